"""What the RL loop (loop.py) may use of the controller: its config and state, typed handles on the other roles,
its parts, and the steps of a job. `Controller` (actor.py) provides it; tests/test_controller_surface.py fails when
the loop reaches for anything else (an actor's ask/tell, its runtime, ...: those belong in a part)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ...config import JobConfig
    from ...role_handles import BufferHandle, TrainerGroup
    from .checkpoints import Checkpoints
    from .debug_data import DebugData
    from .engines import Engines
    from .evaluations import Evaluations
    from .metrics import Metrics
    from .startup import StartupReport
    from .training_group import TrainingGroup


class Ctl(Protocol):
    # the job's config, the controller's log
    cfg: JobConfig
    log: Any
    # the run's state: the policy's weight version (+1 per training step); the phase (for `status`, and for what a
    # restarted engine may do): starting, sync, idle, rollout, train, eval, recovering, done
    version: int
    phase: str
    # the other roles (slime_actors/handles.py): the buffer, and every trainer rank at once
    buffer: BufferHandle
    trainers: TrainerGroup
    # the parts (one file each)
    engines: Engines
    group: TrainingGroup
    checkpoints: Checkpoints
    evaluations: Evaluations
    debug_data: DebugData
    metrics: Metrics
    startup: StartupReport

    # the steps of a job
    async def wait_for_actors(self, timeout: float = 900.0) -> None:
        """Until the directory lists every actor the job needs as alive."""

    def begin_step(self, k: int) -> dict:
        """Step k begins: its metrics row."""

    def start_token(self) -> str:
        """Names this controller process (the buffer's rollbacks are idempotent per token); read once."""
