"""The job's configuration: one tree of typed sections, parsed once in the head, rebuilt typed in every actor.

    cfg = parse_config(["--config", "examples/digits/config.toml", "--lr", "1e-3"])   # -> JobConfig
    cfg.algorithm.eps_clip, cfg.rollout.n_samples_per_prompt, cfg.run.run_dir         # typed reads
    cfg.to_dict()                      # flat, JSON/msgpack-able (job.json, actor configs, traces)
    JobConfig.from_dict(d)             # back to typed (ConfigError naming the field when d is malformed)
    cfg.flat()                         # slime's `args` for user plug-ins: args.rollout_max_response_len, ...

Every flag is one field of one section below, its default and help text next to it; the parser, the TOML keys,
`--help`, job.json and the plug-ins' flat view are all generated from these fields. A field's name is the flag's
name (slime's, where slime has the concept: `rollout_batch_size` is `--rollout-batch-size`), unique across sections.
Adding a flag is adding one field:

    max_staleness: int = flag(1, "async: newest weight version minus oldest used")

A bool field defaulting to False is a switch (`--use-kl-loss`); one defaulting to True takes a value
(`--trace false`). A `list[...]` field takes one or more values. `flag(..., choices=[...])` restricts the values.
Derived defaults (`--global-batch-size`: the whole rollout, `--eps-clip-high`: `--eps-clip`, ...) are filled in by
`JobConfig.validate`, which also checks the values; nothing else restates a default.

A TOML config file may set any flag (by its name with dashes or underscores, at the top level or in any table);
the command line wins over the file. Every `--sglang-<flag> [value]` and `--router-<flag> [value]` is kept, in
order, in `cfg.engine.sglang_args` / `cfg.engine.router_args` for passthrough to those servers. Unknown flags and
bad values are errors that name the flag (and, for the config file, the file and key).

What this module does not check (the launcher's job, slime_actors.launch.job_config): the passthrough flags against
SGLang, and the engine keys the user gave (taken out of the config there, so no file written from it holds them).
"""

from __future__ import annotations

import argparse
import difflib
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

ESTIMATORS = ["grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"]
KL_TYPES = ["k1", "k2", "k3", "low_var_kl"]


class ConfigError(ValueError):
    """A bad flag, value, config file entry or job file field; the message names it."""


def flag(default: Any = None, help: str | None = None, *, choices: list | None = None, path: bool = False,
         top: bool = False) -> Any:
    """A field that is a command-line flag (and a TOML key). `path`: a relative value in a config file is taken
    relative to that file when such a file exists; `top`: listed before the groups in --help."""
    return field(default=default, metadata={"help": help, "choices": choices, "path": path, "top": top, "cli": True})


def passthrough() -> Any:
    """A field filled by the parser, not a flag of its own (the --sglang-* / --router-* passthrough lists)."""
    return field(default_factory=list, metadata={"cli": False})


# ---------------------------------------------------------------------------------------------------------------
# the sections (each is a --help group, in this order)

@dataclass(slots=True)
class RunSection:
    """What the job does and where it writes."""
    TITLE: typing.ClassVar[str] = "run"
    config: str | None = flag(None, "TOML file setting any of these flags; the command line wins", top=True)
    run_dir: str = flag("runs/train", "traces/, logs/, metrics, checkpoints (unless --save)")
    seed: int = flag(1234)
    device: str = flag("cpu", "cpu or cuda")
    num_rollout: int = flag(10, "training steps (rollout + train + sync each)")
    start_rollout_id: int | None = flag(None)
    async_train: bool = flag(False, "one-step-off: generate rollout k+1 while training on rollout k")
    max_staleness: int = flag(1, "async: newest weight version minus oldest used")
    progress: bool = flag(True, "progress bars on the console")


@dataclass(slots=True)
class RuntimeSection:
    """How the actors talk: tracing, transport, keys, liveness (what slime_actors.runtime gives every process)."""
    TITLE: typing.ClassVar[str] = "runtime"
    trace: bool = flag(True, "record every message")
    trace_keep_arrays: bool = flag(False)
    curve: bool = flag(True, "CurveZMQ keys per job")
    transport: str = flag("ipc", choices=["ipc", "tcp"])
    heartbeat_interval: float = flag(1.0)
    heartbeat_liveness: int = flag(5)


