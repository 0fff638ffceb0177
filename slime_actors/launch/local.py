"""Start actor processes on this host and supervise them.

Each actor runs as `python -m slime_actors.launch.actor ROLE INDEX` in its own session (process group), with the
job's environment and, where the topology says so, its GPUs (CUDA_VISIBLE_DEVICES) and CPUs (affinity). Its
stdout/stderr go to RUN_DIR/logs/ROLE-INDEX.out; warnings, errors and tracebacks are also echoed to the console with
the actor's name in front. Every actor gets SIGTERM when the supervisor dies (PR_SET_PDEATHSIG), and the supervisor
is a child subreaper, so whatever an actor started (an engine in its own session) is still ours to clean up.

Supervision, the OTP rules:
  * an actor that exits unexpectedly is restarted if its role's policy says so;
  * a role with `group` set (trainer ranks: one dead rank breaks the process group) is restarted as a whole: the
    surviving members on this host are killed and every member starts again;
  * more than `max_restarts` restarts within `window` seconds stops the job, with a report of what failed;
  * an actor that dies before it ever became ready (its start-up report, launch/startup.py) is judged by the
    start-up rule instead: a cause no restart can change stops the job at once, the same cause twice (or three
    start-up failures in a row) stops it too; the cause is the job's last line, printed once. Until an actor is
    ready its warnings wait (they are echoed once it is; a start that fails leaves them in its log only);
  * an actor whose process is alive but whose heartbeats stopped (the directory's liveness, passed to `check`) for
    `hang_kill_after` seconds is asked for its Python stack (launch/stacks.py), logged with where its main thread
    was, and killed, and so restarted: a hung process is a failed process. A restarted actor that hangs again at the
    same place (its innermost frame in the same function: a loop's line may differ) stops the job with that stack:
    a blocking call in async code hangs every incarnation alike, and restarts every ~15 s would never reach the
    restart limit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from ..env import CPUS, INCARNATION
from ..log import console_write, get_logger
from . import stacks
from .startup import EXIT_PERMANENT, MAX_START_FAILURES, Cause, cause_from_output, read_report
from .topology import RestartPolicy

__all__ = ["LocalLauncher", "ActorProc", "RestartPolicy", "SupervisionError", "become_subreaper", "descendants",
           "kill_tree"]

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
EXIT_GROUP_RESTART = 75   # a trainer rank told to leave its broken group (actors/trainer.py)


@dataclass
class StartState:
    """One incarnation's start: whether it reported ready, and the console lines held until it does."""
    ready: bool = False
    held: deque = field(default_factory=lambda: deque(maxlen=200))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def echo_or_hold(self, text: str) -> bool:
        """True: echo `text` now (ready); else it is held."""
        with self.lock:
            if not self.ready:
                self.held.append(text)
            return self.ready

    def set_ready(self) -> list[str]:
        """Mark ready; the lines held until now."""
        with self.lock:
            self.ready = True
            held = list(self.held)
            self.held.clear()
        return held


@dataclass
class ActorProc:
    role: str
    index: int
    env: dict
    policy: RestartPolicy
    cpus: list[int] | None = None
    popen: subprocess.Popen | None = None
    restarts: deque = field(default_factory=deque)
    started: float = 0.0
    exit_codes: list = field(default_factory=list)
    expected_exit: bool = False
    incarnation: int = 0
    pids: list = field(default_factory=list)
    startup: StartState = field(default_factory=StartState)   # this incarnation's
    start_failures: list = field(default_factory=list)      # start-up Causes since it was last ready
    stack_asked: float | None = None     # when this incarnation, hung, was asked for its stack (launch/stacks.py)
    stack_offset: int = 0                # its log's size then: the dump is read from there
    hung_at: stacks.Frame | None = None  # where the last incarnation killed as hung was stuck (innermost frame)

    @property
    def ready(self) -> bool:
        return self.startup.ready

    @property
    def name(self) -> str:
        return f"{self.role}/{self.index}"

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class SupervisionError(RuntimeError):
    pass


_ECHO = ("[warning", "[error", "[critical", "Traceback", "Error:", "error:")


def _libc():
    import ctypes
    return ctypes.CDLL("libc.so.6", use_errno=True)


def become_subreaper() -> bool:
    """Make this process the reaper of orphaned descendants (Linux), so nothing the job starts escapes it."""
    try:
        return _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except Exception:
        return False


def _child_setup(cpus: list[int] | None):
    def setup():
        try:
            _libc().prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        except Exception:
            pass
        if cpus:
            try:
                os.sched_setaffinity(0, cpus)
            except OSError:
                pass
    return setup


def _ppid_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses; split after the last ')'
        rest = stat[stat.rfind(")") + 2:].split()
        if len(rest) >= 2:
            children.setdefault(int(rest[1]), []).append(int(entry))
    return children


