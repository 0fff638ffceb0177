"""slime users' flags carry over: no abbreviations, unknown flags named, slime's flags honoured or refused with the
reason, Megatron's flags from slime's scripts accepted only where they change nothing, defaults against slime's
recorded parser, docs/flags.md generated from the parser, the top-level command."""

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slime_actors.config import FIELDS, ConfigError, parse_config
from slime_actors.slime_compat import COMPAT, MEGATRON_FLAGS, SLIME_ACCEPTED, SLIME_UNSUPPORTED

ROOT = Path(__file__).resolve().parents[1]
DIGITS = str(ROOT / "examples" / "digits" / "config.toml")
SLIME = json.loads((ROOT / "tests" / "data" / "slime_arguments.json").read_text())


def digits(*extra: str):
    return parse_config(["--config", DIGITS, *extra])


def error_of(*argv: str) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config(["--config", DIGITS, *argv])
    return str(exc.value)


# ---------------------------------------------------------------------------------------------------------------
# the parser

def test_slimes_flag_is_never_taken_for_a_longer_one():
    # slime's --rollout-num-gpus 8 used to parse as --rollout-num-gpus-per-engine 8 (argparse's abbreviations)
    cfg = digits("--rollout-num-gpus", "8", "--rollout-num-gpus-per-engine", "2", "--rollout-engine", "sglang")
    assert cfg.engine.rollout_num_gpus_per_engine == 2 and cfg.engine.rollout_num_engines == 4
    cfg = digits("--rollout-num-gpus", "2")
    assert cfg.engine.rollout_num_gpus_per_engine == 1 and cfg.engine.rollout_num_engines == 2
    # an abbreviation of our own flags is no flag either
    assert error_of("--micro", "4") == "unknown flag --micro; did you mean --micro-batch-size?"
    assert "unknown flag --rollout-batch" in error_of("--rollout-batch", "4")


def test_unknown_flags_name_the_closest_or_slimes_reason(tmp_path):
    assert error_of("--rolout-batch-size", "4") == ("unknown flag --rolout-batch-size; did you mean "
                                                    "--rollout-batch-size?")
    assert error_of("--n-sample-per-prompt=4", "--foo", "1").splitlines() == [    # every unknown flag, each named
        "unknown flag --n-sample-per-prompt; did you mean --n-samples-per-prompt?",
        "unknown flag --foo; `slime-actors train --help` lists the flags"]
    assert error_of("--zzz-qqq") == "unknown flag --zzz-qqq; `slime-actors train --help` lists the flags"
    msg = error_of("--use-opd", "--opd-type", "sglang")
    assert msg.startswith("--use-opd is slime's flag, not supported by slime-actors: on-policy distillation is not "
                          "implemented here")
    # a Megatron flag of slime's scripts is close to nothing of ours, but it is a flag here
    assert digits("--sequence-parallel").notes
    # the config file's keys too
    f = tmp_path / "job.toml"
    f.write_text('[rollout]\nrolout_batch_size = 4\n')
    with pytest.raises(ConfigError, match=r"unknown key 'rollout.rolout_batch_size' \(no flag --rolout-batch-size; "
                                          r"did you mean --rollout-batch-size\?\)"):
        parse_config(["--config", str(f), "--prompt-data", DIGITS, "--hf-checkpoint", "tiny:digits",
                      "--rm-type", "exact_match"])


def test_value_bools_take_slimes_bare_form():
    assert digits("--use-tensorboard").logging.use_tensorboard is True          # slime: a bare switch
    assert digits("--use-tensorboard", "false").logging.use_tensorboard is False
    assert digits("--trace", "--lr", "1e-3").runtime.trace is True              # a bare value-bool before a flag
    assert error_of("--trace", "maybe") == "--trace: expected true/false, got 'maybe'"


