"""slime's sandbox contract (slime/agent/sandbox.py), restated: the shape every backend here has.

A sandbox is an async context manager with an id, command execution and file read/write. Code written against
slime's `Sandbox` (its agent examples, with the E2B backend) runs on `LocalSandbox` by changing one import:

    from slime.agent.sandbox import E2BSandbox                          # slime: a cloud VM, network and an API key
    from slime_actors.sandbox import LocalSandbox as E2BSandbox         # here: this machine, offline
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

ExecResult = tuple[int, str, str]          # (exit code, stdout, stderr)
FileContent = str | bytes | Path           # a Path is a file of the host, copied in


@runtime_checkable
class Sandbox(Protocol):
    sandbox_id: str

    async def __aenter__(self) -> "Sandbox": ...

    async def __aexit__(self, exc_type, exc, tb) -> None: ...

    async def exec(self, cmd: str, *, user: str = "root", env: dict[str, str] | None = None, timeout: int = 120,
                   check: bool = False, idempotent: bool = True) -> ExecResult: ...

    async def write_file(self, sandbox_path: str, content: FileContent, *, user: str = "root") -> None: ...

    async def read_file(self, sandbox_path: str, *, user: str = "root") -> str: ...
