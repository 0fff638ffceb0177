"""Several agents per task, after slime's examples/multi_agent: solvers answer, rewriters revise the candidates for a
bounded number of rounds, a selector picks the final answer. Every agent's turn is a sample of its own in the one
buffer, with its own reward and its own advantage group (docs/multi-agent.md).

    slime-actors train --config examples/multi_agent/config.toml                  # one policy plays every role
    slime-actors train --config examples/multi_agent/config.toml \\
        --frozen-engine-checkpoint tiny:digits                                    # the selector is a fixed model

The task is the digits one (examples/digits: "a b c first =" -> "a"), so the tiny model can play it on CPU. Prompts
are built from its vocabulary (digits and a few symbols); a real model gets the same structure in words
(docs/multi-agent.md has the SmolLM2 recipe: chat prompts get user messages instead).

Rewards (slime's scheme, additive): each solver's and rewriter's answer is graded by the job's reward (`--rm-type`)
-- its own score --; the selector's score is whether its pick is right; every agent then gets `OUTCOME_WEIGHT` more
when the final answer is right (the outcome all agents share). With a frozen engine the selector's turn is not
trained (it is no sample); the others still share its outcome.
"""

from __future__ import annotations

from slime_actors.environments import engine_generate
from slime_actors.types import Sample

SOLVERS = 2          # solvers per task
ROUNDS = 1           # rounds of rewriting (each rewriter sees the previous round's candidates)
REWRITERS = 2        # rewriters per round
OUTCOME_WEIGHT = 0.5


async def turn(engine, sample: Sample, role: str, prompt: str, sampling_params: dict, k: int, *,
               frozen: bool = False) -> tuple[Sample | None, str]:
    """The episode's k-th agent turn, on `prompt`: (its sample -- None when a frozen model played it --, the text it
    wrote). Each turn samples with a seed of its own (the episode's sample index and k): a rerun, or a replay,
    makes the same requests."""
    sampling_params = {**sampling_params, "sampling_seed": (sample.index * 1009 + k) & 0x7FFFFFFF}
    tok = engine.tokenizer
    if isinstance(prompt, list):         # chat messages (a real model): its chat template, as the prompt data has it
        ids = tok(tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True),
                  add_special_tokens=False)["input_ids"]
    else:                                # text (the tiny model): BOS and the prompt, as the prompt data is tokenized
        ids = tok(prompt)["input_ids"]
    s = Sample(index=sample.index, group_index=sample.group_index, prompt=prompt, prompt_tokens=list(ids),
               label=sample.label, metadata={**sample.metadata, "role": role})
    if frozen:
        out = await engine.frozen.generate(ids, sampling_params)
        return None, tok.decode(out["output_ids"], skip_special_tokens=True).strip()
    ep = engine.episode(s, sampling_params)
    await ep.generate(engine, sampling_params)
    ep.finish()
    return s, s.response.strip()


def ask(sample: Sample, text: str) -> str | list[dict]:
    """A prompt that follows the task with `text`: appended to a text task, a user message after a chat one."""
    if isinstance(sample.prompt, list):
        return list(sample.prompt) + [{"role": "user", "content": text}]
    return f"{sample.prompt} {text}"


def rewrite_request(sample: Sample, seen: list[str]) -> str | list[dict]:
    if isinstance(sample.prompt, list):
        return ask(sample, "Candidate answers: " + " | ".join(seen) + ". Write the correct answer.")
    return ask(sample, " , ".join(seen) + " ?")


def select_request(sample: Sample, candidates: list[str]) -> str | list[dict]:
    if isinstance(sample.prompt, list):
        return ask(sample, "Candidate answers: " + " | ".join(candidates) + ". Repeat the correct one exactly.")
    return ask(sample, " , ".join(candidates) + " :")


@engine_generate
async def generate(args, sample: Sample, sampling_params: dict, engine) -> list[Sample]:
    question = sample.prompt
    frozen_selector = bool(getattr(args, "frozen_engine_checkpoint", None))
    samples: list[Sample] = []

    k = 0
    solved = []
    for _ in range(SOLVERS):
        solved.append(await turn(engine, sample, "solver", question, sampling_params, k := k + 1))
    samples += [s for s, _ in solved]
    candidates = [text for _, text in solved]
    for _ in range(ROUNDS):
        rewritten = []
        for _ in range(REWRITERS):
            rewritten.append(await turn(engine, sample, "rewriter", rewrite_request(sample, candidates),
                                        sampling_params, k := k + 1))
        samples += [s for s, _ in rewritten]
        candidates = [text for _, text in rewritten]

    selector, pick = await turn(engine, sample, "selector", select_request(sample, candidates), sampling_params, k + 1,
                                frozen=frozen_selector)
    final = pick if pick in candidates else None          # a pick that is no candidate chooses nothing

    # own scores from the job's reward; the selector's: its pick, graded the same way
    graded = list(samples)
    scores = await engine.score(graded)
    final_right = 0.0
    if final is not None:
        probe = Sample(index=sample.index, group_index=sample.group_index, prompt=question, label=sample.label,
                       metadata=dict(sample.metadata),
                       response=final, status="completed")
        final_right = (await engine.score([probe]))[0]
    for s, own in zip(graded, scores):
        s.reward = own + OUTCOME_WEIGHT * final_right
        s.metadata["own_score"] = own
    if selector is not None:
        selector.reward = final_right + OUTCOME_WEIGHT * final_right
        selector.metadata["own_score"] = final_right
        samples.append(selector)
    for s in samples:
        s.metadata["metrics"] = {"final_correct": final_right, "picked_a_candidate": float(final is not None)}
    return samples
