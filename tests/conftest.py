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