@dataclass(slots=True)
class ModelSection:
    TITLE: typing.ClassVar[str] = "model"
    hf_checkpoint: str | None = flag(None, "Hugging Face model directory (or tiny:NAME, smollm2:135m)", path=True)
    ref_load: str | None = flag(None, "reference model (default: the initial weights)", path=True)


@dataclass(slots=True)
class DataSection:
    TITLE: typing.ClassVar[str] = "data"
    prompt_data: str | None = flag(None, "jsonl or parquet file of prompts", path=True)
    input_key: str = flag("input")
    label_key: str | None = flag(None)
    metadata_key: str = flag("metadata")
    tool_key: str | None = flag(None)
    apply_chat_template: bool = flag(False)
    rollout_shuffle: bool = flag(False)
    rollout_seed: int = flag(42)
    rollout_max_prompt_len: int | None = flag(None, "drop longer prompts (tokens)")


@dataclass(slots=True)
class RolloutSection:
    """What a rollout is: batch sizes, sampling, the user's generate/rollout/filter functions."""
    TITLE: typing.ClassVar[str] = "rollout"
    rollout_batch_size: int = flag(8, "prompt groups per training step")
    n_samples_per_prompt: int = flag(8)
    over_sampling_batch_size: int | None = flag(
        None, "prompt groups handed out per step (>= rollout-batch-size; extra absorbs filtering)")
    rollout_max_response_len: int = flag(32)
    rollout_temperature: float = flag(1.0)
    rollout_top_p: float = flag(1.0)
    rollout_top_k: int = flag(-1)
    rollout_stop: list[str] | None = flag(None)
    rollout_stop_token_ids: list[int] | None = flag(None)
    partial_rollout: bool = flag(False, "keep aborted samples' partial responses and continue them next step")
    dynamic_sampling_filter_path: str | None = flag(
        None, "dotted path of fn(args, samples)->bool; built-in: slime_actors.filters.check_reward_nonzero_std")
    custom_generate_function_path: str | None = flag(None)
    rollout_function_path: str | None = flag(None)


@dataclass(slots=True)
class EngineSection:
    """The generation engines: how many, where, their HTTP keys, the router, health checks."""
    TITLE: typing.ClassVar[str] = "rollout engines"
    rollout_engine: str = flag("local", choices=["local", "sglang"])
    rollout_num_engines: int = flag(1, "rollout workers, one engine each")
    rollout_num_gpus_per_engine: int = flag(1)
    rollout_external_engine_addrs: list[str] | None = flag(None)
    rollout_concurrency: int = flag(64, "HTTP requests in flight per engine")
    engine_max_batch_size: int = flag(64, "local engine: sequences per batch")
    use_fault_tolerance: bool = flag(False)
    rollout_health_check_interval: float = flag(10.0)
    rollout_health_check_timeout: float = flag(30.0)
    rollout_health_check_first_wait: float = flag(0.0)
    engine_auth: bool = flag(True, "engines require keys: an API key for generation, an admin key for weight "
                                   "updates, pauses, aborts and cache flushes (made per job unless given below; "
                                   "docs/security.md)")
    engine_api_key: str | None = flag(None, "the engines' API key (SGLang --api-key) instead of a job-made one; "
                                            "needed for external engines that have one. Visible in the process "
                                            "list: prefer --engine-api-key-file or $SLIME_ACTORS_ENGINE_API_KEY")
    engine_api_key_file: str | None = flag(None, "file holding the engines' API key (mode 0600)")
    engine_admin_api_key: str | None = flag(None, "the engines' admin key (SGLang --admin-api-key); see "
                                                  "--engine-api-key")
    engine_admin_api_key_file: str | None = flag(None, "file holding the engines' admin key (mode 0600)")
    pause_generation_mode: str = flag(
        "abort", "how engines pause around a weight update in --async-train (SGLang /pause_generation mode): abort "
                 "in-flight requests (they go back to the buffer), retract them (recomputed after the update), or "
                 "keep them in place", choices=["abort", "retract", "in_place"])
    use_sglang_router: bool = flag(False, "put an sglang-router in front of the engines (rollout/0 starts it unless "
                                          "--sglang-router-ip is given); every --router-<flag> is passed on as "
                                          "--<flag>")
    sglang_router_ip: str | None = flag(None, "an sglang-router someone else started (slime's flag)")
    sglang_router_port: int | None = flag(None, "its port, or the port to start one on")
    colocate: bool = flag(False, "engines share the trainer's GPUs (engine i starts at GPU i x "
                                 "rollout-num-gpus-per-engine); weights then go by CUDA IPC (the colocated "
                                 "transport) and a colocated engine gets --sglang-mem-fraction-static 0.4 unless "
                                 "given. On a machine with one GPU, one trainer rank and one engine colocate by "
                                 "themselves (docs/launch.md, On one GPU)")
    num_gpus_per_node: int | None = flag(None, "GPUs per node, for placing engines (default: counted on this "
                                               "machine: CUDA_VISIBLE_DEVICES, torch, Slurm)")
    sglang_args: list[str] = passthrough()   # every --sglang-<flag> [value ...] as --<flag> [value ...]
    router_args: list[str] = passthrough()   # every --router-<flag> [value ...] as --<flag> [value ...]


