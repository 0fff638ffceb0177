"""`slime-actors replay`: one actor of a recorded run, built again from its trace header and fed its recorded
messages, produces the same messages -- and when its code changed, the report points at the first message that
differs.

One small RL run is recorded for the module (2 steps of the digits task, ~1 min on CPU) with its reward function in
a file of the test's own, so that a test can edit it afterwards. A second, synthetic recording (three actors in
this process) covers the virtual clock, recorded replies and inputs, and the network guard.
"""

import asyncio
import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest

from helpers import Echo, LoopThread
from slime_actors.actors.base import Actor, handler
from slime_actors.actors.directory import Directory
from slime_actors.cli import main
from slime_actors.mailbox import codec
from slime_actors.runtime import RuntimeConfig
from slime_actors.traces.reader import TraceRun
from slime_actors.traces.replay import replay

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent / "slime-actors"
FLAGS = ["--hf-checkpoint", "tiny:digits", "--prompt-data", "examples/digits/train.jsonl", "--input-key", "input",
         "--label-key", "label", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
         "--global-batch-size", "16", "--micro-batch-size", "16", "--rollout-max-response-len", "1",
         "--advantage-estimator", "grpo", "--lr", "3e-3", "--num-rollout", "2", "--heartbeat-interval", "2",
         "--use-tensorboard", "false", "--progress", "false"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    d = tmp_path_factory.mktemp("replay")
    rm = d / "my_reward.py"
    shutil.copy(ROOT / "examples" / "debugging" / "rewards.py", rm)
    run = d / "run"
    # (hack alarms on, as by default, and the debug data saved: the controller takes both while the trainers train,
    # and its replay must follow the same order)
    res = subprocess.run([str(BIN), "train", "--run-dir", str(run), *FLAGS, "--custom-rm-path",
                          f"{rm}:partial_credit", "--save-debug-rollout-data", str(d / "rollouts")], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    assert sorted(p.name for p in (d / "rollouts").iterdir()) == ["rollout_000000.msgpack", "rollout_000001.msgpack"]
    return run, rm


def _replay(run, actor, **kw):
    cwd = os.getcwd()
    os.chdir(ROOT)  # the recorded prompt data path is relative to where the job ran
    try:
        return replay(str(run), actor, **kw)
    finally:
        os.chdir(cwd)


@pytest.mark.slow  # the module's recorded run (~1 min)
def test_reward_and_buffer_replay_identically(recorded):
    run, _ = recorded
    for actor in ("reward/0", "buffer/0"):
        rep = _replay(run, actor)
        assert rep.identical, rep.render()
        assert rep.counts["inbound"] >= 8 and rep.counts["compared"] >= 8 and rep.counts["outcomes"] >= 8
        assert "identical:" in rep.render()
    assert rep.counts["inputs"] >= 2  # the buffer's clock readings (wait_rollout's seconds) came from the trace


@pytest.mark.slow  # the module's recorded run (~1 min)
def test_trainer_reproduces_its_loss_and_gradient_norm(recorded):
    run, _ = recorded
    rep = _replay(run, "trainer/0")
    assert rep.identical, rep.render()
    assert [s["rollout_id"] for s in rep.steps] == [0, 1]
    for s in rep.steps:
        for k in ("loss", "grad_norm", "entropy"):
            assert s["replayed"][k] == pytest.approx(s["recorded"][k], rel=1e-4, abs=1e-6)
    assert any(s["recorded"]["grad_norm"] > 0 for s in rep.steps)  # it did learn something to reproduce


@pytest.mark.slow  # the module's recorded run (~1 min)
def test_rollout_worker_replays_without_an_engine(recorded):
    run, _ = recorded
    rep = _replay(run, "rollout/0")
    assert rep.identical, rep.render()
    assert rep.counts["inputs"] >= 32  # every engine answer came from the trace (2 steps x 16 samples)
    assert rep.counts["replies"] >= 8


@pytest.mark.slow  # the module's recorded run (~1 min)
def test_every_other_actor_of_the_run_replays_identically(recorded):
    """The controller (its start-up rollback token is a recorded input), the directory and the launcher's agent;
    with the tests above, every actor of the run."""
    run, _ = recorded
    rest = sorted(set(TraceRun(run).actors()) - {"reward/0", "buffer/0", "trainer/0", "rollout/0"})
    assert rest == ["agent/0", "controller/0", "directory/0"]
    for actor in rest:
        rep = _replay(run, actor)
        assert rep.identical, rep.render()
        assert rep.counts["outcomes"] >= 2, rep.render()
    assert rep.counts["inputs"] >= 10  # the directory's clock readings (heartbeats, liveness)


RECORDINGS = ROOT / "tests" / "data" / "recordings"  # made by tests/data/recordings/record.sh; docs/debugging.md walks through them


def _same_on_any_machine(rep) -> None:
    """What a replay of a recording made on another machine must give: nothing but the trainer's floats may differ
    (it computes again, with this machine's kernels: their last bits are the machine's, docs/reproducibility.md);
    every message, field, outcome and step of the schedule is the recording's."""
    if rep.actor.startswith("trainer/"):
        assert rep.verdict in ("identical", "floats"), rep.render()
    else:
        assert rep.identical, rep.render()


@pytest.mark.slow  # ~30 s: every actor of one recording, and the doc's replays
def test_the_recordings_under_traces_replay_as_the_debugging_doc_says():
    """Every actor of tests/data/recordings/small replays with today's code as it ran (a change to a message or to what an actor
    computes makes this fail: then record them again, `bash tests/data/recordings/record.sh`, and update docs/debugging.md); the
    doc's replays give what it shows. The recordings may have been made on another machine than this one: the
    trainer's floats may differ in their last bits here, nothing else may."""
    for actor in TraceRun(RECORDINGS / "small").actors():
        rep = _replay(RECORDINGS / "small", actor)
        _same_on_any_machine(rep)
        assert rep.counts["compared"] + rep.counts["outcomes"] >= 3, rep.render()
    # section 1: the reward function without its slow path gives the same rewards; its handlers take fewer steps,
    # whose recorded turns are skipped (they are not a difference)
    rep = _replay(RECORDINGS / "slow-reward", "reward/0",
                  overrides={"custom_rm_path": "examples/debugging/rewards.py:partial_credit"})
    assert rep.identical, rep.render()
    assert any("ended sooner in the replay were skipped" in n for n in rep.notes), rep.notes
    # section 2: the diverging trainer reproduces itself (to the last bits of this machine's floats), and with the
    # old learning rate keeps its entropy
    rep = _replay(RECORDINGS / "high-lr", "trainer/0")
    _same_on_any_machine(rep)
    # (with --lr 1.0 the last bits grow: 0.9036 recorded, 0.924 replayed on another machine; the collapse stays)
    ent = [s["replayed"]["entropy"] for s in rep.steps]
    assert ent[0] > 3.5 and ent[1] < 1.5 and ent[2] < 0.01, ent
    rep = _replay(RECORDINGS / "high-lr", "trainer/0", overrides={"lr": 0.003, "critic_lr": 0.003})
    # the first difference: the entropy of the second update's reply (the policy keeps it); the largest: the
    # trainer's log-prob gap to the engine, whose recorded answers came from the collapsed policy
    first = rep.findings[0]
    assert not rep.identical and first.kind == "float" and "reply to train" in first.message, rep.render()
    assert first.diff.path == "entropy" and first.diff.b > 3.5, rep.render()
    assert rep.floats.max_rel > 0.5 and rep.floats.max_at[1] == "train_rollout_logprob_abs_diff", rep.render()
    assert [s["replayed"]["entropy"] > 3.5 for s in rep.steps] == [True, True, True]


def _first_changed_score(run):
    """The first score ask (in the reward worker's order) holding a wrong-digit response, and that sample's place."""
    tr = TraceRun(run)
    for e in tr.events("reward/0"):
        if e.ev == "recv" and e.kind == "ask" and e.method == "score":
            for i, s in enumerate(e.body()["samples"]):
                r = (s["response"] or "").strip()
                if r.isdigit() and r != s["label"]:
                    return e.id, i
    return None, None


@pytest.mark.slow  # the module's recorded run (~1 min)
def test_replay_points_at_the_message_an_edited_reward_function_changes(recorded):
    run, rm = recorded
    msg_id, index = _first_changed_score(run)
    assert msg_id is not None, "the recording has no wrong-digit answer to re-score"
    original = rm.read_text()
    try:
        rm.write_text(original.replace("return 0.2 if answer.isdigit() else 0.0",
                                       "return 0.5 if answer.isdigit() else 0.0"))
        res = subprocess.run([str(BIN), "replay", str(run), "--actor", "reward/0", "--json"], cwd=ROOT,
                             capture_output=True, text=True, timeout=600)
    finally:
        rm.write_text(original)
    assert res.returncode == 3, res.stderr[-3000:]  # nothing but float values differ, beyond the tolerance (0)
    rep = json.loads(res.stdout)
    assert rep["verdict"] == "floats" and not rep["within_tolerance"]
    first = rep["differences"][0]
    assert first["kind"] == "float"
    assert first["answers"] == msg_id  # the reply to exactly this ask is the first to change
    assert "reply to score" in first["message"]
    assert first["field"] == f"rewards[{index}]" and first["recorded"] == 0.2 and first["replayed"] == 0.5
    # and the readable report says the same
    res = subprocess.run([str(BIN), "replay", str(run), "--actor", "reward/0"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0 and "identical:" in res.stdout  # the function is back as it was


def _rewrite(src: Path, dst: Path, edit) -> None:
    data = src.read_bytes()
    if src.suffix == ".gz":
        data = gzip.decompress(data)
    up = msgpack.Unpacker(raw=False, strict_map_key=False)
    up.feed(data)
    head = up.unpack()
    out = []
    for rec in up:
        # (a schedule record's header is the call it resumed from, not a message header)
        h = codec.header_as_dict(msgpack.unpackb(rec[2], raw=False)) if rec[2] and rec[0] not in (
            "step", "resume") else {}
        out.extend(edit(rec, h))
    dst.write_bytes(msgpack.packb(head) + b"".join(msgpack.packb(r, use_bin_type=True) for r in out))


@pytest.mark.slow  # the module's recorded run (~1 min)
def test_a_recording_without_what_replay_needs_says_so(recorded, tmp_path, capsys):
    run, _ = recorded
    src = next((run / "traces").glob("buffer-0.*.trace"))
    copy = tmp_path / "cut"
    copy.mkdir()
    omitted = {}

    def drop_a_body(rec, h):
        if rec[0] == "recv" and h.get("method") == "submit" and h.get("kind") == "ask" and not omitted:
            omitted["id"], omitted["size"] = h["id"], rec[4]
            rec[3], rec[5] = None, "00000000"  # as if over the body limit: size and checksum only
        return [rec]
    _rewrite(src, copy / src.name, drop_a_body)
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        rc = main(["replay", str(copy), "--actor", "buffer/0"])
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    assert rc == 2
    stopped = out.split("replay stopped:")[1]
    assert f"submit from rollout/0 (id {omitted['id']})" in stopped
    assert "recorded by size and checksum only" in stopped and "SLIME_ACTORS_TRACE_BODY_LIMIT=65536" in stopped


@pytest.mark.slow  # the module's recorded run (~1 min)
def test_trainer_replays_from_the_batch_it_recorded_when_the_reply_was_too_large(recorded, tmp_path):
    run, _ = recorded
    src = next((run / "traces").glob("trainer-0.*.trace"))
    asks = set()

    def batch_as_input(keep_input):
        def edit(rec, h):
            if rec[0] == "send" and h.get("method") == "get_batch":
                asks.add(h["id"])
            if rec[0] == "recv" and h.get("kind") == "reply" and h.get("re") in asks:
                body = rec[3]
                rec[3], rec[5] = None, "00000000"
                extra = [["input", rec[1] + 1, None, body, len(body), None, None, {"name": "get_batch"}]]
                return [rec] + (extra if keep_input else [])
            return [rec]
        return edit

    for keep in (True, False):
        d = tmp_path / f"keep-{keep}"
        d.mkdir()
        _rewrite(src, d / src.name, batch_as_input(keep))
        rep = _replay(d, "trainer/0")
        if keep:
            assert rep.identical, rep.render()
            assert len(rep.steps) == 2
        else:
            assert not rep.identical and "the reply to get_batch" in rep.stopped
            assert "SLIME_ACTORS_TRACE_BODY_LIMIT" in rep.stopped


def _records(src: Path) -> tuple[bytes, list[int], list]:
    """A trace file's bytes, where each record ends, and the records."""
    data = src.read_bytes()
    if src.suffix == ".gz":
        data = gzip.decompress(data)
    up = msgpack.Unpacker(raw=False, strict_map_key=False)
    up.feed(data)
    ends, recs = [], []
    for rec in up:
        ends.append(up.tell())
        recs.append(rec)
    return data, ends, recs


def _cut(run: Path, actor: str, dst: Path, keep: int) -> Path:
    """A copy of the run's traces with `actor`'s file cut after its first `keep` records (the header is record 0):
    what a SIGKILL leaves (the trace writer writes in order; what it had not written is lost)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in (run / "traces").glob("*.trace"):
        data = f.read_bytes()
        if f.name.startswith(actor.replace("/", "-") + "."):
            _, ends, _ = _records(f)
            data = data[:ends[keep]]
        (dst / f.name).write_bytes(data)
    return dst


@pytest.mark.slow  # the module's recorded run (~1 min), ~20 replays of a few seconds
def test_a_cut_recording_replays_up_to_the_cut(recorded, tmp_path):
    """A process killed anywhere leaves a prefix of its trace: the replay follows it to its end and stops there,
    reporting nothing that lies past the cut (the sends of the step the kill interrupted, readings whose records
    were lost) as a difference."""
    run, _ = recorded
    for actor, points in (("rollout/0", 14), ("buffer/0", 4), ("controller/0", 4)):
        src = next((run / "traces").glob(actor.replace("/", "-") + ".*.trace"))
        _, ends, recs = _records(src)
        assert recs[-1][0] == "end"  # (the full recording: closed by its writer)
        n = len(ends) - 1
        for keep in sorted({max(1, n * k // points) for k in range(points)} | {n - 1, n - 3}):
            rep = _replay(_cut(run, actor, tmp_path / f"{actor.replace('/', '-')}-{keep}", keep), actor)
            assert rep.identical, f"cut after record {keep} of {n}:\n" + rep.render()
            assert rep.cut is not None and rep.cut["why"] == "killed", rep.render()
            assert any("ends without the actor being stopped" in x for x in rep.notes)


@pytest.mark.slow  # the module's recorded run (~1 min)
def test_what_a_killed_actor_lost_is_stated(recorded, tmp_path):
    """Its peers' traces hold what it sent in its last moments; its own trace lost it with the process: replay
    says how many and which, and does not count them as differences."""
    run, _ = recorded
    src = next((run / "traces").glob("rollout-0.*.trace"))
    _, ends, recs = _records(src)
    scores = [i for i, r in enumerate(recs) if isinstance(r, list) and r[0] == "send" and
              codec.header_as_dict(msgpack.unpackb(r[2], raw=False)).get("method") == "score"]
    keep = scores[-3] - 1  # the last three score asks reached the reward worker, but not this trace
    rep = _replay(_cut(run, "rollout/0", tmp_path / "cut", keep), "rollout/0")
    assert rep.identical, rep.render()
    assert rep.cut["lost_sends"] >= 3 and rep.cut["lost_by_method"].get("reward/0.score", 0) >= 3, rep.cut
    assert "its peers received from it are not in its trace" in rep.render()
    rep = _replay(run, "rollout/0")  # the whole recording: nothing lost, nothing cut
    assert rep.identical and rep.cut is None, rep.render()


@pytest.mark.slow  # the module's recorded run (~1 min)
def test_float_differences_are_told_from_logic_ones(recorded, tmp_path):
    """A float that differs in its last bits is a float-level difference, with its relative size and the
    environments compared; an int or a string that differs is a logic difference; `identical` is bit for bit."""
    run, _ = recorded
    src = next((run / "traces").glob("trainer-0.*.trace"))

    def tamper(kind):
        def edit(rec, h):
            if rec[0] == "send" and h.get("method") == "train" and h.get("kind") == "reply" and not done:
                body = msgpack.unpackb(rec[3], raw=False)
                if kind == "ulp":
                    import math
                    body["grad_norm"] = math.nextafter(body["grad_norm"], math.inf)
                else:
                    body["extra_field"] = "recorded only"
                rec[3] = msgpack.packb(body, use_bin_type=True)
                rec[4] = len(rec[3])
                done.append(1)
            if rec[0] == "input" and rec[7].get("name") == "environment" and kind == "ulp":
                env = msgpack.unpackb(rec[3], raw=False)
                env["threads"] = 97
                rec[3] = msgpack.packb(env, use_bin_type=True)
                rec[4] = len(rec[3])
            return [rec]
        return edit

    done: list = []
    d = tmp_path / "ulp"
    d.mkdir()
    _rewrite(src, d / src.name, tamper("ulp"))
    rep = _replay(d, "trainer/0")
    assert rep.verdict == "floats" and not rep.identical and rep.within_tolerance, rep.render()
    assert rep.floats.values == 1 and 0 < rep.floats.max_rel < 1e-6 and rep.floats.max_at[1] == "grad_norm"
    env = {k: (a, b) for k, a, b in rep.environment}
    assert env["torch.threads"][0] == 97, rep.environment
    assert "torch.threads '97' ->" in rep.render()
    assert main(["replay", str(d), "--actor", "trainer/0"]) == 0  # within the trainer's tolerance
    assert main(["replay", str(d), "--actor", "trainer/0", "--rtol", "0", "--atol", "0"]) == 3

    done.clear()
    d = tmp_path / "logic"
    d.mkdir()
    _rewrite(src, d / src.name, tamper("logic"))
    rep = _replay(d, "trainer/0")
    assert rep.verdict == "different" and rep.logic[0].diff.path == "extra_field", rep.render()


def test_a_reply_named_in_full_replies_is_kept_in_the_trace_over_the_body_limit(tmp_path):
    """The trainer's batch (get_batch's reply) is kept in the trace as it arrived, over the trace's body limit, up to
    SLIME_ACTORS_TRACE_BATCH_LIMIT: replay trains on it. Above that bound it is kept by size and checksum, and an
    input named after the method says why (replay reports it); another method's large reply, by size and checksum
    only, as ever."""
    from slime_actors.mailbox.mailbox import Mailbox
    from slime_actors.recorder.writer import TraceWriter
    from slime_actors.traces.reader import read_file

    writer = TraceWriter(tmp_path / "trainer-0.trace", "trainer/0", body_limit=200)
    replies = {"get_batch": {"tokens": [list(range(100))] * 4}, "huge": {"tokens": [list(range(100))] * 40},
               "other": {"tokens": [list(range(100))] * 4}}

    async def go():
        server, client = Mailbox("buffer/0"), Mailbox("trainer/0", tracer=writer)
        server.on_request = lambda inbound: server.reply_nowait(inbound, replies[inbound.header["method"]])
        ep = await server.bind(f"ipc://{tmp_path}/b.sock")
        await client.bind(f"ipc://{tmp_path}/t.sock")
        client.connect("buffer/0", ep)
        client.full_replies["get_batch"] = (4000, "over SLIME_ACTORS_TRACE_BATCH_LIMIT")
        client.full_replies["huge"] = (4000, "over SLIME_ACTORS_TRACE_BATCH_LIMIT")
        try:
            return [await client.ask("buffer/0", m, {}, timeout=10) for m in ("get_batch", "huge", "other")]
        finally:
            client.close()
            server.close()

    assert asyncio.run(go()) == list(replies.values())
    writer.close()
    tf = read_file(tmp_path / "trainer-0.trace")
    sent = {e.id: e.method for e in tf.events if e.ev == "send"}
    got = {sent[e.header["re"]]: e for e in tf.events if e.ev == "recv"}
    assert got["get_batch"].body_size > 200 and not got["get_batch"].omitted
    assert got["get_batch"].body() == replies["get_batch"]          # in full, as it came in
    assert got["huge"].omitted and got["other"].omitted             # over the bound; not named
    inputs = [(e.name, e.body()) for e in tf.events if e.ev == "input"]
    assert inputs == [("huge", {"__omitted__": True, "size": got["huge"].body_size,
                                "why": "over SLIME_ACTORS_TRACE_BATCH_LIMIT"})]


# ------------------------------------------------------------------------------------------------------ synthetic
class Sleeper(Actor):
    """Sleeps (virtual time on replay), reads a clock (a recorded input), asks a peer, and dials the network."""

    role = "sleeper"

    @handler
    async def nap(self, seconds: float) -> dict:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.sleep(seconds)
        return {"slept": round(loop.time() - t0, 1), "clock": self.recorded("clock", time.time)}

    @handler
    async def relay(self, x: int) -> int:
        return await self.ask("echo/1", "echo", {"x": x}, timeout=20) + 1

    @handler
    def dial(self, port: int) -> str:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return "connected"
        except OSError as exc:
            return f"failed: {type(exc).__name__}"


class Racer(Actor):
    """Two concurrent tasks whose order depends on the run's timing: one waits for thread work (0.3 s of real time,
    which a replay's virtual clock does not count), the other for a 0.1 s timer. In a run the timer's task goes
    first; on a virtual clock alone the thread's would."""

    role = "racer"

    @handler
    async def race(self) -> list:
        order = []

        async def thread_work():
            await self.run_blocking(time.sleep, 0.3)
            order.append("thread")

        async def timer():
            await asyncio.sleep(0.1)
            order.append("timer")
        await asyncio.gather(thread_work(), timer())
        if self.config.get("check"):  # (a version of the code with one more step: only in a replay, below)
            await self.run_blocking(sorted, order)
        return order


class Client(Actor):
    role = "client"


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("synthetic") / "run")
    os.makedirs(run_dir)
    lt = LoopThread()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    try:
        base = dict(run_dir=run_dir, curve=False, heartbeat_interval=0.5, liveness=30)
        directory = Directory(0)
        rt = RuntimeConfig(directory=lt.call(directory.start(RuntimeConfig(**base))), **base)
        actors = [Echo(1), Sleeper(0, note="built from this config"), Racer(0), Client(0)]
        for a in actors:
            lt.call(a.start(rt))
        client = actors[-1]

        async def script():
            naps = await asyncio.gather(*(client.ask("sleeper/0", "nap", {"seconds": s}, timeout=20)
                                          for s in (1.5, 1.0)))
            relayed = await client.ask("sleeper/0", "relay", {"x": 41}, timeout=20)
            dialed = await client.ask("sleeper/0", "dial", {"port": server.getsockname()[1]}, timeout=20)
            raced = await client.ask("racer/0", "race", timeout=20)
            return naps, relayed, dialed, raced

        out = lt.call(script(), timeout=60)
        for a in reversed(actors):
            lt.call(a.stop())
        lt.call(directory.stop())
        return run_dir, out
    finally:
        server.close()
        lt.close()


def test_replay_runs_on_recorded_time_with_recorded_replies(synthetic):
    run_dir, (naps, relayed, dialed, _) = synthetic
    assert [n["slept"] for n in naps] == [1.5, 1.0] and relayed == 42 and dialed == "connected"
    t0 = time.monotonic()
    rep = replay(run_dir, "sleeper/0")
    wall = time.monotonic() - t0
    assert wall < 2.0, wall  # 2.5 s of naps on the virtual clock
    assert rep.actor_class.endswith("test_replay:Sleeper")
    assert rep.counts["inbound"] >= 4 and rep.counts["replies"] == 1 and rep.counts["inputs"] == 2
    # the naps, the clock readings and the relayed answer are as recorded; only the dial differs: a replayed actor
    # cannot reach the network
    assert not rep.identical and len(rep.findings) == 1, rep.render()
    f = rep.findings[0]
    assert "reply to dial" in f.message and f.diff.a == "connected" and f.diff.b == "failed: ReplayNetworkError"
    assert any("tried to reach the network" in n for n in rep.notes)
    # with the network allowed (and the server gone) the failure is a real one
    rep = replay(run_dir, "sleeper/0", allow_network=True)
    assert rep.findings[0].diff.b == "failed: ConnectionRefusedError"


def test_replay_errors_are_clear(synthetic, capsys):
    run_dir, _ = synthetic
    assert main(["replay", run_dir, "--actor", "nobody/0"]) == 2
    assert "no trace file for 'nobody/0'" in capsys.readouterr().err
    assert main(["replay", run_dir, "--actor", "sleeper"]) == 2
    assert "expected ROLE/INDEX" in capsys.readouterr().err
    assert main(["replay", run_dir, "--actor", "sleeper/0", "--set", "x=1"]) == 2
    assert "no job flags" in capsys.readouterr().err


def test_a_recording_with_an_unknown_checksum_algorithm_is_refused(synthetic, tmp_path, capsys):
    import msgpack
    run_dir, _ = synthetic
    copy = tmp_path / "run"
    shutil.copytree(Path(run_dir) / "traces", copy / "traces")
    path = next((copy / "traces").glob("sleeper-0.*.trace"))
    data = path.read_bytes()
    up = msgpack.Unpacker(raw=False)
    up.feed(data)
    head = up.unpack()
    path.write_bytes(msgpack.packb({**head, "digest": "md5"}, use_bin_type=True) + data[up.tell():])
    assert main(["replay", str(copy), "--actor", "sleeper/0"]) == 2
    err = capsys.readouterr().err
    assert "checksums are 'md5'" in err and "xxh3_64" in err


def _racer_file(run_dir) -> Path:
    return next((Path(run_dir) / "traces").glob("racer-0.*.trace"))


def test_concurrent_tasks_replay_in_the_order_they_ran(synthetic):
    """The trace holds the racer's schedule -- which of its tasks ran when -- and replay follows it: the timer's task
    goes first as it did, although on the virtual clock alone the thread's task would (its 0.3 s of real work
    take no virtual time)."""
    run_dir, (*_, raced) = synthetic
    assert raced == ["timer", "thread"]
    from slime_actors.traces.reader import read_file
    tf = read_file(_racer_file(run_dir))
    tasks = [(s.task, s.resume) for s in tf.schedule]
    handler = next(t for t, _ in tasks if t.startswith("m:"))
    # the handler, then its two gather children (created in that order: .0 the thread's, .1 the timer's); the
    # thread's task resumed from run_blocking, after the timer's task ran its last step
    assert (f"{handler}.0", None) in tasks and (f"{handler}.1", None) in tasks
    assert tasks.index((f"{handler}.0", "run_blocking")) > max(i for i, (t, r) in enumerate(tasks)
                                                              if t == f"{handler}.1")
    rep = replay(run_dir, "racer/0")
    assert rep.identical, rep.render()
    assert rep.counts["compared"] >= 1  # (the reply to race among them)


class Impatient(Actor):
    """Asks a peer that answers after the ask timed out: the reply comes late, and the trace holds it."""

    role = "impatient"

    @handler
    async def probe(self) -> str:
        from slime_actors.mailbox.errors import AskTimeout
        try:
            # (a 2.2 s margin between the ask's timeout and the reply: a loaded machine's loop may run late)
            await self.ask("sleeper/0", "nap", {"seconds": 2.5}, timeout=0.3)
            return "answered"
        except AskTimeout:
            pass
        await asyncio.sleep(3.0)   # the late reply arrives (and is traced) meanwhile
        return "timed out"


def test_an_ask_that_timed_out_replays_as_a_timeout_although_its_reply_came_late(tmp_path):
    # a loaded CI machine: the controller's ask timed out, its reply came later, and the replay answered the ask with
    # it (the controller then took another path than it had: not identical). The mailbox marks a late reply's trace
    # record; the replay times that ask out as the run did.
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    lt = LoopThread()
    try:
        base = dict(run_dir=run_dir, curve=False, heartbeat_interval=0.5, liveness=30)
        directory = Directory(0)
        rt = RuntimeConfig(directory=lt.call(directory.start(RuntimeConfig(**base))), **base)
        actors = [Sleeper(0), Impatient(0), Client(0)]
        for a in actors:
            lt.call(a.start(rt))
        assert lt.call(actors[-1].ask("impatient/0", "probe", timeout=20), timeout=30) == "timed out"
        for a in reversed(actors):
            lt.call(a.stop())
        lt.call(directory.stop())
    finally:
        lt.close()
    tr = TraceRun(run_dir)
    late = [e for e in tr.events("impatient/0") if e.ev == "recv" and e.header.get("kind") == "reply"
            and (e.extra or {}).get("late")]
    assert len(late) == 1, "the late reply is traced, marked late"
    rep = replay(run_dir, "impatient/0")
    assert rep.identical, rep.render()
    assert rep.counts["replies"] == 0   # no recorded reply answered the replayed ask


def _without_schedule(src: Path, dst: Path, keep=lambda rec: False) -> None:
    """A copy of a trace file without its schedule records (but those `keep` keeps)."""
    data = src.read_bytes()
    up = msgpack.Unpacker(raw=False, strict_map_key=False)
    up.feed(data)
    head = up.unpack()
    out = [r for r in up if r[0] not in ("step", "resume") or keep(r)]
    dst.write_bytes(msgpack.packb(head) + b"".join(msgpack.packb(r, use_bin_type=True) for r in out))


def test_a_replay_that_cannot_follow_the_schedule_says_where_it_left_it(synthetic, tmp_path):
    """With the timer task's steps cut out of the recording, its turn never comes: replay names the task whose
    recorded step could not happen and where that task waits, then carries on as best it can."""
    run_dir, _ = synthetic
    src = _racer_file(run_dir)
    from slime_actors.traces.reader import read_file
    handler = next(s.task for s in read_file(src).schedule if s.task.startswith("m:"))
    (tmp_path / "traces").mkdir()
    _without_schedule(src, tmp_path / "traces" / src.name, keep=lambda r: r[3] != f"{handler}.1".encode())
    rep = replay(tmp_path, "racer/0")
    assert not rep.identical
    print(rep.render())
    first = rep.findings[0]
    assert first.what == "schedule" and "the replay left the recorded schedule" in first.message
    assert f"task {handler} ran here" in first.message and "still waiting at race" in first.message
    assert "schedule" in rep.render()


def test_a_recording_without_a_schedule_replays_with_a_note(synthetic, tmp_path):
    """A recording made before traces held the schedule (version 4) still replays; replay says the order of the
    actor's concurrent tasks is then the replay's own -- here the thread's task goes first on the virtual clock."""
    run_dir, _ = synthetic
    src = _racer_file(run_dir)
    (tmp_path / "traces").mkdir()
    _without_schedule(src, tmp_path / "traces" / src.name)
    rep = replay(tmp_path, "racer/0")
    assert any("holds no schedule" in n for n in rep.notes)
    assert not rep.identical
    d = rep.findings[0].diff
    assert (d.path, d.a, d.b) == ("[0]", "timer", "thread")


def test_a_task_that_takes_a_step_the_recording_does_not_have_is_named(synthetic, tmp_path):
    """Replayed with code that takes one more step (the racer's handler awaits thread work once more before it
    answers): replay names the task, the call and where in the actor's code it was made, then goes on without the
    schedule -- the handler still answers, as it did."""
    run_dir, _ = synthetic
    src = _racer_file(run_dir)
    up = msgpack.Unpacker(raw=False, strict_map_key=False)
    up.feed(src.read_bytes())
    head = up.unpack()
    head["config"] = {**head["config"], "check": True}
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / src.name).write_bytes(msgpack.packb(head) + b"".join(
        msgpack.packb(r, use_bin_type=True) for r in up))
    rep = replay(tmp_path, "racer/0")
    assert not rep.identical
    schedule = [f for f in rep.findings if f.what == "schedule"]
    assert len(schedule) == 1 and "returned from run_blocking in race (test_replay.py:" in schedule[0].message
    assert "a step the recording does not have" in schedule[0].message
    assert not [f for f in rep.findings if f.what != "schedule"], rep.render()  # the answer is the recorded one


@pytest.mark.parametrize("finalizer", ["__del__ of cyclic garbage", "__del__ of the last reference",
                                       "weakref.finalize"])
def test_a_task_a_finalizer_creates_mid_step_is_not_the_actors(finalizer):
    """openai's and anthropic's HTTP clients, left unclosed, `create_task(self.aclose())` when they are freed -- by
    the garbage collector, in the middle of whatever step runs then, at a point the process's allocation history
    decides. Such a task is not tracked: the stepping task's next child keeps the name it has in the recording,
    whose collections fell elsewhere (a rollout worker serving agents left its recorded schedule so: issue 30)."""
    import gc
    import weakref

    from slime_actors.actors import schedule

    class Client:   # what openai's AsyncHttpxClientWrapper.__del__ does
        def __init__(self, made):
            self.made = made

        def __del__(self):
            self.made.append(asyncio.get_running_loop().create_task(asyncio.sleep(0)))

    async def main():
        loop = asyncio.get_running_loop()
        schedule.install(loop)
        sched = schedule.Schedule(lambda ev, t, header, task: None, loop)
        made: list = []

        async def root():
            first = asyncio.ensure_future(asyncio.sleep(0))
            if finalizer == "weakref.finalize":
                c = Client([])
                weakref.finalize(c, lambda: made.append(loop.create_task(asyncio.sleep(0))))
                c.me = c
                del c
                gc.collect()
            elif finalizer == "__del__ of cyclic garbage":
                c = Client(made)
                c.me = c
                del c
                gc.collect()
            else:
                Client(made)   # freed at once
            second = asyncio.ensure_future(asyncio.sleep(0))
            await asyncio.gather(first, second, *made)
            return first, second

        first, second = await sched.task(root(), "start")
        return made, first, second
    made, first, second = asyncio.run(main())
    from slime_actors.actors.schedule import Stepper
    assert len(made) == 1 and not isinstance(made[0].get_coro(), Stepper), "the finalizer's task was tracked"
    assert (first.get_coro().id, second.get_coro().id) == ("start.0", "start.1")
