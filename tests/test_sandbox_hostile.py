"""Hostile programs, each contained (docs/code-sandbox.md, "What the tests show").

Every program here is graded by the code reward against a task it cannot pass honestly (print the sum of two
numbers), in a sandbox with small limits (2 s of CPU, 4 s of wall clock, 256 MiB, 16 MiB files, 32 processes,
64 KiB of output). For each: its attack has no effect outside the sandbox (checked with real listeners, marker
files, secrets and a sentinel process), it ends within its limits and scores 0, this process is alive, the next
honest program scores 1, and no process of the sandbox's users and no file of its runs is left.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from slime_actors.rewards.code import StdioTests, agrade_code
from slime_actors.sandbox import Limits, Policy, Runner
from slime_actors.sandbox.runner import UID_BASE, UID_COUNT

LIMITS = Limits(timeout=4.0, cpu=2.0, memory_mb=256, file_mb=16, open_files=64, processes=32, output_bytes=64 << 10)
TASK = StdioTests(("3 4\n", "10 -2\n"), ("7\n", "8\n"))
HONEST = "a, b = map(int, input().split())\nprint(a + b)\n"
SECRET = "s3cr3t-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def runner():
    root = tempfile.mkdtemp(prefix="sbx-hostile-")       # under /tmp: the sandbox's users must reach it
    r = Runner(Policy(), LIMITS, concurrency=2, root=root)
    r.plan
    yield r
    r.close()
    shutil.rmtree(root, ignore_errors=True)


def grade(runner, program, tests=TASK):
    return asyncio.run(agrade_code(program, tests, runner))


def sandbox_processes(extra_marker: str | None = None) -> list[str]:
    """Processes of the sandbox's users (uid slots), or whose command line holds `extra_marker`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            uid = os.stat(f"/proc/{name}").st_uid
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if UID_BASE <= uid < UID_BASE + UID_COUNT or (extra_marker and extra_marker in cmd):
            found.append(f"{name}: uid {uid}: {cmd[:100]}")
    return found


def leftover_files(runner) -> list[str]:
    return [p for p in os.listdir(runner.root) if p != ".uids"]


def contained(runner, program, *, marker=None, tests=TASK):
    """Grade a hostile program: it scores 0, leaves nothing, and an honest program after it scores 1."""
    t0 = time.monotonic()
    g = grade(runner, program, tests)
    took = time.monotonic() - t0
    assert g.score == 0.0, g
    # the run ends within its limits: one run per case at most, each cut at the wall-clock timeout (plus the
    # runner's own bounded wait for the cell to end, 10 s at most)
    assert took < len(tests.inputs) * (LIMITS.timeout + 12), took
    assert sandbox_processes(marker) == []
    assert leftover_files(runner) == []
    honest = grade(runner, HONEST + f"# {uuid.uuid4().hex}\n", tests)      # (a new text: graded, not cached)
    assert honest.score == 1.0 and "cached" not in honest.details, honest
    return g


def test_infinite_loop(runner):
    g = contained(runner, "while True:\n    pass\n")
    assert "signal" in g.result or "timed out" in g.result


