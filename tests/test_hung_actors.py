"""A hung actor (alive, heartbeats stopped) is asked for its Python stack before it is killed (launch/stacks.py), and
a restarted actor that hangs at the same place again stops the job with that stack (launch/local.py): a blocking call
in async code -- the usual cause -- hangs every incarnation alike, and a restart every ~15 s never reached the restart
limit, so such a job restarted its actor for ever."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_launch_support import FAST_FLAGS, Job, topology

from slime_actors.launch import stacks
from slime_actors.launch.local import ActorProc, LocalLauncher
from slime_actors.launch.topology import RestartPolicy

# a process that registers the dump, says so, then blocks in the function named by argv[1] (as a blocking call in an
# actor's async code would)
HANGS = '''
import sys, time
from slime_actors.launch import stacks
stacks.register()

def here():
    time.sleep(1000)   # HERE

def there():
    while True: pass   # THERE

print("ready", flush=True)
{"here": here, "there": there}[sys.argv[1]]()
'''


def _line(marker: str) -> int:
    return next(i for i, ln in enumerate(HANGS.splitlines(), 1) if marker in ln)


def _dump(p: subprocess.Popen, out: Path, sig=stacks.SIGNAL) -> list:
    """Ask `p` for its stacks; the main thread's frames from the dump it wrote to `out` ([] if none came in 10 s)."""
    mark = stacks.size(out)
    assert stacks.ask(p.pid, sig)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 10:
        time.sleep(0.05)
        frames = stacks.read(out, mark)
        if frames is not None:
            return frames
    return []


def _popen(script: Path, out: Path, *args: str) -> subprocess.Popen:
    """`python script ARGS`, its stderr appended to `out`; returned once it has said "ready"."""
    f = open(out, "ab")
    p = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=f)
    f.close()
    if p.stdout.readline().strip() != b"ready":
        p.kill()
        p.wait()
        raise AssertionError(f"{script.name} did not start: {out.read_text()[-2000:]}")
    return p


def _start(script: Path, where: str, out: Path, sig=stacks.SIGNAL) -> subprocess.Popen:
    """The process, once its main thread is inside `where` (it says "ready" just before it goes in: on a loaded
    machine a dump asked for at once may still find it on the way)."""
    p = _popen(script, out, where)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 20:
        frames = _dump(p, out, sig)
        if frames and frames[0].func == where:
            return p
    p.kill()
    raise AssertionError(f"never saw the process inside {where}(): {out.read_text()[-2000:]}")


@pytest.mark.parametrize("sig", [stacks.SIGNAL, stacks.LIVE_SIGNAL], ids=["faulthandler", "live"])
def test_a_dump_names_where_the_main_thread_is_blocked(tmp_path, sig):
    """faulthandler's dump (SIGUSR1, the supervisor's) and the one from Python (SIGUSR2, `slime-actors stacks`') both
    name the main thread's innermost frame: in a sleep (the handler from Python runs when the signal interrupts it)
    and in a busy loop of Python code."""
    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    out = tmp_path / "err.log"
    out.write_bytes(b"earlier output\nCurrent thread 0x00007f00 (most recent call first):\n"
                    b'  File "/old.py", line 1 in old\n\n')
    offset = stacks.size(out)
    for where, marker in (("here", "# HERE"), ("there", "# THERE")):
        p = _start(script, where, out, sig)
        try:
            frames = _dump(p, out, sig)
            assert frames, out.read_text()[-2000:]
            assert (Path(frames[0].path).name, frames[0].line, frames[0].func) == ("hangs.py", _line(marker), where)
            assert frames[-1].func == "<module>"
            assert stacks.complete(frames) and not stacks.complete(frames[:1]) and not stacks.complete(None)
            assert str(frames[0]) == f'File "{script}", line {_line(marker)}, in {where}'
        finally:
            p.kill()
            p.wait()
    # the last dump after the offset is read; before it, the old one
    assert stacks.read(out, offset)[0].func == "there"
    assert stacks.read(out, 0)[0].func == "there"
    assert stacks.read(out, stacks.size(out)) is None
    assert stacks.read(tmp_path / "none.log") is None
    # an actor runs as `python -m slime_actors.launch.actor`: its dump ends in runpy's frames below its <module>
    m = [stacks.Frame("actor.py", 157, "main"), stacks.Frame("actor.py", 163, "<module>"),
         stacks.Frame("<frozen runpy>", 88, "_run_code"), stacks.Frame("<frozen runpy>", 198, "_run_module_as_main")]
    assert stacks.complete(m) and not stacks.complete(m[:3]) and not stacks.complete(m[:1] + m[3:])
    shown = stacks.shown([stacks.Frame("a.py", i, "f") for i in range(10)], n=3)
    assert shown.splitlines() == ['    File "a.py", line 0, in f', '    File "a.py", line 1, in f',
                                  '    File "a.py", line 2, in f', "    ... 7 outer frames (the actor's log has them)"]


