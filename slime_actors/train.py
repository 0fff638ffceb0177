"""`slime-actors train`: the RL loop on this host.

The directory and the controller run in this process (the head); the buffer, reward workers, rollout workers (each
with its engine) and trainer ranks run as supervised child processes (slime_actors.launch.job / local), placed by a
topology derived from the flags -- the code path of `slime-actors launch` (docs/launch.md). At the end it prints
the held-out reward before and after training, and where the metrics, curves and traces are.
"""

from __future__ import annotations

import sys

from .config import ConfigError
from .launch.job import JobContext, run
from .launch.job_config import build_placed_job_config, print_notes
from .launch.topology import default_topology


def main(argv: list[str]) -> int:
    """`slime-actors train`: the same code path as `slime-actors launch`, with a topology derived from the flags
    (every role on this host; slime_actors.launch.topology.default_topology), placed on this machine's GPUs
    (launch/placement.py: checked before any process starts; one GPU colocates by itself)."""
    from .launch import timeline
    try:
        with timeline.phase("config"):
            cfg, _, plan = build_placed_job_config(argv)
    except ConfigError as exc:
        print(f"slime-actors train: error: {exc}", file=sys.stderr)
        return 2
    print_notes(cfg, "slime-actors train")
    for line in plan.lines() if plan is not None else ():
        print(f"slime-actors train: {line}", file=sys.stderr)
    return run(JobContext(cfg, default_topology(cfg), status="changes", prog="slime-actors train"))
