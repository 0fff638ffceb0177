"""Loading a checkpoint never runs code from it (issue 27, item 1): DCP's `.metadata` is read through an
allow-list of the classes torch.distributed.checkpoint and megatron-core store there, every other pickle a
checkpoint holds through torch's weights_only unpickler (safe_pickle.py). A hostile file -- its pickle
calls `os.system` -- is refused with an error naming the class and the file, and the command never runs (the marker
file it would create stays absent): through `slime-actors convert` (slime's iter_XXXXXXX/ layout and a bare
torch_dist directory), `--load` of a checkpoint of ours, and the backends' own load paths."""

from __future__ import annotations

import io
import json
import os
import random
import pickle
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

from slime_actors.safe_pickle import (UnsafeCheckpointError, check_torch_dist, load_torch_file,
                                               read_dcp_metadata)

BIN = Path(sys.executable).parent / "slime-actors"


class Evil:
    """Unpickling this runs a shell command that creates `marker`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def dcp_save(path: Path, state: dict, **kw) -> Path:
    from torch.distributed.checkpoint import DefaultSavePlanner, FileSystemWriter, save
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        save(state, storage_writer=FileSystemWriter(str(path)), planner=DefaultSavePlanner(**kw), no_dist=True)
    return path


def plain_metadata(path: Path):
    with open(path / ".metadata", "rb") as f:
        return pickle.load(f)  # (the test's own file: what torch itself reads)


def poison_metadata(d: Path, marker: Path) -> None:
    """Rewrite d/.metadata as a real DCP Metadata carrying one extra object whose pickle calls os.system."""
    md = plain_metadata(d)
    md.planner_data = {"x": Evil(marker)}
    (d / ".metadata").write_bytes(pickle.dumps(md))


def test_what_torch_saves_is_read_back_through_the_allow_list(tmp_path):
    """A real DCP save on CPU -- tensors of several dtypes, nested keys, an object entry, flattened and not, a Path
    as checkpoint id -- reads back through the allow-list exactly as pickle reads it."""
    b = io.BytesIO()
    torch.save({"step": 3}, b)
    state = {"w": torch.randn(3, 4), "h": torch.zeros(2, dtype=torch.bfloat16), "i": torch.arange(3),
             "u8": torch.zeros(2, dtype=torch.uint8), "obj": b, "nested": {"x": torch.ones(2)}, "lst": [None],
             "n": 5}
    for flatten in (True, False):
        d = dcp_save(tmp_path / f"ck{flatten}", state if flatten else {k: v for k, v in state.items()
                                                                        if k != "nested"},
                     flatten_state_dict=flatten)
        got, ref = read_dcp_metadata(d), plain_metadata(d)
        assert got.state_dict_metadata == ref.state_dict_metadata
        assert got.storage_data == ref.storage_data and got.planner_data == ref.planner_data
        assert check_torch_dist(d).state_dict_metadata == ref.state_dict_metadata  # the object entries pass too


def test_megatron_core_metadata_class_is_read_without_megatron(tmp_path, monkeypatch):
    """megatron-core (Oct-Dec 2025) pickled its own Metadata subclass, MCoreMetadata (with `mcore_data`); it is read
    into a stand-in, megatron-core not needed."""
    from torch.distributed.checkpoint.metadata import Metadata
    d = dcp_save(tmp_path / "ck", {"decoder.w": torch.ones(4, 2)}, flatten_state_dict=False)
    ref = plain_metadata(d)
    modname = "megatron.core.dist_checkpointing.strategies.torch"
    mod = types.ModuleType(modname)
    from dataclasses import dataclass

    @dataclass
    class MCoreMetadata(Metadata):
        mcore_data: dict | None = None
    MCoreMetadata.__module__, MCoreMetadata.__qualname__ = modname, "MCoreMetadata"
    mod.MCoreMetadata = MCoreMetadata
    parts = modname.split(".")
    for i in range(1, len(parts)):  # (pickle imports the class's module to check it: fake packages above it)
        if ".".join(parts[:i]) not in sys.modules:
            monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    monkeypatch.setitem(sys.modules, modname, mod)
    blob = pickle.dumps(MCoreMetadata(mcore_data={"decoder.w": {"nd_reformulated_orig_global_shape": (4, 2)}},
                                      **vars(ref)))
    monkeypatch.undo()
    assert modname.encode() in blob
    (d / ".metadata").write_bytes(blob)
    got = read_dcp_metadata(d)
    assert isinstance(got, Metadata) and got.mcore_data["decoder.w"]["nd_reformulated_orig_global_shape"] == (4, 2)
    assert got.state_dict_metadata == ref.state_dict_metadata


def test_save_plans_in_the_metadata_as_megatron_core_keeps_them(tmp_path):
    """megatron-core (since Feb 2025) stores every rank's SavePlan in the metadata (`all_local_plans`: WriteItems,
    TensorWriteData, ...); its save does what this planner does."""
    from torch.distributed.checkpoint import DefaultSavePlanner

    class KeepPlans(DefaultSavePlanner):
        def create_global_plan(self, all_plans):
            plans, md = super().create_global_plan(all_plans)
            md.all_local_plans = all_plans
            return plans, md
    b = io.BytesIO(pickle.dumps(None))
    d = tmp_path / "ck"
    from torch.distributed.checkpoint import FileSystemWriter, save
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        save({"w": torch.ones(3, 2), "o": b}, storage_writer=FileSystemWriter(str(d)), planner=KeepPlans(),
             no_dist=True)
    ref = plain_metadata(d)
    assert ref.all_local_plans and ref.all_local_plans[0].items
    assert read_dcp_metadata(d).all_local_plans == ref.all_local_plans


MEGATRON_SAVE = """
import argparse, sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[2])
from megatron_cpu_shim import install
def main():
    install()
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[3], rank=0, world_size=1)
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedObject, ShardedTensor
    sd = {"w": ShardedTensor.from_rank_offsets("decoder.w", torch.randn(4, 3)),
          "opt": ShardedObject("optimizer.param_groups", [{"lr": 1e-3, "betas": (0.9, 0.95)}], (1,), (0,)),
          "args": argparse.Namespace(lr=1e-3), "iteration": 7}
    dist_checkpointing.save(sd, sys.argv[1])
