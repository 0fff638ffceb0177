"""Where a process finds its job: run directory, directory endpoint, transport, keys, tracing and liveness settings.

Every process of a job reads the same settings, normally from the environment its launcher set:

    SLIME_ACTORS_RUN_DIR        run directory (traces/, logs/, keys/, sockets/)         default: ./runs/default
    SLIME_ACTORS_DIRECTORY      endpoint of the directory actor (directory/0)            default: none
    SLIME_ACTORS_TRANSPORT      ipc (one host) or tcp (several hosts)                    default: ipc
    SLIME_ACTORS_HOST           address to bind for tcp                                  default: 127.0.0.1
    SLIME_ACTORS_ADVERTISE      address peers use to reach this host (tcp)               default: the bind address
    SLIME_ACTORS_CURVE          1 to require the job's CURVE keys (keys/ or the env)     default: 1 if keys exist
    SLIME_ACTORS_TRACE          0 to turn tracing off                                    default: 1
    SLIME_ACTORS_TRACE_BODY_LIMIT  bodies larger than this are recorded by size and hash default: 65536
    SLIME_ACTORS_TRACE_KEEP_ARRAYS 1 to record array bytes too                          default: 0
    SLIME_ACTORS_HEARTBEAT      heartbeat interval in seconds                            default: 1.0
    SLIME_ACTORS_LIVENESS       missed heartbeats before a peer is declared down         default: 5
    SLIME_ACTORS_MAX_MESSAGE_BYTES, SLIME_ACTORS_SEND_HWM, SLIME_ACTORS_RECV_HWM,
    SLIME_ACTORS_MAX_INFLIGHT, SLIME_ACTORS_MAX_CONCURRENCY   mailbox limits (MailboxConfig)
    SLIME_ACTORS_MALLOC_KEEP_MIB   freed MiB glibc keeps for large messages (0: untouched)  default: 256
"""

from __future__ import annotations

import hashlib
import os
import socket
import tempfile
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from .mailbox.mailbox import MailboxConfig
from .mailbox.security import JobKeys


def _flag(v: str | None, default: bool) -> bool:
    if v is None or v == "":
        return default
    return v.strip().lower() not in ("0", "false", "no", "off")


