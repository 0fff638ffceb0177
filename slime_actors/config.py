"""The job's flags. Where slime has a flag for the same concept we use its name, so launch scripts move over.

    args = parse_args(["--config", "examples/digits/config.toml", "--lr", "1e-3"])

A TOML config file may set any flag (by its name with dashes or underscores, at the top level or in any table);
the command line wins over the file. Every `--sglang-<flag> [value]` and `--router-<flag> [value]` is kept, in
order, in `args.sglang_args` / `args.router_args` for passthrough to those servers. Unknown flags and bad values
are errors that name the flag (and, for the config file, the file and key).
"""

from __future__ import annotations

import argparse
import os
import tomllib
from pathlib import Path

ESTIMATORS = ["grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"]
KL_TYPES = ["k1", "k2", "k3", "low_var_kl"]


class ConfigError(ValueError):
    """A bad flag, value or config file entry; the message names it."""


def _bool(v) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {v!r}")


def has_flag(argv: list[str], flag: str) -> bool:
    """Whether `flag` is among the command-line arguments, as `--flag VALUE` or `--flag=VALUE`."""
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slime-actors train", description="RL post-training on slime-actors.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--config", default=None, help="TOML file setting any of these flags; the command line wins")

    g = p.add_argument_group("run")
    g.add_argument("--run-dir", default="runs/train", help="traces/, logs/, metrics, checkpoints (unless --save)")
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--device", default="cpu", help="cpu or cuda")
    g.add_argument("--num-rollout", type=int, default=10, help="training steps (rollout + train + sync each)")
    g.add_argument("--start-rollout-id", type=int, default=None)
    g.add_argument("--trace", type=_bool, default=True, help="record every message")
    g.add_argument("--trace-keep-arrays", action="store_true")
    g.add_argument("--curve", type=_bool, default=True, help="CurveZMQ keys per job")
    g.add_argument("--transport", choices=["ipc", "tcp"], default="ipc")
    g.add_argument("--heartbeat-interval", type=float, default=1.0)
    g.add_argument("--heartbeat-liveness", type=int, default=5)
    g.add_argument("--progress", type=_bool, default=True, help="progress bars on the console")

    g = p.add_argument_group("data")
    g.add_argument("--prompt-data", default=None, help="jsonl or parquet file of prompts")
    g.add_argument("--input-key", default="input")
    g.add_argument("--label-key", default=None)
    g.add_argument("--metadata-key", default="metadata")
    g.add_argument("--tool-key", default=None)
    g.add_argument("--apply-chat-template", action="store_true")
    g.add_argument("--rollout-shuffle", action="store_true")
    g.add_argument("--rollout-seed", type=int, default=42)
    g.add_argument("--rollout-max-prompt-len", type=int, default=None, help="drop longer prompts (tokens)")
    g.add_argument("--eval-prompt-data", nargs="+", default=None, help="NAME PATH [NAME PATH ...] or PATH")
    g.add_argument("--eval-input-key", default=None)
    g.add_argument("--eval-label-key", default=None)

    g = p.add_argument_group("rollout")
    g.add_argument("--hf-checkpoint", default=None, help="Hugging Face model directory (or tiny:NAME, "
                                                         "smollm2:135m)")
    g.add_argument("--rollout-engine", choices=["local", "sglang"], default="local")
    g.add_argument("--rollout-num-engines", type=int, default=1, help="rollout workers, one engine each")
    g.add_argument("--rollout-num-gpus-per-engine", type=int, default=1)
    g.add_argument("--rollout-external-engine-addrs", nargs="+", default=None)
    g.add_argument("--rollout-batch-size", type=int, default=8, help="prompt groups per training step")
    g.add_argument("--n-samples-per-prompt", type=int, default=8)
    g.add_argument("--over-sampling-batch-size", type=int, default=None,
                   help="prompt groups handed out per step (>= rollout-batch-size; extra absorbs filtering)")
    g.add_argument("--rollout-max-response-len", type=int, default=32)
    g.add_argument("--rollout-temperature", type=float, default=1.0)
    g.add_argument("--rollout-top-p", type=float, default=1.0)
    g.add_argument("--rollout-top-k", type=int, default=-1)
    g.add_argument("--rollout-stop", nargs="+", default=None)
    g.add_argument("--rollout-stop-token-ids", type=int, nargs="+", default=None)
    g.add_argument("--rollout-concurrency", type=int, default=64, help="HTTP requests in flight per engine")
    g.add_argument("--engine-max-batch-size", type=int, default=64, help="local engine: sequences per batch")
    g.add_argument("--partial-rollout", action="store_true",
                   help="keep aborted samples' partial responses and continue them next step")
    g.add_argument("--dynamic-sampling-filter-path", default=None,
                   help="dotted path of fn(args, samples)->bool; built-in: "
                        "slime_actors.filters.check_reward_nonzero_std")
    g.add_argument("--custom-generate-function-path", default=None)
    g.add_argument("--rollout-function-path", default=None)
    g.add_argument("--use-fault-tolerance", action="store_true")
    g.add_argument("--rollout-health-check-interval", type=float, default=10.0)
    g.add_argument("--rollout-health-check-timeout", type=float, default=30.0)
    g.add_argument("--rollout-health-check-first-wait", type=float, default=0.0)
    g.add_argument("--engine-auth", type=_bool, default=True,
                   help="engines require keys: an API key for generation, an admin key for weight updates, pauses, "
                        "aborts and cache flushes (made per job unless given below; docs/security.md)")
    g.add_argument("--engine-api-key", default=None,
                   help="the engines' API key (SGLang --api-key) instead of a job-made one; needed for external "
                        "engines that have one. Visible in the process list: prefer --engine-api-key-file or "
                        "$SLIME_ACTORS_ENGINE_API_KEY")
    g.add_argument("--engine-api-key-file", default=None, help="file holding the engines' API key (mode 0600)")
    g.add_argument("--engine-admin-api-key", default=None,
                   help="the engines' admin key (SGLang --admin-api-key); see --engine-api-key")
    g.add_argument("--engine-admin-api-key-file", default=None,
                   help="file holding the engines' admin key (mode 0600)")
    g.add_argument("--pause-generation-mode", choices=["abort", "retract", "in_place"], default="abort",
                   help="how engines pause around a weight update in --async-train (SGLang /pause_generation mode): "
                        "abort in-flight requests (they go back to the buffer), retract them (recomputed after the "
                        "update), or keep them in place")
    g.add_argument("--use-sglang-router", action="store_true",
                   help="put an sglang-router in front of the engines (rollout/0 starts it unless "
                        "--sglang-router-ip is given); every --router-<flag> is passed on as --<flag>")
    g.add_argument("--sglang-router-ip", default=None, help="an sglang-router someone else started (slime's flag)")
    g.add_argument("--sglang-router-port", type=int, default=None, help="its port, or the port to start one on")
    g.add_argument("--colocate", action="store_true",
                   help="engines share the trainer's GPUs (engine i starts at GPU i x rollout-num-gpus-per-engine)")
    g.add_argument("--num-gpus-per-node", type=int, default=8, help="GPUs per node, for placing engines")

    g = p.add_argument_group("eval")
    g.add_argument("--eval-interval", type=int, default=None)
    g.add_argument("--n-samples-per-eval-prompt", type=int, default=1)
    g.add_argument("--eval-temperature", type=float, default=None, help="default: greedy (0)")
    g.add_argument("--eval-max-response-len", type=int, default=None)
    g.add_argument("--skip-eval-before-train", action="store_true")

    g = p.add_argument_group("reward")
    g.add_argument("--rm-type", default=None, help="math | boxed | exact_match | remote_rm | ...")
    g.add_argument("--custom-rm-path", default=None, help="dotted path of async fn(args, sample) -> float")
    g.add_argument("--group-rm", action="store_true", help="the reward function scores a whole group at once")
    g.add_argument("--rm-url", default=None)
    g.add_argument("--reward-key", default=None)
    g.add_argument("--num-reward-workers", type=int, default=1)
    g.add_argument("--reward-actor-class", default=None,
                   help="pkg.mod:Class of your own reward actor (role reward, handler score); see "
                        "docs/adding-a-reward-actor.md")
    g.add_argument("--reward-batch-size", type=int, default=64)
    g.add_argument("--math-grading-timeout", type=float, default=5.0,
                   help="seconds math-verify may spend on one sample (math, boxed_math, deepscaler); past it the "
                        "sample scores 0 and counts in rollout/reward_timeouts")
    g.add_argument("--math-grading-processes", type=int, default=2,
                   help="math-verify processes per reward worker (each item's deadline is enforced by killing its "
                        "process)")

    g = p.add_argument_group("algorithm")
    g.add_argument("--advantage-estimator", choices=ESTIMATORS, default="grpo")
    g.add_argument("--eps-clip", type=float, default=0.2)
    g.add_argument("--eps-clip-high", type=float, default=None)
    g.add_argument("--eps-clip-c", type=float, default=None, help="dual-clip constant (> 1)")
    g.add_argument("--use-kl-loss", action="store_true")
    g.add_argument("--kl-loss-coef", type=float, default=0.0)
    g.add_argument("--kl-loss-type", choices=KL_TYPES, default="k1")
    g.add_argument("--kl-coef", type=float, default=0.0, help="KL penalty folded into the reward")
    g.add_argument("--entropy-coef", type=float, default=0.0)
    g.add_argument("--use-tis", action="store_true", help="truncated importance sampling vs rollout log-probs")
    g.add_argument("--tis-clip", type=float, default=2.0)
    g.add_argument("--tis-clip-low", type=float, default=0.0)
    g.add_argument("--gamma", type=float, default=1.0)
    g.add_argument("--lambd", type=float, default=1.0)
    g.add_argument("--normalize-advantages", action="store_true")
    g.add_argument("--disable-grpo-std-normalization", action="store_true")
    g.add_argument("--value-clip", type=float, default=0.2)
    g.add_argument("--calculate-per-token-loss", action="store_true")

    g = p.add_argument_group("training")
    g.add_argument("--train-backend", choices=["torch", "megatron"], default="torch")
    g.add_argument("--actor-num-nodes", type=int, default=1)
    g.add_argument("--actor-num-gpus-per-node", type=int, default=1, help="trainer ranks per node (CPU too)")
    g.add_argument("--torch-parallel", choices=["ddp", "fsdp"], default="ddp")
    g.add_argument("--ref-load", default=None, help="reference model (default: the initial weights)")
    g.add_argument("--lr", type=float, default=1e-6)
    g.add_argument("--critic-lr", type=float, default=None)
    g.add_argument("--weight-decay", type=float, default=0.0)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.98)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--global-batch-size", type=int, default=None,
                   help="samples per optimizer step (default: all samples of the rollout)")
    g.add_argument("--micro-batch-size", type=int, default=1)
    g.add_argument("--use-dynamic-batch-size", action="store_true")
    g.add_argument("--max-tokens-per-gpu", type=int, default=None)
    g.add_argument("--num-steps-per-rollout", type=int, default=None)
    g.add_argument("--bf16", action="store_true")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--use-distributed-optimizer", action="store_true")

    g = p.add_argument_group("weights and checkpoints")
    g.add_argument("--update-weight-transport", choices=["distributed", "nccl", "disk", "colocated"],
                   default="distributed", help="distributed: bucketed broadcast (gloo on CPU, NCCL on GPU)")
    g.add_argument("--update-weight-buffer-size", type=int, default=512 << 20, help="bytes per bucket")
    g.add_argument("--update-weight-disk-dir", default=None)
    g.add_argument("--async-train", action="store_true",
                   help="one-step-off: generate rollout k+1 while training on rollout k")
    g.add_argument("--max-staleness", type=int, default=1, help="async: newest weight version minus oldest used")
    g.add_argument("--save", default=None)
    g.add_argument("--save-interval", type=int, default=None)
    g.add_argument("--load", default=None)
    g.add_argument("--save-hf", default=None)
    g.add_argument("--no-save-optim", action="store_true")

    g = p.add_argument_group("logging and debugging")
    g.add_argument("--use-tensorboard", type=_bool, default=True)
    g.add_argument("--log-samples-interval", type=int, default=1,
                   help="print the best and the worst sample of one group every N rollouts (and the last; 0: never); "
                        "TensorBoard gets them every rollout")
    g.add_argument("--save-eval-responses", type=_bool, default=True,
                   help="write every held-out evaluation's responses to RUN_DIR/evals/NAME_stepK.jsonl "
                        "(`slime-actors samples RUN --eval` / `--report` read them)")
    g.add_argument("--debug-rollout-only", action="store_true")
    g.add_argument("--debug-train-only", action="store_true")
    g.add_argument("--save-debug-rollout-data", default=None)
    g.add_argument("--load-debug-rollout-data", default=None)
    return p


