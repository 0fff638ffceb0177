"""CurveZMQ keys for a job, and the authenticator that refuses peers without them.

Every process of a job holds the same CURVE key pair: each mailbox is a CURVE server with it, and connects to its
peers as a CURVE client with it. A ZAP handler in each process accepts a client only if it presents the job's public
key, so a peer that lacks the job's secret key cannot complete the handshake and is refused.

Keys are created once per run (`JobKeys.create`) and reach the other processes either as files written mode 0600
under RUN_DIR/keys, or through the environment (SLIME_ACTORS_CURVE_PUBLIC / SLIME_ACTORS_CURVE_SECRET, Z85 text).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.utils.z85

from ..env import CURVE_PUBLIC, CURVE_SECRET

ENV_PUBLIC = CURVE_PUBLIC.name   # the variables are declared in slime_actors/env.py, with every other one
ENV_SECRET = CURVE_SECRET.name
ZAP_ENDPOINT = "inproc://zeromq.zap.01"


@dataclass(frozen=True)
class JobKeys:
    public: bytes  # Z85, 40 bytes
    secret: bytes

    @classmethod
    def create(cls) -> "JobKeys":
        if not zmq.has("curve"):
            raise RuntimeError("this libzmq was built without CURVE support; install pyzmq's wheel (it bundles one)")
        public, secret = zmq.curve_keypair()
        return cls(public, secret)

    def save(self, run_dir: str | os.PathLike) -> Path:
        """Write the keys under RUN_DIR/keys (directory 0700, files 0600). Returns the directory."""
        d = Path(run_dir) / "keys"
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        for name, data in (("job.public", self.public), ("job.secret", self.secret)):
            path = d / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, data + b"\n")
            finally:
                os.close(fd)
            os.chmod(path, 0o600)
        return d

    @classmethod
    def load(cls, run_dir: str | os.PathLike) -> "JobKeys":
        d = Path(run_dir) / "keys"
        try:
            public = (d / "job.public").read_bytes().strip()
            secret_path = d / "job.secret"
            mode = secret_path.stat().st_mode & 0o777
            if mode & 0o077:
                raise PermissionError(f"{secret_path} is readable by others (mode {mode:o}); it must be 0600")
            secret = secret_path.read_bytes().strip()
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"no CURVE keys for this run: {exc.filename} is missing") from None
        return cls._checked(public, secret, str(d))

    def env(self) -> dict[str, str]:
        return {ENV_PUBLIC: self.public.decode(), ENV_SECRET: self.secret.decode()}

    @classmethod
    def from_env(cls, environ=os.environ) -> "JobKeys | None":
        public, secret = environ.get(ENV_PUBLIC), environ.get(ENV_SECRET)
        if not public and not secret:
            return None
        if not public or not secret:
            raise ValueError(f"set both {ENV_PUBLIC} and {ENV_SECRET}, or neither")
        return cls._checked(public.encode(), secret.encode(), "the environment")

    @classmethod
    def _checked(cls, public: bytes, secret: bytes, where: str) -> "JobKeys":
        if len(public) != 40 or len(secret) != 40:
            raise ValueError(f"CURVE keys from {where} must be 40-character Z85 strings")
        if zmq.curve_public(secret) != public:
            raise ValueError(f"CURVE keys from {where} do not form a pair")
        return cls(public, secret)

    def apply_server(self, sock: zmq.Socket) -> None:
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_server = True
        sock.zap_domain = b"slime-actors"

    def apply_client(self, sock: zmq.Socket) -> None:
        sock.curve_serverkey = self.public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret


class Authenticator:
    """A ZAP handler thread (RFC 27) for one zmq.Context: accepts CURVE clients holding an allowed public key.

    One per context; counts refusals so tests and `_stats` can show them.
    """

    _lock = threading.Lock()
    _by_ctx: dict[int, "Authenticator"] = {}

    def __init__(self, ctx: zmq.Context, allowed: set[bytes]):
        self.ctx = ctx
        self.allowed = set(allowed)
        self.accepted = 0
        self.refused = 0
        self._sock = ctx.socket(zmq.REP)
        self._sock.linger = 0
        self._sock.bind(ZAP_ENDPOINT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slime-actors-zap", daemon=True)
        self._thread.start()

    @classmethod
    def ensure(cls, ctx: zmq.Context, public_key: bytes) -> "Authenticator":
        with cls._lock:
            auth = cls._by_ctx.get(id(ctx))
            if auth is None:
                auth = cls._by_ctx[id(ctx)] = cls(ctx, {public_key})
            else:
                auth.allowed.add(public_key)
            return auth

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                if not dict(poller.poll(100)):
                    continue
                msg = self._sock.recv_multipart()
            except zmq.ZMQError:
                return
            self._sock.send_multipart(self._answer(msg))

    def _answer(self, msg: list[bytes]) -> list[bytes]:
        # request: version, request id, domain, address, identity, mechanism, credentials...
        if len(msg) < 6:
            return [b"1.0", b"", b"400", b"malformed ZAP request", b"", b""]
        version, request_id, _domain, _address, _identity, mechanism = msg[:6]
        creds = msg[6:]
        if mechanism == b"CURVE" and creds and zmq.utils.z85.encode(creds[0]) in self.allowed:
            self.accepted += 1
            return [version, request_id, b"200", b"OK", b"", b""]
        self.refused += 1
        return [version, request_id, b"400", b"client key is not this job's key", b"", b""]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1)
        self._sock.close(0)
        with self._lock:
            self._by_ctx.pop(id(self.ctx), None)
