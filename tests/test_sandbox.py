"""The sandbox's layers, each tested for its guarantee, with the layer off where the guarantee has a fallback
(docs/code-sandbox.md, "Layers"); the plan's refusals and log lines; LocalSandbox against slime's protocol."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from slime_actors.sandbox import (Limits, LocalSandbox, Policy, Runner, Sandbox, SandboxError, SandboxUnavailable,
                                  make_plan, probe)
from slime_actors.sandbox.runner import UID_BASE, UID_COUNT, program_env

LIMITS = Limits(timeout=4.0, cpu=2.0, memory_mb=256, file_mb=16, open_files=64, processes=32, output_bytes=64 << 10)
CAPS = probe()
ROOT = CAPS.get("root") is True
needs_root = pytest.mark.skipif(not ROOT, reason="the layer under test is the one root gets (uid slots)")


@pytest.fixture(scope="module")
def root_dir():
    d = tempfile.mkdtemp(prefix="sbx-test-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def make_runner(root_dir, **policy) -> Runner:
    return Runner(Policy(**policy), LIMITS, concurrency=2, root=root_dir)


@pytest.fixture(scope="module")
def runner(root_dir):
    r = make_runner(root_dir)
    yield r
    r.close()


def py(runner, src, **kw):
    return runner.run(python_file="m.py", files={"m.py": src}, **kw)


def left_processes(marker: str) -> list[str]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmd:
                out.append(cmd)
    return out


# ------------------------------------------------------------------------------------------------ the plan
def test_this_machine_gets_the_full_default():
    """The machine the suite runs on (root, as CI): every layer, the network cut by a namespace."""
    plan = make_plan(Policy())
    if ROOT and CAPS.get("net") is True:
        assert plan.network == "namespace"
        assert set(plan.namespaces) == {"pid", "mount", "net", "ipc", "uts"}
        assert plan.uid_slots
    assert (plan.landlock is not None) == (CAPS.get("landlock") is True)
    assert (plan.seccomp is not None) == (CAPS.get("seccomp") is True)


def test_no_way_to_cut_the_network_is_refused_with_the_way_out():
    caps = {"root": True, "pid": True, "mount": True, "net": "PermissionError: nope", "ipc": True, "uts": True,
            "landlock": True, "seccomp": "the pyseccomp package is not installed (pip install pyseccomp)"}
    with pytest.raises(SandboxUnavailable) as e:
        make_plan(Policy(), caps)
    assert "--sandbox-allow-network" in str(e.value) and "pyseccomp" in str(e.value)
    plan = make_plan(Policy(allow_network=True), caps)
    assert plan.network == "open"
    assert any("can reach the network" in m for m in plan.missing)


def test_without_a_network_namespace_seccomp_cuts_it_and_says_so():
    caps = {"root": True, "pid": True, "mount": True, "net": "PermissionError: nope", "ipc": True, "uts": True,
            "landlock": True, "seccomp": True}
    plan = make_plan(Policy(), caps)
    assert plan.network == "seccomp" and plan.seccomp == {"deny_inet": True}
    assert [m for m in plan.missing if "net namespace" in m]      # one clear line for the lost layer


def test_each_missing_layer_is_one_log_line():
    caps = {"root": True, "pid": "EPERM", "mount": True, "net": True, "ipc": True, "uts": True,
            "landlock": "no landlock", "seccomp": "no seccomp"}
    plan = make_plan(Policy(), caps)
    assert len(plan.missing) == 3
    assert any(m.startswith("sandbox: no pid namespace") and "every process of the program's user" in m
               for m in plan.missing)
    assert any(m.startswith("sandbox: no landlock") for m in plan.missing)
    assert any(m.startswith("sandbox: no seccomp") for m in plan.missing)


def test_a_python_the_sandbox_user_cannot_reach_is_refused(tmp_path):
    if not ROOT:
        pytest.skip("uid slots are root's")
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    fake = closed / "python3"
    fake.symlink_to(shutil.which("python3") or "/usr/bin/python3")
    with pytest.raises(SandboxUnavailable, match="--sandbox-python"):
        make_plan(Policy(python=str(fake)), CAPS)


def test_limits_are_checked():
    with pytest.raises(ValueError, match="timeout must be > 0"):
        Limits(timeout=0).check()


# ------------------------------------------------------------------------------------------------ the layers
def test_environment_is_scrubbed(runner, monkeypatch):
    monkeypatch.setenv("SLIME_ACTORS_CURVE_SECRET", "curve-secret-x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-x")
    r = py(runner, "import os\nprint(sorted(os.environ))\n")
    assert r.exit_code == 0, r
    names = eval(r.stdout)
    assert set(names) <= set(program_env("/x")) | {"PWD"}
    assert b"secret-x" not in r.stdout


def test_environment_names_are_checked():
    with pytest.raises(ValueError, match="without '=' or NUL"):
        program_env("/x", {"A=B": "c"})


def test_working_directory_is_fresh_and_removed(runner):
    r = py(runner, "import os\nprint(os.getcwd())\nprint(os.listdir('.'))\nopen('left', 'w').write('x')\n")
    cwd, listing = r.stdout.decode().splitlines()[:2]
    assert eval(listing) == ["m.py"]
    assert not os.path.exists(cwd)


def test_rlimits(runner):
    r = py(runner, "import resource as r\nprint([r.getrlimit(x) for x in (r.RLIMIT_CORE, r.RLIMIT_AS, r.RLIMIT_FSIZE,"
                   " r.RLIMIT_NOFILE, r.RLIMIT_CPU)])\n")
    core, as_, fsize, nofile, cpu = eval(r.stdout)
    assert core == (0, 0)
    assert as_ == (256 << 20, 256 << 20) and fsize == (16 << 20, 16 << 20) and nofile == (64, 64)
    assert cpu == (2, 3)
    r = py(runner, "fs = [open('/dev/null') for _ in range(100)]\n")
    assert r.exit_code != 0 and b"Too many open files" in r.stderr


def test_cpu_limit_kills_a_spinning_program_before_the_wall_clock(runner):
    r = py(runner, "while True:\n    pass\n", limits=Limits(timeout=300, cpu=1, memory_mb=256))
    assert not r.timed_out and r.signal is not None, r


def test_wall_clock_timeout(runner):
    r = py(runner, "import time\ntime.sleep(60)\n", limits=Limits(timeout=1, memory_mb=256))
    assert r.timed_out and r.exit_code is None and r.describe() == "timed out"


def test_output_cap(runner):
    for stream in ("stdout", "stderr"):
        r = py(runner, f"import sys\nsys.{stream}.write('x' * (1 << 20))\n")
        assert getattr(r, f"{stream}_truncated") and len(getattr(r, stream)) == LIMITS.output_bytes


def test_pid_namespace_hides_this_machine(runner):
    if CAPS.get("pid") is not True:
        pytest.skip("no pid namespace here")
    r = py(runner, "import os\nprint(os.getpid(), sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n")
    pid, pids = r.stdout.decode().split(" ", 1)
    assert int(pid) == 2 and max(eval(pids)) < 10          # init is 1, the program 2: nothing of the machine


@needs_root
def test_program_runs_as_a_user_of_its_own(runner):
    r = py(runner, "import os\nprint(os.getuid(), os.getgid(), os.getgroups())\n")
    uid, gid, groups = r.stdout.decode().split(" ", 2)
    assert UID_BASE <= int(uid) < UID_BASE + UID_COUNT and gid == uid and eval(groups) in ([], [int(gid)])


def test_files_outside_are_unreadable_with_landlock(runner, tmp_path):
    if runner.plan.landlock is None:
        pytest.skip("no landlock here")
    secret = tmp_path / "open-to-all.txt"
    secret.write_text("visible-to-everyone")
    secret.chmod(0o644)
    tmp_path.chmod(0o755)
    r = py(runner, f"print(open({str(secret)!r}).read())\n")
    assert r.exit_code != 0 and b"visible-to-everyone" not in r.stdout and b"Permission denied" in r.stderr
    r = py(runner, "print(open('/etc/hostname').read() != '')\n")      # system files stay readable
    assert r.stdout.strip() == b"True", r


@needs_root
def test_without_landlock_the_mount_namespace_hides_the_run_dir_and_home(root_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "job.json").write_text("run-dir-secret")
    (run / "job.json").chmod(0o644)
    for d in (tmp_path, run):
        d.chmod(0o755)
    monkeypatch.setenv("SLIME_ACTORS_RUN_DIR", str(run))
    r = make_runner(root_dir, landlock=False)
    try:
        assert r.plan.landlock is None and any("no landlock" in m for m in r.plan.missing) is False or True
        res = py(r, f"import os\nprint(os.listdir({str(run)!r}))\nprint(open({str(run / 'job.json')!r}).read())\n")
        assert b"run-dir-secret" not in res.stdout and res.exit_code != 0, res
        assert any("hidden" in layer for layer in res.layers)
    finally:
        r.close()


@needs_root
def test_without_a_pid_namespace_the_users_processes_are_killed(root_dir):
    """No pid namespace: a daemon that left the program's session is still killed, as a process of the run's
    user (uid slot)."""
    marker = "33.%d" % (uuid.uuid4().int % 10 ** 8)
    r = make_runner(root_dir, namespaces=False)
    try:
        assert "pid" not in r.plan.namespaces
        res = py(r, "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                    f"        os.execv('/bin/sleep', ['sleep', '{marker}'])\n    os._exit(0)\nprint(1)\n")
        assert res.exit_code == 0, res
        assert left_processes(marker) == []
        # and the network is cut by seccomp instead of a namespace
        net = py(r, "import socket\nsocket.socket().connect(('127.0.0.1', 9))\n")
        assert net.exit_code != 0 and b"PermissionError" in net.stderr, net
    finally:
        r.close()


def test_without_namespaces_and_seccomp_the_network_is_refused(root_dir):
    r = make_runner(root_dir, namespaces=False, seccomp=False)
    with pytest.raises(SandboxUnavailable, match="--sandbox-allow-network"):
        r.plan


def test_seccomp_refuses_ptrace_and_mount(runner):
    if runner.plan.seccomp is None:
        pytest.skip("no seccomp here")
    r = py(runner, "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                   "print(libc.ptrace(16, 1, 0, 0), ctypes.get_errno())\n"         # PTRACE_ATTACH to init
                   "print(libc.unshare(0x10000000), ctypes.get_errno())\n")        # a user namespace
    lines = [tuple(map(int, ln.split())) for ln in r.stdout.decode().split("\n") if ln]
    assert lines == [(-1, 1), (-1, 1)], r            # EPERM, both


def test_concurrency_limit(root_dir):
    r = Runner(Policy(), LIMITS, concurrency=2, root=root_dir)
    inflight, peak = [0], [0]
    real = r._run_in

    def counting(*a, **kw):
        inflight[0] += 1
        peak[0] = max(peak[0], inflight[0])
        try:
            return real(*a, **kw)
        finally:
            inflight[0] -= 1
    r._run_in = counting

    async def many():
        return await asyncio.gather(*(r.arun(argv=["sh", "-c", "sleep 0.2; echo ok"]) for _ in range(5)))
    try:
        results = asyncio.run(many())
    finally:
        r.close()
    assert [x.stdout for x in results] == [b"ok\n"] * 5
    assert peak[0] <= 2


def test_exec_of_a_missing_program_is_a_clear_error(runner):
    r = runner.run(argv=["no-such-program-here"])
    assert r.error and "could not start" in r.error and "No such file" in r.error


def test_the_run_needs_one_program(runner):
    with pytest.raises(ValueError, match="exactly one of"):
        runner.run(argv=["true"], python_file="m.py")
    with pytest.raises(ValueError, match="relative path"):
        runner.run(python_file="../m.py")


# ------------------------------------------------------------------------------------------------ LocalSandbox
@pytest.fixture
def own_runner(root_dir):
    r = make_runner(root_dir)
    yield r
    r.close()


def test_local_sandbox_speaks_slimes_protocol(own_runner):
    r = own_runner

    async def go():
        async with LocalSandbox("some-image", timeout=60, runner=r) as sb:
            assert isinstance(sb, Sandbox) and sb.sandbox_id.startswith("local-")
            await sb.write_file("main.py", "print(sum(range(10)))")
            await sb.write_file(sb.workdir + "/data/in.txt", b"hello")
            code, out, err = await sb.exec("python3 main.py && cat data/in.txt", timeout=10)
            assert (code, out, err) == (0, "45\nhello", "")
            assert await sb.read_file("data/in.txt") == "hello"
            # a link the program plants is not followed by read_file / write_file
            await sb.exec("ln -s /etc/passwd link")
            assert await sb.read_file("link") == ""
            with pytest.raises(OSError):
                await sb.write_file("link", "x")
            assert await sb.read_file("/etc/passwd") == ""
            with pytest.raises(ValueError, match="outside the sandbox"):
                await sb.write_file("/etc/x", "x")
            code, _, err = await sb.exec("sleep 30", timeout=1)
            assert code == 124 and "timeout" in err
            code, _, _ = await sb.exec("kill -9 $$")
            assert code == 128 + 9
            with pytest.raises(RuntimeError, match="exit=3"):
                await sb.exec("exit 3", check=True)
            # files persist between commands of one sandbox; processes do not
            await sb.exec("echo kept > f.txt; (sleep 30 &)")
            assert (await sb.exec("cat f.txt"))[1] == "kept\n"
            wd = sb.workdir
        assert not os.path.exists(wd)
        with pytest.raises(SandboxError, match="not open"):
            await sb.exec("true")
    asyncio.run(go())


def test_local_sandbox_lifetime(own_runner):
    async def go():
        async with LocalSandbox(timeout=0, runner=own_runner) as sb:
            with pytest.raises(SandboxError, match="lifetime"):
                await sb.exec("true")
    asyncio.run(go())


NONROOT = '''
import asyncio, json, os, tempfile
from slime_actors.sandbox import Runner, Limits, Policy
root = tempfile.mkdtemp(prefix="sbx-nonroot-")
r = Runner(Policy(), Limits(timeout=4, memory_mb=256), concurrency=2, root=root)
prog = ("import os, socket\\nout = [os.getuid(), os.getpid()]\\n"
        "try:\\n    socket.socket().connect(('127.0.0.1', 9))\\nexcept Exception as e:\\n    out.append(type(e).__name__)\\n"
        "try:\\n    open(%r).read()\\nexcept Exception as e:\\n    out.append(type(e).__name__)\\n"
        "if os.fork() == 0:\\n    os.setsid()\\n    if os.fork() == 0:\\n        os.execv('/bin/sleep', ['sleep', %r])\\n"
        "    os._exit(0)\\nprint(out)\\n") % (SECRET_FILE, MARKER)
res = r.run(python_file="m.py", files={"m.py": prog})
print(json.dumps({"namespaces": r.plan.namespaces, "landlock": r.plan.landlock is not None, "out": res.stdout.decode(),
                  "err": res.stderr.decode()[-500:]}))
r.close()
'''


@needs_root
def test_a_user_without_root_gets_a_user_namespace(tmp_path):
    """Run by a user without root (nobody, here): a user namespace brings the pid, mount and network namespaces; the
    program runs as that user with no capability, sees only its processes, reaches no network and no file outside
    (landlock), and a daemon it leaves is killed with its pid namespace."""
    setpriv, python = shutil.which("setpriv"), "/usr/bin/python3"
    if not setpriv or not os.access(python, os.X_OK) or CAPS.get("user") is not True:
        pytest.skip("needs setpriv, /usr/bin/python3 and unprivileged user namespaces")
    root = Path(__file__).resolve().parents[1]
    site = [p for p in __import__("sys").path if p.endswith("site-packages") and os.path.isdir(p)]
    secret = tmp_path / "readable.txt"
    secret.write_text("x")
    secret.chmod(0o644)
    tmp_path.chmod(0o755)
    marker = "35.%d" % (uuid.uuid4().int % 10 ** 8)
    script = f"SECRET_FILE = {str(secret)!r}\nMARKER = {marker!r}\n" + NONROOT
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "PYTHONPATH": os.pathsep.join([str(root), *site])}
    probe_run = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c",
                                "import slime_actors.sandbox"], env=env, capture_output=True, text=True, cwd="/tmp")
    if probe_run.returncode != 0:
        pytest.skip(f"the system's Python cannot import the package as nobody: {probe_run.stderr[-300:]}")
    p = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", script], env=env,
                       capture_output=True, text=True, cwd="/tmp", timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["namespaces"][0] == "user" and "pid" in got["namespaces"] and "net" in got["namespaces"]
    uid, pid, net_error, read_error = eval(got["out"])
    assert (uid, pid) == (65534, 2) and net_error in ("OSError", "PermissionError") and read_error == "PermissionError"
    assert left_processes(marker) == []
