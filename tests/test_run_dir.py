"""A run never loses a user's files (issue 17): every path is checked before the first write, deletion happens only
inside a marked run directory and only of its own state, `--load` refuses what is not a checkpoint of this layout,
`--save` / `--save-hf` never write over another tool's files. These run the plain `slime-actors train` command; the
refusals take well under a second each (no actor starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "digits" / "config.toml"
BIN = Path(sys.executable).parent / "slime-actors"
ONE_STEP = ["--num-rollout", "1", "--eval-interval", "0", "--progress", "false"]


def train(*flags, cwd=ROOT, timeout=300):
    return subprocess.run([str(BIN), "train", "--config", str(CONFIG), *ONE_STEP, *flags], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def snapshot(d: Path) -> dict[str, bytes]:
    """Every file under d (hidden ones too) with its bytes."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def finished_run(d: Path) -> Path:
    """A run directory as a finished run leaves it (made by hand: marker, job file, metrics, traces, logs,
    TensorBoard events, curves, a checkpoint)."""
    d.mkdir(parents=True)
    (d / ".slime-actors-run").write_text("{}\n")
    (d / "job.json").write_text(json.dumps({"run_dir": str(d), "hf_checkpoint": "x", "num_rollout": 2,
                                            "rollout_batch_size": 16}))
    (d / "metrics.jsonl").write_text('{"rollout_id": 0}\n{"rollout_id": 1}\n')
    (d / "alarms.jsonl").write_text('{"rollout_id": 1, "signal": "collapse"}\n')
    for sub, name in (("traces", "controller-0.1.trace"), ("logs", "controller-0.jsonl"),
                      ("tensorboard", "events.out.tfevents.1.host.1.0"), ("ckpt/iter_0000002", "meta.json")):
        (d / sub).mkdir(parents=True)
        (d / sub / name).write_text(f"{sub}/{name}")
    (d / "curves.png").write_bytes(b"\x89PNG")
    return d


def fake_megatron_checkpoint(root: Path, iteration: str = "19") -> Path:
    """slime's (Megatron-LM's) layout: the tracker file and iter_XXXXXXX/ holding a torch_dist checkpoint."""
    root.mkdir(parents=True)
    (root / "latest_checkpointed_iteration.txt").write_text(iteration)
    it = root / ("release" if iteration == "release" else f"iter_{int(iteration):07d}")
    it.mkdir()
    for name in (".metadata", "__0_0.distcp", "common.pt"):
        (it / name).write_bytes(b"x")
    (it / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1}))
    return root


def assert_refused(p, *needles):
    assert p.returncode == 2, f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    for n in needles:
        assert n in p.stderr, (n, p.stderr)


# -- the run directory --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [
    ["--hf-checkpoint", "/nonexistent/model"],
    ["--load", "EMPTY"],
    ["--load", "/nonexistent/ckpt"],
    ["--save-hf", "USERDIR"],
])
def test_a_run_that_fails_its_checks_changes_nothing(tmp_path, bad):
    run = finished_run(tmp_path / "run")
    (tmp_path / "empty").mkdir()
    user = tmp_path / "user"
    user.mkdir()
    (user / "mine.txt").write_text("a user's file")
    bad = [str(tmp_path / "empty") if b == "EMPTY" else str(user) if b == "USERDIR" else b for b in bad]
    before = snapshot(run), snapshot(user)
    p = train("--run-dir", str(run), *bad)
    assert_refused(p, bad[0])
    assert (snapshot(run), snapshot(user)) == before
    assert "Traceback" not in p.stderr


