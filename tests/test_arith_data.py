"""examples/smollm2_arith/make_data.py: the arithmetic prompt sets (this example's, and the 2,000 + 500 word-problem
set the TRL comparison uses) -- sizes, determinism, no held-out problem in training, labels the math reward accepts."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slime_actors.rewards import math_reward

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "smollm2_arith" / "make_data.py"


@pytest.fixture(scope="module")
def md():
    spec = importlib.util.spec_from_file_location("arith_make_data", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _problem(row) -> str:
    return row["messages"][0]["content"]


@pytest.mark.parametrize("task,n_train,n_held", [("add2", 2000, 500), ("mul2x1", 256, 80), ("word1", 2000, 500),
                                                  ("word2", 2000, 500), ("word", 2000, 500)])
def test_sets_are_distinct_disjoint_and_deterministic(md, task, n_train, n_held):
    train, held = md.generate(task, n_train, n_held, seed=19)
    assert len(train) == n_train and len(held) == n_held
    texts = [_problem(r) for r in train + held]
    assert len(set(texts)) == len(texts)
    assert not {_problem(r) for r in train} & {_problem(r) for r in held}
    assert md.generate(task, n_train, n_held, seed=19) == (train, held)
    assert md.generate(task, n_train, n_held, seed=20) != (train, held)
    for r in held[:50]:
        assert r["messages"][0]["role"] == "user" and _problem(r).endswith("Put your final answer in \\boxed{}.")
        assert int(r["label"]) >= 0 and r["metadata"]["task"] == task
        # the strict math reward takes the label, and a restatement of the question is not an answer to it
        assert math_reward(f"The answer is \\boxed{{{r['label']}}}.", r["label"]) == 1.0
        question = _problem(r).rsplit(" Put your", 1)[0]
        assert math_reward(question, r["label"]) == 0.0 or r["label"] in re.findall(r"\d+", question)


def test_held_out_numbers_are_not_renamed_train_problems(md):
    # the split is by template and numbers, not by text: the same numbers with other names stay on one side
    train, held = md.generate("word1", 1500, 300, seed=3)
    key = lambda r: (r["metadata"]["kind"], tuple(re.findall(r"\d+", _problem(r))))  # noqa: E731
    assert not {key(r) for r in train} & {key(r) for r in held}


def test_answers_are_right(md):
    _, held = md.generate("word", 0, 400, seed=5)
    for r in held:
        nums = [int(x) for x in re.findall(r"\d+", _problem(r))]
        kind = r["metadata"]["kind"]
        want = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
                "div": lambda a, b: a // b, "add_mul": lambda a, b, c: a + b * c,
                "sub_add": lambda a, b, c: a - b + c, "mul_sub": lambda a, b, c: a * b - c}[kind](*nums)
        assert int(r["label"]) == want, (_problem(r), r["label"])
    _, mul = md.generate("mul1", 0, 64, seed=1)
    assert {r["label"] for r in mul} == {str(a * b) for a in range(2, 10) for b in range(2, 10)}


def test_command_line(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--task", "word", "--train", "30", "--heldout", "10",
                          "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "word: 30 train, 10 held-out prompts" in out.stdout
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 30 and len((tmp_path / "heldout.jsonl").read_text().splitlines()) == 10
    bad = subprocess.run([sys.executable, str(SCRIPT), "--task", "mul1", "--train", "100", "--heldout", "10",
                          "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "only 64 distinct problems" in bad.stderr
    bad = subprocess.run([sys.executable, str(SCRIPT), "--heldout", "-1", "--out-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "must be >= 0" in bad.stderr
