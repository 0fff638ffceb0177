"""`slime-actors trace ...` on the recorded runs checked in under tests/data/recordings/ (made by tests/data/recordings/record.sh), and on
corrupt, truncated and old-version trace files: every command answers with one clear line, never a traceback.

tests/data/recordings/small       GRPO on the digits task, partial-credit reward, lr 3e-3, 3 steps
tests/data/recordings/high-lr     the same job with lr 1.0 (the trainer diverges after its first update)
tests/data/recordings/slow-reward a reward function that sleeps 0.2 s whenever the answer is 9, 2 steps
"""

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from slime_actors.cli import main
from slime_actors.mailbox.codec import header_as_dict
from slime_actors.traces.query import steps
from slime_actors.traces.reader import TraceRun

ROOT = Path(__file__).resolve().parents[1]
RECORDINGS = ROOT / "tests" / "data" / "recordings"   # made by tests/data/recordings/record.sh
SMALL, HIGH_LR, SLOW = RECORDINGS / "small", RECORDINGS / "high-lr", RECORDINGS / "slow-reward"


@pytest.fixture
def cli(capsys):
    def run(*args):
        rc = main([str(a) for a in args])
        out, err = capsys.readouterr()
        assert "Traceback" not in err, err
        return rc, out, err
    return run


def test_recordings_are_small_and_readable():
    total = sum(p.stat().st_size for p in RECORDINGS.rglob("*.trace.gz"))
    assert 0 < total < 400_000, total
    for d in (SMALL, HIGH_LR, SLOW):
        run = TraceRun(d)
        assert run.problems == []
        assert {"controller/0", "buffer/0", "rollout/0", "reward/0", "trainer/0"} <= set(run.actors())
        assert all(f.meta["version"] >= 1 and f.meta["actor_class"] for f in run.files if "actor_class" in f.meta)


# ------------------------------------------------------------------------------------------------------ summary
def test_summary_finds_the_slow_reward_function(cli):
    rc, out, _ = cli("trace", "summary", SLOW)
    assert rc == 0
    rows = {tuple(line.split()[:2]): line.split() for line in out.splitlines() if line.startswith(("reward", "buffer"))}
    score = rows[("reward", "score")]
    assert int(score[3]) == 8 and int(score[5]) == 0  # 2 steps x 4 groups, no errors
    handle_p50, handle_p95, handle_p99 = float(score[9]), float(score[10]), float(score[11])
    assert handle_p50 < 50 and handle_p99 >= handle_p95 >= handle_p50  # most groups are quick ...
    slow = out.split("slowest messages")[1].splitlines()[1:6]
    assert not any("get_work" in line for line in slow)  # long polls are left out
    # ... one sleeps 0.2 s (its label is 9): the reward worker's slowest (as the doc narrows it)
    rc, out, _ = cli("trace", "summary", SLOW, "--role", "reward")
    slow = out.split("slowest messages")[1].splitlines()[1:6]
    assert float(slow[0].split()[0]) >= 195 and "reward.score" in slow[0], slow
    # the same numbers as JSON, for scripts
    rc, out, _ = cli("trace", "summary", SLOW, "--role", "reward", "--json")
    data = json.loads(out)
    assert [d["method"] for d in data] == ["_peer_down", "score"]
    assert data[1]["handle_ms"]["max"] >= 195 and data[1]["handle_ms"]["p50"] < 50 and data[1]["asks"] == 8


def test_summary_of_one_step(cli):
    run = TraceRun(SMALL)
    st = steps(run)
    assert sorted(st) == [0, 1, 2] and all(s.start_ns < s.end_ns for s in st.values())
    # (rollouts 1 and 2 were made ahead, held, while the step before trained: their steps start when they open)
    held = sorted(m.send.body()["rollout_id"] for m in run.messages().values() if m.method == "start_rollout"
                  and m.send is not None and m.send.body().get("hold"))
    assert held == [1, 2]
    assert st[0].end_ns <= st[1].start_ns <= st[1].end_ns <= st[2].start_ns
    rc, out, _ = cli("trace", "summary", SMALL, "--step", "1")
    assert rc == 0 and "step 1:" in out.splitlines()[0]
    train = next(line.split() for line in out.splitlines() if line.startswith("trainer") and " train " in line)
    assert int(train[3]) == 1  # one train ask in the step
    rc, _, err = cli("trace", "summary", SMALL, "--step", "7")
    assert rc == 2 and "no step 7" in err and "0..2" in err


