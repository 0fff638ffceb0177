"""The head remembers --sglang-* flag lists SGLang's parser accepted (backends/sglang_flag_cache.py): a job started
again with the same flags and the same SGLang skips importing it; anything else is parsed by SGLang again; the cache
file is read as untrusted input."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from slime_actors.backends import sglang_launch as sl
from slime_actors.backends.sglang_flag_cache import MAX_BYTES, FlagCheckCache, default_path
from slime_actors.backends.sglang_launch import SGLANG_MODULE, SGLangFlagError, check_engine_flags, check_sglang_flags
from tests.test_sglang_launch import args_for, fake_sglang, prompts  # noqa: F401  (fixtures)

ARGV = ["--model-path", "m", "--port", "30000", "--tp-size", "1", "--random-seed", "1", "--weight-version", "0",
        "--attention-backend", "triton", "--skip-tokenizer-init"]
PARSED = "SGLang 0.0.0.fake (sglang.srt.server_args.ServerArgs)"


@pytest.fixture
def parses(monkeypatch):
    """Counts the checks that imported SGLang's ServerArgs (the slow part the cache saves)."""
    calls = []
    real = sl.sglang_server_args

    def counting():
        calls.append(1)
        return real()
    monkeypatch.setattr(sl, "sglang_server_args", counting)
    return calls


def cache_file(tmp_path):
    return tmp_path / "flag-cache.json"   # where the fake_sglang fixture points SLIME_ACTORS_SGLANG_FLAG_CACHE


def test_an_accepted_argv_is_not_parsed_again(fake_sglang, parses, tmp_path):
    cache = FlagCheckCache.default()
    assert cache.path == cache_file(tmp_path)
    assert check_sglang_flags(ARGV, cache) == PARSED and len(parses) == 1
    assert check_sglang_flags(ARGV, cache) == f"SGLang's parser, accepted before ({cache.path})"
    assert len(parses) == 1                                   # SGLang not imported the second time
    assert stat.S_IMODE(os.stat(cache.path).st_mode) == 0o600
    # one flag more, one value changed: new argv, parsed again
    check_sglang_flags(ARGV + ["--disable-cuda-graph"], cache)
    check_sglang_flags([a if a != "triton" else "fa3" for a in ARGV], cache)
    assert len(parses) == 3
    # the worker's check at the engine's start takes no cache: SGLang's parser every time
    assert check_engine_flags(SGLANG_MODULE, ARGV) == PARSED and len(parses) == 4


def test_the_model_directory_port_and_seed_the_worker_writes_are_no_new_check(fake_sglang, parses):
    """The comparison script copies the model into each work directory, and a job may move its model: the values
    the rollout worker writes itself (any of them parses) are not part of the key; a value of the wrong kind is."""
    cache = FlagCheckCache.default()
    check_sglang_flags(ARGV, cache)
    moved = list(ARGV)
    for flag, value in (("--model-path", "/elsewhere/models/smollm2-135m-instruct"), ("--port", "31234"),
                        ("--random-seed", "1235")):
        moved[moved.index(flag) + 1] = value
    assert check_sglang_flags(moved, cache).startswith("SGLang's parser, accepted before")
    assert len(parses) == 1
    assert cache.key(moved) == cache.key(ARGV)
    other_tp = list(ARGV)
    other_tp[other_tp.index("--tp-size") + 1] = "2"
    assert cache.key(other_tp) != cache.key(ARGV)
    # not a port: its own key, parsed (and refused) by SGLang's parser every time
    assert cache.key([a if a != "30000" else "http" for a in ARGV]) != cache.key(ARGV)
    with pytest.raises(SGLangFlagError, match="--port"):
        check_sglang_flags([a if a != "30000" else "http" for a in ARGV], cache)
    assert len(parses) == 2
    # the same values under a flag the worker does not write are part of the key
    assert cache.key(ARGV + ["--served-model-name", "a"]) != cache.key(ARGV + ["--served-model-name", "b"])


def test_a_refused_argv_is_never_remembered(fake_sglang, parses):
    cache = FlagCheckCache.default()
    bad = ARGV + ["--attention-backend", "fa9"]
    for _ in range(2):
        with pytest.raises(SGLangFlagError, match="--attention-backend: invalid choice: 'fa9'"):
            check_sglang_flags(bad, cache)
    assert len(parses) == 2 and not cache.path.exists()