if __name__ == "__main__":
    main()
"""


def test_a_megatron_core_save_passes_the_checks(tmp_path):
    """What megatron-core's dist_checkpointing.save writes (on CPU through the test shim) passes: its .metadata,
    its objects and its common.pt. (Where megatron-core is installed; CI checks the same classes above.)"""
    pytest.importorskip("megatron.core")
    from slime_actors.backends.weight_sync import find_free_port
    script = tmp_path / "save.py"
    script.write_text(MEGATRON_SAVE)
    out = tmp_path / "ck"
    out.mkdir()
    p = subprocess.run([sys.executable, str(script), str(out), str(Path(__file__).parent), str(find_free_port())],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    md = check_torch_dist(out)
    assert "decoder.w" in md.state_dict_metadata
    assert read_dcp_metadata(out).state_dict_metadata == plain_metadata(out).state_dict_metadata


def test_refusals_name_the_class_and_the_file(tmp_path):
    marker = tmp_path / "MARKER"
    d = dcp_save(tmp_path / "ck", {"w": torch.ones(2)})
    poison_metadata(d, marker)
    with pytest.raises(UnsafeCheckpointError) as e:
        read_dcp_metadata(d)
    assert "posix.system" in str(e.value) and str(d / ".metadata") in str(e.value)
    # a garbled file and a pickle of something else are refused too, without a traceback from pickle
    (d / ".metadata").write_bytes(b"\x80\x04garbage")
    with pytest.raises(UnsafeCheckpointError, match="not a readable DCP metadata"):
        read_dcp_metadata(d)
    (d / ".metadata").write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(UnsafeCheckpointError, match="not DCP Metadata"):
        read_dcp_metadata(d)
    # an object entry of the checkpoint (what megatron-core unpickles with torch.load(weights_only=False))
    b = io.BytesIO()
    torch.save({"args": Evil(marker)}, b)
    d2 = dcp_save(tmp_path / "ck2", {"w": torch.ones(2), "common_state": b})
    with pytest.raises(UnsafeCheckpointError) as e:
        check_torch_dist(d2)
    assert "posix.system" in str(e.value) and "common_state" in str(e.value) and ".distcp" in str(e.value)
    # a legacy common.pt, and a torch.save file of ours
    d3 = dcp_save(tmp_path / "ck3", {"w": torch.ones(2)})
    torch.save({"x": Evil(marker)}, d3 / "common.pt")
    with pytest.raises(UnsafeCheckpointError, match="posix.system") as e:
        check_torch_dist(d3)
    assert "common.pt" in str(e.value)
    with pytest.raises(UnsafeCheckpointError, match="posix.system"):
        load_torch_file(d3 / "common.pt")
    assert not marker.exists()


def _model_and_slime_ckpt(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny HF model and the same weights as a slime torch_dist checkpoint (latest_checkpointed_iteration.txt ->
    iter_0000007/)."""
    from slime_actors.models.tiny import make_tiny_model
    model = make_tiny_model(tmp_path / "model")
    ck = tmp_path / "slime_ckpt"
    subprocess.run([str(BIN), "convert", str(model), str(tmp_path / "dist")], check=True, capture_output=True,
                   timeout=300)
    ck.mkdir()
    (tmp_path / "dist" / "release").rename(ck / "iter_0000007")
    (ck / "latest_checkpointed_iteration.txt").write_text("7")
    return model, ck


