"""How well does the untrained model do? Greedy answers of SmolLM2-135M-Instruct to a task's prompts, graded by the
strict math reward -- the held-out accuracy a GRPO run starts from, without starting one.

    python examples/smollm2_arith/baseline.py --task word1 --n 100            # generate, grade, print a summary
    python examples/smollm2_arith/baseline.py --data examples/smollm2_arith/heldout.jsonl --n 100
    python examples/smollm2_arith/baseline.py --grade runs/baseline/word1.jsonl  # grade saved responses again

The prompts go through the model's chat template (as `apply_chat_template = true` does in a run); generation is
greedy (temperature 0), as the run's held-out evaluation is. Responses are saved (--out, default
runs/baseline/TASK.jsonl) with their reward and the answer the grader extracted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here))


def load_rows(a) -> list[dict]:
    if a.data:
        rows = [json.loads(line) for line in Path(a.data).read_text().splitlines() if line.strip()]
        return rows[: a.n]
    from make_data import generate
    _, heldout = generate(a.task, 0, a.n, a.seed)
    return heldout


def generate_responses(rows: list[dict], a) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slime_actors.models import resolve_checkpoint
    torch.manual_seed(0)
    torch.set_num_threads(max(1, a.threads))
    path = resolve_checkpoint(a.model, Path("runs") / ".models")
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    t0 = time.monotonic()
    for i in range(0, len(rows), a.batch):
        chunk = rows[i:i + a.batch]
        texts = [tok.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True) for r in chunk]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=a.max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        for r, ids in zip(chunk, gen[:, enc["input_ids"].shape[1]:]):
            ids = ids.tolist()
            n = len(ids)
            while n and ids[n - 1] == tok.pad_token_id:
                n -= 1
            finished = n < len(ids) or (n and ids[n - 1] == tok.eos_token_id)
            out.append({**r, "response": tok.decode(ids[:n], skip_special_tokens=True), "response_tokens": n,
                        "truncated": not finished})
        print(f"  {len(out)}/{len(rows)} prompts, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return out


def grade(results: list[dict]) -> dict:
    from slime_actors.rewards.answers import extract_answer
    from slime_actors.rewards.rules import boxed_only_math_reward, math_reward
    for r in results:
        r["reward"] = math_reward(r["response"], r["label"])
        r["reward_boxed_only"] = boxed_only_math_reward(r["response"], r["label"])
        ans = extract_answer(r["response"])
        r["answer"], r["answer_from"] = (ans.text, ans.source) if ans else (None, None)
    n = len(results) or 1
    return {"prompts": len(results),
            "accuracy": sum(r["reward"] for r in results) / n,
            "accuracy_boxed_only": sum(r["reward_boxed_only"] for r in results) / n,
            "boxed": sum(1 for r in results if r["answer_from"] == "boxed") / n,
            "truncated": sum(1 for r in results if r.get("truncated")) / n,
            "mean_response_tokens": sum(r.get("response_tokens", 0) for r in results) / n}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="word", help="a make_data.py task (unless --data)")
    p.add_argument("--data", default=None, help="a jsonl of prompts (messages + label) instead of --task")
    p.add_argument("--n", type=int, default=100, help="prompts")
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--model", default="smollm2:135m")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch", type=int, default=25)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="where responses go (default runs/baseline/TASK.jsonl)")
    p.add_argument("--grade", default=None, help="grade this saved responses file again (no generation)")
    p.add_argument("--show", type=int, default=3, help="responses to print")
    a = p.parse_args(argv)
    if a.grade:
        results = [json.loads(line) for line in Path(a.grade).read_text().splitlines() if line.strip()]
        out = Path(a.grade)
    else:
        rows = load_rows(a)
        results = generate_responses(rows, a)
        out = Path(a.out or Path("runs") / "baseline" / f"{Path(a.data).stem if a.data else a.task}.jsonl")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(r) + "\n" for r in results))   # kept even if grading fails
    summary = grade(results)
    out.write_text("".join(json.dumps(r) + "\n" for r in results))
    for r in results[: a.show]:
        print(f"--- label {r['label']}  reward {r['reward']}  answer {r['answer']!r} ({r['answer_from']})")
        print(r["messages"][-1]["content"])
        print(">>> " + r["response"].replace("\n", "\n    "))
    print(json.dumps({"source": a.grade or a.data or a.task, **{k: round(v, 3) for k, v in summary.items()},
                      "max_new_tokens": a.max_new_tokens, "responses": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
