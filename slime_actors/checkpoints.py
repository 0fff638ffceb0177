"""Checkpoint directories: which layout a directory holds, what `--load` resumes from, where `--save-hf` writes.

This project's layout (`--save DIR`, written by the controller and the trainer ranks):

    DIR/latest_checkpointed_iteration.txt        N (the newest complete checkpoint)
    DIR/iter_000000N/meta.json                   next rollout id, weight version, controller RNG, evals
    DIR/iter_000000N/buffer.msgpack              the data buffer
    DIR/iter_000000N/trainer/                    the training backend's state:
        torch backend:    model.safetensors (HF names), optim.pt, rng_rank{r}.pt, meta.json
        megatron backend: dist/ (megatron dist_checkpointing, torch_dist), rng_rank{r}.pt, meta.json

slime's (Megatron-LM's) layout has the same tracker file and iter_XXXXXXX directories, but each holds a torch_dist
checkpoint directly (`.metadata`, `*.distcp`, `common.pt`, `metadata.json`) and no meta.json; slime's converted
models use the tracker value "release" and a `release/` directory. `--load` refuses those (and Hugging Face model
directories, empty directories, unknown contents) with a message saying what it found and what it expected;
`slime-actors convert` turns their weights into an HF directory for --hf-checkpoint. The pickles a checkpoint holds
are read only through allow-lists (safe_pickle.py): loading one never runs code from it.

    ckpt = resolve_load(cfg)         # Path of the iter directory to resume from, None to start fresh; or raises
    layout = detect_layout(path)     # Layout(kind, path, detail)
    root = save_root(cfg)            # where this job's checkpoints go: --save, or the rolling RUN_DIR/ckpt

A job without --save keeps a rolling checkpoint in RUN_DIR/ckpt (unless --no-rolling-save): the same layout, every
--save-interval rollouts (else every ROLLING_INTERVAL) and after the last, only the newest kept (`prune`), so that a
trainer-group restart costs a few steps instead of the whole run. The directory carries ROLLING_MARKER; a new run
clears it (run_dir.py), a run resumed from it continues it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from .config import JobConfig
from .json_files import JsonFileError, odd_files, read_json_object, read_small_json

TRACKER = "latest_checkpointed_iteration.txt"
ROLLING_DIR = "ckpt"                  # RUN_DIR/ckpt: the rolling checkpoint of a job without --save
ROLLING_MARKER = ".slime-actors-rolling"
ROLLING_INTERVAL = 5                  # rollouts between rolling checkpoints (without --save-interval)
ROLLING_KEEP = 1                      # complete checkpoints kept there (a save in progress adds one until done)
META = "meta.json"
BUFFER_FILE = "buffer.msgpack"   # the buffer's snapshot in an iteration directory
TRAINER_DIR = "trainer"          # the training backend's state in an iteration directory
ITER_RE = re.compile(r"^iter_(\d{7})$")
EXPORT_MARKER = ".slime-actors-export"


class CheckpointError(ValueError):
    """A --load / --save / --save-hf / convert path that cannot be used as asked; the message says what was found
    and what was expected."""


@dataclass
class Layout:
    kind: str      # missing | empty | ours | ours-iter | torch-trainer | megatron-trainer | megatron | torch_dist |
                   # hf | file | unknown
    path: Path     # the directory it describes (for "ours" / "megatron": the iteration it points at, if any)
    detail: str    # for messages


def iter_dir(root: str | os.PathLike, n: int) -> Path:
    return Path(root) / f"iter_{n:07d}"


def trainer_dir(ckpt: str | os.PathLike) -> Path:
    """Where an iteration directory keeps the training backend's state (every trainer rank writes and loads it)."""
    return Path(ckpt) / TRAINER_DIR


def buffer_file(ckpt: str | os.PathLike) -> Path:
    """Where an iteration directory keeps the buffer's snapshot."""
    return Path(ckpt) / BUFFER_FILE