@dataclass(slots=True)
class EvalSection:
    TITLE: typing.ClassVar[str] = "eval"
    eval_prompt_data: list[str] | None = flag(None, "NAME PATH [NAME PATH ...] or PATH", path=True)
    eval_input_key: str | None = flag(None)
    eval_label_key: str | None = flag(None)
    eval_interval: int | None = flag(None)
    n_samples_per_eval_prompt: int = flag(1)
    eval_temperature: float | None = flag(None, "default: greedy (0)")
    eval_max_response_len: int | None = flag(None)
    skip_eval_before_train: bool = flag(False)
    save_eval_responses: bool = flag(True, "write every held-out evaluation's responses to "
                                           "RUN_DIR/evals/NAME_stepK.jsonl (`slime-actors samples RUN --eval` / "
                                           "`--report` read them)")


@dataclass(slots=True)
class RewardSection:
    TITLE: typing.ClassVar[str] = "reward"
    rm_type: str | None = flag(None, "math | boxed | exact_match | remote_rm | ...")
    custom_rm_path: str | None = flag(None, "dotted path of async fn(args, sample) -> float")
    group_rm: bool = flag(False, "the reward function scores a whole group at once")
    rm_url: str | None = flag(None)
    reward_key: str | None = flag(None)
    num_reward_workers: int = flag(1)
    reward_actor_class: str | None = flag(None, "pkg.mod:Class of your own reward actor (role reward, handler "
                                                "score); see docs/adding-a-reward-actor.md")
    reward_batch_size: int = flag(64)
    math_grading_timeout: float = flag(5.0, "seconds math-verify may spend on one sample (math, boxed_math, "
                                            "deepscaler); past it the sample scores 0 and counts in "
                                            "rollout/reward_timeouts")
    math_grading_processes: int = flag(2, "math-verify processes per reward worker (each item's deadline is "
                                          "enforced by killing its process)")


@dataclass(slots=True)
class AlgorithmSection:
    TITLE: typing.ClassVar[str] = "algorithm"
    advantage_estimator: str = flag("grpo", choices=ESTIMATORS)
    eps_clip: float = flag(0.2)
    eps_clip_high: float | None = flag(None)
    eps_clip_c: float | None = flag(None, "dual-clip constant (> 1)")
    use_kl_loss: bool = flag(False)
    kl_loss_coef: float = flag(0.0)
    kl_loss_type: str = flag("k1", choices=KL_TYPES)
    kl_coef: float = flag(0.0, "KL penalty folded into the reward")
    entropy_coef: float = flag(0.0)
    use_tis: bool = flag(False, "truncated importance sampling vs rollout log-probs")
    tis_clip: float = flag(2.0)
    tis_clip_low: float = flag(0.0)
    gamma: float = flag(1.0)
    lambd: float = flag(1.0)
    normalize_advantages: bool = flag(False)
    disable_grpo_std_normalization: bool = flag(False)
    value_clip: float = flag(0.2)
    calculate_per_token_loss: bool = flag(False)


@dataclass(slots=True)
class TrainSection:
    TITLE: typing.ClassVar[str] = "training"
    train_backend: str = flag("torch", choices=["torch", "megatron"])
    actor_num_nodes: int = flag(1)
    actor_num_gpus_per_node: int = flag(1, "trainer ranks per node (CPU too)")
    torch_parallel: str = flag("ddp", choices=["ddp", "fsdp"])
    lr: float = flag(1e-6)
    critic_lr: float | None = flag(None)
    weight_decay: float = flag(0.0)
    adam_beta1: float = flag(0.9)
    adam_beta2: float = flag(0.98)
    clip_grad: float = flag(1.0)
    global_batch_size: int | None = flag(None, "samples per optimizer step (default: all samples of the rollout)")
    micro_batch_size: int = flag(1)
    use_dynamic_batch_size: bool = flag(False)
    max_tokens_per_gpu: int | None = flag(None)
    num_steps_per_rollout: int | None = flag(None)
    bf16: bool = flag(False)
    tensor_model_parallel_size: int = flag(1)
    pipeline_model_parallel_size: int = flag(1)
    use_distributed_optimizer: bool = flag(False)

    @property
    def n_ranks(self) -> int:
        """Trainer ranks of the job."""
        return self.actor_num_nodes * self.actor_num_gpus_per_node


