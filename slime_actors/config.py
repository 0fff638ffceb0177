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

    max_staleness: int = flag(1, "async: newest weight version minus oldest used", ge=0)

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
import json
import os
import re
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from .hack_thresholds import HackThresholds
from .json_files import not_regular, parse_json
from .slime_compat import COMPAT

ESTIMATORS = ["grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"]
LOSS_TYPES = ["policy_loss", "sft_loss", "custom_loss"]
KL_TYPES = ["k1", "k2", "k3", "low_var_kl"]


class ConfigError(ValueError):
    """Bad flags, values, config file entries or job file fields: `problems`, one line each, every one naming its
    flag (or file and key). The checks run to the end, so one error reports every problem found."""

    def __init__(self, problems: str | list[str]):
        self.problems = [problems] if isinstance(problems, str) else [str(p) for p in problems]
        super().__init__("\n".join(self.problems))

    def prefixed(self, prefix: str) -> "ConfigError":
        """The same problems, each after `prefix` (e.g. the job file's name)."""
        return ConfigError([f"{prefix}{p}" for p in self.problems])


class StartupError(RuntimeError):
    """An actor cannot start, and starting it again will not change that (the message says why and what to do):
    `--device cuda` where the process sees no GPU, say. The launcher's start-up rule (launch/startup.py) stops the job
    on it instead of restarting the actor. It lives here, below the roles, so that an actor can raise it without
    importing the launcher."""


class Problems(list):
    """Problems found so far, in order; `add` one, `merge` a ConfigError's, `raise_if_any` at the end."""

    def add(self, message: str) -> None:
        if message not in self:
            self.append(message)

    def merge(self, exc: ConfigError) -> None:
        for p in exc.problems:
            self.add(p)

    def raise_if_any(self) -> None:
        if self:
            raise ConfigError(list(self))


def flag(default: Any = None, help: str | None = None, *, choices: list | None = None, path: bool = False,
         top: bool = False, origin: str = "slime", slime: tuple[Any, str] | None = None,
         ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None) -> Any:
    """A field that is a command-line flag (and a TOML key). `path`: a relative value in a config file is taken
    relative to that file when such a file exists; `top`: listed before the groups in --help. `origin`: whose flag
    it is -- "slime" (slime's name and meaning), "megatron" (a Megatron-LM flag slime passes on) or "own" (this
    project's); `slime=(slime's default, why ours differs)` when the default differs from slime's, with two more
    strings when the defaults are derived (ours and slime's as docs/flags.md shows them). docs/flags.md lists
    them; tests/test_flags.py checks them against slime's recorded parser. `ge` / `gt` / `le` / `lt`: the range of
    a number (of each number of a list), checked at parse time with an error naming the flag."""
    if origin not in ("slime", "megatron", "own"):
        raise ValueError(f"origin {origin!r}")
    bounds = tuple((op, v) for op, v in ((">=", ge), (">", gt), ("<=", le), ("<", lt)) if v is not None)
    return field(default=default, metadata={"help": help, "choices": choices, "path": path, "top": top, "cli": True,
                                            "origin": origin, "slime": slime, "bounds": bounds})


def passthrough() -> Any:
    """A field filled by the parser, not a flag of its own (the --sglang-* / --router-* passthrough lists)."""
    return field(default_factory=list, metadata={"cli": False})


# ---------------------------------------------------------------------------------------------------------------
# the sections (each is a --help group, in this order)

@dataclass(slots=True)
class RunSection:
    """What the job does and where it writes."""
    TITLE: typing.ClassVar[str] = "run"
    config: str | None = flag(None, "TOML file setting any of these flags; the command line wins", top=True,
                              origin="own")
    run_dir: str = flag("runs/train", "where the run writes: traces/, logs/, metrics.jsonl, curves.png, tensorboard/, "
                                      "checkpoints (unless --save)", origin="own")
    seed: int = flag(1234, "seed of the trainer's random number generators")
    device: str = flag("cpu", "where the trainer and the local engine run", choices=["cpu", "cuda"], origin="own")
    num_rollout: int | None = flag(
        None, "training steps (rollout + train + weight sync each); default: from --num-epoch, else 10",
        slime=(None, "slime requires --num-rollout or --num-epoch; here a short run of 10 steps", "10",
               "required"), ge=1)
    num_epoch: int | None = flag(
        None, "passes over --prompt-data: --num-rollout = num-epoch x prompts // --rollout-batch-size "
              "(ignored when --num-rollout is given, as in slime)", ge=1)
    start_rollout_id: int | None = flag(
        None, "first rollout id (default: the one after the checkpoint --load names, else 0)", ge=0)
    async_train: bool = flag(False, "one-step-off: generate rollout k+1 while training on rollout k", origin="own")
    max_staleness: int = flag(1, "--async-train: newest weight version minus the oldest one a trained sample may "
                                 "come from (older samples are generated again)", origin="own")
    progress: bool = flag(True, "a progress bar on the console (only when it is a terminal)", origin="own")

    @property
    def n_rollouts(self) -> int:
        """Training steps of the job: --num-rollout as `validate()` settled it (from --num-epoch, else the
        default)."""
        if self.num_rollout is None:
            raise ConfigError("--num-rollout: not settled (the job config was not validated)")
        return self.num_rollout


@dataclass(slots=True)
class RuntimeSection:
    """How the actors talk: tracing, transport, keys, liveness (what slime_actors.runtime gives every process)."""
    TITLE: typing.ClassVar[str] = "runtime"
    trace: bool = flag(True, "record every message in RUN_DIR/traces (docs/debugging.md)", origin="own")
    trace_keep_arrays: bool = flag(False, "record the bytes of arrays in messages too (by default: their shape, "
                                          "dtype and checksum)", origin="own")
    trace_max_bytes: int = flag(1 << 30, "bytes of trace files each process keeps at most: they rotate in 8 "
                                         "segments, the first (the actor's start, which replay runs) and the newest "
                                         "kept; 0: no bound (docs/trace-format.md, Rotation)", origin="own")
    curve: bool = flag(True, "CurveZMQ keys per job: actors accept messages from this job's processes only "
                             "(docs/security.md)", origin="own")
    transport: str = flag("ipc", "ipc: one host; tcp: several hosts", choices=["ipc", "tcp"], origin="own")
    heartbeat_interval: float = flag(1.0, "seconds between an actor's heartbeats to the directory", origin="own", gt=0)
    heartbeat_liveness: int = flag(5, "missed heartbeats before an actor is declared down", origin="own", ge=1)


@dataclass(slots=True)
class ModelSection:
    """The model: its weights and tokenizer, and the reference model."""
    TITLE: typing.ClassVar[str] = "model"
    hf_checkpoint: str | None = flag(
        None, "Hugging Face model directory: the initial weights, the tokenizer and the architecture (or tiny:NAME, "
              "smollm2:135m)", path=True)
    ref_load: str | None = flag(None, "reference model for --use-kl-loss / --kl-coef: a checkpoint or an HF "
                                      "directory (default: the initial weights)", path=True)


@dataclass(slots=True)
class DataSection:
    """The training prompts."""
    TITLE: typing.ClassVar[str] = "data"
    prompt_data: str | None = flag(None, "jsonl or parquet file of prompts", path=True)
    input_key: str = flag("input", "the prompt's key in each row (a string, or a list of chat messages)")
    label_key: str | None = flag(None, "the label's key in each row (what the reward function compares with)")
    metadata_key: str = flag("metadata", "the key of each row's metadata (an object, or a JSON string of one)")
    tool_key: str | None = flag("tools", "the key of each row's tools (a list), passed to the chat template")
    apply_chat_template: bool = flag(False, "wrap each prompt in the tokenizer's chat template (a string prompt "
                                            "becomes one user message)")
    apply_chat_template_kwargs: str = flag(
        "{}", "JSON object of extra arguments to the chat template, e.g. '{\"enable_thinking\": false}' (Qwen3)")
    rollout_shuffle: bool = flag(False, "shuffle the prompts (each epoch, with --rollout-seed)")
    rollout_seed: int = flag(42, "seed of the prompt shuffle and of the engines' sampling")
    rollout_max_prompt_len: int | None = flag(
        None, "drop prompts longer than this many tokens (counted, the first line numbers logged); default: the "
              "model's context (config.json's max_position_embeddings, or --sglang-context-length) less "
              "--rollout-max-response-len, since a longer prompt cannot be generated from", ge=1)
    prompt_data_max_row_bytes: int = flag(
        4 << 20, "a row (jsonl line, parquet row) of the prompt files larger than this is skipped unread and counted: "
                 "memory stays bounded whatever a file holds (docs/security.md)", origin="own", ge=1)


@dataclass(slots=True)
class RolloutSection:
    """What a rollout is: batch sizes, sampling, the user's generate/rollout/filter functions."""
    TITLE: typing.ClassVar[str] = "rollout"
    rollout_batch_size: int = flag(8, "prompts per training step (each gets --n-samples-per-prompt responses)",
                                   slime=(None, "slime requires it; a small default suits the CPU examples"), ge=1)
    n_samples_per_prompt: int = flag(8, "responses generated per prompt (a group)",
                                     slime=(1, "the default estimator, grpo, compares the samples of a group"), ge=1)
    over_sampling_batch_size: int | None = flag(
        None, "prompt groups handed out per step (>= --rollout-batch-size; the extra absorbs filtering); default: "
              "--rollout-batch-size", ge=1)
    rollout_max_response_len: int = flag(
        32, "most tokens generated per response",
        slime=(None, "slime leaves it to the engine's default; a bound keeps the CPU examples short"), ge=1)
    rollout_temperature: float = flag(1.0, "sampling temperature of rollouts", ge=0)
    rollout_top_p: float = flag(1.0, "top-p of rollouts", gt=0, le=1)
    rollout_top_k: int = flag(-1, "top-k of rollouts (-1: off)", ge=-1)
    rollout_stop: list[str] | None = flag(None, "strings that end a response (the engine stops at the first)")
    rollout_stop_token_ids: list[int] | None = flag(None, "token ids that end a response", ge=0)
    partial_rollout: bool = flag(False, "keep aborted samples' partial responses and continue them next step")
    max_failed_groups: int = flag(
        0, "a training rollout in which this many groups failed -- a reward that raised; a generate function that "
           "raised, a request the engine refused (4xx) or samples the buffer refused, 3 times for the group (an "
           "engine out of reach does not count) -- stops the job with the last error (a user's function that always "
           "fails would otherwise make groups for ever); 0: twice --rollout-batch-size", origin="own", ge=0)
    dynamic_sampling_filter_path: str | None = flag(
        None, "dotted path of fn(args, samples) -> bool keeping a group; built-in: "
              "slime_actors.filters.check_reward_nonzero_std. A rollout is complete once --rollout-batch-size groups "
              "pass it (the buffer warns when it has dropped 2, 4, 8, ... times that many)")
    custom_generate_function_path: str | None = flag(
        None, "dotted path (or file.py:fn) of async generate(args, sample, sampling_params) -> Sample, as in slime "
              "(args.sglang_router_ip / _port reach this worker's engine), or of @engine_generate generate(args, "
              "sample, sampling_params, engine) with this project's engine handle")
    rollout_interaction_env_path: str | None = flag(
        None, "the environment of multi-turn episodes (tools, search, code, other agents): pkg.mod:Class or "
              "file.py:Class, a subclass of slime_actors.environments.Env (docs/adding-an-environment.md); or, as in "
              "slime's multi-turn examples (where this is a --custom-config-path key), a module with build_env",
        origin="own")
    agent_function_path: str | None = flag(
        None, "an agent written against a chat API: async fn(sample, base_url, api_key) -> reward | answer | None, "
              "pkg.mod:fn or file.py:fn; it talks to this worker's OpenAI- and Anthropic-compatible endpoint "
              "(a key per episode), its calls become the episode's samples (docs/agents.md)", origin="own")
    max_turns: int | None = flag(
        None, "most model turns per episode of --rollout-interaction-env-path (slime's custom-config key max_turns, "
              "verl's max_assistant_turns); default: the environment's own max_turns, else only the token budget "
              "(--rollout-max-response-len, across turns)", origin="own", ge=1)
    env_kwargs: str = flag(
        "{}", "JSON object of keyword arguments for the environment's constructor (a TOML config may give an "
              "[env_kwargs] table)", origin="own")
    env_error: str = flag(
        "fail", "an environment that raises, times out or answers out of its API: fail the sample (its group is "
                "recorded as failed, counted in rollout/failed, and replaced by a new one) or stop the job",
        choices=["fail", "stop"], origin="own")
    env_timeout: float = flag(600.0, "seconds one environment call (reset, step, close) may take before it counts "
                                     "as failed (--env-error)", origin="own", gt=0)
    rollout_function_path: str | None = flag(
        None, "dotted path of async fn(args, samples, sampling_params, engine) -> samples, called per group instead "
              "of the built-in rollout",
        slime=("slime.rollout.sglang_rollout.generate_rollout", "unset means this project's built-in rollout; "
               "slime's value names slime's own module, whose signature differs (per rollout, not per group)"))