def read_meta(ckpt: str | os.PathLike) -> dict:
    """Iteration directory `ckpt`'s meta.json, checked (a checkpoint may come from anywhere): a JSON object of at most
    8 MiB whose next_rollout_id and weight_version are whole numbers >= 0 and whose controller_rng, when there, is
    a state of Python's random. CheckpointError naming the file and what is wrong with it."""
    path = Path(ckpt) / META
    try:
        meta = read_json_object(path)
    except JsonFileError as exc:
        raise CheckpointError(f"checkpoint metadata {exc}") from None
    problems = [f"{key} {meta[key]!r} (a whole number >= 0)" if key in meta else f"no {key}"
                for key in ("next_rollout_id", "weight_version") if not (type(meta.get(key)) is int and meta[key] >= 0)]
    if "controller_rng" in meta and not _rng_state(meta["controller_rng"]):
        problems.append("controller_rng is not a state of Python's random")
    if not isinstance(meta.get("evals", []), list):
        problems.append(f"evals is a {type(meta['evals']).__name__}, not a list")
    if problems:
        raise CheckpointError(f"checkpoint metadata {path}: {'; '.join(problems)} -- not written by this project, or "
                              "changed since")
    return meta


def _rng_state(value) -> bool:
    """Whether `value` (JSON: [version, [internal state...], gauss]) is what random.getstate() gives."""
    import random
    try:
        random.Random().setstate((value[0], tuple(value[1]), value[2]))
    except (TypeError, ValueError, IndexError, KeyError, OverflowError):
        return False
    return True


def read_tracker(root: str | os.PathLike) -> str | None:
    """latest_checkpointed_iteration.txt under `root` (an iteration number, or "release"), its first 64 bytes
    stripped; None when there is none, or it is not a regular file (a FIFO is never opened: it would block)."""
    path = Path(root) / TRACKER
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return None
        with open(path, "rb") as f:
            return f.read(64).decode("utf-8", "replace").strip()
    except OSError:
        return None


def commit_checkpoint(root: str | os.PathLike, n: int, meta: dict) -> Path:
    """Mark iteration `n` under `root` complete, once the trainer ranks and the buffer have written their parts:
    its meta.json (what makes it a checkpoint: `latest_checkpoint` skips a directory without it), then the tracker
    file. Returns the iteration directory."""
    path = iter_dir(root, n)
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / (META + ".tmp")
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, path / META)
    tracker = Path(root) / (TRACKER + ".tmp")
    tracker.write_text(str(n))
    os.replace(tracker, Path(root) / TRACKER)
    return path


def rolling(cfg: JobConfig) -> bool:
    """Whether this job keeps a rolling checkpoint in RUN_DIR/ckpt (no --save, not --no-rolling-save, a job that
    trains)."""
    checkpoint_cfg = cfg.checkpoint
    return not checkpoint_cfg.save and not checkpoint_cfg.no_rolling_save and not cfg.debug.debug_rollout_only


def rolling_dir(cfg: JobConfig, run_dir: str | os.PathLike | None = None) -> Path:
    """RUN_DIR/ckpt (`run_dir`: the run directory as this process reaches it; default --run-dir)."""
    return Path(run_dir or cfg.run.run_dir) / ROLLING_DIR


def save_root(cfg: JobConfig, run_dir: str | os.PathLike | None = None) -> Path | None:
    """Where this job's checkpoints go: --save, else the rolling RUN_DIR/ckpt, else None (none)."""
    if cfg.checkpoint.save:
        return Path(cfg.checkpoint.save)
    return rolling_dir(cfg, run_dir) if rolling(cfg) else None


def trained_checkpoint(root: str | os.PathLike | None) -> tuple[Path, int] | None:
    """The newest complete checkpoint under `root` and the rollouts trained before it, when that is at least one
    (None: no checkpoint, an unreadable one, or one saved before any training)."""
    ckpt = latest_checkpoint(root) if root is not None else None
    try:
        done = int(read_meta(ckpt)["next_rollout_id"]) if ckpt is not None else 0
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (ckpt, done) if ckpt is not None and done >= 1 else None