# ------------------------------------------------------------------------------------------------------ show
def test_show_decodes_bodies_and_filters(cli):
    rc, out, _ = cli("trace", "show", SLOW, "--actor", "reward/0", "--method", "score", "--events", "recv",
                     "--full")
    assert rc == 0
    lines = out.splitlines()
    assert "8 record(s)" in lines[0]
    heads = [line for line in lines[1:] if not line.startswith("    ")]
    bodies = [json.loads(line.strip()) for line in lines[1:] if line.startswith("    ")]
    assert len(heads) == len(bodies) == 8 and all("recv  ask  <- rollout/0  score" in h for h in heads)
    assert all(len(b["samples"]) == 4 and "prompt_tokens" in b["samples"][0] for b in bodies)
    labels = {s["label"] for b in bodies for s in b["samples"]}
    assert "9" in labels

    # a time window: every record shown lies in it
    run = TraceRun(SLOW)
    t0 = min(f.meta["started_ns"] for f in run.files)
    rc, out, _ = cli("trace", "show", SLOW, "--since", "3", "--until", "+60.5s", "--no-body", "--json")
    recs = [json.loads(x) for x in out.splitlines()]
    assert recs and all(3 <= r["t"] <= 60.5 for r in recs)   # (the recorded run lasts ~7 s)
    assert all(r["header"]["kind"] != "hb" for r in recs if r["header"])  # heartbeats only when asked for
    # inputs recorded for replay, by name
    rc, out, _ = cli("trace", "show", SLOW, "--actor", "rollout/0", "--method", "engine.generate", "--limit", "3")
    assert rc == 0 and out.count("input  engine.generate  key=") == 3 and '"output_ids"' in out
    assert t0 > 0


def test_show_one_message_and_errors(cli):
    run = TraceRun(SMALL)
    m = next(m for m in run.messages().values() if m.method == "get_batch")
    rc, out, _ = cli("trace", "show", SMALL, "--id", m.id, "--no-body")
    assert rc == 0
    kinds = sorted(line.split()[2] for line in out.splitlines()[1:])
    assert kinds == ["handled", "recv", "recv", "send", "send"]  # ask sent+received, handled, reply sent+received
    rc, _, err = cli("trace", "show", SMALL, "--actor", "nobody/3")
    assert rc == 2 and "no actor 'nobody/3'" in err and "reward/0" in err
    rc, _, err = cli("trace", "show", SMALL, "--since", "yesterday")
    assert rc == 2 and "cannot read time 'yesterday'" in err
    rc, _, err = cli("trace", "show", SMALL, "--events", "sent")
    assert rc == 2 and "unknown event kind" in err


def test_show_fields_tells_the_diverging_trainer_apart(cli):
    def entropies(run):
        rc, out, _ = cli("trace", "show", run, "--actor", "trainer/0", "--method", "train", "--events", "send",
                         "--fields", "entropy,grad_norm", "--json")
        assert rc == 0
        recs = [json.loads(line) for line in out.splitlines()]
        assert all(set(r["body"]) == {"entropy", "grad_norm"} for r in recs)
        return [r["body"]["entropy"] for r in recs]
    small, high = entropies(SMALL), entropies(HIGH_LR)
    assert len(small) == len(high) == 3 and small[0] == high[0]  # the same first step
    assert min(small) > 3.0 and high[1] < 1.0 and high[2] < 1e-6  # lr 1.0: the policy collapses


