"""The retriever's key: a bearer key, made per job like the engines' keys (backends/engine_auth.py) and kept the
same way -- RUN_DIR/keys/retriever.key (0600 in a 0700 directory), handed to the job's processes as
SLIME_ACTORS_RETRIEVER_KEY. The job's replicas require it; callers send it as `Authorization: Bearer <key>`.

    key = job_retriever_key(cfg.retriever, run_dir, create=True)    # None: no retriever in this job
    env[RETRIEVER_KEY.name] = key

A retriever named by URL (--retriever-url) gets exactly what the user gave (--retriever-api-key-file, or the
environment variable), possibly nothing. It is a key of its own, not the engines' API key: that one reaches an
engine's /server_info, which shows the admin key, and a retriever started elsewhere should not hold it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from ..config import RetrieverSection
from ..env import RETRIEVER_KEY

KEY_FILE = "retriever.key"


class RetrieverKeyError(ValueError):
    """A retriever key, key file or setting that cannot be used; the message names it."""


def key_from(path: str | os.PathLike | None, environ=os.environ) -> str | None:
    """The key in `path` (refused when other users can read it), else SLIME_ACTORS_RETRIEVER_KEY, else None."""
    from ..backends.engine_auth import EngineKeyError, check_key, read_key_file
    try:
        if path:
            return read_key_file(path, "--retriever-api-key-file")
        value = environ.get(RETRIEVER_KEY.name)
        return check_key(value, RETRIEVER_KEY.name) if value else None
    except EngineKeyError as exc:
        raise RetrieverKeyError(str(exc)) from None


def job_retriever_key(r: RetrieverSection, run_dir: str | os.PathLike, create: bool) -> str | None:
    """The job's retriever key (module docstring); saved under RUN_DIR/keys when the job serves a corpus. None
    when the job has no retriever, or an external one given no key. RetrieverKeyError when a node that may not
    make it (`create` False) finds none."""
    from ..backends.engine_auth import read_key_file, write_secret
    if r.retriever_url:
        return key_from(r.retriever_api_key_file)
    if not r.retriever_corpus:
        return None
    key = key_from(None)
    path = Path(run_dir) / "keys" / KEY_FILE
    if key is None and path.exists():
        key = read_key_file(path, "retriever key file")
    if key is None:
        if not create:
            raise RetrieverKeyError(f"no retriever key: set {RETRIEVER_KEY.name} (as the head has it) or share "
                                    f"{path.parent}")
        key = secrets.token_hex(32)
    write_secret(path, key + "\n")
    return key


def key_env(key: str | None) -> dict[str, str]:
    return {RETRIEVER_KEY.name: key} if key else {}
