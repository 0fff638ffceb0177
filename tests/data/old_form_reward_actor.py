# A reward actor in the form docs/adding-a-reward-actor.md showed before `RewardActor` existed, kept word for word
# (only this comment added): an `Actor` of role `reward` that rebuilds the job's flags with argparse.Namespace,
# decodes the wire samples itself and answers the `score` message with {rewards, errors}.
# tests/test_reward_actor.py::test_a_reward_actor_of_the_old_form_still_scores_for_a_rollout_worker keeps it working.
"""A reward actor of your own: it plays the role `reward` and answers `score` (docs/adding-a-reward-actor.md).

This one stands in for a learned judge: it "loads a model" once at start-up, scores a batch of samples in one go,
and keeps counters you can ask for (`judge_stats`). Use it with:

    slime-actors train --config examples/digits/config.toml \
        --reward-actor-class examples/reward_actor/judge.py:DigitJudge
"""

from __future__ import annotations

import argparse

from slime_actors.actors.base import Actor, handler
from slime_actors.types import Sample


class DigitJudge(Actor):
    role = "reward"  # the rollout workers ask reward/0..N-1 to `score`

    def __init__(self, index: int = 0, **config):
        super().__init__(index, **config)
        self.args = argparse.Namespace(**config.get("args", {}))
        self.judged = 0
        self.table: dict[str, str] = {}

    async def on_start(self) -> None:
        # a real judge would load its model here (await self.run_blocking(load_model, path))
        self.table = {str(d): str(d) for d in range(10)}
        self.log.info("judge ready", entries=len(self.table))

    @handler
    async def score(self, samples: list, group: bool = False) -> dict:
        """The declared contract (slime_actors/messages.py): per-sample rewards, or an error instead."""
        rewards, errors = [], []
        for raw in samples:
            s = Sample.from_wire(raw)
            answer = s.response.strip().split(" ")[0] if s.response.strip() else ""
            if s.label is None:
                rewards.append(None)
                errors.append(f"sample {s.index} has no label to judge against")
                continue
            rewards.append(1.0 if self.table.get(answer) == str(s.label) else 0.0)
            errors.append(None)
        self.judged += len(samples)
        return {"rewards": rewards, "errors": errors}

    @handler
    def judge_stats(self) -> dict:
        return {"judged": self.judged}
