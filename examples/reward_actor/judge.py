"""A reward actor of your own (docs/adding-a-reward-actor.md).

This one stands in for a learned judge: it "loads a model" once at start-up, scores a request's samples in one
batch, and keeps a counter you can ask for (`judge_stats`). Use it with:

    slime-actors train --config examples/digits/config.toml \
        --reward-actor-class examples/reward_actor/judge.py:DigitJudge
"""

from __future__ import annotations

from slime_actors.actors.base import handler
from slime_actors.actors.reward import RewardActor
from slime_actors.types import Sample


class DigitJudge(RewardActor):
    async def setup(self) -> None:
        # a real judge would load its model here: self.model = await self.run_blocking(load_model, path)
        self.table = {str(d): str(d) for d in range(10)}
        self.judged = 0
        self.log.info("judge ready", entries=len(self.table), rm_type=self.cfg.reward.rm_type)

    async def score_batch(self, samples: list[Sample]) -> list:
        """One call for all of a request's samples (a model would score them in one forward pass)."""
        self.judged += len(samples)
        return [self.judge(s) for s in samples]

    def judge(self, s: Sample) -> float | Exception:
        if s.label is None:   # this sample fails, with this message; the others keep their rewards
            return ValueError(f"sample {s.index} has no label to judge against")
        answer = s.response.strip().split(" ")[0] if s.response.strip() else ""
        return 1.0 if self.table.get(answer) == str(s.label) else 0.0

    @handler
    def judge_stats(self) -> dict:
        return {"judged": self.judged}
