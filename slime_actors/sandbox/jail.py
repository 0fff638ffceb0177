"""The jail: the process that builds one program's cell and runs the program in it (a script; standard library only).

slime_actors/sandbox/runner.py starts it once per runner as a server (`serve`: `PYTHON -I -S jail.py
'{"mode": "serve", ...}'`, an environment of PATH only, its stdin a unix socket): it imports the optional layers
(landlock, pyseccomp) and the grading harness once, and for every program forks a jail process -- in a session
of its own, with the program's stdin, stdout and stderr and a status pipe, passed over the socket. Forking a
prepared interpreter instead of starting one per program is what keeps the sandbox's cost near that of a bare
subprocess (bench/sandbox.py). What a jail process does, in order (each step only where its config asks for it;
runner.py asks for what the machine supports, layers.py):

    jail (H)   die with the server (PR_SET_PDEATHSIG; the server ends when the runner's socket closes);
               unshare(2) the namespaces: pid, mount, network, ipc, uts (and user, when not root); fork the cell's
               init
    init (C)   pid 1 of the new pid namespace (when there is one): its own session; the mount namespace made
               private and a fresh /proc mounted (it shows the cell's processes only); paths hidden under empty
               read-only tmpfs (when landlock is missing); report its pid; fork the program; reap every process
               until the program has ended; report the program's end; exit -- the kernel then kills whatever is left
               in the pid namespace (a daemon that double-forked included). Without a pid namespace it kills its
               process group instead, and (as root) every process of the cell's user.
    program (P) rlimits; groups, gid and uid dropped to the cell's user (as root) or capabilities dropped (in a user
               namespace); no new privileges; die with init; landlock (read-only system directories, the working
               directory read-write, nothing else); seccomp (no inet sockets where the network is not cut by a
               namespace, no ptrace/mount/unshare/bpf/keyctl/...); all other fds closed; then exec the program, or,
               in "python" and "harness" mode, run Python code in this process (no second interpreter start).

Status lines (JSON, one per line) go to the status fd: {"pid": init's pid as the runner sees it}, {"layers": [...]}
(what was applied), {"error": "..."} (the cell could not be built: nothing of the program ran), {"exit": code} or
{"signal": number}. The program never holds the status fd.
"""

import ctypes
import errno
import json
import os
import resource
import signal
import sys

CLONE = {"mount": 0x00020000, "uts": 0x04000000, "ipc": 0x08000000, "user": 0x10000000, "pid": 0x20000000,
         "net": 0x40000000}
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
RLIMITS = {"cpu": resource.RLIMIT_CPU, "as": resource.RLIMIT_AS, "fsize": resource.RLIMIT_FSIZE,
           "nofile": resource.RLIMIT_NOFILE, "nproc": resource.RLIMIT_NPROC, "core": resource.RLIMIT_CORE}
# what a program never needs and a hostile one would use to leave its cell or spy on others
DENIED_SYSCALLS = ("ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root", "chroot",
                   "unshare", "setns", "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
                   "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
                   "swapon", "swapoff", "acct", "quotactl", "open_by_handle_at", "name_to_handle_at",
                   "io_uring_setup", "io_uring_enter", "io_uring_register", "fanotify_init", "lookup_dcookie",
                   "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig", "fspick", "mount_setattr")
INET_FAMILIES = (2, 10, 17)           # AF_INET, AF_INET6, AF_PACKET
EXIT_SETUP = 125                      # the jail's own exit code when the cell could not be built

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


def _check(ret, what):
    if ret != 0:
        e = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(e)} (errno {errno.errorcode.get(e, e)})")


def _prctl(option, arg):
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def _mount(source, target, fstype, flags, data=None):
    _check(_libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                       ctypes.c_ulong(flags), data and data.encode()), f"mount {target}")


def _drop_capabilities():
    """capset(2) to nothing: a process in a user namespace it made keeps every capability there otherwise."""
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]
    data = (Data * 2)()
    _check(_libc.capset(ctypes.byref(Header(0x20080522, 0)), data), "capset")


class Status:
    def __init__(self, fd):
        self.fd = fd

    def send(self, **msg):
        try:
            os.write(self.fd, (json.dumps(msg) + "\n").encode())
        except OSError:
            pass


