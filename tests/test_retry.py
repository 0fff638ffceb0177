"""The retry helper (slime_actors/retry.py): attempts, deadline, backoff, which errors, notes, logging -- on a fake
clock and sleep, so nothing waits."""

from __future__ import annotations

import asyncio

import pytest

from slime_actors.mailbox.errors import AskTimeout, MailboxError, PeerDown, RemoteError, transient
from slime_actors.retry import RetryPolicy, retry


class FakeTime:
    def __init__(self):
        self.now = 100.0
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.waits.append(s)
        self.now += s


class Log:
    def __init__(self):
        self.lines: list[tuple[str, dict]] = []

    def warning(self, msg, **kw):
        self.lines.append((msg, kw))


def failing(n: int, exc_type=ConnectionError, result="ok"):
    """A call that fails `n` times, then returns `result`; .calls counts the tries."""
    def fn():
        fn.calls += 1
        if fn.calls <= n:
            raise exc_type(f"failure {fn.calls}")
        return result

    async def call():
        return fn()
    call.fn = fn
    fn.calls = 0
    return call


def run(coro):
    return asyncio.run(coro)


def test_retries_until_success_with_exponential_backoff():
    t, log = FakeTime(), Log()
    call = failing(3)
    pol = RetryPolicy(attempts=5, base=0.5, factor=2, max_delay=1.5)
    assert run(retry(call, pol, what="thing", log=log, clock=t.clock, sleep=t.sleep, peer="x/0")) == "ok"
    assert call.fn.calls == 4
    assert t.waits == [0.5, 1.0, 1.5]       # capped at max_delay
    assert [kw["attempt"] for _, kw in log.lines] == [1, 2, 3]
    assert log.lines[0][0] == "thing failed; retrying" and log.lines[0][1]["error"] == "failure 1"
    assert log.lines[0][1]["peer"] == "x/0"


def test_gives_up_after_attempts_with_the_last_error_and_a_note():
    t = FakeTime()
    call = failing(10)
    with pytest.raises(ConnectionError, match="failure 3") as e:
        run(retry(call, RetryPolicy(attempts=3), what="submit", clock=t.clock, sleep=t.sleep))
    assert call.fn.calls == 3 and len(t.waits) == 2
    assert "submit: gave up after 3 attempt(s)" in e.value.__notes__


def test_deadline_counts_from_the_first_failure():
    t = FakeTime()
    call = failing(100)
    pol = RetryPolicy(attempts=None, deadline=3.0, base=1.0, factor=1.0)
    with pytest.raises(ConnectionError) as e:
        run(retry(call, pol, what="join", clock=t.clock, sleep=t.sleep))
    # failures at t=0,1,2,3 (not past the deadline: retried), the one at t=4 is raised
    assert call.fn.calls == 5 and t.waits == [1.0] * 4
    assert any("over 4 s" in n for n in e.value.__notes__)


def test_errors_outside_the_policy_are_raised_at_once():
    t = FakeTime()
    call = failing(1, exc_type=ValueError)
    with pytest.raises(ValueError):
        run(retry(call, RetryPolicy(retry_on=(ConnectionError,)), what="x", clock=t.clock, sleep=t.sleep))
    assert call.fn.calls == 1 and t.waits == []


def test_retry_if_narrows_retry_on():
    t = FakeTime()
    handler_error = RemoteError("buffer/0", "get_batch", "ValueError", "bad rollout id")
    stopped = RemoteError("buffer/0", "get_batch", "MailboxError", "buffer/0 stopped while handling get_batch")
    seq = [stopped, AskTimeout("buffer/0", "get_batch", 1.0), handler_error]

    async def call():
        raise seq.pop(0)
    pol = RetryPolicy(attempts=10, retry_on=(MailboxError,), retry_if=transient)
    with pytest.raises(RemoteError, match="bad rollout id"):
        run(retry(call, pol, what="get_batch", clock=t.clock, sleep=t.sleep))
    assert seq == [] and len(t.waits) == 2


def test_cancellation_is_never_retried():
    t = FakeTime()

    async def call():
        raise asyncio.CancelledError()
    with pytest.raises(asyncio.CancelledError):
        run(retry(call, RetryPolicy(retry_on=(BaseException,)), what="x", clock=t.clock, sleep=t.sleep))
    assert t.waits == []


def test_on_retry_sees_each_failure():
    t = FakeTime()
    seen = []
    run(retry(failing(2), RetryPolicy(), what="x", clock=t.clock, sleep=t.sleep,
              on_retry=lambda n, exc: seen.append((n, str(exc)))))
    assert seen == [(1, "failure 1"), (2, "failure 2")]


def test_jitter_shortens_waits_within_bounds():
    t = FakeTime()
    run(retry(failing(20), RetryPolicy(attempts=21, base=1.0, factor=1.0, jitter=0.5), what="x", clock=t.clock,
              sleep=t.sleep))
    assert all(0.5 <= w <= 1.0 for w in t.waits) and len(set(t.waits)) > 1


@pytest.mark.parametrize("kw, msg", [
    ({"attempts": None}, "give attempts, a deadline, or both"),
    ({"attempts": 0}, "attempts must be >= 1"),
    ({"deadline": -1}, "deadline must be >= 0"),
    ({"factor": 0.5}, "factor >= 1"),
    ({"jitter": 2}, "jitter must be between 0 and 1"),
    ({"retry_on": ConnectionError}, "retry_on must be a tuple of exception classes"),
])
def test_bad_policies_are_refused(kw, msg):
    with pytest.raises(ValueError, match=msg):
        RetryPolicy(**kw)


def test_transient_mailbox_errors():
    assert transient(PeerDown("buffer/0", "get_batch"))
    assert transient(AskTimeout("buffer/0", "get_batch", 3))
    assert transient(RemoteError("buffer/0", "submit", "MailboxError", "stopped while handling"))
    # a peer too busy to read the ask before its deadline did nothing: asking again may succeed (a loaded CI machine
    # ended a job when the buffer answered the controller's start-up rollback so)
    assert transient(RemoteError("buffer/0", "rollback", "DeadlineExceeded", "deadline passed before handling"))
    assert not transient(RemoteError("buffer/0", "rollback", "UnknownMethod", "unknown method"))
    assert not transient(RemoteError("buffer/0", "submit", "KeyError", "no such group"))
    assert not transient(ValueError("not a mailbox error"))


def test_a_deadline_can_count_from_before_the_first_try():
    t = FakeTime()
    started = t.now
    t.now += 2.5                     # the first try began at `started` and took 2.5 s to fail

    async def call():
        t.now += 0.5
        raise ConnectionError("no head yet")
    pol = RetryPolicy(attempts=None, deadline=3.0, base=1.0, factor=1.0)
    with pytest.raises(ConnectionError) as e:
        run(retry(call, pol, what="join", clock=t.clock, sleep=t.sleep, started=started))
    # failures at 3.0 (not past the deadline: retried) and 4.5 s after `started` (raised)
    assert t.waits == [1.0] and any("over 4 s" in n for n in e.value.__notes__)


def test_describe_names_the_error_in_the_log():
    t, log = FakeTime(), Log()
    run(retry(failing(1, TimeoutError), RetryPolicy(), what="post", log=log, clock=t.clock, sleep=t.sleep,
              describe=lambda exc: f"{type(exc).__name__}!"))
    assert log.lines[0][1]["error"] == "TimeoutError!"
