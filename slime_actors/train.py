"""`slime-actors train`: the RL loop on this host.

The directory and the controller run in this process (the head); the buffer, reward workers, rollout workers (each
with its engine) and trainer ranks run as supervised child processes (slime_actors.launch.job / local), placed by a
topology derived from the flags -- the code path of `slime-actors launch` (docs/launch.md). At the end it prints
the held-out reward before and after training, and where the metrics, curves and traces are.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .config import ConfigError, args_to_dict, parse_args


def check_paths(args) -> Path | None:
    """Every path the job reads or writes, checked before anything is written (docs/fault-tolerance.md, "Run
    directories and checkpoints"): the run directory is new, ours, or holds none of the names a run clears; --load
    is a checkpoint of this layout (or --load = --save, still empty); --save is not another tool's checkpoint
    directory; --ref-load, when the reference model is used, is a Hugging Face directory; nothing lies where a run
    clears its state. Returns the checkpoint to resume from (None: a new run). Raises RunDirError /
    CheckpointError (ValueErrors)."""
    from .checkpoints import CheckpointError, check_save_root, detect_layout, resolve_load
    from .run_dir import check_nothing_inside, inspect_run_dir
    inspect_run_dir(args.run_dir)
    ckpt = resolve_load(args)
    check_save_root(args)
    if args.ref_load and (args.use_kl_loss or (args.kl_coef or 0) > 0):
        lay = detect_layout(args.ref_load)
        if lay.kind != "hf":
            raise CheckpointError(f"--ref-load {args.ref_load}: {lay.detail}; expected a Hugging Face model directory "
                                  "(config.json and safetensors)" + (
                                      f" -- convert it: slime-actors convert {args.ref_load} OUT_DIR "
                                      "--hf-checkpoint MODEL_DIR" if lay.kind in ("megatron", "torch_dist") else ""))
    check_nothing_inside(args.run_dir, {
        "--save": args.save, "--load": args.load, "--save-hf": args.save_hf, "--prompt-data": args.prompt_data,
        "--hf-checkpoint": args.hf_checkpoint, "--ref-load": args.ref_load,
        "--save-debug-rollout-data": args.save_debug_rollout_data,
        "--load-debug-rollout-data": args.load_debug_rollout_data})
    return ckpt


def prepare_run_dir(args, resume: bool = False) -> Path:
    """Create the run directory, or clear a previous run's state in one of ours: a new run never inherits its
    buffer log; a resumed run keeps (and continues) metrics, TensorBoard and curves (slime_actors.run_dir)."""
    from .run_dir import prepare_run_dir as prepare
    return prepare(args.run_dir, resume=resume)


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