def _flag_index(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    out = {}
    for act in parser._actions:
        for opt in act.option_strings:
            if opt.startswith("--"):
                out[opt[2:].replace("-", "_")] = act
    return out


def _flatten(d: dict, prefix: str = "") -> list[tuple[str, object]]:
    items = []
    for k, v in d.items():
        if isinstance(v, dict) and k not in ("sglang", "router"):
            items.extend(_flatten(v, f"{prefix}{k}."))
        else:
            items.append((f"{prefix}{k}", v))
    return items


def _config_to_argv(path: str, parser: argparse.ArgumentParser) -> list[str]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    index = _flag_index(parser)
    argv: list[str] = []
    base = Path(path).resolve().parent
    for dotted, value in _flatten(data):
        key = dotted.rsplit(".", 1)[-1]
        if key in ("sglang", "router") and isinstance(value, dict):
            for k, v in value.items():
                argv += _passthrough(f"--{key}-{k.replace('_', '-')}", v)
            continue
        norm = key.replace("-", "_")
        act = index.get(norm)
        if act is None or norm == "config":
            raise ConfigError(f"config file {path}: unknown key {dotted!r} (no flag --{norm.replace('_', '-')})")
        flag = f"--{norm.replace('_', '-')}"
        if norm in ("prompt_data", "hf_checkpoint", "load", "ref_load", "load_debug_rollout_data") \
                and isinstance(value, str) and not value.startswith(("tiny:", "smollm2:", "/")):
            cand = base / value
            if cand.exists():
                value = str(cand)
        if isinstance(act, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            if not isinstance(value, bool):
                raise ConfigError(f"config file {path}: {dotted} must be true or false, got {value!r}")
            want = isinstance(act, argparse._StoreTrueAction)
            if value == want:
                argv.append(flag)
            continue
        if isinstance(value, list):
            if norm == "eval_prompt_data":
                value = [str(base / v) if (base / str(v)).exists() else str(v) for v in value]
            argv += [flag, *[str(v) for v in value]]
        else:
            argv += [flag, str(value).lower() if isinstance(value, bool) else str(value)]
    return argv


def _passthrough(flag: str, value) -> list[str]:
    if value is True:
        return [flag]
    if value is False or value is None:
        return []
    if isinstance(value, list):
        return [flag, *[str(v) for v in value]]
    return [flag, str(value)]


# our own flags that happen to start with --sglang- (slime's names for an external router)
OWN_SGLANG_PREFIXED = ("--sglang-router-ip", "--sglang-router-port")


def split_passthrough(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """Separate `--sglang-*` and `--router-*` flags (with their values) from ours."""
    ours, sglang, router = [], [], []
    i = 0
    while i < len(argv):
        tok = argv[i]
        target = sglang if tok.startswith("--sglang-") else router if tok.startswith("--router-") else None
        if tok.split("=", 1)[0] in OWN_SGLANG_PREFIXED:
            target = None
        if target is None:
            ours.append(tok)
            i += 1
            continue
        name = tok.split("=", 1)
        target.append("--" + name[0][len("--sglang-" if target is sglang else "--router-"):])
        if len(name) == 2:
            target.append(name[1])
        i += 1
        while i < len(argv) and not argv[i].startswith("--"):
            target.append(argv[i])
            i += 1
    return ours, sglang, router


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ConfigError(message)


def parse_args(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    parser = parser or build_parser()
    parser.__class__ = _Parser
    argv = list(argv or [])
    ours, sglang, router = split_passthrough(argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    known, _ = pre.parse_known_args(ours)
    file_argv: list[str] = []
    if known.config:
        file_argv = _config_to_argv(known.config, parser)
        file_ours, file_sglang, file_router = split_passthrough(file_argv)
        file_argv = file_ours
        sglang = file_sglang + sglang
        router = file_router + router
    args = parser.parse_args(file_argv + ours)
    args.sglang_args = sglang
    args.router_args = router
    validate(args)
    return args


def validate(args: argparse.Namespace) -> None:
    def bad(msg):
        raise ConfigError(msg)

    if args.update_weight_transport == "nccl":
        args.update_weight_transport = "distributed"
    if args.over_sampling_batch_size is None:
        args.over_sampling_batch_size = args.rollout_batch_size
    if args.over_sampling_batch_size < args.rollout_batch_size:
        bad(f"--over-sampling-batch-size ({args.over_sampling_batch_size}) must be >= --rollout-batch-size "
            f"({args.rollout_batch_size})")
    for name in ("rollout_batch_size", "n_samples_per_prompt", "num_rollout", "rollout_num_engines",
                 "actor_num_gpus_per_node", "micro_batch_size", "rollout_max_response_len",
                 "math_grading_processes"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            bad(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.log_samples_interval < 0:
        bad(f"--log-samples-interval must be >= 0, got {args.log_samples_interval}")
    if not args.math_grading_timeout > 0:
        bad(f"--math-grading-timeout must be > 0 seconds, got {args.math_grading_timeout}")
    if args.eps_clip_c is not None and args.eps_clip_c <= 1.0:
        bad(f"--eps-clip-c must be > 1.0, got {args.eps_clip_c}")
    if args.use_dynamic_batch_size and not args.max_tokens_per_gpu:
        bad("--use-dynamic-batch-size needs --max-tokens-per-gpu")
    if args.advantage_estimator in ("grpo", "gspo", "reinforce_plus_plus_baseline") and args.n_samples_per_prompt < 2:
        bad(f"--advantage-estimator {args.advantage_estimator} compares samples of a group: "
            "--n-samples-per-prompt must be >= 2")
    if args.debug_rollout_only and args.debug_train_only:
        bad("--debug-rollout-only and --debug-train-only exclude each other")
    if args.debug_train_only and not args.load_debug_rollout_data:
        bad("--debug-train-only needs --load-debug-rollout-data")
    if args.load_debug_rollout_data:  # the first rollout must be there (later ones are checked when loaded)
        first = debug_rollout_path(args.load_debug_rollout_data, args.start_rollout_id or 0)
        if not first.is_file():
            bad(f"--load-debug-rollout-data {args.load_debug_rollout_data}: no saved rollout "
                f"{args.start_rollout_id or 0} at {first} (--save-debug-rollout-data writes one file per rollout)")
    if args.prompt_data is None and not args.load_debug_rollout_data:
        bad("--prompt-data is required")
    if args.prompt_data and not os.path.exists(args.prompt_data):
        bad(f"--prompt-data {args.prompt_data} does not exist")
    if args.hf_checkpoint is None:
        bad("--hf-checkpoint is required (a Hugging Face model directory, tiny:digits, or smollm2:135m)")
    n_ranks = args.actor_num_nodes * args.actor_num_gpus_per_node
    total = args.rollout_batch_size * args.n_samples_per_prompt
    if args.global_batch_size is None:
        args.global_batch_size = total
    if total % args.global_batch_size:
        bad(f"rollout-batch-size x n-samples-per-prompt ({total}) must be a multiple of --global-batch-size "
            f"({args.global_batch_size})")
    if args.rollout_batch_size % n_ranks:
        bad(f"--rollout-batch-size ({args.rollout_batch_size}) must be a multiple of the trainer ranks "
            f"({n_ranks}): each rank trains on whole prompt groups")
    if args.num_steps_per_rollout is None:
        args.num_steps_per_rollout = total // args.global_batch_size
    if args.eval_temperature is None:
        args.eval_temperature = 0.0
    if args.eval_max_response_len is None:
        args.eval_max_response_len = args.rollout_max_response_len
    if args.critic_lr is None:
        args.critic_lr = args.lr
    if args.eps_clip_high is None:
        args.eps_clip_high = args.eps_clip
    if args.rm_type is None and args.custom_rm_path is None and args.reward_actor_class is None:
        bad("choose a reward: --rm-type (math, boxed, exact_match, remote_rm, ...) or --custom-rm-path")
    if args.rm_type == "remote_rm" and not args.rm_url:
        bad("--rm-type remote_rm needs --rm-url")
    from .backends.engine_auth import EngineKeyError, take_user_keys
    try:  # the keys leave `args` here: job files, actor configs and traces never hold them
        args.engine_user_keys = take_user_keys(args)
    except EngineKeyError as exc:
        bad(str(exc))
    if args.sglang_router_ip and not args.sglang_router_port:
        bad("--sglang-router-ip needs --sglang-router-port")
    if args.sglang_args or args.router_args or args.rollout_engine == "sglang" or args.use_sglang_router:
        from .backends.sglang_launch import SGLangFlagError, check_passthrough
        try:
            check_passthrough(args)
        except SGLangFlagError as exc:
            bad(str(exc))


def debug_rollout_path(spec: str, k: int) -> Path:
    """Where rollout k is saved (--save-debug-rollout-data) or loaded from (--load-debug-rollout-data):
    "dir/data_{rollout_id}.msgpack" as slime writes it, else DIR/rollout_00000K.msgpack for a directory (a path
    without a suffix), else FILE_00000K.SUFFIX."""
    if "{rollout_id" in spec:  # also {rollout_id:06d}
        return Path(spec.format(rollout_id=k))
    p = Path(spec)
    if p.is_dir() or not p.suffix:
        return p / f"rollout_{k:06d}.msgpack"
    return p.with_name(f"{p.stem}_{k:06d}{p.suffix}")


def args_to_dict(args: argparse.Namespace) -> dict:
    """A msgpack-able copy (for messages, traces and checkpoints), without the engine keys the user gave."""
    return {k: v for k, v in vars(args).items() if k != "engine_user_keys"}
