"""A multi-turn rollout with a tool: `--custom-generate-function-path examples/tool_use/generate.py:generate`.

The model may write `call tool`; we run the tool (a calculator that sums the prompt's digits) and append its answer,
`result : N`, to the response as *tool tokens* -- they are part of the context the model continues from, but the
model did not produce them, so their loss-mask entries are 0 and their log-probs are placeholders. Then the engine
is called again to continue. Up to `MAX_TURNS` model turns.

    slime-actors train --config examples/digits/config.toml --rollout-max-response-len 8 \
        --custom-generate-function-path examples/tool_use/generate.py:generate
"""

from __future__ import annotations

from slime_actors.types import ABORTED, COMPLETED, TRUNCATED

MAX_TURNS = 3
TRIGGER = "call tool"


def calculator(prompt: str) -> str:
    """The tool: the sum of the digits in the prompt, modulo 10 (the tiny model's vocabulary has digits only)."""
    return str(sum(int(c) for c in prompt if c.isdigit()) % 10)


async def generate(args, sample, sampling_params, engine):
    tok = engine.tokenizer
    budget = int(sampling_params["max_new_tokens"])
    response, mask, logprobs, versions = [], [], [], []
    status = COMPLETED
    for turn in range(MAX_TURNS):
        left = budget - len(response)
        if left <= 0:
            status = TRUNCATED
            break
        out = await engine.generate(sample.prompt_tokens + response, dict(sampling_params, max_new_tokens=left))
        response += out["output_ids"]
        mask += [1] * len(out["output_ids"])
        logprobs += out["logprobs"]
        versions.append(out["weight_version"])
        if out["finish_reason"] == "abort":
            status = ABORTED
            break
        said = tok.decode(out["output_ids"], skip_special_tokens=True)
        if TRIGGER in said and turn + 1 < MAX_TURNS:
            tool = tok.encode(f"result : {calculator(str(sample.prompt))}", add_special_tokens=False)
            tool = tool[: max(0, budget - len(response))]
            response += tool
            mask += [0] * len(tool)          # not the model's tokens: never trained on
            logprobs += [0.0] * len(tool)    # placeholders (masked out of every loss and metric)
            continue
        status = TRUNCATED if out["finish_reason"] == "length" else COMPLETED
        break
    sample.response_tokens = list(sample.response_tokens) + response
    sample.loss_mask = list(sample.loss_mask) + mask
    sample.rollout_log_probs = list(sample.rollout_log_probs) + logprobs
    sample.response = tok.decode(sample.response_tokens, skip_special_tokens=True)
    sample.status = status
    sample.metadata = {**sample.metadata, "turns": len(versions)}
    ints = [int(v) for v in versions if str(v).lstrip("-").isdigit()]
    sample.weight_versions = list(sample.weight_versions) + ints
    sample.weight_version = min(sample.weight_versions) if sample.weight_versions else -1
    return sample
