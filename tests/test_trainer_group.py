"""The controller's rendezvous of trainer ranks across a restart of the training group (no processes: the
controller's handlers are called directly, its asks to other actors stubbed)."""

from __future__ import annotations

import asyncio

from slime_actors.actors.controller import Controller, _Rendezvous
from slime_actors.config import parse_config

FLAGS = ["--hf-checkpoint", "tiny:digits", "--input-key", "input", "--label-key", "label",
         "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--global-batch-size", "16",
         "--micro-batch-size", "16", "--num-rollout", "4", "--actor-num-gpus-per-node", "2",
         "--rm-type", "exact_match", "--use-tensorboard", "false", "--progress", "false"]


def _controller(tmp_path) -> Controller:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"input": "1+1", "label": "2"}\n')
    ctl = Controller(0, args=parse_config(FLAGS + ["--prompt-data", str(prompts)]).to_dict())
    assert ctl.trainers == ["trainer/0", "trainer/1"]
    ctl.told = []

    async def tell(to, method, body=None, **kw):
        ctl.told.append((to, method, body))

    async def ask_buffer(method, body=None, timeout=300.0, **kw):
        return {"rolled_back": True}

    async def end_rollout(k):
        pass

    ctl.tell = tell
    ctl._ask_buffer = ask_buffer
    ctl._end_rollout = end_rollout
    ctl._restore_state = lambda ckpt: (2, 2)
    ctl._write_recovery = lambda rec: None
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
        ctl._rdzv = _Rendezvous(0, 2)
        ctl._fail = asyncio.get_running_loop().create_future()
        first = await _form(ctl, (100, 101))
        assert {f["generation"] for f in first} == {0}
        # the group's supervisor restarted both ranks; they join again before the controller has noticed anything
        again = await _form(ctl, (200, 201))
        assert {f["generation"] for f in again} == {1}
        assert ctl._fail.done() and "restarted" in ctl._fail.result()
        start = await ctl._recover(ctl._fail.result())
        assert start == 2
        assert ctl._rdzv.generation == 1, "the recovery opened a generation nobody will join"
        assert ("trainer/0", "abort_group", {"generation": 0, "reason": ctl.recoveries[-1]["reason"]}) in ctl.told
        ctl.trainer_ready(rank=0, generation=1, weight_version=2)
        ctl.trainer_ready(rank=1, generation=1, weight_version=2)
        await asyncio.wait_for(ctl._trainers_ready(), 1)
    asyncio.run(main())


def test_a_rank_declared_down_gets_a_new_generation_to_join(tmp_path):
    """The usual order: a rank is declared down while its generation is current; the recovery opens the next one, and
    readiness of the old generation does not count for it."""
    async def main():
        ctl = _controller(tmp_path)
        ctl._rdzv = _Rendezvous(0, 2)
        ctl._fail = asyncio.get_running_loop().create_future()
        await _form(ctl, (100, 101))
        await ctl.on_peer_down("trainer/1", "missed heartbeats")
        await ctl._recover(ctl._fail.result())
        assert ctl._rdzv.generation == 1 and not ctl._rdzv.formed.done()
        ctl.trainer_ready(rank=0, generation=0)  # a late message from the broken generation
        assert not ctl._rdzv.all_ready.is_set()
        again = await _form(ctl, (200, 201))
        assert {f["generation"] for f in again} == {1}
        for r in (0, 1):
            ctl.trainer_ready(rank=r, generation=1)
        await asyncio.wait_for(ctl._trainers_ready(), 1)
    asyncio.run(main())