@dataclass(slots=True)
class EngineSection:
    """The generation engines: how many, where, their HTTP keys, the router, health checks."""
    TITLE: typing.ClassVar[str] = "rollout engines"
    rollout_engine: str = flag("local", "local: this project's engine (CPU or GPU, any HF model it can run); "
                                        "sglang: SGLang servers", choices=["local", "sglang"], origin="own")
    rollout_num_gpus: int | None = flag(
        None, "GPUs for generation in all: --rollout-num-engines = rollout-num-gpus / --rollout-num-gpus-per-engine; "
              "default: with --colocate the trainer's GPUs (as in slime), else one engine", ge=0)
    rollout_num_engines: int | None = flag(
        None, "rollout workers, one engine each (default: from --rollout-num-gpus)", origin="own", ge=1)
    rollout_num_gpus_per_engine: int = flag(1, "GPUs per engine (SGLang's --tp-size)", ge=1)
    rollout_external_engine_addrs: list[str] | None = flag(
        None, "HOST:PORT of engines started elsewhere (one rollout worker attaches to each)")
    frozen_engine_checkpoint: str | None = flag(
        None, "a second engine per rollout worker serving this checkpoint (same tokenizer as --hf-checkpoint), "
              "never updated: a role played by a fixed model (engine.frozen in generate functions; "
              "docs/multi-agent.md)", origin="own")
    rollout_concurrency: int = flag(64, "HTTP requests in flight per engine", origin="own", ge=1)
    engine_max_batch_size: int = flag(64, "sequences per batch of the engine (--max-running-requests)",
                                      origin="own", ge=1)
    use_fault_tolerance: bool = flag(False, "probe engines with /health_generate and restart ones that fail")
    rollout_health_check_interval: float = flag(30.0, "--use-fault-tolerance: seconds between probes", gt=0)
    rollout_health_check_timeout: float = flag(30.0, "--use-fault-tolerance: seconds an engine has to answer", gt=0)
    rollout_health_check_first_wait: float = flag(0.0, "seconds after start before the first probe", ge=0)
    engine_auth: bool = flag(True, "engines require keys: an API key for generation, an admin key for weight "
                                   "updates, pauses, aborts and cache flushes (made per job unless given below; "
                                   "docs/security.md)", origin="own")
    engine_api_key: str | None = flag(None, "the engines' API key (SGLang --api-key) instead of a job-made one; "
                                            "needed for external engines that have one. Visible in the process "
                                            "list: prefer --engine-api-key-file or $SLIME_ACTORS_ENGINE_API_KEY",
                                      origin="own")
    engine_api_key_file: str | None = flag(None, "file holding the engines' API key (mode 0600)", origin="own")
    engine_admin_api_key: str | None = flag(None, "the engines' admin key (SGLang --admin-api-key); see "
                                                  "--engine-api-key", origin="own")
    engine_admin_api_key_file: str | None = flag(None, "file holding the engines' admin key (mode 0600)",
                                                 origin="own")
    pause_generation_mode: str = flag(
        "abort", "how engines pause around a weight update in --async-train (SGLang /pause_generation mode): abort "
                 "in-flight requests (they go back to the buffer), retract them (recomputed after the update), or "
                 "keep them in place", choices=["abort", "retract", "in_place"], origin="own")
    use_sglang_router: bool = flag(False, "put an sglang-router in front of the engines (rollout/0 starts it unless "
                                          "--sglang-router-ip is given); every --router-<flag> is passed on as "
                                          "--<flag>", origin="own")
    sglang_router_ip: str | None = flag(None, "an sglang-router someone else started")
    sglang_router_port: int | None = flag(None, "its port, or the port to start one on", ge=1, le=65535)
    colocate: bool = flag(False, "engines share the trainer's GPUs (engine i starts at GPU i x "
                                 "rollout-num-gpus-per-engine); weights then go by CUDA IPC (the colocated "
                                 "transport) and a colocated engine gets --sglang-mem-fraction-static 0.4 unless "
                                 "given. On a machine with one GPU, one trainer rank and one engine colocate by "
                                 "themselves (docs/launch.md, On one GPU)")
    num_gpus_per_node: int | None = flag(None, "GPUs per node, for placing engines (default: counted on this "
                                               "machine: CUDA_VISIBLE_DEVICES, torch, Slurm)",
                                         slime=(8, "counted here, so a machine with fewer GPUs needs no flag (slime "
                                                   "asks for it under --colocate on fewer than 8)",
                                                "counted", "`8`"), ge=1)
    sglang_args: list[str] = passthrough()   # every --sglang-<flag> [value ...] as --<flag> [value ...]
    router_args: list[str] = passthrough()   # every --router-<flag> [value ...] as --<flag> [value ...]

    @property
    def n_engines(self) -> int:
        """Rollout workers of the job: --rollout-num-engines as `validate()` settled it (from --rollout-num-gpus,
        the external engines or the trainer's GPUs)."""
        if self.rollout_num_engines is None:
            raise ConfigError("--rollout-num-engines: not settled (the job config was not validated)")
        return self.rollout_num_engines


@dataclass(slots=True)
class EvalSection:
    """Held-out evaluation."""
    TITLE: typing.ClassVar[str] = "eval"
    eval_prompt_data: list[str] | None = flag(None, "NAME PATH [NAME PATH ...] (or one PATH): held-out sets",
                                              path=True)
    eval_config: str | None = flag(None, "YAML (or JSON, TOML) file of held-out sets, slime's format: each set's "
                                         "name, path, keys and its own reward (rm_type or custom_rm_path), which "
                                         "grades it whatever the training reward; replaces --eval-prompt-data "
                                         "(slime_actors/eval_config.py)", path=True)
    eval_input_key: str | None = flag(None, "the prompt's key in eval rows (default: --input-key)")
    eval_label_key: str | None = flag(None, "the label's key in eval rows (default: --label-key)")
    eval_interval: int | None = flag(None, "evaluate every N rollouts (and before the first and after the last; "
                                           "0: only then)", ge=0)
    n_samples_per_eval_prompt: int = flag(1, "responses per eval prompt", ge=1)
    eval_temperature: float | None = flag(
        None, "default: greedy (0)",
        slime=(None, "slime samples evals at --rollout-temperature; a greedy eval is deterministic, so before/after "
                     "numbers compare the weights, not the dice", "0 (greedy)", "--rollout-temperature"), ge=0)
    eval_top_p: float | None = flag(None, "top-p of evals (default: --rollout-top-p)", gt=0, le=1)
    eval_top_k: int | None = flag(None, "top-k of evals (default: --rollout-top-k)", ge=-1)
    eval_max_response_len: int | None = flag(None, "most tokens per eval response (default: "
                                                   "--rollout-max-response-len)", ge=1)
    skip_eval_before_train: bool = flag(False, "no evaluation before the first step")
    save_eval_responses: bool = flag(True, "write every held-out evaluation's responses to "
                                           "RUN_DIR/evals/NAME_stepK.jsonl (`slime-actors samples RUN --eval` / "
                                           "`--report` read them)", origin="own")


@dataclass(slots=True)
class RewardSection:
    """How responses are scored."""
    TITLE: typing.ClassVar[str] = "reward"
    rm_type: str | None = flag(None, "built-in reward: math, boxed_math, dapo, deepscaler, boxed, exact_match, "
                                     "exact_match_ci, f1, remote_rm, random, code (or boxed_<type>)")
    custom_rm_path: str | None = flag(None, "dotted path (or file.py:fn) of async fn(args, sample) -> float")
    group_rm: bool = flag(False, "the reward function scores a whole group at once: fn(args, samples) -> list")
    rm_url: str | None = flag(None, "--rm-type remote_rm: the reward model's URL (POST, JSON)")
    rm_timeout: float = flag(60.0, "--rm-type remote_rm: seconds per request attempt", origin="own", gt=0)
    rm_max_attempts: int = flag(5, "--rm-type remote_rm: attempts per sample (connection errors, timeouts, 5xx, "
                                   "408 and 429 are retried with backoff)", origin="own", ge=1)
    rm_headers: str | None = flag(
        None, "--rm-type remote_rm: JSON object of HTTP headers; ${NAME} in a value is read from the reward "
              "worker's environment (keep tokens out of job files: '{\"Authorization\": \"Bearer ${RM_TOKEN}\"}')",
        origin="own")
    reward_key: str | None = flag(None, "when the reward function returns a dict: the key of the reward in it "
                                        "(default: \"reward\")")
    num_reward_workers: int = flag(1, "reward worker processes", origin="own", ge=1)
    reward_actor_class: str | None = flag(None, "pkg.mod:Class of your own reward actor (role reward, handler "
                                                "score); see docs/adding-a-reward-actor.md", origin="own")
    reward_batch_size: int = flag(64, "samples a reward worker scores at once", origin="own", ge=1)
    math_grading_timeout: float = flag(5.0, "seconds math-verify may spend on one sample (math, boxed_math, "
                                            "deepscaler); past it the sample scores 0 and counts in "
                                            "rollout/reward_timeouts", origin="own", gt=0)
    math_grading_processes: int = flag(2, "math-verify processes per reward worker (each item's deadline is "
                                          "enforced by killing its process)", origin="own", ge=1)
    code_partial_credit: bool = flag(False, "--rm-type code: the reward is the fraction of the sample's tests "
                                            "that pass (default: 1 if all pass, else 0)", origin="own")
    sandbox_timeout: float = flag(10.0, "--rm-type code: wall-clock seconds of one program run (the program with "
                                        "its assert tests, or one stdin/stdout case); its CPU time limit too",
                                  origin="own", gt=0)
    sandbox_memory_mb: int = flag(1024, "--rm-type code: address space of each process of a program, MiB "
                                        "(a Python program needs about 30)", origin="own", ge=64)
    sandbox_concurrency: int | None = flag(None, "--rm-type code: programs one reward worker runs at once "
                                                 "(default: its CPUs)", origin="own", ge=1)
    sandbox_allow_network: bool = flag(False, "--rm-type code: run programs even where the sandbox cannot cut "
                                              "the network (neither a network namespace nor seccomp); "
                                              "docs/code-sandbox.md", origin="own")
    sandbox_python: str | None = flag(None, "--rm-type code: the Python that runs programs in the sandbox "
                                            "(default: /usr/bin/python3, which the sandbox's user can reach)",
                                      origin="own")


