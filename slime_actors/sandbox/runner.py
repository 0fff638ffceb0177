"""Run one program in the sandbox and collect what it did: the parent side of slime_actors/sandbox/jail.py.

    runner = Runner(Policy(), Limits(timeout=5, memory_mb=256), concurrency=8)
    r = runner.run(argv=["sh", "-c", "echo hi"])                    # RunResult(exit_code=0, stdout=b"hi\\n", ...)
    r = runner.run(python_file="main.py", files={"main.py": src}, stdin=b"3 4\\n")
    r = await runner.arun(...)                                      # the same from an event loop (a thread each)

Each run: a fresh working directory (made here, owned by the run's user, removed afterwards) unless the caller
gives one; a uid slot (as root: a user of its own, from a range no account uses; held for the run and locked
against other processes); a jail process forked by the runner's jail server (started on first use: one prepared
interpreter, so that none starts per program) in a session of its own, handed the program's stdin, stdout, stderr
and a status pipe over a unix socket; the program's environment a few fixed variables (program_env); stdin written
as the program reads it; stdout and stderr read up to `Limits.output_bytes` each (past that the pipe is closed:
the program's next write fails); at the end -- the program done, the wall-clock timeout, or the caller gone (the
server ends with the runner's process, and every jail with the server) -- the cell's init is killed first (with a
pid namespace that kills every process of the program), then the jail's session, and, without a pid namespace,
every process of the run's user. The run returns only once the jail has ended (its status pipe closed). At most
`concurrency` programs run at once.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .layers import JAIL, Plan, Policy, SandboxUnavailable, make_plan, probe, reachable_by_others

__all__ = ["Limits", "RunResult", "Runner", "UidSlots", "SandboxError", "program_env", "HARNESS"]

HARNESS = str(Path(__file__).with_name("harness.py"))
UID_BASE = 1_900_000_000      # uid slots: far above any account's uid, below the 32-bit limit
UID_COUNT = 4096
DRAIN_AFTER_EXIT = 0.5        # seconds to read what is left in the pipes once the program has ended
_CHUNK = 1 << 16


class SandboxError(RuntimeError):
    """The sandbox could not run a program (its cell could not be built); nothing of the program ran."""


@dataclass(frozen=True)
class Limits:
    """What one program may use. Each is enforced by the kernel (rlimits) except `timeout` (the runner's clock)
    and `output_bytes` (the runner stops reading)."""
    timeout: float = 10.0            # wall-clock seconds, from the start of the jail
    cpu: float | None = None         # CPU seconds of each process (default: timeout); SIGXCPU, then SIGKILL 1 s on
    memory_mb: int = 1024            # address space of each process (RLIMIT_AS)
    file_mb: int = 64                # largest file a process may write (RLIMIT_FSIZE)
    open_files: int = 256            # RLIMIT_NOFILE
    processes: int = 64              # processes of the run's user (RLIMIT_NPROC; exact with a uid slot)
    output_bytes: int = 1 << 20      # stdout and stderr each

    def check(self) -> None:
        bad = [f"{k} must be > 0, got {v}" for k, v in (("timeout", self.timeout), ("memory_mb", self.memory_mb),
                                                        ("file_mb", self.file_mb), ("open_files", self.open_files),
                                                        ("processes", self.processes),
                                                        ("output_bytes", self.output_bytes)) if not v > 0]
        if self.cpu is not None and not self.cpu > 0:
            bad.append(f"cpu must be > 0, got {self.cpu}")
        if bad:
            raise ValueError("sandbox limits: " + "; ".join(bad))

    def rlimits(self) -> dict:
        cpu = max(1, int(round(self.cpu if self.cpu is not None else self.timeout)))
        return {"cpu": [cpu, cpu + 1], "as": self.memory_mb << 20, "fsize": self.file_mb << 20,
                "nofile": self.open_files, "nproc": self.processes, "core": 0}


@dataclass
class RunResult:
    """What a program did. `exit_code` is None when it was killed by a signal (`signal`) or never ran (`error`)."""
    exit_code: int | None = None
    signal: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wall_s: float = 0.0
    error: str | None = None          # the sandbox could not start the program (SandboxError's message)
    layers: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.error is None

    def describe(self) -> str:
        if self.error:
            return f"not run: {self.error}"
        if self.timed_out:
            return "timed out"
        if self.signal is not None:
            name = signal.Signals(self.signal).name if self.signal in signal.Signals._value2member_map_ else ""
            return f"killed by signal {self.signal} {name}".strip()
        return f"exit code {self.exit_code}"


def program_env(workdir: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A program's whole environment: a few fixed variables (nothing of the caller's), plus `extra`."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
           "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8"}
    for k, v in (extra or {}).items():
        if not isinstance(k, str) or not isinstance(v, str) or not k or "=" in k or "\0" in k + v:
            raise ValueError(f"environment variable {k!r}: names and values must be strings without '=' or NUL")
        env[k] = v
    return env


class UidSlots:
    """Users for the programs' processes, one per running program, from [base, base + count): a slot is claimed by
    an exclusive lock on a file of `lock_dir` (so several processes of one machine never share one)."""

    def __init__(self, lock_dir: str, base: int = UID_BASE, count: int = UID_COUNT):
        self.lock_dir, self.base, self.count = lock_dir, base, count
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        self._next = 0
        self._lock = threading.Lock()

    @contextmanager
    def claim(self):
        with self._lock:
            start = self._next
        for i in range(self.count):
            k = (start + i) % self.count
            fd = os.open(os.path.join(self.lock_dir, str(self.base + k)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                         0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            with self._lock:
                self._next = (k + 1) % self.count
            try:
                yield self.base + k
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            return
        raise SandboxError(f"all {self.count} sandbox users are busy ({self.lock_dir})")


def default_root() -> str:
    return os.path.join(tempfile.gettempdir(), "slime-actors-sandbox")


class Runner:
    """Runs programs in the sandbox: the layers of `policy` that the machine has (layers.make_plan), the default
    `limits`, at most `concurrency` at once. Thread-safe; `arun` for event loops."""

    def __init__(self, policy: Policy | None = None, limits: Limits | None = None, concurrency: int | None = None,
                 root: str | None = None, plan: Plan | None = None):
        self.policy = policy or Policy()
        self.limits = limits or Limits()
        self.limits.check()
        self.concurrency = max(1, concurrency or os.cpu_count() or 1)
        self.root = root or default_root()
        self._plan = plan
        self._plan_lock = threading.Lock()
        self._sem = threading.BoundedSemaphore(self.concurrency)
        self._executor: ThreadPoolExecutor | None = None
        self._slots: UidSlots | None = None
        self._jail_server: _JailServer | None = None
        self.stats = {"runs": 0, "timeouts": 0, "errors": 0, "truncated": 0}
        self._stats_lock = threading.Lock()

    # ------------------------------------------------------------------------------------------ set-up
    @property
    def plan(self) -> Plan:
        """The layers this runner uses (probing the machine on first use; SandboxUnavailable when it cannot)."""
        with self._plan_lock:
            if self._plan is None:
                plan = make_plan(self.policy)
                os.makedirs(self.root, mode=0o711, exist_ok=True)
                os.chmod(self.root, 0o711)      # users of the slots reach their own directories, list none
                if plan.uid_slots and not reachable_by_others(self.root):
                    raise SandboxUnavailable(
                        f"the sandbox's directory {self.root} cannot be reached by the sandbox's users (a directory "
                        "above it is closed to others): choose one they can reach, e.g. under /tmp")
                self._plan = plan
            return self._plan

    def python_version(self) -> tuple[int, int] | None:
        """(major, minor) of the sandbox's Python, as the probe found it."""
        v = probe(self.plan.python).get("python")
        return tuple(v[:2]) if isinstance(v, list) and len(v) >= 2 else None

    @property
    def slots(self) -> UidSlots:
        if self._slots is None:
            self._slots = UidSlots(os.path.join(self.root, ".uids"))
        return self._slots

    @contextmanager
    def user(self):
        """A uid for a program's processes (None: the caller's own, where the plan has no uid slots)."""
        if self.plan.uid_slots:
            with self.slots.claim() as uid:
                yield uid
        else:
            yield None

    def make_workdir(self, uid: int | None) -> str:
        self.plan  # noqa: B018 -- makes the root directory
        d = tempfile.mkdtemp(prefix="run-", dir=self.root)
        if uid is not None:
            os.chown(d, uid, uid)
        os.chmod(d, 0o700)
        return d

    # ------------------------------------------------------------------------------------------ running
    def run(self, *, argv: list[str] | None = None, python_file: str | None = None, harness: dict | None = None,
            files: dict[str, str | bytes] | None = None, stdin: bytes = b"", env: dict[str, str] | None = None,
            limits: Limits | None = None, workdir: str | None = None, uid: int | None = None,
            hold_uid: bool = False) -> RunResult:
        """Run one program: `argv` (exec'd, PATH searched), or `python_file` (a file of the working directory run
        as __main__ by the sandbox's Python), or the grading `harness` (harness.py's main(harness)). `files` are
        written into the working directory first. With `workdir` (and its `uid`, `hold_uid=True`: a
        LocalSandbox's), the directory is the caller's and stays; otherwise a fresh one is made and removed."""
        if sum(x is not None for x in (argv, python_file, harness)) != 1:
            raise ValueError("run() needs exactly one of argv, python_file, harness")
        limits = limits or self.limits
        limits.check()
        plan = self.plan
        with self._sem:
            if hold_uid:
                return self._run_in(plan, workdir, uid, argv, python_file, harness, files, stdin, env, limits)
            with self.user() as uid:
                own = workdir is None
                wd = self.make_workdir(uid) if own else workdir
                try:
                    return self._run_in(plan, wd, uid, argv, python_file, harness, files, stdin, env, limits)
                finally:
                    if own:
                        remove_tree(wd)
                    if uid is not None and plan.landlock is None:
                        remove_owned(uid)

    async def arun(self, **kw) -> RunResult:
        """`run` from an event loop: in one of `concurrency` threads (the loop keeps answering meanwhile)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix="sandbox")
        return await asyncio.get_running_loop().run_in_executor(self._executor, lambda: self.run(**kw))

    def close(self) -> None:
        """Stop the runner's threads and its jail server (a later run starts them again)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        if self._jail_server is not None:
            self._jail_server.close()
            self._jail_server = None

    def _count(self, r: RunResult) -> None:
        with self._stats_lock:
            self.stats["runs"] += 1
            self.stats["timeouts"] += r.timed_out
            self.stats["errors"] += r.error is not None
            self.stats["truncated"] += r.stdout_truncated or r.stderr_truncated

    def _config(self, plan: Plan, workdir: str, uid: int | None, argv, python_file, harness, env,
                limits: Limits) -> dict:
        rl = limits.rlimits()
        if uid is None and "nproc" in rl:
            # without a user of its own, RLIMIT_NPROC counts every process of this user: allow those running now
            rl["nproc"] = rl["nproc"] + _processes_of(os.getuid())
        cfg = {"workdir": workdir, "uid": uid, "gid": uid,
               "namespaces": plan.namespaces, "rlimits": rl, "site": plan.site, "env": program_env(workdir, env),
               "seccomp": plan.seccomp}
        if plan.landlock is not None:
            cfg["landlock"] = {**plan.landlock, "write": [workdir]}
        elif "mount" in plan.namespaces:
            cfg["hide"] = hidden_paths(workdir, plan.python)
        if argv is not None:
            if not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
                raise ValueError(f"argv must be a non-empty list of strings, got {argv!r:.200}")
            cfg.update(mode="exec", argv=list(argv))
        elif python_file is not None:
            cfg.update(mode="python", file=_relative(python_file))
        else:
            cfg.update(mode="harness", harness=HARNESS, harness_args=harness)
        return cfg

    def _server(self) -> "_JailServer":
        plan = self.plan
        with self._stats_lock:
            if self._jail_server is None:
                self._jail_server = _JailServer(plan)
            return self._jail_server

    def _run_in(self, plan, workdir, uid, argv, python_file, harness, files, stdin, env, limits) -> RunResult:
        for name, content in (files or {}).items():
            write_in(workdir, name, content, uid)
        cfg = self._config(plan, workdir, uid, argv, python_file, harness, env, limits)
        (in_r, in_w), (out_r, out_w), (err_r, err_w), (st_r, st_w) = os.pipe(), os.pipe(), os.pipe(), os.pipe()
        t0 = time.monotonic()
        try:
            jail_pid = self._server().spawn(cfg, [in_r, out_w, err_w, st_w])
        except BaseException:
            for fd in (in_w, out_r, err_r, st_r):
                os.close(fd)
            raise
        finally:
            for fd in (in_r, out_w, err_w, st_w):
                os.close(fd)
        result = RunResult()
        status = _Status(st_r)
        mine = _Fds(in_w, out_r, err_r)
        try:
            self._communicate(mine, in_w, out_r, err_r, status, stdin, limits, t0, result)
        finally:
            _kill(jail_pid, status)
            if plan.uid_slots and uid is not None and "pid" not in plan.namespaces:
                self._kill_user(plan, uid)
            status.close()
            mine.close_all()
        result.wall_s = time.monotonic() - t0
        result.layers = status.layers
        if status.error:
            result.error = status.error
        elif not result.timed_out:
            result.exit_code, result.signal = status.exit, status.signal
            if status.exit is None and status.signal is None:
                result.error = "the sandbox's jail ended without a report" + \
                    (f": {result.stderr[-300:].decode(errors='replace')}" if result.stderr else "")
        self._count(result)
        return result

    def _communicate(self, mine: "_Fds", win, out_fd, err_fd, status, stdin: bytes, limits: Limits, t0: float,
                     result: RunResult) -> None:
        """Feed stdin, read stdout and stderr (each up to the cap), until the jail has ended (its status pipe is
        closed: the jail and the cell's init are gone) and the pipes are drained, or the wall-clock timeout."""
        deadline = t0 + limits.timeout
        outs = {out_fd: bytearray(), err_fd: bytearray()}
        names = {out_fd: "stdout", err_fd: "stderr"}
        readers = {out_fd, err_fd, status.fd}
        os.set_blocking(win, False)
        pending = memoryview(stdin)
        writing = bool(pending)
        if not writing:
            mine.close(win)
        ended_at = None
        while True:
            now = time.monotonic()
            if now >= deadline:
                result.timed_out = True
                break
            if ended_at is None and status.fd not in readers:
                ended_at = now
            if ended_at is not None and (not readers or now - ended_at > DRAIN_AFTER_EXIT):
                break
            wait = deadline - now if ended_at is None else min(deadline - now, DRAIN_AFTER_EXIT)
            rl, wl, _ = select.select(list(readers), [win] if writing else [], [], min(wait, 0.25))
            for fd in rl:
                if fd == status.fd:
                    if not status.read():
                        readers.discard(fd)
                    continue
                try:
                    chunk = os.read(fd, _CHUNK)
                except OSError:
                    chunk = b""
                if not chunk:
                    readers.discard(fd)
                    continue
                buf = outs[fd]
                room = limits.output_bytes - len(buf)
                buf += chunk[:room]
                if len(chunk) > room:      # over the cap: stop reading; the program's next write fails
                    setattr(result, f"{names[fd]}_truncated", True)
                    readers.discard(fd)
                    mine.close(fd)
            if wl:
                try:
                    n = os.write(win, pending[:_CHUNK])
                    pending = pending[n:]
                except BlockingIOError:
                    pass
                except OSError:            # the program closed its stdin (or ended): the rest is not wanted
                    pending = pending[:0]
                if not pending:
                    writing = False
                    mine.close(win)
        result.stdout, result.stderr = bytes(outs[out_fd]), bytes(outs[err_fd])

    def _kill_user(self, plan: Plan, uid: int) -> None:
        """Without a pid namespace: SIGKILL every process of the run's user (a daemon that left the session)."""
        cfg = {"mode": "reap", "uid": uid}
        subprocess.run([plan.python, "-I", "-S", JAIL, json.dumps(cfg)], env={"PATH": "/usr/bin:/bin"},
                       capture_output=True, timeout=30, check=False)


class _Fds:
    """A run's own fds, each closed exactly once: a number closed twice could by then be another run's pipe (the
    runner's threads make pipes all the time), and closing that would cross two programs' streams."""

    def __init__(self, *fds: int):
        self.open = set(fds)

    def close(self, fd: int) -> None:
        if fd in self.open:
            self.open.discard(fd)
            os.close(fd)

    def close_all(self) -> None:
        for fd in list(self.open):
            self.close(fd)


class _JailServer:
    """The jail server of one runner (jail.py `serve`): started on first use, restarted if it died; `spawn`
    hands it one program's config and fds and returns the jail process's pid."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.lock = threading.Lock()

    def _start(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cfg = {"mode": "serve", "site": self.plan.site, "landlock": self.plan.landlock is not None,
               "seccomp": self.plan.seccomp is not None, "harness": HARNESS}
        try:
            self.proc = subprocess.Popen([self.plan.python, "-I", "-S", JAIL, json.dumps(cfg)], stdin=theirs.fileno(),
                                         stdout=subprocess.DEVNULL, close_fds=True, start_new_session=True,
                                         env={"PATH": "/usr/bin:/bin"})
        except OSError as exc:
            mine.close()
            raise SandboxError(f"the sandbox's jail server did not start: {exc}") from None
        finally:
            theirs.close()
        self.sock = mine

    def spawn(self, cfg: dict, fds: list[int]) -> int:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                if self.sock is not None:
                    self.sock.close()
                self._start()
            try:
                socket.send_fds(self.sock, [json.dumps(cfg).encode()], fds)
                reply = self.sock.recv(4096)
            except OSError as exc:
                raise SandboxError(f"the sandbox's jail server is gone: {exc}") from None
        if not reply:
            raise SandboxError("the sandbox's jail server ended")
        return int(json.loads(reply)["pid"])

    def close(self) -> None:
        with self.lock:
            if self.sock is not None:
                self.sock.close()          # the server ends at EOF
                self.sock = None
            if self.proc is not None:
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
                self.proc = None


class _Status:
    """The jail's status lines: init's pid, the layers, an error, the program's end."""

    def __init__(self, fd: int):
        self.fd, self.buf = fd, b""
        self.init_pid: int | None = None
        self.layers: list[str] = []
        self.error: str | None = None
        self.exit: int | None = None
        self.signal: int | None = None
        self.closed = False
        self.ended = False              # the pipe is closed on all the jail's ends

    def read(self) -> bool:
        try:
            chunk = os.read(self.fd, _CHUNK)
        except OSError:
            chunk = b""
        if not chunk:
            self.ended = True
            return False
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "pid" in msg:
                self.init_pid = int(msg["pid"])
            if "layers" in msg:
                self.layers = list(msg["layers"])
            if "error" in msg and self.error is None:
                self.error = str(msg["error"])
            if "exit" in msg:
                self.exit = int(msg["exit"])
            if "signal" in msg:
                self.signal = int(msg["signal"])
        return True

    def wait_end(self, timeout: float) -> None:
        """Read until the jail's ends of the pipe are all closed (or `timeout`)."""
        until = time.monotonic() + timeout
        while not self.ended and not self.closed:
            left = until - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return
            self.read()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)


