"""Tool use on the environment API: `--rollout-interaction-env-path examples/tool_use/env.py:DigitSum`.

The model may write `call tool`; the environment answers `result : N` (N: the sum of the prompt's digits, mod 10).
The model sees the answer but is not trained on it (loss mask 0), then continues. Up to 3 model turns; the job's
reward function scores the end. docs/adding-an-environment.md walks through it.

    slime-actors train --config examples/digits/config.toml --rollout-max-response-len 8 \
        --rollout-interaction-env-path examples/tool_use/env.py:DigitSum
"""

from slime_actors.environments import Env, Step


def digit_sum(prompt: str) -> str:
    """The tool (the tiny model's vocabulary has digits, not numbers)."""
    return str(sum(int(c) for c in prompt if c.isdigit()) % 10)


class DigitSum(Env):
    max_turns = 3

    async def step(self, sample, turn):
        if "call tool" in turn.text:
            result = await self.call_tool("digit_sum", digit_sum, str(sample.prompt))
            return Step(f"result : {result}")
        return Step(done=True)
