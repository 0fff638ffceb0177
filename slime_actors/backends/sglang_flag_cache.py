"""Flag lists SGLang's own parser has accepted, remembered so that a job started again skips importing SGLang.

    cache = FlagCheckCache.default()                 # SLIME_ACTORS_SGLANG_FLAG_CACHE, or ~/.cache/slime-actors/...
    key = cache.key(argv)                            # None: no sglang here, or the cache is off
    if key is not None and cache.accepted(key): ...  # this SGLang, these files, this exact argv: checked before
    cache.remember(key)                              # after SGLang's parser accepted argv

Checking `--sglang-*` flags with SGLang's parser means importing `sglang.srt.server_args`, which imports torch,
triton and much of SGLang: seconds on every start of a job, before any process starts (a first import on a GPU
machine, of packages not yet byte-compiled, took 21 s of a 202 s start-up: docs/peer-comparison.md). A job is
started again and again with the same flags, so the head remembers which flag lists passed. The key is a sha256 over
where `sglang` is installed, its version, the bytes of the files that build its parser (srt/server_args.py and
srt/arg_groups/*.py) and the argv itself, less the values the rollout worker writes for the model directory, the
port and the seed (any of those parses: a model copied to another directory is no new check). Another SGLang, an
edited parser or one changed flag is a new key and is checked by the parser again. Only what passed is remembered; a
refused flag is checked (and its error printed) every time. Only the head's check before any process starts uses
it: each rollout worker checks its engine's command with SGLang's parser again while the engine starts (off the path
to the first step).

The file is read as untrusted input: at most MAX_BYTES, JSON, an object whose "accepted" is a list of 64-hex-digit
strings; anything else is ignored (and rewritten on the next success). Its worst case is a flag list treated as
checked that SGLang refuses: the rollout worker's own check then fails the engine's start, naming the flag. It is
written atomically, mode 0600.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

from slime_actors.env import SGLANG_FLAG_CACHE, parse_flag
from slime_actors.log import get_logger

log = get_logger(component="sglang_flag_cache")

MAX_BYTES = 1 << 20
KEEP = 256          # the newest keys kept
_HEX64 = re.compile(r"[0-9a-f]{64}")
# Values the rollout worker writes itself (sglang_launch.OWNED_FLAGS: a user cannot pass these flags) and SGLang's
# parser accepts whatever they are -- the model directory (a str), a port and the seed (integers, when they are) --
# are left out of the key: a job whose model sits in another directory, or with another seed, is the same flag list
# to the parser. A value that is not of its kind (a port that is no integer) stays in: it is parsed again.
_ANY_VALUE = {"--model-path": re.compile(r".+", re.S), "--port": re.compile(r"-?[0-9]+"),
              "--random-seed": re.compile(r"-?[0-9]+")}


def default_path() -> Path | None:
    """The cache file: SLIME_ACTORS_SGLANG_FLAG_CACHE, or ~/.cache/slime-actors/sglang-flag-checks.json; None when
    that variable is "off" (every check imports SGLang)."""
    value = SGLANG_FLAG_CACHE.get()
    if value is None:
        return Path.home() / ".cache" / "slime-actors" / "sglang-flag-checks.json"
    if not parse_flag(value):   # off, 0, false, no
        return None
    return Path(value).expanduser()


def parser_fingerprint() -> bytes | None:
    """What SGLang's launch parser is built from, without importing it: the package's location and version and its
    parser files' bytes. None when `sglang` is not installed here."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    h = hashlib.sha256()
    h.update(f"{root.resolve()}\0{version}\0".encode())
    files = [root / "srt" / "server_args.py", *sorted((root / "srt" / "arg_groups").glob("*.py"))]
    for path in files:
        try:
            data = path.read_bytes()
        except OSError:
            data = b"<missing>"
        h.update(f"{path.relative_to(root)}\0{len(data)}\0".encode())
        h.update(data)
    return h.digest()


class FlagCheckCache:
    def __init__(self, path: Path | None):
        self.path = path

    @classmethod
    def default(cls) -> FlagCheckCache:
        return cls(default_path())

    def key(self, argv: Sequence[str]) -> str | None:
        """The key of `argv` for the SGLang installed here; None when the cache is off or there is no SGLang."""
        if self.path is None:
            return None
        fingerprint = parser_fingerprint()
        if fingerprint is None:
            return None
        h = hashlib.sha256(fingerprint)
        args = [str(a) for a in argv]
        for i, arg in enumerate(args):
            kind = _ANY_VALUE.get(args[i - 1]) if i else None
            if kind is not None and kind.fullmatch(arg):
                arg = "\0any"   # (no flag or value is that: it cannot collide)
            h.update(b"\0" + arg.encode("utf-8", "surrogatepass"))
        return h.hexdigest()

    def _read(self) -> list[str]:
        assert self.path is not None
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_BYTES + 1)
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.debug("flag-check cache unreadable", path=str(self.path), error=repr(exc))
            return []
        if len(raw) > MAX_BYTES:
            log.warning("flag-check cache ignored: larger than its limit", path=str(self.path), limit=MAX_BYTES)
            return []
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            log.warning("flag-check cache ignored: not JSON", path=str(self.path))
            return []
        keys = doc.get("accepted") if isinstance(doc, dict) else None
        if not isinstance(keys, list):
            log.warning("flag-check cache ignored: no list 'accepted'", path=str(self.path))
            return []
        return [k for k in keys if isinstance(k, str) and _HEX64.fullmatch(k)]

    def accepted(self, key: str | None) -> bool:
        return key is not None and self.path is not None and key in self._read()

    def remember(self, key: str | None) -> None:
        """Add `key` (argv accepted by SGLang's parser); a cache that cannot be written is only logged."""
        if key is None or self.path is None:
            return
        keys = [k for k in self._read() if k != key][-(KEEP - 1):] + [key]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(prefix=".sglang-flags-", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w") as f:   # mkstemp: mode 0600
                    json.dump({"accepted": keys}, f)
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as exc:
            log.warning("flag-check cache not written", path=str(self.path), error=repr(exc))
