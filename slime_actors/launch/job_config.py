"""The job's config as every launcher builds it, once, in the head: flags + TOML + topology, then the backends'
checks.

    cfg, changed = build_job_config(argv, topology)   # ConfigError / TopologyError naming the problem

1. the topology's `[job] config` file, unless the command line names one (`--config`);
2. the flags and the TOML file: types, defaults, derived values, the values' checks (slime_actors.config);
3. the topology's counts (it wins over the flags; `changed` says what it changed); a topology whose rollout workers
   colocate with the trainer makes the job --colocate (and so the colocated transport, unless one is given);
4. what the backends, the hacking monitor and the eval config own (the monitor's thresholds and alarm names, every
   set of --eval-config, are checked here): the engine keys the user gave are taken out of the config (`cfg.engine_user_keys`, never
   written anywhere from the config), and the `--sglang-*` / `--router-*` passthrough is checked against SGLang's
   own parser or its recorded flag table;
5. the environment the job's processes inherit from this one: --log-level (SLIME_ACTORS_LOG_LEVEL) and
   --wandb-key (WANDB_API_KEY), which stay out of job files (`cfg.process_env`).

A job that runs on this host (`slime-actors train`, `slime-actors launch` without --node) is also placed on its
GPUs, before any process starts (launch/placement.py):

    cfg, changed, plan = build_placed_job_config(argv, topology)   # plan: None off GPU; print plan.lines()

6. with --device cuda the GPUs are counted (slime_actors.gpus); --num-gpus-per-node defaults to the count;
7. one GPU for one trainer rank and one engine: the job is the same flags with --colocate (its transport and
   memory defaults follow), and the plan says so;
8. the plan must fit (ConfigError naming the numbers and the fix); a colocated engine gets its memory fraction
   (`--mem-fraction-static`, unless the job passes one through).

`print_notes(cfg, prog)` prints what the user should know about the flags (slime's flags accepted without effect,
derived values) before the job starts.
"""

from __future__ import annotations

import os
import sys

from ..backends.engine_auth import EngineKeyError, take_user_keys
from ..backends.sglang_launch import SGLangFlagError, check_passthrough, flag_value
from ..config import ConfigError, JobConfig, has_flag, parse_config
from ..eval_config import check_eval_config
from ..gpus import GpuCount, count_gpus
from .placement import GpuPlan, colocates_by_itself, plan_gpus, topology_colocates
from .topology import Topology


def build_job_config(argv: list[str], topology: Topology | None = None) -> tuple[JobConfig, list[str]]:
    """The job's typed config; what the topology changed ("--flag old -> new")."""
    argv = list(argv)
    if topology is not None and topology.job_config and not has_flag(argv, "--config"):
        argv = ["--config", topology.job_config] + argv
    cfg = parse_config(argv)
    if topology_colocates(topology) and not cfg.engine.colocate:
        # the rollout workers share the trainer's GPUs: the job is colocated, with colocation's defaults
        try:
            cfg = parse_config(["--colocate", *argv])
        except ConfigError as exc:
            raise ConfigError(f"{topology.path} colocates the rollout workers with the trainer: {exc}") from None
        changed = ["--colocate False -> True"]
    else:
        changed = []
    changed += topology.apply_to_config(cfg) if topology is not None else []
    check_backend_flags(cfg)
    check_monitor_flags(cfg)
    check_eval_config(cfg)
    os.environ.update(cfg.process_env)
    return cfg, changed


def check_monitor_flags(cfg: JobConfig) -> None:
    """The reward-hacking alarms' flags against the monitor's own names and thresholds (ConfigError)."""
    from ..monitor.hacking import ALARMS, HackThresholds
    mon = cfg.monitor
    try:
        HackThresholds.parse(mon.hack_alarm_thresholds)
    except ValueError as exc:
        raise ConfigError(f"--hack-alarm-thresholds {mon.hack_alarm_thresholds}: {exc}") from None
    unknown = [a for a in mon.hack_alarms_ignore or [] if a not in ALARMS]
    if unknown:
        raise ConfigError(f"--hack-alarms-ignore: unknown alarm(s) {', '.join(unknown)}; the alarms are "
                          f"{', '.join(ALARMS)}")
    if mon.hack_alarms == "stop" and not cfg.checkpoint.save:
        raise ConfigError("--hack-alarms stop saves a checkpoint when an alarm ends the run: give --save DIR "
                          "(where checkpoints go)")


def print_notes(cfg: JobConfig, prog: str) -> None:
    for note in cfg.notes:
        print(f"{prog}: note: {note}", file=sys.stderr)


def check_backend_flags(cfg: JobConfig) -> None:
    """Take the user's engine keys out of the config and check the SGLang passthrough (ConfigError)."""
    try:
        cfg.engine_user_keys = take_user_keys(cfg.engine)
    except EngineKeyError as exc:
        raise ConfigError(str(exc)) from None
    eng = cfg.engine
    if eng.sglang_args or eng.router_args or eng.rollout_engine == "sglang" or eng.use_sglang_router:
        try:
            check_passthrough(cfg)
        except SGLangFlagError as exc:
            raise ConfigError(str(exc)) from None


def build_placed_job_config(argv: list[str], topology: Topology | None = None, gpus: GpuCount | None = None
                            ) -> tuple[JobConfig, list[str], GpuPlan | None]:
    """`build_job_config` for a job that runs on this host, placed on its GPUs (`gpus`: default counted here).
    Returns the plan too (None unless --device cuda); ConfigError when it cannot fit."""
    cfg, changed = build_job_config(argv, topology)
    if not cfg.run.device.startswith("cuda"):
        return cfg, changed, None
    gpus = gpus or count_gpus()
    by_itself = colocates_by_itself(cfg, gpus, topology)
    if by_itself:
        try:
            cfg, changed = build_job_config(["--colocate", *argv], topology)
        except ConfigError as exc:
            raise ConfigError(f"{gpus.describe()}, so the trainer and the engine share it: {exc}") from None
    plan = plan_gpus(cfg, gpus, topology, by_itself)
    if cfg.engine.num_gpus_per_node is None:
        cfg.engine.num_gpus_per_node = plan.per_node
    if plan.mem_fraction is not None and flag_value(cfg.engine.sglang_args, "--mem-fraction-static") is None:
        cfg.engine.sglang_args = [*cfg.engine.sglang_args, "--mem-fraction-static", plan.mem_fraction]
    return cfg, changed, plan
