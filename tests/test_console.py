"""The console: one renderer per process (log.CONSOLE), --log-level for the console only, book-keeping events off
it, a footer (status, progress) only on a terminal."""

import io
import json
import sys

import pytest

from slime_actors import log as L


class Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def stderr(monkeypatch):
    def use(stream):
        monkeypatch.setattr(sys, "stderr", stream)
        return stream
    yield use
    L.CONSOLE.end_footer(keep=False)
    L.setup_logging()   # back to the defaults for other tests


def test_no_footer_and_no_control_codes_off_a_terminal(stderr):
    err = stderr(io.StringIO())
    con = L.Console()
    assert not con.interactive
    con.footer("progress", L.progress_line("rl steps", 3, 60, 1.9))
    con.write("a line")
    con.footer("status", "[ 3s] rollout 3 train")
    con.end_footer()
    assert err.getvalue() == "a line\n"


def test_footer_stays_at_the_bottom_on_a_terminal(stderr):
    err = stderr(Tty())
    con = L.Console()
    assert con.interactive
    con.footer("status", "[ 3s] rollout 3 train v3")
    con.footer("progress", "rl steps 3/60")
    con.write("step 3 done")
    con.end_footer(keep=True)
    out = err.getvalue()
    # the footer (both parts, one line) is erased before a line is written, then drawn again under it
    assert out.endswith("\r\033[Kstep 3 done\n\r\033[K[ 3s] rollout 3 train v3 | rl steps 3/60\n")
    assert out.count("\n") == 2


def test_progress_line():
    line = L.progress_line("rl steps", 15, 60, 2.5, {"reward": 0.25, "eval heldout": None})
    assert line == "rl steps 15/60 ▕█████···············▏  25% 2.5 s/step reward 0.25"
    assert L.progress_line("x", 3, 3, 0.25).endswith("100% 4.0 step/s")


def test_log_level_is_the_consoles_the_json_log_keeps_info(tmp_path, stderr):
    err = stderr(io.StringIO())
    L.setup_logging(tmp_path, "controller/0", level="warning")
    log = L.get_logger(actor="controller/0")
    log.info("step", rollout_id=3)
    log.warning("engine slow", seconds=9)
    log.debug("details")
    shown = err.getvalue()
    assert "engine slow" in shown and "step" not in shown
    events = [json.loads(x)["event"] for x in (tmp_path / "logs" / "controller-0.jsonl").read_text().splitlines()]
    assert events == ["step", "engine slow"]       # info kept in the file, debug not asked for


def test_book_keeping_events_stay_off_the_console_unless_debug(tmp_path, stderr):
    err = stderr(io.StringIO())
    L.setup_logging(tmp_path, "agent/0", level="info")
    log = L.get_logger(actor="agent/0")
    log.info("peer stopped", peer="trainer/0", console=False)
    log.info("eval", reward=0.5)
    assert "peer stopped" not in err.getvalue() and "eval" in err.getvalue()
    rows = [json.loads(x) for x in (tmp_path / "logs" / "agent-0.jsonl").read_text().splitlines()]
    assert [r["event"] for r in rows] == ["peer stopped", "eval"] and "console" not in rows[0]
    L.setup_logging(tmp_path, "agent/0", level="debug")
    L.get_logger(actor="agent/0").info("peer stopped", peer="reward/0", console=False)
    assert "peer stopped" in err.getvalue()


def test_a_bad_log_level_is_named(monkeypatch):
    with pytest.raises(ValueError, match="log level 'loud': expected one of debug, info, warning, error, critical"):
        L.console_level("loud")
    monkeypatch.setenv("SLIME_ACTORS_LOG_LEVEL", "WARN")
    assert L.console_level() == "warning"


def test_a_peer_that_deregistered_is_no_warning(tmp_path, stderr, loop_thread, run_dir):
    """The directory tells watchers `_peer_down(reason="stopped")` when an actor deregisters at a clean stop: a
    line in the JSON log, no warning on the console (it used to print "peer down" for every actor at every job's
    end); a peer that missed its heartbeats is still a warning."""
    from helpers import Echo

    err = stderr(io.StringIO())
    L.setup_logging(tmp_path, "echo/0", level="info")
    a = Echo(0)
    a.log = L.get_logger(actor="echo/0")

    class Box:
        def disconnect(self, name, reason):
            pass
    a.mailbox = Box()
    import asyncio
    asyncio.run(Echo._peer_down(a, "trainer/0", "stopped"))
    assert "peer" not in err.getvalue()
    asyncio.run(Echo._peer_down(a, "trainer/0", "missed heartbeats"))
    assert "peer down" in err.getvalue() and "missed heartbeats" in err.getvalue()
    rows = [json.loads(x) for x in (tmp_path / "logs" / "echo-0.jsonl").read_text().splitlines()]
    assert [r["event"] for r in rows] == ["peer stopped", "peer down"]
