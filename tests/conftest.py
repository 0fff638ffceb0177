import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from helpers import LoopThread  # noqa: E402


@pytest.fixture
def loop_thread():
    lt = LoopThread()
    yield lt
    lt.close()


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    return str(d)


@pytest.fixture
def nothing_starts(monkeypatch):
    """Starting a process, or the job, fails the test: a job's checks must all come before (issue 27 item 4)."""
    import subprocess

    def refuse(*args, **kwargs):
        raise AssertionError(f"a process was started: {args[:1]}")
    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr("slime_actors.train.run", lambda ctx: pytest.fail("the job started"))
    monkeypatch.setattr("slime_actors.launch.job.run", lambda ctx: pytest.fail("the job started"))
