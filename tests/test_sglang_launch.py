"""Launching engines and the router (slime_actors/backends/sglang_launch.py): the command both engines get, the
--sglang-* / --router-* passthrough, its validation -- with SGLang's own parser when `sglang` is importable (a small
fake package here, shaped like SGLang 0.5.15.post1's ServerArgs.add_cli_args), else the recorded flag table -- and the
launch path end to end with only the module name changed (the local engine runs SGLang's command line)."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path

import pytest

from slime_actors.backends import sglang_flags
from slime_actors.backends.engine_auth import EngineKeys
from slime_actors.backends.engine_client import EngineClient, EngineError, parse_generate_output
from slime_actors.backends.engine_process import launch_engine
from slime_actors.backends.sglang_launch import (LOCAL_ENGINE_MODULE, ROUTER_MODULE, SGLANG_MODULE, SGLangFlagError,
                                                 check_engine_flags, check_router_flags, check_sglang_flags,
                                                 engine_command, engine_host, flag_value, router_command,
                                                 split_flags)
from slime_actors.backends.weight_sync import find_free_port
from slime_actors.config import ConfigError
from slime_actors.launch.job_config import build_job_config

pytestmark = pytest.mark.timeout(300)

DATA = Path(__file__).parent / "data"
SERVER = json.loads((DATA / "sglang_server_args_0.5.15.post1.json").read_text())
ROUTER = json.loads((DATA / "sglang_router_args_0.3.2.json").read_text())
# the passthrough the GPU check uses (shared/sglang-gpu/README.md's working launch line)
GPU_FLAGS = ["--sglang-attention-backend", "triton", "--sglang-sampling-backend", "pytorch",
             "--sglang-disable-cuda-graph", "--sglang-mem-fraction-static", "0.2", "--sglang-skip-tokenizer-init",
             "--sglang-grammar-backend", "none"]


@pytest.fixture
def prompts(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"input": "1 2 3 first =", "label": "1"}\n')
    return str(p)


def args_for(prompts, *extra):
    """The job's config as the launcher builds it (its SGLang passthrough checked)."""
    cfg, _ = build_job_config(["--prompt-data", prompts, "--hf-checkpoint", "/models/m", "--rm-type", "exact_match",
                               "--seed", "7", *extra])
    return cfg


@pytest.fixture
def no_sglang(monkeypatch):
    """Make sure neither a real nor a fake sglang / sglang_router is importable (the recorded tables are used)."""
    import slime_actors.backends.sglang_launch as sl
    monkeypatch.setattr(sl, "_importable", lambda name: False)


# -- the recorded tables ------------------------------------------------------------------------------------------

def test_generated_flag_table_matches_the_recorded_json():
    def nargs(flags):
        return {f: (0 if not r["takes_value"] else r.get("nargs")) for f, r in flags.items()}
    assert sglang_flags.SERVER_FLAGS == nargs(SERVER["flags"])
    assert sglang_flags.ROUTER_FLAGS == nargs(ROUTER["flags"])
    assert sglang_flags.SGLANG_VERSION == SERVER["sglang_version"] == "0.5.15.post1"
    # spot checks against SGLang's source (server_args.py): a value flag, a bool, a deprecated bool, an alias
    f = SERVER["flags"]
    assert f["--mem-fraction-static"]["takes_value"] and f["--mem-fraction-static"]["dest"] == "mem_fraction_static"
    assert not f["--skip-tokenizer-init"]["takes_value"]
    assert not f["--disable-cuda-graph"]["takes_value"] and f["--disable-cuda-graph"]["deprecated"]
    assert f["--tensor-parallel-size"]["dest"] == "tp_size" and f["--model"]["dest"] == "model_path"
    assert f["--model-path"]["required"] and f["--cuda-graph-bs"]["nargs"] == "+"
    assert "--get-weight-version" not in f and len({r["dest"] for r in f.values()}) > 400


