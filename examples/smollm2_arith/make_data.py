"""Arithmetic prompts for SmolLM2-135M-Instruct, answers required in \\boxed{} and graded by the strict math reward.

    python examples/smollm2_arith/make_data.py                  # this example's train.jsonl / heldout.jsonl (add2)
    python examples/smollm2_arith/make_data.py --task word --train 2000 --heldout 500 --seed 19 \\
        --out-dir data/arith_word                               # a word-problem set
    python examples/smollm2_arith/make_data.py --task mul1 --heldout 64 --train 0 --out-dir /tmp/mul1

Tasks (--task):
  mul1    one-digit times one-digit ("What is 7 * 8?"); only 64 distinct problems
  add2    two two-digit numbers added ("What is 47 + 38?")
  mul2x1  two-digit times one-digit ("What is 23 * 4?"); 336 distinct problems
  word1   one-step word problems: add, subtract, multiply or divide small numbers
  word2   two-step word problems (a + b * c, a - b + c, a * b - c)
  word    word1 and word2 mixed (half each)

Every row is {"messages": [{"role": "user", "content": QUESTION + " " + INSTRUCTION}], "label": "ANSWER",
"metadata": {"task": ..., "kind": ...}}. The answer is an integer >= 0. Held-out and train problems never share
their numbers and template (not only their text), so a held-out prompt is not a renamed train prompt. The same
--seed writes the same files on every machine.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

INSTRUCTION = "Put your final answer in \\boxed{}."

NAMES = ["Tom", "Anna", "Ben", "Lily", "Sam", "Mia", "Leo", "Emma", "Max", "Zoe", "Jack", "Ella", "Noah", "Ava",
         "Liam", "Sara", "Omar", "Nina", "Ravi", "Yuki"]
ITEMS = ["apples", "pencils", "marbles", "stickers", "books", "cookies", "cards", "shells", "coins", "flowers",
         "stamps", "balloons", "crayons", "buttons"]
BOXES = [("box", "boxes"), ("bag", "bags"), ("pack", "packs"), ("jar", "jars"), ("basket", "baskets")]


# Each maker takes a Random and returns (key, question, answer, kind); the key (template and numbers) decides
# what counts as the same problem when train and held-out are split.
def _mul1(rng):
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    return ("mul1", a, b), f"What is {a} * {b}?", a * b, "mul"


def _add2(rng):
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return ("add2", a, b), f"What is {a} + {b}?", a + b, "add"


def _mul2x1(rng):
    a, b = rng.randint(12, 59), rng.randint(3, 9)
    return ("mul2x1", a, b), f"What is {a} * {b}?", a * b, "mul"


def _who(rng):
    n, m = rng.sample(NAMES, 2)
    return n, m, rng.choice(ITEMS), rng.choice(BOXES)


def _word1(rng):
    n, m, it, (box, boxes) = _who(rng)
    kind = rng.choice(["add", "sub", "mul", "div"])
    if kind == "add":
        a, b = rng.randint(10, 60), rng.randint(2, 40)
        q, ans = f"{n} has {a} {it}. {n} gets {b} more {it}. How many {it} does {n} have now?", a + b
    elif kind == "sub":
        a = rng.randint(15, 80)
        b = rng.randint(2, a - 3)
        q, ans = f"{n} has {a} {it} and gives {b} of them to {m}. How many {it} does {n} have left?", a - b
    elif kind == "mul":
        a, b = rng.randint(2, 9), rng.randint(2, 12)
        q, ans = f"{n} buys {a} {boxes} of {it}. Each {box} has {b} {it}. How many {it} does {n} buy?", a * b
    else:
        b, c = rng.randint(2, 9), rng.randint(2, 12)
        a = b * c
        q = f"{n} puts {a} {it} into {b} {boxes}, the same number in each {box}. How many {it} are in each {box}?"
        ans = c
    nums = (a, b)
    return ("word1", kind, *nums), q, ans, kind


def _word2(rng):
    n, m, it, (box, boxes) = _who(rng)
    kind = rng.choice(["add_mul", "sub_add", "mul_sub"])
    if kind == "add_mul":
        a, b, c = rng.randint(3, 30), rng.randint(2, 6), rng.randint(2, 10)
        q = f"{n} has {a} {it}. {n} buys {b} {boxes} with {c} {it} in each {box}. How many {it} does {n} have now?"
        ans = a + b * c
    elif kind == "sub_add":
        a = rng.randint(15, 60)
        b, c = rng.randint(2, a - 5), rng.randint(2, 30)
        q = (f"{n} has {a} {it}. {n} gives {b} {it} to {m} and then finds {c} more. "
             f"How many {it} does {n} have now?")
        ans = a - b + c
    else:
        a, b = rng.randint(2, 6), rng.randint(3, 10)
        c = rng.randint(1, a * b - 1)
        q = (f"{n} buys {a} {boxes} of {it} with {b} {it} in each {box} and gives {c} {it} to {m}. "
             f"How many {it} does {n} have left?")
        ans = a * b - c
    return ("word2", kind, a, b, c), q, ans, kind


def _word(rng):
    return _word1(rng) if rng.random() < 0.5 else _word2(rng)


TASKS = {"mul1": _mul1, "add2": _add2, "mul2x1": _mul2x1, "word1": _word1, "word2": _word2, "word": _word}
DISTINCT = {"mul1": 64, "mul2x1": 336}  # tasks with few distinct problems: asking for more is an error


def row(question: str, answer: int, task: str, kind: str, instruction: str = INSTRUCTION) -> dict:
    content = f"{question} {instruction}".strip()
    return {"messages": [{"role": "user", "content": content}], "label": str(answer),
            "metadata": {"task": task, "kind": kind}}


def generate(task: str, n_train: int, n_heldout: int, seed: int, instruction: str = INSTRUCTION
             ) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows): distinct problems, held-out first, no problem (template + numbers) in both."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; tasks: {', '.join(TASKS)}")
    if n_train < 0 or n_heldout < 0:
        raise ValueError("--train and --heldout must be >= 0")
    limit = DISTINCT.get(task)
    if limit is not None and n_train + n_heldout > limit:
        raise ValueError(f"task {task} has only {limit} distinct problems; asked for {n_train} + {n_heldout}")
    make = TASKS[task]
    rng = random.Random(f"{task}:{seed}")
    seen: set = set()
    rows: list[dict] = []
    want = n_train + n_heldout
    tries = 0
    while len(rows) < want:
        tries += 1
        if tries > 200 * want + 10_000:
            raise RuntimeError(f"task {task}: could not draw {want} distinct problems (got {len(rows)})")
        key, q, ans, kind = make(rng)
        if key in seen:
            continue
        seen.add(key)
        rows.append(row(q, ans, task, kind, instruction))
    return rows[n_heldout:], rows[:n_heldout]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="add2", choices=sorted(TASKS))
    p.add_argument("--train", type=int, default=1000, help="train prompts")
    p.add_argument("--heldout", type=int, default=200, help="held-out prompts")
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--out-dir", default=str(Path(__file__).parent), help="where train.jsonl and heldout.jsonl go")
    p.add_argument("--instruction", default=INSTRUCTION, help="appended to every question")
    a = p.parse_args(argv)
    try:
        train, heldout = generate(a.task, a.train, a.heldout, a.seed, a.instruction)
    except ValueError as exc:
        print(f"make_data.py: error: {exc}", file=sys.stderr)
        return 2
    out = Path(a.out_dir)
    if train:
        write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "heldout.jsonl", heldout)
    print(f"{a.task}: {len(train)} train, {len(heldout)} held-out prompts in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
