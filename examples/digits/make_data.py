"""Write train.jsonl and heldout.jsonl for the digits task: "a b c first =" -> "a".

Triples of digits are split so that no held-out prompt appears in training. Run: python make_data.py
"""

import itertools
import json
import random
from pathlib import Path

here = Path(__file__).parent
rng = random.Random(7)
triples = list(itertools.product(range(10), repeat=3))
rng.shuffle(triples)
heldout, train = triples[:100], triples[100:]


def row(t):
    return {"input": " ".join(map(str, t)) + " first =", "label": str(t[0])}


for name, rows in (("train.jsonl", train), ("heldout.jsonl", heldout)):
    with open(here / name, "w") as f:
        for t in rows:
            f.write(json.dumps(row(t)) + "\n")
print(f"{len(train)} train, {len(heldout)} held-out prompts")