def test_fork_bomb(runner):
    contained(runner, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")


def test_fork_bomb_is_held_to_its_process_limit(runner):
    prog = ("import os, sys\nn = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n    except OSError:\n"
            "        break\n    if pid == 0:\n        import time; time.sleep(3); os._exit(0)\n    n += 1\n"
            "print(n)\n")
    r = runner.run(python_file="m.py", files={"m.py": prog})
    assert r.exit_code == 0, r
    assert int(r.stdout) < LIMITS.processes
    assert sandbox_processes() == []


def test_ten_gigabyte_allocation(runner):
    prog = "x = bytearray(10 * 1024 ** 3)\nprint(7)\n"
    r = runner.run(python_file="m.py", files={"m.py": prog})
    assert r.exit_code != 0 and b"MemoryError" in r.stderr, r
    contained(runner, prog)


@pytest.fixture
def listener():
    """A real TCP listener on 127.0.0.1 that records any connection."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    s.setblocking(False)
    yield s
    s.close()


def got_connection(s: socket.socket) -> bool:
    try:
        conn, _ = s.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


def connect_program(host: str, port: int) -> str:
    return (f"import socket\ns = socket.socket(socket.AF_INET6 if ':' in {host!r} else socket.AF_INET)\n"
            f"s.settimeout(2)\ns.connect(({host!r}, {port}))\ns.sendall(b'hello')\nprint('connected')\n")


def test_connect_to_a_listener_on_loopback(runner, listener):
    port = listener.getsockname()[1]
    r = runner.run(python_file="m.py", files={"m.py": connect_program("127.0.0.1", port)})
    assert r.exit_code != 0 and b"connected" not in r.stdout, r
    contained(runner, connect_program("127.0.0.1", port))
    assert not got_connection(listener)


def this_hosts_address() -> str | None:
    """An address of this machine that is not loopback (what another host would be reached through)."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout \
        if os.path.exists("/usr/sbin/ip") or os.path.exists("/sbin/ip") or os.path.exists("/usr/bin/ip") else ""
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            addr = parts[parts.index("inet") + 1].split("/")[0]
            if not addr.startswith("127."):
                return addr
    return None


def test_connect_to_another_host(runner):
    """A listener on this machine's own non-loopback address stands for another host: a connection there would
    leave the sandbox's network exactly as one to a remote host would (and sends nothing off this machine)."""
    addr = this_hosts_address()
    if addr is None:
        pytest.skip("this machine has no address but loopback")
    s = socket.socket()
    s.bind((addr, 0))
    s.listen(8)
    s.setblocking(False)
    try:
        prog = connect_program(addr, s.getsockname()[1])
        r = runner.run(python_file="m.py", files={"m.py": prog})
        assert r.exit_code != 0 and b"connected" not in r.stdout, r
        contained(runner, prog)
        assert not got_connection(s)
    finally:
        s.close()


@pytest.fixture
def secrets_in_place(tmp_path, monkeypatch):
    """A run directory with keys and a job.json, a home with a secret, and secrets in this process's environment,
    each holding SECRET."""
    run = tmp_path / "run"
    (run / "keys").mkdir(parents=True)
    (run / "keys").chmod(0o700)
    for name in ("job.secret", "engine.api_key"):
        (run / "keys" / name).write_text(SECRET)
        (run / "keys" / name).chmod(0o600)
    (run / "job.json").write_text('{"engine_api_key": "%s"}' % SECRET)
    (run / "job.json").chmod(0o644)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".netrc").write_text(f"machine x password {SECRET}")
    (home / ".netrc").chmod(0o644)
    for k in ("SLIME_ACTORS_CURVE_SECRET", "SLIME_ACTORS_ENGINE_API_KEY", "HF_TOKEN", "OPENAI_API_KEY"):
        monkeypatch.setenv(k, SECRET)
    monkeypatch.setenv("SLIME_ACTORS_RUN_DIR", str(run))
    monkeypatch.setenv("HOME", str(home))
    return run, home


def test_reading_keys_job_json_and_secrets(runner, secrets_in_place):
    run, home = secrets_in_place
    targets = [run / "keys" / "job.secret", run / "keys" / "engine.api_key", run / "job.json", home / ".netrc",
               Path("/proc/1/environ"), Path("/proc/self/environ")]
    prog = ("import os, glob\nprint(dict(os.environ))\n"
            f"for p in {[str(t) for t in targets]!r} + ['/proc/%d/environ' % os.getppid()]:\n"
            "    try:\n        print(p, open(p, 'rb').read())\n    except Exception as e:\n        print(p, e)\n"
            f"for p in glob.glob({str(run)!r} + '/**', recursive=True):\n    print(p)\n"
            "for pid in os.listdir('/proc'):\n    if pid.isdigit():\n        try:\n"
            "            print(pid, open('/proc/%s/environ' % pid, 'rb').read())\n        except Exception:\n"
            "            pass\n")
    r = runner.run(python_file="m.py", files={"m.py": prog})
    assert r.exit_code == 0, r
    assert SECRET.encode() not in r.stdout + r.stderr
    assert b"Permission denied" in r.stdout        # the attempts were made and refused
    contained(runner, prog)


def test_writing_outside_its_directory(runner, tmp_path):
    name = "pwned-" + uuid.uuid4().hex
    targets = [tmp_path / name, Path("/tmp") / name, Path("/var/tmp") / name, Path("/dev/shm") / name,
               Path(runner.root) / name, Path.cwd() / name]
    prog = (f"for p in {[str(t) for t in targets]!r}:\n    try:\n        open(p, 'w').write('x')\n"
            "        print('wrote', p)\n    except Exception as e:\n        print(p, e)\n")
    r = runner.run(python_file="m.py", files={"m.py": prog})
    assert r.exit_code == 0 and b"wrote" not in r.stdout, r
    contained(runner, prog)
    assert [t for t in targets if t.exists()] == []


