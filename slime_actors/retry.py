"""One way to retry: a policy says how often, how long, how far apart and on which errors; `retry` runs an async call
under it, logs each retry, and raises the last error unchanged when the policy gives up.

    policy = RetryPolicy(deadline=600, base=0.4, max_delay=2.0, retry_on=(MailboxError,), retry_if=transient)
    batch = await retry(lambda: self.ask("buffer/0", "get_batch", body), policy, what="get_batch", log=self.log)

* `attempts`: tries in all, the first one included (None: no limit -- then `deadline` bounds the retrying).
* `deadline`: seconds, counted from the first failure (so a call that succeeds reads no clock), after which the
  next failure is raised instead of retried. A caller whose window opened earlier (before its first try) passes
  `started`, the clock reading to count from.
* backoff: the n-th wait is `base * factor ** (n - 1)`, at most `max_delay`, scaled by a random factor in
  [1 - jitter, 1] when `jitter` is set (many callers retrying at once spread out).
* which errors: those of `retry_on` for which `retry_if(exc)` (when given) is true; anything else is raised at once,
  and so is cancellation.

The error that ends the retrying is raised as it was (callers catch what they caught before), with a note saying
how many tries were made over how long. `clock` and `sleep` can be replaced (an actor under replay passes its
recorded clock); `describe` says how a log line names an error (default: its text, else its repr).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int | None = 5
    deadline: float | None = None
    base: float = 0.2
    factor: float = 2.0
    max_delay: float = 5.0
    jitter: float = 0.0
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    retry_if: Callable[[BaseException], bool] | None = None

    def __post_init__(self):
        if self.attempts is None and self.deadline is None:
            raise ValueError("RetryPolicy: give attempts, a deadline, or both (otherwise it would retry forever)")
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"RetryPolicy: attempts must be >= 1 (got {self.attempts})")
        if self.deadline is not None and self.deadline < 0:
            raise ValueError(f"RetryPolicy: deadline must be >= 0 seconds (got {self.deadline})")
        if self.base < 0 or self.max_delay < 0 or self.factor < 1:
            raise ValueError(f"RetryPolicy: base and max_delay must be >= 0 and factor >= 1 (got base={self.base}, "
                             f"max_delay={self.max_delay}, factor={self.factor})")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"RetryPolicy: jitter must be between 0 and 1 (got {self.jitter})")
        if not isinstance(self.retry_on, tuple) or not all(isinstance(t, type) and issubclass(t, BaseException)
                                                           for t in self.retry_on):
            raise ValueError(f"RetryPolicy: retry_on must be a tuple of exception classes (got {self.retry_on!r})")

    def delay(self, failures: int) -> float:
        """Seconds to wait after the `failures`-th failure (1-based)."""
        d = min(self.max_delay, self.base * self.factor ** max(0, failures - 1))
        return d * (1.0 - self.jitter * random.random()) if self.jitter else d

    def retryable(self, exc: BaseException) -> bool:
        if isinstance(exc, asyncio.CancelledError) or not isinstance(exc, self.retry_on):
            return False
        return self.retry_if is None or bool(self.retry_if(exc))

    def replace(self, **changes) -> RetryPolicy:
        return dataclasses.replace(self, **changes)


async def retry(fn: Callable[[], Awaitable[T]], policy: RetryPolicy, *, what: str, log: Any = None,
                clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                on_retry: Callable[[int, BaseException], Any] | None = None, started: float | None = None,
                describe: Callable[[BaseException], str] | None = None, **log_fields) -> T:
    """`await fn()`, again after each failure the policy retries; the last failure is raised (see the module's
    docstring). `on_retry(failures, exc)` runs before each wait; `log` (a structlog logger) gets a warning per retry
    naming `what`, the error (`describe(exc)`) and the attempt, with `log_fields` added. `started`: a `clock()`
    reading the deadline counts from instead of the first failure."""
    failures = 0
    first_failure: float | None = started
    while True:
        try:
            return await fn()
        except Exception as exc:
            if not policy.retryable(exc):
                raise
            failures += 1
            now = clock()
            if first_failure is None:
                first_failure = now
            spent = now - first_failure
            if policy.attempts is not None and failures >= policy.attempts:
                exc.add_note(f"{what}: gave up after {failures} attempt(s)")
                raise
            if policy.deadline is not None and spent > policy.deadline:
                exc.add_note(f"{what}: gave up after {failures} attempt(s) over {spent:.0f} s")
                raise
            delay = policy.delay(failures)
            if on_retry is not None:
                on_retry(failures, exc)
            if log is not None:
                error = describe(exc) if describe is not None else str(exc) or repr(exc)
                log.warning(f"{what} failed; retrying", error=error, attempt=failures, retry_in=round(delay, 3),
                            **log_fields)
            await sleep(delay)