@dataclass
class RuntimeConfig:
    run_dir: str = "runs/default"
    directory: str | None = None
    transport: str = "ipc"
    host: str = "127.0.0.1"
    advertise: str | None = None
    curve: bool | None = None  # None: use keys if the run has them
    trace: bool = True
    trace_body_limit: int = 65536
    trace_keep_arrays: bool = False
    heartbeat_interval: float = 1.0
    liveness: int = 5
    static_peers: dict[str, str] = field(default_factory=dict)
    mailbox: MailboxConfig = field(default_factory=MailboxConfig)

    def __post_init__(self):
        if self.transport not in ("ipc", "tcp"):
            raise ValueError(f"transport must be ipc or tcp, got {self.transport!r}")
        if self.heartbeat_interval <= 0 or self.liveness < 1:
            raise ValueError("heartbeat interval must be > 0 and liveness >= 1")

    @classmethod
    def from_env(cls, environ=os.environ, **overrides) -> "RuntimeConfig":
        e = environ.get
        cfg = cls(
            run_dir=e("SLIME_ACTORS_RUN_DIR", "runs/default"),
            directory=e("SLIME_ACTORS_DIRECTORY") or None,
            transport=e("SLIME_ACTORS_TRANSPORT", "ipc"),
            host=e("SLIME_ACTORS_HOST", "127.0.0.1"),
            advertise=e("SLIME_ACTORS_ADVERTISE") or None,
            curve=None if e("SLIME_ACTORS_CURVE") in (None, "") else _flag(e("SLIME_ACTORS_CURVE"), True),
            trace=_flag(e("SLIME_ACTORS_TRACE"), True),
            trace_body_limit=int(e("SLIME_ACTORS_TRACE_BODY_LIMIT", "65536")),
            trace_keep_arrays=_flag(e("SLIME_ACTORS_TRACE_KEEP_ARRAYS"), False),
            heartbeat_interval=float(e("SLIME_ACTORS_HEARTBEAT", "1.0")),
            liveness=int(e("SLIME_ACTORS_LIVENESS", "5")),
            mailbox=_mailbox_from_env(environ),
        )
        return replace(cfg, **overrides) if overrides else cfg

    def env(self) -> dict[str, str]:
        """The environment that makes a child process see these settings (keys are passed separately)."""
        out = {"SLIME_ACTORS_RUN_DIR": str(Path(self.run_dir).resolve()), "SLIME_ACTORS_TRANSPORT": self.transport,
               "SLIME_ACTORS_HOST": self.host, "SLIME_ACTORS_TRACE": "1" if self.trace else "0",
               "SLIME_ACTORS_TRACE_BODY_LIMIT": str(self.trace_body_limit),
               "SLIME_ACTORS_TRACE_KEEP_ARRAYS": "1" if self.trace_keep_arrays else "0",
               "SLIME_ACTORS_HEARTBEAT": str(self.heartbeat_interval), "SLIME_ACTORS_LIVENESS": str(self.liveness)}
        if self.directory:
            out["SLIME_ACTORS_DIRECTORY"] = self.directory
        if self.advertise:
            out["SLIME_ACTORS_ADVERTISE"] = self.advertise
        if self.curve is not None:
            out["SLIME_ACTORS_CURVE"] = "1" if self.curve else "0"
        default = MailboxConfig()
        for env_name, attr in _MAILBOX_ENV.items():
            if getattr(self.mailbox, attr) != getattr(default, attr):
                out[env_name] = str(getattr(self.mailbox, attr))
        return out

    @property
    def down_after(self) -> float:
        return self.heartbeat_interval * self.liveness

    def keys(self) -> JobKeys | None:
        """The job's CURVE keys (environment first, then RUN_DIR/keys), or None when CURVE is off."""
        if self.curve is False:
            return None
        keys = JobKeys.from_env()
        if keys is None and (Path(self.run_dir) / "keys" / "job.public").exists():
            keys = JobKeys.load(self.run_dir)
        if keys is None and self.curve:
            raise FileNotFoundError(f"CURVE is required but there are no keys in the environment or in "
                                    f"{Path(self.run_dir) / 'keys'}")
        return keys

    def bind_endpoint(self, name: str) -> str:
        if self.transport == "tcp":
            return f"tcp://{self.host}:0"
        d = Path(self.run_dir).resolve() / "sockets"
        path = d / f"{name.replace('/', '-')}.{os.getpid()}.sock"
        if len(str(path)) > 100:  # AF_UNIX paths are limited to 107 bytes
            tag = hashlib.sha1(str(d).encode()).hexdigest()[:12]
            d = Path(tempfile.gettempdir()) / f"slime-actors-{os.getuid()}" / tag
            path = d / f"{name.replace('/', '-')}.{os.getpid()}.sock"
        d.mkdir(parents=True, exist_ok=True)
        return f"ipc://{path}"

    def node_address(self) -> str:
        """This node's address as other hosts reach it: SLIME_ACTORS_ADVERTISE, else SLIME_ACTORS_HOST unless that is
        a wildcard, else the address of the host name."""
        if self.advertise:
            return self.advertise
        if self.host not in ("0.0.0.0", "*", "[::]", "::", ""):
            return self.host
        return socket.gethostbyname(socket.gethostname())

    def public_endpoint(self, bound: str) -> str:
        """What peers should connect to, given what the ROUTER bound (0.0.0.0 becomes the advertised address)."""
        if not bound.startswith("tcp://"):
            return bound
        hostport = bound[len("tcp://"):]
        host, _, port = hostport.rpartition(":")
        if self.advertise:
            host = self.advertise
        elif host in ("0.0.0.0", "*", "[::]"):
            host = socket.gethostbyname(socket.gethostname())
        return f"tcp://{host}:{port}"


_MAILBOX_ENV = {"SLIME_ACTORS_MAX_MESSAGE_BYTES": "max_message_bytes", "SLIME_ACTORS_SEND_HWM": "send_hwm",
                "SLIME_ACTORS_RECV_HWM": "recv_hwm", "SLIME_ACTORS_MAX_INFLIGHT": "max_inflight_asks",
                "SLIME_ACTORS_MAX_CONCURRENCY": "max_concurrency", "SLIME_ACTORS_MALLOC_KEEP_MIB": "malloc_keep_mib"}


def _mailbox_from_env(environ) -> MailboxConfig:
    cfg = MailboxConfig()
    for env_name, attr in _MAILBOX_ENV.items():
        v = environ.get(env_name)
        if v:
            try:
                setattr(cfg, attr, int(v))
            except ValueError:
                raise ValueError(f"{env_name} must be an integer, got {v!r}") from None
    return cfg


def runtime_field_names() -> list[str]:
    return [f.name for f in fields(RuntimeConfig)]