@dataclass(slots=True)
class AlgorithmSection:
    """The RL algorithm: advantages and the loss."""
    TITLE: typing.ClassVar[str] = "algorithm"
    advantage_estimator: str = flag("grpo", "how rewards become per-token advantages (docs/flags.md)",
                                    choices=ESTIMATORS)
    loss_type: str = flag("policy_loss", "policy_loss: the PPO-family loss of --advantage-estimator; sft_loss: "
                                         "negative log-likelihood of the responses; custom_loss: "
                                         "--custom-loss-function-path", choices=LOSS_TYPES)
    custom_loss_function_path: str | None = flag(
        None, "--loss-type custom_loss: dotted path (or file.py:fn) of fn(args, batch, log_probs, "
              "sum_of_sample_mean) -> (loss, metrics) (docs/flags.md)")
    eps_clip: float = flag(0.2, "PPO clip range (cispo: the lower bound of the truncated ratio is 1 - eps-clip)", ge=0)
    eps_clip_high: float | None = flag(None, "upper clip range (default: --eps-clip)", ge=0)
    eps_clip_c: float | None = flag(None, "dual-clip constant (> 1)", gt=1)
    use_kl_loss: bool = flag(False, "add --kl-loss-coef x KL(actor || reference) to the loss")
    kl_loss_coef: float = flag(0.0, "weight of the KL loss", ge=0)
    kl_loss_type: str = flag("k1", "KL estimator of the KL loss", choices=KL_TYPES)
    kl_coef: float = flag(0.0, "KL penalty folded into the reward (reinforce_plus_plus, ppo)", ge=0)
    entropy_coef: float = flag(0.0, "weight of the entropy bonus")
    use_tis: bool = flag(False, "truncated importance sampling vs the rollout log-probs")
    tis_clip: float = flag(2.0, "--use-tis: upper bound of the importance weight", gt=0)
    tis_clip_low: float = flag(0.0, "--use-tis: lower bound of the importance weight", ge=0)
    gamma: float = flag(1.0, "discount (ppo, reinforce_plus_plus)", ge=0, le=1)
    lambd: float = flag(1.0, "GAE lambda (ppo)", ge=0, le=1)
    normalize_advantages: bool = flag(False, "whiten the advantages over the rollout's tokens")
    disable_grpo_std_normalization: bool = flag(False, "grpo: subtract the group mean only (Dr. GRPO)")
    value_clip: float = flag(0.2, "ppo: clip range of the value loss", ge=0)
    calculate_per_token_loss: bool = flag(False, "reduce the loss per token instead of per sample")

    @property
    def needs_reference(self) -> bool:
        """Whether the reference model is loaded and run: a KL loss (its term, or with --kl-loss-coef 0 its
        train/kl_loss metric, as slime logs it) or a KL penalty in the reward. Otherwise no reference model is
        loaded and no reference forward runs."""
        return self.use_kl_loss or self.kl_coef != 0


@dataclass(slots=True)
class TrainSection:
    """The trainer: backend, ranks, optimizer, batches."""
    TITLE: typing.ClassVar[str] = "training"
    train_backend: str = flag("torch", "torch: FSDP/DDP on CPU or GPU; megatron: megatron-core on GPUs",
                              choices=["torch", "megatron"],
                              slime=("megatron", "megatron-core needs GPUs; the torch backend runs anywhere (CI, "
                                                 "the CPU examples)"))
    actor_num_nodes: int = flag(1, "nodes of trainer ranks", ge=1)
    actor_num_gpus_per_node: int = flag(1, "trainer ranks per node (processes on CPU)",
                                        slime=(8, "one GPU unless told; slime assumes a node of eight"), ge=1)
    torch_parallel: str = flag("ddp", "--train-backend torch: replicate (ddp) or shard (fsdp) the model",
                               choices=["ddp", "fsdp"], origin="own")
    lr: float = flag(1e-6, "learning rate (constant)", ge=0)
    critic_lr: float | None = flag(None, "ppo: the critic's learning rate (default: --lr)", origin="own", ge=0)
    weight_decay: float = flag(0.0, "AdamW weight decay", origin="megatron",
                               slime=(0.01, "Megatron's default; RL fine-tuning here decays nothing unless asked "
                                            "(slime's scripts set 0.1)"), ge=0)
    adam_beta1: float = flag(0.9, "Adam's first-moment decay (beta1)", origin="megatron", ge=0, lt=1)
    adam_beta2: float = flag(0.98, "Adam's second-moment decay (beta2)", origin="megatron",
                             slime=(0.999, "Megatron's default; slime's scripts set 0.98"), ge=0, lt=1)
    clip_grad: float = flag(1.0, "gradient norm clipping", ge=0)
    global_batch_size: int | None = flag(None, "samples per optimizer step (default: all samples of the rollout)", ge=1)
    micro_batch_size: int = flag(1, "samples per forward/backward (unless --use-dynamic-batch-size)", ge=1)
    use_dynamic_batch_size: bool = flag(False, "pack micro-batches up to --max-tokens-per-gpu tokens")
    gradient_checkpointing: bool = flag(
        False, "--train-backend torch: keep only each decoder layer's input for the backward and recompute the layer "
               "there (Hugging Face's gradient checkpointing): the activations of a micro-batch shrink to one layer's, "
               "for a second forward of each training micro-batch", origin="own")
    head_chunk_mib: int = flag(
        256, "--train-backend torch in one trainer process, a Llama/Mistral/Qwen2/Qwen3 model: the training forward "
             "takes the response tokens' log-probs from the model's body and its head applied this many MiB of fp32 "
             "logits at a time (recomputed in the backward), never the micro-batch's whole logits; 0: the whole "
             "logits (docs/performance.md, \"The training forward's head a chunk of rows at a time\")",
        origin="own", ge=0)
    trainer_release_memory: bool = flag(
        True, "after each update a trainer rank gives the memory its allocator freed back to the OS (glibc's "
              "malloc_trim), and after each weight sync it drops the sync's flat bucket buffer; false: both are kept "
              "for reuse (docs/performance.md, \"Trainer memory on CPU\")", origin="own")
    max_tokens_per_gpu: int | None = flag(None, "--use-dynamic-batch-size: tokens per micro-batch", ge=1)
    log_probs_max_tokens_per_gpu: int | None = flag(
        None, "tokens per micro-batch of the no-grad passes (reference and old-policy log-probs, critic values), "
              "packed by length; default: on a GPU as many as half its free memory holds, on CPU the training "
              "micro-batches",
        slime=(None, "slime's default is --max-tokens-per-gpu; a no-grad pass keeps no activations, so here it "
                     "is sized to the GPU's free memory", "sized to the device", "--max-tokens-per-gpu"), ge=1)
    num_steps_per_rollout: int | None = flag(
        None, "optimizer steps per rollout (default: rollout samples / --global-batch-size)", ge=1)
    bf16: bool = flag(False, "mixed precision: forwards and backwards in bfloat16, the weights that train and "
                             "the optimizer's states in fp32 (megatron: Float16Module with fp32 master weights; "
                             "torch: torch.autocast, as TrainingArguments(bf16=True)); log-probs in fp32; the "
                             "engines get bf16 weights and the local engine computes in bf16 (unless "
                             "--sglang-dtype); a frozen LoRA base is held in bf16", origin="megatron")
    tf32: bool = flag(False, "on a GPU, the trainer's fp32 matmuls in TF32 (torch.set_float32_matmul_precision("
                             "'high'), as transformers' TrainingArguments(tf32=True)): inputs rounded to a 10-bit "
                             "mantissa, products accumulated in fp32, several times fp32's matmul throughput on an "
                             "H100/H200; weights, optimizer and log-probs stay fp32. No effect on CPU",
                      origin="own")
    tensor_model_parallel_size: int = flag(1, "--train-backend megatron: tensor-parallel size", origin="megatron", ge=1)
    pipeline_model_parallel_size: int = flag(1, "--train-backend megatron: pipeline-parallel size",
                                             origin="megatron", ge=1)
    use_distributed_optimizer: bool = flag(False, "--train-backend megatron: shard the optimizer state",
                                           origin="megatron")

    @property
    def n_ranks(self) -> int:
        """Trainer ranks of the job."""
        return self.actor_num_nodes * self.actor_num_gpus_per_node


@dataclass(slots=True)
class LoraSection:
    """LoRA: low-rank adapters on the frozen base model, trained through peft (torch backend; docs/lora.md). The
    names follow verl's (lora_rank, lora_alpha, target_modules, exclude_modules) and slime's LoRA pull request."""
    TITLE: typing.ClassVar[str] = "lora"
    lora_rank: int = flag(0, "LoRA rank: > 0 trains adapters of this rank on the frozen base instead of every "
                             "weight (--train-backend torch); 0: full fine-tuning", origin="own")
    lora_alpha: float | None = flag(None, "LoRA scaling: the adapters' output is scaled by alpha / rank (default: "
                                          "2 x --lora-rank)", origin="own")
    lora_dropout: float = flag(0.0, "dropout on the adapters' input in training forwards (not in the log-prob "
                                    "forwards, nor in the engines)", origin="own")
    lora_target_modules: list[str] | None = flag(
        None, "the modules that get adapters, by name (q_proj v_proj ...: the last part of the module's name); "
              "all-linear: every linear layer but the output head (the default, as verl's)", origin="own")
    lora_exclude_modules: list[str] | None = flag(None, "modules that get no adapter, by name (with all-linear, "
                                                        "e.g. down_proj)", origin="own")
    lora_sync: str = flag("adapter", "what the engines get after each step: adapter (the adapters alone, a few MB; "
                                     "the local engine and SGLang are launched with --enable-lora and generate "
                                     "with them) or merged (the full weights with the adapters merged in, by "
                                     "--update-weight-transport: for engines without LoRA)",
                          choices=["adapter", "merged"], origin="own")
    lora_save_merged: bool = flag(False, "--save-hf writes a PEFT adapter directory; with this, also the base "
                                         "model with the adapters merged in, a plain Hugging Face directory, at "
                                         "SAVE_HF/merged", origin="own")


