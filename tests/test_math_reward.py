"""The math reward grades the final answer, not the question: answer extraction, plain-number and MATH-style labels,
sets and intervals, slime's dapo rule, and a hard deadline for math-verify in any thread (grading processes)."""

import asyncio
import threading

import pytest

from slime_actors.config import ConfigError, parse_config
from slime_actors.rewards import (RewardError, compute_reward, dapo_reward, extract_answer, grade_math,
                                  grading_stats, math_reward)
from slime_actors.rewards.answers import answer_number, gold_number
from slime_actors.rewards.grading import GradingError, GradingPool
from slime_actors.types import Sample

from helpers import flat_args


A = flat_args   # what reward functions get: slime's `args`, the job config's flat view


def score(rm_type, response, label, **kw):
    s = Sample(index=0, group_index=0, prompt="q", response=response, label=label)
    return asyncio.run(compute_reward(A(rm_type=rm_type, **kw), s)), s


def in_thread(fn, *a, **kw):
    """fn(*a, **kw) run in a fresh thread (where signal.alarm cannot bound math-verify); its result."""
    out = {}

    def run():
        try:
            out["value"] = fn(*a, **kw)
        except BaseException as exc:  # noqa: BLE001
            out["error"] = exc
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "grading in a thread did not return"
    if "error" in out:
        raise out["error"]
    return out["value"]


# --------------------------------------------------------------------------------------- the question is no answer
@pytest.mark.parametrize("response,label", [
    ("To calculate 12 * 8, you simply multiply", "96"),      # what SmolLM2 learned to say on one H200
    ("12 * 8", "96"),
    ("31 + 44", "75"),
    (r"6 \times 9", "54"),
    (r"$6 \times 9$", "54"),
    ("What is 12 * 8?", "96"),
    (r"\boxed{12 \times 8}", "96"),                         # a boxed restatement is no number either
    ("The answer is 12 * 8.", "96"),
    ("Answer: 31 + 44", "75"),
])
def test_restating_the_question_scores_zero(response, label):
    assert math_reward(response, label) == 0.0
    assert score("math", response, label)[0] == 0.0


@pytest.mark.parametrize("response", [
    "12 * 8 = 96", "12 * 8 = 96.", "So 12 * 8 = 96 apples.", "The answer is 96.", "Answer: 96", "#### 96",
    r"\boxed{96}", r"$\boxed{96}$", r"\boxed{96 \text{ apples}}", "**Answer:** 96", r"$12 \times 8 = 96$",
    r"The final answer is $96$.", "The answer is: **96**", r"\fbox{96}", "96", r"\boxed{96.0}",
])
def test_stating_the_answer_scores_one(response):
    assert math_reward(response, "96") == 1.0


@pytest.mark.parametrize("response,want", [
    (r"I first thought 12, but \boxed{13}", ("13", "boxed")),           # the box wins over everything
    (r"\boxed{1} then \boxed{2}. The answer is 3", ("2", "boxed")),
    (r"so \boxed{27}. Put your final answer in \boxed{}.", ("27", "boxed")),     # an empty box is no answer
    (r"Put your final answer in \boxed{}. 73 - 30 = 43", ("43", "number")),
    ("The answer is 7. Later: 8", ("7", "stated")),                     # a stated answer wins over loose numbers
    ("The answer is simple: 12 * 8 = 96", ("96", "number")),            # "simple" is no answer: the last number
    ("answer: 3.5. Check: 7 / 2", ("3.5", "stated")),
    ("#### 1,024", ("1,024", "stated")),
    ("so x = -5", ("-5", "number")),
    ("5 - 3", ("3", "number")),                                          # a subtraction, not a negative number
    (r"we get \frac{1}{2} of it", (r"\frac{1}{2}", "number")),
    ("no number at all", None),
    ("", None),
])
def test_extract_answer(response, want):
    got = extract_answer(response)
    assert (got.text, got.source) == want if want else got is None


def test_plain_numbers_are_compared_exactly():
    assert gold_number("1,024") == 1024 and gold_number("$-3$") == -3 and gold_number(r"\boxed{7}") == 7
    assert gold_number(r"3\sqrt{2}") is None and gold_number("1, 2") is None and gold_number("x = 5") is None
    assert answer_number(r"96 \text{ apples}.", fractions=False) == 96
    assert answer_number("96 + 4", fractions=False) is None
    assert answer_number("96 apples and 4 pears", fractions=False) is None
    assert answer_number(r"\frac{1}{2}", fractions=False) is None and answer_number("1/2", fractions=True) == 0.5
    assert math_reward(r"\boxed{\frac{1}{2}}", "0.5") == 1.0
    assert math_reward(r"\boxed{1/2}", r"\frac12") == 1.0
    assert math_reward(r"\boxed{0.50}", r"\frac{1}{2}") == 1.0
    assert math_reward(r"\boxed{192/2}", "96") == 0.0         # an integer takes no fraction
    assert math_reward(r"\boxed{1,024}", "1024") == 1.0 and math_reward(r"\boxed{1024}", "1,024") == 1.0
    assert math_reward("it is -5", "-5") == 1.0 and math_reward("it is 5", "-5") == 0.0
    assert math_reward(r"\boxed{96}", ["95", "96"]) == 1.0
    # a huge number of units words is no trouble for the pattern (each word is taken whole)
    assert answer_number("96 " + "a" * 20000 + "+", fractions=False) is None