@pytest.mark.parametrize("layout", ["iter", "bare"])
def test_convert_refuses_a_metadata_that_runs_code(tmp_path, layout):
    """`slime-actors convert DIR OUT --hf-checkpoint MODEL` on a torch_dist checkpoint whose .metadata calls
    os.system: exit 2, the class and the file named, the command not run, nothing written."""
    model, ck = _model_and_slime_ckpt(tmp_path)
    out = tmp_path / "hf_ok"
    p = subprocess.run([str(BIN), "convert", str(ck), str(out), "--hf-checkpoint", str(model)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]  # the same checkpoint, untouched, converts
    src = ck if layout == "iter" else ck / "iter_0000007"
    marker = tmp_path / "MARKER"
    poison_metadata(ck / "iter_0000007", marker)
    p = subprocess.run([str(BIN), "convert", str(src), str(tmp_path / "hf"), "--hf-checkpoint", str(model)],
                       capture_output=True, text=True, timeout=300)
    assert not marker.exists(), "the checkpoint's pickle ran its command"
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr
    assert "posix.system" in p.stderr and str(ck / "iter_0000007" / ".metadata") in p.stderr, p.stderr
    assert not (tmp_path / "hf").exists()


def test_load_of_our_checkpoint_checks_its_pickles_before_start(tmp_path):
    """--load of a checkpoint of ours whose optimizer file (torch backend) or dist/.metadata (megatron backend)
    carries code: refused by the head's check naming the file, before anything starts; the command never runs."""
    from slime_actors.checkpoints import CheckpointError, commit_checkpoint, resolve_load
    from slime_actors.config import JobConfig
    marker = tmp_path / "MARKER"
    root = tmp_path / "save"
    it = commit_checkpoint(root, 3, {"next_rollout_id": 3, "weight_version": 3, "controller_rng": random.getstate(),
                                      "evals": []})
    (it / "trainer").mkdir()
    from safetensors.torch import save_file
    save_file({"w": torch.ones(2)}, str(it / "trainer" / "model.safetensors"))
    torch.save({"state": {}, "param_groups": []}, it / "trainer" / "optim.pt")
    torch.save({"torch": torch.get_rng_state()}, it / "trainer" / "rng_rank0.pt")
    cfg = JobConfig()
    cfg.checkpoint.load = str(root)
    cfg.train.train_backend = "torch"
    assert resolve_load(cfg) == it  # a clean one passes
    torch.save({"state": {0: {"step": Evil(marker)}}, "param_groups": []}, it / "trainer" / "optim.pt")
    with pytest.raises(CheckpointError) as e:
        resolve_load(cfg)
    assert "posix.system" in str(e.value) and str(it / "trainer" / "optim.pt") in str(e.value)
    # the megatron backend's state: dist/.metadata
    (it / "trainer" / "optim.pt").unlink()
    (it / "trainer" / "model.safetensors").unlink()
    dist = dcp_save(it / "trainer" / "dist", {"w": torch.ones(2)})
    cfg.train.train_backend = "megatron"
    assert resolve_load(cfg) == it
    poison_metadata(dist, marker)
    with pytest.raises(CheckpointError) as e:
        resolve_load(cfg)
    assert "posix.system" in str(e.value) and str(dist / ".metadata") in str(e.value)
    assert not marker.exists()


def test_torch_backend_load_refuses_an_optimizer_file_with_code(tmp_path):
    """The trainer's own load (a checkpoint saved by this run, then replaced): refused, naming the file."""
    from test_torch_backend import make_args

    from slime_actors.backends.torch_backend import TorchBackend
    from slime_actors.models.tiny import make_tiny_model
    model = make_tiny_model(tmp_path / "m")
    be = TorchBackend(make_args(tmp_path, str(model)), 0, 1)
    be.init()
    be.save(str(tmp_path / "ck"))
    be.load(str(tmp_path / "ck"))
    marker = tmp_path / "MARKER"
    torch.save({"state": {}, "param_groups": [Evil(marker)]}, tmp_path / "ck" / "optim.pt")
    with pytest.raises(UnsafeCheckpointError, match="posix.system") as e:
        be.load(str(tmp_path / "ck"))
    assert "optim.pt" in str(e.value) and not marker.exists()
    json.loads((tmp_path / "ck" / "meta.json").read_text())  # (the rest of the checkpoint untouched)
