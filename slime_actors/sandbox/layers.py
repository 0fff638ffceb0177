"""Which of the sandbox's layers this machine supports, and which a run uses (docs/code-sandbox.md, "Layers").

    caps = probe("/usr/bin/python3")          # asks the machine once per process: {"pid": True, "net": "...", ...}
    plan = make_plan(Policy(), caps)          # the layers a run gets; SandboxUnavailable if the network stays open
    plan.namespaces, plan.uid_slots, plan.landlock, plan.seccomp, plan.missing

Every layer the machine lacks is logged once per process, in one line saying what is lost and what stands in for it.
The only missing layer that stops a run is the network: where neither a network namespace nor seccomp can cut it,
the sandbox refuses to run programs unless `Policy.allow_network` (--sandbox-allow-network) says so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..log import get_logger

JAIL = str(Path(__file__).with_name("jail.py"))
NAMESPACES = ("pid", "mount", "net", "ipc", "uts")
READ_ONLY = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc")
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run programs here with the guarantees asked for; the message says what is missing and
    how to proceed."""


@dataclass(frozen=True)
class Policy:
    """What a sandbox asks of the machine. Each layer is used where the machine has it (`True`), or not at all."""
    allow_network: bool = False      # run even where nothing can cut the network (else: SandboxUnavailable)
    namespaces: bool = True          # pid, mount, network, ipc and uts namespaces (a user namespace when not root)
    separate_user: bool = True       # as root: each program runs as a user of its own (a uid slot), never as root
    landlock: bool = True            # file access: system directories read-only, the working directory, nothing else
    seccomp: bool = True             # refuse ptrace, mount, unshare, bpf, keyctl, ... (and inet sockets, see above)
    python: str | None = None        # the interpreter of the jail and of Python programs (default: default_python())
    extra_read: tuple[str, ...] = ()  # more paths programs may read (landlock); e.g. a data directory


@dataclass
class Plan:
    """The layers one sandbox uses (a run's config for jail.py is built from it)."""
    python: str
    namespaces: list[str]
    uid_slots: bool
    landlock: dict | None
    seccomp: dict | None
    network: str                       # "namespace", "seccomp" or "open"
    site: list[str]
    missing: list[str] = field(default_factory=list)

    def describe(self) -> list[str]:
        out = ["own session and process group", "rlimits", "wall-clock timeout", "scrubbed environment",
               "throwaway working directory", "output cap"]
        if self.namespaces:
            out.append("namespaces: " + ", ".join(self.namespaces))
        if self.uid_slots:
            out.append("a user of its own (uid slot)")
        if self.landlock:
            out.append("landlock")
        if self.seccomp:
            out.append("seccomp")
        out.append(f"network: {'cut by ' + self.network if self.network != 'open' else 'OPEN'}")
        return out


def default_python() -> str:
    """The system's Python 3 (programs must not need this project's virtual environment), else this interpreter."""
    for p in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(p, os.X_OK):
            return p
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def layer_site_dirs() -> dict[str, str | None]:
    """Where the optional layers' packages (landlock, pyseccomp) are installed: the jail adds these to its path."""
    out: dict[str, str | None] = {}
    for mod in ("landlock", "pyseccomp"):
        spec = importlib.util.find_spec(mod)
        if spec is None or not spec.origin:
            out[mod] = None
        else:
            origin = Path(spec.origin)
            out[mod] = str(origin.parent.parent if origin.name == "__init__.py" else origin.parent)
    return out


_probe_lock = threading.Lock()
_probes: dict[str, dict] = {}


def probe(python: str | None = None) -> dict:
    """What the machine lets the jail do (asked once per interpreter and process): each of the namespaces, a user
    namespace, landlock and seccomp -> True, or the reason it failed; "root": bool; "landlock_abi": int."""
    python = python or default_python()
    with _probe_lock:
        if python in _probes:
            return _probes[python]
        site = sorted({d for d in layer_site_dirs().values() if d})
        cfg = {"mode": "probe", "site": site}
        try:
            out = subprocess.run([python, "-I", "-S", JAIL, json.dumps(cfg)], capture_output=True, timeout=60,
                                 env={"PATH": "/usr/bin:/bin"}, check=False)
            caps = json.loads(out.stdout.decode() or "{}")
            if not caps:
                raise ValueError(out.stderr.decode(errors="replace")[-500:] or f"exit code {out.returncode}")
        except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailable(f"the sandbox's jail does not start with {python}: {exc}") from None
        mods = layer_site_dirs()
        if mods["landlock"] is None:
            caps["landlock"] = "the landlock package is not installed (pip install landlock)"
        if mods["pyseccomp"] is None:
            caps["seccomp"] = "the pyseccomp package is not installed (pip install pyseccomp)"
        _probes[python] = caps
        return caps


_logged: set[str] = set()


