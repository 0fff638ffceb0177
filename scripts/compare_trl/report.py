"""The comparison's report, from the runs the driver left in WORK (run.py), or any runs of the same layout.

    files = build_report("runs/compare_trl", "runs/compare_trl/report", ["ours-local", "trl"])
    python -m scripts.compare_trl.report WORK OUT NAME [NAME ...]

WORK holds job.json (the job both sides ran), util.csv (sampler.py), and one folder per run: ours-* (a slime-actors
run directory: metrics.jsonl, evals/, traces/) and trl (trl_job.py's trl_metrics.jsonl and evals/), each with the
driver's run_info.json (launch time, exit status). Written to OUT:

    report.md              the tables: per framework, held-out accuracy per evaluation, our step split, TRL's
                           step split, utilisation, the differences between the two jobs, held-out responses
    summary.json           every number in report.md, per run and per step
    accuracy_vs_time.png   held-out accuracy against training wall-clock (and against steps), all runs
    gpu_util.png           GPU utilisation and memory during each run
    step_timeline.png      one of our steps (the median one) as the traces show it, one row per actor

Definitions (the report repeats them):
  step time        one optimizer step, without the held-out evaluation after it (ours: the controller's step less
                   its evaluation; TRL: from the end of one step to the end of the next, less the evaluation)
  training wall-clock   the sum of the step times so far; an evaluation after step k sits at the wall-clock of step k
  samples/s, generated tokens/s   all the steps' samples (responses) and response tokens over their summed time
  time to first step    from the launch of the run's process to the end of its first step, less the evaluation
                   before it (model loading and conversion of the GGUF file happen before either run: not counted)
  peak GPU memory  the largest device memory in use while the run ran (the sampler's reading of the whole GPU)
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from slime_actors.traces.summary import percentile

from .sampler import read_samples
from .split import (TAIL, SplitError, eval_before_first_step, orchestration_by_message, read_metrics, rollout_tail,
                    step_split, step_window, trace_intervals)


class ReportError(ValueError):
    """A run folder or file that cannot be read as the report expects: the message names it."""


@dataclass
class Run:
    name: str
    framework: str                      # ours | trl
    label: str
    steps: list[dict] = field(default_factory=list)    # {step, seconds, samples, gen_tokens, reward_mean, end}
    evals: list[dict] = field(default_factory=list)    # {step, accuracy, n}
    info: dict = field(default_factory=dict)           # run_info.json
    time_to_first_step: float | None = None
    first_step_note: str = ""
    split: list[dict] = field(default_factory=list)
    split_notes: list[str] = field(default_factory=list)
    by_message: dict = field(default_factory=dict)     # our orchestration by message, mean s per step (traces)
    tail: dict = field(default_factory=dict)           # the end of a rollout: split.rollout_tail (traces)
    torch_peak_gib: float | None = None
    notes: list[str] = field(default_factory=list)
    util: list[dict] = field(default_factory=list)
    questions: dict[int, list[str]] = field(default_factory=dict)   # step -> its prompts (TRL: its reward calls)
    procs: dict = field(default_factory=dict)          # proctree.json: the run's processes' memory and CPU
    alone: dict = field(default_factory=dict)          # alone.json: our steps' parts measured alone


# ------------------------------------------------------------------------------------------------ reading
def _read_json(path: Path) -> dict:
    try:
        v = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise ReportError(f"{path}: not JSON ({exc})") from None
    if not isinstance(v, dict):
        raise ReportError(f"{path}: expected a JSON object")
    return v


def load_evals(run_dir: Path) -> list[dict]:
    """Held-out evaluations from RUN/evals/heldout_stepNNNNNN.jsonl: accuracy = the mean reward (0 or 1 each)."""
    out = []
    d = run_dir / "evals"
    if not d.is_dir():
        return out
    for p in sorted(d.glob("heldout_step*.jsonl")):
        try:
            step = int(p.stem.rsplit("step", 1)[1])
        except ValueError:
            continue
        rewards = []
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError:
                raise ReportError(f"{p}:{i}: not a JSON line") from None
            if isinstance(r, dict) and r.get("reward") is not None:
                rewards.append(float(r["reward"]))
        if rewards:
            out.append({"step": step, "accuracy": sum(rewards) / len(rewards), "n": len(rewards)})
    return sorted(out, key=lambda e: e["step"])


def load_ours(run_dir: Path, name: str) -> Run:
    info = _read_json(run_dir / "run_info.json")
    engine, backend = info.get("engine", "?"), info.get("backend", "?")
    if engine == "?" and name.startswith("ours-"):
        parts = name[5:].split("-")
        engine, backend = parts[0], parts[1] if len(parts) > 1 else "torch"
    run = Run(name, "ours", f"ours ({engine} engine, {backend} backend)", info=info)
    try:
        rows = read_metrics(run_dir)
    except SplitError as exc:
        run.notes.append(str(exc))
        rows = []
    for r in rows:
        lo, hi = step_window(r)
        n = float(r.get("rollout/samples") or 0)
        run.steps.append({"step": r["rollout_id"] + 1, "seconds": hi - lo, "samples": n,
                          "gen_tokens": n * float(r.get("rollout/response_len_mean") or 0.0),
                          "reward_mean": r.get("rollout/reward_mean"), "end": hi,
                          "sync": float(r.get("time/weight_sync") or 0.0)})
    run.alone = _read_optional(run_dir / "alone.json")
    run.evals = load_evals(run_dir)
    if not run.evals:  # no saved responses: the metrics' eval/heldout (no step 0 there)
        run.evals = [{"step": r["rollout_id"] + 1, "accuracy": float(r["eval/heldout"]), "n": None}
                     for r in rows if r.get("eval/heldout") is not None]
    if rows:
        try:
            run.split, run.split_notes = step_split(run_dir, rows)
            if run.split and run.split[0]["source"] == "traces":
                iv = trace_intervals(run_dir)
                run.by_message = orchestration_by_message(run_dir, rows, iv)
                run.tail = rollout_tail(run_dir, rows, iv)
        except SplitError as exc:
            run.split_notes.append(str(exc))
        if info.get("t_launch"):
            ev0 = eval_before_first_step(run_dir, rows)
            t = run.steps[0]["end"] - float(info["t_launch"])
            if ev0 is None:
                run.first_step_note = "includes the evaluation before it (no traces to measure it)"
            else:
                t -= ev0
            run.time_to_first_step = t
    return run


def load_trl(run_dir: Path, name: str) -> Run:
    info = _read_json(run_dir / "run_info.json")
    run = Run(name, "trl", "TRL GRPOTrainer (transformers generate)", info=info)
    path = run_dir / "trl_metrics.jsonl"
    rows = []
    if path.exists():
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError:
                if i == len(path.read_text().splitlines()):
                    continue  # a torn last line of a stopped run
                raise ReportError(f"{path}:{i}: not a JSON line") from None
    else:
        run.notes.append(f"{path}: no such file (the TRL run ended before it started training: see console.log)")
    start = next((r for r in rows if r.get("kind") == "start"), {})
    t_launch = start.get("t_launch") or info.get("t_launch")
    eval_secs = {}
    for r in rows:
        k = r.get("kind")
        if k == "step":
            run.steps.append({"step": int(r["step"]), "seconds": float(r["step_seconds"]),
                              "samples": float(r.get("samples") or 0), "gen_tokens": float(r.get("gen_tokens") or 0),
                              "reward_mean": r.get("reward_mean"), "end": float(r["time"])})
            if isinstance(r.get("questions"), list):
                run.questions[int(r["step"])] = [str(q) for q in r["questions"]]
            gen, rew = float(r.get("generation_seconds") or 0), float(r.get("reward_seconds") or 0)
            prep = float(r.get("prepare_seconds") or 0)
            wall = float(r["step_seconds"])
            run.split.append({"step": int(r["step"]), "wall": wall, "generation": gen, "reward": rew,
                              "scoring": max(0.0, prep - gen - rew), "training": max(0.0, wall - prep),
                              "source": "timers"})
        elif k == "eval":
            eval_secs[int(r["step"])] = float(r.get("seconds") or 0)
        elif k == "end":
            run.torch_peak_gib = r.get("max_memory_reserved_gib")
    run.evals = load_evals(run_dir) or sorted(
        ({"step": int(r["step"]), "accuracy": float(r["accuracy"]), "n": r.get("n")} for r in rows
         if r.get("kind") == "eval"), key=lambda e: e["step"])
    if run.steps and t_launch:
        run.time_to_first_step = run.steps[0]["end"] - float(t_launch) - eval_secs.get(0, 0.0)
        if 0 not in eval_secs:
            run.first_step_note = "includes the evaluation before it"
    return run


def _read_optional(path: Path) -> dict:
    """A JSON object the run may not have (an older run, a measurement that failed): {} then."""
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def load_run(work: Path, name: str) -> Run:
    d = work / name
    if not d.is_dir():
        run = Run(name, "trl" if name == "trl" else "ours", name)
        run.notes.append(f"{d}: no such run folder (the run did not start)")
        return run
    run = load_trl(d, name) if name == "trl" or (d / "trl_metrics.jsonl").exists() else load_ours(d, name)
    run.procs = _read_optional(d / "proctree.json")
    return run


def bound_ratio(run: Run) -> tuple[float | None, int]:
    """Our steps against their irreducible parts measured alone (alone.json, bench/step_split.py --alone): per step
    k, its time / (generating its batch alone + its RL update alone + its weight sync), the median over the steps
    measured; and how many. The goal: at most 1.3."""
    a = run.alone
    ids, gen, train = a.get("rollout_ids") or [], a.get("generation") or [], a.get("train") or []
    by_step = {s["step"]: s for s in run.steps}
    ratios = []
    for k, g, t in zip(ids, gen, train):
        s = by_step.get(int(k) + 1)
        if s is not None and g + t + s.get("sync", 0.0) > 0:
            ratios.append(s["seconds"] / (g + t + s.get("sync", 0.0)))
    return (statistics.median(ratios) if ratios else None), len(ratios)


def same_prompts(work: Path, ours: Run, trl: Run) -> tuple[int, list[str]]:
    """(steps compared, differences): each of TRL's questions of step k must be among the prompts our buffer
    received for rollout k-1 (its trace), and the two steps must have as many prompts."""
    if not trl.questions:
        return 0, []
    try:
        from slime_actors.sample_display import prompt_text
        from slime_actors.samples import load_from_traces
        rollouts, _, _ = load_from_traces(work / ours.name)
    except Exception as exc:
        return 0, [f"{ours.name}: its trace could not be read ({type(exc).__name__}: {exc})"]
    checked, diffs = 0, []
    for step, qs in sorted(trl.questions.items()):
        samples = rollouts.get(step - 1)
        if not samples:
            continue
        ours_prompts = {prompt_text(s.prompt) for s in samples}
        checked += 1
        missing = [q for q in qs if not any(q in p for p in ours_prompts)]
        if missing or len(ours_prompts) != len(qs):
            diffs.append(f"step {step}: {len(qs)} prompts in TRL, {len(ours_prompts)} in {ours.name}; "
                         f"not in {ours.name}: {missing[:3]}")
    return checked, diffs


def attach_util(runs: list[Run], samples: list[dict]) -> str | None:
    for run in runs:
        run.util = [s for s in samples if s["run"] == run.name]
    sources = sorted({s["source"] for s in samples})
    return sources[0] if len(sources) == 1 else (", ".join(sources) if sources else None)


# ------------------------------------------------------------------------------------------------ numbers


def eval_positions(run: Run) -> list[tuple[float, int, float]]:
    """(training wall-clock, step, accuracy) of each evaluation: one after step k sits at the sum of steps 1..k."""
    cum = {0: 0.0}
    t = 0.0
    for s in sorted(run.steps, key=lambda s: s["step"]):
        t += s["seconds"]
        cum[s["step"]] = t
    return [(cum[e["step"]], e["step"], e["accuracy"]) for e in run.evals if e["step"] in cum]


def accuracy_at_time(run: Run, t: float) -> tuple[float, int] | None:
    """(accuracy, its step) of the last evaluation at or before training wall-clock t."""
    best = None
    for pos, step, acc in eval_positions(run):
        if pos <= t + 1e-9 and (best is None or pos >= best[0]):
            best = (pos, step, acc)
    return None if best is None else (best[2], best[1])


def run_metrics(run: Run, job: dict) -> dict:
    secs = [s["seconds"] for s in run.steps]
    total = sum(secs)
    m = {"steps": len(run.steps), "steps_wanted": job.get("steps"), "train_seconds": total,
         "step_median_s": statistics.median(secs) if secs else None, "step_p90_s": percentile(secs, 90),
         "samples_per_s": sum(s["samples"] for s in run.steps) / total if total > 0 else None,
         "tokens_per_s": sum(s["gen_tokens"] for s in run.steps) / total if total > 0 else None,
         "time_to_first_step_s": run.time_to_first_step, "time_to_first_step_note": run.first_step_note,
         "accuracy_before": next((e["accuracy"] for e in run.evals if e["step"] == 0), None),
         "rc": run.info.get("rc"), "timed_out": run.info.get("timed_out", False)}
    if run.util:
        m["util_mean_pct"] = statistics.fmean(s["util_pct"] for s in run.util)
        m["peak_mem_gib"] = max(s["mem_used_mib"] for s in run.util) / 1024.0
        m["util_source"] = run.util[0]["source"]
    else:
        m["util_mean_pct"] = m["peak_mem_gib"] = None
    if run.torch_peak_gib is not None:
        m["torch_peak_reserved_gib"] = run.torch_peak_gib
    if run.procs.get("peak_pss_mib"):
        m["proc_peak_pss_gib"] = float(run.procs["peak_pss_mib"]) / 1024.0
        m["proc_peak_split_mib"] = run.procs.get("peak_split_mib", {})
        m["proc_cpu_s"] = {r["name"]: r["cpu_s"] for r in run.procs.get("roles", [])}
    if run.framework == "ours":
        m["bound_ratio"], m["bound_steps"] = bound_ratio(run)
    if run.split:
        walls = [r["wall"] for r in run.split]
        tot = sum(walls)
        if tot > 0:
            keys = [k for k in ("generation", "reward", "scoring", "training", "weight_update", "messaging", "idle",
                                "messaging+idle", "orchestration") if any(r.get(k) is not None for r in run.split)]
            m["split_share"] = {k: sum(float(r.get(k) or 0.0) for r in run.split) / tot for k in keys}
            m["split_mean_s"] = {k: sum(float(r.get(k) or 0.0) for r in run.split) / len(run.split) for k in keys}
            if run.by_message:
                m["orchestration_by_message_s"] = dict(run.by_message)
            if run.tail:
                m["rollout_tail_s"] = dict(run.tail)
            if run.framework == "ours":
                shares = [r["orchestration"] / r["wall"] for r in run.split if r["wall"] > 0]
                m["orchestration_share_median"] = statistics.median(shares) if shares else None
                m["orchestration_share_max"] = max(shares) if shares else None
    return m


# which way is better, for the ratio column: -1 lower is better, +1 higher is better, 0 neither
DIRECTION = {"step_median_s": -1, "step_p90_s": -1, "samples_per_s": 1, "tokens_per_s": 1, "peak_mem_gib": -1,
             "proc_peak_pss_gib": -1,
             "time_to_first_step_s": -1, "acc_equal_steps": 1, "acc_equal_time": 1, "util_mean_pct": 0,
             "train_seconds": -1}


def compare(runs: list[Run], job: dict) -> dict:
    """Per-run metrics plus the equal-steps and equal-wall-clock accuracies and each of ours / TRL."""
    metrics = {r.name: run_metrics(r, job) for r in runs}
    with_evals = [r for r in runs if r.evals]
    common = set.intersection(*(set(e["step"] for e in r.evals) for r in with_evals)) if with_evals else set()
    equal_step = max(common) if common else None
    finished = [r for r in runs if r.steps]
    equal_time = min(sum(s["seconds"] for s in r.steps) for r in finished) if finished else None
    for r in runs:
        m = metrics[r.name]
        m["acc_equal_steps"] = next((e["accuracy"] for e in r.evals if e["step"] == equal_step), None)
        at = accuracy_at_time(r, equal_time) if equal_time is not None else None
        m["acc_equal_time"], m["acc_equal_time_step"] = (at if at else (None, None))
    ratios = {}
    trl = next((r for r in runs if r.framework == "trl"), None)
    if trl is not None:
        for r in runs:
            if r.framework != "ours":
                continue
            ratios[r.name] = {}
            for k in DIRECTION:
                a, b = metrics[r.name].get(k), metrics[trl.name].get(k)
                ratios[r.name][k] = a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b \
                    else None
    return {"metrics": metrics, "equal_step": equal_step, "equal_time_s": equal_time, "ratios": ratios}


# ------------------------------------------------------------------------------------------------ writing
def _f(v, digits: int = 2, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}{unit}"
    return f"{v}{unit}"


def _ratio(key: str, v) -> str:
    if v is None:
        return "n/a"
    d = DIRECTION.get(key, 0)
    if d == 0 or abs(v - 1.0) < 0.005:
        return f"{v:.2f}"
    better = (v < 1) if d < 0 else (v > 1)
    return f"{v:.2f} ({'ours' if better else 'TRL'} better)"


def differences(job: dict) -> list[str]:
    """What differs between the two jobs, and what is the same on purpose."""
    p = job.get("precision", "fp32")
    tf32 = (" The matmuls in TF32 on the GPU: ours --tf32 (the trainer) and --sglang-enable-tf32-matmul (the local "
            "engine's generation; SGLang's is float16), TRL tf32=True (torch's allow_tf32 in its one process: "
            "training and generation)."
            if p == "tf32" else "")
    return [
        f"Same: model directory, prompts and their order (step k trains on the same {job.get('prompts')} prompts "
        f"on both sides), group size {job.get('group')}, one optimizer step per rollout in micro batches of "
        f"{job.get('micro_batch')}, lr {job.get('lr')} constant (TRL's default linear decay turned off), AdamW "
        f"betas (0.9, 0.98), eps 1e-8, no weight decay, gradient clipping 1.0, PPO clip {job.get('clip')}, KL "
        f"coefficient {job.get('kl')} against the initial weights, temperature {job.get('temperature')}, top-p 1, "
        f"no top-k, {job.get('max_len')} response tokens at most, GRPO advantages (group mean and std), "
        "per-sample mean of token losses then mean over samples (TRL loss_type='grpo'; its default is 'dapo'), "
        + ("gradient checkpointing on both sides (ours --gradient-checkpointing, TRL's default), "
           if job.get("gradient_checkpointing") else "no gradient checkpointing (TRL's default turns it on), ")
        + "the same strict math reward (our "
        "slime_actors.rewards.rules.math_reward, called from TRL's reward function), greedy held-out evaluation "
        f"on the same {job.get('heldout_n')} prompts every {job.get('eval_every')} steps and before training.",
        ("Precision: fp32 weights, optimizer and generation on both sides: fp32 is the precision both sides share."
         + (" Except SGLang's generation: SGLang cannot generate in float32 (sgl-kernel's rmsnorm has no float32 "
            "kernel), so the sglang modes generate in float16 (--sglang-dtype float16, what SGLang's dtype auto "
            "picks for a float32 checkpoint) while their trainer is fp32; the rollout log-probs are float16 ones."
            if "sglang" in str(job.get("ours_modes", "")) else "") + tf32) if p in ("fp32", "tf32") else
        ("Precision bf16: both sides train in mixed precision, bf16 autocast over fp32 weights and optimizer "
         "states (ours --bf16, TRL bf16=True); our engine generates in bf16 (it gets bf16 weights), TRL's "
         "generate runs on its training model."),
        "Generation: ours by its engine (continuous batching; the local engine or SGLang), a separate process that "
        "gets the new weights after each step (CUDA IPC on one GPU); TRL by transformers `generate` on the training "
        "model (static batch, left-padded, until every sequence ends or hits the limit). Random streams differ: "
        "the same prompts, not the same samples.",
        "KL estimator: both k3 (exp(ref - logp) - (ref - logp) - 1); ours clamps it to [-10, 10] (low_var_kl).",
        "Advantage: (r - mean) / (std + eps), unbiased std on both; eps 1e-6 (ours) vs 1e-4 (TRL). A group with "
        "identical rewards gets 0 on both.",
        "Old log-probs: on-policy on both (one optimizer step per rollout): both use the training forward's own "
        "log-probs, detached (ratio 1 by construction; ours before this project's issue 33 ran a forward of "
        "their own).",
        "Response tokens: TRL counts the end-of-sequence token in a completion; ours counts what the engine "
        "returned. Generated tokens/s uses each side's own count.",
        "Held-out evaluation: ours by the rollout engine (greedy, the same batching as the rollout); TRL by our "
        "callback calling `generate` (greedy) on the training model in batches of up to 256 prompts. Evaluation "
        "time is left out of every step time and of the wall-clock axis on both sides.",
        "vLLM: TRL's fastest generation (use_vllm=True, vllm_mode='colocate') was not run. The newest vLLM (0.33.0) "
        "pins torch==2.14.0 and transformers<5.21, so installing it would replace the GPU image's torch 2.11 that "
        "both frameworks run on here; no vLLM build for that torch was checked to fit. TRL's numbers here are its "
        "default generation only.",
    ]


def _metric_rows(runs: list[Run], cmp: dict, job: dict) -> list[str]:
    names = [r.name for r in runs]
    ours = [n for n in cmp["ratios"]]
    trl = next((r.name for r in runs if r.framework == "trl"), None)
    head = "| | " + " | ".join(names) + "".join(f" | {o} / {trl}" for o in ours) + " |"
    lines = [head, "|---" * (1 + len(names) + len(ours)) + "|"]
    M = cmp["metrics"]
    src = next((M[n].get("util_source") for n in names if M[n].get("util_source")), None)
    mem_label = "peak host memory in use (GiB; no GPU)" if src == "host" else "peak GPU memory (GiB, whole device)"
    util_label = "mean host CPU utilisation (%; no GPU)" if src == "host" else "mean GPU utilisation (%)"
    es, et = cmp["equal_step"], cmp["equal_time_s"]
    spec = [
        ("steps finished", None, lambda m: f"{m['steps']} of {m['steps_wanted']}" +
         (" (stopped at its time limit)" if m.get("timed_out") else "")),
        ("step time, median (s)", "step_median_s", lambda m: _f(m["step_median_s"])),
        ("step time, p90 (s)", "step_p90_s", lambda m: _f(m["step_p90_s"])),
        ("samples/s", "samples_per_s", lambda m: _f(m["samples_per_s"], 1)),
        ("generated tokens/s", "tokens_per_s", lambda m: _f(m["tokens_per_s"], 0)),
        (mem_label, "peak_mem_gib", lambda m: _f(m["peak_mem_gib"])),
        ("peak memory of the run's processes (GiB, host PSS)", "proc_peak_pss_gib",
         lambda m: _f(m.get("proc_peak_pss_gib"))),
        (util_label, "util_mean_pct", lambda m: _f(m["util_mean_pct"], 0)),
        ("time to first step (s)", "time_to_first_step_s",
         lambda m: _f(m["time_to_first_step_s"], 1) + ("*" if m.get("time_to_first_step_note") else "")),
        ("training wall-clock, all steps (s)", "train_seconds", lambda m: _f(m["train_seconds"], 1)),
        ("step / its parts alone (generation + update + weight sync; goal <= 1.3)", None,
         lambda m: (_f(m.get("bound_ratio")) + (f" ({m['bound_steps']} steps)" if m.get("bound_steps") else "")
                    if m.get("bound_ratio") is not None else ("n/a" if "bound_ratio" in m else ""))),
        ("held-out accuracy before training", None, lambda m: _f(m["accuracy_before"], 3)),
        (f"held-out accuracy at equal steps (step {es})", "acc_equal_steps", lambda m: _f(m["acc_equal_steps"], 3)),
        (f"held-out accuracy at equal wall-clock ({_f(et, 1)} s)", "acc_equal_time",
         lambda m: _f(m["acc_equal_time"], 3) + (f" (step {m['acc_equal_time_step']})"
                                                 if m.get("acc_equal_time_step") is not None else "")),
    ]
    for label, key, fn in spec:
        cells = [fn(M[n]) for n in names]
        rat = [_ratio(key, cmp["ratios"][o].get(key)) if key else "" for o in ours]
        lines.append(f"| {label} | " + " | ".join(cells) + "".join(f" | {x}" for x in rat) + " |")
    return lines


def _split_tables(runs: list[Run], cmp: dict) -> list[str]:
    out = []
    for r in runs:
        if not r.split:
            continue
        m = cmp["metrics"][r.name]
        share, mean = m.get("split_share", {}), m.get("split_mean_s", {})
        if r.framework == "ours":
            src = r.split[0]["source"]
            out += [f"**{r.name}** -- from its {'traces' if src == 'traces' else 'metrics (no traces)'}, "
                    f"{len(r.split)} steps, mean step {_f(statistics.fmean(x['wall'] for x in r.split))} s:", ""]
            names = ("generation", "reward", "messaging", "training", "weight_update", "idle") if src == "traces" \
                else ("generation", "training", "weight_update", "messaging+idle")
            labels = {"generation": "generation", "reward": "reward (not overlapped by generation)",
                      "messaging": "buffer / actor messaging", "training": "training compute",
                      "weight_update": "weight update", "idle": "idle", "messaging+idle": "messaging + idle"}
        else:
            out += [f"**{r.name}** -- from timers around GRPOTrainer's methods, {len(r.split)} steps, mean step "
                    f"{_f(statistics.fmean(x['wall'] for x in r.split))} s:", ""]
            names = ("generation", "reward", "scoring", "training")
            labels = {"generation": "generation (`_generate`)", "reward": "reward (`_calculate_rewards`)",
                      "scoring": "reference log-probs, padding, advantages (rest of `_generate_and_score_completions`)",
                      "training": "training compute (forward, backward, optimizer; with the Trainer's bookkeeping)"}
        out += ["| part | mean s per step | share of the step |", "|---|---:|---:|"]
        for k in names:
            out.append(f"| {labels[k]} | {_f(mean.get(k), 3)} | {_f(100 * share[k] if k in share else None, 1)} % |")
        if r.framework == "ours":
            out.append(f"| **orchestration** (all but generation, training, weight update) | "
                       f"{_f(mean.get('orchestration'), 3)} | **{_f(100 * share.get('orchestration', 0), 2)} %** "
                       f"(per step: median {_f(100 * (m.get('orchestration_share_median') or 0), 2)} %, max "
                       f"{_f(100 * (m.get('orchestration_share_max') or 0), 2)} %) |")
        if r.by_message:
            out += ["", f"{r.name}'s orchestration by message (each moment outside generation, training and the "
                    "weight update goes to the scoring or the message that covers it; ms per step):", "",
                    "| where | ms per step |", "|---|---:|"]
            out += [f"| {k} | {1000 * v:.2f} |" for k, v in list(r.by_message.items())[:BY_MESSAGE_ROWS]]
            rest = sum(list(r.by_message.values())[BY_MESSAGE_ROWS:])
            if rest:
                out.append(f"| (the rest) | {1000 * rest:.2f} |")
        if r.tail:
            out += ["", f"{r.name}: the end of a rollout, from its last generation to the trainer's update (mean ms "
                    "after the last generation ended):", "", "| when | ms |", "|---|---:|"]
            out += [f"| {label} | {1000 * r.tail[k]:.2f} |" for k, label in TAIL if k in r.tail]
        for n in r.split_notes:
            out.append(f"\nnote: {n}")
        out.append("")
    return out


BY_MESSAGE_ROWS = 8


def _responses(runs: list[Run], work: Path, n: int = 5, width: int = 160) -> list[str]:
    """The first n held-out prompts: each run's answer before training and at its last evaluation."""
    out = []
    questions = {}
    held = work / "data" / "heldout_eval.jsonl"
    if held.exists():
        for i, line in enumerate(held.read_text().splitlines()):
            try:
                questions[i] = _prompt(json.loads(line).get("messages"))
            except (ValueError, AttributeError):
                continue
    for r in runs:
        d = work / r.name / "evals"
        if not r.evals or not d.is_dir():
            continue
        first, last = r.evals[0]["step"], r.evals[-1]["step"]
        rows = {}
        for step in (first, last):
            p = d / f"heldout_step{step:06d}.jsonl"
            if p.exists():
                rows[step] = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
                rows[step].sort(key=lambda x: x.get("index", 0))
        if first not in rows or last not in rows:
            continue
        out += [f"**{r.name}**: step {first} -> step {last}", "",
                f"| prompt | label | step {first} | reward | step {last} | reward |", "|---|---|---|---|---|---|"]
        for a, b in list(zip(rows[first], rows[last]))[:n]:
            q = questions.get(a.get("index"), _prompt(a.get("prompt")))
            out.append(f"| {_cell(q, 60)} | {a.get('label')} | {_cell(a.get('response'), width)}"
                       f" | {_f(a.get('reward'), 0)} | {_cell(b.get('response'), width)} | {_f(b.get('reward'), 0)} |")
        out.append("")
    return out


