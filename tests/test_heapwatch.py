"""SLIME_ACTORS_HEAPWATCH (slime_actors/heapwatch.py): which actors it names, and a report that points at the line
that allocated what the heap kept."""

import asyncio
import tracemalloc

import pytest

from slime_actors import env as E
from slime_actors import heapwatch

KEPT = []


def _grow():
    KEPT.extend(bytearray(1000) for _ in range(2000))   # ~2 MB held from this line


def test_it_names_actors_by_role_or_name(monkeypatch):
    monkeypatch.setenv(E.HEAPWATCH.name, "buffer, rollout/1")
    assert heapwatch.wanted("buffer/0", "buffer") and heapwatch.wanted("rollout/1", "rollout")
    assert not heapwatch.wanted("rollout/0", "rollout") and not heapwatch.wanted("trainer/0", "trainer")
    monkeypatch.delenv(E.HEAPWATCH.name)
    assert not heapwatch.wanted("buffer/0", "buffer")
    monkeypatch.setenv(E.HEAPWATCH_EVERY.name, "often")
    with pytest.raises(ValueError, match="SLIME_ACTORS_HEAPWATCH_EVERY must be a number, got 'often'"):
        E.HEAPWATCH_EVERY.get()


def test_the_report_names_the_line_that_kept_memory():
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start(heapwatch.FRAMES)
    try:
        first = tracemalloc.take_snapshot()
        _grow()
        now = tracemalloc.take_snapshot()
    finally:
        if not was:
            tracemalloc.stop()
        KEPT.clear()
    text = heapwatch.report(first, now, elapsed=1.0, label="test")
    top = text.splitlines()[3]   # the largest growth by line
    assert "test_heapwatch.py" in top and "KiB" in top, text
    assert text.startswith("test: Python heap ") and "largest growths by traceback:" in text
    assert heapwatch.native().startswith("RSS ")


def test_watch_writes_its_report_under_the_run_directory(tmp_path, monkeypatch):
    monkeypatch.setenv(E.HEAPWATCH_EVERY.name, "0.05")
    out = tmp_path / "heapwatch" / "buffer-0.txt"

    async def main():
        task = asyncio.get_running_loop().create_task(heapwatch.watch("buffer/0", str(tmp_path)))
        for _ in range(600):   # (no time bound on the outcome: a loaded machine only takes longer)
            if out.exists() or task.done():
                break
            await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    was = tracemalloc.is_tracing()
    try:
        asyncio.run(main())
    finally:
        if not was:
            tracemalloc.stop()
    text = out.read_text()
    assert text.startswith("buffer/0 (pid ") and "RSS " in text and "asyncio tasks alive:" in text
