"""A rollout worker's second engine: --frozen-engine-checkpoint served by an engine the weight sync never touches,
for a role played by a fixed model (a frozen critic or opponent: docs/multi-agent.md).

    frozen = FrozenEngine(worker)          # in Generation.start, with --frozen-engine-checkpoint
    await frozen.start()                   # the same engine kind and flags as the worker's own, on a port of its own
    out = await frozen.generate(ids, sp)   # {output_ids, logprobs, finish_reason, weight_version}: recorded
    await frozen.stop()

Generate functions reach it as `engine.frozen` (rollout_generate.EngineHandle). What it generates is text for the
other agents -- not a sample to train. Its answers are recorded in the worker's trace (`frozen.generate`, keyed by
the request) and served back by a replay, like the worker's own engine's; its launch (port, pid) is recorded too. An
engine that exited is started again before the next request (its process's exit code is a recorded input).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from typing import TYPE_CHECKING, Any

from .recorded_engine import RecordedEngine, RecordedProcess, request_key

if TYPE_CHECKING:
    from .rollout import RolloutWorker


class FrozenEngine:
    def __init__(self, worker: "RolloutWorker"):
        self.w = worker
        self.checkpoint = worker.cfg.engine.frozen_engine_checkpoint
        self.proc: RecordedProcess | None = None
        self.client: RecordedEngine | None = None
        self.url: str | None = None
        self.restarts = 0
        self._lock = asyncio.Lock()

    @property
    def tokenizer(self):
        return self.w.tokenizer

    @property
    def weight_version(self) -> int:
        return 0

    def check_tokenizer(self) -> None:
        """The frozen model must read and write the policy's tokens: the same vocabulary, or RuntimeError."""
        from ..tokenizer import load_tokenizer
        if self.checkpoint is None:
            raise RuntimeError("a frozen engine without --frozen-engine-checkpoint")
        theirs = load_tokenizer(self.checkpoint).get_vocab()
        ours: Any = self.w.tokenizer
        if theirs != ours.get_vocab():
            raise RuntimeError(f"--frozen-engine-checkpoint {self.checkpoint}: its tokenizer's vocabulary differs from "
                               f"--hf-checkpoint's ({len(theirs)} vs {len(ours.get_vocab())} tokens); the "
                               "agents exchange tokens, so both models need the same tokenizer")

    async def start(self) -> None:
        from ..backends.engine_client import EngineClient
        from ..backends.engine_process import launch_engine
        from ..backends.sglang_launch import engine_command
        from ..backends.weight_sync import find_free_port
        from .recorded_engine import http_url
        w = self.w
        # (recorded, as every outcome of the worker's outside world: a replay takes the same steps without the files)
        await w.recorded_async("frozen.check_tokenizer", w.run_blocking, self.check_tokenizer)
        port = w.recorded("frozen.port", find_free_port)
        cfg = dataclasses.replace(w.cfg, model=dataclasses.replace(w.cfg.model, hf_checkpoint=self.checkpoint))
        config = None
        if w.keys.any:
            config = w.keys.write_engine_config(os.path.join(w.runtime.run_dir, "keys",
                                                             f"engine-{w.index}-frozen.yaml"))
        module, flags = engine_command(cfg, w.index, port, host="127.0.0.1", config=config)
        log_path = os.path.join(w.runtime.run_dir, "logs", f"engine-{w.index}-frozen.log")
        t0 = time.monotonic()
        w.log.info("starting the frozen engine", checkpoint=self.checkpoint, flags=w.keys.redact(" ".join(flags)))
        self.proc = RecordedProcess(w, "frozen", lambda: launch_engine(
            module, flags, env=dict(os.environ), log_path=log_path, wait=False, on_line=w._engine_line,
            redact=w.keys.secrets))
        await w.recorded_async("frozen.wait_healthy", w.run_blocking, self.proc.wait_healthy,
                               w.cfg.engine.rollout_health_check_first_wait + 600)
        self.url = http_url("127.0.0.1", port)
        if self.client is not None:
            await self.client.close()
        self.client = RecordedEngine(w, EngineClient(self.url, keys=w.keys,
                                                     max_concurrency=w.cfg.engine.rollout_concurrency), "frozen")
        w.log.info("frozen engine up", url=self.url, pid=self.proc.pid, seconds=round(time.monotonic() - t0, 1))

    async def _alive(self) -> None:
        """Start the engine again if its process exited (a recorded reading: a replay takes the same turn)."""
        async with self._lock:
            code = self.proc.poll() if self.proc is not None else None
            if code is not None:
                self.restarts += 1
                self.w.log.warning("the frozen engine exited; starting it again", code=code, restarts=self.restarts)
                await self.start()

    async def generate(self, input_ids: list[int], sampling_params: dict) -> dict:
        """One /generate call of the frozen model with log-probs, recorded: {output_ids, logprobs, finish_reason,
        weight_version}."""
        await self._alive()
        return await self.w.recorded_async("frozen.generate", self._live, list(input_ids), dict(sampling_params),
                                           key=request_key(input_ids, sampling_params))

    async def _live(self, input_ids: list[int], sampling_params: dict) -> dict:
        from ..backends.engine_client import parse_generate_output
        assert self.client is not None, "the frozen engine was not started"
        resp = await self.client.generate(input_ids, sampling_params, return_logprob=True)
        out = parse_generate_output(resp)
        return {"output_ids": list(out.output_ids), "logprobs": list(out.logprobs or []), "finish_reason": out.finish_type,
                "weight_version": out.weight_version}

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.close()
        if self.proc is not None:
            await self.w.run_blocking(self.proc.stop)
