"""Write train.jsonl and heldout.jsonl for smollm2_code: small Python functions, each graded by its tests.

Each task asks for one function (`Write a Python function count_char(s) that returns how many times 'e' occurs in
s.`); its label holds assert-style tests (--rm-type code) made by running a reference implementation, here in
this script, on seeded random inputs. Families x parameters give a few hundred distinct tasks; the split keeps
every held-out task (family and parameters) out of training.

    python examples/smollm2_code/make_data.py                        # 600 train, 30 held-out, seed 3
    python examples/smollm2_code/make_data.py --train 20 --heldout 8 --out-dir /tmp/code8
"""

from __future__ import annotations

import argparse
import json
import random
import string
from pathlib import Path

HERE = Path(__file__).parent
INSTRUCTION = "Reply with the function only, in a ```python code block."


def _word(rng, n=None):
    return "".join(rng.choice("abcdeilmnorst") for _ in range(n or rng.randint(3, 8)))


def _ints(rng, lo=-20, hi=20, n=None):
    return [rng.randint(lo, hi) for _ in range(n if n is not None else rng.randint(0, 7))]


# family: (parameter choices, description(p), signature, reference source(p), input maker(rng, p) -> args tuple)
FAMILIES = {
    "add_k": (list(range(2, 30)), lambda k: f"returns x plus {k}", "add_k(x)",
              lambda k: f"def add_k(x):\n    return x + {k}\n", lambda rng, k: (rng.randint(-100, 100),)),
    "times_k": (list(range(2, 13)), lambda k: f"returns x multiplied by {k}", "times_k(x)",
                lambda k: f"def times_k(x):\n    return x * {k}\n", lambda rng, k: (rng.randint(-50, 50),)),
    "count_char": (list("aeiorst"), lambda c: f"returns how many times the letter '{c}' occurs in the string s",
                   "count_char(s)", lambda c: f"def count_char(s):\n    return s.count({c!r})\n",
                   lambda rng, c: (_word(rng) + c * rng.randint(0, 2) + _word(rng),)),
    "multiples": (list(range(2, 8)), lambda d: f"returns the numbers of the list xs that are divisible by {d}, "
                                               "in order", "multiples(xs)",
                  lambda d: f"def multiples(xs):\n    return [x for x in xs if x % {d} == 0]\n",
                  lambda rng, d: (_ints(rng),)),
    "sum_of_squares": ([0], lambda _: "returns the sum of the squares of the numbers 1 to n", "sum_of_squares(n)",
                       lambda _: "def sum_of_squares(n):\n    return sum(i * i for i in range(1, n + 1))\n",
                       lambda rng, _: (rng.randint(0, 30),)),
    "reverse_words": ([0], lambda _: "returns the words of the sentence s in reverse order, joined by single "
                                     "spaces", "reverse_words(s)",
                      lambda _: "def reverse_words(s):\n    return ' '.join(reversed(s.split()))\n",
                      lambda rng, _: (" ".join(_word(rng) for _ in range(rng.randint(1, 5))),)),
    "clamp": ([(lo, hi) for lo in range(-5, 1) for hi in range(5, 11)],
              lambda p: f"returns x limited to the range {p[0]} to {p[1]} (values below {p[0]} become {p[0]}, "
                        f"values above {p[1]} become {p[1]})", "clamp(x)",
              lambda p: f"def clamp(x):\n    return max({p[0]}, min({p[1]}, x))\n",
              lambda rng, p: (rng.randint(-20, 20),)),
    "is_palindrome": ([0], lambda _: "returns True if the string s reads the same forwards and backwards, else False",
                      "is_palindrome(s)", lambda _: "def is_palindrome(s):\n    return s == s[::-1]\n",
                      lambda rng, _: ((lambda w: w + w[::-1][rng.randint(0, 1):])(_word(rng))
                                      if rng.random() < 0.5 else _word(rng),)),
    "max_gap": ([0], lambda _: "returns the largest number of the list xs minus the smallest, or 0 for an empty list",
                "max_gap(xs)", lambda _: "def max_gap(xs):\n    return max(xs) - min(xs) if xs else 0\n",
                lambda rng, _: (_ints(rng),)),
    "starts_with": (list("abcdelmst"), lambda c: f"returns the words of the list words that start with '{c}', in "
                                                 "order", "starts_with(words)",
                    lambda c: f"def starts_with(words):\n    return [w for w in words if w.startswith({c!r})]\n",
                    lambda rng, c: ([(c if rng.random() < 0.4 else "") + _word(rng) for _ in range(rng.randint(0, 6))],)),
    "fizz": (list(range(3, 8)), lambda k: f"returns 'Fizz' if n is divisible by {k}, else the number n as a string",
             "fizz(n)", lambda k: f"def fizz(n):\n    return 'Fizz' if n % {k} == 0 else str(n)\n",
             lambda rng, k: (rng.randint(0, 60),)),
    "digit_sum": ([0], lambda _: "returns the sum of the decimal digits of the non-negative integer n", "digit_sum(n)",
                  lambda _: "def digit_sum(n):\n    return sum(int(d) for d in str(n))\n",
                  lambda rng, _: (rng.randint(0, 10 ** rng.randint(1, 7)),)),
}


def task(family: str, param, rng: random.Random, n_tests: int = 5) -> dict:
    _, describe, signature, source, make_input = FAMILIES[family]
    ns: dict = {}
    exec(source(param), ns)                 # our own reference implementation, not model output
    fn = ns[signature.split("(")[0]]
    tests, seen = [], set()
    for _ in range(50):
        args = make_input(rng, param)
        key = repr(args)
        if key in seen:
            continue
        seen.add(key)
        tests.append(f"assert {signature.split('(')[0]}({', '.join(map(repr, args))}) == {fn(*args)!r}")
        if len(tests) == n_tests:
            break
    prompt = f"Write a Python function {signature} that {describe(param)}. {INSTRUCTION}"
    return {"messages": [{"role": "user", "content": prompt}], "label": {"tests": tests},
            "metadata": {"family": family, "param": param if isinstance(param, (int, str)) else list(param)}}


def split(seed: int, heldout: int) -> tuple[list, list]:
    """(held-out, train) (family, parameter) pairs: the held-out ones are drawn from the families with several
    parameters, so every family is still trained on (with other parameters); families of one task train only."""
    rng = random.Random(seed)
    multi = [(f, p) for f, (params, *_) in FAMILIES.items() if len(params) > 1 for p in params]
    rng.shuffle(multi)
    if heldout > len(multi) // 2:
        raise SystemExit(f"--heldout {heldout}: at most {len(multi) // 2} tasks can be held out")
    held = multi[:heldout]
    train = [(f, p) for f, (params, *_) in FAMILIES.items() for p in params if (f, p) not in held]
    rng.shuffle(train)
    return held, train


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=int, default=600)
    ap.add_argument("--heldout", type=int, default=30)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--out-dir", default=str(HERE))
    a = ap.parse_args(argv)
    held, rest = split(a.seed, a.heldout)
    rng = random.Random(a.seed + 1)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "heldout.jsonl", "w") as f:
        for fam, p in held:
            f.write(json.dumps(task(fam, p, rng)) + "\n")
    with open(out / "train.jsonl", "w") as f:       # training tasks repeat with fresh test inputs
        for i in range(a.train):
            fam, p = rest[i % len(rest)]
            f.write(json.dumps(task(fam, p, rng)) + "\n")
    print(f"{a.train} train ({len(rest)} distinct tasks), {len(held)} held-out tasks -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