def _unshare(cfg):
    flags = 0
    for name in cfg.get("namespaces", []):
        flags |= CLONE[name]
    if not flags:
        return
    uid, gid = os.getuid(), os.getgid()      # (read before: in the new user namespace they are unmapped yet)
    _check(_libc.unshare(flags), f"unshare({', '.join(cfg['namespaces'])})")
    if "user" in cfg["namespaces"]:
        for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1"),
                           ("/proc/self/gid_map", f"{gid} {gid} 1")):
            fd = os.open(path, os.O_WRONLY)       # (open(path, "w") truncates, which these files refuse)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)


def _init_mounts(cfg, applied):
    ns = cfg.get("namespaces", [])
    if "mount" not in ns:
        return
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    if "pid" in ns:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        applied.append("fresh /proc")
    hidden = []
    for path in cfg.get("hide", []):
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=000")
            hidden.append(path)
    if hidden:
        applied.append("hidden: " + ", ".join(hidden))


def _landlock(cfg):
    """The ruleset (made while the paths can still be opened); applied later, in the program."""
    spec = cfg.get("landlock")
    if not spec:
        return None
    from landlock import FSAccess, Ruleset
    from landlock.plumbing import landlock_abi_version
    abi = landlock_abi_version()
    rs = Ruleset()
    read = FSAccess.READ_FILE | FSAccess.READ_DIR | FSAccess.EXECUTE
    dev = FSAccess.READ_FILE | FSAccess.WRITE_FILE
    if abi >= 3:
        dev |= FSAccess.TRUNCATE
    if abi >= 5:
        dev |= FSAccess.IOCTL_DEV
    for paths, rules in ((spec.get("read", []), read), (spec.get("write", []), None), (spec.get("dev", []), dev)):
        for p in paths:
            if os.path.exists(p):
                rs.allow(p, rules=rules)
    return rs


def _seccomp(cfg):
    spec = cfg.get("seccomp")
    if not spec:
        return None
    import pyseccomp as sc
    f = sc.SyscallFilter(sc.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            f.add_rule(sc.ERRNO(errno.EPERM), name)
        except (OSError, ValueError):
            pass          # a syscall this kernel/libseccomp does not know
    if spec.get("deny_inet"):
        for fam in INET_FAMILIES:
            f.add_rule(sc.ERRNO(errno.EACCES), "socket", sc.Arg(0, sc.EQ, fam))
    return f


def _limits(cfg):
    for name, value in cfg.get("rlimits", {}).items():
        soft, hard = value if isinstance(value, list) else (value, value)
        resource.setrlimit(RLIMITS[name], (soft, hard))


def _become_program(cfg, ruleset, sfilter):
    """In the program's process: everything that can only be done to oneself, last the exec or the Python run."""
    top = _max_fd()
    _limits(cfg)
    os.chdir(cfg["workdir"])
    uid = cfg.get("uid")
    if uid is not None:
        gid = cfg.get("gid", uid)
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    elif "user" in cfg.get("namespaces", []):
        _drop_capabilities()
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if ruleset is not None:
        ruleset.apply()
    if sfilter is not None:
        sfilter.load()
    env = cfg.get("env", {})
    mode = cfg.get("mode", "exec")
    status_fd = cfg["status_fd"]
    if mode == "exec":       # the status fd stays (close-on-exec): a failed exec is reported through it
        os.closerange(3, status_fd)
        os.closerange(status_fd + 1, top)
    else:                    # the program's code runs in this process: it must not hold the status fd
        os.closerange(3, top)
    if mode == "exec":
        argv = cfg["argv"]
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):     # Python ignores them; a program gets the defaults
            signal.signal(sig, signal.SIG_DFL)
        os.execvpe(argv[0], argv, env)
    os.environ.clear()
    os.environ.update(env)
    if mode == "python":
        _run_python(cfg)
    elif mode == "harness":
        _run_harness(cfg)
    raise SetupError(f"unknown mode {mode!r}")


def _max_fd():
    try:
        return max(int(n) for n in os.listdir("/proc/self/fd")) + 1
    except (OSError, ValueError):
        return 1024


