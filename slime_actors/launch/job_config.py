"""The job, planned once in the head before any process starts: config -> checks (every problem) -> placement plan.

    plan = plan_job(argv, topology, place=True, data=True)   # ConfigError listing every problem found
    plan.cfg, plan.changed, plan.gpus, plan.summary           # the config, what the topology changed, the GPU plan,
                                                              # what the job will be (lines for the console)

1. read: the flags and the TOML file (the topology's `[job] config` unless the command line names one), each once
   (config.read_flags: types checked, a string is never a number, every problem collected);
2. --eval-config, every set of it checked (slime_actors.eval_config: its sets go into --eval-prompt-data), then the
   prompt files, each streamed once (launch/checks.py): malformed rows name file:line, rows too large are counted;
   the rows checked go to a temporary file the head hands to the buffer, so no file is parsed twice; their count
   gives --num-rollout from --num-epoch;
3. the values (config.finish_config): slime's function paths mapped, derived values, ranges, rules across flags,
   slime's flags without a field against config.json; a topology whose rollout workers colocate with the trainer
   makes the job --colocate first;
4. the topology's counts (it wins over the flags; `changed` says what it changed);
5. what the backends and the monitor own (launch/checks.py): the engine keys taken out of the config
   (`cfg.engine_user_keys`, never written anywhere from the config), the `--sglang-*` / `--router-*` passthrough
   parsed once (LaunchFlags) and checked against SGLang, the alarms' thresholds; --ref-load (needed or not); every
   path the job reads or writes (with `paths`);
   -> one ConfigError with every problem of 1-5, each naming its flag or file:line;
6. the environment the job's processes inherit from this one: --log-level (SLIME_ACTORS_LOG_LEVEL) and
   --wandb-key (WANDB_API_KEY), which stay out of job files (`cfg.process_env`);
7. with `place` (a job on this host: `slime-actors train`, `launch` without --node) the GPU plan
   (launch/placement.py): with --device cuda the GPUs are counted, --num-gpus-per-node defaults to the count; one
   GPU for one trainer rank and one engine makes the job --colocate (the plan says so); the plan must fit
   (ConfigError naming the numbers and the fix); a colocated engine gets its memory fraction;
8. the summary: device, engine, backend, parallelism, and where slime's defaults differ (launch/summary.py).

`build_job_config` / `build_placed_job_config` are the same pass without the data and path checks, for callers
that only need the config (torchrun's ranks, sbatch's script, tests).
"""

from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass, field

from ..backends.sglang_launch import LaunchFlags
from ..config import ConfigError, JobConfig, Problems, ReadFlags, finish_config, has_flag, read_flags
from ..eval_config import check_eval_config
from .. import startup_timeline as timeline
from ..gpus import GpuCount, count_gpus
from .placement import GpuPlan, colocates_by_itself, plan_gpus, topology_colocates
from .topology import Topology, TopologyError


@dataclass
class JobPlan:
    cfg: JobConfig
    changed: list[str] = field(default_factory=list)   # what the topology changed ("--flag old -> new")
    gpus: GpuPlan | None = None                        # the GPU plan (None off GPU, or not placed here)
    summary: list[str] = field(default_factory=list)   # what the job will be, for the console


def plan_job(argv: list[str], topology: Topology | None = None, *, place: bool = False, data: bool = False,
             paths: bool = False, keep_rows: bool = False, gpus: GpuCount | None = None) -> JobPlan:
    """Steps 1-8 of the module docstring. `data`: check the prompt files (`keep_rows`: keep the rows checked for
    the buffer, `cfg.checked_prompts`); `paths`: check every path (run dir, checkpoints, the model)."""
    from .checks import check_prompt_files, discard_checked
    argv = list(argv)
    if topology is not None and topology.job_config and not has_flag(argv, "--config"):
        argv = ["--config", topology.job_config] + argv
    flags = read_flags(argv)
    launch_flags = LaunchFlags.parse(flags.cfg.engine.sglang_args)   # the --sglang-* flags, parsed once
    changed: list[str] = []
    why_colocated = ""   # what made the job --colocate, named in front of the problems that follow from it
    if topology_colocates(topology) and not flags.cfg.engine.colocate:
        # the rollout workers share the trainer's GPUs: the job is colocated, with colocation's defaults
        flags.cfg.engine.colocate = True
        changed.append("--colocate False -> True")
        why_colocated = f"{topology.path} colocates the rollout workers with the trainer: "
    here = place and flags.cfg.run.device.startswith("cuda")
    if here and gpus is None:
        with timeline.phase("GPU count"):   # (NVML: milliseconds; torch where it must count: seconds)
            gpus = count_gpus()
    by_itself = here and _colocates_by_itself(flags, gpus, launch_flags, topology)
    if by_itself:   # one GPU for one trainer rank and one engine: the job is colocated, with colocation's defaults
        flags.cfg.engine.colocate = True
        why_colocated = f"{gpus.describe()}, so the trainer and the engine share it: "
    problems = Problems(flags.problems)   # in the order found: the flags', the prompt files', the values', ...
    try:
        held_out = check_eval_config(flags.cfg)   # --eval-config's sets (None: --eval-prompt-data's)
    except ConfigError as exc:
        problems.merge(exc)
        held_out = []
    counts = check_prompt_files(flags.cfg, problems, keep=keep_rows, held_out=held_out) if data else {}
    try:
        cfg = _finish(flags, counts, problems, topology, changed, why_colocated)
        _checks(cfg, launch_flags, problems, paths)
        problems.raise_if_any()
        os.environ.update(cfg.process_env)
        plan = JobPlan(cfg, changed)
        if here:
            plan.gpus = plan_gpus(cfg, gpus, launch_flags, topology, by_itself)
            if cfg.engine.num_gpus_per_node is None:
                cfg.engine.num_gpus_per_node = plan.gpus.per_node
            if plan.gpus.mem_fraction is not None and launch_flags.value("--mem-fraction-static") is None:
                cfg.engine.sglang_args = [*cfg.engine.sglang_args, "--mem-fraction-static", plan.gpus.mem_fraction]
                launch_flags = launch_flags.with_flag("--mem-fraction-static", plan.gpus.mem_fraction)
        from .summary import start_lines
        plan.summary = start_lines(cfg, launch_flags)
        return plan
    except BaseException:
        discard_checked(flags.cfg)
        raise


