"""The engines' HTTP keys (slime_actors/backends/engine_auth.py): where they live and with what permissions, how the
job gets them (its own, the user's flags and files, the environment), that they stay out of logs and command lines,
and that an engine holding them refuses -- and is not changed by -- a request without the right one."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slime_actors.backends.engine_auth import (ADMIN_PATHS, ENV_ADMIN_KEY, ENV_API_KEY, EngineKeyError, EngineKeys,
                                               engine_warnings, job_engine_keys, redact_server_info,
                                               startup_warnings)
from slime_actors.backends.engine_client import EngineClient
from slime_actors.backends.engine_process import LOCAL_ENGINE_MODULE, EngineProcess, launch_engine
from slime_actors.config import ConfigError
from slime_actors.launch.job_config import build_job_config
from slime_actors.models.tiny import make_tiny_model

pytestmark = pytest.mark.timeout(300)

API, ADMIN = "api-" + "a" * 40, "adm-" + "b" * 40


@pytest.fixture
def prompts(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"input": "1 2 3 first =", "label": "1"}\n')
    return str(p)


def args_for(prompts, *extra):
    """The job's config as the launcher builds it (the user's keys taken out)."""
    cfg, _ = build_job_config(["--prompt-data", prompts, "--hf-checkpoint", "/models/m", "--rm-type", "exact_match",
                               *extra])
    return cfg


def key_file(path: Path, key: str, mode: int = 0o600) -> str:
    path.write_text(key + "\n")
    os.chmod(path, mode)
    return str(path)


@pytest.fixture
def no_key_env(monkeypatch):
    monkeypatch.delenv(ENV_API_KEY, raising=False)
    monkeypatch.delenv(ENV_ADMIN_KEY, raising=False)


# -- the keys: files, environment, the user's ---------------------------------------------------------------------

def test_keys_are_saved_like_the_curve_keys(tmp_path):
    keys = EngineKeys.create()
    assert keys.complete and keys.api_key != keys.admin_key and len(keys.api_key) == 64
    d = keys.save(tmp_path / "run")
    assert d.stat().st_mode & 0o777 == 0o700
    for name in ("engine.api_key", "engine.admin_key"):
        assert (d / name).stat().st_mode & 0o777 == 0o600
    assert EngineKeys.load(tmp_path / "run") == keys
    assert keys.api_key not in repr(keys) and keys.admin_key not in str(keys) and "<set>" in repr(keys)
    os.chmod(d / "engine.admin_key", 0o644)  # readable by others: refused, naming the file and the fix
    with pytest.raises(EngineKeyError, match=r"engine.admin_key can be read by other users \(mode 644\); chmod 600"):
        EngineKeys.load(tmp_path / "run")
    assert EngineKeys.load(tmp_path / "empty") is None
    cfg = keys.write_engine_config(tmp_path / "run" / "keys" / "engine-0.yaml")
    assert cfg.stat().st_mode & 0o777 == 0o600
    assert EngineKeys.from_env(keys.env()) == keys and EngineKeys.from_env({}) is None
    with pytest.raises(EngineKeyError, match=f"{ENV_API_KEY} holds ' '"):
        EngineKeys.from_env({ENV_API_KEY: "two words"})


def test_the_users_keys_leave_the_flags(prompts, tmp_path):
    a = args_for(prompts, "--engine-api-key", API, "--engine-admin-api-key-file", key_file(tmp_path / "adm", ADMIN))
    assert a.engine_user_keys == EngineKeys(API, ADMIN)
    assert a.engine.engine_api_key is None and a.engine.engine_admin_api_key is None
    text = json.dumps(a.to_dict())  # what job.json, actor configs and traces get
    assert API not in text and ADMIN not in text and "engine_user_keys" not in text
    assert args_for(prompts).engine_user_keys is None


@pytest.mark.parametrize("flags, message", [
    (["--engine-api-key", "a b"], "--engine-api-key holds ' '"),
    (["--engine-api-key", "k", "--engine-api-key-file", "/x"], "give --engine-api-key or --engine-api-key-file"),
    (["--engine-admin-api-key-file", "/no/such/file"], "--engine-admin-api-key-file /no/such/file: no such file"),
    (["--engine-api-key-file", "OPEN"], r"can be read by other users \(mode 644\); chmod 600 it"),
    (["--engine-api-key-file", "EMPTY"], "the key in --engine-api-key-file .* is empty"),
    # not a regular file: refused before it is opened (a FIFO blocked the head for ever; /dev/zero filled it)
    (["--engine-api-key-file", "FIFO"], "--engine-api-key-file .*fifo is a FIFO \\(named pipe\\), not a key file"),
    (["--engine-api-key-file", "/dev/zero"], "--engine-api-key-file /dev/zero is a character device, not a key file"),
    (["--engine-api-key-file", "HUGE"], "holds more than 65,536 bytes; a key file holds one key"),
])
@pytest.mark.timeout(60)
def test_bad_key_flags_are_clear_errors(prompts, tmp_path, flags, message):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    os.chmod(fifo, 0o600)
    subst = {"OPEN": key_file(tmp_path / "open", "k", 0o644), "EMPTY": key_file(tmp_path / "empty", ""),
             "FIFO": str(fifo), "HUGE": key_file(tmp_path / "huge", "k" * (65 << 10))}
    with pytest.raises(ConfigError, match=message):
        args_for(prompts, *[subst.get(f, f) for f in flags])


def test_which_keys_a_job_uses(prompts, tmp_path, monkeypatch, no_key_env):
    run = tmp_path / "run"
    made = job_engine_keys(args_for(prompts).engine, run, create=True)
    assert made.complete and EngineKeys.load(run) == made
    # another node (create=False) finds them in RUN_DIR/keys, or in the environment, which wins
    assert job_engine_keys(args_for(prompts).engine, run, create=False) == made
    monkeypatch.setenv(ENV_API_KEY, API)
    assert job_engine_keys(args_for(prompts).engine, run, create=False) == EngineKeys(API, made.admin_key)
    # the user's flags win over the environment; what they do not give is made
    a = args_for(prompts, "--engine-admin-api-key", ADMIN)
    got = job_engine_keys(a.engine, tmp_path / "run2", create=True, user=a.engine_user_keys)
    assert got == EngineKeys(API, ADMIN)
    monkeypatch.delenv(ENV_API_KEY)
    with pytest.raises(EngineKeyError, match=f"no engine keys: set {ENV_API_KEY} and {ENV_ADMIN_KEY}"):
        job_engine_keys(args_for(prompts).engine, tmp_path / "elsewhere", create=False)
    # external engines get exactly what the user gave: nothing made up (it would only be refused)
    ext = args_for(prompts, "--rollout-external-engine-addrs", "10.0.0.2:30000")
    assert job_engine_keys(ext.engine, tmp_path / "run3", create=True) is None
    assert "requests go without Authorization" in startup_warnings(ext.engine, None)[0]
    ext = args_for(prompts, "--rollout-external-engine-addrs", "h:1", "--engine-api-key", API)
    assert job_engine_keys(ext.engine, tmp_path / "run4", True, ext.engine_user_keys) == EngineKeys(API, None)
    assert "no admin key given" in startup_warnings(ext.engine, EngineKeys(API, None))[0]
    off = args_for(prompts, "--engine-auth", "false")
    assert job_engine_keys(off.engine, tmp_path / "run5", create=True) is None
    assert "engine keys are off" in startup_warnings(off.engine, None)[0]
    assert startup_warnings(args_for(prompts).engine, made) == []


def test_what_an_engines_server_info_says_about_its_keys():
    info = redact_server_info({"api_key": API, "admin_api_key": None, "ssl_keyfile_password": "pw", "tp_size": 1})
    assert info == {"api_key": True, "admin_api_key": False, "ssl_keyfile_password": True, "tp_size": 1}
    open_remote = engine_warnings("http://10.0.0.2:30000", {"api_key": False, "admin_api_key": False})
    assert open_remote == ["engine http://10.0.0.2:30000 runs without an API key: anyone who can reach it from other "
                           "hosts can generate, pause or abort it, or replace its weights"]
    leak = engine_warnings("http://127.0.0.1:1", {"api_key": False, "admin_api_key": True})
    assert "shows its admin key to anyone" in leak[0] and "from other hosts" not in leak[0]
    assert "also unlocks weight updates" in engine_warnings("h:1", {"api_key": True, "admin_api_key": False})[0]
    assert engine_warnings("h:1", {"api_key": True, "admin_api_key": True}) == []
    assert engine_warnings("h:1", {"version": "0.4"}) == []  # an engine that does not say: nothing to claim


# -- out of logs and command lines ------------------------------------------------------------------------------------

def test_engine_output_and_command_line_are_redacted(tmp_path):
    """SGLang logs `server_args=ServerArgs(... api_key='...')` at start-up: the log file, the caller's lines and the
    command line shown in logs and errors carry "<redacted>" instead."""
    code = f"print(\"server_args=ServerArgs(api_key='{API}', admin_api_key='{ADMIN}')\", flush=True)"
    cmd = [sys.executable, "-c", code, "--api-key", API]
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen: list[str] = []
    proc = EngineProcess(popen, cmd, "127.0.0.1", 1, tmp_path / "engine.log", seen.append,
                         redact=EngineKeys(API, ADMIN).secrets)
    popen.wait(30)
    proc.stop()
    logged = (tmp_path / "engine.log").read_text()
    assert logged.strip() == "server_args=ServerArgs(api_key='<redacted>', admin_api_key='<redacted>')"
    assert seen == [logged.strip()] and list(proc.lines) == seen
    assert API not in " ".join(proc.argv) and "--api-key <redacted>" in " ".join(proc.argv)


def test_local_engine_reads_keys_from_a_config_file_as_sglang_does(tmp_path, capsys):
    from slime_actors.backends.local_engine import parse_args as engine_args
    cfg = EngineKeys(API, ADMIN).write_engine_config(tmp_path / "keys" / "e.yaml")
    a = engine_args(["--model-path", "m", "--config", str(cfg)])
    assert (a.api_key, a.admin_api_key, a.ignored_flags) == (API, ADMIN, [])
    # the command line wins over the file (SGLang puts the file's flags first)
    assert engine_args(["--config", str(cfg), "--model-path", "m", "--api-key", "cli"]).api_key == "cli"
    (tmp_path / "list.yaml").write_text("- api-key\n")
    (tmp_path / "keys.txt").write_text("api-key: x\n")
    (tmp_path / "bad.yaml").write_text("api-key: [unclosed\n")
    for argv, message in ((["--config", str(tmp_path / "none.yaml")], "no such file"),
                          (["--config", str(tmp_path / "keys.txt")], "must be YAML"),
                          (["--config", str(tmp_path / "list.yaml")], "must hold a mapping"),
                          (["--config", str(tmp_path / "bad.yaml")], "not valid YAML"),
                          (["--config", str(cfg), f"--config={cfg}"], "only one is allowed"),
                          (["--config"], "no config file given")):
        with pytest.raises(SystemExit) as exit_:
            engine_args(["--model-path", "m", *argv])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and message in err, (argv, err[-500:])


# -- an engine with keys: refused requests change nothing -------------------------------------------------------------

@pytest.fixture(scope="module")
def keyed_engine(tmp_path_factory):
    d = tmp_path_factory.mktemp("keyed")
    base, alt = make_tiny_model(d / "base", seed=0), make_tiny_model(d / "alt", seed=1)
    cfg = EngineKeys(API, ADMIN).write_engine_config(d / "keys" / "engine.yaml")
    proc = launch_engine(LOCAL_ENGINE_MODULE, ["--model-path", str(base), "--config", str(cfg), "--weight-version",
                                               "0", "--random-seed", "0"],
                         log_path=d / "engine.log", startup_timeout=120, redact=[API, ADMIN])
    yield proc, alt, d
    assert proc.stop() == 0


async def _post(url, path, body, key):
    import aiohttp
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as s:
        async with s.post(url + path, json=body, headers=headers) as r:
            return r.status, await r.text()


def _bodies(alt: Path) -> dict:
    """For every admin endpoint a body that would change the engine if it were accepted."""
    flat = {"names": ["lm_head.weight"], "dtypes": ["float32"], "shapes": [[1]], "group_name": "g",
            "weight_version": "evil", "flush_cache": True}
    return {"/update_weights_from_disk": {"model_path": str(alt), "weight_version": "evil"},
            "/update_weight_version": {"new_version": "evil"},
            "/abort_request": {"rid": "", "abort_all": True},
            "/pause_generation": {"mode": "abort"},
            "/continue_generation": {},
            "/flush_cache": {},
            "/init_weights_update_group": {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1,
                                           "world_size": 2, "group_name": "g", "backend": "gloo"},
            "/update_weights_from_distributed": flat,
            "/destroy_weights_update_group": {"group_name": "g"},
            "/update_weights_from_tensor": {"serialized_named_tensors": ["AAAA"], "weight_version": "evil"},
            "/update_weights_from_ipc": {**flat, "handle": {"kind": "shm", "path": "/dev/null"}},
            "/load_lora_adapter": {"lora_name": "evil", "lora_path": str(alt)},
            "/unload_lora_adapter": {"lora_name": "evil"},
            "/start_profile": {"output_dir": str(alt / "evil-profiles"), "num_steps": 1},
            "/stop_profile": {}}


def test_requests_without_the_right_key_are_refused_and_change_nothing(keyed_engine):
    proc, alt, _ = keyed_engine
    url = proc.base_url
    bodies = _bodies(alt)
    assert set(bodies) == ADMIN_PATHS

    async def go():
        keys = EngineKeys(API, ADMIN)
        async with EngineClient(url, keys=keys, timeout=60) as c:
            # a request held in the engine (paused in place, with the admin key) that an abort would end
            await c.pause_generation("in_place")
            held = asyncio.create_task(c.generate([1, 5, 6], {"max_new_tokens": 6, "temperature": 0,
                                                             "ignore_eos": True}, rid="held"))
            while sum(s["waiting"] + s["running"] for s in (await c.get_server_info())["internal_states"]) < 1:
                await asyncio.sleep(0.05)
            answers = {}
            for path, body in bodies.items():  # no key, a wrong key, and the API key (not the admin key)
                for who, key in (("none", None), ("wrong", "nope"), ("api", API)):
                    answers[(path, who)] = await _post(url, path, body, key)
            gen = {"input_ids": [1, 5, 6], "sampling_params": {"max_new_tokens": 2}}
            for who, key in (("none", None), ("wrong", "nope"), ("admin", ADMIN)):  # /generate: the API key only
                answers[("/generate", who)] = await _post(url, "/generate", gen, key)
            info = await c.get_server_info()
            version = await c.get_weight_version()
            await c.continue_generation()
            out = await asyncio.wait_for(held, 60)
            return answers, info, version, out
    answers, info, version, out = asyncio.run(asyncio.wait_for(go(), 120))
    refused = {k: v for k, v in answers.items() if v != (401, '{"error": "Unauthorized"}')}
    assert not refused, refused
    # nothing changed: the weights' version, the held request (neither aborted nor let go), the pause itself
    assert version == "0"
    assert info["internal_states"][0]["paused"] is True
    assert info["refused_requests"] == len(answers)
    assert out["meta_info"]["finish_reason"]["type"] == "length" and len(out["output_ids"]) == 6


def test_the_same_requests_with_the_admin_key_do_change_the_engine(keyed_engine):
    """The control for the test above: these requests, refused without the admin key, act with it."""
    proc, alt, _ = keyed_engine

    async def go():
        async with EngineClient(proc.base_url, keys=EngineKeys(API, ADMIN), timeout=60) as c:
            before = await c.get_weight_version()
            status = await _post(proc.base_url, "/update_weight_version", {"new_version": "v7"}, ADMIN)
            after = await c.get_weight_version()
            await c.update_weights_from_disk(str(alt), weight_version="0")
            return before, status, after, await c.get_weight_version()
    before, status, after, final = asyncio.run(asyncio.wait_for(go(), 120))
    assert status[0] == 200 and (before, after, final) == ("0", "v7", "0")


def test_the_engine_log_holds_no_key(keyed_engine):
    proc, _, d = keyed_engine
    text = (d / "engine.log").read_text()
    assert "local engine ready" in text and API not in text and ADMIN not in text
    assert API not in " ".join(proc.argv) and ADMIN not in " ".join(proc.argv)