# -- the command --------------------------------------------------------------------------------------------------

def test_engine_command_sglang(prompts, no_sglang):
    a = args_for(prompts, "--rollout-engine", "sglang", "--rollout-num-gpus-per-engine", "4", "--sglang-pp-size", "2",
                 "--engine-api-key", "k", *GPU_FLAGS)
    module, argv = engine_command(a, 3, 31000, config="/run/keys/engine-3.yaml")
    assert module == SGLANG_MODULE
    # the keys travel in the --config file, never on the command line
    assert argv == ["--model-path", "/models/m", "--host", "127.0.0.1", "--port", "31000", "--tp-size", "2",
                    "--random-seed", "10", "--weight-version", "0", "--config", "/run/keys/engine-3.yaml",
                    "--pp-size", "2", *[x.replace("--sglang-", "--") for x in GPU_FLAGS]]
    assert "k" not in argv and a.engine.engine_api_key is None and a.engine_user_keys.api_key == "k"
    # every flag we pass is one of SGLang 0.5.15.post1's (ServerArgs.add_cli_args)
    assert {f for f, _ in split_flags(argv)} <= set(SERVER["flags"])
    assert check_engine_flags(module, argv).startswith("SGLang 0.5.15.post1 (recorded table")


def test_engine_command_local_and_gpu_placement(prompts):
    a = args_for(prompts, "--device", "cuda", "--actor-num-gpus-per-node", "4", "--num-gpus-per-node", "8",
                 "--engine-max-batch-size", "16")
    module, argv = engine_command(a, 1, 30001)
    assert module == LOCAL_ENGINE_MODULE
    # disaggregated: engine 1 starts after the trainer's 4 GPUs and engine 0's 1
    assert argv == ["--model-path", "/models/m", "--host", "127.0.0.1", "--port", "30001", "--tp-size", "1",
                    "--random-seed", "8", "--weight-version", "0", "--base-gpu-id", "5", "--device", "cuda",
                    "--max-running-requests", "16"]
    # engines of 2 GPUs (SGLang's: the local engine runs on one device): engine 1 after the trainer's 4 and engine 0's 2
    a = args_for(prompts, "--device", "cuda", "--actor-num-gpus-per-node", "4", "--num-gpus-per-node", "8",
                 "--rollout-num-gpus-per-engine", "2", "--rollout-engine", "sglang")
    module, argv = engine_command(a, 1, 30001)
    assert argv[argv.index("--tp-size") + 1] == "2" and argv[argv.index("--base-gpu-id") + 1] == "6"
    a = args_for(prompts, "--device", "cuda", "--colocate", "--rollout-num-gpus-per-engine", "2", "--num-gpus-per-node",
                 "8", "--rollout-engine", "sglang")
    assert engine_command(a, 3, 1)[1][argv.index("--base-gpu-id") + 1] == "6"   # colocated: 3 x 2
    a = args_for(prompts, "--device", "cuda", "--sglang-base-gpu-id", "5")       # the user's choice wins
    argv = engine_command(a, 0, 1)[1]
    assert argv.count("--base-gpu-id") == 1 and argv[-2:] == ["--base-gpu-id", "5"]
    assert "--base-gpu-id" not in engine_command(args_for(prompts), 0, 1)[1]     # CPU: no GPU placement



def test_the_local_engine_computes_in_bf16_under_bf16_unless_its_dtype_is_given(prompts, no_sglang):
    """--bf16 trains under bf16 autocast: the local engine (whose "auto" is float32) generates in bf16 with it; an
    explicit --sglang-dtype wins; SGLang keeps its own auto (the checkpoint's dtype), as upstream slime."""
    def dtypes(*flags):
        argv = engine_command(args_for(prompts, *flags), 0, 1)[1]
        return [argv[i + 1] for i, x in enumerate(argv) if x == "--dtype"]
    assert dtypes() == []
    assert dtypes("--bf16") == ["bfloat16"]
    assert dtypes("--bf16", "--sglang-dtype", "float32") == ["float32"]
    assert dtypes("--bf16", "--rollout-engine", "sglang", *GPU_FLAGS) == []

