"""`slime-actors train`: the RL loop on this host.

The directory and the controller run in this process (the head); the buffer, reward workers, rollout workers (each
with its engine) and trainer ranks run as supervised child processes (slime_actors.launch.job / local), placed by a
topology derived from the flags -- the code path of `slime-actors launch` (docs/launch.md). Before any of them
starts, the job is planned in one pass (launch/job_config.py): its flags, config file and prompt files read once,
every problem reported at once, the GPU plan made, and a few lines say what the job will be. `--dry-run` stops
there. At the end it prints the held-out reward before and after training, and where the metrics, curves and
traces are.
"""

from __future__ import annotations

import sys

from .config import ConfigError
from .launch.job import JobContext, run
from .launch.job_config import plan_job, print_errors, print_notes
from .launch.topology import default_topology

PROG = "slime-actors train"


def main(argv: list[str]) -> int:
    """`slime-actors train [--dry-run] FLAGS`: the same code path as `slime-actors launch`, with a topology derived
    from the flags (every role on this host; slime_actors.launch.topology.default_topology), placed on this
    machine's GPUs (launch/placement.py: checked before any process starts; one GPU colocates by itself)."""
    dry_run = "--dry-run" in argv
    argv = [a for a in argv if a != "--dry-run"]
    try:
        plan = plan_job(argv, place=True, data=True, paths=True, keep_rows=not dry_run)
    except ConfigError as exc:
        print_errors(exc, PROG)
        return 2
    print_notes(plan.cfg, PROG)
    for line in plan.summary + (plan.gpus.lines() if plan.gpus is not None else []):
        print(f"{PROG}: {line}", file=sys.stderr)
    if dry_run:
        print(f"{PROG}: dry run: every check passed; nothing was started", file=sys.stderr)
        return 0
    return run(JobContext(plan.cfg, default_topology(plan.cfg), status="changes", prog=PROG))
