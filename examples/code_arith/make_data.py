"""Write train.jsonl and heldout.jsonl for the code_arith task: "8 9 sum =" -> a program that computes 17.

The answer is a one-line Python program in the tiny model's words -- an arithmetic expression such as `8 + 9` --
that the sandbox runs as `answer = <response>` against the row's tests (--rm-type code, assert-style). Every
target is 10 or more, so no single token (the model's digits are 0-9) can be the answer: the model has to write
an expression. The tests give partial credit (--code-partial-credit): a program that yields an int, one that
yields 10 or more, one within 3 of the target, the target itself.

Pairs of digits and an operation (sum or product) are split so that no held-out prompt appears in training.
Run: python make_data.py
"""

import itertools
import json
import random
from pathlib import Path

here = Path(__file__).parent
rng = random.Random(11)
OPS = {"sum": lambda a, b: a + b, "*": lambda a, b: a * b}
rows = [(a, b, op) for op in OPS for a, b in itertools.product(range(10), repeat=2) if OPS[op](a, b) >= 10]
rng.shuffle(rows)
heldout, train = rows[:24], rows[24:]


def row(a, b, op):
    target = OPS[op](a, b)
    tests = ["assert type(answer) is int", "assert answer >= 10", f"assert abs(answer - {target}) <= 3",
             f"assert answer == {target}"]
    return {"input": f"{a} {b} {op} =", "label": {"prefix": "answer = ", "tests": tests}}


for name, part in (("train.jsonl", train), ("heldout.jsonl", heldout)):
    with open(here / name, "w") as f:
        for r in part:
            f.write(json.dumps(row(*r)) + "\n")
print(f"{len(train)} train, {len(heldout)} held-out prompts")
