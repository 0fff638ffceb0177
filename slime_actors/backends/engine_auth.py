"""The engines' HTTP keys: an API key (generation, model and server info) and an admin key (weight updates,
pause / continue, abort, cache flush), made per job next to its CURVE keys, and the rule that says which request
needs which -- SGLang 0.5.15.post1's (recorded from its source in tests/data/sglang_auth_0.5.15.post1.json).

    keys = EngineKeys.create()                    # two random 256-bit keys
    keys.save(run_dir)                            # RUN_DIR/keys/engine.api_key, engine.admin_key (0600, dir 0700)
    env.update(keys.env())                        # how child processes get them (SLIME_ACTORS_ENGINE_*)
    keys = EngineKeys.from_env() or EngineKeys.load(run_dir)
    keys.headers_for("/update_weights_from_disk") # {"Authorization": "Bearer <admin key>"}
    keys.write_engine_config(path)                # the engine's --config file (YAML, 0600): its keys off the
                                                  # command line, which every user of the host can read

SGLang's rule (python/sglang/srt/utils/auth.py `decide_request_auth`, the `@auth_level` marks of
entrypoints/http_server.py): paths starting with /health or /metrics, and OPTIONS requests, are always open. An
"admin" endpoint (ADMIN_OPTIONAL there) takes the admin key when the server has one -- and then *not* the API key
--, else the API key when it has one, else anything. Every other endpoint takes the API key when the server has
one (the admin key is not accepted there), else anything: a server with only an admin key serves /generate to
anyone. Refusals are 401 {"error": "Unauthorized"}. The header is `Authorization: Bearer <key>`.

Two SGLang facts shape what the job does: /server_info answers every launch argument, the keys included, to any
holder of the API key (so the API key is as good as the admin key to whoever holds it, and a server without an API
key shows its admin key to anyone); and with --tokenizer-worker-num > 1 SGLang checks no key at all. The job
therefore always sets both keys, refuses --sglang-tokenizer-worker-num > 1 while keys are on, and strips those
fields from what the client returns (they would otherwise land in traces).
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from ..config import EngineSection
from ..env import ENGINE_ADMIN_KEY, ENGINE_API_KEY
from ..json_files import not_regular

ENV_API_KEY = ENGINE_API_KEY.name
ENV_ADMIN_KEY = ENGINE_ADMIN_KEY.name
API_KEY_FILE = "engine.api_key"
ADMIN_KEY_FILE = "engine.admin_key"
REDACTED = "<redacted>"

# SGLang's ADMIN_OPTIONAL endpoints among those the local engine serves and the client calls (the contract test holds
# this to the recorded @auth_level marks). Every other path is a normal one (the API key).
ADMIN_PATHS = frozenset({
    "/flush_cache", "/abort_request", "/pause_generation", "/continue_generation", "/update_weights_from_disk",
    "/init_weights_update_group", "/update_weights_from_distributed", "/destroy_weights_update_group",
    "/update_weights_from_tensor", "/update_weights_from_ipc", "/update_weight_version", "/load_lora_adapter",
    "/unload_lora_adapter", "/start_profile", "/stop_profile",
})
OPEN_PREFIXES = ("/health", "/metrics")
# /server_info fields that hold secrets (SGLang returns its ServerArgs there, in clear)
SECRET_SERVER_INFO_FIELDS = ("api_key", "admin_api_key", "ssl_keyfile_password")
_MAX_KEY = 4096


class EngineKeyError(ValueError):
    """A key, key file or key setting that cannot be used; the message names it."""


def is_admin_path(path: str) -> bool:
    return path.split("?", 1)[0] in ADMIN_PATHS


def bearer_matches(header: str | None, key: str) -> bool:
    """`Authorization: Bearer <key>`: the scheme in any case, one space, then the key (compared in constant time)."""
    if not header:
        return False
    scheme, sep, token = header.partition(" ")
    return bool(sep) and scheme.lower() == "bearer" and secrets.compare_digest(token.encode(), key.encode())


def refusal_status(method: str, path: str, authorization: str | None, api_key: str | None,
                   admin_key: str | None) -> int | None:
    """None when SGLang 0.5.15.post1 lets this request through to its handler, else the status it refuses it with
    (401). `path` is the request path (no query string)."""
    if method.upper() == "OPTIONS" or path.startswith(OPEN_PREFIXES):
        return None
    if path in ADMIN_PATHS and (admin_key or api_key):
        return None if bearer_matches(authorization, admin_key or api_key) else 401
    if path not in ADMIN_PATHS and api_key:
        return None if bearer_matches(authorization, api_key) else 401
    return None


def check_key(value: str, what: str) -> str:
    """A usable key: 1..4096 printable ASCII characters, no spaces (it travels in an HTTP header and a YAML file)."""
    if not isinstance(value, str) or not value:
        raise EngineKeyError(f"{what} is empty")
    if len(value) > _MAX_KEY:
        raise EngineKeyError(f"{what} is longer than {_MAX_KEY} characters")
    bad = next((c for c in value if not (33 <= ord(c) <= 126)), None)
    if bad is not None:
        raise EngineKeyError(f"{what} holds {bad!r}: a key is printable ASCII without spaces")
    return value


def _write_secret(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.chmod(path, 0o600)


write_secret = _write_secret   # (the retriever's key is kept the same way: slime_actors/search/keys.py)


MAX_KEY_FILE_BYTES = 64 << 10   # a key file holds one key (and perhaps a newline)


def read_key_file(path: str | os.PathLike, what: str) -> str:
    """The key in a file (its first line), refusing a file that other users can read, one that is not a regular
    file (a FIFO would block the read, /dev/zero never end), or one of more than MAX_KEY_FILE_BYTES."""
    p = Path(path)
    kind = not_regular(p)
    if kind == "no such file":
        raise EngineKeyError(f"{what} {p}: no such file")
    if kind is not None:
        raise EngineKeyError(f"{what} {p} is {kind}, not a key file")
    try:
        mode = p.stat().st_mode & 0o777
        if mode & 0o077:
            raise EngineKeyError(f"{what} {p} can be read by other users (mode {mode:o}); chmod 600 it")
        with open(p, "rb") as f:
            data = f.read(MAX_KEY_FILE_BYTES + 1)
        if len(data) > MAX_KEY_FILE_BYTES:
            raise EngineKeyError(f"{what} {p} holds more than {MAX_KEY_FILE_BYTES:,} bytes; a key file holds one key")
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise EngineKeyError(f"{what} {p}: no such file") from None
    except (PermissionError, UnicodeDecodeError) as exc:
        raise EngineKeyError(f"{what} {p}: cannot read it ({type(exc).__name__})") from None
    lines = text.strip().splitlines()
    return check_key(lines[0].strip() if lines else "", f"the key in {what} {p}")


@dataclass(frozen=True, repr=False)
class EngineKeys:
    api_key: str | None = None
    admin_key: str | None = None

    def __repr__(self) -> str:  # never the keys themselves (a repr ends up in logs and tracebacks)
        return (f"EngineKeys(api_key={'<set>' if self.api_key else None}, "
                f"admin_key={'<set>' if self.admin_key else None})")

    __str__ = __repr__

    @classmethod
    def create(cls) -> "EngineKeys":
        return cls(secrets.token_hex(32), secrets.token_hex(32))

    @property
    def any(self) -> bool:
        return bool(self.api_key or self.admin_key)

    @property
    def complete(self) -> bool:
        return bool(self.api_key and self.admin_key)

    def fill(self, other: "EngineKeys | None") -> "EngineKeys":
        """These keys, with the ones missing taken from `other`."""
        if other is None:
            return self
        return EngineKeys(self.api_key or other.api_key, self.admin_key or other.admin_key)

    # -- where they live ----------------------------------------------------------------------------------------
    def save(self, run_dir: str | os.PathLike) -> Path:
        """RUN_DIR/keys/engine.api_key and engine.admin_key (files 0600 in a 0700 directory, like the CURVE keys);
        a key that is not set has no file."""
        d = Path(run_dir) / "keys"
        for name, value in ((API_KEY_FILE, self.api_key), (ADMIN_KEY_FILE, self.admin_key)):
            if value:
                _write_secret(d / name, value + "\n")
            else:
                (d / name).unlink(missing_ok=True)
        return d

    @classmethod
    def load(cls, run_dir: str | os.PathLike) -> "EngineKeys | None":
        d = Path(run_dir) / "keys"
        found = {}
        for name in (API_KEY_FILE, ADMIN_KEY_FILE):
            if (d / name).exists():
                found[name] = read_key_file(d / name, "engine key file")
        if not found:
            return None
        return cls(found.get(API_KEY_FILE), found.get(ADMIN_KEY_FILE))

    def env(self) -> dict[str, str]:
        out = {}
        if self.api_key:
            out[ENV_API_KEY] = self.api_key
        if self.admin_key:
            out[ENV_ADMIN_KEY] = self.admin_key
        return out

    @classmethod
    def from_env(cls, environ=os.environ) -> "EngineKeys | None":
        api, admin = environ.get(ENV_API_KEY) or None, environ.get(ENV_ADMIN_KEY) or None
        if api is None and admin is None:
            return None
        return cls(check_key(api, ENV_API_KEY) if api else None, check_key(admin, ENV_ADMIN_KEY) if admin else None)

    # -- use ----------------------------------------------------------------------------------------------------
    def key_for(self, path: str) -> str | None:
        """The key a request to `path` carries: the admin key on admin endpoints (the API key when there is no
        admin key: SGLang then takes it there), the API key elsewhere."""
        if is_admin_path(path):
            return self.admin_key or self.api_key
        return self.api_key

    def headers_for(self, path: str) -> dict[str, str]:
        key = self.key_for(path)
        return {"Authorization": f"Bearer {key}"} if key else {}

    @property
    def secrets(self) -> list[str]:
        return [k for k in (self.api_key, self.admin_key) if k]

    def redact(self, text: str) -> str:
        for k in self.secrets:
            if k in text:
                text = text.replace(k, REDACTED)
        return text

    def write_engine_config(self, path: str | os.PathLike) -> Path:
        """The engine's `--config` file: `api-key` / `admin-api-key` in YAML (JSON strings, which YAML reads as
        quoted scalars), mode 0600. SGLang reads it in prepare_server_args; the local engine the same way."""
        lines = ["# engine keys of one slime-actors job (see docs/security.md); readable by the job's user only"]
        if self.api_key:
            lines.append(f"api-key: {json.dumps(self.api_key)}")
        if self.admin_key:
            lines.append(f"admin-api-key: {json.dumps(self.admin_key)}")
        p = Path(path)
        _write_secret(p, "\n".join(lines) + "\n")
        return p


def redact_server_info(info: dict) -> dict:
    """/server_info without the secrets SGLang puts there: each such field becomes True / False (set or not)."""
    if not isinstance(info, dict):
        return info
    out = dict(info)
    for f in SECRET_SERVER_INFO_FIELDS:
        if f in out:
            out[f] = bool(out[f])
    return out


# -- the job's keys -------------------------------------------------------------------------------------------------

def take_user_keys(engine: EngineSection) -> EngineKeys | None:
    """The keys the user gave in the job's flags (--engine-api-key / --engine-admin-api-key, or their -file forms),
    checked; the literal values are then removed from the config's engine section, so they reach neither job.json
    nor the actors' recorded configuration (traces). Raises EngineKeyError naming the flag."""
    found = {}
    for name, literal, path, flag in (
            ("api_key", engine.engine_api_key, engine.engine_api_key_file, "--engine-api-key"),
            ("admin_key", engine.engine_admin_api_key, engine.engine_admin_api_key_file, "--engine-admin-api-key")):
        if literal and path:
            raise EngineKeyError(f"give {flag} or {flag}-file, not both")
        if literal:
            found[name] = check_key(str(literal), flag)
        elif path:
            found[name] = read_key_file(path, f"{flag}-file")
    engine.engine_api_key = None
    engine.engine_admin_api_key = None
    if not found:
        return None
    return EngineKeys(found.get("api_key"), found.get("admin_key"))


