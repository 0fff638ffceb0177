"""`slime-actors train`: the RL loop on this host.

The directory and the controller run in this process; the buffer, reward workers, rollout workers (each with its
engine) and trainer ranks run as supervised child processes (slime_actors.launch.local). At the end it prints the
held-out reward before and after training, and where the metrics, curves and traces are.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path

from .config import ConfigError, args_to_dict, parse_args


def prepare_run_dir(args) -> Path:
    """Create the run directory; clear a previous run's live state (a new run never inherits its buffer log)."""
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for sub in ("buffer", "traces", "sockets", "weights", "keys", "logs", "tensorboard"):
        shutil.rmtree(run_dir / sub, ignore_errors=True)
    for f in ("metrics.jsonl", "curves.png", "job.json", "result.json"):
        (run_dir / f).unlink(missing_ok=True)
    return run_dir


def write_job(args, run_dir: Path) -> Path:
    path = run_dir / "job.json"
    path.write_text(json.dumps(args_to_dict(args), indent=1, default=str))
    return path


def role_plan(args) -> list[tuple[str, int, dict]]:
    """(role, index, extra env) for every child process of the job."""
    from .backends.weight_sync import find_free_port as free_port
    plan: list[tuple[str, int, dict]] = [("buffer", 0, {})]
    if not args.debug_train_only:
        plan += [("reward", i, {}) for i in range(args.num_reward_workers)]
        plan += [("rollout", i, {}) for i in range(args.rollout_num_engines)]
    n = args.actor_num_nodes * args.actor_num_gpus_per_node
    port = free_port()
    for r in range(n):
        plan.append(("trainer", r, {"RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r),
                                    "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
                                    "MASTER_PORT": str(port)}))
    return plan


def main(argv: list[str]) -> int:
    try:
        args = parse_args(argv)
    except ConfigError as exc:
        print(f"slime-actors train: error: {exc}", file=sys.stderr)
        return 2
    import uvloop

    from .actors.controller import Controller
    from .actors.directory import Directory
    from .launch.local import LocalLauncher, RestartPolicy
    from .log import get_logger, setup_logging
    from .mailbox.security import JobKeys
    from .models import resolve_checkpoint
    from .runtime import RuntimeConfig

    run_dir = prepare_run_dir(args)
    setup_logging(run_dir, "controller/0")
    log = get_logger(actor="train")
    try:
        args.hf_checkpoint = resolve_checkpoint(args.hf_checkpoint, Path(args.run_dir).parent / ".models")
    except FileNotFoundError as exc:
        print(f"slime-actors train: error: {exc}", file=sys.stderr)
        return 2
    job = write_job(args, run_dir)
    keys = None
    if args.curve:
        keys = JobKeys.create()
        keys.save(run_dir)
    rt = RuntimeConfig(run_dir=str(run_dir), curve=args.curve, trace=args.trace,
                       trace_keep_arrays=args.trace_keep_arrays, transport=args.transport,
                       heartbeat_interval=args.heartbeat_interval, liveness=args.heartbeat_liveness)
    log.info("run", run_dir=str(run_dir), model=args.hf_checkpoint, steps=args.num_rollout,
             estimator=args.advantage_estimator)
    t0 = time.monotonic()

    async def run() -> dict:
        directory = Directory(0)
        dep = await directory.start(rt)
        rt.directory = dep
        env = {**rt.env(), "SLIME_ACTORS_JOB": str(job.resolve())}
        launcher = LocalLauncher(str(run_dir), env)
        for role, index, extra in role_plan(args):
            policy = RestartPolicy(restart=role != "trainer")
            launcher.add(role, index, extra, policy)
        launcher.start_all()
        controller = Controller(0, args=args_to_dict(args))
        await controller.start(rt)
        try:
            while not controller.done.done():
                await asyncio.sleep(0.2)
                launcher.check()
                if launcher.failure:
                    raise RuntimeError(f"job stopped: {launcher.failure}")
            return controller.done.result()
        finally:
            await controller.stop()
            # in a thread: the directory (on this loop) must keep answering the actors' deregistrations
            await asyncio.get_running_loop().run_in_executor(None, launcher.stop_all)
            await directory.stop()

    try:
        result = uvloop.run(run())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        print(f"slime-actors train: failed: {exc}", file=sys.stderr)
        return 1
    result["seconds"] = round(time.monotonic() - t0, 1)
    (run_dir / "result.json").write_text(json.dumps(result, indent=1))
    print_summary(result, run_dir)
    return 0


def print_summary(result: dict, run_dir: Path) -> None:
    print("")
    print(f"done: {result['steps']} steps in {result['seconds']} s, weight version {result['weight_version']}")
    for name in sorted(set(result.get("eval_before", {})) | set(result.get("eval_after", {}))):
        b = result.get("eval_before", {}).get(name)
        a = result.get("eval_after", {}).get(name)
        delta = f"{a - b:+.3f}" if a is not None and b is not None else "?"
        print(f"held-out reward [{name}]: before {b if b is None else f'{b:.3f}'} -> after "
              f"{a if a is None else f'{a:.3f}'} ({delta})")
    print(f"metrics: {result['metrics']}")
    if result.get("plot"):
        print(f"curves:  {result['plot']}")
    print(f"traces:  {run_dir / 'traces'}   (slime-actors trace summary {run_dir})")
