"""Environment variables: every SLIME_ACTORS_* name is declared in slime_actors/env.py, and read only through it."""

import re
from pathlib import Path

import pytest

from slime_actors import env as E
from slime_actors.runtime import RuntimeConfig

PKG = Path(__file__).resolve().parents[1] / "slime_actors"
# modules that still read one by its literal name (none: every read goes through slime_actors/env.py)
LITERAL_READS_ALLOWED: set[str] = set()


def _sources():
    for p in sorted(PKG.rglob("*.py")):
        yield p.relative_to(PKG).as_posix(), p.read_text()


def test_every_name_the_package_mentions_is_declared():
    unknown = []
    for rel, text in _sources():
        for m in re.finditer(r"SLIME_ACTORS_[A-Z0-9_]+", text):
            name = m.group(0)
            if name.endswith("_"):  # a family, "SLIME_ACTORS_ENGINE_*"
                continue
            if name not in E.ALL:
                unknown.append(f"{rel}: {name}")
    assert not unknown, unknown


def test_no_module_reads_a_variable_by_its_literal_name():
    pattern = re.compile(r"""(environ\.get|environ\[|getenv)\(?\s*["']SLIME_ACTORS_""")
    found = [rel for rel, text in _sources() if rel != "env.py" and rel not in LITERAL_READS_ALLOWED
             and pattern.search(text)]
    assert not found, found


def test_the_mailbox_keys_are_the_declared_ones():
    from slime_actors.mailbox.security import ENV_PUBLIC, ENV_SECRET
    assert (ENV_PUBLIC, ENV_SECRET) == (E.CURVE_PUBLIC.name, E.CURVE_SECRET.name)


def test_values_are_typed_and_bad_ones_name_the_variable():
    assert E.JOIN_TIMEOUT.get({}) == 600.0 and E.JOIN_TIMEOUT.get({"SLIME_ACTORS_JOIN_TIMEOUT": "12"}) == 12.0
    assert E.CURVE.get({"SLIME_ACTORS_CURVE": "off"}) is False and E.CURVE.get({"SLIME_ACTORS_CURVE": ""}) is None
    with pytest.raises(ValueError, match="SLIME_ACTORS_HEARTBEAT must be a number, got 'soon'"):
        RuntimeConfig.from_env({"SLIME_ACTORS_HEARTBEAT": "soon"})


def test_runtime_settings_travel_to_a_child_and_back():
    rt = RuntimeConfig(run_dir="/tmp/r", directory="ipc:///x", transport="tcp", host="0.0.0.0", advertise="10.0.0.2",
                       curve=False, trace=False, trace_body_limit=1024, trace_keep_arrays=True, trace_batch_limit=7,
                       heartbeat_interval=0.5, liveness=3)
    assert RuntimeConfig.from_env(rt.env()) == rt
    assert RuntimeConfig.from_env({}) == RuntimeConfig()


def test_bad_values_are_job_problems_before_any_process_starts(monkeypatch, tmp_path):
    """The head checks every SLIME_ACTORS_* variable it would hand on, with the flags' problems, all at once: an actor
    process reading SLIME_ACTORS_GC_WARN_MS=fast would otherwise stop at its start, one after another."""
    from slime_actors.config import ConfigError, Problems
    from slime_actors.launch.checks import check_environment
    from slime_actors.launch.job_config import build_job_config
    found, none = Problems(), Problems()
    check_environment(found, {"SLIME_ACTORS_GC_WARN_MS": "fast", "SLIME_ACTORS_HEAPWATCH_EVERY": "1m",
                              "SLIME_ACTORS_GC_FREEZE": "0", "SLIME_ACTORS_JOIN_TIMEOUT": "30"})
    assert sorted(found) == ["SLIME_ACTORS_GC_WARN_MS must be a number, got 'fast'",
                             "SLIME_ACTORS_HEAPWATCH_EVERY must be a number, got '1m'"]
    check_environment(none, {})
    assert none == []
    monkeypatch.setenv("SLIME_ACTORS_GC_WARN_MS", "fast")
    digits = Path(__file__).resolve().parents[1] / "examples" / "digits" / "train.jsonl"
    with pytest.raises(ConfigError) as exc:
        build_job_config(["--prompt-data", str(digits), "--hf-checkpoint", "tiny:digits", "--lr", "-1",
                          "--run-dir", str(tmp_path / "run")])
    text = str(exc.value)
    assert "SLIME_ACTORS_GC_WARN_MS must be a number, got 'fast'" in text and "--lr" in text, text
    assert not (tmp_path / "run").exists()