# ------------------------------------------------------------------------------------------------------ chain
def test_chain_walks_causes_and_effects(cli):
    run = TraceRun(SMALL)
    msgs = run.messages()
    train = next(m for m in msgs.values() if m.method == "train" and m.header["kind"] == "ask")
    get_batch = next(m for m in msgs.values() if m.method == "get_batch" and m.header.get("parent") == train.id)
    # from the effect: the train ask that caused it comes first
    rc, out, _ = cli("trace", "chain", SMALL, get_batch.id)
    assert rc == 0
    up = out.split("caused by:")[1].split("this message:")[0]
    assert f"id={train.id}" in up and "controller/0 -> trainer/0  ask  train" in up
    assert f"id={get_batch.id}" in out.split("this message:")[1]
    assert '"rank": 0' in out and '"tokens"' in out  # the request and reply bodies
    # from the cause: what it led to
    rc, out, _ = cli("trace", "chain", SMALL, train.id)
    down = out.split("caused (")[1]
    assert f"id={get_batch.id}" in down and "trainer/0 -> buffer/0  ask  get_batch" in down
    # a reply's id names its ask
    rc, out, _ = cli("trace", "chain", SMALL, train.reply.id)
    assert rc == 0 and f"{train.reply.id} is the reply to {train.id}" in out
    rc, _, err = cli("trace", "chain", SMALL, "0123456789abcdef")
    assert rc == 2 and "no message with id" in err
    rc, _, err = cli("trace", "chain", SMALL, "ab")
    assert rc == 2 and "too short" in err
    rc, _, err = cli("trace", "chain", SMALL, train.id[:8])  # every id of that process starts so
    assert rc == 2 and "ambiguous" in err


def rewrite(path: Path, edit) -> None:
    """Rewrite a (gzip) trace file, calling edit(record, decoded header) on every record with a header."""
    data = gzip.decompress(path.read_bytes())
    up = msgpack.Unpacker(raw=False, strict_map_key=False)
    up.feed(data)
    head, recs = up.unpack(), list(up)
    for rec in recs:
        if rec[2] and rec[0] not in ("step", "resume"):  # (a schedule record's header is a call's name)
            edit(rec, header_as_dict(msgpack.unpackb(rec[2], raw=False)))
    path.write_bytes(gzip.compress(msgpack.packb(head) + b"".join(msgpack.packb(r, use_bin_type=True)
                                                                    for r in recs)))


# ------------------------------------------------------------------------------------------------------ diff
def test_diff_of_a_run_with_itself_and_with_a_changed_copy(cli, tmp_path):
    rc, out, _ = cli("trace", "diff", SMALL, SMALL)
    assert rc == 0 and "no divergence" in out
    # change one reward in a copy (in the reward worker's file and the rollout worker's, as a changed reward
    # function would): diff names that message and field
    copy = tmp_path / "copy"
    shutil.copytree(SMALL, copy)
    target = {}

    def edit(rec, h):
        if h.get("kind") == "reply" and h.get("method") == "score" and h["id"] == target.setdefault("id", h["id"]):
            body = msgpack.unpackb(rec[3], raw=False)
            body["rewards"][2] = 0.75
            rec[3] = msgpack.packb(body, use_bin_type=True)
            rec[4] = len(rec[3])
            target["re"] = h["re"]
    for path in (next(copy.glob("reward-0.*.trace.gz")), next(copy.glob("rollout-0.*.trace.gz"))):
        rewrite(path, edit)
    rc, out, _ = cli("trace", "diff", SMALL, copy)
    assert rc == 1
    first = out.split("first divergence:")[1]
    assert "rollout/0 -> reward/0 ask score" in first and "reply field rewards[2]" in first and "vs 0.75" in first
    assert f"B: id {target['re']}" in first and target["re"]


def test_diff_takes_the_two_run_directories_as_one(cli, tmp_path):
    """Two runs of one config write to two run directories, and the controller's checkpoint asks name them as its
    process reached them (the launcher resolves a relative --run-dir; the trace header's runtime says where): that
    is no divergence."""
    reached = TraceRun(SMALL).meta("controller/0")["runtime"]["run_dir"]
    assert reached.endswith("small")
    elsewhere = reached[:-len("small")] + "again"   # (the same length: msgpack's string sizes stay right)
    copy = tmp_path / "copy"
    copy.mkdir()
    named = 0
    for path in SMALL.glob("*.trace.gz"):
        data = gzip.decompress(path.read_bytes())
        named += data.count(reached.encode())
        (copy / path.name).write_bytes(gzip.compress(data.replace(reached.encode(), elsewhere.encode())))
    assert named > 7  # every header, and the save asks' paths
    rc, out, _ = cli("trace", "diff", SMALL, copy, "--atol", "1e-6")
    assert rc == 0 and "no divergence" in out, out


