"""Reward functions for the recorded runs under traces/ and the walk-through in docs/debugging.md.

Task (examples/digits): "a b c first =" -> "a". `partial_credit` gives some reward to any digit, so even the tiny
untrained model gets a learning signal in a few steps; `slow_partial_credit` is the same function with a slow path
(a verifier that takes 0.2 s on some inputs), which docs/debugging.md finds from the trace.
"""

import asyncio


def partial_credit(args, sample) -> float:
    answer = (sample.response or "").strip()
    if answer == str(sample.label):
        return 1.0
    return 0.2 if answer.isdigit() else 0.0


async def slow_partial_credit(args, sample) -> float:
    if str(sample.label) == "9":  # the slow path: every prompt whose answer is 9
        await asyncio.sleep(0.2)
    return partial_credit(args, sample)