def continue_hint(cfg: JobConfig) -> str | None:
    """For a job that stopped before its end: how to continue it from its newest checkpoint (None: it has none
    after a trained rollout)."""
    root = save_root(cfg)
    found = trained_checkpoint(root)
    if found is None:
        return None
    ckpt, done = found
    return f"to continue from its checkpoint {ckpt} (rollout {done}): the same command with --load {root}"


def save_interval(cfg: JobConfig) -> int | None:
    """Rollouts between checkpoints: --save-interval, else ROLLING_INTERVAL for the rolling checkpoint."""
    return cfg.checkpoint.save_interval or (ROLLING_INTERVAL if rolling(cfg) else None)


def is_rolling_dir(p: str | os.PathLike) -> bool:
    return (Path(p) / ROLLING_MARKER).is_file()


def rolling_conflict(cfg: JobConfig, run_dir: str | os.PathLike | None = None) -> str | None:
    """Why RUN_DIR/ckpt cannot take the rolling checkpoint (it holds something else: an earlier run's --save, your
    files), or None."""
    d = rolling_dir(cfg, run_dir)
    if not rolling(cfg) or not d.exists() or is_rolling_dir(d):
        return None
    if d.is_dir() and not any(d.iterdir()):
        return None
    return f"{d} holds {_names(d) if d.is_dir() else 'a file'} (not a rolling checkpoint of this project)"


def prune(root: str | os.PathLike, newest: int, keep: int) -> list[Path]:
    """After iteration `newest` was committed under `root`: remove the iterations below it but the `keep` - 1
    newest of them (complete or not: an interrupted save leaves one without meta.json). Iterations above `newest`
    (a job resumed from an older one) and anything that is not an iter_NNNNNNN directory stay. Returns what went."""
    import shutil
    older = sorted((p for p in Path(root).glob("iter_*") if ITER_RE.match(p.name) and p.is_dir()
                    and int(p.name[5:]) < newest), key=lambda p: int(p.name[5:]))
    gone = older[:max(0, len(older) - (keep - 1))]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def latest_checkpoint(root: str | os.PathLike | None) -> Path | None:
    """The newest iter_NNNNNNN directory of this project's layout under `root` (one with meta.json: complete), or
    `root` itself if it is one; None if there is none."""
    if not root:
        return None
    root = Path(root)
    if (root / META).exists() and _iteration_meta(root):
        return root
    text = read_tracker(root)
    if text is not None:
        if text.isdigit():
            p = iter_dir(root, int(text))
            if (p / META).exists():
                return p
    cands = sorted(p for p in root.glob("iter_*") if ITER_RE.match(p.name) and (p / META).exists())
    return cands[-1] if cands else None


def _iteration_meta(p: Path) -> bool:
    """meta.json of a controller checkpoint (not the trainer's meta.json inside it)."""
    return "next_rollout_id" in (read_small_json(p / META) or {})


def _is_torch_dist(p: Path) -> bool:
    if (p / ".metadata").is_file() or any(p.glob("*.distcp")):
        return True
    return (read_small_json(p / "metadata.json") or {}).get("sharded_backend") == "torch_dist"


def _is_hf(p: Path) -> bool:
    return (p / "config.json").is_file() and (any(p.glob("*.safetensors")) or any(p.glob("*.bin")))


def _names(p: Path, limit: int = 8) -> str:
    names = sorted(x.name + ("/" if x.is_dir() else "") for x in p.iterdir())
    return ", ".join(names[:limit]) + (f", ... ({len(names)} entries)" if len(names) > limit else "")


