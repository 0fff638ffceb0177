"""The worked tool-use example (examples/tool_use/env.py) on the environment API, driven by the harness with a
scripted model: several model turns per sample, the tool's tokens masked out of the loss."""

import pytest

from slime_actors.environments.harness import EnvHarness, ScriptedModel
from slime_actors.models.tiny import make_tiny_model

ENV = "examples/tool_use/env.py:DigitSum"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(make_tiny_model(tmp_path_factory.mktemp("m") / "tiny"))


def run(tok, turns, budget=10, prompt="3 4 5 first ="):
    h = EnvHarness(ENV, tok, max_response_len=budget)
    model = ScriptedModel(tok, turns, logprob=-0.25, weight_version=4)
    return h.run_sync(prompt, model), model


def test_tool_call_adds_masked_tool_tokens_and_continues(tok):
    ep, model = run(tok, ["call tool", "2"])
    s = ep.sample
    assert s.response == "call tool result : 2 2"
    assert s.loss_mask == [1, 1, 0, 0, 0, 1]
    assert len(s.rollout_log_probs) == len(s.response_tokens) == 6
    assert s.rollout_log_probs == [-0.25, -0.25, 0.0, 0.0, 0.0, -0.25]
    # the second turn continues from prompt + first turn + tool output (the model's tokens as it gave them), with
    # the budget reduced by all of them
    (first_ids, _), (second_ids, second_params) = model.calls
    assert first_ids == s.prompt_tokens
    assert second_ids == s.prompt_tokens + s.response_tokens[:5]
    assert second_params["max_new_tokens"] == 5
    assert s.status == "completed" and s.weight_version == 4 and s.weight_versions == [4, 4]
    assert s.metadata["turns"] == 2
    assert ep.tools == [{"tool": "digit_sum", "args": ["3 4 5 first ="], "kwargs": {}, "result": "2", "error": None,
                         "seconds": ep.tools[0]["seconds"]}]
    assert ep.segments() == [("call tool", True), ("result : 2", False), ("2", True)]


def test_no_tool_call_is_a_single_turn(tok):
    ep, model = run(tok, [("7", "length")], budget=1)
    assert ep.sample.loss_mask == [1] and ep.sample.status == "truncated" and len(model.calls) == 1
    assert ep.sample.metadata["turns"] == 1


def test_a_tool_call_in_the_last_allowed_turn_ends_the_episode(tok):
    """DigitSum allows 3 model turns: the third turn's tool call is answered by step but not appended."""
    ep, model = run(tok, ["call tool", "call tool", "call tool"], budget=20)
    s = ep.sample
    assert s.response == "call tool result : 2 call tool result : 2 call tool"
    assert s.loss_mask == [1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1]
    assert s.metadata["turns"] == 3 and len(model.calls) == 3 and len(ep.tools) == 3


def test_abort_mid_conversation_is_reported(tok):
    ep, _ = run(tok, ["call tool", ("", "abort")])
    assert ep.sample.status == "aborted" and ep.sample.metadata["turns"] == 2
    assert ep.sample.loss_mask == [1, 1, 0, 0, 0]