def _python_path(cfg):
    here = os.path.dirname(os.path.abspath(__file__))
    keep = [p for p in sys.path if p and os.path.abspath(p) != here and p not in cfg.get("site", [])]
    return [cfg["workdir"]] + keep


def _run_python(cfg):
    """Run a Python source file as __main__, as `python FILE` would (in this process: no second interpreter)."""
    path = os.path.join(cfg["workdir"], cfg["file"])
    sys.path[:] = _python_path(cfg)
    sys.argv[:] = [path]
    for m in [m for m in sys.modules if m in ("landlock", "pyseccomp") or m.startswith("landlock.")]:
        del sys.modules[m]
    code = 0
    try:
        with open(path, "rb") as f:
            source = f.read()
        glb = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
        exec(compile(source, path, "exec"), glb)
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    _flush_and_exit(code)


def _run_harness(cfg):
    sys.path[:] = _python_path(cfg)
    code = 0
    try:
        code = _HARNESS.main(cfg.get("harness_args", {}))
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    _flush_and_exit(code or 0)


def _exit_code(e):
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    try:
        print(e.code, file=sys.stderr)
    except Exception:
        pass
    return 1


def _flush_and_exit(code):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


_HARNESS = None


def _load_harness(cfg):
    """Import the grading harness (a file of this package) before the files become unreadable."""
    global _HARNESS
    if cfg.get("mode") != "harness" or _HARNESS is not None:
        return
    import importlib.util
    spec = importlib.util.spec_from_file_location("slime_sandbox_harness", cfg["harness"])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _HARNESS = mod


def _wait_program(pid):
    """Reap every child (orphans are re-parented to init) until the program itself has ended; its wait status."""
    while True:
        try:
            got, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return None
        except InterruptedError:
            continue
        if got == pid:
            return status


def _kill_user(uid):
    """As root: SIGKILL every process of `uid` (a process of that user, killing all it may signal)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        os._exit(0)
    os.waitpid(pid, 0)


def _init(cfg, status, sfilter, applied):
    """The cell's init (pid 1 in its pid namespace, when there is one)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    os.setsid()
    _init_mounts(cfg, applied)
    ruleset = _landlock(cfg)        # after the mounts: the rules hold the fresh /proc, not the machine's
    if ruleset is not None:
        applied.append("landlock")
    status.send(layers=applied)
    pid = os.fork()
    if pid == 0:
        try:
            _become_program(cfg, ruleset, sfilter)
        except BaseException as e:   # noqa: BLE001 -- nothing of the program ran; say why
            status.send(error=f"the program could not start in the sandbox: {type(e).__name__}: {e}")
        os._exit(EXIT_SETUP)
    wst = _wait_program(pid)
    if wst is None:
        status.send(error="the program's process vanished")
    elif os.WIFSIGNALED(wst):
        status.send(signal=os.WTERMSIG(wst))
    else:
        status.send(exit=os.WEXITSTATUS(wst))
    if "pid" not in cfg.get("namespaces", []):
        if cfg.get("uid") is not None:
            _kill_user(cfg["uid"])
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.killpg(0, signal.SIGKILL)      # this process group, init included (its report is sent)
    os._exit(0)


def _probe():
    """What this machine lets the jail do, one try each in a child: {layer: true | "why not"}."""
    out = {}

    def attempt(name, fn):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                fn()
                os.write(w, b"ok")
            except BaseException as e:   # noqa: BLE001
                os.write(w, f"{type(e).__name__}: {e}".encode()[:300])
            os._exit(0)
        os.close(w)
        msg = b""
        while True:
            chunk = os.read(r, 4096)
            if not chunk:
                break
            msg += chunk
        os.close(r)
        os.waitpid(pid, 0)
        out[name] = True if msg == b"ok" else (msg.decode(errors="replace") or "the try died")

    for ns in ("pid", "mount", "net", "ipc", "uts"):
        attempt(ns, lambda ns=ns: _unshare({"namespaces": [ns]}))
    attempt("user", lambda: _unshare({"namespaces": ["user", "pid", "mount", "net"]}))

    def ll():
        from landlock.plumbing import landlock_abi_version
        if landlock_abi_version() < 1:
            raise SetupError("landlock ABI < 1")
        _landlock({"landlock": {"read": ["/usr"]}}).apply()
    attempt("landlock", ll)
    attempt("seccomp", lambda: _seccomp({"seccomp": {"deny_inet": True}}))
    out["root"] = os.geteuid() == 0
    out["python"] = list(sys.version_info[:3])
    try:
        from landlock.plumbing import landlock_abi_version
        out["landlock_abi"] = landlock_abi_version()
    except Exception:   # noqa: BLE001
        out["landlock_abi"] = 0
    return out


