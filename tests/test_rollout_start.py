"""The rollout worker's start-up order (actors/rollout.py on_start): the engine is launched first, the tokenizer and
the user's functions load while it boots, then the worker waits for it. Two guarantees of the serial order it
replaced must hold:

1. the loop keeps running while the tokenizer's thread imports transformers: nothing the loop does meanwhile may
   import a module (it would wait on the import locks that thread holds; a loop that waits sends no heartbeats and
   the actor is declared down under load). The stand-in tokenizer here holds the interpreter's import lock for as
   long as it takes the loop to show it still runs -- it never does if the loop imports anything meanwhile;
2. a bad user function (or tokenizer) fails the start with its own error, and the engine already launched is
   stopped (tests/test_startup.py runs the same with a real job and checks no process is left).
"""

from __future__ import annotations

import _imp
import asyncio
import sys
import threading
import types
from pathlib import Path

import pytest

from slime_actors.actors import rollout as rollout_mod
from slime_actors.actors.rollout import RolloutWorker
from slime_actors.config import parse_config
from slime_actors.plugins import PluginError

DIGITS = str(Path(__file__).resolve().parents[1] / "examples" / "digits" / "config.toml")
HOLD_LIMIT = 120.0   # seconds the stand-in tokenizer waits for the loop before it calls it stuck (only a failure waits)


class FakeEngineProcess:
    """What launch_engine hands back (backends/engine_process.py), with no process behind it."""

    def __init__(self, events: list):
        self.events, self.pid, self.host, self.stopped = events, 4242, "127.0.0.1", False

    def wait_healthy(self, timeout: float) -> None:
        self.events.append("engine healthy")

    def poll(self):
        return None

    def stop(self, *args) -> int:
        self.stopped = True
        self.events.append("engine stopped")
        return 0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    from slime_actors.models.tiny import make_tiny_model
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "m"))


def _worker(tmp_path, monkeypatch, tiny, *flags) -> tuple[RolloutWorker, list, list]:
    cfg = parse_config(["--config", DIGITS, "--hf-checkpoint", tiny, *flags])
    w = RolloutWorker(0, args=cfg.to_dict())
    w.runtime = types.SimpleNamespace(run_dir=str(tmp_path), transport="ipc")
    (tmp_path / "logs").mkdir()
    events: list = []
    procs: list[FakeEngineProcess] = []

    def launch_engine(module, flags, **kwargs):
        events.append("engine launched")
        procs.append(FakeEngineProcess(events))
        return procs[-1]
    monkeypatch.setattr("slime_actors.backends.engine_process.launch_engine", launch_engine)

    async def serving(port):   # the real one connects to the engine and tells the controller
        await w.run_blocking(w.engine.wait_healthy, 1.0)
        events.append("serving")
    monkeypatch.setattr(w, "_engine_serving", serving)
    monkeypatch.setattr(w, "_pull_loop", _idle)
    monkeypatch.setattr(w, "_watch_engine", _idle)
    return w, events, procs


async def _idle() -> None:
    await asyncio.Event().wait()


class Buffer:
    """The buffer's release_worker, answered only once the tokenizer's thread holds the import lock: the rest of
    the release (the retry's bookkeeping, its log line) then runs on the loop while that thread imports."""

    def __init__(self, holding: threading.Event, events: list):
        self.holding, self.events = holding, events

    async def release_worker(self, name, reason, ask_timeout=None):
        while not self.holding.is_set():
            await asyncio.sleep(0.001)
        self.events.append("released")
        return types.SimpleNamespace(requeued=["w1"])


def _holding_tokenizer(events: list, holding: threading.Event, loop_ran: threading.Event):
    """A tokenizer load that holds the import lock (as a thread importing transformers holds its modules' locks)
    until the loop has shown it runs."""
    real = rollout_mod._load_tokenizer

    def load(path: str):
        tok = real(path)
        events.append("tokenizer")
        _imp.acquire_lock()
        try:
            holding.set()
            ran = loop_ran.wait(HOLD_LIMIT)
        finally:
            _imp.release_lock()
        if not ran:
            raise RuntimeError("the worker's loop stopped while the tokenizer's thread held the import lock")
        return tok
    return load


async def _probe(holding: threading.Event, loop_ran: threading.Event, events: list, then=None) -> None:
    """Loop turns once the thread holds the import lock, after the worker's own work on the loop meanwhile."""
    while not holding.is_set():
        await asyncio.sleep(0.001)
    while "released" not in events:
        await asyncio.sleep(0.001)
    for _ in range(20):
        await asyncio.sleep(0.001)
    if then is not None:
        then()
    loop_ran.set()


def test_the_engine_boots_while_the_tokenizer_loads_and_the_loop_keeps_running(tmp_path, monkeypatch, tiny):
    from slime_actors import startup_timeline as timeline
    w, events, procs = _worker(tmp_path, monkeypatch, tiny)
    holding, loop_ran = threading.Event(), threading.Event()
    w.buffer = Buffer(holding, events)
    monkeypatch.setattr(rollout_mod, "_load_tokenizer", _holding_tokenizer(events, holding, loop_ran))
    timeline.reset()

    async def go():
        probe = asyncio.get_running_loop().create_task(_probe(holding, loop_ran, events))
        await w.on_start()
        await probe
        for t in list(w._tasks):
            t.cancel()
    asyncio.run(go())
    assert events == ["engine launched", "tokenizer", "released", "engine healthy", "serving"], events
    assert w.tokenizer is not None and w.generation.chat is not None and not procs[0].stopped
    phases = {name: (a, b) for name, a, b in timeline.snapshot()["phases"]}
    assert {"engine start", "tokenizer", "user functions"} <= set(phases)
    (e0, e1), (t0, t1) = phases["engine start"], phases["tokenizer"]
    assert e0 <= t0 and t1 <= e1   # the tokenizer loaded while the engine started
    timeline.reset()