@pytest.mark.parametrize("flag, use", [("--sglang-port", "picks a free port"), ("--sglang-tp-size", "--rollout-num"),
                                       ("--sglang-model-path", "--hf-checkpoint"), ("--sglang-api-key", "--engine-api"),
                                       ("--sglang-admin-api-key", "--engine-admin-api-key-file"),
                                       ("--sglang-config", r"\[sglang\] table"), ("--sglang-random-seed", "--seed")])
def test_owned_flags_cannot_be_passed_through(prompts, flag, use):
    # (--sglang-config is also slime's own flag, its deployment files: the refusal says both)
    said = "is slime's flag.*cannot be passed through" if flag == "--sglang-config" else "cannot be passed through"
    with pytest.raises(ConfigError, match=f"{flag} {said}.*{use}"):
        args_for(prompts, "--rollout-engine", "sglang", flag, "1")


def test_unknown_or_malformed_passthrough_is_a_clear_error(prompts, no_sglang):
    with pytest.raises(ConfigError, match=r"--mem-fraction-statc is not a launch flag of SGLang 0\.5\.15\.post1 .*"
                                          r"did you mean --mem-fraction-static"):
        args_for(prompts, "--rollout-engine", "sglang", "--sglang-mem-fraction-statc", "0.2")
    with pytest.raises(ConfigError, match="--disable-radix-cache takes no value"):
        args_for(prompts, "--rollout-engine", "sglang", "--sglang-disable-radix-cache", "yes")
    with pytest.raises(ConfigError, match="--mem-fraction-static takes one value"):
        args_for(prompts, "--rollout-engine", "sglang", "--sglang-mem-fraction-static")
    # the local engine takes SGLang's flags too, checked against the same table
    with pytest.raises(ConfigError, match="--no-such-thing is not a launch flag"):
        args_for(prompts, "--sglang-no-such-thing")
    a = args_for(prompts, "--sglang-mem-fraction-static", "0.5")  # fine for the local engine (ignored there)
    assert a.engine.sglang_args == ["--mem-fraction-static", "0.5"]
    # slime's --sglang-router-ip/port are ours, not passed to SGLang
    a = args_for(prompts, "--use-sglang-router", "--sglang-router-ip", "10.0.0.1", "--sglang-router-port", "3000")
    assert (a.engine.sglang_router_ip, a.engine.sglang_router_port, a.engine.sglang_args) == ("10.0.0.1", 3000, [])
    with pytest.raises(ConfigError, match="needs --sglang-router-port"):
        args_for(prompts, "--sglang-router-ip", "10.0.0.1")


# -- SGLang's own parser, when importable -------------------------------------------------------------------------

