"""The controller's side of checkpoints (--save, --load, --save-hf; the layout: slime_actors/checkpoints.py).

A save after rollout k writes DIR/iter_{k+1:07d}: every trainer rank its model and optimizer, the buffer its state,
and the controller meta.json (the next rollout id, the weight version, its RNG state, the evaluations so far), then
latest_checkpointed_iteration.txt. DIR is --save, or -- without it -- the rolling RUN_DIR/ckpt, where only the
newest checkpoint is kept (the older one goes once the new one is complete). `latest` is the checkpoint a
(re)started training group loads: the one the job resumed from, then the last one saved; `restore` gives back what
meta.json holds.

`rollback_buffer` asks the buffer to go back to `latest` (at the job's start and when the training group restarts).
Each ask waits at most ROLLBACK_ATTEMPT_TIMEOUT for its reply; one that got none -- a reply lost on a link that
reconnected meanwhile ("Host unreachable" at the buffer), a buffer restarting -- is asked again with the same token,
which the buffer answers with the first one's result (waiting for it while it still runs), until the caller's bound
is spent.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from ...mailbox.errors import MailboxError, transient
from ...messages import RolledBack
from ...retry import RetryPolicy, retry
from ...role_handles import BufferHandle

from ...checkpoints import (ROLLING_KEEP, ROLLING_MARKER, commit_checkpoint, hf_export_due, hf_export_path, iter_dir,
                           latest_checkpoint, prune, read_meta, resolve_load, rolling, rolling_conflict, save_interval,
                           save_root)

if TYPE_CHECKING:
    from .actor import Controller

# the buffer's rollback is asked again (the same token) after this many seconds without a reply: a reply lost on a
# link that reconnected is not waited out for the whole bound. A rollback that takes longer (a large snapshot read
# under load) is not run twice: the buffer answers the repeat when the first one is done.
ROLLBACK_ATTEMPT_TIMEOUT = 10.0
# asked again on what a repeat may cure (no reply, the buffer declared down or restarting); the bound is the caller's
ROLLBACK_RETRY = RetryPolicy(attempts=None, deadline=300.0, base=0.5, factor=2.0, max_delay=2.0,
                             retry_on=(MailboxError,), retry_if=transient)


class _Spent(Exception):
    """rollback_buffer's bound is spent before another attempt (not retried: retry raises it at once)."""


class RollbackUnanswered(TimeoutError):
    """The buffer gave no reply to its rollback within the caller's bound, over every attempt."""

    def __init__(self, peer: str, token: str, reason: str, bound: float, attempts: int, per: float,
                 last: BaseException):
        self.peer, self.token, self.bound, self.attempts = peer, token, bound, attempts
        super().__init__(f"{peer}.rollback ({reason}, token {token}): no reply within {bound:g} s in all "
                         f"({attempts} attempt(s) of at most {per:g} s each; the last: {last})")