def detect_layout(path: str | os.PathLike) -> Layout:
    """What `path` holds (reads only)."""
    p = Path(path)
    if not p.exists():
        return Layout("missing", p, "does not exist")
    if not p.is_dir():
        return Layout("file", p, "is a file, not a directory")
    if not any(p.iterdir()):
        return Layout("empty", p, "is an empty directory")
    if (p / META).is_file() and _iteration_meta(p):
        return Layout("ours-iter", p, f"a slime-actors checkpoint ({p.name})")
    text = read_tracker(p)
    if text is not None:
        target = p / "release" if text == "release" else iter_dir(p, int(text)) if text.isdigit() else None
        if target is None:
            return Layout("unknown", p, f"{TRACKER} holds {text!r}, not an iteration number")
        if (target / META).is_file() and _iteration_meta(target):
            return Layout("ours", target, f"slime-actors checkpoints (newest: {target.name})")
        if target.is_dir() and _is_torch_dist(target):
            what = "a converted model (release)" if text == "release" else f"iteration {int(text)}"
            return Layout("megatron", target, f"a Megatron/slime checkpoint ({what}: {target.name}/ in torch_dist "
                                              "format, no meta.json)")
        if not target.exists():
            return Layout("unknown", p, f"{TRACKER} says {text} but {target.name}/ is missing")
        if (target / META).is_file():
            try:
                read_meta(target)
            except CheckpointError as exc:
                return Layout("unknown", p, f"{TRACKER} points at {target.name}/, whose {exc}")
        return Layout("unknown", p, f"{TRACKER} points at {target.name}/, which holds {_names(target)}")
    if latest_checkpoint(p) is not None:
        target = latest_checkpoint(p)
        return Layout("ours", target, f"slime-actors checkpoints (newest: {target.name}; no {TRACKER})")
    iters = sorted(x for x in p.glob("iter_*") if ITER_RE.match(x.name) and x.is_dir())
    if iters and _is_torch_dist(iters[-1]):
        return Layout("megatron", iters[-1], f"Megatron/slime checkpoints ({iters[-1].name}/ in torch_dist format, "
                                             f"no {TRACKER}, no meta.json)")
    if iters:
        return Layout("unknown", p, f"{', '.join(x.name for x in iters[-3:])} without meta.json (an interrupted "
                                    f"save?); {iters[-1].name}/ holds {_names(iters[-1])}")
    if _is_torch_dist(p):
        return Layout("torch_dist", p, "a torch_dist checkpoint (Megatron dist_checkpointing)")
    if (p / "dist").is_dir() and _is_torch_dist(p / "dist"):
        return Layout("megatron-trainer", p, "the megatron backend's trainer state (dist/, torch_dist)")
    if ((p / "model.safetensors").is_file() or (p / "adapter").is_dir()) and not (p / "config.json").exists():
        return Layout("torch-trainer", p, "the torch backend's trainer state (model.safetensors without config)")
    if _is_hf(p):
        return Layout("hf", p, "a Hugging Face model directory")
    return Layout("unknown", p, f"holds {_names(p)}")


EXPECTED = (f"a directory written by --save: {TRACKER} and iter_NNNNNNN/ with meta.json and trainer/ (or one "
            "iter_NNNNNNN/ directory of it)")


def _same(a, b) -> bool:
    return a is not None and b is not None and Path(a).resolve() == Path(b).resolve()