@dataclass(slots=True)
class WeightsSection:
    """How the engines get the trainer's new weights."""
    TITLE: typing.ClassVar[str] = "weight updates"
    update_weight_transport: str | None = flag(
        None, "distributed: bucketed broadcast (NCCL on GPU, gloo on CPU; 'nccl' means the same); disk: an HF "
              "directory the engines load; colocated: CUDA IPC handles (shared memory on CPU) to engines on the "
              "trainer's GPUs. Default: colocated with --colocate, else distributed",
        choices=["distributed", "nccl", "disk", "colocated"],
        slime=("nccl", "'distributed' is NCCL on GPU and gloo on CPU (slime's 'nccl' is accepted and means the "
                       "same); colocated engines get CUDA IPC, as slime's colocated mode does",
               "colocated with --colocate, else distributed", "nccl"))
    update_weight_buffer_size: int = flag(512 << 20, "bytes per broadcast bucket", ge=1)
    update_weight_disk_dir: str | None = flag(None, "--update-weight-transport disk: where the weights are written "
                                                    "(default: RUN_DIR/weights)")


@dataclass(slots=True)
class CheckpointSection:
    """Checkpoints and exports."""
    TITLE: typing.ClassVar[str] = "checkpoints"
    save: str | None = flag(None, "checkpoint directory (iter_NNNNNNN/ per save): after the last rollout, and every "
                                  "--save-interval rollouts when given (slime saves none without --save-interval)")
    save_interval: int | None = flag(None, "save every N rollouts (and after the last)", ge=0)
    load: str | None = flag(None, "resume from this checkpoint directory (this project's or slime's torch_dist "
                                  "layout)", path=True)
    save_hf: str | None = flag(None, "write a Hugging Face model directory at every --save-interval; "
                                     "'{rollout_id}' in the path is formatted as in slime")
    no_save_optim: bool = flag(False, "checkpoints without the optimizer state (smaller; cannot resume training)")
    no_rolling_save: bool = flag(False, "without --save, keep no rolling checkpoint in RUN_DIR/ckpt (by default the "
                                        "newest one is kept there, every --save-interval rollouts, else every 5, "
                                        "and after the last: a crash costs a few steps, not the run)", origin="own")


@dataclass(slots=True)
class LoggingSection:
    """Metrics, samples, the console."""
    TITLE: typing.ClassVar[str] = "logging"
    use_tensorboard: bool = flag(True, "TensorBoard events in RUN_DIR/tensorboard (bare --use-tensorboard as in "
                                       "slime; --use-tensorboard false to turn off)",
                                 slime=(False, "TensorBoard is this project's default viewer; metrics.jsonl and "
                                               "curves.png are always written"))
    log_samples_interval: int = flag(1, "print the best and the worst sample of one group every N rollouts (and the "
                                        "last; 0: never); TensorBoard gets them every rollout", origin="own", ge=0)
    log_passrate: bool = flag(False, "log pass@k (k = 1, 2, 4, ... up to the group size; a sample passes with "
                                     "reward 1) of every rollout (passrate/pass@k) and eval (eval/NAME-pass@k)")
    log_level: str | None = flag(None, "console level: debug, info, warning, error (default: "
                                       "$SLIME_ACTORS_LOG_LEVEL, else info); the JSON logs in RUN_DIR/logs keep info "
                                       "and up", choices=["debug", "info", "warning", "error"], origin="own")
    use_wandb: bool = flag(False, "log every metric, the curves and sample tables to Weights & Biases (needs the "
                                  "wandb package)")
    wandb_project: str | None = flag(None, "the W&B project the run is logged to")
    wandb_group: str | None = flag(None, "the W&B group of the run (and its name, with a random suffix)")
    wandb_team: str | None = flag(None, "the W&B entity (team) of the project")
    wandb_host: str | None = flag(None, "W&B server URL (WANDB_BASE_URL)")
    wandb_mode: str | None = flag(None, "online, offline (written under --wandb-dir, `wandb sync` later) or "
                                        "disabled (default: $WANDB_MODE, else online)",
                                  choices=["online", "offline", "disabled"])
    wandb_dir: str | None = flag(None, "directory of W&B's files (default: RUN_DIR/wandb)",
                                 slime=(None, "slime writes ./wandb; here the run directory keeps it",
                                        "RUN_DIR/wandb", "./wandb"))
    wandb_run_id: str | None = flag(None, "W&B run id: resume that run (default: a new one, or the run this run "
                                          "directory logged to when it resumes)")
    disable_wandb_random_suffix: bool = flag(False, "name the W&B run exactly --wandb-group (no random suffix)")


@dataclass(slots=True)
class DebugSection:
    """Running half of the loop (docs/debugging.md)."""
    TITLE: typing.ClassVar[str] = "debugging"
    debug_rollout_only: bool = flag(False, "generate and score, never train")
    debug_train_only: bool = flag(False, "train on rollouts saved by --save-debug-rollout-data (needs "
                                         "--load-debug-rollout-data); no engines")
    save_debug_rollout_data: str | None = flag(None, "save each rollout: a directory, or a path with {rollout_id}")
    load_debug_rollout_data: str | None = flag(None, "train on saved rollouts instead of generating (what "
                                                     "--save-debug-rollout-data wrote)", path=True)
    # profiling (slime_actors/profiler.py; docs/debugging.md, "Profiles"): Megatron's flags and slime's
    use_pytorch_profiler: bool = flag(False, "torch profiler traces of --profile-target on --profile-ranks for the "
                                             "rollouts [--profile-step-start, --profile-step-end), in RUN_DIR/profiles",
                                      origin="megatron")
    profile_step_start: int = flag(10, "first rollout profiled", origin="megatron")
    profile_step_end: int = flag(12, "first rollout past the profiled ones", origin="megatron")
    profile_ranks: list[int] | None = flag(None, "trainer ranks profiled (default: 0)", origin="megatron")
    profile_target: list[str] | None = flag(
        None, "what is profiled: train_overall (the whole update), train_actor (its optimizer steps), train_log_probs "
              "(its log-prob pass), rollout (each engine's generation, through SGLang's /start_profile; ours)",
        choices=["train_overall", "train_actor", "train_log_probs", "rollout"],
        slime=(["train_overall"], "null here means train_overall, slime's default (a list default cannot be a "
                                  "dataclass default)"))
    record_memory_history: bool = flag(False, "on a GPU: record the CUDA allocator's history on --profile-ranks; "
                                              "a snapshot when it runs out of memory (and after "
                                              "--memory-snapshot-num-steps)")
    memory_snapshot_path: str = flag("snapshot.pickle", "the memory snapshot's file name (under RUN_DIR/profiles)",
                                     origin="megatron")
    memory_snapshot_dir: str | None = flag(None, "where memory snapshots go (default: RUN_DIR/profiles)",
                                           slime=(".", "snapshots go with the run's other profiles, where `trace "
                                                       "export` finds them"))
    memory_snapshot_num_steps: int | None = flag(None, "dump the memory snapshot after this many rollouts (and stop "
                                                       "recording)")
    memory_recorder: str = flag("torch", "the memory recorder: torch (memray is not supported here)",
                                choices=["torch", "memray"])


@dataclass(slots=True)
class MonitorSection:
    """Reward-hacking alarms (slime_actors/monitor/hacking.py, docs/debugging.md section 3)."""
    TITLE: typing.ClassVar[str] = "reward-hacking alarms"
    hack_alarms: str = flag("warn", "watch every training rollout for signs that the reward rises for the wrong "
                                    "reason (hack/* metrics): warn (a warning and a line in RUN_DIR/alarms.jsonl per "
                                    "tripped alarm), stop (the same, then the step finishes, a checkpoint is saved "
                                    "to --save, or the rolling RUN_DIR/ckpt without it, and the run ends), off (nothing is computed)",
                            choices=["warn", "stop", "off"], origin="own")
    hack_alarm_thresholds: str | None = flag(None, "NAME=VALUE[,NAME=VALUE...]: change the alarms' thresholds, e.g. "
                                                   "rewarded_truncated=0.7,min_samples=16 (names and defaults: "
                                                   "docs/debugging.md section 3)", origin="own")
    hack_alarms_ignore: list[str] | None = flag(None, "alarms that may not trip (their metrics are still logged): "
                                                      "rewarded_truncated, collapse, answer_absent, prompt_blind, jump",
                                                origin="own")
    hack_alarm_label_answer: bool | None = flag(
        None, "the reward compares each response with a literal label (enables answer_absent, and the collapse "
              "rule's 'the template does not answer' check); default: true for --rm-type math, boxed_math, dapo, "
              "boxed, exact_match, exact_match_ci, deepscaler (and boxed_<those>), false otherwise (f1, remote_rm, "
              "random, --custom-rm-path, --reward-actor-class)", origin="own")