# ------------------------------------------------------------------------------- MATH-style labels, sets, intervals
@pytest.mark.parametrize("response,label,want", [
    (r"\boxed{3\sqrt{2}}", r"3\sqrt{2}", 1.0),
    (r"\boxed{\sqrt{18}}", r"3\sqrt{2}", 1.0),
    (r"\boxed{3}", r"3\sqrt{2}", 0.0),           # the label's raw parse kept only its leading 3
    (r"\boxed{12\pi}", r"12\pi", 1.0),
    (r"\boxed{12}", r"12\pi", 0.0),
    (r"\boxed{1+\sqrt{5}}", r"1+\sqrt{5}", 1.0),
    (r"\boxed{1}", r"1+\sqrt{5}", 0.0),
    (r"\boxed{1024}", r"2^{10}", 1.0),
    (r"\boxed{2}", r"2^{10}", 0.0),
    (r"\boxed{10\%}", r"10\%", 1.0),
    (r"The answer is $\frac{\sqrt{3}}{2}$.", r"\frac{\sqrt{3}}{2}", 1.0),
    (r"\boxed{x = 5}", "5", 1.0),
])
def test_math_style_labels(response, label, want):
    assert math_reward(response, label) == want


@pytest.mark.parametrize("response,label,want", [
    (r"\boxed{(-\infty, 2)}", r"(-\infty, 2)", 1.0),
    (r"\boxed{(-\infty, 2]}", r"(-\infty, 2)", 0.0),
    (r"\boxed{2}", r"(-\infty, 2)", 0.0),
    (r"\boxed{[0,1]}", "[0, 1]", 1.0),
    (r"\boxed{1}", "[0, 1]", 0.0),
    (r"\boxed{\{2, 1\}}", r"\{1, 2\}", 1.0),
    (r"\boxed{2}", r"\{1, 2\}", 0.0),
    (r"\boxed{3, 1, 2}", "1, 2, 3", 1.0),       # an unordered list
    (r"\boxed{3}", "1, 2, 3", 0.0),
    (r"\boxed{1, 2}", "1, 2, 3", 0.0),
])
def test_sets_intervals_and_lists(response, label, want):
    assert math_reward(response, label) == want