def descendants(pid: int | None = None) -> list[int]:
    """Every live descendant of `pid` (default: this process), children before grandchildren."""
    pid = os.getpid() if pid is None else pid
    tree = _ppid_map()
    out, todo = [], list(tree.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(tree.get(p, []))
    return out


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> list[int]:
    """Signal a process, its process group and all its descendants (stopped ones get SIGCONT too)."""
    pids = [pid] + descendants(pid)
    for p in pids:
        try:
            os.kill(p, sig)
            if sig in (signal.SIGTERM, signal.SIGINT):
                os.kill(p, signal.SIGCONT)   # a stopped process only acts on SIGTERM once continued
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    return pids


def reap_orphans(known: set[int]) -> None:
    """Collect zombies reparented to us (we are a subreaper) that are not our own Popen children."""
    for p in _ppid_map().get(os.getpid(), []):
        if p in known:
            continue
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                state = f.read().decode(errors="replace")
            if state[state.rfind(")") + 2:].split()[0] == "Z":
                os.waitpid(p, os.WNOHANG)
        except (OSError, ChildProcessError, IndexError):
            pass


class LocalLauncher:
    def __init__(self, run_dir: str, base_env: dict, python: str = sys.executable, echo: bool = True,
                 hang_kill_after: float | None = None):
        self.run_dir = Path(run_dir)
        self.base_env = base_env
        self.python = python
        self.echo = echo
        self.hang_kill_after = hang_kill_after
        self.procs: dict[str, ActorProc] = {}
        self.log = get_logger(actor="launcher")
        self.events: list[tuple[float, str, str]] = []  # (time, actor, what)
        self.failure: str | None = None
        self.failure_cause: str | None = None   # a start-up failure's cause (one line), also the failure's last line
        self.group_restarts: dict[str, deque] = {}
        self.restarted_total = 0
        self.reap_all = False       # set when this process is a subreaper that owns everything below it
        self._lock = threading.Lock()
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)

    def add(self, role: str, index: int, env: dict | None = None, policy: RestartPolicy | None = None,
            cpus: list[int] | None = None) -> ActorProc:
        ap = ActorProc(role, index, {**self.base_env, **(env or {})}, policy or RestartPolicy(), cpus)
        self.procs[ap.name] = ap
        return ap

    def start(self, ap: ActorProc) -> None:
        out_path = self.run_dir / "logs" / f"{ap.role}-{ap.index}.out"
        out = open(out_path, "ab")
        env = {**os.environ, **ap.env, "PYTHONUNBUFFERED": "1", INCARNATION.name: str(ap.incarnation)}
        cpus = ap.cpus
        if cpus is None and CPUS.get(env):
            cpus = [int(c) for c in CPUS.get(env).split(",") if c.strip()]
        ap.popen = subprocess.Popen([self.python, "-m", "slime_actors.launch.actor", ap.role, str(ap.index)],
                                    env=env, stdout=out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                    start_new_session=True, preexec_fn=_child_setup(cpus))
        out.close()
        ap.started = time.monotonic()
        ap.expected_exit = False
        ap.stack_asked = None
        ap.startup = StartState()
        ap.pids.append(ap.popen.pid)
        threading.Thread(target=self._pump, args=(ap, ap.popen, ap.startup, out_path), daemon=True).start()
        self.events.append((time.time(), ap.name, f"started pid {ap.popen.pid}"))

    def _pump(self, ap: ActorProc, popen: subprocess.Popen, start: StartState, out_path: Path) -> None:
        with open(out_path, "ab") as out:
            for line in popen.stderr:
                out.write(line)
                out.flush()
                if self.echo:
                    text = line.decode(errors="replace").rstrip()
                    # (until it is ready the lines are held: a failed start is reported by its cause)
                    if any(m in text for m in _ECHO) and start.echo_or_hold(text):
                        console_write(f"{ap.name:>12} | {text}")

    def start_all(self) -> None:
        for ap in self.procs.values():
            self.start(ap)

    # ------------------------------------------------------------------------------------------ supervision
    def _intensity(self, key: str, q: deque, policy: RestartPolicy) -> bool:
        """Record a restart; False when it is one too many (> max_restarts within window)."""
        now = time.monotonic()
        q.append(now)
        while q and now - q[0] > policy.window:
            q.popleft()
        return len(q) <= policy.max_restarts

    def check(self, liveness: dict | None = None) -> list[str]:
        """Restart what died (per policy); kill what hangs. Returns the names restarted; sets `failure` when the
        job must stop. `liveness`: the directory's `list` answer (name -> {alive, last_seen, pid})."""
        if self.failure:
            return []
        if liveness and self.hang_kill_after:
            self._kill_hung(liveness)
        for ap in self.procs.values():
            if not ap.ready and ap.popen is not None:
                self._poll_ready(ap)
        died: list[tuple[ActorProc, int]] = []
        for ap in self.procs.values():
            if ap.popen is None or ap.expected_exit:
                continue
            code = ap.popen.poll()
            if code is None:
                continue
            ap.exit_codes.append(code)
            self.events.append((time.time(), ap.name, f"exited with code {code}"))
            died.append((ap, code))
        restarted: list[str] = []
        done_groups: set[str] = set()
        for ap, code in died:
            if ap.popen is None:
                continue
            tail = _tail(self.run_dir / "logs" / f"{ap.role}-{ap.index}.out")
            why = _exit_reason(code)
            if not ap.ready:
                self._poll_ready(ap)   # (it may have become ready since the last check)
            if not ap.ready:
                stop = self._start_failed(ap, code)
                if stop is not None:
                    self.failure, self.failure_cause = stop
                    ap.popen = None
                    continue
            if not ap.policy.restart:
                self.failure = f"{ap.name} {why} and its role is not restarted\n{tail}"
                ap.popen = None
                continue
            if ap.policy.group:
                if ap.role in done_groups:
                    continue
                done_groups.add(ap.role)
                q = self.group_restarts.setdefault(ap.role, deque())
                if not self._intensity(ap.role, q, ap.policy):
                    self.failure = (f"the {ap.role} group was restarted {len(q)} times within "
                                    f"{ap.policy.window:g}s (limit {ap.policy.max_restarts}); last: {ap.name} "
                                    f"{why}\n{tail}")
                    ap.popen = None
                    continue
                members = [m for m in self.procs.values() if m.role == ap.role]
                self.log.warning("group member died; restarting the group", actor=ap.name, code=code,
                                 members=len(members), restarts=len(q))
                for m in members:   # the survivors' process group is broken: they go too
                    if m.alive():
                        m.expected_exit = True
                        kill_tree(m.popen.pid, signal.SIGKILL)
                for m in members:
                    if m.popen is not None:
                        try:
                            m.popen.wait(10)
                        except subprocess.TimeoutExpired:
                            pass
                    m.incarnation += 1
                    self.start(m)
                    restarted.append(m.name)
                self.events.append((time.time(), ap.role, f"group restarted after {ap.name} {why}"))
                self.restarted_total += 1
                continue
            if not self._intensity(ap.name, ap.restarts, ap.policy):
                self.failure = (f"{ap.name} died {len(ap.restarts)} times within {ap.policy.window:g}s "
                                f"(limit {ap.policy.max_restarts}); last: {why}\n{tail}")
                ap.popen = None
                continue
            self.log.warning("actor died; restarting", actor=ap.name, code=code, restarts=len(ap.restarts))
            kill_tree(ap.popen.pid, signal.SIGKILL)  # anything it left behind in its session
            ap.incarnation += 1
            self.start(ap)
            restarted.append(ap.name)
            self.restarted_total += 1
        reap_orphans({ap.popen.pid for ap in self.procs.values() if ap.popen is not None})
        return restarted

    def _poll_ready(self, ap: ActorProc) -> None:
        report = read_report(self.run_dir, ap.name, ap.popen.pid)
        if report is None or report.get("state") != "ready":
            return
        held = ap.startup.set_ready()
        ap.start_failures.clear()
        if self.echo:
            for text in held:
                console_write(f"{ap.name:>12} | {text}")

    def _start_failed(self, ap: ActorProc, code: int) -> tuple[str, str] | None:
        """The start-up rule (launch/startup.py) for an actor that died before it was ready: (failure, cause) when
        the job must stop, None when it may start again."""
        ap.startup.held.clear()
        out_path = self.run_dir / "logs" / f"{ap.role}-{ap.index}.out"
        report = read_report(self.run_dir, ap.name, ap.popen.pid)
        if report is not None and report.get("state") == "failed" and report.get("cause"):
            cause = Cause(str(report["cause"]), bool(report.get("permanent")) or code == EXIT_PERMANENT)
        else:  # no report (killed, crashed in the interpreter): its output's last exception, else how it ended
            try:
                lines = out_path.read_text(errors="replace").splitlines()[-60:]
            except OSError:
                lines = []
            found = cause_from_output(lines)
            text = f"{_exit_reason(code)}: {found.text}" if found else _exit_reason(code)
            cause = Cause(text, code == EXIT_PERMANENT or bool(found and found.permanent))
        self.events.append((time.time(), ap.name, f"failed to start: {cause.text}"))
        where = f"its log: {_shown(out_path)}"
        if cause.permanent:
            return (f"{ap.name} could not start, and starting it again cannot change the cause ({where})\ncause: "
                    + cause.text, cause.text)
        same = any(c.key == cause.key for c in ap.start_failures)
        ap.start_failures.append(cause)
        if same:
            return (f"{ap.name} failed to start twice with the same cause ({where})\ncause: {cause.text}",
                    cause.text)
        if len(ap.start_failures) >= MAX_START_FAILURES:
            earlier = "; ".join(c.text for c in ap.start_failures[:-1])
            return (f"{ap.name} failed to start {len(ap.start_failures)} times in a row, never ready ({where}); "
                    f"before: {earlier}\ncause: " + cause.text, cause.text)
        if self.echo:
            console_write(f"{ap.name:>12} | failed to start: {cause.text} -- starting it again (the same cause once "
                          "more stops the job)")
        return None

    def _kill_hung(self, liveness: dict) -> None:
        now = time.monotonic()
        for name, info in liveness.items():
            ap = self.procs.get(name)
            if ap is None or not ap.alive() or info.get("alive", True):
                continue
            if info.get("pid") != ap.popen.pid or now - ap.started < self.hang_kill_after:
                continue
            if info.get("last_seen", 0) < self.hang_kill_after:
                continue
            out_path = self.run_dir / "logs" / f"{ap.role}-{ap.index}.out"
            if ap.stack_asked is None:   # first its stack: it is written to its log from a signal handler
                ap.stack_offset = stacks.size(out_path)
                ap.stack_asked = now
                if stacks.ask(ap.popen.pid):
                    continue
                ap.stack_asked -= stacks.WAIT_S   # (not asked: no dump to wait for)
            dumped = stacks.read(out_path, ap.stack_offset)
            if now - ap.stack_asked < stacks.WAIT_S and not stacks.complete(dumped):
                continue   # (the dump reaches the log line by line, through the pipe the supervisor pumps)
            frames = dumped or []
            place = frames[0] if frames else None
            silent = info.get("last_seen")
            self.log.error("actor alive but silent; killing it", actor=name, pid=ap.popen.pid, silent_for=silent,
                           stuck_at=str(place) if place else "(no Python stack: not in Python, or stopped)")
            self.events.append((time.time(), name, f"hung: no heartbeat for {silent}s"
                                + (f" at {place}" if place else "") + "; killed"))
            if place is not None and ap.hung_at is not None and place.function == ap.hung_at.function:
                ap.expected_exit = True   # not restarted: the job stops
                self.failure = (
                    f"{name} hung twice at the same place, each time alive but silent (no heartbeat) for "
                    f"{self.hang_kill_after:g}s, killed; its main thread was at:\n{stacks.shown(frames)}\n"
                    "A call that blocks inside async code (time.sleep, requests, subprocess.run, a long "
                    "computation) stops the whole actor, its heartbeats too: await an async version of it or run "
                    f"it in a thread (await asyncio.to_thread(fn, ...)). Its log: {_shown(out_path)}")
                self.failure_cause = f"{name} hung twice at {place.path}:{place.line} in {place.func}"
            ap.hung_at = place
            kill_tree(ap.popen.pid, signal.SIGKILL)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        ap = self.procs[name]
        pid = ap.popen.pid
        os.killpg(pid, sig)
        return pid

    def snapshot(self) -> dict:
        return {ap.name: {"pid": ap.pid, "alive": ap.alive(), "restarts": ap.incarnation,
                          "exit_codes": ap.exit_codes[-5:]} for ap in self.procs.values()}

    def stop_all(self, grace: float = 15.0) -> None:
        """SIGTERM every actor (and what it started), wait, then SIGKILL what is left: no orphans."""
        self.echo = False  # peers going down now is expected: keep it in the logs, off the console
        live = [ap for ap in self.procs.values() if ap.alive()]
        for ap in live:
            ap.expected_exit = True
            try:
                os.kill(ap.popen.pid, signal.SIGTERM)
                os.kill(ap.popen.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        for ap in live:
            try:
                ap.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for ap in self.procs.values():
            ap.expected_exit = True
            if ap.popen is None:
                continue
            kill_tree(ap.popen.pid, signal.SIGKILL)
            try:
                ap.popen.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if not self.reap_all:
            return
        # engines are in their own sessions; after their worker died they were reparented to us (subreaper)
        left = descendants()
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5:
            reap_orphans(set())
            if not [p for p in descendants() if _is_live(p)]:
                break
            time.sleep(0.05)


def _is_live(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            s = f.read().decode(errors="replace")
        return s[s.rfind(")") + 2:].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code == EXIT_GROUP_RESTART:
        return "left its broken group (exit 75)"
    return f"exited with code {code}"


def _shown(path: Path) -> str:
    """A path as the user gave its run directory: relative to the working directory when it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return ""
    return "\n".join("    " + ln for ln in lines)
