"""The job's typed config: parsed once, written flat, rebuilt typed; the plug-ins' flat view; --help."""

import contextlib
import dataclasses
import io
import json
import os
import pickle
import re

import msgpack
import pytest

from slime_actors.config import FIELDS, SECTIONS, ConfigError, FlatArgs, JobConfig, parse_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIGITS = os.path.join(ROOT, "examples", "digits", "config.toml")


def digits(*extra: str) -> JobConfig:
    return parse_config(["--config", DIGITS, *extra])


def minimal(**flat) -> dict:
    return {"prompt_data": "p.jsonl", "hf_checkpoint": "tiny:x", "rm_type": "exact_match", **flat}


def test_every_flag_is_one_field_of_one_section():
    seen = {}
    for name, cls in SECTIONS.items():
        for f in (x.name for x in dataclasses.fields(cls)):
            assert f not in seen, f"{f} is in sections {seen[f]} and {name}"
            seen[f] = name
    assert set(seen) == set(FIELDS)
    assert all(FIELDS[n].section == s for n, s in seen.items())


def test_parse_fills_derived_values_once():
    cfg = digits("--eps-clip", "0.3", "--sglang-mem-fraction-static", "0.5")
    assert cfg.algorithm.eps_clip_high == 0.3                       # defaults to --eps-clip
    assert cfg.train.global_batch_size == 128                       # from the config file
    assert cfg.train.num_steps_per_rollout == 1                     # 16 x 8 / 128
    assert cfg.rollout.over_sampling_batch_size == 16               # --rollout-batch-size
    assert cfg.eval.eval_temperature == 0.0 and cfg.eval.eval_max_response_len == 1
    assert cfg.train.critic_lr == cfg.train.lr == 3e-3
    assert cfg.engine.sglang_args == ["--mem-fraction-static", "0.5"]
    assert cfg.data.prompt_data == os.path.join(ROOT, "examples", "digits", "train.jsonl")  # next to the file
    assert cfg.eval.eval_prompt_data == ["heldout", os.path.join(ROOT, "examples", "digits", "heldout.jsonl")]
    # a flat dict without the derived values gets the same ones
    d = cfg.to_dict()
    for k in ("eps_clip_high", "global_batch_size", "num_steps_per_rollout", "over_sampling_batch_size",
              "eval_temperature", "eval_max_response_len", "critic_lr"):
        d.pop(k)
    d["global_batch_size"] = 128
    assert JobConfig.from_dict(d) == cfg


def test_job_config_round_trips_typed_through_json_and_msgpack():
    cfg = digits("--rollout-stop", "a", "b", "--rollout-stop-token-ids", "3", "4", "--use-kl-loss",
                 "--kl-loss-coef", "1", "--trace", "false", "--sglang-router-port", "30000")
    d = cfg.to_dict()
    assert set(d) == set(FIELDS)
    for wire in (json.loads(json.dumps(d)), msgpack.unpackb(msgpack.packb(d), raw=False)):
        back = JobConfig.from_dict(wire, source="job.json")
        assert back == cfg
        assert back.algorithm.kl_loss_coef == 1.0 and isinstance(back.algorithm.kl_loss_coef, float)
        assert back.rollout.rollout_stop == ["a", "b"] and back.rollout.rollout_stop_token_ids == [3, 4]
        assert back.runtime.trace is False and back.algorithm.use_kl_loss is True
        assert back.engine.sglang_router_port == 30000


