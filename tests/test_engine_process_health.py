"""EngineProcess.wait_healthy against an engine whose /health takes over a second, as SGLang's does (it sleeps 1 s,
then answers once its scheduler has answered a one-token generation). A probe that gives up after 1 s never sees
that answer; one that waits sees the first. The stand-in engine below answers after 1.2 s -- a loaded machine only
makes it slower -- and prints one line per /health it answers."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from slime_actors.backends.engine_process import EngineProcess, EngineStartError, find_free_port

SLOW_HEALTH = textwrap.dedent("""
    import http.server, sys, time

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/health":
                time.sleep(float(sys.argv[2]))
                print("health answered", flush=True)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def _engine(tmp_path, delay: float) -> EngineProcess:
    port = find_free_port()
    cmd = [sys.executable, "-c", SLOW_HEALTH, str(port), str(delay)]
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    return EngineProcess(popen, cmd, "127.0.0.1", port, tmp_path / "engine.log", None)


def test_a_health_answer_slower_than_a_second_is_waited_for(tmp_path):
    proc = _engine(tmp_path, 1.2)
    try:
        proc.wait_healthy(timeout=60)
        answered = lambda: [line for line in proc.lines if line == "health answered"]  # noqa: E731
        deadline = time.monotonic() + 30
        while not answered() and time.monotonic() < deadline:   # (the engine's output is read by a thread)
            time.sleep(0.05)
        assert answered() == ["health answered"]   # the first probe waited; no probe after it
    finally:
        proc.stop()


def test_an_engine_that_exits_while_starting_still_fails_at_once(tmp_path):
    popen = subprocess.Popen([sys.executable, "-c", "import sys; print('boom', flush=True); sys.exit(3)"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    proc = EngineProcess(popen, ["engine"], "127.0.0.1", find_free_port(), None, None)
    with pytest.raises(EngineStartError, match="exited while starting"):
        proc.wait_healthy(timeout=60)
    proc.stop()