def job_engine_keys(engine: EngineSection, run_dir: str | os.PathLike, create: bool,
                    user: EngineKeys | None = None) -> EngineKeys | None:
    """The engine keys of this job, saved under RUN_DIR/keys; None when there are none (--engine-auth false, or
    external engines given no keys). The user's flags win, then SLIME_ACTORS_ENGINE_* from the environment (how the
    head hands them to its processes, and how Slurm steps share them). Engines the job starts always get both
    keys: what is missing is read from RUN_DIR/keys (another node, a restarted head) or, where `create`, made
    here. External engines (--rollout-external-engine-addrs) get exactly what the user gave."""
    if not engine.engine_auth:
        return None
    keys = (user or EngineKeys()).fill(EngineKeys.from_env())
    if engine.rollout_external_engine_addrs:
        if not keys.any:
            return None
    elif not keys.complete:
        if not create:
            keys = keys.fill(EngineKeys.load(run_dir))
        if not keys.complete:
            if not create:
                raise EngineKeyError(f"no engine keys: set {ENV_API_KEY} and {ENV_ADMIN_KEY} (as the head has them) "
                                     f"or share {Path(run_dir) / 'keys'}")
            keys = keys.fill(EngineKeys.create())
    keys.save(run_dir)
    return keys


def startup_warnings(engine: EngineSection, keys: EngineKeys | None) -> list[str]:
    """What the head tells the user about the engines' HTTP plane before the job starts."""
    out = []
    external = engine.rollout_external_engine_addrs
    if not engine.engine_auth:
        out.append("engine keys are off (--engine-auth false): anyone who can reach an engine's port can generate, "
                   "pause or abort it and replace its weights")
    elif external and keys is None:
        out.append("--rollout-external-engine-addrs: no engine keys given (--engine-api-key-file / "
                   f"--engine-admin-api-key-file, or {ENV_API_KEY} / {ENV_ADMIN_KEY}); requests go without "
                   "Authorization -- an engine that needs none can be driven by anyone who reaches it")
    elif external and not keys.admin_key:
        out.append("--rollout-external-engine-addrs: no admin key given; weight updates, pauses and aborts carry the "
                   "API key (SGLang takes it there only when it was started without --admin-api-key)")
    return out


def engine_warnings(url: str, server_info: dict) -> list[str]:
    """What an engine's (redacted) /server_info says about its keys, as warnings for the user."""
    if not isinstance(server_info, dict) or "api_key" not in server_info:
        return []
    out = []
    if not server_info.get("api_key"):
        where = "" if _loopback(url) else " from other hosts"
        msg = f"engine {url} runs without an API key: anyone who can reach it{where} can generate"
        if not server_info.get("admin_api_key"):
            msg += ", pause or abort it, or replace its weights"
        else:
            msg += ", and its /server_info shows its admin key to anyone"
        out.append(msg)
    elif not server_info.get("admin_api_key"):
        out.append(f"engine {url} has no admin key: its API key also unlocks weight updates, pauses and aborts")
    return out


def _loopback(url: str) -> bool:
    from urllib.parse import urlsplit
    host = urlsplit(url if "://" in url else f"http://{url}").hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")
