"""The head of a job: `directory/0` and `controller/0` in one process, the job's keys, RUN_DIR/head.json, the status
board and the end of the run. Both ways of running a job have this one head: `slime-actors launch` / `train`
(launch/job.py: it adds this node's agent and its supervised actor processes) and torchrun's rank 0
(launch/torchrun.py: it publishes the head in torchrun's store for the other ranks).

    head = Head(cfg, rt, fresh=True, prog="slime-actors train")
    await head.open(started=time.time())           # keys, directory, head.json
    ... start what this launcher starts, with head.env() ...
    await head.start_controller()
    failure = await head.watch(stop, board, check=...)
    await head.stop_controller()
    ... stop what this launcher started ...
    await head.close()
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..config import JobConfig
from ..log import CONSOLE, console_write, get_logger
from ..runtime import RuntimeConfig, job_keys

POLL_S = 0.2  # how often the head reads the directory's listing and the controller's status


def engine_keys(cfg: JobConfig, run_dir: Path, create: bool, prog: str | None = None):
    """The job's engine HTTP keys (backends/engine_auth.py), saved under RUN_DIR/keys; with `prog`, the warnings
    about them are printed."""
    from ..backends.engine_auth import job_engine_keys, startup_warnings
    keys = job_engine_keys(cfg.engine, run_dir, create, user=cfg.engine_user_keys)
    if prog:
        for w in startup_warnings(cfg.engine, keys):
            get_logger(actor="launcher").warning(w)
            print(f"{prog}: warning: {w}", file=sys.stderr)
    return keys


def retriever_key(cfg: JobConfig, run_dir: Path, create: bool, prog: str | None = None) -> str | None:
    """The job's retriever key (search/keys.py), saved under RUN_DIR/keys; with `prog`, a warning when an external
    retriever gets none."""
    from ..search.keys import job_retriever_key
    key = job_retriever_key(cfg.retriever, run_dir, create)
    if prog and cfg.retriever.retriever_url and key is None:
        w = (f"--retriever-url {cfg.retriever.retriever_url}: no key given (--retriever-api-key-file or "
             "SLIME_ACTORS_RETRIEVER_KEY); requests go without Authorization")
        get_logger(actor="launcher").warning(w)
        print(f"{prog}: warning: {w}", file=sys.stderr)
    return key


class Head:
    """The head's parts, in the order a launcher uses them (the module's docstring)."""

    def __init__(self, cfg: JobConfig, rt: RuntimeConfig, *, fresh: bool, prog: str):
        self.cfg, self.rt, self.fresh, self.prog = cfg, rt, fresh, prog
        self.run_dir = Path(cfg.run.run_dir).resolve()
        self.keys = self.engines = self.retriever_key = None
        self.directory = self.controller = None

    async def open(self, endpoint: str | None = None, **info) -> str:
        """The job's CURVE keys and engine keys (made when `fresh`; ValueError naming a problem with the engine
        keys, before anything started), then `directory/0` (at `endpoint` when given) and RUN_DIR/head.json: its
        endpoint, pid and host, and `info`. Returns the directory's endpoint."""
        from ..actors.directory import Directory
        self.keys = job_keys(self.cfg.runtime.curve, self.run_dir, create=self.fresh)
        self.engines = engine_keys(self.cfg, self.run_dir, self.fresh, prog=self.prog)
        self.retriever_key = retriever_key(self.cfg, self.run_dir, self.fresh, prog=self.prog)
        self.directory = Directory(0)
        dep = await self.directory.start(self.rt, endpoint=endpoint)
        self.rt.directory = dep
        (self.run_dir / "head.json").write_text(json.dumps({"directory": dep, "pid": os.getpid(),
                                                            "host": socket.gethostname(), **info}))
        return dep

    def env(self, extra: dict | None = None) -> dict:
        """What the job's other processes need in their environment: the runtime (directory, transport, run dir),
        `extra`, then the CURVE keys and the engine keys."""
        env = {**self.rt.env(), **(extra or {})}
        for keys in (self.keys, self.engines):
            if keys is not None:
                env.update(keys.env())
        from ..search.keys import key_env
        env.update(key_env(self.retriever_key))
        return env

    async def start_controller(self, **kwargs) -> None:
        from ..actors.controller import Controller
        self.controller = Controller.for_job(0, self.cfg, **kwargs)
        await self.controller.start(self.rt)

    def listing(self) -> dict:
        """The directory's view of the job's actors (what its `list` answers, read in this process: not one of the
        directory's recorded clock readings, which would not be in its replay)."""
        return self.directory.snapshot()

    def status(self) -> dict:
        from ..actors.controller import Controller
        return Controller.status(self.controller)

    async def watch(self, stop: asyncio.Event, board: StatusBoard, *, check: Callable[[dict], str | None] | None = None,
                    processes: Callable[[], dict] = dict, restarts: Callable[[], int] = lambda: 0) -> str | None:
        """Until the controller is done or `stop` is set: every POLL_S the directory's listing goes to `check`
        (a launcher's supervision; a failure it returns ends the watch and is returned), then to the board."""
        while not self.controller.done.done() and not stop.is_set():
            await asyncio.sleep(POLL_S)
            listing = self.listing()
            failure = check(listing) if check is not None else None
            if failure:
                return failure
            board.update(listing, self.status(), processes(), restarts())
        return None

    async def stop_controller(self) -> None:
        await self.controller.stop()

    async def wait_gone(self, names: list[str], seconds: float) -> None:
        """Until none of `names` is registered with the directory, for at most `seconds`."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds and any(n in self.listing() for n in names):
            await asyncio.sleep(POLL_S)

    async def close(self) -> None:
        await self.directory.stop()



def report(result: dict, run_dir: str | os.PathLike) -> None:
    """The run's end: RUN_DIR/result.json and the summary on the console."""
    from .summary import print_summary
    run_dir = Path(run_dir)
    (run_dir / "result.json").write_text(json.dumps(result, indent=1, default=str))
    print_summary(result, run_dir)


