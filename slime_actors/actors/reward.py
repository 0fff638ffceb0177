"""A reward worker: scores samples with the configured reward function (--rm-type, --custom-rm-path, --group-rm).

A reward function that raises loses nothing: the failing samples come back with an error instead of a reward, the
rollout worker retries them (on another reward worker if there is one), and a group that still cannot be scored is
handed to the buffer as failed, where it is recorded and replaced by a fresh prompt.

Your own reward actor: docs/adding-a-reward-actor.md.
"""

from __future__ import annotations

import argparse

from ..types import Sample
from .base import Actor, handler


class RewardWorker(Actor):
    role = "reward"

    def __init__(self, index: int = 0, **config):
        super().__init__(index, **config)
        self.args = argparse.Namespace(**config["args"])
        self.counters.update({"scored": 0, "reward_errors": 0})

    async def on_start(self) -> None:
        # import the reward modules (math-verify, sympy: seconds) and load a custom function before serving, off
        # the event loop, so the first `score` does not stall the mailbox and bad paths fail at start-up
        await self.run_blocking(_prepare, self.args)

    @handler
    async def score(self, samples: list, group: bool = False) -> dict:
        from ..rewards import score_samples
        parsed = [Sample.from_wire(s) for s in samples]
        rewards, errors = await score_samples(self.args, parsed, group=group or self.args.group_rm,
                                              concurrency=self.args.reward_batch_size)
        n_err = sum(1 for e in errors if e is not None)
        self.counters["scored"] += len(parsed) - n_err
        self.counters["reward_errors"] += n_err
        if n_err:
            first = next(e for e in errors if e is not None)
            self.log.warning("reward function failed", samples=n_err, of=len(parsed), first_error=first)
        return {"rewards": rewards, "errors": errors}


def _prepare(args) -> None:
    from ..rewards import check_reward_args
    if getattr(args, "reward_actor_class", None) is None or args.rm_type or args.custom_rm_path:
        check_reward_args(args)