def _log_missing(lines: list[str]) -> None:
    log = get_logger(component="sandbox")
    for line in lines:
        if line not in _logged:
            _logged.add(line)
            log.warning(line)


def reachable_by_others(path: str) -> bool:
    """Whether a user other than the owner can reach and run `path` (every directory on the way searchable)."""
    p = Path(os.path.realpath(path))
    for d in [*reversed(p.parents)]:
        try:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    try:
        return bool(os.stat(p).st_mode & stat.S_IXOTH)
    except OSError:
        return False


def python_prefix(python: str) -> str:
    """The installation a Python interpreter reads its standard library from (e.g. /usr)."""
    return str(Path(os.path.realpath(python)).parent.parent)


def make_plan(policy: Policy, caps: dict | None = None) -> Plan:
    """The layers a sandbox with `policy` gets on this machine; logs (once) each layer that is missing and raises
    SandboxUnavailable where the network cannot be cut and `policy.allow_network` is off."""
    python = policy.python or default_python()
    if not os.access(python, os.X_OK):
        raise SandboxUnavailable(f"the sandbox's Python {python} is not an executable (--sandbox-python)")
    caps = caps if caps is not None else probe(python)
    missing: list[str] = []
    root = bool(caps.get("root"))
    ns: list[str] = []
    if policy.namespaces:
        if root:
            ns = [n for n in NAMESPACES if caps.get(n) is True]
            lost = [n for n in NAMESPACES if caps.get(n) is not True]
            if lost:
                missing.append(f"sandbox: no {', '.join(lost)} namespace here ({caps.get(lost[0])}); "
                               + _ns_consequence(lost))
        elif caps.get("user") is True:
            ns = ["user", *NAMESPACES]
        else:
            missing.append(f"sandbox: no user namespace for a user without root here ({caps.get('user')}): no pid, "
                           "mount or network namespace; " + _ns_consequence(list(NAMESPACES)))
    uid_slots = root and policy.separate_user
    if root and not policy.separate_user:
        missing.append("sandbox: programs run as root (Policy.separate_user is off): only landlock keeps them from "
                       "the run directory, keys and home")
    if uid_slots and not reachable_by_others(python):
        raise SandboxUnavailable(
            f"the sandbox's Python {python} cannot be run by the sandbox's user (a directory on its path is closed "
            "to others, e.g. a home directory): set --sandbox-python to one outside it, such as /usr/bin/python3")
    landlock = None
    if policy.landlock and caps.get("landlock") is True:
        landlock = {"read": [*READ_ONLY, python_prefix(python), *policy.extra_read], "dev": list(DEVICES)}
    elif policy.landlock:
        missing.append(f"sandbox: no landlock here ({caps.get('landlock')}): files are kept from programs by "
                       + ("hiding the run directory, the home and the working directory of this process under "
                          "empty mounts, and " if "mount" in ns else "")
                       + ("a user of their own (files of mode 0600/0700 only)" if uid_slots
                          else "nothing else: programs can read what this user can"))
    seccomp = None
    if policy.seccomp and caps.get("seccomp") is True:
        seccomp = {"deny_inet": not policy.allow_network}
    elif policy.seccomp:
        missing.append(f"sandbox: no seccomp filter here ({caps.get('seccomp')}): ptrace, mount, bpf and other "
                       "system calls are limited only by the program's user and namespaces")
    if "net" in ns:
        network = "namespace"
    elif seccomp is not None and not policy.allow_network:
        network = "seccomp"
        missing.append("sandbox: no network namespace here; the network is cut by seccomp (inet sockets refused)")
    elif policy.allow_network:
        network = "open"
        missing.append("sandbox: programs can reach the network (--sandbox-allow-network)")
    else:
        raise SandboxUnavailable(
            "the sandbox cannot cut the network here: no network namespace "
            f"({caps.get('net') if root else caps.get('user')}) and no seccomp filter ({caps.get('seccomp')}). "
            "Install pyseccomp (and libseccomp), run where namespaces are allowed, or pass --sandbox-allow-network "
            "to run programs with network access")
    site = sorted({d for d in layer_site_dirs().values() if d})
    _log_missing(missing)
    return Plan(python=python, namespaces=ns, uid_slots=uid_slots, landlock=landlock, seccomp=seccomp,
                network=network, site=site, missing=missing)


def _ns_consequence(lost: list[str]) -> str:
    parts = []
    if "pid" in lost:
        parts.append("a daemon that leaves the program's session outlives it unless the sandbox runs as root "
                     "(then every process of the program's user is killed)")
    if "net" in lost:
        parts.append("the network is cut by seccomp instead, where there is seccomp")
    if "mount" in lost:
        parts.append("no fresh /proc (programs see this machine's process list)")
    return "; ".join(parts) or "nothing else is lost"

