"""A rollout worker's engine between weight versions: the controller's pause and resume, and the trainer's weight
updates (through an NCCL group, from disk, LoRA adapters, or directly by a colocated trainer). `EngineWeights` is
the part of `RolloutWorker` (actors/rollout.py) that holds these handlers; the engine's start, watch and restarts
are `EngineSupervisor`'s (actors/rollout_engine.py), which derives from it. An update the engine's restart
interrupted fails, so the controller re-syncs the new engine.
"""

from __future__ import annotations

import asyncio
import os
import shutil

from .base import Actor, handler
from .recorded_engine import RecordedEngine


class EngineWeights(Actor):
    """The weight-update handlers of a rollout worker. Its state is set by EngineSupervisor._init_engine_state."""

    weight_version: int
    client: RecordedEngine | None
    engine_url: str | None
    engine_restarts: int
    _inflight: dict[str, asyncio.Task]
    _resumed: asyncio.Event
    _engine_ok: asyncio.Event
    _restarting: bool
    _engine_paused: str | None
    _pause_lock: asyncio.Lock
    _updating: int
    _direct_update_restarts: int
    _engine_caps: dict
    _lora_loaded: list[str]

    @property
    def engine_client(self) -> RecordedEngine:
        """The engine's client; a RuntimeError before there is one (the engine has not started)."""
        if self.client is None:
            raise RuntimeError(f"{self.name}: its engine has not started")
        return self.client

    @handler
    async def resume(self, weight_version: int) -> None:
        async with self._pause_lock:
            if weight_version != self.weight_version:
                # a restarted engine serves only once it holds the current weights (the controller re-syncs it)
                self.log.warning("not resuming: the engine does not hold the weight version asked for",
                                 asked=weight_version, engine=self.weight_version)
                return
            if self._engine_paused is not None and self._engine_ok.is_set():
                await self.engine_client.continue_generation()
                self.log.info("engine continued", paused_mode=self._engine_paused)
            self._engine_paused = None
            self._resumed.set()
            self._on_resumed()

    def _on_resumed(self) -> None:
        """Resumed: what waited for it starts (the rollout worker: groups taken ahead)."""

    @handler
    async def pause(self, abort: bool = False) -> dict:
        """Stop pulling and pause the engine (/pause_generation) in --pause-generation-mode (abort=True: abort).
        abort: in-flight requests come back aborted and their groups go back to the buffer (partial responses kept
        under --partial-rollout); retract / in_place: they wait in the engine and finish after resume."""
        async with self._pause_lock:
            self._resumed.clear()
            n = len(self._inflight)
            mode = "abort" if abort else self.cfg.engine.pause_generation_mode
            if self._engine_paused is None and self._engine_ok.is_set():
                await self.engine_client.pause_generation(mode)
                self._engine_paused = mode
                self.log.info("engine paused", mode=mode, in_flight=n)
            return {"in_flight": n, "mode": self._engine_paused or mode}

    @handler
    async def init_weights_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                 group_name: str, backend: str) -> dict:
        await self._engine_ok.wait()
        self._updating += 1
        try:
            res = await self.engine_client.init_weights_update_group(master_address, master_port, rank_offset,
                                                                     world_size, group_name, backend)
        finally:
            self._updating -= 1
        # the trainer sends flattened buckets only when every engine of the group takes them
        return {**res, "flattened_bucket": bool(self._engine_caps.get("flattened_bucket"))}

    def _flush(self, flush_cache: bool) -> bool:
        """SGLang asserts that the cache flush after a weight update succeeds, which it cannot while requests wait
        in an engine paused with retract / in_place: no flush then (their prefix cache entries stay)."""
        return bool(flush_cache) and self._engine_paused not in ("retract", "in_place")

    async def _update(self, weight_version: int, call) -> dict:
        """Run one weight-update call to the engine. If the engine was restarted meanwhile (it hung, or died, during
        the update), the answer -- even a success from the old process -- says nothing about the engine now
        serving, which holds its launch weights: the update fails, and the controller re-syncs the new one."""
        restarts = self.engine_restarts
        if self._restarting:
            raise RuntimeError(f"{self.name}: the engine is restarting; weight version {weight_version} not loaded")
        self._updating += 1
        try:
            res = await call()
        finally:
            self._updating = max(0, self._updating - 1)
        self._loaded(weight_version, restarts)
        return res

    def _loaded(self, weight_version: int, restarts_at_start: int) -> None:
        """An update that began at `restarts_at_start` finished: the engine holds `weight_version` -- unless it was
        restarted since (the new one holds its launch weights), which fails the update."""
        if self.engine_restarts != restarts_at_start or self._restarting:
            raise RuntimeError(f"{self.name}: the engine was restarted during the update to weight version "
                               f"{weight_version}; the new engine does not hold it")
        self.weight_version = weight_version

    @handler
    async def update_weights_from_distributed(self, names: list, dtypes: list, shapes: list, group_name: str,
                                              weight_version: int, flush_cache: bool = True,
                                              load_format: str | None = None) -> dict:
        return await self._update(weight_version, lambda: self.engine_client.update_weights_from_distributed(
            names, dtypes, shapes, group_name, weight_version=str(weight_version), flush_cache=self._flush(flush_cache),
            load_format=load_format))

    @handler
    async def destroy_weights_group(self, group_name: str) -> None:
        await self.engine_client.destroy_weights_update_group(group_name)

    @handler
    async def update_weights_from_disk(self, model_path: str, weight_version: int) -> dict:
        await self._engine_ok.wait()
        return await self._update(weight_version, lambda: self.engine_client.update_weights_from_disk(
            model_path, weight_version=str(weight_version), flush_cache=self._flush(True)))

    @handler
    async def load_lora_adapter(self, weight_version: int, tensors: dict, config: dict) -> dict:
        """--lora-sync adapter (weight_sync.WeightPusher): the trainer's LoRA adapters for `weight_version`, written
        as a PEFT adapter directory under RUN_DIR/lora/, loaded into the engine as "v<version>" and named by every
        generation from then on; the engine's weight version moves with it. The adapter before stays loaded (a
        request paused in place may still use it); older ones are unloaded."""
        from ..backends.engine_client import EngineError
        from ..backends.lora import write_adapter_dir
        await self._engine_ok.wait()
        name, loaded = f"v{weight_version}", self._lora_loaded
        base = os.path.join(self.runtime.run_dir, "lora", self.name.replace("/", "-"))
        # (a replay takes the same step without writing: the recording kept the tensors' checksums only)
        await self.run_blocking(write_adapter_dir if not self.replaying else lambda *_: None,
                                os.path.join(base, name), tensors, config)

        async def call():
            if name in loaded:   # a retried sync of this version
                await self.engine_client.unload_lora_adapter(name)
                loaded.remove(name)
            await self.engine_client.load_lora_adapter(name, os.path.join(base, name))
            loaded.append(name)
            return await self.engine_client.update_weight_version(str(weight_version))
        await self._update(weight_version, call)
        self.engine_client.unwrapped.lora_path = name
        while len(loaded) > 2:
            old = loaded.pop(0)
            try:
                await self.engine_client.unload_lora_adapter(old)
            except EngineError as exc:
                self.log.warning("could not unload an old LoRA adapter", adapter=old, error=str(exc))
            if not self.replaying:
                shutil.rmtree(os.path.join(base, old), ignore_errors=True)
        return {"lora_name": name, "loaded": list(loaded)}

    @handler
    async def weight_update(self, active: bool, weight_version: int | None = None) -> dict:
        """The trainer updates this engine directly (/update_weights_from_tensor, colocated): hold health probes
        while `active`; at the end, the version the engine now holds."""
        if active:
            await self._engine_ok.wait()
            self._updating += 1
            self._direct_update_restarts = self.engine_restarts
        else:
            self._updating = max(0, self._updating - 1)
            if weight_version is not None:
                self._loaded(weight_version, self._direct_update_restarts)
        return {"engine_url": self.engine_url, "paused": self._engine_paused,
                "flush_cache": self._flush(True), "tp_size": int(self._engine_caps.get("tp_size", 1))}