@dataclass(slots=True)
class WeightsSection:
    TITLE: typing.ClassVar[str] = "weight updates"
    update_weight_transport: str | None = flag(
        None, "distributed: bucketed broadcast (gloo on CPU, NCCL on GPU); disk: safetensors files; colocated: CUDA "
              "IPC handles (shared memory on CPU) to engines on the trainer's GPUs. Default: colocated with "
              "--colocate, else distributed", choices=["distributed", "nccl", "disk", "colocated"])
    update_weight_buffer_size: int = flag(512 << 20, "bytes per bucket")
    update_weight_disk_dir: str | None = flag(None)


@dataclass(slots=True)
class CheckpointSection:
    TITLE: typing.ClassVar[str] = "checkpoints"
    save: str | None = flag(None)
    save_interval: int | None = flag(None)
    load: str | None = flag(None, path=True)
    save_hf: str | None = flag(None)
    no_save_optim: bool = flag(False)


@dataclass(slots=True)
class LoggingSection:
    TITLE: typing.ClassVar[str] = "logging"
    use_tensorboard: bool = flag(True)
    log_samples_interval: int = flag(1, "print the best and the worst sample of one group every N rollouts (and the "
                                        "last; 0: never); TensorBoard gets them every rollout")


@dataclass(slots=True)
class DebugSection:
    TITLE: typing.ClassVar[str] = "debugging"
    debug_rollout_only: bool = flag(False)
    debug_train_only: bool = flag(False)
    save_debug_rollout_data: str | None = flag(None)
    load_debug_rollout_data: str | None = flag(None, path=True)


@dataclass(slots=True)
class MonitorSection:
    """Reward-hacking alarms (slime_actors/monitor/hacking.py, docs/debugging.md section 3)."""
    TITLE: typing.ClassVar[str] = "reward-hacking alarms"
    hack_alarms: str = flag("warn", "watch every training rollout for signs that the reward rises for the wrong "
                                    "reason (hack/* metrics): warn (a warning and a line in RUN_DIR/alarms.jsonl per "
                                    "tripped alarm), stop (the same, then the step finishes, a checkpoint is saved "
                                    "to --save and the run ends), off (nothing is computed)",
                            choices=["warn", "stop", "off"])
    hack_alarm_thresholds: str | None = flag(None, "NAME=VALUE[,NAME=VALUE...]: change the alarms' thresholds, e.g. "
                                                   "rewarded_truncated=0.7,min_samples=16 (names and defaults: "
                                                   "docs/debugging.md section 3)")
    hack_alarms_ignore: list[str] | None = flag(None, "alarms that may not trip (their metrics are still logged): "
                                                      "rewarded_truncated, collapse, answer_absent, jump")
    hack_alarm_label_answer: bool | None = flag(
        None, "the reward compares each response with a literal label (enables answer_absent, and the collapse "
              "rule's 'the template does not answer' check); default: true for --rm-type math, boxed_math, dapo, "
              "boxed, exact_match, exact_match_ci, deepscaler (and boxed_<those>), false otherwise (f1, remote_rm, "
              "random, --custom-rm-path, --reward-actor-class)")


