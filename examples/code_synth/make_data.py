"""Write train.jsonl and heldout.jsonl for the code_synth task: from one example, write the program.

A prompt shows one call of an unknown function on a list of digits and its result -- `2 7 : 7` -- and the model
answers with a program, in the tiny model's words, that the sandbox runs as `answer = <response>` and tests on
lists it has not seen (--rm-type code, assert-style): here `max` (the function `max`) passes `answer([4, 1]) == 4`
and the other hidden tests; `7` (a number, not a function) and `min` fail them. Three functions are hidden behind
the examples: max, min and sum (their results differ on every prompt, so one example names one function).

Prompts are split so that no held-out prompt appears in training. Run: python make_data.py
"""

import itertools
import json
import random
from pathlib import Path

here = Path(__file__).parent
rng = random.Random(5)
FUNCS = {"max": max, "min": min, "sum": sum}
HIDDEN = [[4, 1], [2, 8, 5], [6, 6, 1], [0, 3], [9, 2, 7, 1]]     # the tests' inputs (never in a prompt)


def rows():
    out = []
    for n in (2, 3):
        for xs in itertools.product(range(10), repeat=n):
            results = {name: f(xs) for name, f in FUNCS.items()}
            if len(set(results.values())) < 3:
                continue                 # the example must tell the functions apart
            for name, r in results.items():
                if r <= 9:               # a result the tiny model can read (one digit)
                    out.append((list(xs), name, r))
    return out


def row(xs, name, result):
    f = FUNCS[name]
    tests = [f"assert answer({h}) == {f(h)}" for h in HIDDEN]
    return {"input": " ".join(map(str, xs)) + f" : {result}", "label": {"prefix": "answer = ", "tests": tests},
            "metadata": {"function": name}}


all_rows = rows()
rng.shuffle(all_rows)
heldout, train = all_rows[:120], all_rows[120:]
for fname, part in (("train.jsonl", train), ("heldout.jsonl", heldout)):
    with open(here / fname, "w") as f:
        for r in part:
            f.write(json.dumps(row(*r)) + "\n")
print(f"{len(train)} train, {len(heldout)} held-out prompts")