def test_run_dir_that_holds_a_users_files_is_refused(tmp_path):
    for sub in ("logs", "tensorboard", "traces"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "keep.txt").write_text(sub)
    (tmp_path / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    p = train("--run-dir", ".", cwd=tmp_path)
    assert_refused(p, "--run-dir .", "not a slime-actors run directory", "logs/, tensorboard/, traces/",
                   "and 1 other entries", "Nothing was changed")
    assert snapshot(tmp_path) == before


def test_a_directory_of_other_files_is_used_and_its_files_left_alone(tmp_path):
    """A directory without the marker that holds none of the names a run writes is marked and used; a later new run
    there clears only what runs wrote."""
    from slime_actors.run_dir import MARKER, inspect_run_dir, prepare_run_dir
    (tmp_path / "ckpt" / "iter_0000002").mkdir(parents=True)
    (tmp_path / "ckpt" / "iter_0000002" / "meta.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("mine")
    assert inspect_run_dir(tmp_path) == "new"
    prepare_run_dir(tmp_path)
    (tmp_path / "logs").mkdir()  # as a run writes it
    (tmp_path / "metrics.jsonl").write_text("{}")
    prepare_run_dir(tmp_path)
    assert set(snapshot(tmp_path)) == {MARKER, "notes.txt", "ckpt/iter_0000002/meta.json"}


def test_a_new_run_clears_only_its_own_state(tmp_path):
    from slime_actors.run_dir import MARKER, prepare_run_dir
    run = finished_run(tmp_path / "run")
    (run / "my_notes.txt").write_text("mine")
    (run / "hf").mkdir()
    (run / "hf" / "model.safetensors").write_bytes(b"w")
    for live in ("buffer", "sockets", "keys", "weights"):
        (run / live).mkdir()
        (run / live / "x").write_text("x")
    prepare_run_dir(run, resume=False)
    left = snapshot(run)
    assert set(left) == {MARKER, "my_notes.txt", "hf/model.safetensors", "ckpt/iter_0000002/meta.json"}


def test_a_resumed_run_archives_the_attempt_and_keeps_the_history(tmp_path):
    from slime_actors.run_dir import prepare_run_dir
    run = finished_run(tmp_path / "run")
    (run / "buffer").mkdir()
    (run / "buffer" / "log.msgpack").write_bytes(b"old")
    prepare_run_dir(run, resume=True)
    left = snapshot(run)
    assert not (run / "buffer").exists() and not (run / "traces").exists() and not (run / "job.json").exists()
    for kept in ("metrics.jsonl", "alarms.jsonl", "curves.png", "tensorboard/events.out.tfevents.1.host.1.0",
                 "ckpt/iter_0000002/meta.json"):
        assert kept in left, kept
    assert left["attempts/1/traces/controller-0.1.trace"] == b"traces/controller-0.1.trace"
    assert left["attempts/1/logs/controller-0.jsonl"] == b"logs/controller-0.jsonl"
    assert left["attempts/1/metrics.jsonl"] == left["metrics.jsonl"]
    prepare_run_dir(run, resume=True)
    assert not (run / "attempts" / "2").exists()  # nothing new to archive: no empty attempt


def test_a_run_directory_of_an_earlier_version_is_adopted(tmp_path):
    from slime_actors.run_dir import MARKER, inspect_run_dir, prepare_run_dir
    run = finished_run(tmp_path / "run")
    (run / MARKER).unlink()
    assert inspect_run_dir(run) == "legacy"
    prepare_run_dir(run)
    assert (run / MARKER).is_file() and not (run / "metrics.jsonl").exists()
    (run / "job.json").write_text('{"something": "else"}')
    (run / MARKER).unlink()
    from slime_actors.run_dir import RunDirError
    with pytest.raises(RunDirError, match="not a slime-actors run directory"):
        inspect_run_dir(run)


def test_paths_where_a_run_clears_its_state_are_refused(tmp_path):
    run = tmp_path / "run"
    p = train("--run-dir", str(run), "--save", str(run / "logs" / "ckpt"), "--save-interval", "1")
    assert_refused(p, "--save", "which a run clears")
    assert not run.exists()


# -- --load ---------------------------------------------------------------------------------------------------------

def test_load_refuses_what_is_not_a_checkpoint_of_this_layout(tmp_path):
    run = tmp_path / "run"
    cases = {}
    cases["slime"] = (fake_megatron_checkpoint(tmp_path / "slime"), ["Megatron/slime checkpoint", "iter_0000019",
                                                                     "slime-actors convert", "expected"])
    cases["release"] = (fake_megatron_checkpoint(tmp_path / "release_ckpt", "release"),
                        ["a converted model (release)", "slime-actors convert"])
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"w")
    cases["hf"] = (hf, ["a Hugging Face model directory", "pass it as --hf-checkpoint"])
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "weights.npz").write_bytes(b"w")
    cases["unknown"] = (odd, ["holds weights.npz", "expected"])
    torn = tmp_path / "torn"
    (torn / "iter_0000004" / "trainer").mkdir(parents=True)
    cases["torn"] = (torn, ["iter_0000004 without meta.json", "interrupted"])
    for name, (path, needles) in cases.items():
        p = train("--run-dir", str(run), "--load", str(path))
        assert_refused(p, f"--load {path}", *needles)
        assert not run.exists(), name