def test_diff_finds_where_the_high_learning_rate_run_parts_ways(cli):
    # (--atol 1e-6: the trainer's step-0 log-prob gap to the engine may differ by a float32 ulp, ~1e-8, between two
    # processes; that is not where the runs part ways)
    rc, out, _ = cli("trace", "diff", SMALL, HIGH_LR, "--atol", "1e-6")
    assert rc == 1
    assert "config differs" in out and "lr: 0.003 -> 1.0" in out
    # step 0 is the same in both runs (same weights, same seeds): the divergence is in what the updated policy
    # generates in step 1
    run = TraceRun(SMALL)
    st = steps(run)
    t0 = min(f.meta["started_ns"] for f in run.files)
    first = out.split("first divergence:")[1].splitlines()[0]
    at = float(first.split(" at +")[1].split("s in A")[0])
    assert (st[1].start_ns - t0) / 1e9 <= at <= (st[1].end_ns - t0) / 1e9, (first, st)
    assert "engine.generate" in first
    assert "first message that differs: rollout/0 -> reward/0 ask score" in out


# ------------------------------------------------------------------------------------------------------ export
def test_export_is_valid_trace_event_json_with_flows(cli, tmp_path):
    out_path = tmp_path / "run.json"
    rc, out, _ = cli("trace", "export", SMALL, "-o", out_path)
    assert rc == 0 and "ui.perfetto.dev" in out
    data = json.loads(out_path.read_text())
    ev = data["traceEvents"]
    run = TraceRun(SMALL)
    names = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names.values()) == sorted(run.actors())  # one track per actor
    assert len(set(names)) == len(names)
    slices: dict = {}
    for e in ev:
        if e["ph"] == "X":
            assert e["dur"] > 0 and e["pid"] in names
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for lane in slices.values():  # slices on one thread never overlap
        lane.sort()
        assert all(a[1] <= b[0] for a, b in zip(lane, lane[1:]))
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert starts and set(starts) == set(ends)

    def inside(e):
        return any(a < e["ts"] < b for a, b in slices.get((e["pid"], e["tid"]), ()))

    for fid, s in starts.items():
        f = ends[fid]
        assert f["bp"] == "e" and s["cat"] == f["cat"] and s["name"] == f["name"]
        assert inside(s) and inside(f), (s, f)  # each end binds to the slice around it
    msgs = run.messages()
    requests = [m for m in msgs.values() if m.header["kind"] in ("tell", "ask") and m.send and m.recv]
    replies = [m for m in requests if m.reply is not None and m.reply_sent is not None]
    assert len(starts) == len(requests) + len(replies)
    # a window: only that step
    rc, out, _ = cli("trace", "export", SMALL, "-o", tmp_path / "step.json", "--step", "1")
    step = json.loads((tmp_path / "step.json").read_text())
    assert 0 < sum(1 for e in step["traceEvents"] if e["ph"] == "X") < sum(1 for e in ev if e["ph"] == "X")


# ------------------------------------------------------------------------------------------------------ timeline
def test_timeline_png_of_one_step(cli, tmp_path):
    png = tmp_path / "step.png"
    rc, out, _ = cli("trace", "timeline", SLOW, "--step", "1", "-o", png)
    assert rc == 0 and "handled message(s)" in out
    raw = png.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n" and len(raw) > 20_000
    import matplotlib.image
    img = matplotlib.image.imread(png)
    assert img.shape[0] > 300 and img.shape[1] > 1200
    rc, _, err = cli("trace", "timeline", SLOW, "--step", "5", "-o", tmp_path / "x.png")
    assert rc == 2 and "no step 5" in err and not (tmp_path / "x.png").exists()


# ------------------------------------------------------------------------------------------------------ bad files
def _header(version=2, **kw) -> bytes:
    return msgpack.packb({"format": "slime-actors-trace", "version": version, "actor": "reward/0", "pid": 1,
                          "started_ns": 1, **kw})