@dataclass(slots=True)
class JobConfig:
    """The job's flags, by section. Build it with `parse_config` (the head) or `from_dict` (every actor)."""
    run: RunSection = field(default_factory=RunSection)
    runtime: RuntimeSection = field(default_factory=RuntimeSection)
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    engine: EngineSection = field(default_factory=EngineSection)
    eval: EvalSection = field(default_factory=EvalSection)
    reward: RewardSection = field(default_factory=RewardSection)
    algorithm: AlgorithmSection = field(default_factory=AlgorithmSection)
    train: TrainSection = field(default_factory=TrainSection)
    weights: WeightsSection = field(default_factory=WeightsSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    logging: LoggingSection = field(default_factory=LoggingSection)
    debug: DebugSection = field(default_factory=DebugSection)
    monitor: MonitorSection = field(default_factory=MonitorSection)
    # the engine keys the user gave (backends.engine_auth.EngineKeys), taken out of the flags by the launcher:
    # never in to_dict(), so job.json, actor configs and traces do not hold them
    engine_user_keys: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        """Every field, flat (slime's names), JSON- and msgpack-able; the engine keys are not in it."""
        out = {}
        for spec in FIELDS.values():
            v = getattr(getattr(self, spec.section), spec.name)
            out[spec.name] = list(v) if isinstance(v, list) else v
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str = "job config") -> "JobConfig":
        """The typed config of a flat dict (`to_dict`'s, as job.json and actor configs hold it). A field it lacks
        takes its default; derived values are filled in and the values checked (`validate`). Raises ConfigError
        naming `source` and the field: an unknown field, a value of the wrong type or outside its choices."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: expected a table of the job's flags, got {type(data).__name__}")
        values: dict[str, dict] = {name: {} for name in SECTIONS}
        for key, value in data.items():
            spec = FIELDS.get(key) if isinstance(key, str) else None
            if spec is None:
                raise ConfigError(f"{source}: unknown field {key!r}{_suggest(str(key))}")
            values[spec.section][key] = spec.check(value, source)
        cfg = cls(**{name: SECTIONS[name](**kw) for name, kw in values.items()})
        try:
            cfg.validate()
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        return cfg

    def flat(self) -> "FlatArgs":
        """slime's `args` for user plug-ins: a read-only view, `args.<flag name>`."""
        return FlatArgs(self)

    def validate(self, check_files: bool = False) -> "JobConfig":
        """Fill in the derived defaults and check the values (ConfigError naming the flag). Idempotent. With
        `check_files`, also the files the flags name (the head does this once, before anything is written)."""
        _validate(self, check_files)
        return self


# section name (the JobConfig attribute) -> its dataclass, in --help order
SECTIONS: dict[str, type] = {f.name: f.default_factory for f in fields(JobConfig) if f.default_factory is not MISSING}


@dataclass(frozen=True)
class FieldSpec:
    """One flag: its section, name, type, default and help, as the dataclass field declares them."""
    section: str
    name: str
    base: type                    # int, float, str or bool (the element type of a list)
    is_list: bool
    optional: bool
    default: Any
    help: str | None
    choices: list | None
    path: bool
    top: bool
    cli: bool

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def switch(self) -> bool:
        """A bool defaulting to False: `--flag` turns it on (store_true); a bool defaulting to True takes a value."""
        return self.base is bool and not self.is_list and self.default is False

    def describe(self) -> str:
        kind = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[self.base]
        if self.is_list:
            kind = f"a list of {kind.split(' ', 1)[1]}s" if self.base is not bool else "a list of booleans"
        if self.choices:
            kind = f"one of {self.choices}"
        return kind + (" or null" if self.optional else "")

    def check(self, value: Any, source: str) -> Any:
        """`value` as this field's type, or ConfigError naming the field."""
        def bad():
            return ConfigError(f"{source}: field {self.name!r} ({self.option}) must be {self.describe()}, "
                               f"got {value!r:.200}")

        if value is None:
            if self.optional:
                return None
            raise bad()
        if self.is_list:
            if not isinstance(value, (list, tuple)):
                raise bad()
            out = []
            for v in value:
                ok, conv = _scalar(self.base, v)
                if not ok:
                    raise bad()
                out.append(conv)
            return out
        ok, conv = _scalar(self.base, value)
        if not ok or (self.choices and conv not in self.choices):
            raise bad()
        return conv


def _scalar(base: type, v: Any) -> tuple[bool, Any]:
    if base is bool:
        return isinstance(v, bool), v
    if base is int:
        return isinstance(v, int) and not isinstance(v, bool), v
    if base is float:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        return ok, float(v) if ok else v
    return isinstance(v, str), v