class StatusBoard:
    """What is up, on the console and in RUN_DIR/status.json."""

    def __init__(self, run_dir: Path, expected: list[str], mode: str, interval: float = 1.0):
        self.run_dir, self.expected, self.mode, self.interval = run_dir, expected, mode, interval
        self.t0 = time.monotonic()
        self._last_key = None
        self._last_print = 0.0
        self._last_write = 0.0

    def update(self, listing: dict, controller: dict | None, processes: dict, restarts: int,
               force: bool = False, state: str = "running", failure: str | None = None,
               cause: str | None = None) -> None:
        now = time.monotonic()
        if not force and now - self._last_write < self.interval:
            return
        self._last_write = now
        actors = {}
        for name in sorted(set(self.expected) | set(listing)):
            e = listing.get(name, {})
            p = processes.get(name, {})
            actors[name] = {"up": bool(e.get("alive")), "registered": name in listing, "pid": e.get("pid") or
                            p.get("pid"), "host": e.get("host"), "endpoint": e.get("endpoint"),
                            "last_seen": e.get("last_seen"),
                            "incarnation": e.get("incarnation", 0), "restarts": p.get("restarts", 0)}
        st = {"time": time.time(), "uptime": round(now - self.t0, 1), "state": state, "controller": controller or {},
              "actors": actors, "processes": processes, "restarts": restarts}
        if failure:  # state "failed": why, and its root cause in one line (the console's last line)
            st.update(failure=failure, cause=cause or failure.splitlines()[-1])
        tmp = self.run_dir / "status.json.tmp"
        tmp.write_text(json.dumps(st, default=str))
        os.replace(tmp, self.run_dir / "status.json")
        if self.mode == "off":
            return
        up = [n for n in self.expected if actors.get(n, {}).get("up")]
        down = [n for n in self.expected if n not in up]
        c = controller or {}
        step = f"rollout {c.get('rollout_id', '-')} {c.get('phase', '?')} v{c.get('weight_version', 0)}"
        line = (f"[{now - self.t0:5.0f}s] {step} | up {len(up)}/{len(self.expected)}"
                + (f" | down: {' '.join(down)}" if down else "") + (f" | restarts {restarts}" if restarts else ""))
        if self.mode == "line":   # the console's footer, with the progress bar (slime_actors.log.CONSOLE)
            CONSOLE.footer("status", line)
        elif self.mode == "table":
            if force or now - self._last_print >= 10:
                self._last_print = now
                console_write(self.table(actors, line))
        else:  # changes: one line when who is up changes (or the phase), else every 30 s
            key = (tuple(down), c.get("phase"), restarts)
            if force or key != self._last_key or now - self._last_print >= 30:
                self._last_key, self._last_print = key, now
                console_write(line)

    @staticmethod
    def table(actors: dict, head: str) -> str:
        rows = [head, f"  {'actor':<14} {'state':<6} {'pid':>8} {'host':<12} {'seen':>6} {'restarts':>8}"]
        for n, a in actors.items():
            rows.append(f"  {n:<14} {'up' if a['up'] else 'down':<6} {a['pid'] or '-':>8} {str(a['host'] or '-'):<12} "
                        f"{a['last_seen'] if a['last_seen'] is not None else '-':>6} {a['restarts']:>8}")
        return "\n".join(rows)

    def finish(self) -> None:
        """The footer ends (the status line stays as the last line of the run; a progress bar left by a run that
        failed is erased), so what is printed next -- the summary, the failure's cause -- starts a line of its own."""
        CONSOLE.end_footer(keep=self.mode == "line")