def _kill(jail_pid: int, status: "_Status", wait: float = 10.0) -> None:
    """SIGKILL the cell's init first: its end takes every process of its pid namespace with it, and the jail, which
    waits for init, ends only after that -- its status pipe closes then, so once it has, nothing of the program is
    left. Then the jail's session, whatever remains of it."""
    if not status.ended and status.init_pid is not None:
        for target in (lambda: os.kill(status.init_pid, signal.SIGKILL),
                       lambda: os.killpg(status.init_pid, signal.SIGKILL)):
            try:
                target()
            except (ProcessLookupError, PermissionError):
                pass
    if not status.ended:
        status.wait_end(wait / 2)
    try:
        os.killpg(jail_pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if not status.ended:
        status.wait_end(wait / 2)


def _processes_of(uid: int) -> int:
    n = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                n += os.stat(f"/proc/{name}").st_uid == uid
            except OSError:
                pass
    return n


def _relative(name: str) -> str:
    p = Path(name)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ValueError(f"{name!r}: a file of the working directory, as a relative path without '..'")
    return str(p)


def write_in(workdir: str, name: str, content: str | bytes, uid: int | None = None) -> None:
    """Write a file inside `workdir` without following links the program may have planted (O_NOFOLLOW on every
    component), owned by `uid`."""
    data = content.encode() if isinstance(content, str) else bytes(content)
    parts = Path(_relative(name)).parts
    dfd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts[:-1]:
            try:
                os.mkdir(part, 0o700, dir_fd=dfd)
                if uid is not None:
                    os.chown(part, uid, uid, dir_fd=dfd, follow_symlinks=False)
            except FileExistsError:
                pass
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
            os.close(dfd)
            dfd = nfd
        fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600,
                     dir_fd=dfd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, f"{name} is not a regular file")
            if uid is not None:
                os.fchown(fd, uid, uid)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
    finally:
        os.close(dfd)