# threads that start and end all the time, running Python code (a pool's short tasks): faulthandler's dump, written
# from the C signal handler while they run, can crash such a process (CPython gh-116008; a buffer's SIGSEGV in the
# suite); the dump from Python reads them with the GIL held
CHURN = '''
import threading, time, typing
from slime_actors.launch import stacks
stacks.register()

def task():
    for _ in range(50):
        typing.Union[int, str, bytes]   # TASK

def churn():
    while True:
        ts = [threading.Thread(target=task) for _ in range(4)]
        for t in ts: t.start()
        for t in ts: t.join()

threading.Thread(target=churn, daemon=True).start()
print("ready", flush=True)
while True:
    time.sleep(0.01)   # MAIN
'''


def _spawn(tmp_path: Path, name: str, program: str) -> tuple[subprocess.Popen, Path]:
    """`program` run as tmp_path/name, its stderr to tmp_path/err.log; returned once it has said "ready"."""
    script = tmp_path / name
    script.write_text(program)
    out = tmp_path / "err.log"
    return _popen(script, out), out


def test_the_live_dump_leaves_a_process_whose_threads_come_and_go_running(tmp_path):
    p, out = _spawn(tmp_path, "churn.py", CHURN)
    try:
        assert stacks.catches(p.pid, stacks.LIVE_SIGNAL) and stacks.catches(p.pid, stacks.SIGNAL)
        others = 0
        for _ in range(40):
            mark = stacks.size(out)
            frames = _dump(p, out, stacks.LIVE_SIGNAL)
            assert frames and stacks.complete(frames), out.read_text()[-2000:]
            assert frames[0].func == "<module>" or "time" in frames[0].path, frames   # (in the main loop's sleep)
            text = stacks.dump_text(out, mark)
            assert text.rstrip().splitlines()[-1].endswith(" in <module>"), text   # the main thread's block last
            others += sum(ln.startswith("Thread 0x") for ln in text.splitlines())
            assert p.poll() is None, out.read_text()[-2000:]
        assert others > 0          # the other threads' stacks were in the dumps
        time.sleep(0.5)
        assert p.poll() is None    # alive after 40 dumps
    finally:
        p.kill()
        p.wait()


def test_a_process_without_the_handler_is_not_asked(tmp_path):
    """SIGUSR1 and SIGUSR2 end a process that has no handler for them: `catches` reads whether it has one, and
    `slime-actors stacks` does not signal an actor's process without it (one started by another version, say)."""
    # its command line is an actor's (`... slime_actors.launch.actor rollout 0 ...`), its handlers are not
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "slime_actors.launch.actor", "rollout",
                          "0"])
    try:
        time.sleep(0.3)
        assert stacks.is_actor(p.pid, "rollout/0")
        assert not stacks.catches(p.pid, stacks.LIVE_SIGNAL) and not stacks.catches(p.pid, stacks.SIGNAL)
        assert not stacks.catches(2 ** 22 + 12345, stacks.LIVE_SIGNAL)   # (no such process)
        (tmp_path / "status.json").write_text(json.dumps({"state": "running", "processes": {"rollout/0": {
            "pid": p.pid}}}))
        for extra in ([], ["--native"]):
            r = _stacks(str(tmp_path), *extra)
            sig = "SIGUSR1" if extra else "SIGUSR2"
            assert r.returncode == 1 and f"rollout/0 (pid {p.pid}): has no handler for {sig}" in r.stdout, r.stdout
        time.sleep(0.3)
        assert p.poll() is None    # not signalled
    finally:
        p.kill()
        p.wait()


# the main thread blocks the signal for a while, a worker thread does not: a signal sent to the process goes to the
# worker (its stack headed "Current thread", read as the main thread's); one sent to the main thread waits for it
MAIN_BLOCKS = '''
import signal, threading, time
from slime_actors.launch import stacks
stacks.register()

def worker():
    time.sleep(1000)   # WORKER

threading.Thread(target=worker, daemon=True).start()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
print("ready", flush=True)
time.sleep(3)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})   # UNBLOCK
time.sleep(1000)   # AFTER
'''


@pytest.mark.skipif(stacks._TGKILL is None, reason="no tgkill here (glibc 2.30+ on Linux): the stacks are asked "
                    "of the process, and the kernel picks the thread")