def test_load_refuses_a_checkpoint_of_the_other_backend(tmp_path):
    ckpt = tmp_path / "ckpt"
    it = ckpt / "iter_0000002"
    (it / "trainer" / "dist").mkdir(parents=True)
    (it / "trainer" / "dist" / ".metadata").write_bytes(b"x")
    (it / "meta.json").write_text(json.dumps({"next_rollout_id": 2, "weight_version": 2}))
    (ckpt / "latest_checkpointed_iteration.txt").write_text("2")
    p = train("--run-dir", str(tmp_path / "run"), "--load", str(ckpt))
    assert_refused(p, "written by the megatron backend", "--train-backend torch")


def test_load_equal_to_save_starts_fresh_while_empty(tmp_path):
    from slime_actors.checkpoints import CheckpointError, resolve_load
    from slime_actors.config import parse_config
    base = ["--config", str(CONFIG)]
    ck = tmp_path / "ck"
    assert resolve_load(parse_config(base + ["--load", str(ck), "--save", str(ck)])) is None
    ck.mkdir()
    assert resolve_load(parse_config(base + ["--load", str(ck), "--save", str(ck)])) is None
    with pytest.raises(CheckpointError, match="empty directory"):
        resolve_load(parse_config(base + ["--load", str(ck), "--save", str(tmp_path / "other")]))


# -- --save, --save-hf, --ref-load ------------------------------------------------------------------------------------

def test_save_into_another_tools_checkpoints_is_refused(tmp_path):
    slime = fake_megatron_checkpoint(tmp_path / "slime")
    before = snapshot(slime)
    p = train("--run-dir", str(tmp_path / "run"), "--save", str(slime), "--save-interval", "1")
    assert_refused(p, f"--save {slime}", "Megatron/slime", "latest_checkpointed_iteration.txt")
    assert snapshot(slime) == before


def test_save_hf_never_writes_over_a_model_or_a_users_directory(tmp_path):
    from slime_actors.models.tiny import make_tiny_model
    model = make_tiny_model(tmp_path / "model")
    before = snapshot(model)
    p = train("--run-dir", str(tmp_path / "run"), "--hf-checkpoint", str(model), "--save-hf", str(model))
    assert_refused(p, "is the --hf-checkpoint directory")
    p = train("--run-dir", str(tmp_path / "run"), "--save-hf", str(tmp_path / "hf" / "{rollout}"))
    assert_refused(p, "bad format", "{rollout_id}")
    (tmp_path / "hf" / "0000000").mkdir(parents=True)
    (tmp_path / "hf" / "0000000" / "x.txt").write_text("mine")
    p = train("--run-dir", str(tmp_path / "run"), "--save-hf", str(tmp_path / "hf" / "{rollout_id:07d}"))
    assert_refused(p, "not an export of slime-actors", "x.txt")
    assert snapshot(model) == before and not (tmp_path / "run").exists()


def test_ref_load_in_megatron_format_is_refused(tmp_path):
    slime = fake_megatron_checkpoint(tmp_path / "ref", "release")
    p = train("--run-dir", str(tmp_path / "run"), "--ref-load", str(slime), "--use-kl-loss", "--kl-loss-coef", "0.1")
    assert_refused(p, "--ref-load", "expected a Hugging Face model directory", "slime-actors convert")