def _field_specs() -> dict[str, FieldSpec]:
    out: dict[str, FieldSpec] = {}
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            tp = hints[f.name]
            args = typing.get_args(tp)
            optional = type(None) in args and isinstance(tp, types.UnionType)
            if optional:
                (tp,) = [a for a in args if a is not type(None)]
            is_list = typing.get_origin(tp) is list
            base = typing.get_args(tp)[0] if is_list else tp
            if base not in (int, float, str, bool):
                raise TypeError(f"{cls.__name__}.{f.name}: a flag is an int, float, str or bool (or a list of one)")
            if f.name in out:
                raise TypeError(f"{cls.__name__}.{f.name}: the name is already a field of section "
                                f"{out[f.name].section!r}; flag names are unique (the plug-ins' flat view uses them)")
            md = f.metadata
            default = [] if f.default is MISSING else f.default
            out[f.name] = FieldSpec(section, f.name, base, is_list, optional, default, md.get("help"),
                                    md.get("choices"), md.get("path", False), md.get("top", False), md["cli"])
    return out


FIELDS: dict[str, FieldSpec] = _field_specs()   # flag name (slime's) -> its spec, in --help order


def default_of(name: str) -> Any:
    """The declared default of flag `name` (for code outside a job that needs the same default)."""
    return FIELDS[name].default


def _suggest(name: str) -> str:
    close = difflib.get_close_matches(name, list(FIELDS), n=2, cutoff=0.75)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


class FlatArgs:
    """slime's `args` for user plug-ins (reward functions `fn(args, sample)`, custom generate functions, dynamic
    sampling filters `fn(args, samples)`, rollout functions): the job's config as flat attributes with slime's names
    (`args.rollout_max_response_len`, `args.n_samples_per_prompt`, ...), read-only, always current. An unknown
    name raises AttributeError (so `getattr(args, name, default)` in a plug-in works as with slime's Namespace)."""
    __slots__ = ("_cfg",)

    def __init__(self, cfg: JobConfig):
        object.__setattr__(self, "_cfg", cfg)

    def __getattr__(self, name: str) -> Any:
        spec = FIELDS.get(name) if not name.startswith("_") else None
        if spec is None:
            raise AttributeError(f"args has no attribute {name!r}: not a flag of this job{_suggest(name)}")
        value = getattr(getattr(self._cfg, spec.section), name)
        return list(value) if isinstance(value, list) else value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"args is read-only (setting {name!r}): plug-ins get the job's config to read; keep "
                             "your own state elsewhere")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"args is read-only (deleting {name!r})")

    def __dir__(self) -> list[str]:
        return list(FIELDS)

    def __reduce__(self):
        return FlatArgs, (self._cfg,)

    def __repr__(self) -> str:
        return "FlatArgs(" + ", ".join(f"{k}={v!r}" for k, v in self._cfg.to_dict().items()) + ")"

    def to_dict(self) -> dict:
        return self._cfg.to_dict()


# ---------------------------------------------------------------------------------------------------------------
# the parser, generated from the fields

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


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ConfigError(message)


def _add(group, spec: FieldSpec) -> None:
    text = (spec.help or "").replace("%", "%%")
    kw: dict[str, Any] = {"default": spec.default, "help": f"{text} (default: %(default)s)".lstrip()}
    if spec.switch:
        kw["action"] = "store_true"
    else:
        if spec.base is not str:
            kw["type"] = _bool if spec.base is bool else spec.base
        if spec.is_list:
            kw["nargs"] = "+"
        if spec.choices:
            kw["choices"] = spec.choices
    group.add_argument(spec.option, **kw)


def build_parser() -> argparse.ArgumentParser:
    """`slime-actors train`'s parser: one argument per field, one group per section (errors raise ConfigError)."""
    p = _Parser(prog="slime-actors train", description="RL post-training on slime-actors.")
    specs = [s for s in FIELDS.values() if s.cli]
    for s in specs:
        if s.top:
            _add(p, s)
    for section, cls in SECTIONS.items():
        g = p.add_argument_group(cls.TITLE)
        for s in specs:
            if s.section == section and not s.top:
                _add(g, s)
    return p


# ---------------------------------------------------------------------------------------------------------------
# the config file

def _flatten(d: dict, prefix: str = "") -> list[tuple[str, object]]:
    items = []
    for k, v in d.items():
        if isinstance(v, dict) and k not in ("sglang", "router"):
            items.extend(_flatten(v, f"{prefix}{k}."))
        else:
            items.append((f"{prefix}{k}", v))
    return items


