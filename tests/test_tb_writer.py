"""TensorBoard events without torch (slime_actors/tb_writer.py): what TensorBoard reads back, and the head's metric
sinks opening it without loading torch (issue 33: ~250 MiB and seconds of CPU at every start)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_scalars_text_and_purge_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from slime_actors.tb_writer import TensorBoardWriter
    w = TensorBoardWriter(str(tmp_path))
    for k in range(3):
        w.add_scalar("train/loss", 1.0 / (k + 1), k)
    w.add_text("rollout/samples", "**best** 1.0", 2)
    w.close()
    w = TensorBoardWriter(str(tmp_path), purge_step=1)    # a resumed run: what the crashed one logged from 1 on
    w.add_scalar("train/loss", 9.0, 1)
    w.close()
    ea = EventAccumulator(str(tmp_path))
    ea.Reload()
    assert [(e.step, round(e.value, 4)) for e in ea.Scalars("train/loss")] == [(0, 1.0), (1, 9.0)]
    text = ea.Tensors("rollout/samples/text_summary")
    assert [(t.step, t.tensor_proto.string_val) for t in text] == [(2, [b"**best** 1.0"])]
    meta = ea.SummaryMetadata("rollout/samples/text_summary")
    assert meta.plugin_data.plugin_name == "text"             # what TensorBoard's text tab reads


def test_the_heads_metric_sinks_do_not_import_torch(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from slime_actors.config import parse_config
        from slime_actors.metric_sinks import MetricSinks
        cfg = parse_config(["--config", {str(ROOT / "examples/digits/config.toml")!r}])
        sinks = MetricSinks(cfg, {str(tmp_path)!r}, None)
        sinks.open(None)
        assert sinks.tb is not None
        sinks.scalars({{"rollout_id": 0, "train/loss": 0.5}})
        sinks.samples(0, [{{"which": "best", "reward": 1.0, "prompt": "p", "response": "r"}}])
        sinks.close()
        print("torch" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"