def run_cell(cfg, status_fd, parent):
    """The jail's part for one program (in a process forked by the server, `parent`): build the cell, start its
    init, wait for it. Returns this process's exit code."""
    status = Status(status_fd)
    os.set_inheritable(status_fd, False)
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            return EXIT_SETUP          # the server (and so the runner) is already gone
        _load_harness(cfg)
        sfilter = _seccomp(cfg)
        _unshare(cfg)
    except BaseException as e:   # noqa: BLE001
        status.send(error=f"the sandbox could not be built: {type(e).__name__}: {e}")
        return EXIT_SETUP
    applied = [f"namespaces: {', '.join(cfg.get('namespaces', []))}"] if cfg.get("namespaces") else []
    if sfilter is not None:
        applied.append("seccomp")
    cfg["status_fd"] = status_fd
    pid = os.fork()
    if pid == 0:
        try:
            _init(cfg, status, sfilter, applied)
        except BaseException as e:   # noqa: BLE001
            status.send(error=f"the sandbox could not be built: {type(e).__name__}: {e}")
        os._exit(EXIT_SETUP)
    status.send(pid=pid)
    while True:
        try:
            _, wst = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    return os.WEXITSTATUS(wst) if os.WIFEXITED(wst) else EXIT_SETUP


def serve(cfg):
    """The jail server: started once per runner, its stdin a unix socket to the runner. It imports the layers'
    packages and the harness once, then for each request (a cell's config, and the program's stdin, stdout, stderr
    and a status pipe as passed fds) forks a process that runs `run_cell` in a session of its own, and answers
    that process's pid. It ends when the runner closes the socket (the runner's end); what it started then dies
    with it (PR_SET_PDEATHSIG)."""
    import socket
    sock = socket.socket(fileno=os.dup(0))
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)
    if cfg.get("landlock"):
        import landlock  # noqa: F401
        from landlock.plumbing import landlock_abi_version
        landlock_abi_version()
    if cfg.get("seccomp"):
        _seccomp({"seccomp": {"deny_inet": True}})          # loads libseccomp once
    _load_harness({"mode": "harness", "harness": cfg["harness"]})
    import select
    me = os.getpid()
    while True:
        _reap()                   # (waited for, the jails' CPU time counts in this process's children, and up)
        if not select.select([sock], [], [], 1.0)[0]:
            continue
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 8)
        except OSError:
            msg, fds = b"", []
        if not msg:
            _reap()               # the jails that have ended (one still running dies with this process)
            return 0
        pid = os.fork()
        if pid == 0:
            code = EXIT_SETUP
            try:
                sock.close()
                os.setsid()
                for target, fd in zip((0, 1, 2), fds[:3]):
                    os.dup2(fd, target)
                for fd in fds[:3]:
                    if fd > 2:
                        os.close(fd)
                code = run_cell(json.loads(msg), fds[3], me)
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        try:
            sock.send(json.dumps({"pid": pid}).encode())
        except OSError:
            return 0


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv):
    cfg = json.loads(argv[1])
    for p in cfg.get("site", []):
        sys.path.append(p)
    if cfg.get("mode") == "probe":
        print(json.dumps(_probe()))
        return 0
    if cfg.get("mode") == "reap":
        if os.geteuid() == 0 and cfg.get("uid"):
            _kill_user(int(cfg["uid"]))
        return 0
    if cfg.get("mode") == "serve":
        return serve(cfg)
    print(f"jail.py: unknown mode {cfg.get('mode')!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