def _config_to_argv(path: str) -> list[str]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    argv: list[str] = []
    base = Path(path).resolve().parent

    def near(v):  # a path relative to the config file, when there is such a file there
        if isinstance(v, str) and not v.startswith(("tiny:", "smollm2:", "/")) and (base / v).exists():
            return str(base / v)
        return v

    for dotted, value in _flatten(data):
        key = dotted.rsplit(".", 1)[-1]
        if key in ("sglang", "router") and isinstance(value, dict):
            for k, v in value.items():
                argv += _passthrough(f"--{key}-{k.replace('_', '-')}", v)
            continue
        norm = key.replace("-", "_")
        spec = FIELDS.get(norm)
        if spec is None or not spec.cli or norm == "config":
            raise ConfigError(f"config file {path}: unknown key {dotted!r} (no flag --{norm.replace('_', '-')})")
        if spec.switch:
            if not isinstance(value, bool):
                raise ConfigError(f"config file {path}: {dotted} must be true or false, got {value!r}")
            if value:
                argv.append(spec.option)
            continue
        if isinstance(value, list):
            argv += [spec.option, *[str(near(v) if spec.path else v) for v in value]]
        else:
            value = near(value) if spec.path else value
            argv += [spec.option, str(value).lower() if isinstance(value, bool) else str(value)]
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