def test_the_check_sees_an_import_on_the_loop_while_the_tokenizer_loads(tmp_path, monkeypatch, tiny):
    """The harness above can fail: an import on the loop while the thread holds the lock stops the loop, and the
    start fails (the stand-in gives up after HOLD_LIMIT; here a short one)."""
    monkeypatch.setattr(sys.modules[__name__], "HOLD_LIMIT", 3.0)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "fresh_module_for_the_probe.py").write_text("X = 1\n")
    w, events, procs = _worker(tmp_path, monkeypatch, tiny)
    holding, loop_ran = threading.Event(), threading.Event()
    w.buffer = Buffer(holding, events)
    monkeypatch.setattr(rollout_mod, "_load_tokenizer", _holding_tokenizer(events, holding, loop_ran))

    def imports():
        import fresh_module_for_the_probe  # noqa: F401  (waits for the lock the thread holds)

    async def go():
        probe = asyncio.get_running_loop().create_task(_probe(holding, loop_ran, events, then=imports))
        with pytest.raises(RuntimeError, match="loop stopped while the tokenizer's thread held the import lock"):
            await w.on_start()
        probe.cancel()
        for t in list(w._tasks):
            t.cancel()
    asyncio.run(go())
    assert procs[0].stopped and "serving" not in events


def test_a_bad_user_function_fails_the_start_with_its_error_and_stops_the_engine(tmp_path, monkeypatch, tiny):
    gen = tmp_path / "gen.py"
    gen.write_text("async def generate(args, sample):\n    return sample\n")
    w, events, procs = _worker(tmp_path, monkeypatch, tiny, "--custom-generate-function-path", f"{gen}:generate")
    w.buffer = Buffer(threading.Event(), events)
    w.buffer.holding.set()

    async def go():
        with pytest.raises(PluginError, match=r"--custom-generate-function-path .*gen.py:generate: expected async "
                                              r"generate\(args, sample, sampling_params\)"):
            await w.on_start()
        for t in list(w._tasks):
            t.cancel()
    asyncio.run(go())
    assert procs and procs[0].stopped, events
    assert "engine healthy" not in events and "serving" not in events


def test_a_tokenizer_that_cannot_load_fails_the_start_and_stops_the_engine(tmp_path, monkeypatch, tiny):
    w, events, procs = _worker(tmp_path, monkeypatch, tiny)
    w.buffer = Buffer(threading.Event(), events)
    w.buffer.holding.set()

    def broken(path):
        raise OSError(f"{path} has no tokenizer.json")
    monkeypatch.setattr(rollout_mod, "_load_tokenizer", broken)

    async def go():
        with pytest.raises(OSError, match="has no tokenizer.json"):
            await w.on_start()
        for t in list(w._tasks):
            t.cancel()
    asyncio.run(go())
    assert procs[0].stopped and "serving" not in events


@pytest.mark.parametrize("refuse", [False, True])
def test_the_engines_flags_are_checked_while_it_starts_and_a_refused_flag_stops_it(tmp_path, monkeypatch, tiny,
                                                                                    refuse):
    """The worker's own check of the engine command (SGLang's parser: a 16 s import on one H100) runs after the
    launch, alongside the engine's start (the head checked the same flags before any process started); a flag this
    host's engine refuses fails the start with SGLangFlagError, and the engine launched is stopped."""
    from slime_actors.backends.sglang_launch import SGLangFlagError
    w, events, procs = _worker(tmp_path, monkeypatch, tiny)
    w.buffer = Buffer(threading.Event(), events)
    w.buffer.holding.set()

    def check(module, flags):
        events.append("flags checked")
        assert "--port" in flags   # the launched command itself
        if refuse:
            raise SGLangFlagError("--made-up-flag is not a launch flag of SGLang 9.9")
        return "SGLang 9.9 (stand-in)"
    monkeypatch.setattr("slime_actors.backends.sglang_launch.check_engine_flags", check)

    async def go():
        if refuse:
            with pytest.raises(SGLangFlagError, match="--made-up-flag"):
                await w.on_start()
        else:
            await w.on_start()
        for t in list(w._tasks):
            t.cancel()
    asyncio.run(go())
    assert events[:2] == ["engine launched", "flags checked"], events
    assert procs[0].stopped is refuse
    assert ("serving" in events) is not refuse


def test_engine_lines_about_errors_are_warnings_but_not_the_ones_sglang_ignores(tmp_path, monkeypatch, tiny):
    """The engine's output goes into the worker's log line by line: a traceback or an error as a warning (the
    console shows it), everything else as info -- and so SGLang's "Ignore import error when loading
    sglang.srt.models.X" (one per optional model module without its kernels: dozens at every start)."""
    w, _, _ = _worker(tmp_path, monkeypatch, tiny)
    seen: list[tuple[str, str]] = []
    monkeypatch.setattr(w, "log", types.SimpleNamespace(warning=lambda ev, line: seen.append(("warning", line)),
                                                        info=lambda ev, line: seen.append(("info", line))))
    for line in ["[2026-12-06 06:04:56] Ignore import error when loading sglang.srt.models.deepseek_v2: No module "
                 "named 'cutlass'",
                 "Traceback (most recent call last):", "RuntimeError: CUDA out of memory",
                 "[2026-12-06 06:05:01] Load weight end. type=LlamaForCausalLM"]:
        w._engine_line(line)
    assert [level for level, _ in seen] == ["info", "warning", "warning", "info"]
