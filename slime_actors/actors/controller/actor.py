"""The controller: the actor that runs the RL loop (loop.py: the synchronous and the asynchronous schedule on one
page) and answers the messages about it -- engines reporting ready, trainer ranks joining their group, `status`.

What it keeps: the job's config, the current weight version and rollout id, the phase (for `status` and for what a
restarted engine may do). What the loop may use of it is declared in surface.py (`Ctl`). Its parts, one file each in
this package and each built as `Part(ctl)`: typed handles on the buffer and the trainer ranks
(slime_actors/handles.py), the engines (engines.py), the training group and its recovery (training_group.py),
checkpoints (checkpoints.py), evaluations (evaluations.py), the debug-data modes (debug_data.py), the start-up
breakdown printed after the first step (startup.py), metrics, the hack
alarms and the result (metrics.py: JSONL, TensorBoard and W&B, RUN_DIR/alarms.jsonl; with --hack-alarms stop the run
ends after the step whose rollout tripped an alarm, with a checkpoint).
"""

from __future__ import annotations

import asyncio
import os

from ...role_handles import BufferHandle, DirectoryHandle, TrainerGroup, TrainerHandle
from ..base import DIRECTORY, Actor, handler
from . import loop
from .checkpoints import Checkpoints
from .debug_data import DebugData
from .engines import Engines
from .evaluations import Evaluations
from .metrics import Metrics
from .startup import StartupReport
from .training_group import TrainingGroup

BUFFER_RETRY_FOR = 600.0  # seconds an ask to the buffer is retried while it restarts (its methods are idempotent)


class Controller(Actor):
    role = "controller"

    def __init__(self, index: int = 0, resume_from_save: bool = False, **config):
        """`resume_from_save`: a restarted job (torchrun) resumes from the newest checkpoint under --save."""
        super().__init__(index, resume_from_save=resume_from_save, **config)   # (self.cfg: the job's config)
        self.version = 0                      # the policy's weight version (+1 per training step)
        self.rollout_id = 0                   # the step running
        self.phase = "starting"               # starting, sync, idle, rollout, train, eval, recovering, done
        self._start_token: str | None = None  # (start_token)
        self.done: asyncio.Future[dict] | None = None  # the job's result (or its error): the launcher waits on it
        # the other roles, as typed handles (slime_actors/handles.py), and the controller's parts
        self.directory = DirectoryHandle(self, DIRECTORY)
        self.buffer = BufferHandle(self, "buffer/0", retry_for=BUFFER_RETRY_FOR, log=self.log)
        self.trainers = TrainerGroup(TrainerHandle(self, f"trainer/{r}") for r in range(self.cfg.train.n_ranks))
        self.engines = Engines(self)
        self.checkpoints = Checkpoints(self, resume_from_save)
        self.group = TrainingGroup(self)
        self.evaluations = Evaluations(self)
        self.debug_data = DebugData(self)
        self.metrics = Metrics(self)
        self.startup = StartupReport(self)

    @property
    def result(self) -> dict:
        return self.metrics.result

    async def on_start(self) -> None:
        self.done = asyncio.get_running_loop().create_future()
        self.checkpoints.find()
        self.group.start()
        self.spawn(self._run(), name="loop")

    async def _run(self) -> None:
        try:
            await loop.run(self)
            self.phase = "done"
            if self.done is not None and not self.done.done():
                self.done.set_result(self.result)
        except Exception as exc:
            self.metrics.flush()   # (the rows of the steps that ended)
            self.log.error("training loop failed", error=repr(exc))
            self.stop_job(exc)

    def begin_step(self, k: int) -> dict:
        """Step k begins: its metrics row (filled in as it runs, written at its end)."""
        self.rollout_id = k
        return self.metrics.begin(k, self.version)

    def start_token(self) -> str:
        """Names this controller process (the buffer's rollback at the job's start is idempotent per token, and a
        training-group restart's token carries it); a recorded input read once: a replay sends the recorded token."""
        if self._start_token is None:
            self._start_token = self.recorded("start_token", lambda: f"start-{os.getpid()}-{self.started_at}")
        return self._start_token

    def stop_job(self, exc: BaseException) -> None:
        """End the job with this error (the launcher waits on `done`)."""
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc)

    async def wait_for_actors(self, timeout: float = 900.0) -> None:
        """Wait until the directory lists every actor the job needs as alive, and the buffer serves."""
        names = ["buffer/0"] + self.trainers.names
        if not self.cfg.debug.debug_train_only:
            names += self.engines.names + [f"reward/{i}" for i in range(self.cfg.reward.num_reward_workers)]
        self.log.info("waiting for actors", actors=len(names))
        t0 = None
        while True:
            listing = await self.directory.list(ask_timeout=30)
            missing = [n for n in names if not (n in listing and listing[n].get("alive"))]
            if not missing:
                break
            if t0 is None:  # (recorded clock readings: a replay takes the same turns)
                t0 = self.monotonic()
            elif self.monotonic() - t0 > timeout:
                raise TimeoutError(f"actors did not come up within {timeout:.0f}s: {', '.join(missing)}")
            await asyncio.sleep(0.2)
        # An actor is listed once its process runs; its requests wait until its start has finished. The buffer's
        # start loads the prompts (20 s for 2000 chat prompts on a GPU machine busy starting SGLang): wait for it
        # here, so that the job's first ask to it -- the rollback at the start, 10 s an attempt -- is not given up
        # and asked again while the buffer is still loading.
        await self.buffer._ping(ask_timeout=timeout)

    # ------------------------------------------------------------------------------------------ messages
    @handler
    async def trainer_join(self, rank: int, world_size: int, addr: str, port: int, pid: int) -> dict:
        """A trainer rank joins the training group; answered when every rank of this generation has joined."""
        return await self.group.join(rank, world_size, addr, port, pid)

    @handler
    def trainer_ready(self, rank: int, generation: int, weight_version: int = 0) -> None:
        self.group.ready_rank(rank, generation)

    @handler
    async def engine_ready(self, worker: str, weight_version: int) -> None:
        """An engine (re)started: bring it to the current weights, then let it work if a rollout is running."""
        self.engines.ready(worker, weight_version)

    @handler
    def rollout_failed(self, worker: str, error: str) -> None:
        """A rollout worker cannot go on (--env-error stop): the job ends with its error."""
        self.log.error("a rollout worker stops the job", worker=worker, error=error)
        self.stop_job(RuntimeError(error))

    @handler
    def status(self) -> dict:
        history = self.metrics.history
        return {"phase": self.phase, "rollout_id": self.rollout_id, "weight_version": self.version,
                "engines": self.engines.versions, "last": history[-1] if history else None,
                "steps": len(history), "num_rollout": self.cfg.run.num_rollout,
                "trainer_generation": self.group.rdzv.generation if self.group.rdzv else None,
                "recoveries": self.group.recoveries, "stopped": self.metrics.stopped}

    async def on_peer_down(self, name: str, reason: str) -> None:
        if name in self.trainers.names:
            self.group.failed(f"{name} is down ({reason})")