def _colocates_by_itself(flags: ReadFlags, gpus: GpuCount, launch_flags: LaunchFlags, topology: Topology | None
                         ) -> bool:
    """Whether the job, as given, is one trainer rank and one one-GPU engine on one GPU (placement.py): decided on
    a trial of the values (derived engine counts), before the job's config is finished once, colocated or not."""
    trial = copy.deepcopy(flags)
    trial.problems.clear()
    try:
        cfg = finish_config(trial, check_files=False)
        if topology is not None:
            topology.apply_to_config(cfg)
    except (ConfigError, TopologyError):
        return False   # (the job's own pass reports why)
    return colocates_by_itself(cfg, gpus, launch_flags, topology)


def _finish(flags: ReadFlags, counts: dict[str, int], problems: Problems, topology: Topology | None,
            changed: list[str], why_colocated: str) -> JobConfig:
    """Steps 3-4: the values, then the topology's counts; problems collected, the config returned as far as it
    got (the later checks still run, so every problem is reported at once)."""
    from ..data import TRAIN_SET
    try:
        cfg = finish_config(flags, check_files=True, prompt_count=counts.get(TRAIN_SET))
    except ConfigError as exc:
        for p in exc.problems:
            problems.add(why_colocated + p if why_colocated and "--colocate" in p else p)
        cfg = flags.cfg
    if topology is not None:
        try:
            changed += topology.apply_to_config(cfg)
        except TopologyError as exc:
            problems.add(str(exc))
    return cfg


def _checks(cfg: JobConfig, launch_flags: LaunchFlags, problems: Problems, paths: bool) -> None:
    """Step 5. A check that trips over a value already reported bad is not reported again."""
    from .checks import check_backends, check_environment, check_job_paths, settle_reference
    steps = [lambda: check_backends(cfg, problems, launch_flags), lambda: settle_reference(cfg),
             lambda: check_environment(problems)]
    if paths:
        steps.append(lambda: check_job_paths(cfg, problems))
    for step in steps:
        try:
            step()
        except (TypeError, AttributeError, ValueError):
            if not problems:
                raise


# ---------------------------------------------------------------------------------------------------------------
# the config alone (the same pass, without the data and path checks)

def build_job_config(argv: list[str], topology: Topology | None = None) -> tuple[JobConfig, list[str]]:
    """The job's typed config; what the topology changed ("--flag old -> new"). ConfigError with every problem."""
    plan = plan_job(argv, topology)
    return plan.cfg, plan.changed


def build_placed_job_config(argv: list[str], topology: Topology | None = None, gpus: GpuCount | None = None
                            ) -> tuple[JobConfig, list[str], GpuPlan | None]:
    """`build_job_config` for a job that runs on this host, placed on its GPUs (`gpus`: default counted here).
    Returns the plan too (None unless --device cuda); ConfigError when it cannot fit."""
    plan = plan_job(argv, topology, place=True, gpus=gpus)
    return plan.cfg, plan.changed, plan.gpus


# ---------------------------------------------------------------------------------------------------------------
# the console

def print_notes(cfg: JobConfig, prog: str) -> None:
    for note in cfg.notes:
        print(f"{prog}: note: {note}", file=sys.stderr)


def print_errors(exc: ConfigError, prog: str) -> None:
    """Every problem on a line of its own, after how many there are; nothing was started."""
    if len(exc.problems) > 1:
        print(f"{prog}: {len(exc.problems)} problems, nothing was started:", file=sys.stderr)
    for p in exc.problems:
        print(f"{prog}: error: {p}", file=sys.stderr)
