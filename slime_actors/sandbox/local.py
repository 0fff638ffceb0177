"""LocalSandbox: slime's Sandbox protocol (protocol.py) on this machine, offline, every command in a fresh cell.

    async with LocalSandbox() as sb:                      # a working directory of its own, and a user of its own
        await sb.write_file("main.py", "print(sum(range(10)))")
        code, out, err = await sb.exec("python3 main.py", timeout=10)      # (0, "45\\n", "")
        text = await sb.read_file("main.py")

How it differs from slime's E2BSandbox (a cloud VM):
- Files live in the sandbox's working directory (`sb.workdir`): a relative path is taken inside it, an absolute
  one must lie inside it. The rest of the machine is visible read-only where the layers allow (system
  directories), or not at all (the run directory, keys, homes).
- Each `exec` runs `/bin/sh -c CMD` in a cell of its own (runner.py): nothing it starts outlives it, so slime's
  `exec_and_wait` (detach a command, poll for its marker file) does not apply -- give `exec` the long timeout.
- `user` is accepted and not used: every command runs as the sandbox's own unprivileged user, never as root.
- `image` is accepted and not used (there are no images: programs use this machine's system).
- A command that runs past its timeout returns exit code 124; one killed by signal N returns 128 + N.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace
from pathlib import Path

from ..log import get_logger
from .layers import Policy
from .protocol import ExecResult, FileContent
from .runner import Limits, Runner, SandboxError, read_in, remove_tree, write_in

__all__ = ["LocalSandbox", "default_runner"]

TIMEOUT_EXIT = 124
_default: Runner | None = None


def default_runner() -> Runner:
    """The runner LocalSandboxes share in this process (the default layers and limits; 1 GiB per process)."""
    global _default
    if _default is None:
        _default = Runner(Policy(), Limits(timeout=120))
    return _default


class LocalSandbox:
    """slime's `Sandbox` on this machine (module docstring). `timeout` is the sandbox's lifetime in seconds, as in
    slime (default 3600): an exec after it is refused, one running at it is cut short."""

    def __init__(self, image: str | None = None, *, timeout: int | None = None, runner: Runner | None = None,
                 limits: Limits | None = None):
        self.image = image
        self.lifetime = float(timeout if timeout is not None else 3600)
        self.runner = runner
        self.limits = limits
        self.sandbox_id = ""
        self.workdir = ""
        self._uid_ctx = None
        self.uid: int | None = None
        self._until = 0.0

    async def __aenter__(self) -> "LocalSandbox":
        self.runner = self.runner or default_runner()
        runner = self.runner
        await asyncio.to_thread(lambda: runner.plan)       # probes the machine once (SandboxUnavailable)
        if self.image:
            get_logger(component="sandbox").info("a local sandbox has no images: this machine's system is used",
                                                 image=self.image)
        self._uid_ctx = runner.user()
        self.uid = self._uid_ctx.__enter__()
        try:
            self.workdir = runner.make_workdir(self.uid)
        except BaseException:
            self._uid_ctx.__exit__(None, None, None)
            raise
        self.sandbox_id = "local-" + os.path.basename(self.workdir)
        self._until = time.monotonic() + self.lifetime
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if self.workdir:
            await asyncio.to_thread(remove_tree, self.workdir)
            self.workdir = ""
        if self._uid_ctx is not None:
            self._uid_ctx.__exit__(None, None, None)
            self._uid_ctx = None

    def _inside(self, sandbox_path: str) -> str:
        if not self.workdir:
            raise SandboxError("the sandbox is not open (use `async with LocalSandbox() as sb`)")
        p = Path(sandbox_path)
        if p.is_absolute():
            try:
                p = p.relative_to(self.workdir)
            except ValueError:
                raise ValueError(f"{sandbox_path}: outside the sandbox's directory {self.workdir}") from None
        return str(p)

    async def exec(self, cmd: str, *, user: str = "root", env: dict[str, str] | None = None, timeout: int = 120,
                   check: bool = False, idempotent: bool = True) -> ExecResult:
        if not self.workdir:
            raise SandboxError("the sandbox is not open (use `async with LocalSandbox() as sb`)")
        left = self._until - time.monotonic()
        if left <= 0:
            raise SandboxError(f"sandbox {self.sandbox_id} has reached the end of its lifetime "
                               f"({self.lifetime:.0f} s)")
        base = self.limits or self.runner.limits
        limits = replace(base, timeout=min(float(timeout), left), cpu=float(timeout))
        r = await self.runner.arun(argv=["/bin/sh", "-c", cmd], env=env, limits=limits, workdir=self.workdir,
                                   uid=self.uid, hold_uid=True)
        if r.error:
            raise SandboxError(r.error)
        code = TIMEOUT_EXIT if r.timed_out else r.exit_code if r.exit_code is not None else 128 + (r.signal or 0)
        out = r.stdout.decode("utf-8", errors="replace")
        err = r.stderr.decode("utf-8", errors="replace")
        if r.timed_out:
            err += f"\n[the command ran past its timeout of {limits.timeout:g} s and was killed]"
        if check and code != 0:
            raise RuntimeError(f"local sandbox exec failed (exit={code}): {cmd[:120]}\n{err[:400]}")
        return code, out, err

    async def write_file(self, sandbox_path: str, content: FileContent, *, user: str = "root") -> None:
        rel = self._inside(sandbox_path)
        data = await asyncio.to_thread(content.read_bytes) if isinstance(content, Path) else content
        await asyncio.to_thread(write_in, self.workdir, rel, data, self.uid)

    async def read_file(self, sandbox_path: str, *, user: str = "root") -> str:
        """The file's text; "" when it cannot be read (as slime's backend answers)."""
        try:
            rel = self._inside(sandbox_path)
            data = await asyncio.to_thread(read_in, self.workdir, rel)
        except (OSError, ValueError, SandboxError):
            return ""
        return data.decode("utf-8", errors="replace")
