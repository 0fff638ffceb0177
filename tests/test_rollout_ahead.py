"""A rollout worker's groups taken ahead (`take_ahead`): the controller made rollout k+1 while the trainers train on
k; the worker leases its share then and starts it at the first resume whose engine holds the rollout's weights --
never before, never at older weights -- gives it back when the rollout is ended first, and names it among the groups
it holds. No engine, no buffer: the worker's calls to them are stubs."""

from __future__ import annotations

import asyncio
from pathlib import Path

from slime_actors.actors.rollout import RolloutWorker
from slime_actors.config import parse_config
from slime_actors.mailbox.errors import AskTimeout
from slime_actors.messages import Work, WorkGroup

DIGITS = str(Path(__file__).resolve().parents[1] / "examples" / "digits" / "config.toml")


def group(i: int) -> WorkGroup:
    return WorkGroup(f"train-{i}", 1, "train", i, {"temperature": 1.0}, [{"index": 8 * i + j} for j in range(8)])


class Buffer:
    """The buffer's side: get_work(ahead=True) answers with the held rollout's groups; returns are recorded."""

    def __init__(self, groups: list[WorkGroup], version: int | None, fail: bool = False):
        self.groups, self.version, self.fail = groups, version, fail
        self.asked: list[dict] = []
        self.released: list[tuple] = []

    async def release_worker(self, worker, reason=None, ask_timeout=None):
        self.released.append((worker, reason))

    async def get_work(self, worker, max_groups, wait=None, ahead=None, ask_timeout=None, idem=None):
        self.asked.append({"worker": worker, "max_groups": max_groups, "ahead": ahead, "idem": idem})
        if self.fail:
            raise AskTimeout("buffer/0", "get_work", ask_timeout or 0)
        out, self.groups = self.groups[:max_groups], self.groups[max_groups:]
        return Work(out, self.version)


def worker(buffer: Buffer, version: int = 3, capacity: int = 32) -> tuple[RolloutWorker, list[str], list[str]]:
    """A worker whose engine serves at `version`, generating `capacity` samples at once (4 groups of 8); the groups
    it starts and the ones it gives back, in order."""
    w = RolloutWorker(0, args=parse_config(["--config", DIGITS, "--n-samples-per-prompt", "8"]).to_dict())
    w._engine_ok.set()
    w.weight_version, w._capacity, w.buffer = version, capacity, buffer
    started: list[str] = []
    returned: list[str] = []

    def start(g: WorkGroup) -> None:
        started.append(g.work_id)

    async def give_back(wid, samples, reason):
        returned.append(wid)
    w._start_group, w._return = start, give_back
    return w, started, returned


def test_groups_taken_ahead_start_at_the_first_resume_whose_engine_holds_their_weights():
    async def go():
        buf = Buffer([group(i) for i in range(6)], version=4)
        w, started, _ = worker(buf)
        await w.take_ahead(rollout_id=1)
        # its share (what it generates at once: 4 groups of 8), leased now, started at no point yet
        assert buf.asked == [{"worker": "rollout/0", "max_groups": 4, "ahead": True, "idem": buf.asked[0]["idem"]}]
        assert buf.asked[0]["idem"].startswith("take_ahead:") and buf.asked[0]["idem"].endswith(":1")
        assert started == [] and w.held_groups() == ["train-0", "train-1", "train-2", "train-3"]
        await w.resume(weight_version=3)          # resumed, but the engine holds version 3: the groups wait for 4
        assert started == []
        w.weight_version = 4                      # the weight sync
        await w.take_ahead(rollout_id=1)          # (a second tell takes nothing more: its share is taken)
        assert len(buf.asked) == 1
        await w.resume(weight_version=4)
        assert started == ["train-0", "train-1", "train-2", "train-3"] and w._ahead == {}
    asyncio.run(go())


def test_groups_taken_ahead_after_the_resume_start_at_once():
    async def go():
        buf = Buffer([group(0), group(1)], version=4)
        w, started, _ = worker(buf, version=4)
        await w.resume(weight_version=4)
        await w.take_ahead(rollout_id=1)
        assert started == ["train-0", "train-1"]
    asyncio.run(go())


def test_a_rollout_ended_before_its_groups_started_gets_them_back():
    async def go():
        buf = Buffer([group(0), group(1)], version=4)
        w, started, returned = worker(buf)
        await w.take_ahead(rollout_id=1)
        await w.end_rollout(rollout_id=0)
        assert returned == ["train-0", "train-1"] and started == [] and w.held_groups() == []
        w.weight_version = 4
        await w.resume(weight_version=4)
        assert started == []
    asyncio.run(go())


def test_groups_whose_lease_comes_back_after_the_rollout_was_ended_are_given_back():
    """A step failed while the worker's take_ahead was out: the controller ended the rollout (and rolls the buffer
    back); the groups leased by that ask are not kept to start later."""
    async def go():
        buf = Buffer([group(0), group(1)], version=4)
        w, started, returned = worker(buf)
        ask = buf.get_work

        async def ended_meanwhile(*a, **kw):
            await w.end_rollout(rollout_id=0)
            return await ask(*a, **kw)
        buf.get_work = ended_meanwhile
        await w.take_ahead(rollout_id=1)
        await asyncio.sleep(0.01)   # (the returns are tasks)
        assert sorted(returned) == ["train-0", "train-1"] and w._ahead == {}
    asyncio.run(go())


def test_a_worker_that_cannot_take_ahead_pulls_when_the_rollout_opens():
    async def go():
        buf = Buffer([group(0)], version=4, fail=True)
        w, started, _ = worker(buf)
        await w.take_ahead(rollout_id=1)          # (retried, then a warning: nothing is held)
        assert len(buf.asked) == 3 and w._ahead == {}
        # the buffer may have leased groups whose reply never came: with nothing else leased, the worker releases
        assert buf.released == [("rollout/0", "take_ahead unanswered")]
        full = Buffer([group(0)], version=4)
        w2, _, _ = worker(full, capacity=7)       # no room for a group of 8: nothing asked
        await w2.take_ahead(rollout_id=1)
        w2._engine_ok.clear()
        await w2.take_ahead(rollout_id=1)         # an engine not serving: nothing asked either
        assert full.asked == []
    asyncio.run(go())