# Shaped like SGLang 0.5.15.post1: python/sglang/srt/arg_groups/arg_utils.py (A = Annotated, Arg metadata,
# add_cli_args_from_dataclass deriving --field-name, bool -> store_true, List -> nargs "+", choices, aliases) and
# python/sglang/srt/server_args.py (a dataclass ServerArgs whose staticmethod add_cli_args(parser) calls it, then
# adds dynamic-choice and deprecated flags by hand). Only a few fields; `--fake-only-flag` is in no recorded table.
FAKE_ARG_UTILS = '''
import dataclasses
from typing import Annotated, List, Optional, get_args, get_origin, get_type_hints, Union
A = Annotated

@dataclasses.dataclass(frozen=True)
class Arg:
    help: str = ""
    choices: Optional[list] = None
    aliases: Optional[List[str]] = None
    cli_name: Optional[str] = None
    nargs: Optional[str] = None
    action: object = None
    no_cli: bool = False

def add_cli_args_from_dataclass(parser, cls):
    hints = get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if get_origin(hint) is not Annotated:
            continue
        inner, meta = get_args(hint)[0], get_args(hint)[1]
        meta = Arg(help=meta) if isinstance(meta, str) else meta
        if meta.no_cli:
            continue
        names = [meta.cli_name or "--" + f.name.replace("_", "-")] + (meta.aliases or [])
        if get_origin(inner) is Union:
            inner = [t for t in get_args(inner) if t is not type(None)][0]
        kw = {"dest": f.name, "help": meta.help}
        if f.default is not dataclasses.MISSING:
            kw["default"] = f.default
        if meta.action is not None:
            parser.add_argument(*names, action=meta.action, **kw)
        elif inner is bool:
            parser.add_argument(*names, action="store_true", **kw)
        elif get_origin(inner) in (list, List):
            parser.add_argument(*names, type=get_args(inner)[0], nargs=meta.nargs or "+", **kw)
        else:
            if f.default is dataclasses.MISSING:
                kw["required"] = True
            parser.add_argument(*names, type=inner, choices=meta.choices, **kw)
'''
FAKE_SERVER_ARGS = '''
import argparse, dataclasses
from typing import List, Optional
from sglang.srt.arg_groups.arg_utils import A, Arg, add_cli_args_from_dataclass

@dataclasses.dataclass
class ServerArgs:
    model_path: A[str, Arg(help="model", aliases=["--model"])]
    host: A[str, "host"] = "127.0.0.1"
    port: A[int, "port"] = 30000
    tp_size: A[int, Arg(help="tp", aliases=["--tensor-parallel-size"])] = 1
    random_seed: A[Optional[int], "seed"] = None
    weight_version: A[str, "version"] = "default"
    api_key: A[Optional[str], "key"] = None
    base_gpu_id: A[int, "gpu"] = 0
    mem_fraction_static: A[Optional[float], "mem"] = None
    attention_backend: A[Optional[str], Arg(help="attn", choices=["triton", "fa3", "flashinfer"])] = None
    skip_tokenizer_init: A[bool, "skip"] = False
    cuda_graph_bs: A[Optional[List[int]], "bs"] = None
    fake_only_flag: A[bool, "only in the fake"] = False

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        add_cli_args_from_dataclass(parser, ServerArgs)
        parser.add_argument("--config", type=str)
        parser.add_argument("--disable-cuda-graph", action="store_true", help="deprecated")
'''
FAKE_ROUTER_ARGS = '''
import dataclasses

@dataclasses.dataclass
class RouterArgs:
    host: str = "127.0.0.1"
    port: int = 30000

    @staticmethod
    def add_cli_args(parser, use_router_prefix=False, exclude_host_port=False):
        prefix = "router-" if use_router_prefix else ""
        if not exclude_host_port:
            parser.add_argument("--host", type=str, default=RouterArgs.host)
            parser.add_argument("--port", type=int, default=RouterArgs.port)
        parser.add_argument("--worker-urls", type=str, nargs="*", default=[])
        parser.add_argument(f"--{prefix}policy", type=str, choices=["random", "round_robin", "cache_aware"])
        parser.add_argument(f"--{prefix}disable-health-check", action="store_true")
        parser.add_argument(f"--{prefix}disable-circuit-breaker", action="store_true")
        parser.add_argument(f"--{prefix}prometheus-port", type=int)
        parser.add_argument(f"--{prefix}prometheus-host", type=str)
'''


