"""The worked tool-use example: several engine calls per sample, tool tokens masked out of the loss."""

import asyncio

import pytest

from slime_actors.models.tiny import make_tiny_model
from slime_actors.plugins import load_function
from slime_actors.types import Sample


class FakeEngine:
    """Answers turn by turn from a script, like the engine handle a custom generate function gets."""

    def __init__(self, tokenizer, turns):
        self.tokenizer = tokenizer
        self.turns = list(turns)
        self.calls = []

    async def generate(self, input_ids, sampling_params):
        self.calls.append((list(input_ids), dict(sampling_params)))
        text, finish = self.turns.pop(0)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return {"output_ids": ids, "logprobs": [-0.1 * (i + 1) for i in range(len(ids))], "finish_reason": finish,
                "weight_version": "4"}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(make_tiny_model(tmp_path_factory.mktemp("m") / "tiny"))


def sample(tok, prompt="3 4 5 first ="):
    return Sample(index=0, group_index=0, prompt=prompt, prompt_tokens=tok.encode(prompt, add_special_tokens=False))


def test_tool_call_adds_masked_tool_tokens_and_continues(tok):
    gen = load_function("examples/tool_use/generate.py:generate")
    eng = FakeEngine(tok, [("call tool", "stop"), ("2", "stop")])
    s = asyncio.run(gen(None, sample(tok), {"max_new_tokens": 10, "temperature": 1.0}, eng))
    assert s.response == "call tool result : 2 2"
    assert s.loss_mask == [1, 1, 0, 0, 0, 1]
    assert len(s.rollout_log_probs) == len(s.response_tokens) == 6
    assert s.rollout_log_probs[2:5] == [0.0, 0.0, 0.0]
    # the second turn continues from prompt + first turn + tool output, with the budget reduced
    second_ids, second_params = eng.calls[1]
    assert second_ids == s.prompt_tokens + s.response_tokens[:5]
    assert second_params["max_new_tokens"] == 5
    assert s.status == "completed" and s.weight_version == 4 and s.metadata["turns"] == 2


def test_no_tool_call_is_a_single_turn(tok):
    gen = load_function("examples/tool_use/generate.py:generate")
    eng = FakeEngine(tok, [("7", "length")])
    s = asyncio.run(gen(None, sample(tok), {"max_new_tokens": 1}, eng))
    assert s.loss_mask == [1] and s.status == "truncated" and len(eng.calls) == 1


def test_abort_mid_conversation_is_reported(tok):
    gen = load_function("examples/tool_use/generate.py:generate")
    eng = FakeEngine(tok, [("call tool", "stop"), ("", "abort")])
    s = asyncio.run(gen(None, sample(tok), {"max_new_tokens": 10}, eng))
    assert s.status == "aborted"
