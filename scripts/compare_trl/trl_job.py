"""The TRL side of the comparison: GRPOTrainer (trl 1.16) on the job the driver wrote, timed per step.

    python -m scripts.compare_trl.trl_job --job WORK/job.json --out WORK/trl     # the driver (run.py) runs this

Runs under the Python that has trl (on a CPU machine a separate venv; on the GPU machine the image's Python with
trl's four wheels). It reads the same files and settings as our run (job.json, written by run.py) and writes, in
--out:

    trl_metrics.jsonl   one line per event: {"kind": "start"} (launch, model loaded), {"kind": "step"} per
                        optimizer step (seconds without evaluation, samples, generated tokens, reward, and the
                        step's generation / reward / scoring seconds), {"kind": "eval"} per held-out evaluation,
                        {"kind": "log"} (TRL's own logs), {"kind": "end"} (peak memory)
    evals/heldout_stepNNNNNN.jsonl   every held-out response with its grade (as our runs write them)

The reward is OUR strict math reward (slime_actors.rewards.rules.math_reward: the final answer, graded), wrapped as
TRL's reward function. Held-out accuracy: greedy `generate` on the held-out prompts before training and every
`eval_every` steps (a callback), graded by the same function.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def load_job(path: str | os.PathLike) -> dict:
    p = Path(path)
    try:
        job = json.loads(p.read_text())
    except FileNotFoundError:
        raise SystemExit(f"trl_job: {p}: no such job file (run.py writes it)") from None
    except ValueError as exc:
        raise SystemExit(f"trl_job: {p}: not JSON ({exc})") from None
    need = ("model_dir", "train_file", "heldout_file", "steps", "prompts", "group", "max_len", "temperature", "lr",
            "kl", "clip", "eval_every", "micro_batch", "precision", "device", "seed")
    missing = [k for k in need if k not in job]
    if missing:
        raise SystemExit(f"trl_job: {p}: missing {', '.join(missing)}")
    return job


def grpo_config_kwargs(job: dict, out: Path) -> dict:
    """GRPOConfig's arguments for the job: one optimizer step per generation of prompts x group completions, in
    micro batches, as our trainer does (the model's dtype, a torch object, is the caller's to add)."""
    cpu = job["device"] == "cpu"
    per_step = job["prompts"] * job["group"]
    micro = min(job["micro_batch"], per_step)
    if per_step % micro:
        raise SystemExit(f"trl_job: prompts x group ({per_step}) must be a multiple of the micro batch ({micro})")
    return dict(
        output_dir=str(out / "trainer"), max_steps=job["steps"], per_device_train_batch_size=micro,
        gradient_accumulation_steps=per_step // micro, num_generations=job["group"],
        max_completion_length=job["max_len"], temperature=job["temperature"], top_p=1.0, top_k=0,
        learning_rate=job["lr"], lr_scheduler_type="constant", warmup_steps=0, adam_beta1=0.9, adam_beta2=0.98,
        adam_epsilon=1e-8, weight_decay=0.0, max_grad_norm=1.0, beta=job["kl"], epsilon=job["clip"],
        loss_type="grpo", scale_rewards="group", num_iterations=1, shuffle_dataset=False,
        gradient_checkpointing=bool(job.get("gradient_checkpointing", False)),
        bf16=job["precision"] == "bf16" and not cpu, fp16=False, tf32=True if job["precision"] == "tf32" and not cpu
        else None, logging_steps=1, save_strategy="no",
        report_to="none", seed=job["seed"], use_cpu=cpu, remove_unused_columns=False, disable_tqdm=True,
        log_completions=False)


def read_rows(path: str | os.PathLike) -> list[dict]:
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except ValueError:
            raise SystemExit(f"trl_job: {path}:{i}: not a JSON line") from None
        if not isinstance(r.get("messages"), list) or "label" not in r:
            raise SystemExit(f"trl_job: {path}:{i}: expected {{\"messages\": [...], \"label\": ...}} "
                             "(examples/smollm2_arith/make_data.py writes them)")
        rows.append({"prompt": r["messages"], "label": str(r["label"])})
    if not rows:
        raise SystemExit(f"trl_job: {path}: no prompts")
    return rows


def completion_text(c) -> str:
    """A TRL completion: a list of messages (conversational prompts) or a string."""
    if isinstance(c, list):
        return "".join(str(m.get("content", "")) for m in c if isinstance(m, dict))
    return str(c)


def user_text(prompt) -> str:
    """The last user turn of a conversational prompt (the question), or the prompt itself."""
    if isinstance(prompt, list):
        users = [str(m.get("content", "")) for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return users[-1] if users else ""
    return str(prompt)


class Log:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(path, "a")

    def write(self, kind: str, **kw) -> None:
        self.f.write(json.dumps({"kind": kind, "time": time.time(), **kw}, default=float) + "\n")
        self.f.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", required=True, help="job.json written by run.py")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--t-launch", type=float, default=None, help="when the driver started this process (Unix s)")
    a = ap.parse_args(argv)
    t_launch = a.t_launch or time.time()
    job = load_job(a.job)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "trl_metrics.jsonl")

    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from slime_actors.rewards.rules import math_reward

    train_rows = read_rows(job["train_file"])
    heldout = read_rows(job["heldout_file"])
    cpu = job["device"] == "cpu"
    if not cpu and not torch.cuda.is_available():
        raise SystemExit("trl_job: --device cuda but torch sees no GPU")
    device = torch.device("cpu" if cpu else "cuda")
    tok = AutoTokenizer.from_pretrained(job["model_dir"])
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    cfg = GRPOConfig(**grpo_config_kwargs(job, out), model_init_kwargs={"dtype": torch.float32})

    stats = {"gen_tokens": 0, "samples": 0, "reward_sum": 0.0, "generation": 0.0, "reward": 0.0, "prepare": 0.0}
    questions: set[str] = set()   # the step's prompts (their user turn), to check both sides had the same

    def strict_math(prompts, completions, label, completion_ids=None, **kw):
        """Our strict math reward (slime_actors.rewards.rules.math_reward) on each completion."""
        questions.update(user_text(p) for p in prompts)
        scores = [math_reward(completion_text(c), lab) for c, lab in zip(completions, label)]
        stats["samples"] += len(scores)
        stats["reward_sum"] += sum(scores)
        if completion_ids is not None:
            stats["gen_tokens"] += sum(len(ids) for ids in completion_ids)
        else:
            stats["gen_tokens"] += sum(len(tok(completion_text(c), add_special_tokens=False)["input_ids"])
                                       for c in completions)
        return scores

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer with the parts of a step timed: generation, reward, and all of the batch preparation."""

        def _timed(self, key, fn, *args, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                stats[key] += time.perf_counter() - t0

        def _generate(self, prompts):
            return self._timed("generation", super()._generate, prompts)

        def _calculate_rewards(self, *args, **kw):
            return self._timed("reward", super()._calculate_rewards, *args, **kw)

        def _generate_and_score_completions(self, inputs):
            return self._timed("prepare", super()._generate_and_score_completions, inputs)

    def evaluate(model, step: int) -> None:
        t0 = time.time()
        was_training = model.training
        model.eval()
        rows_out, correct = [], 0
        side = tok.padding_side
        tok.padding_side = "left"
        try:
            bs = int(job.get("eval_batch", 256))
            for i in range(0, len(heldout), bs):
                chunk = heldout[i:i + bs]
                texts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
                         for r in chunk]
                enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
                with torch.no_grad():
                    gen = model.generate(**enc, do_sample=False, max_new_tokens=job["eval_max_len"],
                                         pad_token_id=tok.pad_token_id, temperature=None, top_p=None, top_k=None)
                for j, r in enumerate(chunk):
                    resp = tok.decode(gen[j, enc["input_ids"].shape[1]:], skip_special_tokens=True)
                    score = math_reward(resp, r["label"])
                    correct += score
                    rows_out.append({"index": i + j, "prompt": r["prompt"], "label": r["label"], "response": resp,
                                     "reward": score, "step": step})
        finally:
            tok.padding_side = side
            if was_training:
                model.train()
        ev = out / "evals" / f"heldout_step{step:06d}.jsonl"
        ev.parent.mkdir(parents=True, exist_ok=True)
        ev.write_text("".join(json.dumps(r) + "\n" for r in rows_out))
        acc = correct / len(heldout)
        log.write("eval", step=step, accuracy=acc, n=len(heldout), seconds=time.time() - t0)
        print(f"[trl] held-out accuracy at step {step}: {acc:.3f} ({int(correct)}/{len(heldout)}, "
              f"{time.time() - t0:.1f} s)", flush=True)

    class StepClock(TrainerCallback):
        """Step times without the evaluations, the held-out evaluations, and TRL's logs into trl_metrics.jsonl."""

        def __init__(self):
            self.last = None

        def on_train_begin(self, args, state, control, model=None, **kw):
            evaluate(model, 0)
            self.last = time.time()
            for k in stats:
                stats[k] = 0 if isinstance(stats[k], int) else 0.0

        def on_step_end(self, args, state, control, model=None, **kw):
            now = time.time()
            n = stats["samples"]
            log.write("step", step=state.global_step, step_seconds=now - self.last, samples=n,
                      gen_tokens=stats["gen_tokens"], reward_mean=(stats["reward_sum"] / n) if n else None,
                      generation_seconds=stats["generation"], reward_seconds=stats["reward"],
                      prepare_seconds=stats["prepare"], questions=sorted(questions))
            print(f"[trl] step {state.global_step}: {now - self.last:.2f} s, reward "
                  f"{(stats['reward_sum'] / n) if n else float('nan'):.3f}, {stats['gen_tokens']} tokens", flush=True)
            for k in stats:
                stats[k] = 0 if isinstance(stats[k], int) else 0.0
            questions.clear()
            ev = job["eval_every"]
            if (ev and state.global_step % ev == 0) or (state.global_step == args.max_steps and
                                                         not (ev and args.max_steps % ev == 0)):
                evaluate(model, state.global_step)
            self.last = time.time()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs:
                log.write("log", step=state.global_step, **{k: v for k, v in logs.items()
                                                             if isinstance(v, (int, float))})

    log.write("start", t_launch=t_launch, trl=trl.__version__, torch=torch.__version__,
              device=str(device), python=sys.version.split()[0])
    trainer = TimedGRPOTrainer(model=job["model_dir"], reward_funcs=strict_math, args=cfg,
                               train_dataset=Dataset.from_list(train_rows), processing_class=tok,
                               callbacks=[StepClock()])
    log.write("loaded", seconds=time.time() - t_launch)
    trainer.train()
    peak = {}
    if device.type == "cuda":
        peak = {"max_memory_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
                "max_memory_reserved_gib": torch.cuda.max_memory_reserved() / 2**30}
    log.write("end", steps=trainer.state.global_step, **peak)
    return 0


if __name__ == "__main__":
    sys.exit(main())