def test_every_flag_has_help_and_its_origin_against_slimes_parser():
    """Each flag says where it comes from; a flag of slime's origin is in slime's parser with the same default
    (or says why not); every flag of slime's parser is ours, accepted (compat) or refused with a reason."""
    flags = SLIME["flags"]
    for spec in FIELDS.values():
        if not spec.cli:
            continue
        assert spec.help and len(spec.help) > 15, spec.name
        if spec.origin == "slime":
            assert spec.option in flags, f"{spec.option} says it is slime's, but slime has no such flag"
            theirs = flags[spec.option]
            slime_default = theirs["default"]
            if theirs["action"] == "store_false":   # --disable-x: slime's dest x defaults to True: off
                slime_default = not slime_default
            if spec.slime is None:
                assert spec.default == slime_default, (f"{spec.option}: default {spec.default!r}, slime's "
                                                       f"{slime_default!r}: the field must say why (slime=...)")
            else:
                assert spec.slime[0] == slime_default, (spec.option, spec.slime[0], slime_default)
                assert len(spec.slime[1]) > 20
            if theirs["choices"] and spec.choices:
                assert set(theirs["choices"]) - {"nccl"} <= set(spec.choices), spec.option
        else:
            assert spec.option not in flags, f"{spec.option} is slime's flag: origin should be 'slime'"
    for name, f in COMPAT.items():   # Megatron's flags are in slime's table only where slime resets their default
        assert f.note and (name in flags if f.origin == "slime" else flags.get(name, {"reset": True})["reset"]), name
        assert name not in {s.option for s in FIELDS.values()}
    from slime_actors.backends.sglang_flags import SERVER_FLAGS
    unaccounted = [k for k in flags if k not in {s.option for s in FIELDS.values()} and k not in COMPAT
                   and k not in SLIME_UNSUPPORTED
                   and not (k.startswith("--sglang-") and "--" + k[len("--sglang-"):] in SERVER_FLAGS)]  # SGLang's
    assert not unaccounted, f"slime's flags neither honoured, accepted nor refused with a reason: {unaccounted}"
    assert set(SLIME_UNSUPPORTED) <= set(flags)


def test_docs_flags_md_is_the_parsers():
    from slime_actors.flags_doc import flags_markdown
    doc = (ROOT / "docs" / "flags.md").read_text()
    assert doc == flags_markdown(), "docs/flags.md is stale: python -m slime_actors.flags_doc > docs/flags.md"
    for spec in FIELDS.values():
        if spec.cli:
            assert f"| `{spec.option}` |" in doc
    for name in list(COMPAT) + list(SLIME_UNSUPPORTED):
        assert f"`{name}`" in doc


# ---------------------------------------------------------------------------------------------------------------
# slime's and Megatron's flags without a field

QWEN3_4B_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
                   "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                   "rms_norm_eps": 1e-06, "rope_theta": 1000000, "max_position_embeddings": 40960,
                   "tie_word_embeddings": True}


@pytest.fixture
def qwen_dir(tmp_path):
    d = tmp_path / "Qwen3-4B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(QWEN3_4B_CONFIG))
    return d


def test_megatron_flags_change_nothing_or_are_refused(qwen_dir):
    base = ["--hf-checkpoint", str(qwen_dir)]
    cfg = digits(*base, "--optimizer", "adam", "--lr-decay-style", "constant", "--attention-dropout", "0.0",
                 "--recompute-granularity", "full", "--num-layers", "36", "--kv-channels", "128", "--qk-layernorm")
    notes = "\n".join(cfg.notes)
    assert "no effect here" in notes and "--recompute-granularity full" in notes
    assert "--optimizer adam" in notes and "--lr-decay-style constant" in notes and "--attention-dropout 0.0" in notes
    assert f"model architecture from {qwen_dir}/config.json; these agree with it: --num-layers 36, " \
           "--kv-channels 128" in notes
    assert "accepted unchecked: --qk-layernorm" in notes
    # values that would change the result are refused, naming the flag and why
    assert error_of(*base, "--optimizer", "sgd") == "--optimizer sgd: not supported: Adam(W) is the optimizer here"
    assert "--lr-decay-style cosine: not supported: the learning rate is constant" in error_of(
        *base, "--lr-decay-style", "cosine")
    assert "--hidden-dropout 0.1: not supported: dropout is off" in error_of(*base, "--hidden-dropout", "0.1")
    assert "--context-parallel-size 2: not supported" in error_of(*base, "--context-parallel-size", "2")
    msg = error_of(*base, "--num-layers", "28")
    assert msg.startswith(f"--num-layers 28: {qwen_dir}/config.json says 36")
    assert "--untie-embeddings-and-output-weights" in error_of(*base, "--untie-embeddings-and-output-weights")
    assert "--num-query-groups 4" in error_of(*base, "--num-query-groups", "4")
    # slime's own flags without effect here
    notes = "\n".join(digits("--balance-data", "--tb-project-name", "x").notes)
    assert "--balance-data" in notes and "--tb-project-name x" in notes
    assert "--update-weight-mode delta: not supported" in error_of("--update-weight-mode", "delta")


def test_compat_flags_in_a_config_file(tmp_path, qwen_dir):
    f = tmp_path / "job.toml"
    f.write_text(f'hf_checkpoint = "{qwen_dir}"\nprompt_data = "{ROOT}/examples/digits/train.jsonl"\n'
                 'rm_type = "exact_match"\n[megatron]\nsequence_parallel = true\nnum_layers = 36\n'
                 'optimizer = "adam"\n')
    cfg = parse_config(["--config", str(f)])
    assert any("--sequence-parallel" in n for n in cfg.notes)
    assert any("--num-layers 36" in n for n in cfg.notes)
    f.write_text(f.read_text().replace("num_layers = 36", "num_layers = 2"))
    with pytest.raises(ConfigError, match="--num-layers 2: .* says 36"):
        parse_config(["--config", str(f)])