def test_another_sglang_parser_is_a_new_key(fake_sglang, parses):
    cache = FlagCheckCache.default()
    check_sglang_flags(ARGV, cache)
    server_args = fake_sglang / "sglang" / "srt" / "server_args.py"
    # SGLang upgraded (or edited): the parser's files differ, so the same argv is parsed by the new parser
    server_args.write_text(server_args.read_text().replace('choices=["triton", "fa3", "flashinfer"]',
                                                           'choices=["fa3", "flashinfer"]'))
    for name in [m for m in sys.modules if m.split(".")[0] == "sglang"]:   # a new process would import it anew
        del sys.modules[name]
    with pytest.raises(SGLangFlagError, match="--attention-backend: invalid choice: 'triton'"):
        check_sglang_flags(ARGV, cache)
    assert len(parses) == 2


def test_the_jobs_check_before_launch_uses_the_cache(fake_sglang, parses, prompts, tmp_path):  # noqa: F811
    for _ in range(2):
        a = args_for(prompts, "--rollout-engine", "sglang", "--sglang-fake-only-flag")
        assert a.engine.sglang_args == ["--fake-only-flag"]
    assert len(parses) == 1 and cache_file(tmp_path).exists()
    # a typo is refused each time, with SGLang's own message
    from slime_actors.config import ConfigError
    for _ in range(2):
        with pytest.raises(ConfigError, match="--fake-only-flg is not a launch flag of SGLang 0.0.0.fake"):
            args_for(prompts, "--rollout-engine", "sglang", "--sglang-fake-only-flg")
    assert len(parses) == 3


@pytest.mark.parametrize("content", [
    b"not json", b"\xff\xfe\x00garbage", b'["a list"]', b'{"accepted": "abc"}', b'{"accepted": [1, null, "zz"]}',
    b'{"accepted": ["' + b"A" * 64 + b'"]}', b" " * (MAX_BYTES + 1)])
def test_a_hostile_cache_file_is_ignored_and_rewritten(fake_sglang, parses, content):
    cache = FlagCheckCache.default()
    cache.path.write_bytes(content)
    assert check_sglang_flags(ARGV, cache) == PARSED and len(parses) == 1
    doc = json.loads(cache.path.read_text())
    assert doc == {"accepted": [cache.key(ARGV)]}
    assert check_sglang_flags(ARGV, cache).startswith("SGLang's parser, accepted before")


def test_a_planted_key_for_other_flags_does_not_pass_these(fake_sglang, parses):
    cache = FlagCheckCache.default()
    cache.path.write_text(json.dumps({"accepted": ["0" * 64, cache.key(["--model-path", "other"])]}))
    with pytest.raises(SGLangFlagError, match="--attention-backend: invalid choice"):
        check_sglang_flags(ARGV + ["--attention-backend", "fa9"], cache)
    assert len(parses) == 1


def test_the_cache_keeps_its_newest_keys(fake_sglang, parses, monkeypatch):
    from slime_actors.backends import sglang_flag_cache
    monkeypatch.setattr(sglang_flag_cache, "KEEP", 3)
    cache = FlagCheckCache.default()
    argvs = [ARGV + ["--weight-version", str(p)] for p in range(5)]
    for argv in argvs:
        check_sglang_flags(argv, cache)
    assert json.loads(cache.path.read_text())["accepted"] == [cache.key(a) for a in argvs[-3:]]


def test_off_and_unwritable(fake_sglang, parses, monkeypatch, tmp_path):
    monkeypatch.setenv("SLIME_ACTORS_SGLANG_FLAG_CACHE", "off")
    assert default_path() is None
    cache = FlagCheckCache.default()
    assert cache.key(ARGV) is None
    check_sglang_flags(ARGV, cache)
    check_sglang_flags(ARGV, cache)
    assert len(parses) == 2
    # a cache that cannot be written: the check still passes (logged), and parses again next time
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cache = FlagCheckCache(blocker / "sub" / "cache.json")
    assert check_sglang_flags(ARGV, cache) == PARSED
    assert check_sglang_flags(ARGV, cache) == PARSED and len(parses) == 4


def test_no_sglang_no_cache(monkeypatch, tmp_path):
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    cache = FlagCheckCache(tmp_path / "c.json")
    assert cache.key(ARGV) is None and not cache.accepted(None)
    cache.remember(None)
    assert not (tmp_path / "c.json").exists()


def test_a_cache_file_over_its_size_limit_is_not_read_even_when_it_holds_the_key(fake_sglang, parses):
    cache = FlagCheckCache.default()
    body = json.dumps({"accepted": [cache.key(ARGV)]})
    cache.path.write_text(" " * MAX_BYTES + body)     # valid JSON holding this argv's key, past the limit
    assert check_sglang_flags(ARGV, cache) == PARSED and len(parses) == 1
    assert json.loads(cache.path.read_text()) == {"accepted": [cache.key(ARGV)]}   # rewritten, small