# ----------------------------------------------------------------------------------------------- deadlines
def _working(n_chars: int) -> str:
    """~n_chars of working that restates the question and includes expressions math-verify cannot finish with."""
    step = r"We could try $9^{9^{9^{9}}}$ or $x^{x^{x^{x^{x}}}}$, but 12 * 8 is simpler. "
    return step * (n_chars // len(step) + 1)


def test_a_huge_response_is_graded_in_a_worker_thread():
    working = _working(100_000)
    assert len(working) > 100_000
    # (before: math-verify parsed all of it, found `12 * 8` and scored 1.0; a response ending in a tower stalled
    # the thread -- and, holding the GIL in sympy, the whole process)
    assert in_thread(math_reward, working, "96") == 0.0
    assert in_thread(math_reward, working + "So 12 * 8 = 96.", "96") == 1.0
    assert in_thread(math_reward, working + "So 12 * 8 = 96.", "95") == 0.0
    assert in_thread(math_reward, working + r"The result is $9^{9^{9^{9}}}$", "96") == 0.0
    g = in_thread(grade_math, working + r"The result is $9^{9^{9^{9}}}$", r"12\pi")
    assert g.score == 0.0 and g.answer.text == "9"


def test_math_verify_past_its_deadline_scores_zero_and_is_counted_in_any_thread():
    before = grading_stats()
    g = in_thread(grade_math, r"so \boxed{9^{9^{9^{9}}}}", r"12\pi", timeout=3.0)
    assert g.score == 0.0 and g.timed_out and g.answer.text == "9^{9^{9^{9}}}"
    g = in_thread(grade_math, r"\boxed{9^{9^{9^{9}}}}", r"x + 1", timeout=0.8)
    assert g.score == 0.0 and g.timed_out
    assert grading_stats()["timeouts"] - before["timeouts"] == 2
    assert in_thread(math_reward, r"\boxed{\sqrt{18}}", r"3\sqrt{2}") == 1.0


def test_an_item_past_its_deadline_is_killed_with_its_process():
    pool = GradingPool(1)
    try:
        # math-verify's own alarms get 10 s here (a third of the request's 30): the 0.5 s deadline must kill it
        req = {"op": "verify", "golds": [r"12\pi"], "answer": "9^{9^{9^{9}}}", "source": "boxed", "timeout": 30.0}
        assert in_thread(pool.call, req, 0.5) == {"score": 0.0, "timed_out": True}
        assert pool.stats["timeouts"] == 1 and pool.stats["restarts"] == 1 and not pool._children
        assert pool.verify(["2"], "2", "boxed")["score"] == 1.0      # a fresh process takes the next item
        assert pool.stats["calls"] == 2 and len(pool._children) == 1
    finally:
        pool.close()


def test_the_math_rules_mark_timed_out_samples():
    r, s = score("math", r"\boxed{9^{9^{9^{9}}}}", r"12\pi", math_grading_timeout=2.0)
    assert r == 0.0 and s.metadata["reward_timed_out"] is True
    r, s = score("math", r"\boxed{12\pi}", r"12\pi")
    assert r == 1.0 and "reward_timed_out" not in s.metadata


def test_grading_pool_errors():
    with pytest.raises(ValueError, match="at least 1 process"):
        GradingPool(0)
    pool = GradingPool(1)
    try:
        with pytest.raises(GradingError, match="unknown request"):
            pool.call({"op": "nope"})
        (child,) = list(pool._children)
        assert pool.verify(["2"], "2", "boxed")["score"] == 1.0   # the same process survived the bad request
        assert list(pool._children) == [child] and child.proc.poll() is None
    finally:
        pool.close()
    with pytest.raises(GradingError, match="closed"):
        pool.verify(["2"], "2", "boxed")


def test_a_dead_grading_process_is_replaced():
    pool = GradingPool(1)
    try:
        assert pool.verify(["2"], "2", "boxed")["score"] == 1.0
        (child,) = list(pool._children)
        child.proc.kill()
        child.proc.wait()
        assert pool.verify([r"\sqrt{2}"], r"\sqrt 2", "boxed")["score"] == 1.0
        assert child not in pool._children and len(pool._children) == 1
    finally:
        pool.close()


def test_a_grading_process_that_cannot_start_is_a_clear_error(tmp_path, monkeypatch):
    fake = tmp_path / "math_verify"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('math-verify is broken here')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    pool = GradingPool(2)
    try:
        with pytest.raises(GradingError, match="did not start: ImportError: math-verify is broken here"):
            pool.warm_up()
        with pytest.raises(GradingError, match="did not start"):
            pool.verify(["x"], "x", "boxed")
        assert not pool._children
    finally:
        pool.close()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_grading_processes_end_with_the_process_that_started_them():
    import subprocess
    import sys
    import time
    code = ("from slime_actors.rewards.grading import GradingPool\n"
            "p = GradingPool(1); p.warm_up(); print(next(iter(p._children)).proc.pid, flush=True)\n"
            "import time; time.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(owner.stdout.readline())
        assert not _gone(child)
        owner.kill()
        owner.wait()
        t0 = time.monotonic()
        while not _gone(child) and time.monotonic() - t0 < 60:
            time.sleep(0.1)
        assert _gone(child), "the grading process outlived the process that started it"
    finally:
        owner.kill()


def test_grading_flags_are_checked():
    with pytest.raises(ConfigError, match="--math-grading-timeout must be > 0"):
        parse_config(["--math-grading-timeout", "0"])
    with pytest.raises(ConfigError, match="--math-grading-processes must be >= 1"):
        parse_config(["--math-grading-processes", "0"])


# ------------------------------------------------------------------------------------------------ rm types
def test_boxed_math_needs_a_box():
    assert score("boxed_math", "12 * 8 = 96", "96")[0] == 0.0
    assert score("boxed_math", r"12 * 8 = 96 \boxed{}", "96")[0] == 0.0
    assert score("boxed_math", r"so \boxed{96}", "96")[0] == 1.0
    assert score("boxed_math", r"\boxed{3\sqrt{2}}", r"3\sqrt{2}")[0] == 1.0


def test_deepscaler_grades_after_thinking():
    assert score("deepscaler", r"<think>12 * 8 = 96</think> so 12 * 8", "96")[0] == 0.0
    assert score("deepscaler", r"<think>maybe 95</think> 12 * 8 = 96", "96")[0] == 1.0
    with pytest.raises(RewardError, match="label"):
        score("deepscaler", r"<think>unfinished", None)


@pytest.mark.parametrize("response,label,want", [
    ("Let me see.\nAnswer: 96", "96", 1.0),
    ("Answer: $96$", "96", 1.0),
    ("answer: 96 minutes", "96", 1.0),                # DAPO's unit words are dropped ...
    ("answer: 96 apples", "96", -1.0),                # ... others are not (as in slime)
    ("ANSWER: 1,000", "1000", 1.0),
    ("Answer: x = 12", "12", 1.0),
    ("Answer: 95", "96", -1.0),
    (r"\boxed{96}", "96", -1.0),                      # dapo reads "Answer:" lines only
    ("Answer: 96" + "." * 400, "96", -1.0),           # only the last 300 characters are read
    ("Answer: 96", "96.0", 1.0),
])
def test_dapo(response, label, want):
    assert dapo_reward(response, label) == want
    assert score("dapo", response, label)[0] == want


def test_dapo_refuses_a_label_that_is_not_an_integer():
    with pytest.raises(ValueError, match="not an integer"):
        dapo_reward("Answer: 1", r"\frac{1}{2}")
    with pytest.raises(RewardError, match="not an integer"):
        score("dapo", "Answer: 1", "one half")