@dataclass(slots=True)
class RetrieverSection:
    """The retriever of search tasks: the job's own replicas (BM25 over --retriever-corpus) or one named by URL
    (docs/search.md)."""
    TITLE: typing.ClassVar[str] = "retriever"
    retriever_corpus: str | None = flag(None, "jsonl corpus the job's retriever serves (BM25, Search-R1's POST "
                                              "/retrieve protocol): starts the retriever role", path=True,
                                        origin="own")
    retriever_num_replicas: int = flag(1, "retriever processes with --retriever-corpus (a topology's "
                                          "[roles.retriever] count wins); callers spread over them", origin="own")
    retriever_url: str | None = flag(None, "a retriever started elsewhere, http://HOST:PORT (instead of "
                                           "--retriever-corpus)", origin="own")
    retriever_api_key_file: str | None = flag(None, "file holding the key --retriever-url takes (mode 0600); or "
                                                    "$SLIME_ACTORS_RETRIEVER_KEY. The job's own replicas get a key "
                                                    "made per job", path=True, origin="own")
    retriever_topk: int = flag(3, "documents per search (Search-R1's topk)", origin="own")
    retriever_timeout: float = flag(30.0, "seconds one retrieval may take before it is tried on another replica",
                                    origin="own")
    retriever_cache_dir: str | None = flag(None, "where the BM25 index is cached, by the corpus's hash (default: "
                                                 "RUN_DIR/../.retriever)", path=True, origin="own")

    @property
    def enabled(self) -> bool:
        return bool(self.retriever_corpus or self.retriever_url)


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
    lora: LoraSection = field(default_factory=LoraSection)
    weights: WeightsSection = field(default_factory=WeightsSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    logging: LoggingSection = field(default_factory=LoggingSection)
    debug: DebugSection = field(default_factory=DebugSection)
    monitor: MonitorSection = field(default_factory=MonitorSection)
    retriever: RetrieverSection = field(default_factory=RetrieverSection)
    # the engine keys the user gave (backends.engine_auth.EngineKeys), taken out of the flags by the launcher:
    # never in to_dict(), so job.json, actor configs and traces do not hold them
    engine_user_keys: Any = field(default=None, repr=False, compare=False)
    # what the head tells the user at start (slime's flags accepted with no effect, derived values): never in
    # to_dict(); filled by parse_config and validate
    notes: list = field(default_factory=list, repr=False, compare=False)
    # environment the head gives the job's processes (--log-level, --wandb-key): never in to_dict(); applied by
    # the launcher (slime_actors.launch.job_config)
    process_env: dict = field(default_factory=dict, repr=False, compare=False)
    # where a value came from when it was not the command line ("config file F: train.lr"), for the messages of
    # the checks; never in to_dict()
    sources: dict = field(default_factory=dict, repr=False, compare=False)
    # the flags the user set (command line or config file), not defaults; never in to_dict()
    given: set = field(default_factory=set, repr=False, compare=False)
    # the prompt files' rows as the launcher checked them, before the run directory exists: set name -> a
    # temporary file the head moves to RUN_DIR/prompts/ (launch/checks.py, launch/prepare.py); never in to_dict()
    checked_prompts: dict = field(default_factory=dict, repr=False, compare=False)
    # the longest prompt those files hold, UTF-8 bytes of its text (rows.text_bytes; None: not read here): what a
    # colocated engine's KV cache is sized for when --rollout-max-prompt-len is not given (launch/placement.py)
    prompt_bytes_max: int | None = field(default=None, repr=False, compare=False)
    # --hack-alarm-thresholds parsed (hack_thresholds.HackThresholds), by `validate`: the one parse of the flag in a
    # process; the buffer's alarm monitor takes it as it is. Never in to_dict() (the flag's text is)
    hack_thresholds: Any = field(default=None, repr=False, compare=False)

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
        problems = Problems()
        for key, value in data.items():
            spec = FIELDS.get(key) if isinstance(key, str) else None
            if spec is None:
                problems.add(f"{source}: unknown field {key!r}{_suggest(str(key))}")
                continue
            try:
                values[spec.section][key] = spec.check(value, source)
            except ConfigError as exc:
                problems.merge(exc)
        problems.raise_if_any()
        cfg = cls(**{name: SECTIONS[name](**kw) for name, kw in values.items()})
        try:
            cfg.validate()
        except ConfigError as exc:
            raise exc.prefixed(f"{source}: ") from None
        return cfg

    def set(self, name: str, value: Any, source: str = "set") -> None:
        """Set the flag of slime's name `name` to `value`, checked as its field's type; ConfigError naming `source`
        and the flag when there is no such flag or the value is not of its type. (`validate()` then checks the
        values together.)"""
        spec = FIELDS.get(name)
        if spec is None:
            raise ConfigError(f"{source}: the job has no flag {name!r}{_suggest(name)}")
        setattr(getattr(self, spec.section), spec.name, spec.check(value, source))

    def map_strings(self, fn: Callable[[str], str]) -> None:
        """Every str value (and the str items of a list value) of every flag replaced by `fn(value)` (replay's path
        mapping)."""
        for spec in FIELDS.values():
            section = getattr(self, spec.section)
            v = getattr(section, spec.name)
            if isinstance(v, str):
                setattr(section, spec.name, fn(v))
            elif isinstance(v, list):
                setattr(section, spec.name, [fn(x) if isinstance(x, str) else x for x in v])

    def flat(self) -> "FlatArgs":
        """slime's `args` for user plug-ins: a read-only view, `args.<flag name>`."""
        return FlatArgs(self)

    def validate(self, check_files: bool = False) -> "JobConfig":
        """Fill in the derived defaults and check the values (ConfigError naming the flag). Idempotent. With
        `check_files`, also the files the flags name (the head does this once, before anything is written)."""
        problems = Problems()
        _validate(self, check_files, problems)
        problems.raise_if_any()
        return self


# section name (the JobConfig attribute) -> its dataclass, in --help order
SECTIONS: dict[str, type] = {f.name: f.default_factory for f in fields(JobConfig)
                             if f.default_factory is not MISSING and hasattr(f.default_factory, "TITLE")}


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
    origin: str = "slime"         # "slime" | "megatron" | "own"
    slime: tuple | None = None    # (slime's default, why ours differs[, ours as shown, slime's as shown])
    bounds: tuple = ()            # ((">=", 1), ...): the range of its numbers

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

    def typed(self, value: Any, optional: bool | None = None) -> tuple[bool, Any]:
        """(whether `value` -- JSON / TOML data -- is of this field's type, the value as that type). No string
        stands for a number or a bool: "2" is not an integer."""
        if value is None:
            return (self.optional if optional is None else optional), None
        if self.is_list:
            out = _scalars(self.base, value) if isinstance(value, (list, tuple)) else None
            return (False, value) if out is None else (True, out)
        ok, conv = _scalar(self.base, value)
        return ok and not (self.choices and conv not in self.choices), conv

    def check(self, value: Any, source: str) -> Any:
        """`value` as this field's type, or ConfigError naming the field."""
        ok, conv = self.typed(value)
        if not ok:
            raise ConfigError(f"{source}: field {self.name!r} ({self.option}) must be {self.describe()}, "
                              f"got {value!r:.200}")
        return conv

    def from_text(self, text: str) -> Any:
        """A command-line value as this field's type; ValueError saying what was expected."""
        if self.base is bool:
            try:
                return _bool(text)
            except argparse.ArgumentTypeError as exc:
                raise ValueError(str(exc)) from None
        try:
            value = self.base(text)
        except ValueError:
            raise ValueError(f"expected {self.describe().replace(' or null', '')}, got {text!r}") from None
        if self.base is float and value != value:   # nan passes float() and every range check
            raise ValueError(f"expected a number, got {text!r}")
        if self.choices and value not in self.choices:
            raise ValueError(f"invalid choice: {text!r} (choose from {', '.join(map(repr, self.choices))})")
        return value

    def out_of_range(self, value: Any) -> str | None:
        """"must be >= 1, got 0" when a number of `value` is outside the field's range, else None."""
        for v in (value if isinstance(value, list) else [value]):
            if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            for op, bound in self.bounds:
                if not {">=": v >= bound, ">": v > bound, "<=": v <= bound, "<": v < bound}[op]:
                    return f"must be {self.range_text()}, got {v}"
        return None

    def range_text(self) -> str:
        """">= 1", "> 0 and <= 1", "" without a range."""
        return " and ".join(f"{op} {b:g}" for op, b in self.bounds)


def _scalars(base: type, values: Any) -> list | None:
    """Each value as `base` (`_scalar`), or None when one is not."""
    out = []
    for v in values:
        ok, conv = _scalar(base, v)
        if not ok:
            return None
        out.append(conv)
    return out


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
                                    md.get("choices"), md.get("path", False), md.get("top", False), md["cli"],
                                    md.get("origin", "own"), md.get("slime"), md.get("bounds", ()))
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
    """argparse with ConfigError for errors and no abbreviations: `--rollout-num-gpus` (slime's flag) must never
    be taken for `--rollout-num-gpus-per-engine`."""

    def __init__(self, *a, **kw):
        kw.setdefault("allow_abbrev", False)
        super().__init__(*a, **kw)

    def error(self, message):
        raise ConfigError(message)

    def parse_args(self, args=None, namespace=None):
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            raise ConfigError(unknown_flag_message(extra, self))
        return ns


def _option_names(parser: argparse.ArgumentParser) -> list[str]:
    return [o for a in parser._actions for o in a.option_strings if o.startswith("--")]


def unknown_flag_message(extra: list[str], parser: argparse.ArgumentParser | None = None) -> str:
    """The error for arguments no flag takes: the first unknown flag, with slime's reason when it is a slime flag
    this project does not have, or the closest flags by name."""
    from .slime_compat import SLIME_UNSUPPORTED
    flags = [t for t in extra if t.startswith("-")]
    if not flags:
        return f"unexpected value {extra[0]!r} (every value follows its flag: --flag VALUE)"
    name = flags[0].split("=", 1)[0]
    more = f" (and {len(flags) - 1} more unknown: {' '.join(f.split('=', 1)[0] for f in flags[1:4])}" \
           f"{' ...' if len(flags) > 4 else ''})" if len(flags) > 1 else ""
    if name in SLIME_UNSUPPORTED:
        return f"{name} is slime's flag, not supported by slime-actors: {SLIME_UNSUPPORTED[name]}{more}"
    known = _option_names(parser) if parser is not None else [s.option for s in FIELDS.values() if s.cli]
    # an abbreviation (no longer accepted) names the flags it abbreviates; a typo the closest names
    close = [k for k in known if k.startswith(name)][:3] or closest(name, known)
    hint = f"; did you mean {' or '.join(close)}?" if close else "; `slime-actors train --help` lists the flags"
    return f"unknown flag {name}{hint}{more}"


def closest(name: str, known: list[str], cutoff: float = 0.75) -> list[str]:
    """The names nearest to `name` (difflib's ratio), the best and any within 0.05 of it, at most three."""
    scored = sorted(((difflib.SequenceMatcher(None, name, k).ratio(), k) for k in known), reverse=True)
    if not scored or scored[0][0] < cutoff:
        return []
    return [k for r, k in scored[:3] if r >= max(cutoff, scored[0][0] - 0.05)]


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
        elif spec.base is bool:   # a bool defaulting to True: `--flag` alone means true (slime's bare switch)
            kw["nargs"] = "?"
            kw["const"] = True
            kw["metavar"] = "{true,false}"
        if spec.choices:
            kw["choices"] = spec.choices
    group.add_argument(spec.option, **kw)


COMPAT_DEST = "compat__"   # argparse dest prefix of slime's / Megatron's flags that are not fields


def _add_compat(group, flag) -> None:
    kind = {"noop": "no effect here", "fixed": f"only {flag.expect!r}", "alias": f"means --{flag.alias}",
            "arch": "checked against config.json" if flag.hf else "accepted, not checked",
            "env": "sets an environment variable"}[flag.kind].replace("_", "-")
    kw: dict[str, Any] = {"dest": COMPAT_DEST + flag.dest, "default": None,
                          "help": f"{kind}: {flag.note}".replace("%", "%%")}
    if flag.switch:
        kw["action"] = "store_const"
        kw["const"] = True
    else:
        kw["type"] = flag.type
        kw["metavar"] = flag.dest.upper()
        if flag.nargs:
            kw["nargs"] = flag.nargs
    group.add_argument(flag.name, **kw)


def build_parser() -> argparse.ArgumentParser:
    """`slime-actors train`'s parser: one argument per field, one group per section, then slime's / Megatron's
    flags that are accepted without a field (slime_actors.slime_compat); errors raise ConfigError."""
    from . import __version__
    from .slime_compat import MEGATRON_FLAGS, SLIME_ACCEPTED
    p = _Parser(prog="slime-actors train", description="RL post-training on slime-actors. Flags have slime's names "
                "and meanings; docs/flags.md lists them all, where a default differs from slime's and why.")
    p.add_argument("--version", action="version", version=f"slime-actors {__version__}")
    specs = [s for s in FIELDS.values() if s.cli]
    for s in specs:
        if s.top:
            _add(p, s)
    for section, cls in SECTIONS.items():
        g = p.add_argument_group(cls.TITLE, getattr(cls, "__doc__", None))
        for s in specs:
            if s.section == section and not s.top:
                _add(g, s)
    g = p.add_argument_group("slime's flags accepted without effect", "slime flags for what this project does "
                             "its own way; given a value that would change the result, they are refused")
    for f in SLIME_ACCEPTED:
        _add_compat(g, f)
    g = p.add_argument_group("Megatron flags (from slime's scripts)", "accepted so a slime launch script runs: "
                             "memory/speed settings have no effect, fixed settings must name what this project "
                             "does, architecture flags must agree with --hf-checkpoint's config.json")
    for f in MEGATRON_FLAGS:
        _add_compat(g, f)
    return p


