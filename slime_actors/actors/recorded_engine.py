"""What an engine tells a rollout worker, recorded: its answers (`RecordedEngine`), its process as the worker sees it
(`RecordedProcess`), and the key that matches an answer to its request. Whatever an engine says is an input of the
worker's trace, so `slime-actors replay` runs the worker's code with no engine (actors/rollout_engine.py starts and
watches the engine; actors/rollout_frozen.py a second, frozen one).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import Any

from .base import Actor


def request_key(input_ids: list[int], sampling_params: dict) -> str:
    """Which request an engine answer belongs to (answers to concurrent requests come back in any order)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(repr((list(input_ids), sorted(sampling_params.items()))).encode())
    return h.hexdigest()


class RecordedEngine:
    """The engine client (or the router's) as the worker uses it: the answers of its calls (weights, aborts, health,
    close; not generate, which `Generation.raw` (rollout_generate.py) records parsed) are recorded in the trace as `<prefix>.<method>`, and
    under replay served from it."""

    _LOCAL = frozenset(("generate",))

    def __init__(self, actor: Actor, client: Any, prefix: str = "engine"):
        self._actor, self._client, self._prefix = actor, client, prefix

    @property
    def unwrapped(self) -> Any:
        """The client itself (EngineClient, RouterClient; a test's stand-in)."""
        return self._client

    def __getattr__(self, name: str):
        fn = getattr(self._client, name)
        if name in self._LOCAL or not asyncio.iscoroutinefunction(fn):
            return fn

        async def call(*args, **kwargs):
            return await self._actor.recorded_async(f"{self._prefix}.{name}", fn, *args, **kwargs)
        return call


class RecordedProcess:
    """A process the worker started (its engine), as the worker sees it: what it learns of the process -- its pid
    and host at launch, its exit code when polled -- is a recorded input, so replay runs the same code with no
    process (waits, stops and signals then do nothing)."""

    def __init__(self, actor: Actor, name: str, launch):
        self._actor, self._name = actor, name
        self._proc: Any = None   # the EngineProcess (backends/engine_process.py); None under replay

        def start() -> dict:
            self._proc = launch()
            return {"pid": self._proc.pid, "host": self._proc.host}
        info = actor.recorded(f"{name}.launch", start)
        self.pid, self.host = info["pid"], info["host"]

    def poll(self) -> int | None:
        proc = self._proc   # (under replay None: the recorded answer is served, the lambda not called)
        return self._actor.recorded(f"{self._name}.poll", lambda: proc.poll() if proc is not None else None)

    def wait_healthy(self, timeout: float) -> None:
        if self._proc is not None:
            self._proc.wait_healthy(timeout)

    def stop(self, *args) -> None:
        if self._proc is not None:
            self._proc.stop(*args)

    def signal(self, sig: int) -> None:
        if self._proc is not None:
            os.kill(self._proc.pid, sig)


def http_url(host: str, port: int) -> str:
    """The URL a server listening on `host` is reached at from this host (a wildcard: the loopback)."""
    if host in ("0.0.0.0", "", "*", "::", "[::]"):
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6
    return f"http://{host}:{int(port)}"
