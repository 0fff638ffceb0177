"""bench/soak.py's arithmetic and its --render of saved samples (the long run itself is a bench, not a test)."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("soak", ROOT / "bench" / "soak.py")
soak = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(soak)


def samples(n=40):
    """A buffer growing 0.1 MiB a step (100 per 1,000 steps), a flat reward worker; 10 steps a sample."""
    return [{"t": 15.0 * i, "step": 10 * i,
             "procs": {"buffer/0": {"rss_mib": 300 + i, "open_files": 29, "threads": 9, "trace_mib": 0.5 * i},
                       "reward/0": {"rss_mib": 60.0, "open_files": 26, "threads": 7, "trace_mib": 0.2 * i}}}
            for i in range(n)]


def test_the_slope_is_per_thousand_steps_after_the_warmup():
    rows = {(r[0], r[1]): r for r in soak.table(samples(), 0.1)}
    name, metric, start, end, slope, n = rows[("buffer/0", "rss_mib")]
    assert slope == pytest.approx(100.0) and (start, end) == (304, 339) and n == 36
    assert rows[("reward/0", "rss_mib")][4] == pytest.approx(0.0)
    assert rows[("buffer/0", "trace_mib")][4] == pytest.approx(50.0)


def test_render_reads_saved_samples_and_a_window_of_steps(tmp_path, capsys):
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples()))
    assert soak.main(["--render", str(tmp_path)]) == 0
    table = (tmp_path / "table.md").read_text()
    assert "| buffer/0 | rss_mib | 304.0 | 339.0 | +100.000 |" in table
    assert soak.main(["--render", str(tmp_path), "--steps", "100:200"]) == 0
    part = (tmp_path / "table-100-200.md").read_text()
    assert "steps 100-200 only (11 samples" in part and "| buffer/0 | rss_mib | 310.0 | 320.0 | +100.000 |" in part


def test_bad_render_input_is_named(tmp_path, capsys):
    assert soak.main(["--render", str(tmp_path)]) == 1
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "samples.jsonl").write_text("{not json\n")
    assert soak.main(["--render", str(tmp_path)]) == 1
    assert "is not JSON lines" in capsys.readouterr().err
    for bad, why in ((["--steps", "1:2"], "--steps goes with --render"),
                     (["--render", str(tmp_path), "--steps", "9:x"], "--steps must be FIRST:LAST"),
                     (["--render", str(tmp_path), "--steps", "9:3"], "FIRST must be >= 0 and below LAST")):
        with pytest.raises(SystemExit):
            soak.main(bad)
        assert why in capsys.readouterr().err