def test_the_user_keys_never_reach_the_dict():
    cfg = digits()
    cfg.engine_user_keys = object()
    assert "engine_user_keys" not in cfg.to_dict()
    assert JobConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("bad,message", [
    ({"rollout_batch_size": "8"}, "field 'rollout_batch_size' (--rollout-batch-size) must be an integer, got '8'"),
    ({"rollout_batch_size": True}, "field 'rollout_batch_size' (--rollout-batch-size) must be an integer"),
    ({"lr": "1e-3"}, "field 'lr' (--lr) must be a number, got '1e-3'"),
    ({"use_kl_loss": 1}, "field 'use_kl_loss' (--use-kl-loss) must be true or false, got 1"),
    ({"rollout_engine": "vllm"}, "field 'rollout_engine' (--rollout-engine) must be one of ['local', 'sglang']"),
    ({"rollout_stop": "</s>"}, "field 'rollout_stop' (--rollout-stop) must be a list of strings or null"),
    ({"rollout_stop_token_ids": [1, "2"]}, "field 'rollout_stop_token_ids' (--rollout-stop-token-ids) must be a "
                                           "list of integers"),
    ({"run_dir": None}, "field 'run_dir' (--run-dir) must be a string, got None"),
    ({"rollout_num_engnes": 2}, "unknown field 'rollout_num_engnes' (did you mean rollout_num_engines"),
    ({"engine_user_keys": {"api_key": "x"}}, "unknown field 'engine_user_keys'"),
    ({"rollout_batch_size": 0}, "--rollout-batch-size must be >= 1, got 0"),
    ({"head_chunk_mib": -1}, "--head-chunk-mib must be >= 0, got -1"),
    ({"hf_checkpoint": None}, "--hf-checkpoint is required"),
])
def test_a_malformed_job_file_names_the_field(bad, message):
    with pytest.raises(ConfigError) as exc:
        JobConfig.from_dict(minimal(**bad), source="runs/x/job.json")
    assert str(exc.value).startswith("runs/x/job.json: ")
    assert message in str(exc.value)


def test_a_job_file_that_is_not_a_table():
    with pytest.raises(ConfigError, match=r"job.json: expected a table of the job's flags, got list"):
        JobConfig.from_dict([1, 2], source="job.json")


def test_from_dict_fills_defaults_for_missing_fields():
    cfg = JobConfig.from_dict(minimal(eps_clip=0.25))
    assert cfg.algorithm.eps_clip_high == 0.25 and cfg.train.global_batch_size == 64
    assert cfg.run.run_dir == FIELDS["run_dir"].default == "runs/train"


# ---------------------------------------------------------------------------------------------------------------
# the plug-ins' flat view

def test_flat_view_has_every_flag_under_slimes_name():
    cfg = digits("--rollout-stop", "x")
    args = cfg.flat()
    assert args.rollout_max_response_len == 1 and args.n_samples_per_prompt == 8
    assert args.eps_clip_high == cfg.algorithm.eps_clip_high and args.rm_type == "exact_match"
    assert args.sglang_args == [] and args.hf_checkpoint == "tiny:digits"
    for name, spec in FIELDS.items():
        assert getattr(args, name) == getattr(getattr(cfg, spec.section), name)
    assert set(dir(args)) == set(FIELDS)
    assert args.to_dict() == cfg.to_dict()


def test_flat_view_is_read_only_and_current():
    cfg = digits("--rollout-stop", "x")
    args = cfg.flat()
    with pytest.raises(AttributeError, match="read-only"):
        args.rollout_temperature = 0.5
    with pytest.raises(AttributeError, match="read-only"):
        del args.lr
    stop = args.rollout_stop
    stop.append("y")                                # a copy: the job's config is untouched
    assert cfg.rollout.rollout_stop == ["x"]
    cfg.rollout.rollout_temperature = 0.7           # the view reads through
    assert args.rollout_temperature == 0.7


def test_flat_view_unknown_names_behave_like_a_namespace():
    args = digits().flat()
    assert getattr(args, "my_plugin_option", "dflt") == "dflt"
    assert not hasattr(args, "engine_user_keys")
    with pytest.raises(AttributeError, match=r"no attribute 'rollout_max_reponse_len'.*did you mean "
                                             r"rollout_max_response_len"):
        args.rollout_max_reponse_len


def test_flat_view_pickles():
    args = digits().flat()
    back = pickle.loads(pickle.dumps(args))
    assert isinstance(back, FlatArgs) and back.to_dict() == args.to_dict()


