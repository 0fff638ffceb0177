"""The local engine's command line: SGLang's launch flags (its own --config YAML file included), then the server.

    python -m slime_actors.backends.local_engine --model-path DIR --host 127.0.0.1 --port 30000 \\
        [--config KEYS.yaml | --api-key KEY --admin-api-key KEY] [--device cpu|cuda|cuda:N] [--dtype float32] \\
        [--max-running-requests 64] [--random-seed S] [--weight-version default] [--context-length N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from slime_actors.log import setup_logging

# Every other launch flag of SGLang 0.5.15.post1 (the table recorded from its ServerArgs, sglang_flags.py) is accepted
# and ignored -- CUDA graphs, radix cache, kernels, ... -- so one launch line serves both engines;
# the ones given are logged at start-up. A flag SGLang does not have is an error, as it would be for SGLang.
MULTI_DEVICE_FLAGS = {"tp_size": "--tp-size", "dp_size": "--dp-size", "pp_size": "--pp-size", "ep_size": "--ep-size"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m slime_actors.backends.local_engine",
                                description="Local HF engine speaking SGLang's native HTTP API (see docs/sglang.md)")
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--api-key", default=None)
    p.add_argument("--admin-api-key", default=None)
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--dp-size", "--data-parallel-size", type=int, default=1)
    p.add_argument("--pp-size", "--pipeline-parallel-size", type=int, default=1)
    p.add_argument("--ep-size", "--expert-parallel-size", type=int, default=1)
    p.add_argument("--dtype", default="auto", choices=["auto", "half", "float16", "bfloat16", "float", "float32"],
                   help="auto = float32 here (SGLang's auto would pick fp16/bf16); no mixed precision")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    p.add_argument("--base-gpu-id", type=int, default=0)
    p.add_argument("--mem-fraction-static", type=float, default=None,
                   help="on a GPU: the most of its memory this engine allocates (torch's per-process memory fraction; "
                        "SGLang's flag sizes its weights and KV cache) -- a colocated engine leaves the trainer room")
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument("--enable-deterministic-inference", action="store_true",
                   help="a request's numbers do not depend on the requests batched with it (each runs alone in "
                        "every step: slower; docs/reproducibility.md)")
    p.add_argument("--enable-tf32-matmul", action="store_true",
                   help="on a GPU, fp32 matmuls in TF32 (torch's float32 matmul precision 'high'), as SGLang's flag")
    p.add_argument("--max-running-requests", "--max-batch-size", dest="max_running_requests", type=int, default=64)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--weight-version", default="default")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--skip-tokenizer-init", action="store_true")
    p.add_argument("--log-level", default=None)
    p.add_argument("--log-dir", default=None, help="(local) write JSON logs under LOG_DIR/logs/")
    p.add_argument("--keep-host-memory", action="store_true",
                   help="(local) keep host memory as before the engine's memory work: a weight update received into "
                        "a buffer kept between updates and copied into the model, and no malloc_trim after a batch "
                        "or an update (default: received in place, trimmed; bench/engine_memory.py)")
    p.add_argument("--enable-lora", action="store_true",
                   help="serve LoRA adapters: /load_lora_adapter, /unload_lora_adapter, /generate's lora_path")
    p.add_argument("--max-lora-rank", type=int, default=None, help="refuse adapters of a higher rank")
    p.add_argument("--lora-target-modules", nargs="*", default=None,
                   help="refuse adapters on other modules (all: any linear layer)")
    from slime_actors.backends.sglang_flags import SERVER_FLAGS
    ours = {o for a in p._actions for o in a.option_strings}
    for f, nargs in SERVER_FLAGS.items():
        if f in ours:
            continue
        dest = "ignored__" + f[2:].replace("-", "_")
        if nargs == 0:
            p.add_argument(f, dest=dest, action="store_true", help=argparse.SUPPRESS)
        else:
            p.add_argument(f, dest=dest, nargs=nargs, default=None, help=argparse.SUPPRESS)
    return p


def honoured_flags() -> set[str]:
    """The launch flags the local engine acts on (every other flag of SGLang's it accepts and ignores)."""
    return {o for a in build_parser()._actions if not a.dest.startswith("ignored__") for o in a.option_strings}


def merge_config_file(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """SGLang's `--config FILE` (server_args.prepare_server_args, server_args_config_parser.py): a YAML mapping of
    flag names (as written: `api-key`, not `api_key`) to values, whose flags go before the command line's, so the
    command line wins. true adds a switch, false leaves it out; a list gives the values after one flag. One --config
    at most, a .yaml / .yml file. (`--config=FILE` is read too: SGLang would ignore it -- and the keys in it.)"""
    at = [i for i, a in enumerate(argv) if a == "--config" or a.startswith("--config=")]
    if not at:
        return argv
    if len(at) > 1:
        parser.error("--config: multiple config files specified; only one is allowed")
    i = at[0]
    if argv[i] == "--config":
        if i + 1 >= len(argv):
            parser.error("--config: no config file given")
        path, rest = argv[i + 1], argv[:i] + argv[i + 2:]
    else:
        path, rest = argv[i].split("=", 1)[1], argv[:i] + argv[i + 1:]
    if not path.lower().endswith((".yaml", ".yml")):
        parser.error(f"--config {path}: the config file must be YAML (.yaml or .yml)")
    try:
        import yaml
        with open(path) as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        parser.error(f"--config {path}: no such file")
    except OSError as exc:
        parser.error(f"--config {path}: cannot read it: {exc}")
    except Exception as exc:  # noqa: BLE001 -- yaml.YAMLError and what it wraps
        parser.error(f"--config {path}: not valid YAML: {exc}")
    data = {} if data is None else data
    if not isinstance(data, dict):
        parser.error(f"--config {path}: the file must hold a mapping of flag names to values")
    switches = {o for act in parser._actions if isinstance(act, argparse._StoreTrueAction) for o in act.option_strings}
    out: list[str] = []
    for key, value in data.items():
        flag = f"--{key}"
        if isinstance(value, bool):
            if flag in switches:
                out += [flag] if value else []
            else:
                out += [flag, str(value).lower()]
        elif isinstance(value, list):
            out += [flag, *map(str, value)] if value else []
        elif isinstance(value, dict):
            out += [flag, json.dumps(value)]
        else:
            out += [flag, str(value)]
    return out + rest


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    argv = merge_config_file(list(sys.argv[1:] if argv is None else argv), p)
    args = p.parse_args(argv)
    f = args.mem_fraction_static
    if f is not None and not 0.0 < f <= 1.0:
        p.error(f"--mem-fraction-static {f}: must be a fraction in (0, 1]")
    if args.max_lora_rank is not None and args.max_lora_rank < 1:
        p.error(f"--max-lora-rank {args.max_lora_rank}: must be >= 1")
    for dest, flag in MULTI_DEVICE_FLAGS.items():
        if getattr(args, dest) != 1:
            p.error(f"{flag} {getattr(args, dest)}: the local engine runs one model replica on one device; "
                    f"use SGLang (sglang.launch_server) for {flag} > 1")
    args.ignored_flags = sorted("--" + k[len("ignored__"):].replace("_", "-") for k, v in vars(args).items()
                                if k.startswith("ignored__") and v not in (None, False))
    return args



def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    setup_logging(run_dir=args.log_dir, name=f"local_engine-{args.port}", level=args.log_level)
    # (as an actor process: long collections logged, start-up's frozen -- from before torch is imported; the server
    # settles the collector once it serves)
    from slime_actors import gc_watch
    from slime_actors.log import get_logger
    gc_watch.watch(get_logger(component="local_engine"))
    from .server import serve
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args))
    # Leave without running native finalizers: a communicator whose peer is gone can block exit for minutes.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

