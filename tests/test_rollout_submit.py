"""A rollout worker hands its scored groups to the buffer one `submit` at a time while none is out, and the groups
finished while one is out together in one `submit_groups` once it is answered (at the end of a rollout the groups
finish within milliseconds of each other). Each group's hand-in returns when the buffer answered for it; a refusal
is logged with its reason; a group cancelled before its submit went out is not handed in; a buffer that does not
answer loses nothing but the message. No engine, no buffer process: the worker's buffer is a stub."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
from structlog.testing import capture_logs

from slime_actors.actors import rollout as rollout_module
from slime_actors.actors.rollout import RolloutWorker, submit_key
from slime_actors.config import parse_config
from slime_actors.mailbox.errors import AskTimeout
from slime_actors.messages import Submitted, SubmittedGroups
from slime_actors.retry import RetryPolicy
from slime_actors.types import Sample

DIGITS = str(Path(__file__).resolve().parents[1] / "examples" / "digits" / "config.toml")


def samples(i: int) -> list[Sample]:
    return [Sample(index=2 * i + j, group_index=i, prompt="1 2 first =", response="1", response_tokens=[5],
                   loss_mask=[1], rollout_log_probs=[-0.5], reward=1.0) for j in range(2)]


class Buffer:
    """The buffer's side: each ask is recorded and waits until the test opens `gate`; `refuse` names work ids it
    refuses; `fail`: every ask times out; `malformed`: submit_groups answers for one group too few."""

    def __init__(self, refuse=(), fail=False, malformed=False):
        self.asks: list[tuple] = []
        self.gate = asyncio.Event()
        self.refuse, self.fail, self.malformed = set(refuse), fail, malformed

    def _result(self, wid: str) -> Submitted:
        return Submitted(False, f"{wid} is queued") if wid in self.refuse else Submitted(True, None, "done")

    async def submit(self, worker, work_id, samples, ask_timeout=None, idem=None):
        self.asks.append(("submit", [work_id], idem))
        await self.gate.wait()
        if self.fail:
            raise AskTimeout("buffer/0", "submit", ask_timeout or 0)
        return self._result(work_id)

    async def submit_groups(self, worker, groups, ask_timeout=None, idem=None):
        self.asks.append(("submit_groups", [g["work_id"] for g in groups], idem))
        assert all(len(g["samples"]) == 2 and g["samples"][0]["response_tokens"] == [5] for g in groups)
        await self.gate.wait()
        if self.fail:
            raise AskTimeout("buffer/0", "submit_groups", ask_timeout or 0)
        results = [self._result(g["work_id"]) for g in groups]
        return SubmittedGroups(results[:-1] if self.malformed else results)


@pytest.fixture(autouse=True)
def once(monkeypatch):
    """One attempt per ask (the retries' waits are not what is tested here)."""
    monkeypatch.setattr(rollout_module, "SUBMIT_RETRY", RetryPolicy(attempts=1, base=0.0))


def worker(buffer: Buffer) -> RolloutWorker:
    w = RolloutWorker(0, args=parse_config(["--config", DIGITS]).to_dict())
    w.buffer, w.runtime = buffer, SimpleNamespace(trace=True, trace_body_limit=65536)
    return w


async def hand_in(w: RolloutWorker, i: int) -> asyncio.Task:
    """Group train-i handed in (lease 1), by a task of its own as the worker's groups are; one turn of the loop."""
    t = asyncio.ensure_future(w._submit(f"train-{i}", samples(i), 1))
    await asyncio.sleep(0)
    return t


def test_groups_finished_while_a_submit_is_out_go_together_once_it_is_answered():
    async def go():
        buf = Buffer()
        w = worker(buf)
        first = await hand_in(w, 0)
        later = [await hand_in(w, i) for i in (1, 2)]
        await asyncio.sleep(0.01)
        # one submit out (train-0); train-1 and train-2 wait for its answer
        assert buf.asks == [("submit", ["train-0"], submit_key("train-0", 1, samples(0)[0]))]
        assert not any(t.done() for t in [first, *later])
        buf.gate.set()
        await asyncio.wait_for(asyncio.gather(first, *later), 5)
        assert [a[:2] for a in buf.asks] == [("submit", ["train-0"]), ("submit_groups", ["train-1", "train-2"])]
        assert buf.asks[1][2].startswith("groups:")      # (an idempotency key of its own: a retry is applied once)
        # with nothing out, the next group goes at once, alone
        await asyncio.wait_for(await hand_in(w, 3), 5)
        assert buf.asks[-1][:2] == ("submit", ["train-3"])
    asyncio.run(go())


def test_a_refused_group_is_logged_with_its_reason_and_the_others_are_taken():
    async def go():
        buf = Buffer(refuse={"train-2"})
        w = worker(buf)
        tasks = [await hand_in(w, i) for i in range(3)]
        buf.gate.set()
        with capture_logs() as logs:
            await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return logs
    logs = asyncio.run(go())
    refused = [e for e in logs if e["event"] == "buffer refused a group"]
    assert [(e["work_id"], e["reason"]) for e in refused] == [("train-2", "train-2 is queued")]


def test_a_group_cancelled_before_its_submit_went_out_is_not_handed_in():
    async def go():
        buf = Buffer()
        w = worker(buf)
        first = await hand_in(w, 0)
        gone, kept = await hand_in(w, 1), await hand_in(w, 2)
        gone.cancel()          # (an engine restart: the worker's leases are released, the buffer re-issues it)
        await asyncio.sleep(0)
        buf.gate.set()
        await asyncio.wait_for(asyncio.gather(first, kept), 5)
        assert gone.cancelled()
        return [a[:2] for a in buf.asks]
    assert asyncio.run(go()) == [("submit", ["train-0"]), ("submit", ["train-2"])]


def test_a_buffer_that_does_not_answer_or_answers_for_too_few_groups_loses_nothing_else():
    async def go(buf):
        w = worker(buf)
        tasks = [await hand_in(w, i) for i in range(3)]
        buf.gate.set()
        with capture_logs() as logs:
            await asyncio.wait_for(asyncio.gather(*tasks), 5)    # (each returns: the groups stay leased to it)
        return [e["event"] for e in logs if e["log_level"] == "error"]
    assert asyncio.run(go(Buffer(fail=True))) == ["gave up handing in groups; the buffer will re-issue them"] * 2
    assert asyncio.run(go(Buffer(malformed=True))) == ["the buffer answered for another number of groups"]


def test_a_batch_stays_within_the_traces_body_limit():
    """The groups sent together fit the trace's body limit (a body over it is kept by size and checksum only: the
    buffer's trace could not give the samples back, nor replay the buffer): here two groups' worth -- train-1 and
    train-2 together, train-3 on its own."""
    async def go():
        buf = Buffer()
        w = worker(buf)
        one = rollout_module._wire_bytes([s.to_wire() for s in samples(1)])
        w.runtime = SimpleNamespace(trace=True, trace_body_limit=2 * one + 10)
        tasks = [await hand_in(w, i) for i in range(4)]
        buf.gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return [a[:2] for a in buf.asks]
    assert asyncio.run(go()) == [("submit", ["train-0"]), ("submit_groups", ["train-1", "train-2"]),
                                 ("submit", ["train-3"])]


def test_the_size_counted_is_at_least_the_encoded_size():
    import msgpack
    from slime_actors.mailbox.codec import encode_body
    s = Sample(index=3, group_index=1, prompt=[{"role": "user", "content": "Wie viel ist 12 * 8? ü" * 20}],
               response="Die Antwort ist 96. ✓" * 30, label={"answer": "96", "tests": ["x" * 300]},
               prompt_tokens=list(range(49000, 49400)), response_tokens=[70000 + i for i in range(500)],
               loss_mask=[1] * 500, rollout_log_probs=[-0.123456789] * 500, metadata={"k": [1.5] * 40}, reward=1.0)
    group = [s.to_wire() for _ in range(8)]
    assert rollout_module._wire_bytes(group) >= len(msgpack.packb(group, use_bin_type=True))
    assert rollout_module._wire_bytes(group) >= len(encode_body({"samples": group})[0])
