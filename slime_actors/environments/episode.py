"""The per-sample token bookkeeping, written once: every way a response is generated goes through `Episode`.

    ep = Episode(sample, sampling_params["max_new_tokens"], tokenizer)
    out = await ep.generate(engine, sampling_params)     # one model turn: its tokens, log-probs, version, status
    ep.add_observation(tool_ids)                          # tokens the model did not produce: loss mask 0
    ...
    ep.finish()                                           # writes the sample's fields, checks they line up

The rules (docs/adding-an-environment.md, "What is trained"):

* the model's tokens are appended exactly as the engine returned them (never decoded and re-tokenized), with loss
  mask 1 and the engine's log-probs; everything else in the response -- observations, tool output, chat-template
  glue between turns -- has loss mask 0 and log-prob 0.0 (a placeholder every loss and metric masks out);
* the budget is the response's length in tokens (--rollout-max-response-len) across all turns: each model turn may
  use what is left (`max_new_tokens`), an observation is cut where the budget ends, and the sample is then
  `truncated`; a turn the engine aborted (a pause, the rollout's end) makes it `aborted`, its partial response kept;
* each model turn adds the weight version that produced it to `weight_versions`; `weight_version` is the oldest;
* `metadata["turns"]` is the number of model turns (for episodes that may have several).

Used by the built-in single-turn path, environments (runner.py), this project's generate functions
(`engine.episode(sample, sampling_params)`) and -- through `settle` -- slime's generate functions.
"""

from __future__ import annotations

from typing import Any

from ..tokenizer import decode_text
from ..types import ABORTED, COMPLETED, FAILED, PENDING, TRUNCATED, Sample


def int_version(v: Any, default: int) -> int:
    """An engine's weight version ("3", 3) as an int; `default` when it is not a number ("default", None)."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


class Episode:
    """One sample's response, built turn by turn. It continues whatever response the sample already has (a partial
    rollout resumed)."""

    def __init__(self, sample: Sample, max_new_tokens: int, tokenizer: Any = None, *, count_turns: bool = True):
        self.sample = sample
        self.tokenizer = tokenizer
        self.budget = int(max_new_tokens)
        self.count_turns = count_turns
        self.response: list[int] = list(sample.response_tokens)
        self.loss_mask: list[int] = list(sample.loss_mask)
        self.logprobs: list[float] = list(sample.rollout_log_probs)
        self.versions: list[int] = list(sample.weight_versions)
        self.turns = 0
        self.status: str | None = None
        self.finish_reason: str | None = None

    # ------------------------------------------------------------------------------------------ reading
    @property
    def tokens_left(self) -> int:
        return max(0, self.budget - len(self.response))

    @property
    def context(self) -> list[int]:
        """What the next model turn continues from: the prompt and the response so far."""
        return self.sample.prompt_tokens + self.response

    @property
    def over(self) -> bool:
        """No model turn may follow: the engine aborted one, or the budget is spent."""
        return self.status in (ABORTED, TRUNCATED)

    # ------------------------------------------------------------------------------------------ adding
    async def generate(self, engine: Any, sampling_params: dict) -> dict | None:
        """One model turn through `engine.generate(input_ids, sampling_params)` with what is left of the budget as
        `max_new_tokens`; None (and the sample truncated) when nothing is left. Returns the engine's answer
        ({output_ids, logprobs, finish_reason, weight_version})."""
        left = self.tokens_left
        if left == 0:
            self.status = TRUNCATED
            return None
        before = int(getattr(engine, "weight_version", -1))  # the version when the call began (if none comes back)
        out = await engine.generate(self.context, dict(sampling_params, max_new_tokens=left))
        self.add_answer(out, before)
        return out

    def add_answer(self, out: dict, version_before: int) -> None:
        """The engine's answer to this episode's turn ({output_ids, logprobs, finish_reason, weight_version}) as a
        model turn; `version_before`: the engine's weight version when the call began (used if the answer has
        none)."""
        self.add_model_turn(out["output_ids"], out["logprobs"], out["finish_reason"],
                            int_version(out.get("weight_version"), version_before))

    def add_model_turn(self, token_ids: list[int], logprobs: list[float], finish_reason: str | None,
                       weight_version: int) -> None:
        """Tokens the model produced (loss mask 1, their log-probs), as the engine gave them."""
        if len(token_ids) != len(logprobs):
            raise ValueError(f"sample {self.sample.index}: the engine returned {len(token_ids)} tokens but "
                             f"{len(logprobs)} log-probs")
        self.response += list(token_ids)
        self.loss_mask += [1] * len(token_ids)
        self.logprobs += [float(x) for x in logprobs]
        self.versions.append(int(weight_version))
        self.turns += 1
        self.finish_reason = finish_reason
        self.status = ABORTED if finish_reason == "abort" else TRUNCATED if finish_reason == "length" else COMPLETED

    def add_observation(self, token_ids: list[int]) -> bool:
        """Tokens the model did not produce (loss mask 0, log-prob placeholders), cut at the budget. False (and the
        sample truncated) when they did not fit."""
        left = self.tokens_left
        kept = list(token_ids[:left])
        self.response += kept
        self.loss_mask += [0] * len(kept)
        self.logprobs += [0.0] * len(kept)
        if len(kept) < len(token_ids):
            self.status = TRUNCATED
            return False
        return True

    # ------------------------------------------------------------------------------------------ the end
    def finish(self, status: str | None = None, error: str | None = None) -> Sample:
        """Write the response into the sample (and check it lines up). `status` overrides the last turn's."""
        s = self.sample
        s.response_tokens, s.loss_mask, s.rollout_log_probs = self.response, self.loss_mask, self.logprobs
        if self.tokenizer is not None:
            s.response = decode_text(self.tokenizer, s.response_tokens)
        s.finish_reason = self.finish_reason
        s.status = status or self.status or COMPLETED
        if error is not None:
            s.error = error
        s.weight_versions = self.versions
        s.weight_version = min(self.versions) if self.versions else -1
        if self.count_turns:
            s.metadata = {**s.metadata, "turns": self.turns}
        check_aligned(s)
        return s


def check_aligned(s: Sample, who: str = "") -> None:
    """One loss-mask entry and one log-prob per response token, or ValueError naming the sample."""
    n = len(s.response_tokens)
    if len(s.loss_mask) != n or len(s.rollout_log_probs) != n:
        raise ValueError(f"{who}sample {s.index} has {n} response tokens but {len(s.loss_mask)} loss-mask entries "
                         f"and {len(s.rollout_log_probs)} log-probs")


def settle(s: Sample, tokenizer: Any, version: int, who: str) -> Sample:
    """A sample a generate function of slime's filled in itself: what it left unset is filled in as slime would (an
    all-ones loss mask, the decoded response, a status, the weight version when its call began), then checked."""
    n = len(s.response_tokens)
    if not s.loss_mask:
        s.loss_mask = [1] * n
    if len(s.loss_mask) != n:
        raise ValueError(f"{who}: sample {s.index} has {n} response tokens but a loss mask of {len(s.loss_mask)}")
    if not s.response and n and tokenizer is not None:
        s.response = decode_text(tokenizer, s.response_tokens)
    if s.status == PENDING:
        s.status = COMPLETED if n else FAILED
        if not n:
            s.error = "the custom generate function produced no response"
    if not s.weight_versions:
        s.weight_versions = [version]
        s.weight_version = version
    return s
