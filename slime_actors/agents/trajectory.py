"""An agent's calls of one episode as training samples, token in, token out (after slime's TrajectoryManager,
slime/agent/trajectory.py, on tokens alone).

    t = Trajectory()
    t.add(prompt_ids, output_ids, logprobs, finish_reason, weight_version)    # one call of the chat API
    samples = t.samples(origin)          # one sample per branch of the conversation, the model's tokens trained

Each call is a turn: the tokens the chat template rendered from the request's messages (the prompt) and the tokens
the engine produced, with their log-probs. A turn continues an earlier one when the earlier turn's prompt and output
are a prefix of its prompt -- the agent sent the conversation back with something appended (a tool's result, the
next user message): the part between is the observation (loss mask 0). Turns form a tree (each continues the
turn with the longest such prefix; none: it starts a new root), and each leaf's path is one sample: its first turn's
prompt is the sample's prompt; the response is every turn's output (loss mask 1, the engine's log-probs) with the
observations between (loss mask 0).

Branches -- the agent went back to an earlier point and continued differently (a retry, a sub-agent, a summary) --
are leaves of their own: their shared turns are trained once, in the first branch (later ones carry them masked,
as slime does). A turn whose prompt does not extend any earlier turn's tokens -- the agent rewrote history, or the
chat template re-rendered an earlier turn differently (a template that drops earlier reasoning, a re-tokenization
that splits the text otherwise) -- starts a new root: a sample of its own (slime's "fork"; its "realign" of a short
drift in the last response is not done here: such a turn forks).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..tokenizer import decode_text
from ..types import COMPLETED, TRUNCATED, Sample


@dataclass
class Turn:
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    weight_version: int
    parent: int | None = None
    children: list[int] = field(default_factory=list)

    @property
    def end(self) -> list[int]:
        return self.prompt_ids + self.output_ids


class Trajectory:
    def __init__(self):
        self.turns: list[Turn] = []

    def add(self, prompt_ids: list[int], output_ids: list[int], logprobs: list[float], finish_reason: str,
            weight_version: int) -> int:
        """Record one call; its turn's index."""
        if len(output_ids) != len(logprobs):
            raise ValueError(f"{len(output_ids)} output tokens but {len(logprobs)} log-probs")
        prompt_ids, output_ids = list(prompt_ids), list(output_ids)
        parent, best = None, -1
        for i, t in enumerate(self.turns):
            end = t.end
            if len(end) > best and len(end) <= len(prompt_ids) and prompt_ids[:len(end)] == end:
                parent, best = i, len(end)
        self.turns.append(Turn(prompt_ids, output_ids, [float(x) for x in logprobs], finish_reason,
                               int(weight_version), parent))
        if parent is not None:
            self.turns[parent].children.append(len(self.turns) - 1)
        return len(self.turns) - 1

    def paths(self) -> list[list[int]]:
        """Each leaf's turns, root first, in the order the leaves were made."""
        leaves = [i for i, t in enumerate(self.turns) if not t.children]
        out = []
        for leaf in leaves:
            path, i = [], leaf
            while i is not None:
                path.append(i)
                i = self.turns[i].parent
            out.append(path[::-1])
        return out

    def samples(self, origin: Sample, tokenizer=None) -> list[Sample]:
        """One sample per path (none when no call was made), each a copy of `origin` with its prompt and response;
        a turn shared by several paths is trained in the first only."""
        trained: set[int] = set()
        out = []
        for path in self.paths():
            first = self.turns[path[0]]
            s = Sample(index=origin.index, group_index=origin.group_index, prompt=origin.prompt,
                       prompt_tokens=list(first.prompt_ids), label=origin.label, metadata=dict(origin.metadata),
                       rollout_id=origin.rollout_id)
            resp, mask, lps, versions = [], [], [], []
            held = list(first.prompt_ids)
            for i in path:
                t = self.turns[i]
                between = t.prompt_ids[len(held):]
                resp += between
                mask += [0] * len(between)
                lps += [0.0] * len(between)
                own = i not in trained
                trained.add(i)
                resp += t.output_ids
                mask += [int(own)] * len(t.output_ids)
                lps += t.logprobs if own else [0.0] * len(t.output_ids)
                versions.append(t.weight_version)
                held = t.end
            s.response_tokens, s.loss_mask, s.rollout_log_probs = resp, mask, lps
            s.weight_versions, s.weight_version = versions, min(versions)
            last = self.turns[path[-1]]
            s.finish_reason = last.finish_reason
            s.status = TRUNCATED if last.finish_reason == "length" else COMPLETED
            s.metadata["turns"] = len(path)
            if tokenizer is not None:
                s.response = decode_text(tokenizer, resp)
            out.append(s)
        return out
