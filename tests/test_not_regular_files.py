"""A path a user gives for a file may name a directory, a FIFO or a device: each is refused by name before any
process starts (json_files.not_regular), never opened. Before: `--prompt-data DIR` (or a FIFO, or /dev/zero) passed
the head's checks and the job started, its buffer failed twice and the job stopped 17 s later; `--config FIFO`
blocked `slime-actors train` for ever, as did a topology file, a search corpus or a saved rollout that was a FIFO.
Each test below would hang on a FIFO that were opened: they run under a timeout."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slime_actors.config import ConfigError
from slime_actors.json_files import not_regular
from slime_actors.launch.job_config import plan_job

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"
BIN = Path(sys.executable).parent / "slime-actors"


@pytest.fixture
def odd(tmp_path) -> dict[str, Path]:
    """A directory, a FIFO, a character device."""
    d = tmp_path / "adir"
    d.mkdir()
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    return {"a directory": d, "a FIFO (named pipe)": fifo, "a character device": Path("/dev/zero")}


def problems(*flags) -> str:
    with pytest.raises(ConfigError) as e:
        plan_job(["--hf-checkpoint", "tiny:digits", "--rm-type", "exact_match", *flags], data=True)   # (the head's)
    return str(e.value)


def test_not_regular_names_what_the_path_is(odd, tmp_path):
    for what, path in odd.items():
        assert not_regular(path) == what
    assert not_regular(tmp_path / "none") == "no such file"
    assert not_regular(DIGITS / "train.jsonl") is None


@pytest.mark.timeout(120)
def test_prompt_files_that_are_not_regular_files_are_refused_by_the_head(odd):
    for what, path in odd.items():
        msg = problems("--prompt-data", str(path))
        assert f"--prompt-data: {path} is {what}, not a .jsonl or .parquet file" in msg, msg
        msg = problems("--prompt-data", str(DIGITS / "train.jsonl"), "--eval-prompt-data", "h", str(path))
        assert f"--eval-prompt-data h: {path} is {what}, not a .jsonl or .parquet file" in msg, msg
    # --num-epoch counts the rows of --prompt-data: not of a FIFO
    fifo = odd["a FIFO (named pipe)"]
    msg = problems("--prompt-data", str(fifo), "--num-epoch", "1")
    assert f"--prompt-data: {fifo} is a FIFO" in msg, msg


@pytest.mark.timeout(120)
def test_an_eval_config_set_that_is_a_directory_is_refused(odd, tmp_path):
    """(Its check said only whether the set's file existed; a directory then stopped the evaluating buffer.)"""
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(f"eval:\n  datasets:\n    - name: d\n      path: {odd['a directory']}\n")
    msg = problems("--prompt-data", str(DIGITS / "train.jsonl"), "--eval-config", str(cfg))
    assert f"--eval-config set d: {odd['a directory']} is a directory, not a .jsonl or .parquet file" in msg, msg


@pytest.mark.timeout(120)
def test_a_config_file_that_is_a_fifo_does_not_block_the_command(odd):
    fifo = odd["a FIFO (named pipe)"]
    out = subprocess.run([str(BIN), "train", "--config", str(fifo)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"error: config file {fifo} is a FIFO (named pipe), not a TOML file" in out.stderr, out.stderr


@pytest.mark.timeout(120)
def test_a_topology_corpus_or_saved_rollout_that_is_a_fifo_is_named(odd, tmp_path):
    from slime_actors.actors.controller import Controller
    from slime_actors.config import parse_config
    from slime_actors.launch.topology import TopologyError, load_topology
    from slime_actors.search.corpus import CorpusError, read_corpus
    fifo = odd["a FIFO (named pipe)"]
    with pytest.raises(TopologyError, match="is a FIFO \\(named pipe\\), not a TOML or YAML file"):
        load_topology(fifo)
    with pytest.raises(CorpusError, match="a FIFO \\(named pipe\\), not a jsonl file"):
        read_corpus(fifo)
    msg = problems("--prompt-data", str(DIGITS / "train.jsonl"), "--retriever-corpus", str(fifo))
    assert f"--retriever-corpus {fifo} is a FIFO (named pipe), not a jsonl file" in msg, msg

    # a saved rollout: the head checks the first; the controller each one it loads
    saved = tmp_path / "saved"
    saved.mkdir()
    os.mkfifo(saved / "rollout_000000.msgpack")
    msg = problems("--debug-train-only", "--load-debug-rollout-data", str(saved))
    assert "rollout_000000.msgpack is a FIFO (named pipe), not a saved rollout" in msg, msg
    cfg = parse_config(["--hf-checkpoint", "tiny:digits", "--rm-type", "exact_match", "--debug-train-only",
                        "--load-debug-rollout-data", str(saved)], check_files=False)
    ctl = Controller(0, args=cfg.to_dict())
    with pytest.raises(ValueError, match="rollout_000000.msgpack is a FIFO \\(named pipe\\), not a saved rollout"):
        asyncio.run(ctl.debug_data.load(0))


@pytest.mark.timeout(120)
def test_a_model_directory_with_a_file_that_is_not_regular_is_refused_by_the_head(tmp_path):
    """Before: a tokenizer.json that was a FIFO passed the head's checks; the rollout worker failed to start twice
    and the job stopped 14 s later ("Couldn't instantiate the backend tokenizer")."""
    from slime_actors.models import resolve_checkpoint
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(b"")
    os.mkfifo(model / "tokenizer.json")
    (model / "tokenizer_config.json").mkdir()
    os.symlink(tmp_path / "gone", model / "generation_config.json")
    (model / "original").mkdir()                     # (a subdirectory of its own, as Llama's repositories have)
    (model / "notes").symlink_to("/dev/zero")         # (not a file a loader opens)
    with pytest.raises(ValueError) as e:
        resolve_checkpoint(str(model), tmp_path / "cache")
    assert str(e.value) == (f"--hf-checkpoint {model}: generation_config.json is a link to nothing; tokenizer.json "
                            "is a FIFO (named pipe); tokenizer_config.json is a directory -- a model's files must be "
                            "regular files")
    for p in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        os.remove(model / p) if p != "tokenizer_config.json" else os.rmdir(model / p)
    assert resolve_checkpoint(str(model), tmp_path / "cache") == str(model)


@pytest.mark.timeout(120)
def test_a_checkpoint_with_a_file_that_is_not_regular_is_refused_by_the_head(tmp_path):
    """Before: `--load CKPT` whose buffer.msgpack was a FIFO passed every check; the buffer blocked reading it until
    the hang check stopped the job. A .pt file that was a FIFO would block the head's own pickle check."""
    import random

    import torch
    from safetensors.torch import save_file

    from slime_actors.checkpoints import CheckpointError, commit_checkpoint, resolve_load
    root = tmp_path / "ck"
    it = commit_checkpoint(root, 4, {"next_rollout_id": 4, "weight_version": 4, "controller_rng": random.getstate(),
                                     "evals": []})
    (it / "trainer").mkdir()
    save_file({"w": torch.ones(2)}, str(it / "trainer" / "model.safetensors"))
    os.mkfifo(it / "buffer.msgpack")
    os.mkfifo(it / "trainer" / "optim.pt")
    cfg = plan_job(["--hf-checkpoint", "tiny:digits", "--rm-type", "exact_match", "--prompt-data",
                    str(DIGITS / "train.jsonl")]).cfg
    cfg.checkpoint.load = str(root)
    with pytest.raises(CheckpointError) as e:
        resolve_load(cfg)
    assert str(e.value) == (f"--load: {it}: buffer.msgpack is a FIFO (named pipe); trainer/optim.pt is a FIFO (named "
                            "pipe) -- a checkpoint's files are regular files (not written by this project, or "
                            "changed since)")
    os.remove(it / "buffer.msgpack")
    os.remove(it / "trainer" / "optim.pt")
    (it / "buffer.msgpack").write_bytes(b"\x80")
    assert resolve_load(cfg) == it