def test_the_stacks_asked_for_are_the_main_threads_even_when_another_thread_could_take_the_signal(tmp_path):
    p, out = _spawn(tmp_path, "main_blocks.py", MAIN_BLOCKS)
    script = tmp_path / "main_blocks.py"
    try:
        frames = _dump(p, out)
        assert frames, out.read_text()[-2000:]
        lines = {m: next(i for i, ln in enumerate(MAIN_BLOCKS.splitlines(), 1) if m in ln)
                 for m in ("# UNBLOCK", "# AFTER")}
        mine = [(fr.func, fr.line) for fr in frames if Path(fr.path).name == script.name]
        # the main thread's: as it unblocks (inside signal.py's pthread_sigmask), or after (a loaded machine that
        # asked only once it had); never the worker's
        assert mine in ([("<module>", lines["# UNBLOCK"])], [("<module>", lines["# AFTER"])]), out.read_text()[-2000:]
        assert stacks.complete(frames)
    finally:
        p.kill()
        p.wait()


class _Popen:
    """A launcher's view of one process started outside it."""

    def __init__(self, p: subprocess.Popen):
        self._p = p
        self.pid = p.pid

    def poll(self):
        return self._p.poll()

    def wait(self, timeout=None):
        return self._p.wait(timeout)


def _hang_and_kill(launcher: LocalLauncher, ap: ActorProc, script: Path, where: str) -> None:
    """Start `ap`'s next incarnation hung at `where`; the launcher, told it is silent, asks for its stack, kills it."""
    out = launcher.run_dir / "logs" / f"{ap.role}-{ap.index}.out"
    p = _start(script, where, out)
    ap.popen = _Popen(p)
    ap.started = time.monotonic() - 100
    ap.stack_asked = None
    silent = {ap.name: {"alive": False, "pid": p.pid, "last_seen": 12.5}}
    t0 = time.monotonic()
    while p.poll() is None and time.monotonic() - t0 < 10:
        launcher._kill_hung(silent)
        time.sleep(0.05)
    assert p.wait(5) == -9, "not killed"


def test_a_restarted_actor_hung_at_the_same_place_stops_the_job(tmp_path):
    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    launcher = LocalLauncher(str(tmp_path / "run"), {}, hang_kill_after=10)
    ap = launcher.add("rollout", 0, policy=RestartPolicy())
    _hang_and_kill(launcher, ap, script, "here")
    assert launcher.failure is None   # once: killed (and restarted by check), where it was logged
    assert any("hung: no heartbeat for 12.5s at File" in what and f"line {_line('# HERE')}, in here" in what
               for _, _, what in launcher.events), launcher.events
    _hang_and_kill(launcher, ap, script, "there")
    assert launcher.failure is None   # another place: another hang, restarted again
    _hang_and_kill(launcher, ap, script, "there")
    assert launcher.failure is not None and ap.expected_exit   # the same place twice in a row: the job stops
    first = launcher.failure.splitlines()
    assert first[0] == ("rollout/0 hung twice at the same place, each time alive but silent (no heartbeat) for 10s, "
                        "killed; its main thread was at:")
    assert first[1] == f'    File "{script}", line {_line("# THERE")}, in there'
    assert "await asyncio.to_thread" in launcher.failure and "logs/rollout-0.out" in launcher.failure
    assert launcher.failure_cause == f"rollout/0 hung twice at {script}:{_line('# THERE')} in there"
    # the same function seen at another line (a loop of several lines) is the same place; another file is not
    for earlier, stops in ((stacks.Frame(str(script), 999, "there"), True),
                           (stacks.Frame(str(tmp_path / "other.py"), _line("# THERE"), "there"), False)):
        launcher.failure = None
        ap.hung_at = earlier
        _hang_and_kill(launcher, ap, script, "there")
        assert (launcher.failure is not None) == stops, earlier


def test_a_process_that_gives_no_stack_is_killed_all_the_same(tmp_path):
    """Stopped (SIGSTOP) or not in Python: no dump comes; it is killed after the wait, never judged by place."""
    launcher = LocalLauncher(str(tmp_path / "run"), {}, hang_kill_after=10)
    ap = launcher.add("reward", 0, policy=RestartPolicy())
    for _ in range(2):
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"])   # SIGUSR1 kills it: no dump
        ap.popen = _Popen(p)
        ap.started = time.monotonic() - 100
        ap.stack_asked = None
        t0 = time.monotonic()
        while p.poll() is None and time.monotonic() - t0 < 10:
            launcher._kill_hung({ap.name: {"alive": False, "pid": p.pid, "last_seen": 11.0}})
            time.sleep(0.05)
        assert p.wait(5) in (-9, -10)
    assert launcher.failure is None


BLOCKING_ENV = '''
import time
from slime_actors.environments import Env, Step


class Blocks(Env):
    max_turns = 2

    async def step(self, sample, turn):
        time.sleep(1000)   # a blocking call in async code: the worker's loop, heartbeats too, stop here
        return Step(done=True)
'''


