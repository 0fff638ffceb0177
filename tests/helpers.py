"""Test helpers: run actors on a loop in a background thread, or in child processes."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import threading
import time

import uvloop

from slime_actors.actors.base import Actor, handler
from slime_actors.config import FIELDS, FlatArgs, JobConfig
from slime_actors.runtime import RuntimeConfig


def job_config(**flags) -> JobConfig:
    """A validated job config with these flags (slime's flat names); a prompt file, model and reward filled in."""
    return JobConfig.from_dict({"prompt_data": "prompts.jsonl", "hf_checkpoint": "tiny:x", "rm_type": "exact_match",
                                **flags})


def flat_args(**flags) -> FlatArgs:
    """slime's `args` as plug-ins get it, with these flags set on the defaults -- not validated, so a test can give
    the reward and filter functions what no job would (no reward chosen, remote_rm without a URL)."""
    cfg = JobConfig()
    for name, value in flags.items():
        setattr(getattr(cfg, FIELDS[name].section), name, value)
    return cfg.flat()


class LoopThread:
    """An event loop in a daemon thread; `call(coro)` runs a coroutine there and returns its result."""

    def __init__(self):
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class Echo(Actor):
    role = "echo"

    def __init__(self, index=0, **config):
        super().__init__(index, **config)
        self.seen: list = []

    @handler
    def echo(self, x=None):
        return x

    @handler
    def record(self, sender: str, n: int) -> None:
        self.seen.append((sender, n))

    @handler
    def seen_list(self) -> list:
        return self.seen

    @handler
    async def sleep(self, seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    @handler
    def boom(self, text: str = "boom"):
        raise ValueError(text)


class Quiet(Echo):
    """An Echo that asks the directory for a quiet window from a worker thread, as the trainer's profiler does before
    its export (Actor.expect_silence)."""
    role = "quiet"

    @handler
    async def hush(self, seconds: float) -> bool:
        await self.run_blocking(self.expect_silence, seconds, "a test's window")
        return True


class Slow(Actor):
    """Handles `work` slowly, one at a time (max_concurrency is set low by the test)."""

    role = "slow"

    def __init__(self, index=0, **config):
        super().__init__(index, **config)
        self.handled = 0

    @handler
    async def work(self, payload: bytes) -> None:
        await asyncio.sleep(config_delay(self.config))
        self.handled += 1

    @handler
    def count(self) -> int:
        return self.handled


def config_delay(cfg: dict) -> float:
    return float(cfg.get("delay", 0.001))


def _child(cls, index, env, config, ready):
    """A spawned actor process: the same bootstrap as every actor process (slime_actors/launch/actor.py)."""
    os.environ.update(env)
    from slime_actors import gc_watch
    from slime_actors.launch.actor import serve, set_up_process
    rt = RuntimeConfig.from_env()
    set_up_process(f"{cls.role}/{index}", rt.run_dir, console=False)

    async def make():
        return cls(index, **config), rt

    uvloop.run(serve(make, ready=lambda actor: (gc_watch.settle(actor.log), ready.set())))


def spawn_actor(cls, index: int, runtime: RuntimeConfig, config: dict | None = None, timeout: float = 60):
    """Start `cls(index)` in a child process (spawn) with the runtime's environment; returns the Process."""
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    env = runtime.env()
    keys = runtime.keys()
    if keys is not None:
        env.update(keys.env())
    p = ctx.Process(target=_child, args=(cls, index, env, config or {}, ready), daemon=True)
    p.start()
    if not ready.wait(timeout):
        p.kill()
        raise TimeoutError(f"{cls.role}/{index} did not start within {timeout}s")
    return p


def wait_for(pred, timeout: float = 10, interval: float = 0.02):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return True
        time.sleep(interval)
    return False


class Untouchable(list):
    """A token list no text-only reward may read (the rollout workers send their samples without them): any read
    raises."""

    def _refuse(self, *args, **kwargs):
        raise AssertionError("a text-only reward read a sample's token list")
    __iter__ = __len__ = __getitem__ = __contains__ = __bool__ = __reversed__ = _refuse


def untouchable(sample):
    """`sample` with every token list (actors/rollout.py TOKEN_FIELDS) an Untouchable."""
    from slime_actors.actors.rollout import TOKEN_FIELDS
    for key in TOKEN_FIELDS:
        setattr(sample, key, Untouchable())
    return sample
