"""A reward actor of your own in a few lines (`RewardActor`): the score, batched and group forms, errors per sample,
the reply the rollout workers read, start-up hooks and typed config, the old wire form still answering, and the
shapes refused when the class is defined."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from helpers import Echo, job_config

from slime_actors.actors.base import Actor, handler
from slime_actors.actors.reward import RewardActor, RewardWorker
from slime_actors.actors.rollout import RolloutWorker
from slime_actors.launch.roles import job_class_for
from slime_actors.mailbox.errors import RemoteError
from slime_actors.runtime import RuntimeConfig
from slime_actors.types import Sample


def wire(i: int, response: str, label="7", group: int = 0) -> dict:
    return Sample(index=i, group_index=group, prompt="q", response=response, label=label).to_wire()


def ask_score(actor: RewardActor, samples: list[dict], group: bool = False) -> dict:
    """The score handler, called as the actor calls it for a request (no process, no socket)."""
    handlers = type(actor)._handlers
    return asyncio.run(handlers["score"].fn(actor, samples=samples, group=group))


def serve_and_ask(loop_thread, run_dir, actor: Actor, body: dict, method: str = "score"):
    """Start `actor` as reward/0, ask it `method` from another actor through the mailbox; the reply."""
    ep = loop_thread.call(actor.start(RuntimeConfig(run_dir=run_dir, curve=False)), timeout=60)
    asker = Echo(1)
    loop_thread.call(asker.start(RuntimeConfig(run_dir=run_dir, curve=False, static_peers={"reward/0": ep})))
    try:
        return loop_thread.call(asker.ask("reward/0", method, body, timeout=30), timeout=60)
    finally:
        loop_thread.call(asker.stop())
        loop_thread.call(actor.stop())


# ------------------------------------------------------------------------------------------------ the score form
class Judge(RewardActor):
    async def setup(self):
        self.ready = True
        self.stopped = False

    async def teardown(self):
        self.stopped = True

    async def score(self, sample: Sample) -> float:
        if sample.response == "boom":
            raise RuntimeError("judge crashed")
        if sample.response == "dict":
            return {"score": 0.25}
        if sample.response == "nan":
            return float("nan")
        return float(sample.response.strip() == sample.label)


def test_score_form_answers_through_the_mailbox_with_errors_per_sample(loop_thread, run_dir):
    j = Judge(0, args=job_config(reward_key="score").to_dict())
    assert j.cfg.reward.reward_key == "score"    # the job's config, typed
    samples = [wire(0, "7"), wire(1, "boom"), wire(2, "3"), wire(3, "dict"), wire(4, "nan")]
    rep = serve_and_ask(loop_thread, run_dir, j, {"samples": samples})
    assert rep["rewards"] == [1.0, None, 0.0, 0.25, None]
    assert rep["errors"][0] is None and rep["errors"][2] is None and rep["errors"][3] is None
    assert rep["errors"][1] == "reward 'Judge.score' failed for sample 1: RuntimeError: judge crashed"
    assert "sample 4" in rep["errors"][4] and "finite" in rep["errors"][4]
    assert rep["timed_out"] == [False] * 5
    assert j.ready and j.stopped                  # setup ran before serving, teardown at stop
    assert (j.counters["scored"], j.counters["reward_errors"]) == (3, 2)


def test_a_sync_score_and_the_timed_out_mark_are_reported():
    class Quick(RewardActor):
        def score(self, sample):
            if sample.response == "slow":
                sample.metadata["reward_timed_out"] = True
                return 0.0
            return 1.0

    q = Quick(0)
    rep = ask_score(q, [wire(0, "fast"), wire(1, "slow")])
    assert rep == {"rewards": [1.0, 0.0], "errors": [None, None], "timed_out": [False, True]}
    assert q.counters["reward_timeouts"] == 1


def test_score_runs_a_requests_samples_concurrently_up_to_the_batch_size():
    class Counting(RewardActor):
        def __init__(self, index=0, **config):
            super().__init__(index, **config)
            self.now = self.peak = 0

        async def score(self, sample):
            self.now += 1
            self.peak = max(self.peak, self.now)
            await asyncio.sleep(0.01)
            self.now -= 1
            return 1.0

    c = Counting(0, args=job_config(reward_batch_size=3).to_dict())
    rep = ask_score(c, [wire(i, "x") for i in range(10)])
    assert rep["rewards"] == [1.0] * 10 and c.peak == 3


# ------------------------------------------------------------------------------------------------ the batched form
class Batched(RewardActor):
    calls: list

    async def score_batch(self, samples):
        self.calls = getattr(self, "calls", []) + [[s.index for s in samples]]
        if samples[0].response == "raise":
            raise RuntimeError("judge model out of memory")
        if samples[0].response == "short":
            return [1.0]
        return [ValueError(f"no label for sample {s.index}") if s.label is None else len(s.response)
                for s in samples]


def test_batched_form_one_call_errors_per_sample():
    b = Batched(0)
    rep = ask_score(b, [wire(0, "ab"), wire(1, "abc", label=None), wire(2, "a")])
    assert b.calls == [[0, 1, 2]]
    assert rep["rewards"] == [2.0, None, 1.0]
    assert rep["errors"] == [None, "reward 'Batched.score' failed for sample 1: ValueError: no label for sample 1",
                             None]


def test_batched_form_that_raises_or_miscounts_fails_each_sample_with_the_cause():
    b = Batched(0)
    rep = ask_score(b, [wire(0, "raise"), wire(1, "x")])
    assert rep["rewards"] == [None, None]
    assert rep["errors"] == [("reward 'Batched.score_batch' failed for samples [0, 1]: RuntimeError: judge model "
                              "out of memory")] * 2
    rep = ask_score(b, [wire(0, "short"), wire(1, "x")])
    assert rep["rewards"] == [None, None]
    assert "score_batch returned 1 rewards for 2 samples" in rep["errors"][0]
    assert b.counters["reward_errors"] == 4


# ------------------------------------------------------------------------------------------------ the group form
class Grouped(RewardActor):
    async def score(self, sample):
        return -1.0

    async def score_group(self, samples):
        self.groups = getattr(self, "groups", []) + [[s.index for s in samples]]
        best = max(len(s.response) for s in samples)
        return [float(len(s.response) == best) for s in samples]


def test_group_form_scores_each_prompts_group_under_group_rm():
    g = Grouped(0)
    samples = [wire(0, "a", group=0), wire(1, "aa", group=1), wire(2, "aaa", group=0), wire(3, "b", group=1)]
    rep = ask_score(g, samples, group=True)
    assert sorted(g.groups) == [[0, 2], [1, 3]]
    assert rep["rewards"] == [0.0, 1.0, 1.0, 0.0] and rep["errors"] == [None] * 4
    # without --group-rm the per-sample form answers; with it set in the job, the group form
    assert ask_score(g, samples)["rewards"] == [-1.0] * 4
    g2 = Grouped(0, args=job_config(group_rm=True).to_dict())
    assert ask_score(g2, samples)["rewards"] == [0.0, 1.0, 1.0, 0.0]


def test_only_a_group_form_scores_whole_groups_and_a_failing_group_fails_alone():
    class OnlyGroups(RewardActor):
        async def score_group(self, samples):
            if samples[0].group_index == 1:
                raise RuntimeError("group 1 is cursed")
            return [0.5] * len(samples)

    rep = ask_score(OnlyGroups(0), [wire(0, "a", group=0), wire(1, "b", group=1), wire(2, "c", group=0)])
    assert rep["rewards"] == [0.5, None, 0.5]
    assert rep["errors"][1] == ("reward 'OnlyGroups.score_group' failed for samples [1]: RuntimeError: group 1 is "
                                "cursed")


def test_the_reward_worker_scores_a_requests_groups_under_one_concurrency_bound(tmp_path):
    """The built-in worker under --group-rm hands a request's groups to the reward function together, at most
    --reward-batch-size calls at once, as before RewardActor (not that bound per group)."""
    f = tmp_path / "group_rm.py"
    f.write_text("import asyncio\n"
                 "now = peak = 0\n"
                 "async def best_of(args, samples):\n"
                 "    global now, peak\n"
                 "    now += 1\n"
                 "    peak = max(peak, now)\n"
                 "    await asyncio.sleep(0.01)\n"
                 "    now -= 1\n"
                 "    longest = max(len(s.response) for s in samples)\n"
                 "    return [float(len(s.response) == longest) for s in samples]\n")
    w = RewardWorker(0, args=job_config(custom_rm_path=f"{f}:best_of", group_rm=True, reward_batch_size=1).to_dict())
    samples = [wire(i, "a" * (i % 3 + 1), group=i % 4) for i in range(12)]
    rep = ask_score(w, samples)
    assert rep["rewards"] == [1.0 if i % 3 + 1 == max(j % 3 + 1 for j in range(12) if j % 4 == i % 4) else 0.0
                              for i in range(12)]
    from slime_actors.plugins import load_function
    assert load_function(f"{f}:best_of").__globals__["peak"] == 1


# ------------------------------------------------------------------------------------------------ malformed input
def test_a_malformed_sample_is_refused_naming_its_place(loop_thread, run_dir):
    bad = wire(1, "x")
    bad["colour"] = "red"
    with pytest.raises(RemoteError, match=r"samples\[1\] is not a sample: .*unknown field.*colour"):
        serve_and_ask(loop_thread, run_dir, Judge(0), {"samples": [wire(0, "7"), bad]})


# ------------------------------------------------------------------------------------------------ the old wire form
OLD_FORM = Path(__file__).parent / "data" / "old_form_reward_actor.py"


class ScoringOnly(RolloutWorker):
    """A rollout worker without its engine: only its scoring path (`_score`) runs."""

    async def on_start(self):
        pass


def test_a_reward_actor_of_the_old_form_still_scores_for_a_rollout_worker(loop_thread, run_dir):
    """The form users copied before RewardActor (tests/data/old_form_reward_actor.py, word for word: an Actor that
    rebuilds the flags with argparse.Namespace, decodes the samples and replies {rewards, errors} without
    `timed_out`), chosen as --reward-actor-class and scored for by a rollout worker: rewards land on the samples, a
    sample it cannot score is retried and then failed with its message."""
    cfg = job_config(reward_actor_class=f"{OLD_FORM}:DigitJudge")
    cls = job_class_for("reward", cfg)
    judge = cls(0, args=cfg.to_dict())
    assert judge.args.rm_type == "exact_match" and judge.args.reward_actor_class.endswith("DigitJudge")
    ep = loop_thread.call(judge.start(RuntimeConfig(run_dir=run_dir, curve=False)), timeout=60)
    w = ScoringOnly(0, args=cfg.to_dict())
    loop_thread.call(w.start(RuntimeConfig(run_dir=run_dir, curve=False, static_peers={"reward/0": ep})))
    try:
        samples = [Sample(index=0, group_index=0, prompt="q", response="7 apples", label="7"),
                   Sample(index=1, group_index=0, prompt="q", response="3", label=None),
                   Sample(index=2, group_index=0, prompt="q", response="4", label="5")]
        loop_thread.call(w._score(samples, "train"), timeout=60)
        assert [s.reward for s in samples] == [1.0, None, 0.0]
        assert [s.status for s in samples] == ["pending", "failed", "pending"]
        assert samples[1].error == "reward failed: sample 1 has no label to judge against"
        assert not any(s.metadata.get("reward_timed_out") for s in samples)
        # three samples, then the failing one twice more (the rollout worker's retries); its extra handler answers
        assert loop_thread.call(w.ask("reward/0", "judge_stats", {}, timeout=30), timeout=60) == {"judged": 5}
    finally:
        loop_thread.call(w.stop())
        loop_thread.call(judge.stop())


def test_a_reward_actor_overriding_the_score_handler_with_the_wire_form_keeps_answering():
    class OldStyleSubclass(RewardWorker):
        @handler
        async def score(self, samples: list, group: bool = False) -> dict:
            return {"rewards": [0.5] * len(samples), "errors": [None] * len(samples), "group": group}

    w = OldStyleSubclass(0, args=job_config().to_dict())
    assert ask_score(w, [wire(0, "x")], group=True) == {"rewards": [0.5], "errors": [None], "group": True}


# ------------------------------------------------------------------------------------------------ refused shapes
NEW_FORM = "async def score(self, sample: Sample) -> float"


def test_the_new_form_marked_as_a_handler_is_refused_showing_the_new_form():
    with pytest.raises(TypeError) as ei:
        class Marked(RewardActor):
            @handler
            async def score(self, sample) -> float:
                return 1.0
    assert "define score as a plain method, without @handler" in str(ei.value) and NEW_FORM in str(ei.value)
    with pytest.raises(TypeError, match="define score_batch as a plain method"):
        class MarkedBatch(RewardActor):
            @handler
            async def score_batch(self, samples: list) -> list:
                return []


def test_the_wire_signature_without_handler_is_refused_showing_the_new_form():
    with pytest.raises(TypeError) as ei:
        class Mixed(RewardActor):
            async def score(self, samples, group):
                return {"rewards": [], "errors": []}
    msg = str(ei.value)
    assert "Mixed.score must take one argument, the sample (`score(self, sample)`), but takes samples, group" in msg
    assert NEW_FORM in msg
    with pytest.raises(TypeError, match=r"score_group must take one argument, the samples .*takes nothing"):
        class NoArgs(RewardActor):
            async def score_group(self):
                return []


def test_a_reward_actor_that_scores_nothing_is_refused_at_start_showing_the_new_form():
    class Empty(RewardActor):
        pass

    with pytest.raises(TypeError) as ei:
        Empty(0)
    assert "Empty does not score" in str(ei.value) and NEW_FORM in str(ei.value)


# ------------------------------------------------------------------------------------------------ the example
def test_the_example_judge_scores_a_batch_and_counts():
    from slime_actors.launch.roles import class_for
    cls = class_for("reward", "examples/reward_actor/judge.py:DigitJudge")
    j = cls(0, args=job_config().to_dict())
    asyncio.run(j.setup())
    rep = ask_score(j, [wire(0, "7 apples"), wire(1, "3", label=None), wire(2, "4")])
    assert rep["rewards"] == [1.0, None, 0.0]
    assert rep["errors"][1].endswith("ValueError: sample 1 has no label to judge against")
    assert j.judge_stats() == {"judged": 3}