@pytest.fixture
def fake_sglang(tmp_path, monkeypatch):
    root = tmp_path / "site"
    files = {"sglang/__init__.py": "__version__ = '0.0.0.fake'\n", "sglang/srt/__init__.py": "",
             "sglang/srt/arg_groups/__init__.py": "", "sglang/srt/arg_groups/arg_utils.py": FAKE_ARG_UTILS,
             "sglang/srt/server_args.py": FAKE_SERVER_ARGS, "sglang_router/__init__.py": "",
             "sglang_router/router_args.py": FAKE_ROUTER_ARGS}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(root))
    # the head's check remembers what passed (sglang_flag_cache): in this test's folder, not the home directory
    monkeypatch.setenv("SLIME_ACTORS_SGLANG_FLAG_CACHE", str(tmp_path / "flag-cache.json"))
    for name in [m for m in sys.modules if m.split(".")[0] in ("sglang", "sglang_router")]:
        monkeypatch.delitem(sys.modules, name)
    yield root
    for name in [m for m in sys.modules if m.split(".")[0] in ("sglang", "sglang_router")]:
        del sys.modules[name]


def test_validation_uses_sglangs_parser_when_importable(prompts, fake_sglang):
    argv = ["--model-path", "m", "--port", "1", "--tp-size", "1", "--random-seed", "1", "--weight-version", "0",
            "--mem-fraction-static", "0.2", "--attention-backend", "triton", "--skip-tokenizer-init",
            "--cuda-graph-bs", "1", "2", "--fake-only-flag", "--disable-cuda-graph"]
    assert check_sglang_flags(argv) == "SGLang 0.0.0.fake (sglang.srt.server_args.ServerArgs)"
    # a flag only the recorded table knows is refused by this SGLang: its parser is the judge
    with pytest.raises(SGLangFlagError, match=r"--enable-metrics is not a launch flag of SGLang 0\.0\.0\.fake"):
        check_sglang_flags(argv + ["--enable-metrics"])
    with pytest.raises(SGLangFlagError, match=r"--mem-fraction-statik is not .*did you mean --mem-fraction-static"):
        check_sglang_flags(argv + ["--mem-fraction-statik", "0.3"])
    with pytest.raises(SGLangFlagError, match="--attention-backend: invalid choice: 'fa9'"):
        check_sglang_flags(argv + ["--attention-backend", "fa9"])
    with pytest.raises(SGLangFlagError, match="--mem-fraction-static: invalid float value"):
        check_sglang_flags(argv + ["--mem-fraction-static", "lots"])
    with pytest.raises(SGLangFlagError, match="--model-path"):
        check_sglang_flags(["--port", "1"])
    # through the job's flags: --sglang-fake-only-flag passes (this SGLang has it), a typo does not
    a = args_for(prompts, "--rollout-engine", "sglang", "--sglang-fake-only-flag", "--sglang-attention-backend", "fa3")
    assert a.engine.sglang_args == ["--fake-only-flag", "--attention-backend", "fa3"]
    with pytest.raises(ConfigError, match="--fake-only-flg is not a launch flag of SGLang 0.0.0.fake"):
        args_for(prompts, "--rollout-engine", "sglang", "--sglang-fake-only-flg")
    # router flags with the router's own parser
    module, argv = router_command(args_for(prompts, "--router-policy", "cache_aware"), "127.0.0.1", 3000, 3001)
    assert module == ROUTER_MODULE and check_router_flags(argv).startswith("sglang-router (")
    with pytest.raises(SGLangFlagError, match="--policy: invalid choice"):
        check_router_flags(argv + ["--policy", "nearest"])