class Checkpoints:
    def __init__(self, ctl: Controller, resume_from_save: bool):
        self.ctl = ctl
        self.cfg = ctl.cfg
        self.resume_from_save = resume_from_save  # a restarted job (torchrun) resumes from the newest under --save
        self.latest: Path | None = None
        self.started_from: dict | None = None   # the checkpoint the job started from (loop.prepare), for the summary
        self._initial_rng = random.getstate()
        self._root: tuple[Path | None, bool] | None = None
        # the rollback's asks, without the retrying of ctl.buffer: rollback_buffer bounds each attempt and the total
        self._buffer = BufferHandle(ctl, "buffer/0")

    def _where(self) -> tuple[Path | None, bool]:
        """(where checkpoints go, whether that is the rolling RUN_DIR/ckpt), decided once the runtime is known (the
        run directory as this process reaches it)."""
        if self._root is None:
            cfg, rt = self.cfg, getattr(self.ctl, "runtime", None)
            run_dir = getattr(rt, "run_dir", None) or cfg.run.run_dir
            root, roll = save_root(cfg, run_dir), rolling(cfg)
            if roll:
                conflict = rolling_conflict(cfg, run_dir)
                if conflict:  # never written into: it is not ours
                    self.ctl.log.warning(f"no rolling checkpoint this run: {conflict}; give --save DIR to keep "
                                         "checkpoints")
                    root, roll = None, False
            self._root = (root, roll)
        return self._root

    @property
    def root(self) -> Path | None:
        return self._where()[0]

    @property
    def rolling(self) -> bool:
        return self._where()[1]

    def find(self) -> Path | None:
        """The checkpoint the job starts from: the newest under --save (or the rolling one) for a restarted job,
        else --load's."""
        save = self.root
        if self.resume_from_save and save:
            ckpt = latest_checkpoint(save)
            if ckpt is not None:
                self.latest = ckpt
                return ckpt
        self.latest = resolve_load(self.cfg)  # (the head checked --load before the job started: this does not raise)
        return self.latest

    def restore(self) -> tuple[int, int]:
        """(first rollout id, weight version) of `latest` -- or of the run's start -- and its RNG state and evals."""
        ctl, start = self.ctl, self.cfg.run.start_rollout_id or 0
        if self.latest is None:
            random.setstate(self._initial_rng)
            ctl.evaluations.history = [e for e in ctl.evaluations.history if e["step"] <= start]
            return start, 0
        meta = read_meta(self.latest)
        if "controller_rng" in meta:   # (checked by read_meta)
            random.setstate(_tuple_state(meta["controller_rng"]))
        ctl.evaluations.history = meta.get("evals", [])
        return meta["next_rollout_id"], meta["weight_version"]

    async def rollback_buffer(self, start: int, reason: str, token: str, timeout: float = 300.0,
                              attempt_timeout: float = ROLLBACK_ATTEMPT_TIMEOUT) -> RolledBack:
        """Bring the buffer back to `latest` when it holds rollouts from `start` on (idempotent per `token`).

        Each ask waits at most `attempt_timeout` s; one that got no reply (or found the buffer down or restarting)
        is asked again with the same token, each retry logged with its attempt number, for at most `timeout` s in
        all -- then RollbackUnanswered names that bound and the attempts. An error the buffer's handler raised is
        not retried."""
        ctl = self.ctl
        per = min(attempt_timeout, timeout)
        # The clock is read only once an attempt failed (a recorded input: a replay of a run whose first ask was
        # answered reads none). The first failure comes at most `per` s after the start: the retries get what is
        # left of `timeout` after that.
        window = timeout - per
        failed_at: list[float] = []   # retry's clock readings, one per failed attempt
        errors: list[BaseException] = []

        def clock() -> float:
            failed_at.append(ctl.monotonic())
            return failed_at[-1]

        def ask() -> Awaitable[RolledBack]:
            wait = per
            if failed_at:
                wait = min(per, failed_at[0] + window - ctl.monotonic())
                if wait <= 0:
                    raise _Spent()
            return self._buffer.rollback(path=str(self.latest) if self.latest else None, if_ahead_of=start,
                                         reason=reason, token=token, ask_timeout=wait)
        try:
            rb = await retry(ask, ROLLBACK_RETRY.replace(deadline=window), what="buffer rollback", log=ctl.log,
                             clock=clock, on_retry=lambda n, exc: errors.append(exc), token=token,
                             attempt_timeout=per, bound=timeout)
        except (_Spent, MailboxError) as exc:
            if isinstance(exc, MailboxError) and not transient(exc):
                raise
            last = exc if isinstance(exc, MailboxError) else errors[-1]
            raise RollbackUnanswered(self._buffer.name, token, reason, timeout, len(errors) + (exc is last), per,
                                     last) from last
        if rb.get("rolled_back"):
            ctl.log.warning("buffer rolled back to the checkpoint", **{k: v for k, v in rb.items()
                                                                       if k != "rolled_back"})
        return rb

    def save_due(self, k: int, stopping: bool = False) -> bool:
        """After rollout k: every --save-interval steps (the rolling checkpoint: every 5), after the last -- also with
        --save and no --save-interval, which saved nothing at all before -- and when the run stops (--hack-alarms
        stop)."""
        every = save_interval(self.cfg)
        return self.root is not None and (stopping or k + 1 == self.cfg.run.num_rollout
                                          or bool(every and (k + 1) % every == 0))

    def save_hf_due(self, k: int) -> bool:
        return bool(self.cfg.checkpoint.save_hf) and not self.cfg.debug.debug_rollout_only and hf_export_due(self.cfg, k)

    async def save(self, k: int) -> float:
        """Checkpoint after rollout k; the seconds it took."""
        ctl, t0 = self.ctl, time.monotonic()
        root = self.root
        if root is None:
            raise RuntimeError("no checkpoint directory: --save, or the rolling one (save_due said no)")
        if self.rolling:
            root.mkdir(parents=True, exist_ok=True)
            (root / ROLLING_MARKER).touch()
        path = iter_dir(root, k + 1)
        path.mkdir(parents=True, exist_ok=True)
        save_optim = not self.cfg.checkpoint.no_save_optim
        await asyncio.gather(ctl.trainers.save(str(path), save_optim=save_optim, ask_timeout=3600),
                             ctl.buffer.save(str(path), ask_timeout=600))
        meta = {"next_rollout_id": k + 1, "weight_version": ctl.version, "controller_rng": random.getstate(),
                "evals": ctl.evaluations.history, "time": time.time()}
        self.latest = commit_checkpoint(root, k + 1, meta)  # what a restarted training group loads
        if self.rolling:
            prune(root, k + 1, ROLLING_KEEP)
        ctl.log.info("checkpoint saved", path=str(path), rolling=self.rolling)
        return time.monotonic() - t0

    async def save_hf(self, k: int) -> float:
        """--save-hf after rollout k: every trainer rank takes part (gathering), rank 0 writes the directory."""
        t0 = time.monotonic()
        spec = self.cfg.checkpoint.save_hf
        if not spec:
            raise RuntimeError("--save-hf is not given (save_hf_due said no)")
        path = hf_export_path(spec, k)
        await self.ctl.trainers.save_hf(str(path), rollout_id=k, ask_timeout=3600)
        self.ctl.log.info("HF model saved", path=str(path), rollout_id=k, weight_version=self.ctl.version)
        return time.monotonic() - t0


def _tuple_state(s):
    return (s[0], tuple(s[1]), s[2])