def test_multi_gigabyte_file(runner):
    prog = ("chunk = b'x' * (1 << 20)\nwith open('big', 'wb') as f:\n    for _ in range(3 * 1024):\n"
            "        f.write(chunk)\nprint(7)\n")
    r = runner.run(python_file="m.py", files={"m.py": prog})
    assert r.exit_code != 0 and b"File too large" in r.stderr, r
    contained(runner, prog)


def test_megabytes_on_stdout(runner):
    prog = "import sys\nfor _ in range(100):\n    sys.stdout.write('7' * (1 << 20))\n"
    r = runner.run(python_file="m.py", files={"m.py": prog})
    assert r.stdout_truncated and len(r.stdout) <= LIMITS.output_bytes, r.describe()
    contained(runner, prog)


def test_killing_its_parent_and_other_processes_of_the_user(runner):
    sentinel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        prog = ("import os, signal\n"
                f"for pid in (os.getppid(), 1, {sentinel.pid}, {os.getpid()}):\n"
                "    try:\n        os.kill(pid, signal.SIGKILL)\n    except Exception as e:\n        print(pid, e)\n"
                "for f in (lambda: os.kill(-1, 9), lambda: os.killpg(0, 9)):\n    try:\n        f()\n"
                "    except Exception as e:\n        print(e)\n")
        runner.run(python_file="m.py", files={"m.py": prog})
        contained(runner, prog)
        assert sentinel.poll() is None           # the other process of this user lives
    finally:
        sentinel.kill()
        sentinel.wait()


def test_daemon_that_double_forks(runner):
    marker = "31.%d" % (uuid.uuid4().int % 10 ** 8)
    prog = ("import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execv('/bin/sleep', ['sleep', '{marker}'])\n    os._exit(0)\nprint(1)\n")
    contained(runner, prog, marker=marker)


def test_sleeping_past_the_timeout(runner):
    g = contained(runner, "import time\ntime.sleep(100)\n")
    assert "timed out" in g.result


def test_closing_stdout_early(runner):
    prog = "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(0.2)\n"
    r = runner.run(python_file="m.py", files={"m.py": prog})
    assert not r.timed_out and r.stdout == b"", r
    contained(runner, prog)


def test_program_that_never_reads_its_stdin(runner):
    big = StdioTests(("1 2\n" * (1 << 20),), ("3\n",))       # 4 MiB of input, far more than a pipe holds
    prog = "import time\ntime.sleep(0.2)\nprint(3)\n"
    r = runner.run(python_file="m.py", files={"m.py": prog}, stdin=big.inputs[0].encode())
    assert not r.timed_out and r.exit_code == 0, r
    # it prints the right answer without reading: graded 1 (the task was only to print 3); the point is no hang
    assert asyncio.run(agrade_code(prog, big, runner)).score == 1.0
    assert sandbox_processes() == [] and leftover_files(runner) == []


def test_the_worker_runs_many_hostile_programs_at_once(runner):
    """Several at once (the concurrency limit holds them to 2 running): all contained, the honest one graded."""
    progs = ["while True:\n    pass\n", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
             "        pass\n", "x = bytearray(10 * 1024 ** 3)\n", HONEST, "import time\ntime.sleep(100)\n"]

    async def all_of_them():
        return await asyncio.gather(*(agrade_code(p, TASK, runner) for p in progs))
    scores = [g.score for g in asyncio.run(all_of_them())]
    assert scores == [0.0, 0.0, 0.0, 1.0, 0.0]
    assert sandbox_processes() == [] and leftover_files(runner) == []


def test_the_grader_is_alive_after_signals_to_its_group(runner):
    """A program that signals every process group it can name (its own, 0, the runner's) leaves the runner
    untouched: the program's session is its own."""
    prog = (f"import os\nfor g in (0, {os.getpgrp()}, {os.getpid()}):\n    try:\n        os.killpg(g, 9)\n"
            "    except Exception as e:\n        print(g, e)\n")
    contained(runner, prog)
    os.kill(os.getpid(), 0)


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGABRT])
def test_program_that_crashes(runner, sig):
    contained(runner, f"import os\nos.kill(os.getpid(), {int(sig)})\n")