def test_router_command(prompts, no_sglang):
    a = args_for(prompts, "--use-sglang-router", "--router-policy", "round_robin", "--router-balance-abs-threshold", "8")
    module, argv = router_command(a, "127.0.0.1", 3000, prometheus_port=3001)
    assert module == ROUTER_MODULE
    assert argv == ["--host", "127.0.0.1", "--port", "3000", "--disable-health-check", "--disable-circuit-breaker",
                    "--prometheus-port", "3001", "--prometheus-host", "127.0.0.1", "--policy", "round_robin",
                    "--balance-abs-threshold", "8"]
    assert {f for f, _ in split_flags(argv)} <= set(ROUTER["flags"])
    assert check_router_flags(argv).startswith("sglang-router 0.3.2 (recorded table")
    a = args_for(prompts, "--router-health-check-interval-secs", "5")  # their own health checks when asked for
    assert "--disable-health-check" not in router_command(a, "h", 1)[1]
    with pytest.raises(ConfigError, match="--router-port cannot be passed through: use --sglang-router-port"):
        args_for(prompts, "--use-sglang-router", "--router-port", "3")
    with pytest.raises(ConfigError, match="--polcy is not a launch flag of sglang-router 0.3.2"):
        args_for(prompts, "--use-sglang-router", "--router-polcy", "random")


def test_router_command_takes_the_engine_keys(prompts, no_sglang):
    """The router asks for the API key on generation and the admin key on its worker registry; both flags are the
    job's to set."""
    a = args_for(prompts, "--use-sglang-router")
    _, argv = router_command(a, "127.0.0.1", 3000, keys=EngineKeys("api-k", "admin-k"))
    assert flag_value(argv, "--api-key") == "api-k"
    entry = flag_value(argv, "--control-plane-api-keys")
    assert entry.split(":", 3)[2:] == ["admin", "admin-k"]  # id:name:role:key, as RouterArgs parses it
    check_router_flags(argv)
    for flag in ("--router-api-key", "--router-control-plane-api-keys"):
        with pytest.raises(ConfigError, match=f"{flag} cannot be passed through: use --engine"):
            args_for(prompts, "--use-sglang-router", flag, "x")


def test_engines_listen_on_loopback_unless_another_host_needs_them(prompts):
    a = args_for(prompts)
    assert engine_host(a) == "127.0.0.1"
    assert engine_host(a, multi_host=True, node_address="10.0.0.5") == "127.0.0.1"  # no router: only local clients
    r = args_for(prompts, "--use-sglang-router")
    assert engine_host(r) == "127.0.0.1"                                             # the router is on this host
    assert engine_host(r, multi_host=True, node_address="10.0.0.5") == "10.0.0.5"    # ... or on another one
    ext = args_for(prompts, "--use-sglang-router", "--sglang-router-ip", "10.0.0.9", "--sglang-router-port", "30")
    assert engine_host(ext, node_address="10.0.0.5") == "10.0.0.5"
    loc = args_for(prompts, "--use-sglang-router", "--sglang-router-ip", "127.0.0.1", "--sglang-router-port", "30")
    assert engine_host(loc, node_address="10.0.0.5") == "127.0.0.1"
    with pytest.raises(SGLangFlagError, match="set SLIME_ACTORS_ADVERTISE"):
        engine_host(r, multi_host=True, node_address=None)
    assert engine_host(args_for(prompts, "--sglang-host", "10.1.1.1")) == "10.1.1.1"  # the user's choice wins
    module, argv = engine_command(a, 0, 1, host="10.0.0.5")
    assert flag_value(argv, "--host") == "10.0.0.5" and "0.0.0.0" not in argv


def test_more_tokenizer_workers_are_refused_while_engines_have_keys(prompts, no_sglang):
    """SGLang 0.5.15.post1 checks no key with --tokenizer-worker-num > 1 (tests/data/sglang_auth_0.5.15.post1.json)."""
    with pytest.raises(ConfigError, match="--sglang-tokenizer-worker-num 2: SGLang 0.5.15.post1 checks no API key"):
        args_for(prompts, "--rollout-engine", "sglang", "--sglang-tokenizer-worker-num", "2")
    args_for(prompts, "--rollout-engine", "sglang", "--sglang-tokenizer-worker-num", "1")
    args_for(prompts, "--rollout-engine", "sglang", "--sglang-tokenizer-worker-num", "2", "--engine-auth", "false")


# -- the local engine takes SGLang's command line -----------------------------------------------------------------

