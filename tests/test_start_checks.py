"""Every problem of a job is found before any process starts, and reported at once, each naming its flag or
file:line (issue 27 item 4); the start-up is one pass that reads each input once (issue 29 item 5)."""

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from slime_actors.config import ConfigError, parse_config

ROOT = Path(__file__).resolve().parents[1]
DIGITS = str(ROOT / "examples" / "digits" / "config.toml")
LOCAL_TOPOLOGY = str(ROOT / "launch" / "local.toml")


def _train(argv, capsys) -> tuple[int, list[str]]:
    from slime_actors.train import main
    code = main(argv)
    return code, capsys.readouterr().err.splitlines()


def _leftover_temp() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("slime-actors-prompts-")}


def test_every_problem_at_once_before_any_process(tmp_path, capsys, nothing_starts):
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(b'{"input": "1 2 3 first =", "label": "1"}\n'
                        b'{"input": "4 5 6 first ="}\n'                     # no label
                        b'{"input": "7 8 9 first =", "label": \n'           # not JSON
                        b'{"input": "\xff", "label": "1"}\n')               # not UTF-8
    config = tmp_path / "job.toml"
    config.write_text('hf_checkpoint = "no-such-model"\nprompt_data = "p.jsonl"\nrm_type = "exact_match"\n'
                      'label_key = "label"\nlr = -3e-3\nnum_rollout = "ten"\n[rollout]\nrollout_batch_size = "2"\n')
    run_dir = tmp_path / "run"
    before = _leftover_temp()
    code, err = _train(["--config", str(config), "--run-dir", str(run_dir), "--eps-clip-c", "0.5",
                        "--advantage-estimator", "grpox"], capsys)
    assert code == 2
    assert err[0] == "slime-actors train: 9 problems, nothing was started:", err
    expected = ["--advantage-estimator: invalid choice: 'grpox' (choose from 'grpo', 'gspo',",
                f"config file {config}: num_rollout must be an integer, got 'ten'",
                f"config file {config}: rollout.rollout_batch_size must be an integer, got '2'",
                f"--prompt-data: {prompts}:2: missing label key 'label'",
                f"--prompt-data: {prompts}:3: invalid JSON",
                f"--prompt-data: {prompts}:4: not valid UTF-8",
                "--eps-clip-c must be > 1, got 0.5",
                f"--lr must be >= 0, got -0.003 (config file {config}: lr)",
                "--hf-checkpoint no-such-model: no such directory"]
    for want, line in zip(expected, err[1:]):
        assert line.startswith("slime-actors train: error: " + want), (want, line)
    assert len(err) == 10
    assert not run_dir.exists() and _leftover_temp() == before


def test_a_negative_learning_rate_names_the_flag():
    # argparse takes "-3e-3" for a flag; the value is the flag's, and out of range
    with pytest.raises(ConfigError, match=r"^--lr must be >= 0, got -0.003$"):
        parse_config(["--config", DIGITS, "--lr", "-3e-3"])
    with pytest.raises(ConfigError, match=r"--rollout-top-p must be > 0 and <= 1, got 1.5"):
        parse_config(["--config", DIGITS, "--rollout-top-p", "1.5"])


