"""The benchmarks run and print their tables (bench/mailbox.py, bench/trace_cost.py, bench/allocator_rss.py), and
refuse bad options with a message naming what is allowed. No figure is checked against a target here: these machines
are shared and noisy, and targets belong to the benchmarks' own output (docs/performance.md)."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.split("|")[1:-1]]


def test_mailbox_bench_prints_every_figure_and_ratio():
    p = _run("bench/mailbox.py", "--quick", "--no-ray")
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    header = next(ln for ln in out.splitlines() if ln.startswith("| figure"))
    assert _cells(header)[1:6] == ["raw pyzmq", "uvloop floor", "slime trace on", "slime trace off", "Ray"], header
    for row in ("ask round trip, small body (µs)", "pipelined one-way msgs/s", "16 MiB array round trip (ms)"):
        line = next(ln for ln in out.splitlines() if ln.startswith(f"| {row} |"))
        cells = _cells(line)[1:6]
        assert all(re.fullmatch(r"[\d,.]+", c) for c in cells[:4]) and cells[4] == "—", line  # no Ray
    for ratio in ("slime (trace on) / raw", "slime (trace off) / raw", "throughput on / off"):
        line = next(ln for ln in out.splitlines() if ratio in ln)
        # three rounds, paired: the median of the per-round ratios and their range
        assert re.search(r"\| \d+\.\d\dx \(\d+\.\d\d–\d+\.\d\d\) \|", line), line
        assert re.search(r"\| (PASS|MISS|BORDERLINE \([12]/3 rounds\)) \|$", line), line
    for ratio in ("uvloop floor / raw", "slime (trace on) / uvloop floor"):  # shown, not judged
        line = next(ln for ln in out.splitlines() if ratio in ln)
        assert re.search(r"\| \d+\.\d\dx \(.*\) \| — \|  \|$", line), line
    assert "Ray / slime" in out and "SKIP" in out and "note: Ray skipped (--no-ray)" in out
    assert "command:" in out and "date:" in out


def test_mailbox_bench_verdicts_from_per_round_ratios():
    spec = importlib.util.spec_from_file_location("bench_mailbox", ROOT / "bench" / "mailbox.py")
    bench = importlib.util.module_from_spec(spec)  # (the stdlib has a module named mailbox)
    spec.loader.exec_module(bench)
    s = {("on", "rtt"): [110.0, 120.0, 100.0], ("raw", "rtt"): [100.0, 80.0, 100.0],
         ("ray", "rtt"): [900.0, 700.0]}
    rs = bench.ratios(s, ("on", "rtt"), ("raw", "rtt"))
    assert rs == [1.1, 1.5, 1.0]  # paired round by round, not a ratio of medians (110/100)
    assert bench.verdict(rs, 1.3, "≤") == "BORDERLINE (2/3 rounds)"
    assert bench.verdict(rs, 1.6, "≤") == "PASS"
    assert bench.verdict(rs, 1.05, "≤") == "MISS"  # the median (1.1) misses
    assert bench.verdict([0.95, 0.85, 0.92], 0.9, "≥") == "BORDERLINE (2/3 rounds)"
    assert bench.verdict([], 0.9, "≥") == "SKIP"
    # Ray runs after the others: its ratio is of medians, one value
    assert bench.ratios(s, ("ray", "rtt"), ("on", "rtt")) == [800.0 / 110.0]
    assert bench.ratios(s, ("loop", "rtt"), ("raw", "rtt")) == []


def test_mailbox_bench_runs_only_the_variants_asked_for():
    p = _run("bench/mailbox.py", "--quick", "--no-ray", "--variants", "raw,off", "--pin", "none")
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("| ask round trip"))
    raw, loop, on, off = _cells(line)[1:5]
    assert re.fullmatch(r"[\d,.]+", raw) and loop == on == "—" and re.fullmatch(r"[\d,.]+", off), line
    assert "not pinned" in next(ln for ln in p.stdout.splitlines() if ln.startswith("rounds:"))
    line = next(ln for ln in p.stdout.splitlines() if "uvloop floor / raw" in ln)
    assert "| n/a | — |" in line, line


def test_mailbox_bench_refuses_bad_options():
    p = _run("bench/mailbox.py", "--variants", "raw,foo")
    assert p.returncode == 2 and "--variants takes raw, loop, on, off" in p.stderr and "foo" in p.stderr
    p = _run("bench/mailbox.py", "--pin", "0,99999")
    assert p.returncode == 2 and "--pin takes two of the CPUs this process may use" in p.stderr


def test_trace_cost_bench_prints_its_table():
    p = _run("bench/trace_cost.py", "--tells", "2000", "--rounds", "2", "--repeats", "1")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {ln.split("|")[1].strip(): ln.split("|")[2].strip() for ln in p.stdout.splitlines()
            if ln.startswith("| ") and not ln.startswith("| receiver")}
    assert float(rows["untraced"]) > 0 and float(rows["traced"]) > 0
    assert "of the traced message" in rows["tracing's share"] and "target >= 0.9x" in \
        rows["throughput on / off if the receiver's Python were all"]
    # the async handler's table: traced with and without the actor's schedule (replay's task order)
    assert float(rows["traced, schedule not recorded"]) > 0
    assert "ns a step" in rows["the schedule's share"] and "without the schedule" in rows["throughput on / off"]
    p = _run("bench/trace_cost.py", "--clock", "cpu")
    assert p.returncode == 2 and "invalid choice: 'cpu'" in p.stderr


def test_allocator_rss_bench_prints_both_settings():
    p = _run("bench/allocator_rss.py", "--arrays", "4", "--repeats", "1")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("| 0 ") or ln.startswith("| 256 ")]
    assert [r.split("|")[1].strip() for r in rows] == ["0 (glibc defaults)", "256 (default)"], p.stdout
    for r in rows:
        start, busy, peak, after = (int(c) for c in r.split("|")[2:6])
        assert 0 < start <= peak and busy <= peak and after > 0, r


def test_array_tells_bench_prints_its_table():
    p = _run("bench/array_tells.py", "--sizes", "65536,1048576", "--bytes", str(4 << 20), "--rounds", "1")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [ln for ln in p.stdout.splitlines() if re.match(r"\| [\d,]+ KiB \|", ln)]
    assert len(rows) == 2, p.stdout
    for ln in rows:
        cells = [c.strip() for c in ln.split("|")[1:-1]]
        assert all(float(c.replace(",", "")) > 0 for c in cells[2:]), ln
    p = _run("bench/array_tells.py", "--sizes", "big")
    assert p.returncode == 2 and "--sizes takes byte counts" in p.stderr
    for bad in (["--sizes", "2"], ["--rounds", "0"], ["--bytes", "0"]):
        p = _run("bench/array_tells.py", *bad)
        assert p.returncode == 2 and "--sizes must be >= 4 bytes each, --rounds and --bytes >= 1" in p.stderr, bad


def test_retriever_bench_prints_its_table():
    p = _run("bench/retriever.py", "--seconds", "0.5", "--people", "60", "--share-rollouts", "1", timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [_cells(ln) for ln in p.stdout.splitlines() if ln.startswith("| 60 |")]
    assert [(r[1], r[2]) for r in rows] == [("1", "1"), ("32", "1"), ("32", "8")], p.stdout
    assert all(float(r[4]) > 0 for r in rows)
    # the search job's row: its episodes searched (some), and the searches took a share of their time
    share = json.loads(p.stderr.strip().splitlines()[-1])["share"]
    assert share["episodes"] >= 128 and share["searching_episodes"] >= 1, share
    assert share["searches_s"] > 0 and 0 < share["mean_share_searching"] < 1, share
    assert "the retriever's share of a rollout" in p.stdout


def test_sandbox_bench_prints_its_table():
    """bench/sandbox.py, small: every row has both rates, the ratio and every program passed (sandbox and bare)."""
    p = _run("bench/sandbox.py", "--programs", "6", "--concurrency", "1", "4", "--train-steps", "0")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [_cells(ln) for ln in p.stdout.splitlines() if ln.startswith(("| stdio |", "| assert |"))]
    assert [(r[0], r[1]) for r in rows] == [("stdio", "1"), ("stdio", "4"), ("assert", "1"), ("assert", "4")]
    for r in rows:
        assert all(re.fullmatch(r"[\d.]+", c) for c in (r[2], r[3], r[5], r[6])), r
        assert re.fullmatch(r"[\d.]+x", r[4]) and r[7] == "6/6, 6/6", r
    assert "sandbox layers:" in p.stdout


def test_generate_requests_bench_prints_both_ways_and_checks_their_answers_agree():
    """bench/generate_requests.py, small: a row per way of sending, each with three figures; the answers of the two
    ways were compared (the bench asserts it every round, so a difference fails the run)."""
    p = _run("bench/generate_requests.py", "--groups", "3", "--group", "4", "--rounds", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [_cells(ln) for ln in p.stdout.splitlines() if ln.startswith(("| per sample |", "| one request per group |"))]
    assert [r[0] for r in rows] == ["per sample", "one request per group"], p.stdout
    assert all(re.fullmatch(r"[\d.]+", c) for r in rows for c in r[1:]), rows
    assert "checked every round" in p.stdout


def test_entropy_memory_bench_prints_both_ways():
    """bench/entropy_memory.py, small: a row per way, each a number of MiB (the entropies of the two ways are
    compared by the bench itself: a difference fails the run)."""
    p = _run("bench/entropy_memory.py", "--rows", "64", "--vocab", "1024", "--rounds", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [_cells(ln) for ln in p.stdout.splitlines() if ln.startswith(("| all rows", "| a chunk"))]
    assert len(rows) == 2 and all(re.fullmatch(r"-?\d+", r[1]) for r in rows), p.stdout
    assert "checked" in p.stdout


def test_entropy_memory_bench_runs_an_update_each_way(tmp_path):
    """bench/entropy_memory.py --update, on CPU with the tiny model: one GRPO update per way in a process of its
    own; the entropy metric the same both ways (the bench checks it), memory n/a off a GPU."""
    from slime_actors.models.tiny import make_tiny_model
    model = make_tiny_model(tmp_path / "m")
    p = _run("bench/entropy_memory.py", "--update", str(model), "--device", "cpu", "--samples", "8", "--rounds", "1",
             timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [_cells(ln) for ln in p.stdout.splitlines() if ln.startswith(("| all rows", "| a chunk"))]
    assert len(rows) == 2 and all(r[1] == "n/a (CPU)" and re.fullmatch(r"[\d.]+", r[3]) for r in rows), p.stdout
    assert "the entropy metric the same both ways" in p.stdout


def test_head_memory_bench_prints_both_settings(tmp_path):
    """bench/head_memory.py, on CPU with the tiny model: a row per setting (the whole logits, the head a chunk at a
    time), each with its numbers, and the same first loss both ways."""
    from slime_actors.models.tiny import make_tiny_model
    model = make_tiny_model(tmp_path / "m")
    p = _run("bench/head_memory.py", "--model", str(model), "--samples", "8", "--micro-batch", "4", "--updates", "1",
             "--repeats", "1", timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {_cells(ln)[0]: _cells(ln)[1:] for ln in p.stdout.splitlines() if ln.startswith(("| logits", "| chunked"))}
    assert set(rows) == {"logits", "chunked"}, p.stdout
    assert p.stdout.startswith("# the training forward's head: whole logits against chunks on CPU ("), p.stdout
    assert all(re.fullmatch(r"-?[\d.]+", c) for r in rows.values() for c in r), rows
    assert abs(float(rows["logits"][-1]) - float(rows["chunked"][-1])) < 1e-4, rows


def test_buffer_step_bench_prints_every_part_and_refuses_bad_options():
    p = _run("bench/buffer_step.py", "--steps", "1", "--groups", "2", "--group", "2", "--tokens", "8")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {_cells(ln)[0]: _cells(ln)[1:] for ln in p.stdout.splitlines() if ln.startswith("| ") and "---" not in ln}
    for part in ("start_rollout", "get_work", "submit", "wait_rollout", "get_batch", "encode batch", "decode batch",
                 "mark_trained", "in all"):
        assert re.fullmatch(r"\d+\.\d\d", rows[part][0]), (part, rows[part])
    assert rows["submit"][1] == "2" and rows["get_batch"][1] == "1"   # a submit per group
    for part in ("wait_rollout answered (the controller: the trainers start)",
                 "a rank's shard answered (wait_batch, asked ahead)"):   # (--burst: the last 2 groups together)
        assert re.fullmatch(r"\d+\.\d\d", rows[part][0]), (part, rows.get(part))
    p = _run("bench/buffer_step.py", "--steps", "0", "--chat", "--burst", "-1")
    assert p.returncode == 2 and "--steps must be at least 1, got 0" in p.stderr and "--chat reads --prompts" in p.stderr
    assert "--burst must be 0 or more, got -1" in p.stderr, p.stderr


def test_rollout_group_bench_prints_each_stage_both_ways_and_refuses_bad_options(tmp_path):
    """bench/rollout_group.py with the tiny model's tokenizer: a row per stage of a group's answer, the decoding both
    ways (the same text checked), and bad options refused naming each."""
    from slime_actors.models.tiny import make_tiny_model
    model = make_tiny_model(tmp_path / "m")
    p = _run("bench/rollout_group.py", "--tokenizer", str(model), "--group", "2", "--tokens", "8", "--rounds", "1",
             "--reps", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {_cells(ln)[0]: _cells(ln)[1:] for ln in p.stdout.splitlines() if ln.startswith("| ") and "---" not in ln}
    assert rows["stage"] == ["decode", "decode_text"], rows
    for stage in ("parse the answer", "record the answers", "episodes", "finish (decode)", "score ask body",
                  "submit body", "**in all**"):
        assert all(re.fullmatch(r"\**\d+\**", c) for c in rows[stage]), (stage, rows.get(stage))
    assert "decoded to the same text both ways: yes" in p.stdout, p.stdout
    p = _run("bench/rollout_group.py", "--tokenizer", str(model), "--group", "0", "--reps", "-1")
    assert p.returncode == 2 and "--group must be at least 1, got 0" in p.stderr, p.stderr
    assert "--reps must be at least 1, got -1" in p.stderr, p.stderr


def test_rl_bodies_bench_prints_the_bodies_and_the_batch_both_ways():
    """bench/rl_bodies.py, one round: a row per body (the packed batch among them), then the trainer's batch as
    lists and packed at two response lengths, then a group's score ask whole and without its token lists, each row
    with its numbers."""
    p = _run("bench/rl_bodies.py", "--rounds", "1", timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("| ") and not ln.startswith("| body")
            and not ln.startswith("| response")]
    bodies, ways, scores = rows[:6], rows[6:10], rows[10:]
    assert any("packed as the trainer asks" in r for r in bodies) and len(ways) == 4 and len(scores) == 4
    assert [r.split("|")[2].strip() for r in ways] == ["lists", "packed", "lists", "packed"]
    assert [r.split("|")[2].strip() for r in scores] == ["whole", "without token lists"] * 2
    for r in ways + scores:
        assert all(float(c.replace(",", "")) >= 0 for c in r.split("|")[3:-1]), r
    # (the lean score body is smaller: bytes, not time)
    assert int(scores[1].split("|")[3].replace(",", "")) < int(scores[0].split("|")[3].replace(",", "")) / 2



def test_http_answers_bench_prints_each_answer_both_ways():
    p = _run("bench/http_answers.py", "--requests", "5", "--rounds", "1")
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("| ")]
    assert _cells(lines[0]) == ["answer", "resp.read() (µs)", "read_answer (µs)", "read_answer / read()"]
    assert [_cells(ln)[0] for ln in lines[1:]] == ["68 KB, Content-Length", "68 KB, chunked", "68 KB, gzip",
                                                   "4 MB, Content-Length"]
    for ln in lines[1:]:
        assert re.fullmatch(r"[\d,.]+ \| [\d,.]+ \| \d+\.\d\dx", " | ".join(_cells(ln)[1:])), ln
    assert _run("bench/http_answers.py", "--rounds", "0").returncode == 2


def test_rollout_tail_bench_prints_both_ways():
    """bench/rollout_tail.py, small: one round each way, four processes each; the answers waited for their turns
    with the client as it is, never with one turn (what the way changes), and the refusals of bad options."""
    p = _run("bench/rollout_tail.py", "--rounds", "1", "--groups", "4", "--burst", "3", "--every-ms", "1")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {_cells(ln)[0]: _cells(ln)[1:] for ln in p.stdout.splitlines() if ln.startswith(("| turns", "| one turn"))}
    assert set(rows) == {"turns", "one turn"}, p.stdout
    for cells in rows.values():
        for cell in cells[:2]:
            assert re.fullmatch(r"\d+\.\d \(\d+\.\d-\d+\.\d\)", cell), cells
    assert rows["one turn"][2] == "0", p.stdout
    bad = _run("bench/rollout_tail.py", "--rounds", "0", "--burst", "20", "--score-ms", "-1")
    assert bad.returncode == 2, bad.stderr
    assert "--rounds must be at least 1" in bad.stderr and "--burst 20 is more than --groups 16" in bad.stderr \
        and "--score-ms must be 0 or more" in bad.stderr, bad.stderr


def test_stack_dumps_bench_prints_both_ways_and_the_live_dump_leaves_the_process_running():
    """bench/stack_dumps.py, small: a row per way of asking; the dump from Python (SIGUSR2) kills no process
    (faulthandler's row is printed, not checked: its crash is a race)."""
    p = _run("bench/stack_dumps.py", "--tries", "1", "--asks", "20")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {_cells(ln)[0]: _cells(ln) for ln in p.stdout.splitlines() if ln.startswith(("| faulthandler", "| from"))}
    assert set(rows) == {"faulthandler (SIGUSR1, `--native`)", "from Python (SIGUSR2, the default)"}, p.stdout
    assert rows["from Python (SIGUSR2, the default)"][1:] == ["0 of 1", "20", "-", "-"], p.stdout


def test_reply_latency_bench_prints_both_ways_from_the_traces():
    """bench/reply_latency.py, small: one round each way; every figure comes from the two actors' traces."""
    p = _run("bench/reply_latency.py", "--rounds", "1", "--groups", "4")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {_cells(ln)[0]: _cells(ln)[1:] for ln in p.stdout.splitlines() if ln.startswith(("| as is", "| polled"))}
    assert set(rows) == {"as is", "polled"}, p.stdout
    for cells in rows.values():
        for transit in cells[:2]:
            # (a transit can be a few us below zero: the sender stamps its `send` record once the send is done, and
            # the receiver on another core may read the message first)
            assert re.fullmatch(r"-?\d+\.\d\d / -?\d+\.\d\d / -?\d+\.\d\d", transit), cells
        assert re.fullmatch(r"\d+\.\d \(\d+\.\d-\d+\.\d\)", cells[2]), cells
    bad = _run("bench/reply_latency.py", "--rounds", "0", "--poll-ms", "0")
    assert bad.returncode == 2, bad.stderr
    assert "--rounds must be at least 1" in bad.stderr and "--poll-ms must be above 0" in bad.stderr, bad.stderr