def test_export_replaces_only_its_own_directories(tmp_path):
    import torch

    from slime_actors.backends.hf_export import export_hf
    from slime_actors.checkpoints import CheckpointError
    from slime_actors.models.tiny import make_tiny_model
    model = make_tiny_model(tmp_path / "model")
    out = tmp_path / "out"
    w = {"model.norm.weight": torch.ones(4)}
    export_hf(w.items(), out, model, {"rollout_id": 3})
    marker = json.loads((out / ".slime-actors-export").read_text())
    assert marker["rollout_id"] == 3 and (out / "config.json").exists() and (out / "tokenizer.json").exists()
    assert not (out / "slime_tiny.json").exists()
    export_hf({"model.norm.weight": torch.zeros(4)}.items(), out, model)  # an export of ours: replaced
    from safetensors.torch import load_file
    assert torch.equal(load_file(out / "model.safetensors")["model.norm.weight"], torch.zeros(4))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    (out / ".slime-actors-export").unlink()
    consumed = []

    def gen():
        for k, v in w.items():
            consumed.append(k)
            yield k, v
    with pytest.raises(CheckpointError, match="not an export of slime-actors"):
        export_hf(gen(), out, model)
    assert consumed == list(w)  # consumed anyway: it may be a collective other ranks iterate
    with pytest.raises(CheckpointError, match="source model directory"):
        export_hf(w.items(), model, model)
    assert os.path.exists(model / "model.safetensors")


def test_a_node_agent_that_arrives_first_marks_the_run_dir_for_the_head(tmp_path):
    """Another host's agent may start before the head and write keys/ and traces/ at once: it marks a new run
    directory (the head then treats it as ours), refuses a user's, and never clears anything."""
    from slime_actors.run_dir import MARKER, RunDirError, inspect_run_dir, join_run_dir
    run = tmp_path / "run"
    join_run_dir(run)
    (run / "traces").mkdir()
    (run / "traces" / "agent-1.1.trace").write_bytes(b"t")
    assert (run / MARKER).is_file() and inspect_run_dir(run) == "ours"
    join_run_dir(run)
    assert (run / "traces" / "agent-1.1.trace").exists()
    user = tmp_path / "user"
    (user / "logs").mkdir(parents=True)
    with pytest.raises(RunDirError, match="logs/"):
        join_run_dir(user)
    assert not (user / MARKER).exists()


def test_a_run_directory_in_use_by_a_running_job_is_refused(tmp_path):
    """A second job in a running job's run directory cleared its sockets, keys and buffer log under it (the first
    then hung); now the second is refused and the first is untouched."""
    import socket
    import time

    from slime_actors.run_dir import run_in_use
    d = finished_run(tmp_path / "run")
    assert run_in_use(d) is None                                   # no head.json
    # a live process of ours on this host (its command line names the package), as the running job's head
    def started(p: subprocess.Popen, says: str) -> subprocess.Popen:   # (until exec, a child's cmdline is ours)
        t0 = time.monotonic()
        while says not in Path(f"/proc/{p.pid}/cmdline").read_bytes().decode(errors="replace"):
            assert time.monotonic() - t0 < 20, "the child never started"
            time.sleep(0.01)
        return p

    head = started(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "slime_actors.launch.head"]),
                   "slime_actors.launch.head")
    try:
        (d / "head.json").write_text(json.dumps({"pid": head.pid, "host": socket.gethostname()}))
        why = run_in_use(d)
        assert why == (f"--run-dir {d} is in use by a running job (its head: pid {head.pid} on this host); stop it "
                       "first (Ctrl-C where it runs) or give another --run-dir. Nothing was changed")
        before = snapshot(d)
        assert_refused(train("--run-dir", str(d)), why)
        assert snapshot(d) == before
    finally:
        head.kill()
        head.wait()
    assert run_in_use(d) is None                                   # it ended: a new run may clear it
    for hostile in ("[1]", '{"pid": "x"}', '{"pid": -1}', "{"):       # not what a head writes: never trusted
        (d / "head.json").write_text(hostile)
        assert run_in_use(d) is None
    # a pid reused by another program
    other = started(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]), "time.sleep")
    try:
        (d / "head.json").write_text(json.dumps({"pid": other.pid, "host": socket.gethostname()}))
        assert run_in_use(d) is None
    finally:
        other.kill()
        other.wait()
    # a head on another host: its status written in the last 30 s says it runs
    (d / "head.json").write_text(json.dumps({"pid": 1, "host": "node-7"}))
    now = time.time()
    (d / "status.json").write_text(json.dumps({"state": "running", "time": now - 3}))
    assert run_in_use(d, now=now).startswith(f"--run-dir {d} is in use by a running job (its head on node-7, its "
                                             "status written 3 s ago); stop it first")
    assert run_in_use(d, now=now + 60) is None                     # stale: that head is gone
    (d / "status.json").write_text(json.dumps({"state": "finished", "time": now}))
    assert run_in_use(d, now=now) is None
