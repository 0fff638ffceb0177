"""The launch commands of generation engines and of the sglang-router, built in one place from the job's flags.

    module, argv = engine_command(cfg, index=0, port=30001)       # what rollout worker `index` runs (cfg: JobConfig)
    check_engine_flags(module, argv)                              # SGLangFlagError naming a flag SGLang lacks
    proc = launch_engine(module, argv, ...)                       # slime_actors.backends.engine_process

Both engines get the same flags: `python -m sglang.launch_server` (`--rollout-engine sglang`) or
`python -m slime_actors.backends.local_engine` (`local`), with

    --model-path HF_CHECKPOINT --host HOST --port PORT --tp-size N --random-seed SEED+INDEX
    --weight-version 0 [--config KEYS.yaml] [--base-gpu-id G] [local engine: --device D --max-running-requests M]
    + every `--sglang-<flag> [value ...]` of the job, passed on as `--<flag> [value ...]` (slime's convention)

KEYS.yaml holds the engine's `api-key` and `admin-api-key` (engine_auth.EngineKeys.write_engine_config, mode 0600):
SGLang reads a --config file's flags as if given first, and the keys stay off the command line, which every user of
the host can read. HOST is 127.0.0.1 unless something on another host must reach the engine (`engine_host`).

N is `--rollout-num-gpus-per-engine` divided by a passed-through `--sglang-pp-size` (as slime does); G is the
engine's first GPU (`--device cuda`): after the trainer's GPUs (`--actor-num-gpus-per-node`), or on them with
`--colocate`, modulo `--num-gpus-per-node` (default: the GPUs counted, slime_actors.gpus) -- unless
`--sglang-base-gpu-id` says otherwise. The launcher checks before any process starts that this fits the GPUs
there are (launch/placement.py). The flags the worker
sets itself (`OWNED_FLAGS`) cannot be passed through: that is an error naming the flag to use instead.

Validation: with the `sglang` package importable, the command is parsed by SGLang's own parser
(`ServerArgs.add_cli_args`, as `sglang.launch_server` builds it), so a flag this SGLang does not know, a missing
value or a value outside its choices is an error naming the flag -- before anything is launched (the head remembers
the flag lists that passed, so a job started again with the same flags and the same SGLang skips importing it:
sglang_flag_cache.py; each rollout worker parses its engine's command again while the engine starts). Without it, the
flag names are checked against the table recorded from SGLang 0.5.15.post1's source (`sglang_flags.py`); the
local engine accepts exactly those flags (ignoring the ones that mean nothing to it).

The router: `python -m sglang_router.launch_router --host H --port P ...` plus every `--router-<flag>` as
`--<flag>`; the rollout workers register their engines with it (`POST /workers`) and send generation there.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass

from slime_actors.config import JobConfig
from slime_actors.env import PLACED_GPUS
from slime_actors.log import get_logger

from . import sglang_flags
from .sglang_flag_cache import FlagCheckCache

log = get_logger(component="sglang_launch")

SGLANG_MODULE = "sglang.launch_server"
LOCAL_ENGINE_MODULE = "slime_actors.backends.local_engine"
ROUTER_MODULE = "sglang_router.launch_router"
RECORDED_SGLANG_VERSION = sglang_flags.SGLANG_VERSION
RECORDED_ROUTER_VERSION = sglang_flags.ROUTER_VERSION

# flags the rollout worker sets; the job flag that controls each instead of a passthrough --sglang-<flag>
OWNED_FLAGS = {
    "--model-path": "--hf-checkpoint", "--model": "--hf-checkpoint",
    "--port": "nothing (the rollout worker picks a free port)",
    "--tp-size": "--rollout-num-gpus-per-engine", "--tensor-parallel-size": "--rollout-num-gpus-per-engine",
    "--random-seed": "--seed (engine i gets seed + i)",
    "--weight-version": "nothing (an engine starts at version 0; updates set it)",
    "--api-key": "--engine-api-key-file (the job makes one by default)",
    "--admin-api-key": "--engine-admin-api-key-file (the job makes one by default)",
    "--config": "the [sglang] table of the job's --config file (the rollout worker gives the engine a --config file "
                "of its own, holding its keys)",
}
# router flags the rollout workers set: host/port come from --sglang-router-ip/--sglang-router-port, workers register
OWNED_ROUTER_FLAGS = {"--host": "--sglang-router-ip", "--port": "--sglang-router-port",
                      "--worker-urls": "nothing (each rollout worker registers its engine)",
                      "--api-key": "--engine-api-key-file (the router takes the engines' API key)",
                      "--control-plane-api-keys": "--engine-admin-api-key-file (the router's /workers take the "
                                                  "engines' admin key)"}
ROUTER_KEY_ID = "slime-actors:rollout-workers"  # id:name of the router's control-plane key (role admin)


class SGLangFlagError(ValueError):
    """A launch flag SGLang (or the router) would refuse, or one the rollout worker owns. The message names it."""


# -- argv helpers --------------------------------------------------------------------------------------------

def split_flags(argv: Sequence[str]) -> list[tuple[str, list[str]]]:
    """["--a", "1", "--b", "--c=x", "y"] -> [("--a", ["1"]), ("--b", []), ("--c", ["x", "y"])]. A token that does
    not start with "--" belongs to the flag before it; one before any flag is an error."""
    out: list[tuple[str, list[str]]] = []
    for tok in argv:
        tok = str(tok)
        if tok.startswith("--") and len(tok) > 2:
            name, eq, val = tok.partition("=")
            out.append((name, [val] if eq else []))
        elif out:
            out[-1][1].append(tok)
        else:
            raise SGLangFlagError(f"{tok!r} is not a flag (flags start with --)")
    return out


@dataclass(frozen=True)
class LaunchFlags:
    """Launch flags (the job's --sglang-* passthrough, as --<flag> [value ...]) parsed once: what the launcher's
    checks, its GPU plan and the engine command ask of them.

        flags = LaunchFlags.parse(cfg.engine.sglang_args)
        flags.value("--base-gpu-id")        # the last value given, "" for a bare switch, None when absent
    """
    items: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def parse(cls, argv: Sequence[str]) -> "LaunchFlags":
        return cls(tuple((name, tuple(vals)) for name, vals in split_flags(argv)))

    def value(self, *names: str) -> str | None:
        val = None
        for name, vals in self.items:
            if name in names:
                val = vals[0] if vals else ""
        return val

    def names(self) -> list[str]:
        return [name for name, _ in self.items]

    def with_flag(self, name: str, *values: str) -> "LaunchFlags":
        """These flags and one more (what the launcher adds: a colocated engine's --mem-fraction-static)."""
        return LaunchFlags(self.items + ((name, tuple(values)),))


def flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The (last) value of any of `names` in argv, or None (one question of a command line: several questions
    parse it once with LaunchFlags)."""
    return LaunchFlags.parse(argv).value(*names)


def _suggest(flag: str, known) -> str:
    close = difflib.get_close_matches(flag, list(known), n=3, cutoff=0.75)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


# -- the engine command ---------------------------------------------------------------------------------------

def base_gpu_id(cfg: JobConfig, index: int, placed: str | None = None) -> int | None:
    """First GPU of engine `index` on its node (slime's placement), or None off GPU. Where a topology gave the
    worker its own GPUs (`placed`, default: $SLIME_ACTORS_GPUS; CUDA_VISIBLE_DEVICES then shows only those,
    renumbered from 0) the engine starts at 0."""
    if cfg.run.device.split(":")[0] != "cuda":
        return None
    if placed is None:
        placed = PLACED_GPUS.get()
    if placed:
        return 0
    per_engine = max(1, cfg.engine.rollout_num_gpus_per_engine)
    per_node = cfg.engine.num_gpus_per_node
    if per_node is None:  # (a launcher that did not count them: torchrun, a Slurm submission)
        from slime_actors.gpus import count_gpus
        per_node = count_gpus().count
    per_node = max(1, per_node)
    start = 0 if cfg.engine.colocate or cfg.debug.debug_rollout_only else cfg.train.actor_num_gpus_per_node
    return (start + index * min(per_engine, per_node)) % per_node


def check_passthrough_owned(sglang_args: Sequence[str] | LaunchFlags) -> None:
    flags = sglang_args if isinstance(sglang_args, LaunchFlags) else LaunchFlags.parse(sglang_args)
    for name in flags.names():
        if name in OWNED_FLAGS:
            raise SGLangFlagError(f"--sglang-{name[2:]} cannot be passed through: the rollout worker sets {name} "
                                  f"itself; use {OWNED_FLAGS[name]}")


def engine_host(cfg: JobConfig, multi_host: bool = False, node_address: str | None = None) -> str:
    """The address an engine (or the router rollout/0 starts) listens on: --sglang-host when given, else 127.0.0.1
    -- its rollout worker, and a colocated trainer, share its host -- unless an sglang-router must reach it from
    another host (a job over several hosts, or a router at a non-local --sglang-router-ip): then `node_address`,
    this node's address as the job's topology advertises it. Never 0.0.0.0 unless asked for."""
    engine_cfg = cfg.engine
    given = flag_value(engine_cfg.sglang_args, "--host")
    if given:
        return given
    remote_router = (bool(engine_cfg.sglang_router_ip)
                     and not engine_cfg.sglang_router_ip.startswith(("127.", "localhost")))
    if engine_cfg.use_sglang_router and (multi_host or remote_router):
        if not node_address:
            raise SGLangFlagError("the sglang-router is reached from other hosts but this node's address is unknown: "
                                  "set SLIME_ACTORS_ADVERTISE (or --sglang-host)")
        return node_address
    return "127.0.0.1"


def engine_command(cfg: JobConfig, index: int, port: int, host: str | None = None,
                   config: str | os.PathLike | None = None, flags: LaunchFlags | None = None) -> tuple[str, list[str]]:
    """(module, argv) of rollout worker `index`'s engine; `config`: its keys file (`--config`); `flags`: the
    job's --sglang-* flags when the caller has parsed them. See the module docstring for the flags."""
    passthrough = list(cfg.engine.sglang_args)
    flags = flags if flags is not None else LaunchFlags.parse(passthrough)
    check_passthrough_owned(flags)
    module = SGLANG_MODULE if cfg.engine.rollout_engine == "sglang" else LOCAL_ENGINE_MODULE
    pp_text = flags.value("--pp-size", "--pipeline-parallel-size")
    try:
        pp = int(pp_text) if pp_text else 1
    except ValueError:
        raise SGLangFlagError(f"--sglang-pp-size must be an integer, got {pp_text!r}") from None
    gpus = cfg.engine.rollout_num_gpus_per_engine
    if pp < 1 or gpus % pp:
        raise SGLangFlagError(f"--rollout-num-gpus-per-engine ({gpus}) must be a multiple of --sglang-pp-size ({pp})")
    given_host = flags.value("--host")
    if host is None:
        host = given_host or "127.0.0.1"
    argv = ["--model-path", str(cfg.model.hf_checkpoint), "--port", str(int(port)), "--tp-size", str(gpus // pp),
            "--random-seed", str(cfg.run.seed + index), "--weight-version", "0"]
    if given_host is None:
        argv[2:2] = ["--host", host]
    if config is not None:
        argv += ["--config", str(config)]
    gpu = base_gpu_id(cfg, index)
    if gpu is not None and flags.value("--base-gpu-id") is None:
        argv += ["--base-gpu-id", str(gpu)]
    if module == LOCAL_ENGINE_MODULE:
        argv += ["--device", cfg.run.device, "--max-running-requests", str(cfg.engine.engine_max_batch_size)]
        if cfg.train.bf16 and flags.value("--dtype") is None:
            # (--bf16: it computes in bf16, as the trainer's autocast; its "auto" is float32. SGLang's auto is the
            # checkpoint's dtype, as upstream)
            argv += ["--dtype", "bfloat16"]
    return module, argv + lora_engine_flags(cfg, passthrough) + passthrough


def lora_engine_flags(cfg: JobConfig, passthrough: Sequence[str] = ()) -> list[str]:
    """With --lora-rank and --lora-sync adapter the engines serve the trainer's adapters: SGLang's --enable-lora
    --max-lora-rank R --lora-target-modules ... (the local engine takes the same flags), unless the job passes
    --sglang-enable-lora itself."""
    lora_cfg = cfg.lora
    if (lora_cfg.lora_rank <= 0 or lora_cfg.lora_sync != "adapter"
            or flag_value(passthrough, "--enable-lora") is not None):
        return []
    targets = ["all" if t == "all-linear" else t for t in lora_cfg.lora_target_modules or ["all-linear"]]
    return ["--enable-lora", "--max-lora-rank", str(lora_cfg.lora_rank), "--lora-target-modules", *targets]


# -- validation -----------------------------------------------------------------------------------------------

class _RaisingParser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print and exit; we want the message
        raise SGLangFlagError(message)


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _check_with_parser(parser: argparse.ArgumentParser, argv: list[str], what: str) -> argparse.Namespace:
    try:
        ns, extra = parser.parse_known_args(argv)
    except SGLangFlagError as exc:
        raise SGLangFlagError(f"{what} refuses the launch flags: {exc}") from None
    unknown = [t.split("=", 1)[0] for t in extra if t.startswith("-")]
    if unknown or extra:
        known = [o for a in parser._actions for o in a.option_strings]
        bad = unknown[0] if unknown else extra[0]
        raise SGLangFlagError(f"{bad} is not a launch flag of {what}{_suggest(bad, known)}"
                              + (f" (also unknown: {' '.join(unknown[1:])})" if len(unknown) > 1 else ""))
    return ns


def _check_with_table(argv: list[str] | LaunchFlags, table: dict, what: str) -> None:
    items = argv.items if isinstance(argv, LaunchFlags) else split_flags(argv)
    for name, vals in items:
        if name not in table:
            raise SGLangFlagError(f"{name} is not a launch flag of {what}{_suggest(name, table)}")
        nargs = table[name]
        if nargs == 0 and vals:
            raise SGLangFlagError(f"{name} takes no value in {what}, got {' '.join(vals)!r}")
        if nargs is None and len(vals) != 1:
            raise SGLangFlagError(f"{name} takes one value in {what}, got {len(vals)}")
        if nargs == "+" and not vals:
            raise SGLangFlagError(f"{name} takes at least one value in {what}")


def sglang_server_args():
    """SGLang's ServerArgs class when the `sglang` package is importable here, else None."""
    if not _importable("sglang"):
        return None
    try:
        return importlib.import_module("sglang.srt.server_args").ServerArgs
    except Exception as exc:  # installed but broken (e.g. no GPU libraries here): fall back to the table
        log.warning("sglang is installed but its ServerArgs cannot be imported; checking launch flags against the "
                    f"table recorded from SGLang {RECORDED_SGLANG_VERSION}", error=repr(exc))
        return None


def check_sglang_flags(argv: Sequence[str], cache: FlagCheckCache | None = None) -> str:
    """Check `python -m sglang.launch_server <argv>`'s flags; returns what they were checked against.
    Raises SGLangFlagError naming the offending flag. With `cache` (the head's check before any process starts), an
    argv this SGLang's parser accepted before is not parsed again, and SGLang is not imported (sglang_flag_cache)."""
    argv = [str(a) for a in argv]
    key = cache.key(argv) if cache is not None else None
    if cache is not None and cache.accepted(key):
        return f"SGLang's parser, accepted before ({cache.path})"
    server_args = sglang_server_args()
    if server_args is not None:
        version = getattr(importlib.import_module("sglang"), "__version__", "?")
        what = f"SGLang {version} (sglang.srt.server_args.ServerArgs)"
        parser = _RaisingParser(prog="sglang.launch_server", add_help=False)
        server_args.add_cli_args(parser)
        _check_with_parser(parser, argv, what)
        if cache is not None:
            cache.remember(key)
        return what
    what = f"SGLang {RECORDED_SGLANG_VERSION} (recorded table; sglang is not importable here)"
    split_flags(argv)
    _check_with_table(argv, sglang_flags.SERVER_FLAGS, what)
    if flag_value(argv, "--model-path", "--model") is None:
        raise SGLangFlagError(f"--model-path is required by {what}")
    return what


def check_engine_flags(module: str, argv: Sequence[str], cache: FlagCheckCache | None = None) -> str:
    """Check an engine command before launching it. The local engine accepts SGLang's flags (it has its own parser
    and refuses what it cannot do at start-up); SGLang's are checked by `check_sglang_flags` (with `cache`)."""
    if module == SGLANG_MODULE:
        return check_sglang_flags(argv, cache)
    _check_with_table([str(a) for a in argv], {**sglang_flags.SERVER_FLAGS, "--max-batch-size": None,
                                               "--log-dir": None},
                      f"the local engine (SGLang {RECORDED_SGLANG_VERSION} flags)")
    return "local engine"


def check_passthrough(cfg: JobConfig, flags: LaunchFlags | None = None) -> str:
    """Config-time check of the job's --sglang-* and --router-* flags (no engine is launched); `flags`: the
    --sglang-* flags parsed (LaunchFlags.parse(cfg.engine.sglang_args))."""
    engine_cfg = cfg.engine
    flags = flags if flags is not None else LaunchFlags.parse(engine_cfg.sglang_args)
    check_passthrough_owned(flags)
    workers = flags.value("--tokenizer-worker-num")
    if workers not in (None, "", "1") and engine_cfg.engine_auth and not engine_cfg.rollout_external_engine_addrs:
        raise SGLangFlagError(f"--sglang-tokenizer-worker-num {workers}: SGLang {RECORDED_SGLANG_VERSION} checks no "
                              "API key with more than one tokenizer worker (http_server.py adds its key middleware "
                              "only in single-tokenizer mode), so the engines would be open; drop the flag or turn "
                              "the keys off with --engine-auth false")
    if engine_cfg.rollout_engine == "sglang" and not engine_cfg.rollout_external_engine_addrs:
        module, argv = engine_command(cfg, 0, 30000, flags=flags)
        what = check_engine_flags(module, argv, FlagCheckCache.default())
    else:
        _check_with_table(flags, sglang_flags.SERVER_FLAGS, f"SGLang {RECORDED_SGLANG_VERSION} (recorded table)")
        what = "recorded table"
    if engine_cfg.router_args or engine_cfg.use_sglang_router:
        router_command(cfg, "127.0.0.1", 30000, check=True)
    return what


def local_engine_ignores(flags: LaunchFlags) -> list[str]:
    """The passthrough flags the local engine accepts but does nothing with (SGLang's CUDA graphs, kernels, cache
    settings, ...), as the user wrote them (--sglang-<flag>)."""
    from .local_engine.cli import honoured_flags
    honoured = honoured_flags()
    return [f"--sglang-{name[2:]}" for name in dict.fromkeys(flags.names()) if name not in honoured]


# -- the router -----------------------------------------------------------------------------------------------

def sglang_router_args():
    if not _importable("sglang_router"):
        return None
    try:
        return importlib.import_module("sglang_router.router_args").RouterArgs
    except Exception as exc:
        log.warning("sglang_router is installed but RouterArgs cannot be imported", error=repr(exc))
        return None


def check_router_flags(argv: Sequence[str]) -> str:
    argv = [str(a) for a in argv]
    router_args = sglang_router_args()
    if router_args is not None:
        what = "sglang-router (sglang_router.router_args.RouterArgs)"
        parser = _RaisingParser(prog="sglang_router.launch_router", add_help=False)
        router_args.add_cli_args(parser, use_router_prefix=False)
        _check_with_parser(parser, argv, what)
        return what
    what = f"sglang-router {RECORDED_ROUTER_VERSION} (recorded table; sglang_router is not importable here)"
    _check_with_table(argv, sglang_flags.ROUTER_FLAGS, what)
    return what


def router_command(cfg: JobConfig, host: str, port: int, prometheus_port: int | None = None,
                   check: bool = False, keys=None) -> tuple[str, list[str]]:
    """(module, argv) of the router the rollout workers share. Like slime, the router's own health checks and
    circuit breaker are off (the rollout workers probe their engines and restart them), unless the job's --router-*
    flags set them. With the job's engine keys (`keys`, engine_auth.EngineKeys) the router asks for the API key on
    generation (`--api-key`, sglang-router 0.3.2's data-plane key, also its key toward workers) and for the admin
    key on its worker registry (`--control-plane-api-keys ID:NAME:admin:KEY`). The router takes keys only on its
    command line: it renames its process (setproctitle "sglang::router") once started, which hides them from the
    process list after the first moments; docs/security.md says so."""
    passthrough = list(cfg.engine.router_args)
    given = {name for name, _ in split_flags(passthrough)}
    for name in given & set(OWNED_ROUTER_FLAGS):
        raise SGLangFlagError(f"--router-{name[2:]} cannot be passed through: use {OWNED_ROUTER_FLAGS[name]}")
    argv = ["--host", host, "--port", str(int(port))]
    if not given & {"--disable-health-check", "--health-check-interval-secs", "--health-check-endpoint"}:
        argv.append("--disable-health-check")
    if not given & {"--disable-circuit-breaker", "--cb-failure-threshold"}:
        argv.append("--disable-circuit-breaker")
    if prometheus_port is not None and "--prometheus-port" not in given:
        argv += ["--prometheus-port", str(int(prometheus_port))]
    if "--prometheus-host" not in given:  # its metrics endpoint: this host only (--router-prometheus-host opens it)
        argv += ["--prometheus-host", "127.0.0.1"]
    if keys is not None and keys.api_key:
        argv += ["--api-key", keys.api_key]
    if keys is not None and (keys.admin_key or keys.api_key):
        argv += ["--control-plane-api-keys", f"{ROUTER_KEY_ID}:admin:{keys.admin_key or keys.api_key}"]
    argv += passthrough
    if check:
        check_router_flags(argv)
    return ROUTER_MODULE, argv
