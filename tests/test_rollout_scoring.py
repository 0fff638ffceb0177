"""What a rollout worker sends the reward worker: a sample without its token ids, loss mask and log-probs when its
grader is a built-in that reads none of them (tests/test_rewards.py checks that each of those reads none), the whole
sample otherwise -- the user's reward function or reward actor, a row's own reward type that is not such a built-in,
an evaluation set whose own grader is the user's. No processes: the worker is made, not started."""

from __future__ import annotations

from pathlib import Path

import pytest

from slime_actors.actors.rollout import TOKEN_FIELDS, RolloutWorker, _text_only_graders
from slime_actors.config import parse_config
from slime_actors.eval_config import EVAL_SET_KEY
from slime_actors.types import Sample

DIGITS = str(Path(__file__).resolve().parents[1] / "examples" / "digits" / "config.toml")


def cfg(*flags):
    return parse_config(["--config", DIGITS, *flags])


def sample(**metadata) -> Sample:
    return Sample(index=3, group_index=1, prompt="7 + 1 =", prompt_tokens=[5, 6], label="8", metadata=dict(metadata),
                  response="8", response_tokens=[9, 2], loss_mask=[1, 1], rollout_log_probs=[-0.1, -0.2],
                  weight_version=2, status="completed")


@pytest.mark.parametrize("flags,lean", [
    ((), True),                                                            # the digits job: --rm-type exact_match
    (("--rm-type", "boxed_f1"), True),
    (("--custom-rm-path", "examples/debugging/rewards.py:partial_credit"), False),
    (("--reward-actor-class", "examples/reward_actor/judge.py:DigitJudge"), False),
])
def test_the_jobs_reward_decides(flags, lean):
    assert _text_only_graders(cfg(*flags))[""] is lean


def test_a_lean_sample_is_the_whole_one_less_its_token_lists():
    w = RolloutWorker(0, args=cfg().to_dict())
    s = sample()
    got, whole = w._score_wire(s), s.to_wire()
    assert set(whole) - set(got) == set(TOKEN_FIELDS) and all(got[k] == whole[k] for k in got)
    assert Sample.from_wire(got).response == "8"   # (what the reward worker decodes: token lists empty)
    # a row's own reward type: a text-only built-in stays lean, anything else gets the whole sample
    assert set(TOKEN_FIELDS).isdisjoint(w._score_wire(sample(rm_type="f1")))
    assert w._score_wire(sample(rm_type="mine")) == sample(rm_type="mine").to_wire()


def test_an_evaluation_sets_own_grader_decides_for_its_samples():
    w = RolloutWorker(0, args=cfg().to_dict())
    w._text_only = {"": True, "easy": True, "hard": False}   # (what _text_only_graders gives with --eval-config)
    assert set(TOKEN_FIELDS).isdisjoint(w._score_wire(sample(**{EVAL_SET_KEY: "easy"})))
    assert w._score_wire(sample(**{EVAL_SET_KEY: "hard"})) == sample(**{EVAL_SET_KEY: "hard"}).to_wire()
    assert set(TOKEN_FIELDS).isdisjoint(w._score_wire(sample(**{EVAL_SET_KEY: "other"})))   # the job's reward's
    # a row's own type comes first, in a set with a grader of its own too
    mine = sample(**{EVAL_SET_KEY: "easy", "rm_type": "mine"})
    assert w._score_wire(mine) == mine.to_wire()
    w._text_only = {"": False}
    assert w._score_wire(sample()) == sample().to_wire()
