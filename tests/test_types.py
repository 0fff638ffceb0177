"""The type checker (mypy, pinned in the `test` extra) over the RL loop, the typed handles, the roles, the buffer and
the algorithms -- the files pyproject.toml's [tool.mypy] names -- finds 0 errors; and it does catch a wrong call on a
role's handle (so the handles really are typed, and the check is not a formality).

The cache lives in .mypy_cache/ at the repository's root (ignored by git): a fresh clone checks everything once
(about half a minute on 2 cores), later runs reuse it."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".mypy_cache"

# what issue 29 asks the type checker to cover: the loop, the handles, the roles, the buffer, the algorithms
MUST_COVER = ("slime_actors/actors/controller/loop.py", "slime_actors/handles.py", "slime_actors/role_handles.py",
              "slime_actors/actors/buffer.py", "slime_actors/actors/trainer.py", "slime_actors/buffer_state.py",
              "slime_actors/algo/advantages.py")


def _mypy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(CACHE), "--no-color-output",
                           "--no-error-summary", *args], cwd=ROOT, capture_output=True, text=True, timeout=500)


def _configured_files() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]


def test_the_configuration_covers_the_loop_handles_roles_buffer_and_algorithms():
    files = _configured_files()
    for path in MUST_COVER:
        assert (ROOT / path).exists(), path
        assert any(path == f or path.startswith(f.rstrip("/") + "/") for f in files), \
            f"{path} is not in [tool.mypy] files of pyproject.toml: {files}"


def test_mypy_finds_no_errors():
    r = _mypy()   # (the files: pyproject.toml's [tool.mypy])
    errors = [line for line in r.stdout.splitlines() if ": error:" in line]
    assert r.returncode == 0 and not errors, f"mypy: {len(errors)} error(s)\n{r.stdout}\n{r.stderr}"


def test_mypy_catches_a_wrong_call_on_a_handle(tmp_path):
    # a field of the wrong type, a field the message does not have, and a reply used as what it is not
    program = (
        "from slime_actors.role_handles import BufferHandle\n"
        "async def f(buffer: BufferHandle) -> None:\n"
        "    await buffer.start_rollout('seven')\n"
        "    await buffer.mark_trained(3, no_such_field=1)\n"
        "    stats = await buffer.wait_rollout(3)\n"
        "    stats.no_such_statistic\n")
    path = tmp_path / "wrong_calls.py"
    path.write_text(program)
    r = _mypy(str(path))
    errors = [line for line in r.stdout.splitlines() if ": error:" in line]
    assert r.returncode == 1, r.stdout + r.stderr
    assert len(errors) == 3, r.stdout
    assert any('"start_rollout"' in e and "str" in e for e in errors), r.stdout
    assert any("no_such_field" in e for e in errors), r.stdout
    assert any("no_such_statistic" in e for e in errors), r.stdout