def test_local_engine_accepts_every_recorded_sglang_flag():
    from slime_actors.backends.local_engine import build_parser, parse_args as engine_args
    ours = {o for a in build_parser()._actions for o in a.option_strings}
    argv = ["--model-path", "m"]
    for flag, nargs in sglang_flags.SERVER_FLAGS.items():
        if flag in ours:
            continue
        argv += [flag] if nargs == 0 else [flag, "x"] if nargs in (None, "?") else [flag, "x", "y"]
    args = engine_args(argv)
    assert len(args.ignored_flags) == len(sglang_flags.SERVER_FLAGS) - len(set(sglang_flags.SERVER_FLAGS) & ours)
    with pytest.raises(SystemExit):
        engine_args(["--model-path", "m", "--not-an-sglang-flag"])


def test_launch_sglang_command_with_the_local_engine(prompts, tmp_path, no_sglang):
    """The rollout worker's SGLang command line, run with only the module name changed."""
    from slime_actors.models.tiny import make_tiny_model
    model = make_tiny_model(tmp_path / "tiny")
    a = args_for(prompts, "--rollout-engine", "sglang", "--hf-checkpoint", str(model), *GPU_FLAGS,
                 "--sglang-max-running-requests", "4", "--sglang-context-length", "64")
    port = find_free_port()
    keys = EngineKeys("sk", "admin-sk")
    module, argv = engine_command(a, 0, port, config=keys.write_engine_config(tmp_path / "keys" / "engine-0.yaml"))
    assert module == SGLANG_MODULE
    check_engine_flags(module, argv)
    lines: list[str] = []
    proc = launch_engine(LOCAL_ENGINE_MODULE, argv, log_path=tmp_path / "engine.log", on_line=lines.append,
                         startup_timeout=120)
    try:
        async def go():
            async with EngineClient(proc.base_url, api_key="nope", timeout=60) as c:  # the file's keys hold
                with pytest.raises(EngineError, match="HTTP 401"):
                    await c.get_weight_version()
            async with EngineClient(proc.base_url, keys=keys, timeout=60) as c:
                out = parse_generate_output(await c.generate([1, 5, 6], {"max_new_tokens": 4, "temperature": 0}))
                info = await c.get_server_info()
                return out, info, await c.get_weight_version()
        out, info, version = asyncio.run(go())
    finally:
        assert proc.stop() == 0
    assert proc.port == port and len(out.output_ids) == 4 and out.weight_version == "0" and version == "0"
    assert info["max_running_requests"] == 4 and info["context_length"] == 64 and info["random_seed"] == 7
    log = (tmp_path / "engine.log").read_text()
    for flag in ("--attention-backend", "--disable-cuda-graph", "--grammar-backend"):
        assert flag in log  # named in the start-up line as accepted and ignored
    assert "--mem-fraction-static" not in log and "mem_fraction_static=0.2" in log  # honoured (a cap on a GPU)
    assert lines  # streamed to the caller too


@pytest.mark.parametrize("script", ["sglang_qwen3_4b_grpo_disagg.sh", "sglang_qwen3_4b_grpo_colocated.sh"])
def test_gpu_cluster_launch_scripts_parse(tmp_path, script, no_sglang):
    """examples/launch/sglang_qwen3_4b_grpo_*.sh: every flag parses and checks (CHECK_ONLY=1), with stand-in paths."""
    import os
    import subprocess
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    for f in ("d.jsonl", "e.jsonl"):
        (tmp_path / f).write_text("")
    env = {**os.environ, "CHECK_ONLY": "1", "MODEL": str(tmp_path / "m"), "DATA": str(tmp_path / "d.jsonl"),
           "EVAL": str(tmp_path / "e.jsonl"), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(root)}
    r = subprocess.run(["bash", str(root / "examples" / "launch" / script)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ok: sglang ["), r.stdout + r.stderr
    assert "--mem-fraction-static" in r.stdout