def test_a_job_whose_environment_blocks_stops_naming_the_line(tmp_path):
    """The user's mistake as they make it: the rollout worker hangs in the environment's step, is killed and
    restarted, hangs there again, and the job stops with exit code 1 and the environment's line -- before this, it
    restarted the worker every ~15 s for ever."""
    env = tmp_path / "blocks.py"
    env.write_text(BLOCKING_ENV)
    topo = topology(tmp_path, """
[supervisor]
hang_kill_after = 4

[roles.buffer]
[roles.reward]
[roles.rollout]
[roles.trainer]
""")
    job = Job(tmp_path, topo, [*FAST_FLAGS, "--num-rollout", "2", "--rollout-max-response-len", "8",
                               "--rollout-interaction-env-path", f"{env}:Blocks"]).start()
    try:
        rc = job.wait(150)
        out = job.log()
        assert rc == 1, out[-3000:]
        line = next(i for i, ln in enumerate(BLOCKING_ENV.splitlines(), 1) if "time.sleep" in ln)
        assert "rollout/0 hung twice at the same place" in out, out[-3000:]
        assert f'File "{env}", line {line}, in step' in out, out[-3000:]
        assert out.count("actor alive but silent; killing it") >= 2, out[-3000:]   # (a loaded machine may add one)
    finally:
        job.close()


def _stacks(*args, timeout=60):
    from test_launch_support import SLIME
    return subprocess.run([SLIME, "stacks", *args], capture_output=True, text=True, timeout=timeout)


def test_the_stacks_command_shows_a_running_jobs_actors_and_leaves_it_running(tmp_path):
    topo = topology(tmp_path, """
[roles.buffer]
[roles.reward]
[roles.rollout]
[roles.trainer]
""")
    job = Job(tmp_path, topo, [*FAST_FLAGS, "--num-rollout", "100000"]).start()
    try:
        job.wait_step(2)
        job.wait_for(lambda: len(json.loads((job.run_dir / "status.json").read_text()).get("processes") or {}) == 4,
                     30, "the status to list the processes")
        p = _stacks(str(job.run_dir))
        assert p.returncode == 0, p.stdout + p.stderr
        for name in ("buffer/0", "reward/0", "rollout/0", "trainer/0"):
            block = p.stdout.split(f"== {name} (pid ")[1].split("\n\n")[0]
            assert "main thread, innermost first" in block.splitlines()[0], block
            frames = [ln for ln in block.splitlines()[1:] if ln.startswith('    File "')]
            assert frames and frames[-1].endswith("in _run_module_as_main"), block
        p = _stacks(str(job.run_dir), "--actor", "trainer/0", "--all-threads")
        assert p.returncode == 0 and "every thread" in p.stdout and "Current thread 0x" in p.stdout, p.stdout
        p = _stacks(str(job.run_dir), "--actor", "judge/0")
        assert p.returncode == 2 and "no process judge/0 on this host's launcher (it has: buffer/0, reward/0, " \
                                     "rollout/0, trainer/0)" in p.stderr, p.stderr
        before = job.controller()["rollout_id"]
        job.wait_step(before + 2)    # the job went on
        job.proc.send_signal(2)
        assert job.wait(60) == 130
        p = _stacks(str(job.run_dir))
        assert p.returncode == 1 and f"the job in {job.run_dir} is not running (its status: stopped)" in p.stderr
    finally:
        job.close()
    p = _stacks(str(tmp_path / "nothing"))
    assert p.returncode == 2 and "no readable status.json" in p.stderr
    # a status left "running" by a head that was killed, its actor's pid since taken by another program: that
    # program is not sent SIGUSR1 (it would end it)
    stale = tmp_path / "stale"
    stale.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (stale / "status.json").write_text(json.dumps({"state": "running", "processes": {"rollout/0": {
            "pid": other.pid}}}))
        p = _stacks(str(stale))
        assert p.returncode == 1 and f"rollout/0: not running (pid {other.pid} is not this actor's process now)" \
            in p.stdout, p.stdout
        time.sleep(0.5)
        assert other.poll() is None, "the other program was signalled"
    finally:
        other.kill()
        other.wait()
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    for body, rc, says in (("[1]", 2, "no readable status.json"),
                           ('{"state": "running", "processes": [1]}', 2, "lists no actor processes"),
                           ('{"state": "running", "processes": {"rollout/0": {"pid": "1"}}, "actors": [2]}', 1,
                            "rollout/0: not running (pid 1 is not this actor's process now)")):
        (hostile / "status.json").write_text(body)
        p = _stacks(str(hostile))
        assert p.returncode == rc and says in p.stdout + p.stderr, (body, p.stdout, p.stderr)
    (tmp_path / "torchrun").mkdir()
    (tmp_path / "torchrun" / "status.json").write_text(json.dumps({"state": "running", "processes": {}}))
    p = _stacks(str(tmp_path / "torchrun"))
    assert p.returncode == 2 and "lists no actor processes of its launcher" in p.stderr, p.stderr
