"""The rollout worker's record of the weight version its engine holds, across an engine restart: an update that
the old engine answered after the worker restarted it must not count for the new engine (which holds its launch
weights), for the distributed / disk updates and for the colocated (direct) one. No engine: the calls are stubs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from slime_actors.actors.rollout import RolloutWorker
from slime_actors.config import parse_config

DIGITS = str(Path(__file__).resolve().parents[1] / "examples" / "digits" / "config.toml")


def worker() -> RolloutWorker:
    w = RolloutWorker(0, args=parse_config(["--config", DIGITS]).to_dict())
    w._engine_ok = asyncio.Event()
    w._engine_ok.set()
    w.weight_version = 3
    return w


def test_an_update_across_a_restart_does_not_count():
    async def go():
        w = worker()

        async def ok():
            return {"success": True}
        assert await w._update(4, ok) == {"success": True} and w.weight_version == 4

        async def restarted_meanwhile():
            w.engine_restarts += 1          # the watcher restarted the engine while the call was out
            w.weight_version = -1
            return {"success": True}        # ... and the old process still answered
        with pytest.raises(RuntimeError, match="restarted during the update to weight version 5"):
            await w._update(5, restarted_meanwhile)
        assert w.weight_version == -1 and w._updating == 0

        w._restarting = True
        with pytest.raises(RuntimeError, match="the engine is restarting"):
            await w._update(6, ok)
    asyncio.run(go())


def test_a_colocated_update_across_a_restart_does_not_count():
    async def go():
        w = worker()
        await w.weight_update(active=True)
        await w.weight_update(active=False, weight_version=4)
        assert w.weight_version == 4 and w._updating == 0
        await w.weight_update(active=True)
        w.engine_restarts += 1
        w.weight_version = -1
        with pytest.raises(RuntimeError, match="restarted during the update to weight version 5"):
            await w.weight_update(active=False, weight_version=5)
        assert w.weight_version == -1 and w._updating == 0
    asyncio.run(go())
