"""The checks of a job before any process starts, beyond the values of its flags (slime_actors.config does those):
the prompt files, the reference model, the backends' flags, the monitor's, the paths. Each adds what it finds to
one list of problems, so a job with five mistakes is told all five at once (launch/job_config.py runs them).

    counts = check_prompt_files(cfg, problems, keep=True)   # each file streamed once; {"train": 1000, ...}
    settle_reference(cfg)                                   # --ref-load a torch_dist checkpoint: needed or not
    check_backends(cfg, problems, flags)                    # engine keys, --sglang-* / --router-*, LoRA, alarms
    check_job_paths(cfg, problems)                          # run dir, --load, --save, --ref-load, --hf-checkpoint
    check_environment(problems)                             # SLIME_ACTORS_* variables: values of their kind

Prompt files (docs/security.md, "Inputs"): every row is read once, in bounded memory (slime_actors.rows), and
checked: malformed rows (bad UTF-8, invalid JSON, no prompt, no label when --label-key is given, ...) are problems
naming file:line -- the first ten of each file, and how many more; rows larger than --prompt-data-max-row-bytes are
skipped unread and counted in a note. With `keep`, the rows checked are written as they are read to a temporary
file per prompt file (`cfg.checked_prompts`), which the head moves to RUN_DIR/checked-prompts/ (launch/prepare.py)
for the buffer: the file is parsed once per job.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping

from .. import startup_timeline as timeline
from ..config import JobConfig, Problems
from ..data import EVAL_SET, TRAIN_SET, eval_row_keys, train_row_keys
from ..json_files import not_regular
from ..rows import CheckedWriter, DataError, RowKeys, scan_rows, source_stamp


def check_prompt_files(cfg: JobConfig, problems: Problems, keep: bool = False, held_out: list | None = None
                       ) -> dict[str, int]:
    """Stream --prompt-data and every held-out set's file once (`held_out`: --eval-config's sets, as
    eval_config.check_eval_config returned them; None: --eval-prompt-data's); returns the usable prompts of each (by
    set name: "train", "eval-NAME"). With `keep`, `cfg.checked_prompts` names a temporary file per set holding the
    rows checked (`discard_checked` removes them)."""
    from ..eval_config import EvalSet, parse_eval_prompt_data
    data = cfg.data
    sets: list[tuple[str, str, str, RowKeys]] = []   # (set name, flag, path, keys)
    if data.prompt_data:
        sets.append((TRAIN_SET, "--prompt-data", data.prompt_data, train_row_keys(cfg)))
    from_file = held_out is not None   # (--eval-config's check said already which of its files are missing)
    if held_out is None:
        try:
            held_out = [EvalSet(name, path) for name, path in parse_eval_prompt_data(cfg.eval.eval_prompt_data)]
        except DataError as exc:
            problems.add(str(exc))
            held_out = []
    where = "--eval-config set" if from_file else "--eval-prompt-data"
    sets += [(EVAL_SET + es.name, f"{where} {es.name}", es.path, eval_row_keys(cfg, es)) for es in held_out]
    cap = data.prompt_data_max_row_bytes
    tmp = tempfile.mkdtemp(prefix="slime-actors-prompts-") if keep and sets else None
    counts: dict[str, int] = {}
    for name, flag, path, keys in sets:
        what = not_regular(path)
        if what == "no such file":
            if name != TRAIN_SET and not from_file:   # (--prompt-data's and --eval-config's own checks say so)
                problems.add(f"{flag}: {path} does not exist")
            continue
        if what is not None:
            problems.add(f"{flag}: {path} is {what}, not a .jsonl or .parquet file")
            continue
        writer = CheckedWriter(os.path.join(tmp, f"{name}.msgpack"), source_stamp(path, keys, cap)) if tmp else None
        try:
            scan = scan_rows(path, keys, cap, writer)
        except DataError as exc:
            problems.add(f"{flag}: {exc}")
            if writer is not None:
                writer.close(keep=False)
            continue
        if writer is not None:
            writer.close(keep=not scan.bad)
            if not scan.bad:
                cfg.checked_prompts[name] = writer.path
        for line in scan.error_lines():
            problems.add(f"{flag}: {line}")
        if not scan.good and not scan.bad:
            problems.add(f"{flag}: {path} holds no prompt ({scan.rows} rows, {scan.n_oversize} larger than "
                         f"--prompt-data-max-row-bytes {cap})")
        note = scan.oversize_note(cap)
        if note:
            cfg.notes.append(note)
        counts[name] = scan.good
        if scan.good:
            cfg.prompt_bytes_max = max(cfg.prompt_bytes_max or 0, scan.max_prompt_bytes)
    if tmp and not cfg.checked_prompts:
        os.rmdir(tmp)
    return counts


def discard_checked(cfg: JobConfig) -> None:
    """Remove the temporary files of the rows checked (a dry run, or a job that does not start)."""
    dirs = {os.path.dirname(p) for p in cfg.checked_prompts.values()}
    cfg.checked_prompts.clear()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def settle_reference(cfg: JobConfig) -> None:
    """--ref-load that is not a Hugging Face directory (slime's scripts pass their torch_dist checkpoint) with
    --use-kl-loss --kl-loss-coef 0 (slime's scripts again): the reference model changes nothing, so it is not
    loaded (--use-kl-loss is turned off) and the job says so. Where it is needed, prepare.reference_problem says why it
    cannot be read and how to convert it."""
    from ..checkpoints import detect_layout
    algorithm_cfg, ref = cfg.algorithm, cfg.model.ref_load
    if not ref or not algorithm_cfg.use_kl_loss or algorithm_cfg.kl_coef != 0 or algorithm_cfg.kl_loss_coef != 0:
        return
    lay = detect_layout(ref)
    if lay.kind != "hf":
        algorithm_cfg.use_kl_loss = False
        cfg.notes.append(f"--ref-load {ref} ({lay.detail}) is not loaded: with --kl-loss-coef 0 the KL term adds "
                         "nothing to the loss, so the job runs without a reference model (train/kl_loss is not "
                         "logged; to log it, convert the checkpoint: slime-actors convert "
                         f"{ref} OUT_DIR --hf-checkpoint MODEL_DIR, and give --ref-load OUT_DIR)")


def check_backends(cfg: JobConfig, problems: Problems, flags=None) -> None:
    """The engine keys (taken out of the config: `cfg.engine_user_keys`), the --sglang-* / --router-* passthrough
    (`flags`: parsed once, backends.sglang_launch.LaunchFlags; checked against SGLang's parser or its recorded
    table), the reward-hacking alarms' flags."""
    from ..backends.engine_auth import EngineKeyError, take_user_keys
    from ..backends.sglang_launch import SGLangFlagError, check_passthrough
    try:
        cfg.engine_user_keys = take_user_keys(cfg.engine)
    except EngineKeyError as exc:
        problems.add(str(exc))
    engine_cfg = cfg.engine
    if (engine_cfg.sglang_args or engine_cfg.router_args or engine_cfg.rollout_engine == "sglang"
            or engine_cfg.use_sglang_router):
        try:
            with timeline.phase("SGLang flag check"):   # (imports SGLang unless these flags passed before)
                check_passthrough(cfg, flags)
        except SGLangFlagError as exc:
            problems.add(str(exc))
    check_lora_flags(cfg, problems)
    check_monitor_flags(cfg, problems)


def check_lora_flags(cfg: JobConfig, problems: Problems) -> None:
    """--lora-target-modules / --lora-exclude-modules against the model's linear layers (built on the meta device
    from its config: nothing is read or allocated), all unknown names at once; the job then carries the resolved
    names (all-linear spelled out), so the trainer and the engines' --lora-target-modules agree."""
    lora_cfg = cfg.lora
    if lora_cfg.lora_rank <= 0 or not cfg.model.hf_checkpoint:
        return
    from ..backends.lora import SGLANG_LORA_TARGETS, LoraError, resolve_targets, spec_linear_names
    names = spec_linear_names(cfg.model.hf_checkpoint)
    if names is None:
        return   # no model to read: the path checks say so
    try:
        lora_cfg.lora_target_modules = resolve_targets(names, list(lora_cfg.lora_target_modules or ["all-linear"]),
                                                 lora_cfg.lora_exclude_modules)
    except LoraError as exc:
        problems.add(f"{exc} ({cfg.model.hf_checkpoint})")
        return
    odd = [t for t in lora_cfg.lora_target_modules if t not in SGLANG_LORA_TARGETS]
    if odd and lora_cfg.lora_sync == "adapter" and cfg.engine.rollout_engine == "sglang":
        problems.add(f"--lora-target-modules {' '.join(odd)}: SGLang serves no LoRA adapter on such modules (its "
                     f"--lora-target-modules: {' '.join(sorted(SGLANG_LORA_TARGETS))}); name others, or use "
                     "--lora-sync merged")
    if lora_cfg.lora_sync == "adapter" and cfg.engine.rollout_external_engine_addrs:
        cfg.notes.append("--lora-sync adapter with --rollout-external-engine-addrs: those engines must run with "
                         "--enable-lora --max-lora-rank >= --lora-rank, and read the adapter directories the rollout "
                         "workers write under RUN_DIR/lora (a shared file system); else use --lora-sync merged")


def check_monitor_flags(cfg: JobConfig, problems: Problems) -> None:
    """The reward-hacking alarms' flags against the monitor's own names, and where `stop` saves its checkpoint."""
    from ..monitor.hacking import ALARMS
    monitor_cfg = cfg.monitor   # (--hack-alarm-thresholds: the config parsed it, cfg.hack_thresholds)
    unknown = [a for a in monitor_cfg.hack_alarms_ignore or [] if a not in ALARMS]
    if unknown:
        problems.add(f"--hack-alarms-ignore: unknown alarm(s) {', '.join(unknown)}; the alarms are "
                     f"{', '.join(ALARMS)}")
    if monitor_cfg.hack_alarms == "stop" and not cfg.debug.debug_rollout_only:
        # the checkpoint saved when an alarm ends the run goes to --save, else to the rolling RUN_DIR/ckpt
        from ..checkpoints import rolling_conflict, save_root
        if save_root(cfg) is None:
            problems.add("--hack-alarms stop saves a checkpoint when an alarm ends the run, and with "
                         "--no-rolling-save and no --save this job keeps none: give --save DIR, or drop "
                         "--no-rolling-save (the rolling checkpoint RUN_DIR/ckpt takes it)")
        elif conflict := rolling_conflict(cfg):
            problems.add(f"--hack-alarms stop saves a checkpoint when an alarm ends the run, to the rolling "
                         f"RUN_DIR/ckpt without --save, but {conflict}: give --save DIR")


def check_environment(problems: Problems, environ: Mapping[str, str] | None = None) -> None:
    """Every SLIME_ACTORS_* variable set here (the job's processes inherit them) holds a value of its kind: a
    number where a number is wanted (SLIME_ACTORS_GC_WARN_MS=fast would otherwise stop every actor at its start)."""
    from ..env import ALL
    for var in ALL.values():
        try:
            var.get(environ)
        except ValueError as exc:
            problems.add(str(exc))


def check_job_paths(cfg: JobConfig, problems: Problems) -> None:
    """Every path the job reads or writes (launch/prepare.check_paths: run directory, --load, --save, --ref-load,
    --save-hf) and the model --hf-checkpoint names -- read only, nothing written."""
    from ..models import model_cache, resolve_checkpoint
    from .prepare import check_paths
    check_paths(cfg, problems)
    for flag, spec in (("--hf-checkpoint", cfg.model.hf_checkpoint),
                       ("--frozen-engine-checkpoint", cfg.engine.frozen_engine_checkpoint)):
        if spec and not spec.startswith(("tiny:", "smollm2:")):
            try:
                resolve_checkpoint(spec, model_cache(cfg.run.run_dir))   # a directory with config.json (no download)
            except (FileNotFoundError, ValueError) as exc:
                problems.add(str(exc).replace("--hf-checkpoint", flag))
