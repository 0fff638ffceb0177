"""Where a process finds its job: run directory, directory endpoint, transport, keys, tracing and liveness settings.

Every process of a job reads the same settings, normally from the environment its launcher set (`RuntimeConfig.env()`
writes it, `RuntimeConfig.from_env()` reads it back; each variable is described in slime_actors.env): the run
directory, the directory's endpoint, transport and addresses, CURVE, tracing (--trace, --trace-keep-arrays, --trace-max-bytes, the body
and batch limits), liveness (--heartbeat-interval, --heartbeat-liveness) and the mailbox limits (MailboxConfig).
A launcher builds its own from the job's config (`RuntimeConfig.for_job`) and hands it on with `env()`.
"""

from __future__ import annotations

import hashlib
import os
import socket
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import env as E
from .config import JobConfig, default_of
from .mailbox.mailbox import MailboxConfig
from .mailbox.security import JobKeys


@dataclass
class RuntimeConfig:
    run_dir: str = "runs/default"
    directory: str | None = None
    transport: str = default_of("transport")
    host: str = "127.0.0.1"
    advertise: str | None = None
    curve: bool | None = None  # None: use keys if the run has them
    trace: bool = default_of("trace")
    trace_body_limit: int = 65536
    trace_keep_arrays: bool = default_of("trace_keep_arrays")
    trace_batch_limit: int = 256 << 20   # bytes of batches a trainer records for replay
    trace_max_bytes: int = default_of("trace_max_bytes")  # a process's trace files at most (0: unbounded)
    heartbeat_interval: float = default_of("heartbeat_interval")
    liveness: int = default_of("heartbeat_liveness")
    static_peers: dict[str, str] = field(default_factory=dict)
    mailbox: MailboxConfig = field(default_factory=MailboxConfig)

    def __post_init__(self):
        if self.transport not in ("ipc", "tcp"):
            raise ValueError(f"transport must be ipc or tcp, got {self.transport!r}")
        if self.heartbeat_interval <= 0 or self.liveness < 1:
            raise ValueError("heartbeat interval must be > 0 and liveness >= 1")

    @classmethod
    def from_env(cls, environ=os.environ, **overrides) -> "RuntimeConfig":
        """The settings the environment gives (slime_actors.env); the defaults above for what it does not."""
        given = {attr: var.get(environ) for var, attr in _ENV.items()}
        cfg = cls(**{k: v for k, v in given.items() if v is not None}, mailbox=_mailbox_from_env(environ))
        return replace(cfg, **overrides) if overrides else cfg

    def env(self) -> dict[str, str]:
        """The environment that makes a child process see these settings (keys are passed separately)."""
        out = {E.RUN_DIR.name: str(Path(self.run_dir).resolve())}
        for var, attr in _ENV.items():
            value = getattr(self, attr)
            if attr != "run_dir" and value is not None:
                out[var.name] = ("1" if value else "0") if isinstance(value, bool) else str(value)
        default = MailboxConfig()
        for var, attr in _MAILBOX_ENV.items():
            if getattr(self.mailbox, attr) != getattr(default, attr):
                out[var.name] = str(getattr(self.mailbox, attr))
        return out

    @classmethod
    def for_job(cls, cfg: JobConfig, multi_host: bool = False, environ=os.environ) -> "RuntimeConfig":
        """A launcher's settings: the environment's (addresses, mailbox limits), then the job's flags (run directory,
        CURVE, tracing, liveness, transport -- tcp whenever the job spans hosts)."""
        rt = cls.from_env(environ)
        r = cfg.runtime
        rt.run_dir = str(Path(cfg.run.run_dir).resolve())
        rt.curve, rt.trace, rt.trace_keep_arrays = r.curve, r.trace, r.trace_keep_arrays
        rt.trace_max_bytes = r.trace_max_bytes
        rt.transport = "tcp" if multi_host and r.transport == "ipc" else r.transport
        rt.heartbeat_interval, rt.liveness = r.heartbeat_interval, r.heartbeat_liveness
        return rt

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


_ENV = {E.RUN_DIR: "run_dir", E.DIRECTORY: "directory", E.TRANSPORT: "transport", E.HOST: "host",
        E.ADVERTISE: "advertise", E.CURVE: "curve", E.TRACE: "trace", E.TRACE_BODY_LIMIT: "trace_body_limit",
        E.TRACE_KEEP_ARRAYS: "trace_keep_arrays", E.TRACE_BATCH_LIMIT: "trace_batch_limit",
        E.TRACE_MAX_BYTES: "trace_max_bytes",
        E.HEARTBEAT: "heartbeat_interval", E.LIVENESS: "liveness"}
_MAILBOX_ENV = {E.MAX_MESSAGE_BYTES: "max_message_bytes", E.SEND_HWM: "send_hwm", E.RECV_HWM: "recv_hwm",
                E.MAX_INFLIGHT: "max_inflight_asks", E.MAX_CONCURRENCY: "max_concurrency",
                E.MALLOC_KEEP_MIB: "malloc_keep_mib"}


def _mailbox_from_env(environ) -> MailboxConfig:
    cfg = MailboxConfig()
    for var, attr in _MAILBOX_ENV.items():
        v = var.get(environ)
        if v is not None:
            setattr(cfg, attr, v)
    return cfg


def job_keys(curve: bool, run_dir: str | os.PathLike, create: bool) -> JobKeys | None:
    """The job's CURVE keys (--curve): from the environment, else RUN_DIR/keys, else made here (`create`: the head
    of a new job); saved under RUN_DIR/keys. None with CURVE off. RuntimeError when another process finds none."""
    if not curve:
        return None
    run_dir = Path(run_dir)
    keys = JobKeys.from_env()
    if keys is None and not create and (run_dir / "keys" / "job.public").exists():
        keys = JobKeys.load(run_dir)
    if keys is None:
        if not create:
            raise RuntimeError(f"no CURVE keys: set {E.CURVE_PUBLIC.name}/SECRET (as the head has them) or share "
                               f"{run_dir / 'keys'}")
        keys = JobKeys.create()
    keys.save(run_dir)
    return keys