def _real_trace() -> bytes:
    return gzip.decompress(next(SMALL.glob("reward-0.*.trace.gz")).read_bytes())


def _boundaries(data: bytes) -> list[int]:
    up = msgpack.Unpacker(raw=False, strict_map_key=False)
    up.feed(data)
    out = []
    while True:
        try:
            up.unpack()
        except msgpack.OutOfData:
            return out
        out.append(up.tell())


_REQ = msgpack.packb({"v": 1, "kind": "ask", "id": "a1", "trace": "t1", "from": "client/0", "to": "reward/0",
                      "method": "score", "seq": 1, "ts": 1.0})

BAD = {
    "empty.trace": (lambda: b"", "file is empty"),
    "garbage.trace": (lambda: b"\xc1\xc1 this is not msgpack", "expected a trace header map"),
    "json.trace": (lambda: b'{"format": "slime-actors-trace"}', "not a slime-actors trace"),
    "old.trace": (lambda: _header(version=0), "version 0 is not supported"),
    "future.trace": (lambda: _header(version=99), "written by a newer slime-actors"),
    "record.trace": (lambda: _header() + msgpack.packb("hello"), "expected a record [event, time_ns"),
    "event.trace": (lambda: _header() + msgpack.packb(["sned", 1, None, None, 0, None, None, None]),
                    "expected an event name"),
    "header.trace": (lambda: _header() + msgpack.packb(["send", 1, b"\xc1", None, 0, None, None, None]),
                     "record header is not msgpack"),
    "broken.trace.gz": (lambda: b"\x1f\x8b\x08\x00garbage", "expected a gzip-compressed trace file"),
    "outcome.trace": (lambda: _header(version=3) + msgpack.packb(["recv", 1, _REQ, None, 0, None, None,
                                                                   {"ok": "soon"}]), "expected extra.ok"),
    "twice.trace": (lambda: _header(version=3) + msgpack.packb(["recv", 1, _REQ, None, 0, None, None,
                                                                 {"ok": [2, 1], "handled": {"outcome": "ok"}}]),
                    "carries its outcome once"),
    "dur.trace": (lambda: _header(version=4) + msgpack.packb(["recv", 1, _REQ, None, 0, None, None, None, -1]),
                  "expected the outcome field dur_ns as an int >= 0"),
    "sent.trace": (lambda: _header(version=4) + msgpack.packb(["send", 1, _REQ, None, 0, None, None, None, 1]),
                   "only a recv record carries an outcome"),
    "both.trace": (lambda: _header(version=4) + msgpack.packb(["recv", 1, _REQ, None, 0, None, None,
                                                                {"ok": [2, 1]}, 1]), "carries its outcome once"),
    "ten.trace": (lambda: _header(version=4) + msgpack.packb(["recv", 1, _REQ, None, 0, None, None, None, 2, 1]),
                  "expected a record [event, time_ns"),
    # the schedule (version 5): a step names no call, a resume the call it resumed from; both name their task
    "step.trace": (lambda: _header(version=5) + msgpack.packb(["step", 1, b"ask", b"m:1", 0, None, None, None]),
                   "expected a step record"),
    "resume.trace": (lambda: _header(version=5) + msgpack.packb(["resume", 1, b"", b"m:1", 0, None, None, None]),
                     "expected a resume record"),
    "task.trace": (lambda: _header(version=5) + msgpack.packb(["step", 1, b"", None, 0, None, None, None]),
                   "expected a step record"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_trace_files_are_reported_clearly_by_every_command(cli, tmp_path, name):
    make, expected = BAD[name]
    d = tmp_path / "run"
    d.mkdir()
    (d / name).write_bytes(make())
    commands = [("summary", d), ("show", d), ("chain", d, "0123456789abcdef"), ("diff", d, SMALL),
                ("export", d, "-o", tmp_path / "o.json"), ("timeline", d, "--step", "0", "-o", tmp_path / "o.png")]
    for cmd in commands:
        rc, out, err = cli("trace", *cmd)
        assert rc == 2, (cmd, out, err)
        assert err.startswith("slime-actors: error: bad trace file:") and str(d / name) in err, err
        assert expected in err and "at byte" in err, err
    rc, _, err = cli("replay", d, "--actor", "reward/0")
    assert rc == 2 and expected in err
    # --skip-bad reads what is readable and names the rest
    shutil.copy(next(SMALL.glob("reward-0.*.trace.gz")), d)
    rc, out, err = cli("trace", "summary", d, "--skip-bad")
    assert rc == 0 and "reward" in out and f"skipped: {d / name}" in err


def test_a_synchronously_handled_request_reads_as_recv_and_handled_in_every_form(tmp_path):
    """Version 4's outcome field [..., dur_ns], version 3's {"ok": [t, dur]} and version 2's
    {"handled": {...}} give the same two events."""
    from slime_actors.traces.reader import read_file
    long_form = ["recv", 10, _REQ, b"\x80", 1, None, None, {"handled": {"outcome": "ok", "dur_ns": 10, "t": 20}}]
    short_form = ["recv", 10, _REQ, b"\x80", 1, None, None, {"ok": [20, 10]}]
    fields_form = ["recv", 10, _REQ, b"\x80", 1, None, None, None, 10]
    got = []
    for version, rec in ((2, long_form), (3, short_form), (4, fields_form)):
        f = tmp_path / f"v{version}.trace"
        f.write_bytes(_header(version=version) + msgpack.packb(rec, use_bin_type=True))
        got.append([(e.ev, e.t_ns, e.id, e.extra) for e in read_file(f).events])
    assert got[0] == got[1] == got[2] == [("recv", 10, "a1", None),
                                          ("handled", 20, "a1", {"outcome": "ok", "dur_ns": 10})]


def test_offsets_point_at_the_bad_record(cli, tmp_path):
    data = _real_trace()
    cut = _boundaries(data)[10]
    bad = data[:cut] + b"\xc1" + data[cut:]  # 0xc1 is never valid msgpack
    (tmp_path / "mid.trace").write_bytes(bad)
    rc, _, err = cli("trace", "summary", tmp_path / "mid.trace")
    assert rc == 2 and f"at byte {cut}: expected a trace record, could not decode" in err
    # a body that is not msgpack is found when it is decoded
    up = msgpack.Unpacker(raw=False, strict_map_key=False)
    up.feed(data)
    head = up.unpack()
    recs, offsets = [], []
    pos = up.tell()
    for rec in up:
        recs.append(rec)
        offsets.append(pos)
        pos = up.tell()
    i = next(i for i, r in enumerate(recs) if r[0] == "recv" and r[3])
    recs[i][3] = b"\xc1\xc1"
    (tmp_path / "body.trace").write_bytes(msgpack.packb(head) + b"".join(msgpack.packb(r, use_bin_type=True)
                                                                        for r in recs))
    rc, _, err = cli("trace", "show", tmp_path / "body.trace")
    assert rc == 2 and f"at byte {offsets[i]}: expected a msgpack body in this recv record" in err


def test_a_truncated_file_is_read_up_to_the_cut(cli, tmp_path):
    data = _real_trace()
    bounds = _boundaries(data)
    (tmp_path / "cut.trace").write_bytes(data[: bounds[-1] - 5])  # the last record loses its tail
    rc, out, err = cli("trace", "summary", tmp_path / "cut.trace")
    assert rc == 0 and "reward" in out
    assert f"at byte {bounds[-2]}: ends mid-record" in err
    run = TraceRun(tmp_path / "cut.trace")
    assert len(run.files[0].events) + len(run.files[0].schedule) >= len(bounds) - 2


def test_missing_run_and_console_script(tmp_path):
    exe = Path(sys.executable).parent / "slime-actors"
    res = subprocess.run([str(exe), "trace", "show", str(tmp_path / "nothing")], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "no such run directory" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run([str(exe), "trace", "summary", str(SMALL)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "NO_COLOR": "1"})
    assert res.returncode == 0 and "reward      score" in res.stdout


def test_the_writer_declares_the_newest_version_it_writes(tmp_path):
    """A file's header names the version of the records in it (older readers would misread newer records)."""
    from slime_actors.traces.reader import SUPPORTED
    from slime_actors.recorder.writer import TRACE_VERSION, TraceWriter
    assert TRACE_VERSION == max(SUPPORTED) == 6
    w = TraceWriter(tmp_path / "a.trace", "reward/0")
    w.close()
    meta = next(iter(msgpack.Unpacker(open(tmp_path / "a.trace", "rb"), raw=False)))
    assert meta["version"] == TRACE_VERSION


# ----------------------------------------------------------------------------------- replies waiting for their asker
def _ev(offset, t, ev, kind, mid, to="reward/0", method="score", re=None):
    from slime_actors.traces.reader import Event
    h = {"kind": kind, "id": mid, "to": to, "from": "rollout/0", "method": method, **({"re": re} if re else {})}
    return Event("rollout/0", ev, t, h, None, 0, None, None, None, "f", offset)


def test_reply_waits_read_from_the_askers_schedule():
    """A reply's wait for its asker's loop: from its recv record to the asking task's next `resume ask` step. A
    step's record comes after the events it made; a send outside any recorded step, a step that resumed from
    something else, and asks to the directory (made inside other asks) are not counted."""
    from types import SimpleNamespace

    from slime_actors.traces.reader import Step, TraceFile
    from slime_actors.traces.summary import render, reply_waits
    events = [
        _ev(1, 1000, "send", "ask", "a1"),                                   # task A's ask, in its step (t=900)
        _ev(3, 1100, "send", "ask", "b1", method="other"),                   # made between steps: nobody's
        _ev(5, 1300, "send", "ask", "d1", to="directory/0", method="lookup"),  # task C's, to the directory
        _ev(7, 1400, "send", "ask", "e1", method="third"),                   # task E's
        _ev(9, 2000, "recv", "reply", "r1", re="a1"),                        # A's reply read at t=2000 ...
        _ev(10, 2100, "recv", "reply", "r2", re="b1"),
        _ev(11, 2200, "recv", "reply", "r3", re="d1"),
        _ev(12, 2300, "recv", "reply", "r4", re="e1"),
    ]
    events.insert(1, _ev(1, 950, "send", "ask", None, to=7))  # a hostile header (no id, a number for `to`): skipped
    schedule = [
        Step(2, 900, "A", None),           # A's step that sent a1
        Step(4, 1200, "B", None),          # began after b1 was sent: not its sender
        Step(6, 1250, "C", None),          # sent d1
        Step(8, 1350, "E", None),          # sent e1
        Step(13, 5000, "A", "ask"),        # ... A resumes from its ask 3 ms after its reply was read
        Step(14, 6000, "C", "ask"),
        Step(15, 6000, "B", "ask"),
        Step(16, 6100, "E", "recorded_async"),   # E's next step is not the ask's resume: not counted ...
        Step(17, 7000, "E", "ask"),              # ... nor is a later one
    ]
    f = TraceFile(Path("f"), {"actor": "rollout/0"}, events, schedule=schedule)
    run = SimpleNamespace(files=[f])
    assert reply_waits(run) == {("rollout/0", "reward.score"): [0.003]}
    assert reply_waits(run, roles={"buffer"}) == {} and reply_waits(run, methods={"other"}) == {}
    assert reply_waits(run, since=2001) == {}
    text = render(SimpleNamespace(root="r", files=[f], actors=lambda: ["rollout/0"], problems=[]), rows=[],
                  loop_waits=reply_waits(run))
    assert "replies waiting for their asker's event loop" in text and "rollout/0  reward.score  n=1" in text, text


def test_summary_shows_how_long_replies_waited_for_their_asker(cli):
    rc, out, _ = cli("trace", "summary", SMALL)
    assert rc == 0
    section = out.split("replies waiting for their asker's event loop")[1]
    rows = {tuple(ln.split()[:2]): ln.split() for ln in section.splitlines()[1:] if ln.startswith("  ")}
    assert int(rows[("rollout/0", "reward.score")][2].removeprefix("n=")) == 11   # every score ask of the run
    assert not any(m.startswith("directory.") for _, m in rows)
    rc, out, _ = cli("trace", "summary", SMALL, "--role", "buffer")
    section = out.split("replies waiting for their asker's event loop")[1]
    assert "reward.score" not in section and "buffer." in section