def test_wandb_key_goes_to_the_environment_not_the_job_file(monkeypatch):
    from slime_actors.launch.job_config import build_job_config
    # set, then deleted: teardown restores the original (absent) values over what build_job_config sets -- later
    # tests start jobs that inherit this environment
    for name in ("WANDB_API_KEY", "SLIME_ACTORS_LOG_LEVEL"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    cfg = digits("--wandb-key", "k-123")
    assert cfg.process_env == {"WANDB_API_KEY": "k-123"}
    assert "k-123" not in json.dumps(cfg.to_dict())
    cfg, _ = build_job_config(["--config", DIGITS, "--wandb-key", "k-456", "--log-level", "warning"])
    assert os.environ["WANDB_API_KEY"] == "k-456" and os.environ["SLIME_ACTORS_LOG_LEVEL"] == "warning"


# ---------------------------------------------------------------------------------------------------------------
# slime's flags with a field

def test_rollout_num_gpus(tmp_path):
    # slime: with --colocate the engines take the trainer's GPUs unless --rollout-num-gpus says otherwise
    plain = ["--prompt-data", str(ROOT / "examples" / "digits" / "train.jsonl"), "--hf-checkpoint", "tiny:digits",
             "--rm-type", "exact_match", "--rollout-batch-size", "16"]
    cfg = parse_config(plain + ["--colocate", "--actor-num-gpus-per-node", "8", "--rollout-num-gpus-per-engine", "2",
                                "--rollout-engine", "sglang"])
    assert cfg.engine.rollout_num_engines == 4 and cfg.engine.rollout_num_gpus == 8
    cfg = parse_config(plain + ["--colocate", "--actor-num-gpus-per-node", "8", "--rollout-num-gpus", "2"])
    assert cfg.engine.rollout_num_engines == 2
    # a config file's engine count gives way to the command line's GPU count (and the other way round)
    assert digits("--rollout-num-gpus", "3").engine.rollout_num_engines == 3
    assert digits().engine.rollout_num_engines == 1 and digits().engine.rollout_num_gpus == 1
    assert "--rollout-num-gpus (6) must be a multiple of --rollout-num-gpus-per-engine (4)" in error_of(
        "--rollout-num-gpus", "6", "--rollout-num-gpus-per-engine", "4")
    assert "--rollout-num-engines 3 disagrees with --rollout-num-gpus 4 / --rollout-num-gpus-per-engine 1 = 4" in \
        error_of("--rollout-num-gpus", "4", "--rollout-num-engines", "3")
    assert "--rollout-num-gpus 0 starts no engine" in error_of("--rollout-num-gpus", "0")
    cfg = digits("--rollout-num-gpus", "0", "--rollout-external-engine-addrs", "h:1", "h:2")
    assert cfg.engine.rollout_num_engines == 2


def test_num_epoch(tmp_path):
    rows = sum(1 for _ in open(ROOT / "examples" / "digits" / "train.jsonl"))
    # the digits config file sets num_rollout: the command line's --num-epoch replaces it ...
    cfg = digits("--num-epoch", "2")
    assert cfg.run.num_rollout == 2 * rows // 16
    # ... both on the command line: --num-rollout wins, as in slime, and the user is told
    cfg = digits("--num-epoch", "2", "--num-rollout", "5")
    assert cfg.run.num_rollout == 5 and any("--num-epoch 2 is ignored" in n for n in cfg.notes)
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"input": f"q{i}", "label": "1"}) + "\n" for i in range(37)))
    base = ["--prompt-data", str(data), "--hf-checkpoint", "tiny:digits", "--rm-type", "exact_match",
            "--rollout-batch-size", "4"]
    cfg = parse_config(base + ["--num-epoch", "3"])
    assert cfg.run.num_rollout == 3 * 37 // 4 == 27
    assert any("--num-rollout 27 (3 x 37 prompts // --rollout-batch-size 4" in n for n in cfg.notes)
    assert parse_config(base).run.num_rollout == 10
    assert rows > 0
    with pytest.raises(ConfigError, match="--num-epoch must be >= 1"):
        parse_config(base + ["--num-epoch", "0"])
    with pytest.raises(ConfigError, match="make no batch"):
        parse_config(base + ["--num-epoch", "1", "--rollout-batch-size", "64"])