def resolve_load(cfg: JobConfig) -> Path | None:
    """The checkpoint --load resumes from (an iter directory), or None to start fresh. Starting fresh happens only
    without --load, or when --load is the --save directory and holds nothing yet (slime's `--load X --save X`
    habit: the first run of a job that resumes itself). Everything else that is not a checkpoint of this layout
    is refused with a CheckpointError."""
    load = cfg.checkpoint.load
    if not load:
        return None
    lay = detect_layout(load)
    if lay.kind in ("ours", "ours-iter"):
        _check_backend(cfg.train.train_backend, lay.path)
        _check_lora(cfg.lora.lora_rank, lay.path)
        _check_files(lay.path)   # (before anything opens them: check_pickles reads the .pt files)
        check_pickles(lay.path)
        read_meta(lay.path)   # (checked before any process starts: the controller and the trainers read it)
        return lay.path
    if lay.kind in ("missing", "empty") and _same(load, cfg.checkpoint.save):
        return None
    hint = ""
    if lay.kind in ("megatron", "torch_dist", "megatron-trainer", "torch-trainer"):
        hint = (f" To start from its weights, convert them to a Hugging Face directory -- slime-actors convert {load} "
                "OUT_DIR --hf-checkpoint MODEL_DIR -- and pass --hf-checkpoint OUT_DIR (with --start-rollout-id to "
                "continue the numbering); optimizer and data position do not carry over.")
    elif lay.kind == "hf":
        hint = " A Hugging Face model is not a training state: pass it as --hf-checkpoint."
    elif lay.kind in ("missing", "empty"):
        hint = (" Nothing was loaded and nothing was changed (give the --save directory of an earlier run; --load "
                "equal to --save starts fresh while that directory is still empty).")
    raise CheckpointError(f"--load {load}: {lay.detail}; expected {EXPECTED}.{hint}")


def _check_files(ckpt: Path) -> None:
    """Every entry of the checkpoint is a directory or a regular file: a FIFO would block the process that opens it
    (the buffer blocked on a FIFO buffer.msgpack until the hang check stopped the job), a device never end."""
    odd = odd_files(ckpt, [os.path.relpath(os.path.join(root, name), ckpt)
                           for root, _, files in os.walk(ckpt) for name in files])
    if odd:
        raise CheckpointError(f"--load: {ckpt}: {odd} -- a checkpoint's files are regular files (not written by this "
                              "project, or changed since)")


def _check_backend(want: str, ckpt: Path) -> None:
    t = trainer_dir(ckpt)
    # the torch backend keeps model.safetensors, or with LoRA adapter/ (backends/lora.py LORA_CKPT_DIR)
    has = "megatron" if (t / "dist").is_dir() else \
        "torch" if (t / "model.safetensors").is_file() or (t / "adapter").is_dir() else None
    if has is None:
        raise CheckpointError(f"--load: {ckpt} has no trainer state ({t} holds "
                              f"{_names(t) if t.is_dir() else 'nothing'}); expected {EXPECTED}")
    if has != want:
        raise CheckpointError(
            f"--load: {ckpt} was written by the {has} backend, but this run uses --train-backend {want}; "
            f"resume with --train-backend {has}, or convert its weights (slime-actors convert {ckpt} OUT_DIR) and "
            "start from them with --hf-checkpoint OUT_DIR")


def _check_lora(rank: int, ckpt: Path) -> None:
    """A checkpoint of LoRA adapters resumes only with --lora-rank, a full one only without."""
    adapters = (trainer_dir(ckpt) / "adapter").is_dir()
    if rank > 0 and not adapters and (trainer_dir(ckpt) / "model.safetensors").is_file():
        raise CheckpointError(f"--load: {ckpt} holds full weights (trained without LoRA), but this run has --lora-rank "
                              f"{rank}; resume without the --lora-* flags, or start LoRA from its weights: "
                              f"slime-actors convert {ckpt} OUT_DIR, then --hf-checkpoint OUT_DIR")
    if rank == 0 and adapters:
        raise CheckpointError(f"--load: {ckpt} holds LoRA adapters (trainer/adapter/), but this run has no "
                              "--lora-rank; resume with the --lora-* flags it was trained with, or fine-tune the "
                              f"merged model: slime-actors convert {ckpt} OUT_DIR, then --hf-checkpoint OUT_DIR")


