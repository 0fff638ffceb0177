"""A reward worker: scores samples with the configured reward function (--rm-type, --custom-rm-path, --group-rm).

A reward function that raises loses nothing: the failing samples come back with an error instead of a reward, the
rollout worker retries them (on another reward worker if there is one), and a group that still cannot be scored is
handed to the buffer as failed, where it is recorded and replaced by a fresh prompt.

Your own reward actor: docs/adding-a-reward-actor.md.
"""

from __future__ import annotations

from ..config import JobConfig, RewardSection
from ..types import Sample
from .base import Actor, handler


class RewardWorker(Actor):
    role = "reward"

    def __init__(self, index: int = 0, **config):
        super().__init__(index, **config)
        self.cfg = JobConfig.from_dict(config["args"])
        self.plugin_args = self.cfg.flat()   # what reward functions get (slime's `args`)
        self.counters.update({"scored": 0, "reward_errors": 0, "reward_timeouts": 0})

    async def on_start(self) -> None:
        # import the reward modules and load a custom function before serving, off the event loop, so the first
        # `score` does not stall the mailbox and bad paths fail at start-up; start the math grading processes
        # (each imports sympy and math-verify: about a second) when a math rule is configured
        problem = await self.run_blocking(_prepare, self.cfg.reward, self.plugin_args)
        if problem:
            self.log.warning("math grading processes did not start: labels that are plain numbers are graded, "
                             "others fail with this error", error=problem)

    async def on_stop(self) -> None:
        from ..rewards.grading import close_grading_pool
        close_grading_pool()

    @handler
    async def score(self, samples: list, group: bool = False) -> dict:
        from ..rewards import score_samples
        parsed = [Sample.from_wire(s) for s in samples]
        rw = self.cfg.reward
        rewards, errors = await score_samples(self.plugin_args, parsed, group=group or rw.group_rm,
                                              concurrency=rw.reward_batch_size)
        n_err = sum(1 for e in errors if e is not None)
        timed_out = [bool(s.metadata.get("reward_timed_out")) for s in parsed]
        self.counters["scored"] += len(parsed) - n_err
        self.counters["reward_errors"] += n_err
        self.counters["reward_timeouts"] += sum(timed_out)
        if n_err:
            first = next(e for e in errors if e is not None)
            self.log.warning("reward function failed", samples=n_err, of=len(parsed), first_error=first)
        if any(timed_out):
            self.log.warning("grading ran out of time; those samples score 0", samples=sum(timed_out),
                             of=len(parsed), timeout_s=rw.math_grading_timeout)
        return {"rewards": rewards, "errors": errors, "timed_out": timed_out}


MATH_RULES = ("math", "boxed_math", "deepscaler")


def _prepare(rw: RewardSection, args) -> str | None:
    """Check the reward flags (raises); start the grading processes for a math rule. Returns why they could not
    start (math-verify missing, say), or None. `args`: the flat view reward functions get."""
    from ..rewards import GradingError, check_reward_args, grading_pool
    if rw.reward_actor_class is None or rw.rm_type or rw.custom_rm_path:
        check_reward_args(args)
    pool = grading_pool(rw.math_grading_processes)
    if (rw.rm_type or "").removeprefix("boxed_") in MATH_RULES and not rw.custom_rm_path:
        try:
            pool.warm_up()
        except GradingError as exc:
            return str(exc)
    return None