def parse_config(argv: list[str] | None = None) -> JobConfig:
    """Flags and the --config file -> the validated JobConfig (ConfigError naming the flag, file or key)."""
    parser = build_parser()
    argv = list(argv or [])
    ours, sglang, router = split_passthrough(argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    known, _ = pre.parse_known_args(ours)
    file_argv: list[str] = []
    if known.config:
        file_argv = _config_to_argv(known.config)
        file_ours, file_sglang, file_router = split_passthrough(file_argv)
        file_argv = file_ours
        sglang = file_sglang + sglang
        router = file_router + router
    ns = vars(parser.parse_args(file_argv + ours))
    values: dict[str, dict] = {name: {} for name in SECTIONS}
    for spec in FIELDS.values():
        if spec.cli:
            values[spec.section][spec.name] = ns[spec.name]
    cfg = JobConfig(**{name: SECTIONS[name](**kw) for name, kw in values.items()})
    cfg.engine.sglang_args = sglang
    cfg.engine.router_args = router
    return cfg.validate(check_files=True)


# ---------------------------------------------------------------------------------------------------------------
# derived values and checks

def _validate(cfg: JobConfig, check_files: bool) -> None:
    def bad(msg):
        raise ConfigError(msg)

    run, ro, tr, ev, al, dbg = cfg.run, cfg.rollout, cfg.train, cfg.eval, cfg.algorithm, cfg.debug
    w = cfg.weights
    if w.update_weight_transport is None:
        w.update_weight_transport = "colocated" if cfg.engine.colocate else "distributed"
    if w.update_weight_transport == "nccl":
        w.update_weight_transport = "distributed"
    if (cfg.engine.colocate and run.device.startswith("cuda") and w.update_weight_transport == "distributed"
            and not dbg.debug_train_only):
        bad("--colocate puts each engine on a trainer rank's GPU, and --update-weight-transport distributed would "
            "join the two processes of that GPU in one NCCL group, which NCCL refuses ('Duplicate GPU detected'): "
            "leave the flag out (colocated, CUDA IPC, is the default with --colocate) or use disk")
    if cfg.engine.num_gpus_per_node is not None and cfg.engine.num_gpus_per_node < 1:
        bad(f"--num-gpus-per-node must be >= 1, got {cfg.engine.num_gpus_per_node}")
    if ro.over_sampling_batch_size is None:
        ro.over_sampling_batch_size = ro.rollout_batch_size
    if ro.over_sampling_batch_size < ro.rollout_batch_size:
        bad(f"--over-sampling-batch-size ({ro.over_sampling_batch_size}) must be >= --rollout-batch-size "
            f"({ro.rollout_batch_size})")
    for section, name in (("rollout", "rollout_batch_size"), ("rollout", "n_samples_per_prompt"),
                          ("run", "num_rollout"), ("engine", "rollout_num_engines"),
                          ("train", "actor_num_gpus_per_node"), ("train", "micro_batch_size"),
                          ("rollout", "rollout_max_response_len"), ("reward", "math_grading_processes")):
        value = getattr(getattr(cfg, section), name)
        if value < 1:
            bad(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if cfg.logging.log_samples_interval < 0:
        bad(f"--log-samples-interval must be >= 0, got {cfg.logging.log_samples_interval}")
    if not cfg.reward.math_grading_timeout > 0:
        bad(f"--math-grading-timeout must be > 0 seconds, got {cfg.reward.math_grading_timeout}")
    if al.eps_clip_c is not None and al.eps_clip_c <= 1.0:
        bad(f"--eps-clip-c must be > 1.0, got {al.eps_clip_c}")
    if tr.use_dynamic_batch_size and not tr.max_tokens_per_gpu:
        bad("--use-dynamic-batch-size needs --max-tokens-per-gpu")
    if al.advantage_estimator in ("grpo", "gspo", "reinforce_plus_plus_baseline") and ro.n_samples_per_prompt < 2:
        bad(f"--advantage-estimator {al.advantage_estimator} compares samples of a group: "
            "--n-samples-per-prompt must be >= 2")
    if dbg.debug_rollout_only and dbg.debug_train_only:
        bad("--debug-rollout-only and --debug-train-only exclude each other")
    if dbg.debug_train_only and not dbg.load_debug_rollout_data:
        bad("--debug-train-only needs --load-debug-rollout-data")
    if check_files and dbg.load_debug_rollout_data:  # the first rollout must be there (later ones: when loaded)
        first = debug_rollout_path(dbg.load_debug_rollout_data, run.start_rollout_id or 0)
        if not first.is_file():
            bad(f"--load-debug-rollout-data {dbg.load_debug_rollout_data}: no saved rollout "
                f"{run.start_rollout_id or 0} at {first} (--save-debug-rollout-data writes one file per rollout)")
    if cfg.data.prompt_data is None and not dbg.load_debug_rollout_data:
        bad("--prompt-data is required")
    if check_files and cfg.data.prompt_data and not os.path.exists(cfg.data.prompt_data):
        bad(f"--prompt-data {cfg.data.prompt_data} does not exist")
    if cfg.model.hf_checkpoint is None:
        bad("--hf-checkpoint is required (a Hugging Face model directory, tiny:digits, or smollm2:135m)")
    total = ro.rollout_batch_size * ro.n_samples_per_prompt
    if tr.global_batch_size is None:
        tr.global_batch_size = total
    if tr.global_batch_size < 1 or total % tr.global_batch_size:
        bad(f"rollout-batch-size x n-samples-per-prompt ({total}) must be a multiple of --global-batch-size "
            f"({tr.global_batch_size})")
    if ro.rollout_batch_size % tr.n_ranks:
        bad(f"--rollout-batch-size ({ro.rollout_batch_size}) must be a multiple of the trainer ranks "
            f"({tr.n_ranks}): each rank trains on whole prompt groups")
    if tr.num_steps_per_rollout is None:
        tr.num_steps_per_rollout = total // tr.global_batch_size
    if ev.eval_temperature is None:
        ev.eval_temperature = 0.0
    if ev.eval_max_response_len is None:
        ev.eval_max_response_len = ro.rollout_max_response_len
    if tr.critic_lr is None:
        tr.critic_lr = tr.lr
    if al.eps_clip_high is None:
        al.eps_clip_high = al.eps_clip
    rw = cfg.reward
    if rw.rm_type is None and rw.custom_rm_path is None and rw.reward_actor_class is None:
        bad("choose a reward: --rm-type (math, boxed, exact_match, remote_rm, ...) or --custom-rm-path")
    if rw.rm_type == "remote_rm" and not rw.rm_url:
        bad("--rm-type remote_rm needs --rm-url")
    if cfg.engine.sglang_router_ip and not cfg.engine.sglang_router_port:
        bad("--sglang-router-ip needs --sglang-router-port")
    _validate_monitor(cfg.monitor, cfg.checkpoint, bad)


def _validate_monitor(mon: MonitorSection, ckpt: CheckpointSection, bad) -> None:
    from .monitor.hacking import ALARMS, HackThresholds
    try:
        HackThresholds.parse(mon.hack_alarm_thresholds)
    except ValueError as exc:
        bad(f"--hack-alarm-thresholds {mon.hack_alarm_thresholds}: {exc}")
    unknown = [a for a in mon.hack_alarms_ignore or [] if a not in ALARMS]
    if unknown:
        bad(f"--hack-alarms-ignore: unknown alarm(s) {', '.join(unknown)}; the alarms are {', '.join(ALARMS)}")
    if mon.hack_alarms == "stop" and not ckpt.save:
        bad("--hack-alarms stop saves a checkpoint when an alarm ends the run: give --save DIR (where checkpoints "
            "go)")


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