def check_pickles(ckpt: str | os.PathLike) -> None:
    """Every pickle of a checkpoint of ours loads without running code (safe_pickle.py): the trainer's
    `*.pt` files (optimizer, RNG: torch's weights_only unpickler; tensor data is not read) and the megatron
    backend's `dist/.metadata` (the DCP allow-list). The backends load them the same way; this reports a bad file
    before any process starts. Raises CheckpointError naming the file and the class."""
    from .safe_pickle import UnsafeCheckpointError, load_torch_file, read_dcp_metadata
    t = trainer_dir(ckpt)
    try:
        for f in sorted(t.glob("*.pt")):
            load_torch_file(f, mmap=True)
        if (t / "dist" / ".metadata").is_file():
            read_dcp_metadata(t / "dist")
    except UnsafeCheckpointError as exc:
        raise CheckpointError(f"--load: {exc}") from None


def check_save_root(cfg: JobConfig) -> None:
    """--save must not be a directory of another layout (slime's checkpoints: its tracker file would be
    overwritten) or a file."""
    save = cfg.checkpoint.save
    if not save:
        return
    lay = detect_layout(save)
    if lay.kind in ("missing", "empty", "ours", "ours-iter"):
        if lay.kind == "ours-iter":
            raise CheckpointError(f"--save {save}: is one checkpoint (iter directory), not a checkpoint root; give "
                                  "its parent")
        return
    if lay.kind == "unknown" and not (Path(save) / TRACKER).exists() and not any(Path(save).glob("iter_*")):
        return  # a directory of other things: we add iter_NNNNNNN/ and the tracker file, nothing else
    raise CheckpointError(f"--save {save}: {lay.detail}; writing this run's checkpoints there would overwrite its "
                          f"{TRACKER} -- give another directory")


# -- --save-hf ------------------------------------------------------------------------------------------------------

def hf_export_path(spec: str, rollout_id: int) -> Path:
    """slime's `--save-hf` formatting: `spec.format(rollout_id=rollout_id)` (rollout_id: the rollout just trained,
    0-based); a spec without `{rollout_id}` is one directory, replaced at each export."""
    try:
        return Path(spec.format(rollout_id=rollout_id))
    except (KeyError, IndexError, ValueError) as exc:
        raise CheckpointError(f"--save-hf {spec}: bad format ({type(exc).__name__}: {exc}); the only field is "
                              "{rollout_id}, e.g. --save-hf out/hf/iter_{rollout_id:07d}") from None


def hf_export_due(cfg: JobConfig, k: int) -> bool:
    """Whether --save-hf exports after rollout k: every --save-interval rollouts, and after the last one."""
    interval = cfg.checkpoint.save_interval
    return bool(interval and (k + 1) % interval == 0) or k + 1 == cfg.run.num_rollout


def hf_export_ids(cfg: JobConfig, start: int = 0) -> list[int]:
    """The rollout ids from `start` on after which --save-hf exports."""
    return [k for k in range(start, cfg.run.num_rollout) if hf_export_due(cfg, k)]


def is_export_of_ours(p: Path) -> bool:
    return (p / EXPORT_MARKER).is_file()


def check_hf_exports(cfg: JobConfig, hf_dir: str | None, start: int = 0) -> None:
    """Every directory --save-hf will write (rollouts `start`..) must be new, empty, or an earlier export of ours,
    and never the --hf-checkpoint directory (an export replaces the weights it finds)."""
    spec = cfg.checkpoint.save_hf
    if not spec:
        return
    for k in hf_export_ids(cfg, start):
        p = hf_export_path(spec, k)
        if hf_dir and _same(p, hf_dir):
            raise CheckpointError(f"--save-hf {spec}: {p} is the --hf-checkpoint directory; an export would replace "
                                  "its weights -- give another directory")
        if p.exists() and (not p.is_dir() or (any(p.iterdir()) and not is_export_of_ours(p))):
            raise CheckpointError(f"--save-hf {spec}: {p} exists and is not an export of slime-actors (no "
                                  f"{EXPORT_MARKER}; it holds {_names(p) if p.is_dir() else 'a file'}); an export "
                                  "replaces its directory -- give a new one")