def _prompt(p) -> str:
    if isinstance(p, list):
        return " ".join(str(m.get("content", "")) for m in p if isinstance(m, dict) and m.get("role") == "user")
    return str(p)


def _cell(text, width: int) -> str:
    s = " ".join(str(text or "").split()).replace("|", "\\|")
    return s if len(s) <= width else s[:width - 1] + "…"


def render_markdown(runs: list[Run], cmp: dict, job: dict, work: Path, images: dict) -> str:
    L = ["# Our GRPO job against TRL's GRPOTrainer, side by side", ""]
    L.append(f"Job: `{job.get('model')}` on task `{job.get('task')}` ({job.get('train_size')} train / "
             f"{job.get('heldout_size')} held-out prompts, seed {job.get('data_seed')}; evaluation on the first "
             f"{job.get('heldout_n')}), {job.get('steps')} steps of {job.get('prompts')} prompts x "
             f"{job.get('group')} samples, responses up to {job.get('max_len')} tokens, device "
             f"`{job.get('device')}`, precision {job.get('precision')}.")
    L += ["", "## Per framework", ""]
    L += _metric_rows(runs, cmp, job)
    L += ["", "Ratios are ours / TRL; \"better\" says which side the row favours. Step times leave out the held-out "
              "evaluations; samples/s and tokens/s are over the summed step times. Accuracy at equal wall-clock: each "
              "run's last evaluation at or before the shorter run's training wall-clock."]
    trl_name = next((r.name for r in runs if r.framework == "trl"), "trl")
    for name, sp in cmp.get("same_prompts", {}).items():
        n, diffs = sp["steps_compared"], sp["differences"]
        if n and not diffs:
            L.append(f"\nPrompts: {name} and {trl_name} trained on the same prompts in each of the {n} steps "
                     "compared (our buffer's trace against TRL's reward calls).")
        elif diffs:
            L.append(f"\n**Prompts differ** between {name} and {trl_name}: " + "; ".join(diffs[:5]))
        else:
            L.append(f"\nPrompts: not compared for {name} (no trace of its rollouts, or no TRL step log).")
    if any(cmp["metrics"][r.name].get("time_to_first_step_note") for r in runs):
        L.append("\n\\* " + "; ".join(f"{r.name}: {cmp['metrics'][r.name]['time_to_first_step_note']}" for r in runs
                                     if cmp["metrics"][r.name].get("time_to_first_step_note")))
    for r in runs:
        m = cmp["metrics"][r.name]
        if m.get("torch_peak_reserved_gib") is not None:
            L.append(f"\n{r.name}: torch's own peak reserved memory in its process: "
                     f"{_f(m['torch_peak_reserved_gib'])} GiB.")
        if m.get("proc_peak_split_mib"):
            split = ", ".join(f"{k} {v:.0f}" for k, v in sorted(m["proc_peak_split_mib"].items(),
                                                               key=lambda kv: -kv[1]))
            cpu = ", ".join(f"{k} {v:.1f}" for k, v in sorted(m.get("proc_cpu_s", {}).items(), key=lambda kv: -kv[1]))
            L.append(f"\n{r.name}: host memory (PSS, MiB) of its processes at their peak: {split}; CPU seconds: {cpu}.")
    L += ["", "## Held-out accuracy per evaluation", ""]
    steps = sorted({e["step"] for r in runs for e in r.evals})
    L.append("| step | " + " | ".join(r.name for r in runs) + " |")
    L.append("|---" * (1 + len(runs)) + "|")
    for s in steps:
        cells = []
        for r in runs:
            e = next((e for e in r.evals if e["step"] == s), None)
            pos = next((p for p, st, _ in eval_positions(r) if st == s), None)
            cells.append("" if e is None else f"{e['accuracy']:.3f}" + (f" ({pos:.0f} s)" if pos is not None else ""))
        L.append(f"| {s} | " + " | ".join(cells) + " |")
    L.append("\n(in brackets: the training wall-clock at that evaluation)")
    if images.get("accuracy"):
        L += ["", f"![held-out accuracy against wall-clock]({images['accuracy']})"]
    L += ["", "## Where a step goes", ""]
    L += _split_tables(runs, cmp) or ["(no step finished)"]
    if images.get("timeline"):
        L += [f"One of our steps, actor by actor: ![step timeline]({images['timeline']})", ""]
    L += ["## Utilisation", ""]
    for r in runs:
        m = cmp["metrics"][r.name]
        L.append(f"- {r.name}: mean {_f(m.get('util_mean_pct'), 0)} %, peak memory {_f(m.get('peak_mem_gib'))} GiB "
                 f"({len(r.util)} samples, {r.util[0]['source'] if r.util else 'none'})")
    if images.get("util"):
        L += ["", f"![utilisation]({images['util']})"]
    L += ["", "## What differs between the two jobs", ""]
    L += [f"- {d}" for d in differences(job)]
    resp = _responses(runs, work)
    if resp:
        L += ["", "## Held-out responses, before and after", ""] + resp
    problems = [(r.name, n) for r in runs for n in r.notes]
    problems += [(r.name, f"exit status {r.info['rc']}") for r in runs if r.info.get("rc") not in (None, 0)]
    if problems:
        L += ["", "## Problems", ""] + [f"- {n}: {p}" for n, p in problems]
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------------------------------------ plots
def plot_accuracy(runs: list[Run], path: Path, title: str) -> Path | None:
    if not any(r.evals for r in runs):
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    for r in runs:
        pts = sorted(eval_positions(r))
        if pts:
            ax.plot([p[0] for p in pts], [p[2] for p in pts], "o-", lw=2, label=r.label)
        ev = sorted((e["step"], e["accuracy"]) for e in r.evals)
        if ev:
            ax2.plot([e[0] for e in ev], [e[1] for e in ev], "o-", lw=2, label=r.name)
    ax.set_xlabel("training wall-clock (s, evaluations left out)")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_ylim(bottom=0)
    ax2.set_xlabel("step")
    ax2.set_title("against steps", fontsize=10)
    ax2.grid(alpha=0.3)
    ax2.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_util(runs: list[Run], path: Path) -> Path | None:
    if not any(r.util for r in runs):
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    host = any(s["source"] == "host" for r in runs for s in r.util)
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 4.5), sharex=True)
    for r in runs:
        if not r.util:
            continue
        t0 = float(r.info.get("t_launch") or r.util[0]["time"])
        xs = [s["time"] - t0 for s in r.util]
        a1.plot(xs, [s["util_pct"] for s in r.util], lw=1, label=r.name)
        a2.plot(xs, [s["mem_used_mib"] / 1024 for s in r.util], lw=1, label=r.name)
    a1.set_ylabel("CPU busy %" if host else "GPU util %")
    a1.set_ylim(0, 105)
    a2.set_ylabel("host mem GiB" if host else "GPU mem GiB")
    a2.set_xlabel("seconds since the run's launch")
    a1.set_title("host CPU and memory (no GPU here)" if host else "GPU utilisation and memory", fontsize=10)
    for ax in (a1, a2):
        ax.grid(alpha=0.3)
    a1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_timeline(runs: list[Run], work: Path, path: Path) -> Path | None:
    """The median-length step of the first of our runs that has traces, as slime-actors' timeline draws it."""
    for r in runs:
        if r.framework != "ours" or not r.split or r.split[0].get("source") != "traces":
            continue
        walls = sorted(r.split, key=lambda x: x["wall"])
        step = walls[len(walls) // 2]["step"]
        try:
            from slime_actors.traces.reader import TraceRun
            from slime_actors.traces.timeline import render_step
            render_step(TraceRun(work / r.name, skip_bad=True), step - 1, path)
            return path
        except Exception as exc:
            r.split_notes.append(f"no timeline picture: {type(exc).__name__}: {exc}")
    return None


# ------------------------------------------------------------------------------------------------ entry
def build_report(work: str | Path, out: str | Path, names: list[str]) -> list[Path]:
    work, out = Path(work), Path(out)
    job = _read_json(work / "job.json")
    if not job:
        raise ReportError(f"{work / 'job.json'}: missing (the driver writes it before any run)")
    if not names:
        raise ReportError("no runs named")
    runs = [load_run(work, n) for n in names]
    attach_util(runs, read_samples(work / "util.csv"))
    cmp = compare(runs, job)
    trl = next((r for r in runs if r.framework == "trl"), None)
    cmp["same_prompts"] = {}
    for r in runs:
        if r.framework == "ours" and trl is not None and r.steps and trl.steps:
            n, diffs = same_prompts(work, r, trl)
            cmp["same_prompts"][r.name] = {"steps_compared": n, "differences": diffs}
    out.mkdir(parents=True, exist_ok=True)
    files = []
    images = {}
    title = f"{job.get('model')}, {job.get('task')}: {job.get('prompts')} prompts x {job.get('group')} per step"
    for key, fn in (("accuracy", lambda: plot_accuracy(runs, out / "accuracy_vs_time.png", title)),
                    ("util", lambda: plot_util(runs, out / "gpu_util.png")),
                    ("timeline", lambda: plot_timeline(runs, work, out / "step_timeline.png"))):
        p = fn()
        if p is not None:
            images[key] = p.name
            files.append(p)
    md = render_markdown(runs, cmp, job, work, images)
    (out / "report.md").write_text(md)
    summary = {"job": job, "equal_step": cmp["equal_step"], "equal_time_s": cmp["equal_time_s"],
               "same_prompts": cmp["same_prompts"],
               "ratios_ours_over_trl": cmp["ratios"],
               "runs": {r.name: {"label": r.label, "framework": r.framework, "metrics": cmp["metrics"][r.name],
                                 "steps": r.steps, "evals": r.evals, "split": r.split, "notes": r.notes + r.split_notes,
                                 "info": {k: v for k, v in r.info.items() if k != "command"},
                                 "command": r.info.get("command")} for r in runs}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float))
    return [out / "report.md", out / "summary.json"] + files


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 3:
        print("usage: python -m scripts.compare_trl.report WORK OUT NAME [NAME ...]", file=sys.stderr)
        return 2
    try:
        files = build_report(argv[0], argv[1], argv[2:])
    except ReportError as exc:
        print(f"report: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(str(f) for f in files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