def _reading_parser() -> argparse.ArgumentParser:
    """The parser that reads a command line: the same options as `build_parser`, every value kept as the string
    given (the types are checked after, every problem collected), nothing set that was not given."""
    from .slime_compat import MEGATRON_FLAGS, SLIME_ACCEPTED
    p = _Parser(prog="slime-actors train", add_help=False, argument_default=argparse.SUPPRESS)
    for s in FIELDS.values():
        if not s.cli:
            continue
        if s.switch:
            p.add_argument(s.option, dest=s.name, action="store_true")
        elif s.is_list:
            p.add_argument(s.option, dest=s.name, nargs="+")
        elif s.base is bool:   # a bool defaulting to True: `--flag` alone means true (slime's bare switch)
            p.add_argument(s.option, dest=s.name, nargs="?", const="true")
        else:
            p.add_argument(s.option, dest=s.name)
    for f in SLIME_ACCEPTED + MEGATRON_FLAGS:
        if f.switch:
            p.add_argument(f.name, dest=COMPAT_DEST + f.dest, action="store_const", const=True)
        else:
            p.add_argument(f.name, dest=COMPAT_DEST + f.dest, nargs=f.nargs)
    return p


_NEGATIVE = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-inf$")


def _negative_values_joined(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """`--lr -3e-3` as `--lr=-3e-3`: argparse takes a value that starts with '-' for a flag unless it looks like
    an integer or a decimal, so a negative number in exponent form would otherwise be "expected one argument"."""
    takes_one = {o for a in parser._actions for o in a.option_strings if a.nargs in (None, "?")}
    out: list[str] = []
    for tok in argv:
        if out and _NEGATIVE.match(tok) and out[-1] in takes_one:
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out


def _read_command_line(argv: list[str], problems: Problems) -> tuple[dict[str, Any], dict[str, Any]]:
    """The flags given on the command line: (field name -> typed value, compat flag name -> typed value). Every
    unknown flag and every value of the wrong type is a problem of its own."""
    parser = _reading_parser()
    try:
        ns, extra = parser.parse_known_args(_negative_values_joined(argv, parser))
    except ConfigError as exc:   # a flag without its value: argparse stops there
        problems.merge(exc)
        return {}, {}
    flags = [t for t in extra if t.startswith("-")]
    if extra and not flags:
        problems.add(unknown_flag_message(extra, parser))
    for f in flags:
        problems.add(unknown_flag_message([f], parser))
    values: dict[str, Any] = {}
    compat: dict[str, Any] = {}
    by_dest = {COMPAT_DEST + f.dest: f for f in COMPAT.values()}
    for dest, raw in vars(ns).items():
        flag = by_dest.get(dest)
        try:
            if flag is not None:
                compat[flag.name] = raw if flag.switch else _compat_from_text(flag, raw)
            else:
                spec = FIELDS[dest]
                if spec.switch:
                    values[dest] = True
                elif spec.is_list:
                    values[dest] = [spec.from_text(v) for v in raw]
                else:
                    values[dest] = spec.from_text(raw)
        except ValueError as exc:
            problems.add(f"{flag.name if flag is not None else FIELDS[dest].option}: {exc}")
    return values, compat


def _compat_from_text(flag, raw: Any) -> Any:
    def one(text: str) -> Any:
        try:
            return flag.type(text)
        except ValueError:
            kind = {int: "an integer", float: "a number"}.get(flag.type, flag.type.__name__)
            raise ValueError(f"expected {kind}, got {text!r}") from None
    return [one(v) for v in raw] if isinstance(raw, list) else one(raw)


# ---------------------------------------------------------------------------------------------------------------
# the config file

def _flatten(d: dict, prefix: str = "") -> list[tuple[str, object]]:
    items = []
    for k, v in d.items():
        if isinstance(v, dict) and k not in ("sglang", "router", "env_kwargs", "env-kwargs"):
            items.extend(_flatten(v, f"{prefix}{k}."))
        else:
            items.append((f"{prefix}{k}", v))
    return items


@dataclass
class _ConfigFile:
    """What a --config file sets, typed: fields, compat flags, passthrough flags, and where each field was set."""
    values: dict[str, Any] = field(default_factory=dict)
    compat: dict[str, Any] = field(default_factory=dict)
    sglang: list[str] = field(default_factory=list)
    router: list[str] = field(default_factory=list)
    keys: dict[str, str] = field(default_factory=dict)   # field name -> its dotted key in the file


_TOML_KIND = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _read_config_file(path: str, problems: Problems) -> _ConfigFile:
    """A TOML file's flags, each value checked against its flag's type (a string is never a number: `lr = "3e-3"`
    is an error naming the file and the key); every problem goes to `problems`."""
    out = _ConfigFile()
    what = not_regular(path)
    if what == "no such file":
        problems.add(f"config file {path} does not exist")
        return out
    if what is not None:   # (a FIFO would block the open)
        problems.add(f"config file {path} is {what}, not a TOML file")
        return out
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        problems.add(f"config file {path} does not exist")
        return out
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        problems.add(f"config file {path}: {exc}")
        return out
    except RecursionError:   # (tomllib parses nested arrays and tables by recursion)
        problems.add(f"config file {path}: nested too deep to be read")
        return out
    base = Path(path).resolve().parent

    def near(v):  # a path relative to the config file, when there is such a file there
        if isinstance(v, str) and not v.startswith(("tiny:", "smollm2:", "/")) and (base / v).exists():
            return str(base / v)
        return v

    def bad(dotted: str, what: str, value: Any) -> None:
        problems.add(f"config file {path}: {dotted} must be {what}, got {value!r:.200}")

    for dotted, value in _flatten(data):
        key = dotted.rsplit(".", 1)[-1]
        if key in ("sglang", "router") and isinstance(value, dict):
            for k, v in value.items():
                (out.sglang if key == "sglang" else out.router).extend(
                    _passthrough(f"--{k.replace('_', '-')}", v))
            continue
        norm = key.replace("-", "_")
        spec = FIELDS.get(norm)
        option = "--" + norm.replace("_", "-")
        if (spec is None or not spec.cli) and option in COMPAT:
            flag = COMPAT[option]
            ok, conv = _compat_typed(flag, value)
            if not ok:
                kind = _TOML_KIND[flag.type] if not flag.nargs else f"a list of {_TOML_KIND[flag.type]}s"
                bad(dotted, kind.replace("true or falses", "booleans"), value)
            elif conv is not False:   # `flag = false` for a switch: not given
                out.compat[option] = conv
            continue
        if spec is None or not spec.cli or norm == "config":
            problems.add(f"config file {path}: unknown key {dotted!r} "
                         f"({unknown_flag_message([option]).replace('unknown flag ', 'no flag ')})")
            continue
        if norm in out.keys:
            problems.add(f"config file {path}: {dotted} and {out.keys[norm]} both set {spec.option}")
            continue
        if norm == "env_kwargs" and isinstance(value, dict):   # a table: the JSON object the flag takes
            value = json.dumps(value)
        ok, conv = spec.typed(value, optional=False)
        if not ok:
            bad(dotted, spec.describe().replace(" or null", ""), value)
            continue
        if spec.path:
            conv = [near(v) for v in conv] if isinstance(conv, list) else near(conv)
        out.values[norm] = conv
        out.keys[norm] = dotted
    return out


def _compat_typed(flag, value: Any) -> tuple[bool, Any]:
    if flag.switch:
        return isinstance(value, bool), value
    if isinstance(value, list) and not flag.nargs:
        return False, value
    out = _scalars(flag.type, value if isinstance(value, list) else [value])
    return (False, value) if out is None else (True, out if flag.nargs else out[0])


def _passthrough(flag: str, value) -> list[str]:
    if value is True:
        return [flag]
    if value is False or value is None:
        return []
    if isinstance(value, list):
        return [flag, *[str(v) for v in value]]
    return [flag, str(value)]


# our own flags that happen to start with --sglang- (slime's names for an external router)
# and slime's own --sglang-* flags (not SGLang's): they go to this parser, which accepts or refuses them
OWN_SGLANG_PREFIXED = ("--sglang-router-ip", "--sglang-router-port", "--sglang-server-concurrency",
                       "--sglang-router-request-timeout-secs", "--sglang-config")


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


# flags that derive each other: one given on the command line replaces the other one's value from the config file
_EITHER_OR = (("rollout_num_gpus", "rollout_num_engines"), ("num_epoch", "num_rollout"))


@dataclass
class ReadFlags:
    """A command line and its --config file, read once: the config as given (defaults for the rest; nothing
    derived or checked beyond types), slime's / Megatron's flags given without a field, and what was wrong."""
    cfg: "JobConfig"
    compat: dict[str, Any]
    problems: Problems
    unreadable: set[str] = field(default_factory=set)   # fields whose given value could not be read


def read_flags(argv: list[str] | None = None) -> ReadFlags:
    """Read the flags and the --config file (each once). `--help` / `--version` print and exit, as argparse does."""
    argv = list(argv or [])
    ours, sglang, router = split_passthrough(argv)
    if any(a in ("-h", "--help", "--version") for a in ours):
        build_parser().parse_args([a for a in ours if a in ("-h", "--help", "--version")][:1])
    problems = Problems()
    configs = [a for a in ours if a == "--config" or a.startswith("--config=")]
    if len(configs) > 1:
        problems.add(f"--config is given {len(configs)} times: a job has one config file (the command line sets "
                     "the rest, and wins over it)")
    cli, cli_compat = _read_command_line(ours, problems)
    file = _read_config_file(cli["config"], problems) if cli.get("config") else _ConfigFile()
    values = {s.name: (list(s.default) if isinstance(s.default, list) else s.default)
              for s in FIELDS.values() if s.cli}
    values.update(file.values)
    for a, b in _EITHER_OR:   # the command line wins over the file across two flags that say the same thing
        for given, other in ((a, b), (b, a)):
            if given in cli and other not in cli and other in file.values:
                values[other] = FIELDS[other].default
    values.update(cli)
    merged = {**file.compat, **cli_compat}
    compat = {name: merged[name] for name in COMPAT if name in merged}   # in the tables' order
    for name, value in compat.items():   # slime's other name of one of our flags: ours, unless ours is given too
        flag = COMPAT[name]
        if flag.kind == "alias" and flag.alias not in cli and flag.alias not in file.values:
            values[flag.alias] = value
    by_section: dict[str, dict] = {name: {} for name in SECTIONS}
    for name, value in values.items():
        by_section[FIELDS[name].section][name] = value
    cfg = JobConfig(**{name: SECTIONS[name](**kw) for name, kw in by_section.items()})
    cfg.engine.sglang_args = file.sglang + sglang
    cfg.engine.router_args = file.router + router
    cfg.sources = {name: f"config file {cli['config']}: {key}" for name, key in file.keys.items() if name not in cli}
    cfg.given = set(cli) | set(file.values)
    unreadable = {s.name for s in FIELDS.values() if any(p.startswith(s.option + ":") for p in problems)}
    return ReadFlags(cfg, compat, problems, unreadable)


def finish_config(flags: ReadFlags, check_files: bool = True, prompt_count: int | None = None) -> "JobConfig":
    """The config read by `read_flags`, completed: slime's function paths mapped to this project's, derived values,
    every value's checks, slime's flags without a field (slime_actors.slime_compat: notes, or problems) and, with
    `check_files`, the files the flags name and the function paths (found without running them). Raises one
    ConfigError with every problem, its own and `flags.problems`. `prompt_count`: --prompt-data's prompts when the
    caller has counted them (for --num-epoch)."""
    from .plugins import check_function_path
    from .slime_compat import FUNCTION_FLAGS, check as check_compat, map_function_paths
    cfg, problems = flags.cfg, Problems(flags.problems)
    found = Problems()
    cfg.notes += map_function_paths(cfg, found)
    _validate(cfg, check_files, found, prompt_count)
    compat = check_compat(flags.compat, cfg.model.hf_checkpoint, cfg.train.train_backend)
    found.extend(compat.errors)
    for section, name, _ in FUNCTION_FLAGS if check_files else ():
        path = getattr(getattr(cfg, section), name)
        if path is not None and not path.startswith(("slime.", "slime_plugins.")):   # (slime's: said above)
            why = check_function_path(path, FIELDS[name].option)
            if why:
                found.add(why)
    for p in found:   # not again for a flag whose value could not be read (its default stood in for it)
        if not any(FIELDS[n].option in p for n in flags.unreadable):
            problems.add(p)
    problems.raise_if_any()
    cfg.notes += compat.notes()
    cfg.process_env.update(compat.env)
    if cfg.logging.log_level:
        from .env import LOG_LEVEL
        cfg.process_env[LOG_LEVEL.name] = cfg.logging.log_level
    return cfg


def parse_config(argv: list[str] | None = None, *, check_files: bool = True) -> "JobConfig":
    """Flags and the --config file -> the validated JobConfig. Every problem found is in the one ConfigError raised,
    each naming the flag, file or key. slime's and Megatron's flags without a field are checked
    (slime_actors.slime_compat) and reported in `cfg.notes`."""
    return finish_config(read_flags(argv), check_files=check_files)



# ---------------------------------------------------------------------------------------------------------------
# derived values and checks

def _validate(cfg: JobConfig, check_files: bool, problems: Problems, prompt_count: int | None = None) -> None:
    """Derived values filled in, every value checked; each problem found goes to `problems` (a check whose inputs
    are already known to be bad is skipped, so one mistake is reported once)."""
    bad = problems.add
    for spec in FIELDS.values():   # the declared ranges (flag(..., ge=1))
        if spec.bounds:
            wrong = spec.out_of_range(getattr(getattr(cfg, spec.section), spec.name))
            if wrong:
                where = cfg.sources.get(spec.name)
                bad(f"{spec.option} {wrong}" + (f" ({where})" if where else ""))
    run, rollout_cfg, train_cfg, eval_cfg = cfg.run, cfg.rollout, cfg.train, cfg.eval
    algorithm_cfg, debug_cfg = cfg.algorithm, cfg.debug
    try:
        cfg.hack_thresholds = HackThresholds.parse(cfg.monitor.hack_alarm_thresholds)
    except ValueError as exc:
        bad(f"--hack-alarm-thresholds {cfg.monitor.hack_alarm_thresholds}: {exc}")
    for name, value in (("--rollout-top-k", rollout_cfg.rollout_top_k), ("--eval-top-k", eval_cfg.eval_top_k)):
        if value == 0:
            bad(f"{name} must be -1 (off) or >= 1, got 0")
    weights_cfg = cfg.weights
    if weights_cfg.update_weight_transport is None:
        weights_cfg.update_weight_transport = "colocated" if cfg.engine.colocate else "distributed"
    if weights_cfg.update_weight_transport == "nccl":
        weights_cfg.update_weight_transport = "distributed"
    if (cfg.engine.colocate and run.device.startswith("cuda") and weights_cfg.update_weight_transport == "distributed"
            and not debug_cfg.debug_train_only):
        bad("--colocate puts each engine on a trainer rank's GPU, and --update-weight-transport distributed would "
            "join the two processes of that GPU in one NCCL group, which NCCL refuses ('Duplicate GPU detected'): "
            "leave the flag out (colocated, CUDA IPC, is the default with --colocate) or use disk")
    if rollout_cfg.over_sampling_batch_size is None:
        rollout_cfg.over_sampling_batch_size = rollout_cfg.rollout_batch_size
    if rollout_cfg.over_sampling_batch_size < rollout_cfg.rollout_batch_size:
        bad(f"--over-sampling-batch-size ({rollout_cfg.over_sampling_batch_size}) must be >= --rollout-batch-size "
            f"({rollout_cfg.rollout_batch_size})")
    _derive_num_rollout(cfg, check_files, bad, prompt_count)
    _derive_engines(cfg, bad)
    _validate_lora(cfg, bad)
    engine_cfg = cfg.engine
    if engine_cfg.rollout_engine == "local" and engine_cfg.rollout_num_gpus_per_engine > 1 \
            and not engine_cfg.rollout_external_engine_addrs and not debug_cfg.debug_train_only:
        bad(f"--rollout-num-gpus-per-engine {engine_cfg.rollout_num_gpus_per_engine}: the local engine "
            "(--rollout-engine local, the default) runs one model on one device; an engine over several GPUs is "
            "SGLang's: add --rollout-engine sglang (or give 1)")
    for name, text in (("apply_chat_template_kwargs", cfg.data.apply_chat_template_kwargs),
                       ("rm_headers", cfg.reward.rm_headers), ("env_kwargs", rollout_cfg.env_kwargs)):
        if text is not None:
            try:
                json_object(text, "--" + name.replace("_", "-"), strings=name == "rm_headers")
            except ConfigError as exc:
                problems.merge(exc)
    ways = [w for w in ("rollout_interaction_env_path", "agent_function_path", "custom_generate_function_path",
                        "rollout_function_path") if getattr(rollout_cfg, w)]
    if len(ways) > 1 and (rollout_cfg.rollout_interaction_env_path or rollout_cfg.agent_function_path):
        bad(f"--{ways[0].replace('_', '-')} and --{ways[1].replace('_', '-')} both say how samples are generated: "
            "give one")
    if train_cfg.use_dynamic_batch_size and not train_cfg.max_tokens_per_gpu:
        bad("--use-dynamic-batch-size needs --max-tokens-per-gpu")
    if algorithm_cfg.advantage_estimator in ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline") \
            and rollout_cfg.n_samples_per_prompt == 1:
        bad(f"--advantage-estimator {algorithm_cfg.advantage_estimator} compares samples of a group: "
            "--n-samples-per-prompt must be >= 2")
    if debug_cfg.debug_rollout_only and debug_cfg.debug_train_only:
        bad("--debug-rollout-only and --debug-train-only exclude each other")
    if debug_cfg.use_pytorch_profiler and not 0 <= debug_cfg.profile_step_start < debug_cfg.profile_step_end:
        bad(f"--profile-step-start {debug_cfg.profile_step_start} / --profile-step-end {debug_cfg.profile_step_end}: "
            "need 0 <= start < end (the rollouts [start, end) are profiled)")
    if debug_cfg.memory_recorder != "torch":
        bad(f"--memory-recorder {debug_cfg.memory_recorder}: only torch's CUDA memory history is supported here")
    if debug_cfg.debug_train_only and not debug_cfg.load_debug_rollout_data:
        bad("--debug-train-only needs --load-debug-rollout-data")
    if check_files and debug_cfg.load_debug_rollout_data:  # the first rollout must be there (later ones: when loaded)
        first = debug_rollout_path(debug_cfg.load_debug_rollout_data, run.start_rollout_id or 0)
        what = not_regular(first)
        if what == "no such file":
            bad(f"--load-debug-rollout-data {debug_cfg.load_debug_rollout_data}: no saved rollout "
                f"{run.start_rollout_id or 0} at {first} (--save-debug-rollout-data writes one file per rollout)")
        elif what is not None:
            bad(f"--load-debug-rollout-data {debug_cfg.load_debug_rollout_data}: {first} is {what}, not a saved "
                "rollout")
    if cfg.data.prompt_data is None and not debug_cfg.load_debug_rollout_data:
        bad("--prompt-data is required")
    if check_files and cfg.data.prompt_data and not os.path.exists(cfg.data.prompt_data):
        bad(f"--prompt-data {cfg.data.prompt_data} does not exist")
    if cfg.model.hf_checkpoint is None:
        bad("--hf-checkpoint is required (a Hugging Face model directory, tiny:digits, or smollm2:135m)")
    total = rollout_cfg.rollout_batch_size * rollout_cfg.n_samples_per_prompt
    if train_cfg.global_batch_size is None:
        train_cfg.global_batch_size = total
    if train_cfg.global_batch_size >= 1 and total >= 1 and total % train_cfg.global_batch_size:
        bad(f"rollout-batch-size x n-samples-per-prompt ({total}) must be a multiple of --global-batch-size "
            f"({train_cfg.global_batch_size})")
    if train_cfg.n_ranks >= 1 and rollout_cfg.rollout_batch_size % train_cfg.n_ranks:
        bad(f"--rollout-batch-size ({rollout_cfg.rollout_batch_size}) must be a multiple of the trainer ranks "
            f"({train_cfg.n_ranks}): each rank trains on whole prompt groups")
    if train_cfg.num_steps_per_rollout is None:
        train_cfg.num_steps_per_rollout = (max(1, total // train_cfg.global_batch_size)
                                           if train_cfg.global_batch_size >= 1 else 1)
    if eval_cfg.eval_temperature is None:
        eval_cfg.eval_temperature = 0.0
    if eval_cfg.eval_max_response_len is None:
        eval_cfg.eval_max_response_len = rollout_cfg.rollout_max_response_len
    if train_cfg.critic_lr is None:
        train_cfg.critic_lr = train_cfg.lr
    if algorithm_cfg.eps_clip_high is None:
        algorithm_cfg.eps_clip_high = algorithm_cfg.eps_clip
    if eval_cfg.eval_top_p is None:
        eval_cfg.eval_top_p = rollout_cfg.rollout_top_p
    if eval_cfg.eval_top_k is None:
        eval_cfg.eval_top_k = rollout_cfg.rollout_top_k
    if algorithm_cfg.loss_type == "custom_loss" and not algorithm_cfg.custom_loss_function_path:
        bad("--loss-type custom_loss needs --custom-loss-function-path")
    if algorithm_cfg.custom_loss_function_path and algorithm_cfg.loss_type != "custom_loss":
        bad(f"--custom-loss-function-path is used with --loss-type custom_loss (as in slime); the job has "
            f"--loss-type {algorithm_cfg.loss_type}: add --loss-type custom_loss, or drop the path")
    if algorithm_cfg.advantage_estimator == "cispo" and algorithm_cfg.eps_clip < 1.0 \
            and not any("CISPO" in n for n in cfg.notes):
        cfg.notes.append(f"--advantage-estimator cispo with --eps-clip {algorithm_cfg.eps_clip}: the lower bound "
                         f"{1.0 - algorithm_cfg.eps_clip:g} of the truncated ratio is active; canonical CISPO is "
                         "one-sided (--eps-clip 1.0, and a wide --eps-clip-high such as 4.0)")
    if algorithm_cfg.tis_clip_low > algorithm_cfg.tis_clip:
        bad(f"--tis-clip-low ({algorithm_cfg.tis_clip_low}) must be <= --tis-clip ({algorithm_cfg.tis_clip})")
    reward_cfg = cfg.reward
    if reward_cfg.rm_type is None and reward_cfg.custom_rm_path is None and reward_cfg.reward_actor_class is None:
        bad("choose a reward: --rm-type (math, boxed, exact_match, remote_rm, ...) or --custom-rm-path")
    if reward_cfg.rm_type == "remote_rm" and not reward_cfg.rm_url:
        bad("--rm-type remote_rm needs --rm-url")
    if cfg.engine.sglang_router_ip and not cfg.engine.sglang_router_port:
        bad("--sglang-router-ip needs --sglang-router-port")
    _validate_retriever(cfg.retriever, check_files, bad)
    logging_cfg = cfg.logging
    if logging_cfg.use_wandb and check_files:
        import importlib.util
        if importlib.util.find_spec("wandb") is None:
            bad("--use-wandb needs the wandb package: pip install wandb (or drop --use-wandb; TensorBoard and "
                "metrics.jsonl have every metric)")
    unused = [f"--{n.replace('_', '-')}" for n in ("wandb_project", "wandb_group", "wandb_team", "wandb_host",
                                                   "wandb_mode", "wandb_dir", "wandb_run_id")
              if getattr(logging_cfg, n) is not None]
    if unused and not logging_cfg.use_wandb and not any("without --use-wandb" in n for n in cfg.notes):
        cfg.notes.append(f"{', '.join(unused)} given without --use-wandb: W&B is off (add --use-wandb)")


def _validate_retriever(r: RetrieverSection, check_files: bool, bad) -> None:
    if r.retriever_corpus and r.retriever_url:
        bad("give --retriever-corpus (the job serves it) or --retriever-url (a retriever started elsewhere), not both")
    if r.retriever_url and not r.retriever_url.startswith(("http://", "https://")):
        bad(f"--retriever-url must be http://HOST:PORT or https://..., got {r.retriever_url!r}")
    if r.retriever_api_key_file and not r.retriever_url:
        bad("--retriever-api-key-file is the key of --retriever-url (the job's own retriever gets a key made per job)")
    for name in ("retriever_num_replicas", "retriever_topk"):
        if getattr(r, name) < 1:
            bad(f"--{name.replace('_', '-')} must be >= 1, got {getattr(r, name)}")
    if not r.retriever_timeout > 0:
        bad(f"--retriever-timeout must be > 0 seconds, got {r.retriever_timeout}")
    what = not_regular(r.retriever_corpus) if check_files and r.retriever_corpus else None
    if what is not None:
        bad(f"--retriever-corpus {r.retriever_corpus} does not exist" if what == "no such file" else
            f"--retriever-corpus {r.retriever_corpus} is {what}, not a jsonl file")


LORA_ALL_LINEAR = "all-linear"
MEGATRON_LORA_REFUSAL = (
    "--lora-rank needs --train-backend torch: the megatron backend (megatron-core's GPTModel) has no LoRA -- "
    "Megatron's LoRA training lives in Megatron-Bridge / NeMo, which this project does not use --, and adapters on its fused linear_qkv / linear_fc1 "
    "layers would not be the q_proj / k_proj / v_proj / gate_proj / up_proj adapters that PEFT and SGLang load; "
    "train LoRA with --train-backend torch (--torch-parallel fsdp shards the frozen base across GPUs)")


def _validate_lora(cfg: JobConfig, bad) -> None:
    """--lora-*: values, and what LoRA cannot be combined with (the module names are checked against the model by
    the launcher: launch/checks.check_lora_flags)."""
    lora_cfg = cfg.lora
    if lora_cfg.lora_rank < 0:
        bad(f"--lora-rank must be >= 0 (0: full fine-tuning), got {lora_cfg.lora_rank}")
    if lora_cfg.lora_rank == 0:
        given = [f"--{n.replace('_', '-')}" for n in ("lora_alpha", "lora_target_modules", "lora_exclude_modules")
                 if getattr(lora_cfg, n) is not None] + (["--lora-dropout"] if lora_cfg.lora_dropout else []) \
            + (["--lora-save-merged"] if lora_cfg.lora_save_merged else [])
        if given:
            bad(f"{', '.join(given)} given without --lora-rank: LoRA is off (give --lora-rank N, N > 0)")
        return
    if cfg.train.train_backend == "megatron":
        bad(MEGATRON_LORA_REFUSAL)
    if lora_cfg.lora_alpha is None:
        lora_cfg.lora_alpha = 2.0 * lora_cfg.lora_rank
    if not lora_cfg.lora_alpha > 0:
        bad(f"--lora-alpha must be > 0, got {lora_cfg.lora_alpha}")
    if not 0.0 <= lora_cfg.lora_dropout < 1.0:
        bad(f"--lora-dropout must be in [0, 1), got {lora_cfg.lora_dropout}")
    if not lora_cfg.lora_target_modules:
        lora_cfg.lora_target_modules = [LORA_ALL_LINEAR]
    import re
    for flag_name, names in (("--lora-target-modules", lora_cfg.lora_target_modules),
                             ("--lora-exclude-modules", lora_cfg.lora_exclude_modules or [])):
        odd = [n for n in names if n != LORA_ALL_LINEAR and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n)]
        if odd:
            bad(f"{flag_name}: {odd[0]!r} is not a module name (the last part of a module's name, e.g. q_proj)")
    if LORA_ALL_LINEAR in lora_cfg.lora_target_modules and len(lora_cfg.lora_target_modules) > 1:
        bad(f"--lora-target-modules: {LORA_ALL_LINEAR} means every linear layer; give it alone, or name modules")
    if LORA_ALL_LINEAR in (lora_cfg.lora_exclude_modules or []):
        bad(f"--lora-exclude-modules {LORA_ALL_LINEAR} would leave no module to adapt")
    if lora_cfg.lora_save_merged and not cfg.checkpoint.save_hf:
        bad("--lora-save-merged writes next to --save-hf's export: give --save-hf too")


def json_object(text: str, flag: str, strings: bool = False) -> dict:
    """A flag's JSON object value (--apply-chat-template-kwargs, --rm-headers), or ConfigError naming the flag."""
    try:
        value = parse_json(text)
    except ValueError as exc:
        raise ConfigError(f"{flag} must be a JSON object, e.g. '{{\"enable_thinking\": false}}': {exc}: "
                          f"{text!r:.200}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag} must be a JSON object, got {type(value).__name__}: {text!r:.200}")
    if strings:
        wrong = [k for k, v in value.items() if not isinstance(v, str)]
        if wrong:
            raise ConfigError(f"{flag}: header {wrong[0]!r} must be a string, got {value[wrong[0]]!r:.100}")
    return value


DEFAULT_NUM_ROLLOUT = 10   # without --num-rollout and --num-epoch (slime requires one of them)


def _derive_num_rollout(cfg: JobConfig, check_files: bool, bad, prompt_count: int | None = None) -> None:
    """--num-rollout, else --num-epoch x prompts // --rollout-batch-size (slime's rule), else 10. `prompt_count`:
    the prompts of --prompt-data when the caller has counted them (the launcher's one pass over the file)."""
    run = cfg.run
    if run.num_rollout is not None:
        if run.num_epoch is not None and not any(n.startswith("--num-epoch") for n in cfg.notes):
            cfg.notes.append(f"--num-epoch {run.num_epoch} is ignored: --num-rollout {run.num_rollout} is given "
                             "(as in slime)")
        return
    if run.num_epoch is None:
        run.num_rollout = DEFAULT_NUM_ROLLOUT
        return
    if run.num_epoch < 1:
        return   # (its range check reported it)
    path = cfg.data.prompt_data
    if prompt_count is None:
        if not path or not (check_files or os.path.exists(path)):
            bad("--num-epoch needs --prompt-data (the number of prompts sets --num-rollout); or give --num-rollout")
            return
        if not os.path.exists(path):
            return   # (reported: --prompt-data does not exist)
        try:
            prompt_count = count_prompt_rows(path, cfg.data.prompt_data_max_row_bytes)
        except ConfigError as exc:
            bad(str(exc))
            return
    per = cfg.rollout.rollout_batch_size
    if per < 1:
        return
    run.num_rollout = run.num_epoch * prompt_count // per
    if run.num_rollout < 1:
        bad(f"--num-epoch {run.num_epoch}: {prompt_count} prompts in {path} make no batch of --rollout-batch-size "
            f"{per}")
        run.num_rollout = None
        return
    cfg.notes.append(f"--num-epoch {run.num_epoch}: --num-rollout {run.num_rollout} ({run.num_epoch} x "
                     f"{prompt_count} prompts // --rollout-batch-size {per}; prompts that --rollout-max-prompt-len "
                     "drops are counted)")


def count_prompt_rows(path: str, max_row_bytes: int | None = None) -> int:
    """Rows of a prompt file that are JSON objects (what --num-epoch counts); ConfigError naming a bad file."""
    from .rows import read_rows
    try:
        return sum(1 for row in read_rows(path, max_row_bytes) if row.problem is None and row.obj is not None)
    except Exception as exc:  # an unreadable file: say which
        raise ConfigError(f"--prompt-data {path}: cannot count its prompts for --num-epoch: {exc}") from None


def _derive_engines(cfg: JobConfig, bad) -> None:
    """Engines = --rollout-num-gpus / --rollout-num-gpus-per-engine; without --rollout-num-gpus: the external
    engines given, else under --colocate the trainer's GPUs (slime's rule), else one engine."""
    engine_cfg, train_cfg = cfg.engine, cfg.train
    per = engine_cfg.rollout_num_gpus_per_engine
    if per < 1:
        return   # (its range check reported it)
    external = len(engine_cfg.rollout_external_engine_addrs or [])
    gpus = engine_cfg.rollout_num_gpus
    if gpus is not None:
        if gpus < 0:
            return
        if gpus == 0 and not external:
            bad("--rollout-num-gpus 0 starts no engine: give --rollout-external-engine-addrs (engines started "
                "elsewhere), or a number of GPUs")
            return
        if gpus % per:
            bad(f"--rollout-num-gpus ({gpus}) must be a multiple of --rollout-num-gpus-per-engine ({per})")
            return
        engines = gpus // per if gpus else external
        if engine_cfg.rollout_num_engines is not None and engine_cfg.rollout_num_engines != engines:
            bad(f"--rollout-num-engines {engine_cfg.rollout_num_engines} disagrees with --rollout-num-gpus {gpus} / "
                f"--rollout-num-gpus-per-engine {per} = {engines} engines; give one of them")
        engine_cfg.rollout_num_engines = engines
        return
    if engine_cfg.rollout_num_engines is None:
        if external:
            engine_cfg.rollout_num_engines = external
        elif engine_cfg.colocate:
            trainer_gpus = train_cfg.actor_num_nodes * train_cfg.actor_num_gpus_per_node
            engine_cfg.rollout_num_engines = max(1, trainer_gpus // per)
        else:
            engine_cfg.rollout_num_engines = 1
    engine_cfg.rollout_num_gpus = engine_cfg.rollout_num_engines * per if not external else 0


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

