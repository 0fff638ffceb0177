"""slime_actors.plugins.load_function: dotted paths, file paths, and errors that say what is missing."""

import sys
import uuid

import pytest

from slime_actors.plugins import PluginError, clear_cache, load_function, maybe_load_function


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """A fresh importable package <name>/ with mod.py, on sys.path; yields its name."""
    name = f"plug_{uuid.uuid4().hex[:8]}"
    d = tmp_path / name
    d.mkdir()
    (d / "__init__.py").write_text("")
    (d / "mod.py").write_text(
        "VALUE = 3\n"
        "def score(args, sample):\n    return 1.0\n"
        "async def ascore(args, sample):\n    return 0.5\n"
        "class Scorer:\n    @staticmethod\n    def score(args, sample):\n        return 2.0\n")
    (d / "broken_dep.py").write_text("import definitely_not_installed_xyz\ndef f():\n    pass\n")
    (d / "raises.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    clear_cache()
    yield name
    for m in [m for m in sys.modules if m.startswith(name)]:
        del sys.modules[m]
    clear_cache()


def test_dotted_paths(pkg):
    assert load_function(f"{pkg}.mod.score")(None, None) == 1.0
    assert load_function(f"{pkg}.mod:ascore").__name__ == "ascore"
    assert load_function(f"{pkg}.mod.Scorer.score")(None, None) == 2.0      # attribute of a class
    assert load_function(f"{pkg}.mod:Scorer.score")(None, None) == 2.0
    assert load_function("os.path.join") is __import__("os").path.join
    # cached: the same object, without importing again
    assert load_function(f"{pkg}.mod.score") is load_function(f"{pkg}.mod.score")


def test_file_path(tmp_path):
    f = tmp_path / "my reward-fn.py"
    f.write_text("def reward(args, sample):\n    return 7\n")
    fn = load_function(f"{f}:reward")
    assert fn(None, None) == 7
    assert fn.__module__.startswith("slime_actors_plugin_my_reward_fn_")
    assert fn.__module__ in sys.modules


def test_module_not_found(pkg):
    with pytest.raises(PluginError) as e:
        load_function("no_such_pkg_zz.mod.fn", flag="--custom-rm-path")
    assert e.value.kind == "module_not_found"
    assert "--custom-rm-path" in str(e.value) and "'no_such_pkg_zz.mod'" in str(e.value)
    with pytest.raises(PluginError) as e:
        load_function(f"{pkg}.nomod.fn")         # package exists, submodule does not
    assert e.value.kind == "module_not_found" and f"'{pkg}.nomod'" in str(e.value)
    with pytest.raises(PluginError) as e:
        load_function("no_such_pkg_zz:fn")
    assert e.value.kind == "module_not_found"
    with pytest.raises(PluginError) as e:
        load_function("/nonexistent/dir/rm.py:fn")
    assert e.value.kind == "module_not_found" and "/nonexistent/dir/rm.py" in str(e.value)


def test_attribute_missing(pkg, tmp_path):
    with pytest.raises(PluginError) as e:
        load_function(f"{pkg}.mod.scor")
    assert e.value.kind == "attribute_missing"
    assert f"module '{pkg}.mod' has no attribute 'scor'" in str(e.value)
    assert "did you mean score" in str(e.value)
    with pytest.raises(PluginError) as e:
        load_function(f"{pkg}.mod.Scorer.nope")
    assert e.value.kind == "attribute_missing" and "'nope'" in str(e.value)
    f = tmp_path / "f.py"
    f.write_text("x = 1\n")
    with pytest.raises(PluginError) as e:
        load_function(f"{f}:missing")
    assert e.value.kind == "attribute_missing" and "'missing'" in str(e.value)


def test_not_callable(pkg):
    with pytest.raises(PluginError) as e:
        load_function(f"{pkg}.mod.VALUE")
    assert e.value.kind == "not_callable" and "int" in str(e.value)


def test_import_failures_are_not_reported_as_missing(pkg, tmp_path):
    with pytest.raises(PluginError) as e:
        load_function(f"{pkg}.broken_dep.f")
    assert e.value.kind == "import_failed"
    assert "definitely_not_installed_xyz" in str(e.value)
    with pytest.raises(PluginError) as e:
        load_function(f"{pkg}.raises.f")
    assert e.value.kind == "import_failed" and "boom at import" in str(e.value)
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n")
    with pytest.raises(PluginError) as e:
        load_function(f"{bad}:f")
    assert e.value.kind == "import_failed" and "SyntaxError" in str(e.value)


@pytest.mark.parametrize("path", ["", "   ", "fn", "a b.c", "reward.py", ":fn", "mod:"])
def test_bad_paths(path):
    with pytest.raises(PluginError) as e:
        load_function(path)
    assert e.value.kind == "bad_path"


def test_maybe_load_function():
    assert maybe_load_function(None) is None
    assert maybe_load_function("") is None
    assert maybe_load_function("os.getcwd") is __import__("os").getcwd


def test_plugin_error_is_import_error():
    with pytest.raises(ImportError):
        load_function("no_such_pkg_zz.fn")


def test_a_reward_worker_hands_its_function_the_jobs_flat_view(loop_thread, run_dir, tmp_path):
    """A reward actor rebuilds the job's typed config; the user's function gets slime's `args` made from it:
    attribute access by flag name, the job's values, read-only."""
    from helpers import Echo, job_config
    from slime_actors.actors.reward import RewardWorker
    from slime_actors.runtime import RuntimeConfig
    from slime_actors.types import Sample
    f = tmp_path / "seen_rm.py"
    f.write_text("seen = {}\n"
                 "def score(args, sample):\n"
                 "    seen.update(type=type(args).__name__, n=args.n_samples_per_prompt, stop=args.rollout_stop)\n"
                 "    try:\n"
                 "        args.rollout_max_response_len = 1\n"
                 "    except AttributeError as exc:\n"
                 "        seen['set'] = str(exc)\n"
                 "    return float(args.rollout_max_response_len)\n")
    cfg = job_config(custom_rm_path=f"{f}:score", n_samples_per_prompt=4, rollout_max_response_len=7,
                     rollout_stop=["</s>"])
    r = RewardWorker(0, args=cfg.to_dict())
    ep = loop_thread.call(r.start(RuntimeConfig(run_dir=run_dir, curve=False)), timeout=120)
    asker = Echo(1)
    loop_thread.call(asker.start(RuntimeConfig(run_dir=run_dir, curve=False, static_peers={"reward/0": ep})))
    try:
        sample = Sample(index=0, group_index=0, prompt="q", response="r", label="l").to_wire()
        rep = loop_thread.call(asker.ask("reward/0", "score", {"samples": [sample]}, timeout=60), timeout=90)
    finally:
        loop_thread.call(asker.stop())
        loop_thread.call(r.stop())
    assert rep["rewards"] == [7.0] and rep["errors"] == [None]
    seen = load_function(f"{f}:score").__globals__["seen"]
    assert seen["type"] == "FlatArgs" and seen["n"] == 4 and seen["stop"] == ["</s>"]
    assert "read-only" in seen["set"]


def test_a_plugin_file_nested_too_deep_for_the_parser_is_named(tmp_path):
    """The launcher reads a plug-in's file with Python's parser before any process starts: a file whose expression
    nests deeper than the parser goes raised RecursionError (or MemoryError) out of the check, a traceback."""
    from slime_actors.plugins import check_function_path
    for name, expr in (("sum.py", "+".join(["a"] * 200_000)), ("neg.py", "-" * 200_000 + "1")):
        f = tmp_path / name
        f.write_text(f"x = {expr}\n\ndef fn(args, sample):\n    return 1.0\n")
        assert check_function_path(f"{f}:fn", "--custom-rm-path") == \
            f"--custom-rm-path: cannot load '{f}:fn': {f}: nested too deep for Python's parser"
