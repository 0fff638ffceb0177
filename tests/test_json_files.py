"""JSON files read from disk that this process did not write (slime_actors/json_files.py): a checkpoint's meta.json,
a model's config.json, a run directory's head.json -- bounded, never blocking, and every problem named. And what
the readers that use it make of a hostile file: `--load` of a checkpoint whose meta.json is wrong is refused before
anything starts, naming the file and the problem."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from slime_actors.checkpoints import CheckpointError, commit_checkpoint, detect_layout, latest_checkpoint, read_meta
from slime_actors.json_files import MAX_BYTES, JsonFileError, read_json_object, read_small_json

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent / "slime-actors"


def _problem(path) -> str:
    with pytest.raises(JsonFileError) as e:
        read_json_object(path)
    assert read_small_json(path) is None
    return str(e.value)


def test_an_object_is_read_and_every_other_file_is_named_with_its_problem(tmp_path):
    ok = tmp_path / "ok.json"
    ok.write_text('{"a": [1, 2], "b": null}')
    assert read_json_object(ok) == {"a": [1, 2], "b": None} == read_small_json(ok)
    cases = {
        "missing.json": (None, "no such file"),
        "list.json": ("[1, 2]", "holds a JSON array where an object ({...}) belongs"),
        "string.json": ('"x"', "holds a JSON string where an object"),
        "null.json": ("null", "holds a JSON null where an object"),
        "number.json": ("3", "holds a JSON number where an object"),
        "broken.json": ('{"a": ', "not valid JSON"),
        "latin1.json": (b'{"a": "\xe9"}', "not valid JSON"),
        "deep.json": ("[" * 200_000 + "]" * 200_000, "nested too deep to be read"),
        # a number of 5,000 digits: Python's int() limit (a JSON number of a billion digits would take minutes)
        "digits.json": ('{"a": ' + "7" * 5000 + "}", "not valid JSON"),
    }
    for name, (body, want) in cases.items():
        p = tmp_path / name
        if isinstance(body, bytes):
            p.write_bytes(body)
        elif body is not None:
            p.write_text(body)
        msg = _problem(p)
        assert msg.startswith(f"{p}: ") and want in msg, (name, msg)
    (tmp_path / "dir.json").mkdir()
    assert _problem(tmp_path / "dir.json") == f"{tmp_path / 'dir.json'}: not a regular file"


def test_a_large_file_is_not_read_and_a_fifo_does_not_block(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:            # a valid object, one byte over the bound
        f.write(b'{"a": "' + b"x" * (MAX_BYTES - 8) + b'"}')
    assert big.stat().st_size == MAX_BYTES + 1
    assert _problem(big) == f"{big}: {MAX_BYTES + 1:,} bytes, more than the {MAX_BYTES:,} such a file may have"
    assert read_json_object(big, limit=MAX_BYTES + 1)["a"].startswith("xxx")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)                       # opening it would wait for a writer for ever
    assert _problem(fifo) == f"{fifo}: not a regular file"


def _meta(tmp_path, **changes):
    root = tmp_path / "ck"
    it = commit_checkpoint(root, 4, {"next_rollout_id": 4, "weight_version": 4, "controller_rng": random.getstate(),
                                     "evals": []})
    meta = json.loads((it / "meta.json").read_text())
    meta.update(changes)
    (it / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if v is not ...}))
    return root, it


def test_a_checkpoints_metadata_is_checked_and_each_problem_named(tmp_path):
    root, it = _meta(tmp_path)
    assert read_meta(it)["next_rollout_id"] == 4
    wrong = {
        "next_rollout_id -3 (a whole number >= 0)": {"next_rollout_id": -3},
        "next_rollout_id '4' (a whole number >= 0)": {"next_rollout_id": "4"},
        "next_rollout_id True (a whole number >= 0)": {"next_rollout_id": True},
        "no next_rollout_id": {"next_rollout_id": ...},
        "no weight_version": {"weight_version": ...},
        "weight_version 1.5 (a whole number >= 0)": {"weight_version": 1.5},
        "controller_rng is not a state of Python's random": {"controller_rng": [3, [1, 2], None]},
        "evals is a dict, not a list": {"evals": {}},
    }
    for want, changes in wrong.items():
        _, it = _meta(tmp_path, **changes)
        with pytest.raises(CheckpointError) as e:
            read_meta(it)
        assert str(e.value) == (f"checkpoint metadata {it / 'meta.json'}: {want} -- not written by this project, or "
                                "changed since"), str(e.value)
    (it / "meta.json").write_text("[4]")
    with pytest.raises(CheckpointError, match=r"meta.json: holds a JSON array where an object"):
        read_meta(it)
    # finding the newest checkpoint never reads a huge meta.json whole: a 9 MiB one is not a checkpoint
    (it / "meta.json").write_text(json.dumps({"next_rollout_id": 4, "pad": "x" * (9 << 20)}))
    assert latest_checkpoint(it) is None and detect_layout(it).kind != "ours-iter"
    (root / "latest_checkpointed_iteration.txt").write_text("4" + " " * (1 << 20))   # (read: its first 64 bytes)
    lay = detect_layout(root)
    assert lay.kind == "unknown" and "whose checkpoint metadata" in lay.detail and "9,437," in lay.detail, lay.detail
    # a tracker that is a FIFO is never opened (the open would wait for a writer for ever): read as no tracker
    (root / "latest_checkpointed_iteration.txt").unlink()
    os.mkfifo(root / "latest_checkpointed_iteration.txt")
    assert latest_checkpoint(root) == it and "no latest_checkpointed_iteration.txt" in detect_layout(root).detail


def test_load_of_a_checkpoint_with_wrong_metadata_is_refused_before_anything_starts(tmp_path):
    """The plain command: `slime-actors train ... --load CKPT` whose meta.json a hand or another tool changed: exit 2,
    the file and the problem named, no traceback, no run directory made. Before: a next_rollout_id of "x" passed the
    checks and the job failed inside the controller; a meta.json that was a list was called 'not a checkpoint'."""
    root, it = _meta(tmp_path, next_rollout_id="x")
    (it / "trainer").mkdir()
    from safetensors.torch import save_file
    import torch
    save_file({"w": torch.ones(2)}, str(it / "trainer" / "model.safetensors"))
    run = tmp_path / "run"
    argv = [str(BIN), "train", "--config", str(ROOT / "examples" / "digits" / "config.toml"), "--run-dir", str(run),
            "--load", str(root), "--dry-run"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    assert (f"checkpoint metadata {it / 'meta.json'}: next_rollout_id 'x' (a whole number >= 0) -- not written by "
            "this project, or changed since") in p.stderr, p.stderr[-3000:]
    assert not run.exists()


def test_an_adapter_directory_with_a_hostile_config_is_refused_by_name(tmp_path):
    """An engine asked to load a PEFT adapter directory (load_lora_adapter) reads its adapter_config.json bounded."""
    from slime_actors.backends.lora import ADAPTER_CONFIG, ADAPTER_FILE, LoraError, check_adapter_dir
    d = tmp_path / "adapter"
    d.mkdir()
    (d / ADAPTER_FILE).write_bytes(b"")
    for body, want in (("[]", "holds a JSON array where an object"), ("{", "not valid JSON"),
                       ('{"a": ' * 100_000, "nested too deep")):
        (d / ADAPTER_CONFIG).write_text(body)
        with pytest.raises(LoraError) as e:
            check_adapter_dir(d)
        assert str(e.value).startswith(f"{d / ADAPTER_CONFIG}: ") and want in str(e.value), str(e.value)
    (d / ADAPTER_CONFIG).unlink()
    os.mkfifo(d / ADAPTER_CONFIG)
    with pytest.raises(LoraError, match="not a PEFT adapter directory: no adapter_config.json"):
        check_adapter_dir(d)   # (a FIFO is not a file: never opened)


def test_a_model_directory_whose_config_is_not_an_object_is_refused(tmp_path):
    from slime_actors.models import resolve_checkpoint
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('["llama"]')
    with pytest.raises(ValueError) as e:
        resolve_checkpoint(str(model), tmp_path / "cache")
    assert str(e.value) == (f"--hf-checkpoint {model}: {model / 'config.json'}: holds a JSON array where an object "
                            "({...}) belongs")


def test_json_nested_too_deep_is_named_by_every_reader_of_text_we_did_not_write(tmp_path):
    """Python's json raises RecursionError -- not the ValueError every reader catches -- on text nested ~1,000 deep:
    a prompt file with such a line stopped `slime-actors train` with a traceback (instead of its list of problems),
    a label stopped the code reward. Each reader now names it like any other text that is not JSON (the servers:
    tests/test_retriever.py, tests/test_local_engine.py; HTTP answers: tests/test_http_answers.py)."""
    from slime_actors.config import ConfigError, json_object
    from slime_actors.json_files import parse_json
    from slime_actors.rewards.code import parse_tests
    from slime_actors.rows import RowKeys, scan_rows
    from slime_actors.search.corpus import CorpusError, read_corpus
    from slime_actors.tokenizer import TokenizerFileError, fast_tokenizer_class
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(json.JSONDecodeError, match="nested too deep to be read"):
        parse_json(deep)
    with pytest.raises(json.JSONDecodeError, match="nested too deep to be read"):
        parse_json(deep.encode())

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"input": "a", "label": "1"}\n' + deep + "\n"
                       + json.dumps({"input": "b", "label": "2", "metadata": deep}) + "\n"
                       + json.dumps({"input": "c", "label": "3", "tools": deep}) + "\n")
    scan = scan_rows(str(prompts), RowKeys(label_key="label", tool_key="tools"))
    assert (scan.rows, scan.good, scan.bad) == (4, 1, 3)
    assert scan.problems == [f"{prompts}:2: invalid JSON (nested too deep to be read at column 1)",
                             f"{prompts}:3: metadata 'metadata' is a string but not JSON (nested too deep to be read)",
                             f"{prompts}:4: tools 'tools' is a string but not JSON (nested too deep to be read)"]

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "0", "contents": "\\"T\\"\\nbody"}\n' + deep + "\n")
    with pytest.raises(CorpusError, match="line 2: not JSON \\(nested too deep to be read\\)"):
        read_corpus(corpus)

    with pytest.raises(ValueError, match="got text that is not JSON: nested too deep to be read"):
        parse_tests(deep)
    with pytest.raises(ConfigError, match="--rm-headers must be a JSON object.*nested too deep to be read"):
        json_object(deep, "--rm-headers")

    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer_config.json").write_text(deep)
    with pytest.raises(TokenizerFileError, match="tokenizer_config.json is not a valid JSON file \\(nested too deep"):
        fast_tokenizer_class(model)


def test_config_files_nested_too_deep_are_named_not_a_traceback(tmp_path):
    """tomllib and PyYAML parse nested arrays by recursion too: `--config` with `lr = [[[...]]]` 5,000 deep stopped
    `slime-actors train` with a RecursionError traceback; an eval config or a topology file likewise."""
    from slime_actors.config import ConfigError
    from slime_actors.eval_config import read_eval_config
    from slime_actors.launch.topology import TopologyError, load_topology
    deep = "[" * 5000 + "]" * 5000
    toml_file, yaml_file = tmp_path / "deep.toml", tmp_path / "deep.yaml"
    toml_file.write_text(f"lr = {deep}\n")
    yaml_file.write_text(f"eval: {deep}\n")
    out = subprocess.run([str(BIN), "train", "--config", str(toml_file)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f"error: config file {toml_file}: nested too deep to be read" in out.stderr, out.stderr
    for f in (toml_file, yaml_file):
        with pytest.raises(ConfigError, match=f"--eval-config {f}: nested too deep to be read"):
            read_eval_config(str(f))
        with pytest.raises(TopologyError, match="nested too deep to be read"):
            load_topology(f)