def test_eval_sampling_flags_reach_the_eval_requests():
    from slime_actors.actors.buffer import Buffer
    cfg = digits("--rollout-top-p", "0.9", "--rollout-top-k", "50")
    assert (cfg.eval.eval_top_p, cfg.eval.eval_top_k) == (0.9, 50)            # slime: default to the rollout's
    b = Buffer(0, args=digits("--eval-top-p", "0.7", "--eval-top-k", "5", "--eval-temperature", "0.6").to_dict())
    sp = b.state.settings.sampling_params("eval")
    assert (sp["top_p"], sp["top_k"], sp["temperature"]) == (0.7, 5, 0.6)
    assert b.state.settings.sampling_params("train")["top_p"] == 1.0


class _Tok:
    """A tokenizer whose chat template records the arguments it gets."""

    def __init__(self):
        self.kwargs = []

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **kw):
        self.kwargs.append(kw)
        return f"<user>{messages[-1]['content']}</user>" + ("" if kw.get("enable_thinking", True) else "<no-think>")

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[1] * len(t) for t in texts]}


def test_apply_chat_template_kwargs_reach_the_template():
    from slime_actors.data import load_prompt_data
    cfg = digits("--apply-chat-template", "--apply-chat-template-kwargs", '{"enable_thinking": false}')
    tok = _Tok()
    train, evals = load_prompt_data(cfg, tokenizer=tok)
    assert train.prompts[0].prompt.endswith("<no-think>")
    assert tok.kwargs[0] == {"enable_thinking": False}
    assert all(p.prompt.endswith("<no-think>") for p in evals["heldout"].prompts)
    assert "--apply-chat-template-kwargs must be a JSON object" in error_of("--apply-chat-template-kwargs",
                                                                           "enable_thinking=false")
    assert "got list" in error_of("--apply-chat-template-kwargs", "[1]")


def test_loss_type_and_custom_loss_flags():
    assert digits("--advantage-estimator", "cispo").algorithm.advantage_estimator == "cispo"
    cfg = digits("--advantage-estimator", "cispo")
    assert any("lower bound 0.8" in n for n in cfg.notes)   # slime's warning: canonical CISPO is one-sided
    assert not any("CISPO" in n for n in digits("--advantage-estimator", "cispo", "--eps-clip", "1.0").notes)
    assert "--loss-type custom_loss needs --custom-loss-function-path" in error_of("--loss-type", "custom_loss")
    assert "--custom-loss-function-path is used with --loss-type custom_loss" in error_of(
        "--custom-loss-function-path", "m.f")
    assert "--n-samples-per-prompt must be >= 2" in error_of("--advantage-estimator", "cispo",
                                                             "--n-samples-per-prompt", "1",
                                                             "--global-batch-size", "16")


def test_wandb_flags_without_use_wandb_are_noted():
    cfg = digits("--wandb-project", "p")
    assert any("--wandb-project given without --use-wandb" in n for n in cfg.notes)


def test_use_wandb_without_the_package_is_refused(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    assert "--use-wandb needs the wandb package" in error_of("--use-wandb")


# ---------------------------------------------------------------------------------------------------------------
# the command

def _run_cli(*argv):
    from slime_actors.cli import main
    out, err = io.StringIO(), io.StringIO()
    code = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def test_top_level_command_lists_every_subcommand_and_its_version():
    from slime_actors import __version__
    code, out, _ = _run_cli()
    assert code == 0
    code2, out2, _ = _run_cli("--help")
    assert code2 == 0
    for text in (out, out2):
        listed = text[text.index("COMMAND\n"):]
        for cmd in ("train", "launch", "sbatch", "convert", "demo", "trace", "replay", "samples"):
            assert f"\n    {cmd} " in listed, cmd
    code, out, _ = _run_cli("--version")
    assert code == 0 and out.strip() == f"slime-actors {__version__}"
    code, out, _ = _run_cli("train", "--version")
    assert code == 0 and out.strip() == f"slime-actors {__version__}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{__version__}"' in pyproject


def test_train_prints_the_notes_and_refuses_before_starting(tmp_path, qwen_dir):
    bin_ = Path(sys.executable).parent / "slime-actors"
    p = subprocess.run([str(bin_), "train", "--config", DIGITS, "--run-dir", str(tmp_path / "r"),
                        "--hf-checkpoint", str(qwen_dir), "--num-layers", "35"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == (f"slime-actors train: error: --num-layers 35: {qwen_dir}/config.json "
                                                 "says 36 (config.json); the model trained is the one config.json "
                                                 "describes -- fix the flag or use the matching checkpoint")
    assert not (tmp_path / "r").exists()


def test_launch_and_sbatch_take_no_abbreviations(tmp_path):
    from slime_actors.launch.job import launch_main
    topo = tmp_path / "t.toml"
    topo.write_text('[nodes.n]\ncount = 1\n[roles.buffer]\n[roles.trainer]\n[roles.rollout]\n[roles.reward]\n')
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = launch_main([str(topo), "--config", DIGITS, "--no", "x", "--dry-run"])
    assert code == 2 and "unknown flag --no" in err.getvalue()
