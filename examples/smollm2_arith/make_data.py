"""Multiplication prompts SmolLM2-135M-Instruct mostly gets wrong: "What is 23 * 4? ..." -> "92"."""

import json
import random
from pathlib import Path

here = Path(__file__).parent
rng = random.Random(11)
pairs = [(a, b) for a in range(12, 60) for b in range(3, 10)]
rng.shuffle(pairs)


def row(a, b):
    return {"messages": [{"role": "user", "content": f"What is {a} * {b}? Answer with only the number."}],
            "label": str(a * b)}


for name, chunk in (("heldout.jsonl", pairs[:32]), ("train.jsonl", pairs[32:])):
    with open(here / name, "w") as f:
        for a, b in chunk:
            f.write(json.dumps(row(a, b)) + "\n")
print(f"{len(pairs) - 32} train, 32 held-out prompts")
