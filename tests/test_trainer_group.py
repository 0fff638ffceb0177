"""The controller's rendezvous of trainer ranks across a restart of the training group (no processes: the
controller's handlers are called directly, its asks to other actors stubbed)."""

from __future__ import annotations

import asyncio

from slime_actors.actors.controller import Controller
from slime_actors.config import parse_config

FLAGS = ["--hf-checkpoint", "tiny:digits", "--input-key", "input", "--label-key", "label",
         "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--global-batch-size", "16",
         "--micro-batch-size", "16", "--num-rollout", "4", "--actor-num-gpus-per-node", "2",
         "--rm-type", "exact_match", "--use-tensorboard", "false", "--progress", "false"]


def _controller(tmp_path) -> Controller:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"input": "1+1", "label": "2"}\n')
    ctl = Controller(0, args=parse_config(FLAGS + ["--prompt-data", str(prompts)]).to_dict())
    assert ctl.trainers.names == ["trainer/0", "trainer/1"]
    ctl.told = []

    async def tell(to, method, body=None, **kw):
        ctl.told.append((to, method, body))

    ctl.asked = []

    async def ask(to, method, body=None, **kw):
        assert (to, method) in (("buffer/0", "rollback"), ("rollout/0", "end_rollout")), (to, method)
        ctl.asked.append((to, method, body))
        # (as the actors answer: a typed handle checks the reply's keys)
        return {"rolled_back": True} if method == "rollback" else {"aborted": 0, "returned": 0}

    ctl.tell = tell
    ctl.ask = ask
    ctl.checkpoints.restore = lambda: (2, 2)
    ctl.group.write = lambda rec: None
    return ctl


async def _form(ctl: Controller, pids: tuple[int, int]) -> list[dict]:
    joins = [ctl.trainer_join(rank=r, world_size=2, addr="127.0.0.1", port=29500 + r, pid=pids[r])
             for r in (1, 0)]
    return await asyncio.gather(*joins)


def test_a_generation_formed_before_the_recovery_is_the_one_waited_for(tmp_path):
    """Both ranks restart and join again before the controller's recovery runs (seen in a CI-like run): the recovery
    must keep the generation they formed, or their trainer_ready is ignored and the job waits forever."""
    async def main():
        ctl = _controller(tmp_path)
        ctl.group.start()
        assert ctl.group.rdzv.generation == 0
        first = await _form(ctl, (100, 101))
        assert {f["generation"] for f in first} == {0}
        # the group's supervisor restarted both ranks; they join again before the controller has noticed anything
        again = await _form(ctl, (200, 201))
        assert {f["generation"] for f in again} == {1}
        assert "restarted" in ctl.group.failure
        start = await ctl.group.restart(ctl.group.failure)
        assert start == 2
        assert ctl.group.rdzv.generation == 1, "the recovery opened a generation nobody will join"
        assert ("trainer/0", "abort_group", {"generation": 0, "reason": ctl.group.recoveries[-1]["reason"]}) in ctl.told
        ctl.trainer_ready(rank=0, generation=1, weight_version=2)
        ctl.trainer_ready(rank=1, generation=1, weight_version=2)
        await asyncio.wait_for(ctl.group.ready(), 1)
    asyncio.run(main())


def test_a_rank_declared_down_gets_a_new_generation_to_join(tmp_path):
    """The usual order: a rank is declared down while its generation is current; the recovery opens the next one, and
    readiness of the old generation does not count for it."""
    async def main():
        ctl = _controller(tmp_path)
        ctl.group.start()
        assert ctl.group.rdzv.generation == 0
        await _form(ctl, (100, 101))
        await ctl.on_peer_down("trainer/1", "missed heartbeats")
        await ctl.group.restart(ctl.group.failure)
        assert ctl.group.rdzv.generation == 1 and not ctl.group.rdzv.formed.done()
        ctl.trainer_ready(rank=0, generation=0)  # a late message from the broken generation
        assert not ctl.group.rdzv.all_ready.is_set()
        again = await _form(ctl, (200, 201))
        assert {f["generation"] for f in again} == {1}
        for r in (0, 1):
            ctl.trainer_ready(rank=r, generation=1)
        await asyncio.wait_for(ctl.group.ready(), 1)
    asyncio.run(main())


def test_a_restarted_controller_rolls_the_buffer_back_under_a_token_of_its_own(tmp_path):
    """A restarted controller counts recoveries and generations from 0 again; the buffer answers a rollback whose
    token it ran last from its record instead of running it. So the first recovery of each controller process must
    ask under a token of its own, or a second incarnation's recovery could be taken for the first one's and the
    buffer not rolled back."""
    async def recovery_token(started_at: float) -> str:
        ctl = _controller(tmp_path)
        ctl.started_at = started_at
        ctl.group.start()
        await _form(ctl, (100, 101))
        await ctl.on_peer_down("trainer/1", "missed heartbeats")
        await ctl.group.restart(ctl.group.failure)
        [token] = [body["token"] for to, method, body in ctl.asked if method == "rollback"]
        return token

    first, second = asyncio.run(recovery_token(1.0)), asyncio.run(recovery_token(2.0))
    assert first.startswith("recovery-0-0") and second.startswith("recovery-0-0")
    assert first != second
