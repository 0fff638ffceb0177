"""What the head prints when a job starts -- what the job will be: device, engine, backend, parallelism, and where
slime's defaults differ (`start_lines`) -- and when it ends: steps and time, every rollback (a training group
restarted from a checkpoint: how many steps were trained again), held-out reward before and after (and which reward
graded it), the last rollout's best and worst sample, where the checkpoint, metrics, curves and traces are
(`print_summary`)."""

from __future__ import annotations

from pathlib import Path

from ..config import FIELDS, JobConfig

# slime's defaults for what a job runs on, where ours differ: (field, slime's value, what it means)
SLIME_RUNS_ON = (("device", "cuda", "CUDA"), ("rollout_engine", "sglang", "SGLang engines"),
                 ("train_backend", "megatron", "Megatron"))


def start_lines(cfg: JobConfig, sglang_flags) -> list[str]:
    """A few lines on what the job will be, printed before it starts (`sglang_flags`: its --sglang-* flags parsed,
    backends.sglang_launch.LaunchFlags). The first says what runs where; a second where it runs otherwise than a
    slime job by default (flags left at this project's defaults) and the flags to change that; then what the job
    ignores of the flags given."""
    eng, tr, ro = cfg.engine, cfg.train, cfg.rollout
    device = cfg.run.device
    ranks = tr.n_ranks
    if tr.train_backend == "megatron":
        dp = max(1, ranks // max(1, tr.tensor_model_parallel_size * tr.pipeline_model_parallel_size))
        parallel = (f"megatron backend: {ranks} rank{'s' * (ranks != 1)} (tensor {tr.tensor_model_parallel_size} x "
                    f"pipeline {tr.pipeline_model_parallel_size} x data {dp})")
    else:
        parallel = (f"torch backend: {ranks} rank{'s' * (ranks != 1)} ({tr.torch_parallel}"
                    f"{'' if device.startswith('cuda') else ', CPU processes'})")
    if cfg.debug.debug_train_only:
        engines = "no engines (--debug-train-only)"
    elif eng.rollout_external_engine_addrs:
        engines = f"{len(eng.rollout_external_engine_addrs)} external engine(s)"
    else:
        n = eng.rollout_num_engines
        engines = (f"{n} {'local' if eng.rollout_engine == 'local' else 'SGLang'} engine{'s' * (n != 1)}"
                   + (f" of {eng.rollout_num_gpus_per_engine} GPUs" if eng.rollout_num_gpus_per_engine > 1 else "")
                   + (" (colocated)" if eng.colocate else ""))
    lines = [f"job: {device}; {engines}; {parallel}; {cfg.run.num_rollout} steps of {ro.rollout_batch_size} prompts "
             f"x {ro.n_samples_per_prompt} samples"]
    ours = {"device": device, "rollout_engine": eng.rollout_engine, "train_backend": tr.train_backend}
    differs = [(name, theirs, what) for name, theirs, what in SLIME_RUNS_ON
               if name not in cfg.given and ours[name] != theirs]
    if differs:
        lines.append("slime runs " + ", ".join(what for _, _, what in differs) + " by default; here: "
                     + " ".join(f"{FIELDS[n].option} {theirs}" for n, theirs, _ in differs)
                     + " (docs/flags.md lists every default that differs)")
    if tr.train_backend == "torch" and (tr.tensor_model_parallel_size > 1 or tr.pipeline_model_parallel_size > 1):
        lines.append(f"--tensor-model-parallel-size {tr.tensor_model_parallel_size} / "
                     f"--pipeline-model-parallel-size {tr.pipeline_model_parallel_size} are the megatron backend's; "
                     f"the torch backend ignores them ({tr.torch_parallel}: "
                     + ("each rank holds the whole model" if tr.torch_parallel == "ddp" else "the model is sharded "
                        "over the ranks") + ") -- --train-backend megatron for tensor/pipeline parallelism"
                     + ("" if tr.torch_parallel == "fsdp" else ", or --torch-parallel fsdp to shard"))
    if eng.rollout_engine == "local" and not eng.rollout_external_engine_addrs and eng.sglang_args:
        from ..backends.sglang_launch import local_engine_ignores
        ignored = local_engine_ignores(sglang_flags)
        if ignored:
            lines.append(f"the local engine ignores {', '.join(ignored)} (SGLang's own settings; "
                         "--rollout-engine sglang uses them)")
    return lines


def print_summary(result: dict, run_dir: Path) -> None:
    print("")
    print(f"done: {result['steps']} steps in {result['seconds']} s, weight version {result['weight_version']}")
    if result.get("started_from"):
        sf = result["started_from"]
        print(f"resumed: from {sf['checkpoint']} (rollout {sf['rollout']})" + (
            f"; {sf['retrained']} rollout(s) the previous attempt trained after it are trained again"
            if sf.get("retrained") else ""))
    for line in rollback_lines(result.get("recoveries") or []):
        print(line)
    for name in sorted(set(result.get("eval_before", {})) | set(result.get("eval_after", {}))):
        b = result.get("eval_before", {}).get(name)
        a = result.get("eval_after", {}).get(name)
        delta = f"{a - b:+.3f}" if a is not None and b is not None else "?"
        grader = result.get("eval_graders", {}).get(name)
        print(f"held-out reward [{name}]: before {b if b is None else f'{b:.3f}'} -> after "
              f"{a if a is None else f'{a:.3f}'} ({delta})" + (f"   graded by {grader}" if grader else ""))
    if result.get("samples"):
        from ..samples import format_examples
        last = result["samples"]
        print(format_examples(last["rollout_id"], last["examples"], kind="last rollout"))
    if result.get("stopped"):
        st = result["stopped"]
        print(f"stopped early after rollout {st['rollout_id']} ({st['steps_left']} steps left): {st['reason']}")
        print(f"checkpoint: {st['checkpoint']}   (resume with --load; read the samples first: "
              f"slime-actors samples {run_dir} --rollout {st['rollout_id']})")
    from ..monitor.alarms import ALARMS_FILE
    alarms = run_dir / ALARMS_FILE
    if alarms.exists() and alarms.stat().st_size:
        n = sum(1 for line in alarms.read_text().splitlines() if line.strip())
        print(f"alarms:  {alarms}   ({n} reward-hacking alarm(s) tripped; docs/debugging.md section 3)")
    if result.get("checkpoint"):
        ck = Path(result["checkpoint"])
        print(f"checkpoint: {ck}" + (f"   (rolling: the newest only; slime-actors convert {ck.parent} OUT_DIR gives "
                                     "a Hugging Face directory)" if result.get("rolling_checkpoint") else ""))
    print(f"metrics: {result['metrics']}")
    if result.get("plot"):
        print(f"curves:  {result['plot']}")
    print(f"traces:  {run_dir / 'traces'}   (slime-actors trace summary {run_dir})")


def rollback_lines(recoveries: list[dict]) -> list[str]:
    """One line per training-group restart: where it failed, the checkpoint it went back to, the steps trained
    again."""
    out = []
    for rec in recoveries:
        failed, back = rec.get("failed_at_rollout"), rec.get("resumed_from")
        again = len((rec.get("buffer") or {}).get("trained_rollouts_discarded") or [])
        lost = f"{failed - back} step(s) redone" if isinstance(failed, int) and isinstance(back, int) else "?"
        src = Path(rec["checkpoint"]).name if rec.get("checkpoint") else "the initial weights (no checkpoint)"
        out.append(f"rolled back: at rollout {failed}, the training group restarted from {src} (rollout {back}): "
                   f"{lost}, {again} trained rollout(s) discarded and trained again -- {rec.get('reason', '')}"[:400])
    return out
