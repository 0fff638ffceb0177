"""The buffer's rollback asked again with the same token (issue 31): the controller's start-up rollback whose reply was
lost on a link that reconnected ("Host unreachable" at the buffer) is asked again after a short wait instead of
waiting out the whole bound, and the buffer runs a rollback once however often it is asked -- a repeat that arrives
while the first still runs waits for it and gets its reply; one after it is answered from the record.

A real buffer (in this process, real mailboxes); the lost reply is the mailbox's own path for it (`_reply_lost`, as
ROUTER_MANDATORY reports EHOSTUNREACH), taken for the first reply to `rollback`."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import zmq
from structlog.testing import capture_logs

from slime_actors.actors import buffer as buffer_module
from slime_actors.actors.base import Actor
from slime_actors.actors.controller import Controller
from slime_actors.actors.controller.checkpoints import ROLLBACK_ATTEMPT_TIMEOUT, RollbackUnanswered
from slime_actors.mailbox import RemoteError
from slime_actors.runtime import RuntimeConfig

from test_buffer import ask, make_args, start, tiny  # noqa: F401  (tiny: the module's model, a fixture)

TOKEN = "start-4242-1700000000.0"
BODY = {"path": None, "if_ahead_of": 0, "reason": "job start", "token": TOKEN}


async def _handling(b, received: int) -> None:
    """Until the buffer has taken its `received`-th request, and the task handling it has run as far as it goes
    without waiting for something (the loop's ready queue is first in, first out)."""
    while b.mailbox.stats["received"] < received:
        await asyncio.sleep(0.01)
    for _ in range(20):
        await asyncio.sleep(0)


def _asked_twice_at_once(loop_thread, run_dir, tmp_path, tiny, monkeypatch, read):
    """A buffer with a training rollout from 0 on (so the rollback has work) asked to roll back by two workers with
    the same token, the second while the first is held in its snapshot's read (`read(path)`, in a thread). Returns
    (the buffer, the two workers, the two asks' futures, the paths read)."""
    b, w1, w2 = start(loop_thread, run_dir, make_args(tmp_path, tiny))
    ask(loop_thread, w1, "start_rollout", {"rollout_id": 0})
    entered, release, reads = threading.Event(), threading.Event(), []

    def held_read(path):
        reads.append(path)
        entered.set()
        release.wait(60)
        return read(path)
    monkeypatch.setattr(buffer_module, "_read", held_read)
    first = asyncio.run_coroutine_threadsafe(w1.ask("buffer/0", "rollback", BODY, timeout=60), loop_thread.loop)
    assert entered.wait(30), "the rollback did not start"
    received = b.mailbox.stats["received"]
    second = asyncio.run_coroutine_threadsafe(w2.ask("buffer/0", "rollback", BODY, timeout=60), loop_thread.loop)
    loop_thread.call(_handling(b, received + 1))
    release.set()
    return b, (w1, w2), (first, second), reads


def test_a_rollback_asked_again_while_it_runs_waits_for_it_and_runs_once(loop_thread, run_dir, tmp_path, tiny,
                                                                         monkeypatch):
    b, (w1, w2), (first, second), reads = _asked_twice_at_once(loop_thread, run_dir, tmp_path, tiny, monkeypatch,
                                                               buffer_module._read)
    r1, r2 = first.result(60), second.result(60)
    assert r1["rolled_back"] and r1["epoch"] == 1, r1
    assert r2 == r1, "the repeat did not get the first one's reply"
    assert len(reads) == 1, f"the rollback ran {len(reads)} times"
    acc = ask(loop_thread, w1, "accounting", {})
    assert acc["epoch"] == 1 and len(acc["rollbacks"]) == 1, acc
    # asked again once it is done: answered from the record, not run again
    assert ask(loop_thread, w2, "rollback", BODY) == r1
    assert len(reads) == 1 and ask(loop_thread, w1, "accounting", {})["epoch"] == 1
    for a in (w1, w2, b):
        loop_thread.call(a.stop())


def test_a_repeat_of_a_failing_rollback_gets_its_error_and_a_later_ask_runs_it_again(loop_thread, run_dir, tmp_path,
                                                                                     tiny, monkeypatch):
    def bad_read(path):
        raise ValueError(f"{path}: not a buffer snapshot")
    b, (w1, w2), asks, reads = _asked_twice_at_once(loop_thread, run_dir, tmp_path, tiny, monkeypatch, bad_read)
    for fut in asks:
        with pytest.raises(RemoteError, match="not a buffer snapshot"):
            fut.result(60)
    assert len(reads) == 1
    assert ask(loop_thread, w1, "accounting", {})["epoch"] == 0   # nothing was rolled back
    with pytest.raises(RemoteError, match="not a buffer snapshot"):   # asked after it failed: run again
        ask(loop_thread, w2, "rollback", BODY)
    assert len(reads) == 2
    for a in (w1, w2, b):
        loop_thread.call(a.stop())


class ControllerMailbox(Actor):
    """The controller's mailbox (controller/0): the Controller under test sends its asks through it."""
    role = "controller"


def _controller_and_lossy_buffer(loop_thread, run_dir, tmp_path, tiny, lose_all: bool):
    """A buffer with a training rollout from 0 on, whose first reply to `rollback` (every one: `lose_all`) is lost
    the way a reply to an asker whose connection went away is; a Controller (not started) whose asks go to it.
    Returns (the controller, the buffer, a worker, the ids of the asks whose replies were lost, the actors)."""
    args = make_args(tmp_path, tiny)
    b, w1, _ = start(loop_thread, run_dir, args)
    ask(loop_thread, w1, "start_rollout", {"rollout_id": 0})
    sender = ControllerMailbox(0)
    loop_thread.call(sender.start(RuntimeConfig(run_dir=run_dir, curve=False,
                                                static_peers={"buffer/0": b.endpoint})))
    ctl = Controller(0, args=args)
    ctl.ask = sender.ask
    real_reply, lost = b._reply_nowait, []

    def lossy_reply(inbound, body=None, *, error=None, host_copy=False):
        if inbound.header.get("method") == "rollback" and (lose_all or not lost):
            lost.append(inbound.header["id"])
            b.mailbox._reply_lost(inbound, zmq.ZMQError(zmq.EHOSTUNREACH))
            return None
        return real_reply(inbound, body, error=error, host_copy=host_copy)
    b._reply_nowait = lossy_reply
    return ctl, w1, lost, (sender, w1, b)


def test_the_controller_asks_again_when_the_rollback_reply_is_lost(loop_thread, run_dir, tmp_path, tiny):
    """The first reply to `rollback` is lost: the controller, with the bounds its start-up uses, asks again with the
    same token after ROLLBACK_ATTEMPT_TIMEOUT and gets the first rollback's result -- in seconds, not the 300 s it
    waited before -- logging the retry with its attempt number."""
    ctl, w1, lost, actors = _controller_and_lossy_buffer(loop_thread, run_dir, tmp_path, tiny, lose_all=False)
    assert ROLLBACK_ATTEMPT_TIMEOUT <= 30
    t0 = time.monotonic()
    with capture_logs() as logs:
        # as loop.prepare asks it (its bound: 300 s); the test waits 120 s
        rb = loop_thread.call(ctl.checkpoints.rollback_buffer(0, "job start", token=TOKEN), timeout=120)
    took = time.monotonic() - t0
    assert lost, "no reply was lost: the test did not test anything"
    assert rb["rolled_back"] and rb["epoch"] == 1, rb
    assert took < 120, took   # (a generous bound: ROLLBACK_ATTEMPT_TIMEOUT and a retry's wait)
    retries = [e for e in logs if e["event"] == "buffer rollback failed; retrying"]
    assert [e["attempt"] for e in retries] == [1], logs
    assert retries[0]["token"] == TOKEN and "got no reply" in retries[0]["error"]
    acc = ask(loop_thread, w1, "accounting", {})
    assert acc["epoch"] == 1 and len(acc["rollbacks"]) == 1, acc
    for a in actors:
        loop_thread.call(a.stop())


def test_a_rollback_never_answered_ends_at_the_bound_naming_it(loop_thread, run_dir, tmp_path, tiny):
    """Every reply lost: the controller gives up after its bound (here 3 s, 1 s an attempt), with an error naming
    the bound and the attempts."""
    ctl, _, lost, actors = _controller_and_lossy_buffer(loop_thread, run_dir, tmp_path, tiny, lose_all=True)
    with pytest.raises(RollbackUnanswered, match=r"no reply within 3 s in all \(\d+ attempt\(s\) of at most 1 s"):
        loop_thread.call(ctl.checkpoints.rollback_buffer(0, "job start", token=TOKEN, timeout=3.0,
                                                         attempt_timeout=1.0), timeout=60)
    assert len(lost) >= 2
    for a in actors:
        loop_thread.call(a.stop())
