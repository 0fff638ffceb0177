"""A trainer rank asks for the next rollout's shard as soon as it trained on one (`wait_batch`, answered by the
buffer once that rollout is complete), so the step's training starts when the controller's `train` arrives instead
of after a get_batch round trip. It trains on that shard only when it is the batch `train` names (wait_rollout's
`batch_id`); anything else -- another id, another rollout, no id, an ask that failed, was answered with nothing or
is late -- and it pulls its shard as before. The rank here is a TrainerRank without a process: its buffer handle
answers as the test says."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import structlog

from slime_actors.actors import trainer as trainer_module
from slime_actors.actors.trainer import TrainerRank
from slime_actors.mailbox.errors import MailboxError
from slime_actors.messages import TrainBatch


def batch(tag: str) -> dict:
    return {key: [tag] for key in TrainBatch.KEYS}


class Buffer:
    """The rank's buffer handle: wait_batch answers with `ahead` (an exception is raised; None never answers);
    get_batch with batch("pulled"). Both counted."""

    def __init__(self, ahead):
        self.ahead = ahead
        self.asked: list[tuple] = []
        self.cancelled = 0

    async def wait_batch(self, rollout_id, rank, world_size, packed=None, timeout=None, ask_timeout=None):
        self.asked.append(("wait_batch", rollout_id, rank, world_size, packed))
        try:
            await asyncio.sleep(0.01)
            if self.ahead is None:
                await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if isinstance(self.ahead, Exception):
            raise self.ahead
        return self.ahead

    async def get_batch(self, rollout_id, rank, world_size, packed=None, ask_timeout=None):
        self.asked.append(("get_batch", rollout_id, rank, world_size, packed))
        return TrainBatch.from_wire(batch("pulled"))


def rank(ahead) -> TrainerRank:
    r = TrainerRank.__new__(TrainerRank)
    r.backend = SimpleNamespace(data_parallel_rank=1, data_parallel_size=2)
    r.buffer, r.log, r._next_batch = Buffer(ahead), structlog.get_logger(), None
    return r


def shard(r: TrainerRank, rollout_id: int, batch_id: str | None, fetched_ahead_for: int | None = 3) -> dict:
    async def go():
        if fetched_ahead_for is not None:
            r._fetch_ahead(fetched_ahead_for)
        await asyncio.sleep(0.05)     # (the rank trains meanwhile; then the controller's train comes)
        got = await r._batch(rollout_id, batch_id)
        await asyncio.sleep(0)       # (a cancelled ask sees its cancellation)
        return got
    return asyncio.run(go())


def test_the_shard_fetched_ahead_is_trained_on_when_it_is_the_batch_train_names():
    r = rank({"batch_id": "b3", "batch": batch("ahead")})
    assert shard(r, 3, "b3") == batch("ahead")
    assert r.buffer.asked == [("wait_batch", 3, 1, 2, True)]   # (this rank's data-parallel shard; no get_batch)
    assert r._next_batch is None


@pytest.mark.parametrize("ahead, rollout_id, batch_id, why", [
    ({"batch_id": "old", "batch": batch("ahead")}, 3, "b3", "made again since: another id"),
    ({"batch_id": "b3", "batch": batch("ahead")}, 3, None, "train names no batch"),
    ({"batch_id": "b3", "batch": batch("ahead")}, 4, "b4", "train is for another rollout (a restarted group)"),
    ({"batch_id": "b3"}, 3, "b3", "an answer without a batch"),
    ("nothing", 3, "b3", "answered with nothing (timeout, rollback)"),
    (MailboxError("buffer/0 is down"), 3, "b3", "the ask failed"),
])
def test_anything_but_the_named_batch_is_set_aside_and_the_shard_is_pulled(ahead, rollout_id, batch_id, why):
    r = rank(None if ahead == "nothing" else ahead)
    if ahead == "nothing":
        async def nothing(*a, **kw):
            r.buffer.asked.append(("wait_batch",))
            return None
        r.buffer.wait_batch = nothing
    assert shard(r, rollout_id, batch_id) == batch("pulled"), why
    assert [a[0] for a in r.buffer.asked] == ["wait_batch", "get_batch"], why
    assert r.buffer.asked[-1] == ("get_batch", rollout_id, 1, 2, True)


def test_an_answer_that_does_not_come_is_waited_for_a_bounded_time_then_pulled(monkeypatch):
    monkeypatch.setattr(trainer_module, "NEXT_BATCH_LATE_S", 0.1)
    r = rank(None)      # (wait_batch never answers)
    assert shard(r, 3, "b3") == batch("pulled")
    assert [a[0] for a in r.buffer.asked] == ["wait_batch", "get_batch"] and r.buffer.cancelled == 1


def test_nothing_fetched_ahead_pulls_and_a_newer_ask_replaces_an_older_one():
    r = rank({"batch_id": "b3", "batch": batch("ahead")})
    assert shard(r, 2, "b2", fetched_ahead_for=None) == batch("pulled")   # (the first step: nothing asked ahead)

    async def twice():
        r._fetch_ahead(3)
        await asyncio.sleep(0)
        first = r._next_batch[1]
        r._fetch_ahead(3)           # (the old ask is cancelled, not left waiting in the buffer)
        got = await r._batch(3, "b3")
        return got, first.cancelled()
    r.buffer.asked.clear()
    assert asyncio.run(twice()) == (batch("ahead"), True)
    assert r.buffer.cancelled == 1 and len(r.buffer.asked) == 2


def test_the_ask_after_the_last_rollout_is_cancelled_when_the_rank_stops():
    r = rank(None)
    r.weights = None

    async def go():
        r._fetch_ahead(10)          # (after the last rollout: no rollout 10 will come)
        await asyncio.sleep(0)
        await r.on_stop()
        await asyncio.sleep(0.02)
    asyncio.run(go())
    assert r.buffer.cancelled == 1 and r._next_batch is None


def test_a_train_cancelled_while_it_waits_for_the_shard_leaves_no_ask_waiting():
    r = rank(None)      # (wait_batch never answers)

    async def go():
        r._fetch_ahead(3)
        await asyncio.sleep(0)
        task = r._next_batch[1]
        waiting = asyncio.ensure_future(r._batch(3, "b3"))
        await asyncio.sleep(0.02)
        waiting.cancel()           # (the rank stops while its train waits)
        await asyncio.sleep(0.02)
        return task
    task = asyncio.run(go())
    assert task.cancelled() and r.buffer.cancelled == 1 and r._next_batch is None


def test_the_trained_batch_is_freed_after_trains_reply_not_before():
    """Freeing a trained batch (tens of thousands of objects at a real step's size) is not left to the train handler's
    return, which comes before its reply: the batch is whole when `train` returns (the reply is sent then, in the same
    turn of the loop) and emptied on the loop's next turn."""
    trained: list[dict] = []

    async def run_blocking(fn, *args):
        return fn(*args)

    def update(rl_update, b, rollout_id, cause):
        trained.append(b)
        return {"loss": 0.5}

    async def go():
        r = rank(None)
        r.run_blocking, r._update = run_blocking, update
        r.cfg = SimpleNamespace(run=SimpleNamespace(n_rollouts=1))   # (the last rollout: nothing asked for ahead)
        metrics = await r.train(0, None)
        whole = {k: list(v) for k, v in trained[0].items()}
        await asyncio.sleep(0)
        return metrics, whole, trained[0]
    metrics, whole, after = asyncio.run(go())
    assert metrics["loss"] == 0.5 and whole == batch("pulled")
    assert after == {}