def test_the_toml_takes_no_string_for_a_number(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text('hf_checkpoint = "tiny:digits"\nprompt_data = "train.jsonl"\nrm_type = "exact_match"\n'
                 '[train]\nlr = "3e-3"\n[rollout]\nn_samples_per_prompt = "2"\nrollout_stop = "x"\n')
    (tmp_path / "train.jsonl").write_text('{"input": "1 first =", "label": "1"}\n')
    with pytest.raises(ConfigError) as exc:
        parse_config(["--config", str(f)])
    assert exc.value.problems == [f"config file {f}: train.lr must be a number, got '3e-3'",
                                  f"config file {f}: rollout.n_samples_per_prompt must be an integer, got '2'",
                                  f"config file {f}: rollout.rollout_stop must be a list of strings, got 'x'"]
    f.write_text('lr = 1\nuse_kl_loss = "yes"\n')           # an integer is a number; a string is no bool
    with pytest.raises(ConfigError, match=r"use_kl_loss must be true or false, got 'yes'"):
        parse_config(["--config", str(f)])
    with pytest.raises(ConfigError, match=r"--config is given 2 times: a job has one config file"):
        parse_config(["--config", DIGITS, "--config", str(f)])


@pytest.mark.parametrize("command", ["train", "launch"])
def test_dry_run_checks_everything_and_starts_nothing(tmp_path, capsys, nothing_starts, command):
    from slime_actors.launch.job import launch_main
    from slime_actors.train import main as train_main

    def dry(*flags):
        argv = ["--config", DIGITS, "--run-dir", str(tmp_path / "run"), *flags, "--dry-run"]
        code = train_main(argv) if command == "train" else launch_main([LOCAL_TOPOLOGY, *argv])
        return code, capsys.readouterr()

    before = _leftover_temp()
    code, out = dry("--hf-checkpoint", str(tmp_path / "missing"))
    assert code == 2 and f"error: --hf-checkpoint {tmp_path / 'missing'}: no such directory" in out.err
    code, out = dry()
    assert code == 0 and "dry run: every check passed; nothing was started" in out.out + out.err
    assert "job: cpu; 1 local engine; torch backend: 1 rank" in out.err
    assert not (tmp_path / "run").exists() and _leftover_temp() == before


def test_each_input_is_read_once(tmp_path, monkeypatch):
    """The TOML file, the prompt files and the --sglang-* flags are each parsed once by the launcher -- with a
    topology that makes the job --colocate, and on one GPU, which used to parse everything again -- and the buffer
    loads the rows the launcher checked instead of parsing the files again."""
    import tomllib

    from slime_actors import rows
    from slime_actors.backends import sglang_launch
    from slime_actors.data import load_prompt_data
    from slime_actors.gpus import GpuCount
    from slime_actors.launch.job_config import plan_job
    from slime_actors.launch.prepare import hand_over_checked_prompts
    from slime_actors.launch.topology import load_topology
    reads: dict[str, int] = {}

    def counting(name, fn):
        def wrapped(*a, **kw):
            key = f"{name}:{a[0] if name == 'rows' else ''}"
            reads[key] = reads.get(key, 0) + 1
            return fn(*a, **kw)
        return wrapped
    monkeypatch.setattr(tomllib, "load", counting("toml", tomllib.load))
    monkeypatch.setattr(rows, "read_rows", counting("rows", rows.read_rows))
    monkeypatch.setattr(sglang_launch.LaunchFlags, "parse", classmethod(
        counting("sglang", sglang_launch.LaunchFlags.parse.__func__)))
    topo = load_topology(ROOT / "launch" / "colocated-1node.toml")
    plan = plan_job(["--config", DIGITS, "--device", "cuda", "--sglang-mem-fraction-static", "0.5", "--run-dir",
                     str(tmp_path / "run"), "--num-epoch", "1", "--num-rollout", "3"], topo, place=True, data=True,
                    keep_rows=True, gpus=GpuCount(8, "test"))
    plan2 = plan_job(["--config", DIGITS, "--device", "cuda", "--run-dir", str(tmp_path / "run2")], place=True,
                     gpus=GpuCount(1, "test"))
    assert plan2.gpus.by_itself and plan2.cfg.engine.colocate
    train = str(ROOT / "examples" / "digits" / "train.jsonl")
    heldout = str(ROOT / "examples" / "digits" / "heldout.jsonl")
    assert reads == {"toml:": 2, "sglang:": 2, f"rows:{train}": 1, f"rows:{heldout}": 1}   # one of each per plan
    # the buffer's side: the rows checked, not the files
    cfg = plan.cfg
    (tmp_path / "run").mkdir()
    hand_over_checked_prompts(cfg, tmp_path / "run")
    monkeypatch.setattr("slime_actors.data.read_rows", lambda *a, **k: pytest.fail("a prompt file read again"))
    from transformers import AutoTokenizer

    from slime_actors.models.tiny import make_tiny_model
    tok = AutoTokenizer.from_pretrained(str(make_tiny_model(tmp_path / "tiny")))
    train_set, evals = load_prompt_data(cfg, tok)
    assert train_set.from_checked and len(train_set) == 900 and evals["heldout"].from_checked
    assert train_set[0].source == f"{train}:1" and train_set[0].label == "1"


def test_a_changed_prompt_file_is_read_again_not_its_stale_copy(tmp_path):
    from transformers import AutoTokenizer

    from slime_actors.config import Problems
    from slime_actors.data import PromptDataset, checked_path
    from slime_actors.launch.checks import check_prompt_files
    from slime_actors.launch.prepare import hand_over_checked_prompts
    from slime_actors.models.tiny import make_tiny_model
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"input": "1 2 first =", "label": "1"}\n')
    cfg = parse_config(["--prompt-data", str(prompts), "--hf-checkpoint", "tiny:x", "--rm-type", "exact_match",
                        "--label-key", "label", "--run-dir", str(tmp_path / "run"), "--rollout-batch-size", "1",
                        "--n-samples-per-prompt", "2"])
    assert check_prompt_files(cfg, Problems(), keep=True) == {"train": 1}
    (tmp_path / "run").mkdir()
    hand_over_checked_prompts(cfg, tmp_path / "run")
    tok = AutoTokenizer.from_pretrained(str(make_tiny_model(tmp_path / "tiny")))
    kw = dict(label_key="label", tool_key="tools", checked=checked_path(tmp_path / "run", "train"))
    assert PromptDataset(prompts, tok, **kw).from_checked
    prompts.write_text('{"input": "1 2 first =", "label": "1"}\n{"input": "3 4 first =", "label": "3"}\n')
    again = PromptDataset(prompts, tok, **kw)
    assert not again.from_checked and len(again) == 2
    assert not PromptDataset(prompts, tok, label_key=None, tool_key="tools", checked=kw["checked"]).from_checked


def test_an_actor_still_names_every_bad_field_of_its_job_file():
    from slime_actors.config import JobConfig
    with pytest.raises(ConfigError) as exc:
        JobConfig.from_dict({"prompt_data": "p.jsonl", "hf_checkpoint": "tiny:x", "rm_type": "exact_match",
                             "lr": "x", "rollout_batch_size": "8", "nope": 1}, source="job.json")
    assert exc.value.problems == ["job.json: field 'lr' (--lr) must be a number, got 'x'",
                                  "job.json: field 'rollout_batch_size' (--rollout-batch-size) must be an integer, "
                                  "got '8'",
                                  "job.json: unknown field 'nope'"]


def test_the_launchers_print_every_problem(tmp_path):
    bin_ = Path(os.environ.get("VIRTUAL_ENV", Path(__file__).resolve().parents[1] / ".venv")) / "bin" / "slime-actors"
    if not bin_.exists():
        import sys
        bin_ = Path(sys.executable).parent / "slime-actors"
    p = subprocess.run([str(bin_), "sbatch", LOCAL_TOPOLOGY, "--lr", "-1", "--rollout-top-k", "0"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2
    assert p.stderr.splitlines() == ["slime-actors sbatch: 2 problems, nothing was started:",
                                     "slime-actors sbatch: error: --lr must be >= 0, got -1.0",
                                     "slime-actors sbatch: error: --rollout-top-k must be -1 (off) or >= 1, got 0"]
    assert json.dumps(p.stdout) == '""'