def read_in(workdir: str, name: str, limit: int = 64 << 20) -> bytes:
    """Read a regular file inside `workdir` (no link followed; at most `limit` bytes)."""
    parts = Path(_relative(name)).parts
    dfd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts[:-1]:
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
            os.close(dfd)
            dfd = nfd
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, f"{name} is not a regular file")
            out = bytearray()
            while len(out) < limit:
                chunk = os.read(fd, min(_CHUNK, limit - len(out)))
                if not chunk:
                    break
                out += chunk
            return bytes(out)
        finally:
            os.close(fd)
    finally:
        os.close(dfd)


def remove_tree(path: str) -> None:
    """Remove a working directory, whatever modes the program left on what it made."""
    def fix(func, p, exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass
    shutil.rmtree(path, onerror=fix)
    if os.path.lexists(path):
        shutil.rmtree(path, ignore_errors=True)


SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")


def remove_owned(uid: int) -> None:
    """Without landlock a program may write where everyone may (/tmp, /var/tmp, /dev/shm): remove what a run's
    user left there."""
    for d in SHARED_WRITABLE:
        try:
            entries = os.scandir(d)
        except OSError:
            continue
        with entries:
            for e in entries:
                try:
                    if e.stat(follow_symlinks=False).st_uid == uid:
                        if e.is_dir(follow_symlinks=False):
                            remove_tree(e.path)
                        else:
                            os.unlink(e.path)
                except OSError:
                    pass


def hidden_paths(workdir: str, python: str) -> list[str]:
    """What a mount namespace hides when there is no landlock: the home directory, the run directory, this
    process's working directory -- except a directory holding the program's working directory or its Python."""
    from .. import env as E
    cands = [os.path.expanduser("~"), E.RUN_DIR.get() or "", os.getcwd(), "/root"]
    keep = [os.path.realpath(workdir), os.path.realpath(python)]
    out = []
    for c in cands:
        if not c:
            continue
        c = os.path.realpath(c)
        if c in out or c == "/" or any(k == c or k.startswith(c + os.sep) for k in keep):
            continue
        if os.path.isdir(c):
            out.append(c)
    return out