# ---------------------------------------------------------------------------------------------------------------
# --help

def _train_help() -> str:
    from slime_actors.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exc:
        main(["train", "--help"])
    assert exc.value.code == 0
    return out.getvalue()


def test_help_lists_every_flag_with_its_default():
    text = _train_help()
    entries = {}     # each option's entry: from its line ("  --flag ...") to the next option or group
    for chunk in re.split(r"\n(?=  -|\S)", text[text.index("options:"):]):
        m = re.match(r"\s+(--[\w-]+)", chunk)
        if m:
            entries[m.group(1)] = " ".join(chunk.split())
    for s in FIELDS.values():
        if s.cli:
            assert s.option in entries, f"{s.option} is not in --help"
            assert entries[s.option].endswith(f"(default: {s.default})"), entries[s.option]
            # a help text of its own, not only the default
            assert len(entries[s.option].split("(default:")[0].split(maxsplit=1)[-1]) > 15, entries[s.option]
    from slime_actors.slime_compat import COMPAT
    for name, f in COMPAT.items():
        assert name in entries and f.note.split(" (")[0][:40].replace(" ", "") in entries[name].replace(" ", ""), name
    assert set(entries) == {s.option for s in FIELDS.values() if s.cli} | set(COMPAT) | {"--version"}
    for cls in SECTIONS.values():
        assert f"\n{cls.TITLE}:\n" in text


def test_flags_and_defaults_of_the_parser_are_the_fields():
    from slime_actors.config import build_parser
    from slime_actors.config import COMPAT_DEST
    actions = {a.dest: a for a in build_parser()._actions if a.dest not in ("help", "version")
               and not a.dest.startswith(COMPAT_DEST)}
    assert set(actions) == {s.name for s in FIELDS.values() if s.cli}
    for name, a in actions.items():
        spec = FIELDS[name]
        assert a.default == spec.default and a.option_strings == [spec.option]
        assert (a.nargs == "+") == spec.is_list and a.choices == spec.choices
        assert (a.const is True) == (spec.base is bool and not spec.is_list)  # bare --flag means true
        assert (a.nargs == 0) == spec.switch   # store_true for bools defaulting to False


def test_an_actor_process_names_the_job_file_and_the_field(tmp_path):
    from slime_actors.launch.actor import load_job_config
    good = digits().to_dict()
    path = tmp_path / "job.json"
    path.write_text(json.dumps(good))
    assert load_job_config(str(path)) == JobConfig.from_dict(good)
    path.write_text(json.dumps({**good, "n_samples_per_prompt": "eight"}))
    with pytest.raises(SystemExit) as exc:
        load_job_config(str(path))
    assert str(exc.value) == (f"error: job file {path}: field 'n_samples_per_prompt' (--n-samples-per-prompt) must be "
                              "an integer, got 'eight'")


# ---------------------------------------------------------------------------------------------------------------
# the package reads the typed config

PKG = os.path.join(ROOT, "slime_actors")
# argparse namespaces of other commands, not the job's config (the local engine's own CLI, `slime-actors trace`)
OWN_CLI_NAMESPACES = ("backends/local_engine", "traces/cli.py")


def _package_sources():
    for dirpath, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                yield os.path.relpath(path, PKG).replace(os.sep, "/"), open(path).read()


def test_no_namespace_and_no_getattr_defaults_on_args_in_the_package():
    namespaces, getattrs = [], []
    for rel, text in _package_sources():
        if rel != "config.py" and re.search(r"Namespace\(\s*\*\*", text):
            namespaces.append(rel)
        if rel != "config.py" and not rel.startswith(OWN_CLI_NAMESPACES) \
                and re.search(r"getattr\(\s*(self\.)?(args|cfg|a)\s*,", text):
            getattrs.append(rel)
    assert not namespaces, f"argparse.Namespace(**...) outside slime_actors/config.py: {namespaces}"
    assert not getattrs, f"getattr(args, ...) instead of the typed config: {getattrs}"
