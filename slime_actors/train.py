"""`slime-actors train`: the RL loop on this host.

The directory and the controller run in this process (the head); the buffer, reward workers, rollout workers (each
with its engine) and trainer ranks run as supervised child processes (slime_actors.launch.job / local), placed by a
topology derived from the flags -- the code path of `slime-actors launch` (docs/launch.md). At the end it prints
the held-out reward before and after training, and where the metrics, curves and traces are.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from .config import ConfigError, args_to_dict, parse_args


def prepare_run_dir(args) -> Path:
    """Create the run directory; clear a previous run's live state (a new run never inherits its buffer log)."""
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for sub in ("buffer", "traces", "sockets", "weights", "keys", "logs", "tensorboard"):
        shutil.rmtree(run_dir / sub, ignore_errors=True)
    for f in ("metrics.jsonl", "curves.png", "job.json", "result.json", "head.json", "status.json",
              "recoveries.jsonl"):
        (run_dir / f).unlink(missing_ok=True)
    for f in run_dir.glob("job-agent-*.json"):
        f.unlink(missing_ok=True)
    return run_dir


def write_job(args, run_dir: Path) -> Path:
    path = run_dir / "job.json"
    path.write_text(json.dumps(args_to_dict(args), indent=1, default=str))
    return path


def main(argv: list[str]) -> int:
    """`slime-actors train`: the same code path as `slime-actors launch`, with a topology derived from the flags
    (every role on this host; slime_actors.launch.topology.default_topology)."""
    try:
        args = parse_args(argv)
    except ConfigError as exc:
        print(f"slime-actors train: error: {exc}", file=sys.stderr)
        return 2
    from .launch.job import JobContext, run
    from .launch.topology import default_topology
    return run(JobContext(args, default_topology(args), status="changes", prog="slime-actors train"))


def print_summary(result: dict, run_dir: Path) -> None:
    print("")
    print(f"done: {result['steps']} steps in {result['seconds']} s, weight version {result['weight_version']}")
    for name in sorted(set(result.get("eval_before", {})) | set(result.get("eval_after", {}))):
        b = result.get("eval_before", {}).get(name)
        a = result.get("eval_after", {}).get(name)
        delta = f"{a - b:+.3f}" if a is not None and b is not None else "?"
        print(f"held-out reward [{name}]: before {b if b is None else f'{b:.3f}'} -> after "
              f"{a if a is None else f'{a:.3f}'} ({delta})")
    if result.get("samples"):
        from .samples import format_examples
        last = result["samples"]
        print(format_examples(last["rollout_id"], last["examples"], kind="last rollout"))
    print(f"metrics: {result['metrics']}")
    if result.get("plot"):
        print(f"curves:  {result['plot']}")
    print(f"traces:  {run_dir / 'traces'}   (slime-actors trace summary {run_dir})")
