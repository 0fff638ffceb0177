"""Before a job's first write: every path checked, the run directory made (or cleared), the model resolved, the job
file written -- the job's config as a flat dict, which every actor process rebuilds typed (launch/actor.py).

    job_path = prepare_head(cfg)       # ValueError / FileNotFoundError with the cause; nothing written then
"""

from __future__ import annotations

import json
from pathlib import Path

from ..config import JobConfig


def check_paths(cfg: JobConfig, problems: list[str] | None = None) -> Path | None:
    """Every path the job reads or writes, checked before anything is written (docs/fault-tolerance.md, "Run
    directories and checkpoints"): the run directory is new, ours, or holds none of the names a run clears; --load
    is a checkpoint of this layout (or --load = --save, still empty); --save is not another tool's checkpoint
    directory; --ref-load, when the reference model is used, is a Hugging Face directory; nothing lies where a run
    clears its state. Returns the checkpoint to resume from (None: a new run). Every problem goes to `problems`
    when given; else the first is raised (RunDirError / CheckpointError, ValueErrors)."""
    from ..checkpoints import CheckpointError, check_save_root, resolve_load
    from ..run_dir import check_nothing_inside, inspect_run_dir
    run_dir, ref_load = cfg.run.run_dir, cfg.model.ref_load
    found: list[ValueError] = []

    def attempt(fn, *args):
        try:
            return fn(*args)
        except ValueError as exc:
            found.append(exc)
            return None

    attempt(inspect_run_dir, run_dir)
    ckpt = attempt(resolve_load, cfg)
    attempt(check_save_root, cfg)
    ref_problem = reference_problem(cfg)
    if ref_problem:
        found.append(CheckpointError(ref_problem))
    checkpoint_cfg, debug_cfg = cfg.checkpoint, cfg.debug
    attempt(check_nothing_inside, run_dir, {
        "--save": checkpoint_cfg.save, "--load": checkpoint_cfg.load, "--save-hf": checkpoint_cfg.save_hf,
        "--prompt-data": cfg.data.prompt_data,
        "--hf-checkpoint": cfg.model.hf_checkpoint, "--ref-load": ref_load,
        "--save-debug-rollout-data": debug_cfg.save_debug_rollout_data,
        "--load-debug-rollout-data": debug_cfg.load_debug_rollout_data})
    if problems is not None:
        problems.extend(str(e) for e in found if str(e) not in problems)
    elif found:
        raise found[0]
    return ckpt


def reference_problem(cfg: JobConfig) -> str | None:
    """Why the reference model the job needs (--use-kl-loss, --kl-coef) cannot be read from --ref-load."""
    from ..checkpoints import detect_layout
    algorithm_cfg, ref = cfg.algorithm, cfg.model.ref_load
    if not ref or not algorithm_cfg.needs_reference:
        return None
    lay = detect_layout(ref)
    if lay.kind == "hf":
        return None
    convert = (f" -- convert it: slime-actors convert {ref} OUT_DIR --hf-checkpoint MODEL_DIR"
               if lay.kind in ("megatron", "torch_dist") else "")
    return (f"--ref-load {ref}: {lay.detail}; expected a Hugging Face model directory (config.json and "
            f"safetensors) for the reference model of --kl-loss-coef {algorithm_cfg.kl_loss_coef} / "
            f"--kl-coef {algorithm_cfg.kl_coef}"
            f"{convert}")


def write_job(cfg: JobConfig, path: Path) -> Path:
    """The job file: the config's flat dict (JobConfig.to_dict: no engine keys)."""
    path.write_text(json.dumps(cfg.to_dict(), indent=1))
    return path


def prepare_head(cfg: JobConfig, fresh: bool = True) -> Path:
    """Checks, run dir, resolved model, the checked prompt rows, job file. Returns the job file's path. Every check
    comes before the first write: a job that fails them has changed nothing (ValueError / FileNotFoundError with
    the cause). `fresh`: clear the run directory's live state (False: a restarted head, which continues it)."""
    from ..checkpoints import check_hf_exports, read_meta
    from ..models import model_cache, resolve_checkpoint
    from ..run_dir import RunDirError, prepare_run_dir, run_in_use, unfinished_run
    run_dir = Path(cfg.run.run_dir)
    ckpt = check_paths(cfg)
    if fresh and (why := run_in_use(run_dir) or (unfinished_run(run_dir) if ckpt is None else None)):
        raise RunDirError(why)   # (a fresh head only: a restarted one, torchrun's, continues the run)
    spec = cfg.model.hf_checkpoint
    if not spec.startswith(("tiny:", "smollm2:")):
        resolve_checkpoint(spec, model_cache(run_dir))  # checks only (no download, nothing written)
    start = read_meta(ckpt)["next_rollout_id"] if ckpt is not None else (cfg.run.start_rollout_id or 0)
    check_hf_exports(cfg, None if spec.startswith(("tiny:", "smollm2:")) else spec, start)
    cfg.model.hf_checkpoint = resolve_checkpoint(spec, model_cache(run_dir))
    check_hf_exports(cfg, cfg.model.hf_checkpoint, start)
    if cfg.engine.frozen_engine_checkpoint:   # (a tiny:/smollm2: spec made in the cache as --hf-checkpoint's)
        cfg.engine.frozen_engine_checkpoint = resolve_checkpoint(cfg.engine.frozen_engine_checkpoint,
                                                                 model_cache(run_dir))
    if fresh:
        prepare_run_dir(cfg.run.run_dir, resume=ckpt is not None, resume_from=ckpt)
    run_dir.mkdir(parents=True, exist_ok=True)
    hand_over_checked_prompts(cfg, run_dir)
    return write_job(cfg, run_dir / "job.json").resolve()


def hand_over_checked_prompts(cfg: JobConfig, run_dir: Path) -> None:
    """The prompt files' rows as the launcher checked them (launch/checks.py) go to RUN_DIR/checked-prompts/, where the
    buffer reads them instead of parsing the files again (slime_actors.data.checked_path)."""
    import os
    import shutil

    from ..data import checked_path
    for name, tmp in list(cfg.checked_prompts.items()):
        dest = Path(checked_path(run_dir, name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(tmp, dest)
        try:
            os.rmdir(os.path.dirname(tmp))
        except OSError:
            pass
    cfg.checked_prompts.clear()


def prepare_agent(cfg: JobConfig, agent_index: int) -> Path:
    """A node agent's share: join the run directory; returns where its job file goes (`write_agent_job` writes it
    once the agent joined the head: agents resolve the model after the head made it -- a tiny model is written to
    disk, and two processes writing it at once would race)."""
    from ..run_dir import join_run_dir
    run_dir = Path(cfg.run.run_dir)
    join_run_dir(run_dir)  # an agent may get there before the head: it writes keys and traces right away
    return run_dir.resolve() / f"job-agent-{agent_index}.json"


def write_agent_job(cfg: JobConfig, path: Path) -> None:
    """A node agent's job file, once the head has made the model: the same config, the model resolved here."""
    from ..models import model_cache, resolve_checkpoint
    cfg.model.hf_checkpoint = resolve_checkpoint(cfg.model.hf_checkpoint, model_cache(cfg.run.run_dir))
    if cfg.engine.frozen_engine_checkpoint:
        cfg.engine.frozen_engine_checkpoint = resolve_checkpoint(cfg.engine.frozen_engine_checkpoint,
                                                                 model_cache(cfg.run.run_dir))
    write_job(cfg, path)
