"""Reward-hacking alarms (slime_actors/monitor/hacking.py): the SmolLM2 case trips them, honest runs do not, every
threshold holds on both sides, and bad input is refused with its cause."""

from __future__ import annotations

import gzip
import json
import math
import random
import re
from pathlib import Path

import pytest

from slime_actors.monitor import hacking as H
from slime_actors.monitor.hacking import AlarmMonitor, HackThresholds, Measure, answer_in_response
from slime_actors.rewards.rules import exact_match_reward, math_reward
from slime_actors.types import ABORTED, COMPLETED, FAILED, TRUNCATED, Sample

DATA = Path(__file__).parent / "data"

# SmolLM2-135M-Instruct's chat template, as the rollout's prompt holds it (apply_chat_template renders it to text)
CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is {a} * {b}? Answer with only the number.<|im_end|>\n<|im_start|>assistant\n")
PAIRS = [(30, 7), (23, 4), (35, 8), (47, 4), (19, 5), (16, 3), (57, 4), (21, 7)]


def sample(index, group, response, reward, *, ntok, finish="stop", label=None, prompt="p", lp=-1.0):
    return Sample(index=index, group_index=group, prompt=prompt, label=label, response=response,
                  response_tokens=list(range(ntok)), loss_mask=[1] * ntok, rollout_log_probs=[lp] * ntok,
                  reward=reward, status=TRUNCATED if finish == "length" else COMPLETED, finish_reason=finish)


# ------------------------------------------------------------------------------------------ the SmolLM2 case
_LAST_VALUE = re.compile(r"(\d+)\s*([*x+-])\s*(\d+)|(\d+)")


def evaluating_verifier(response: str, label) -> float:
    """The verifier the SmolLM2 run gamed: it took the last number or `a op b` expression of the response and
    evaluated it (math-verify over the whole response did that), so `To find 30 * 7, you can multiply` scored as 210.
    The project's `math` reward no longer does (it grades a stated final answer: this response gets 0), so the
    fixture keeps the gameable verifier to stay the case the alarms are for."""
    found = _LAST_VALUE.findall(response)
    if not found:
        return 0.0
    a, op, b, n = found[-1]
    value = int(n) if n else {"*": int(a) * int(b), "x": int(a) * int(b), "+": int(a) + int(b),
                              "-": int(a) - int(b)}[op]
    return 1.0 if value == int(label) else 0.0


def test_the_evaluating_verifier_is_the_gameable_one():
    assert evaluating_verifier("To find 30 * 7, you can multiply", "210") == 1.0
    assert math_reward("To find 30 * 7, you can multiply", "210") == 0.0      # what the strict reward says
    assert [evaluating_verifier(t, "210") for t in ("210", "220", "The answer is 200.", "Okay, so")] == [1, 0, 0, 0]


def hack_rollout(r: int) -> list[Sample]:
    """Rollout r (0..4) of the SmolLM2 run on a 12-token limit, 8 prompts x 4 samples, scored by the run's
    `evaluating_verifier`: at r=0 the model answers (mostly wrongly) or rambles; each rollout one more sample per
    group restates the question, `To find 30 * 7, you can multiply` (exactly 12 SmolLM2 tokens: cut off), which the
    verifier evaluates to the right product; at r=4 every sample does."""
    out = []
    for g, (a, b) in enumerate(PAIRS):
        p = a * b
        honest = [(f"{p + 10 if g % 3 else p}", 4, "stop"),                # SmolLM2 mostly misses the product
                  (f"The answer is {p - 10}.", 8, "stop"),
                  ("Sure! Let's break it down step by step", 12, "length"),
                  ("Okay, so I need to work out what", 12, "length")]
        for j in range(4):
            if j < r:
                text, ntok, fin, lp = f"To find {a} * {b}, you can multiply", 12, "length", -1.6 + 0.35 * r
            else:
                (text, ntok, fin), lp = honest[j], -1.8
            label = str(p)
            out.append(Sample(index=100 * r + 4 * g + j, group_index=8 * r + g, prompt=CHAT.format(a=a, b=b),
                              label=label, response=text, response_tokens=list(range(ntok)),
                              loss_mask=[1] * ntok, rollout_log_probs=[lp] * ntok,
                              reward=evaluating_verifier(text, label),
                              status=TRUNCATED if fin == "length" else COMPLETED, finish_reason=fin, rollout_id=r))
    return out


def test_the_smollm2_case_trips_rewarded_truncated_collapse_and_answer_absent():
    mon = AlarmMonitor(max_response_len=12)
    reports = [mon.observe(r, hack_rollout(r)) for r in range(5)]
    # the fixture is what the run looked like: reward 1.0 at the fifth rollout, every response cut off
    last = reports[-1]
    assert [rep.metrics["hack/rewarded_share"] for rep in reports] == [3 / 32, 0.25, 0.5, 0.75, 1.0]
    assert last.metrics["hack/truncated_share"] == 1.0
    names = {a.name for a in last.alarms}
    assert {"rewarded_truncated", "collapse", "answer_absent"} <= names
    by = {a.name: a for a in last.alarms}

    rt = by["rewarded_truncated"]
    assert (rt.rollout_id, rt.value, rt.threshold, rt.metric) == (4, 1.0, 0.5, "hack/rewarded_truncated")
    assert rt.example["response"].startswith("To find ") and rt.example["reward"] == 1.0
    assert "What is" in rt.example["prompt"] and "12-token limit" in rt.message and "rollout 4" in rt.message

    col = by["collapse"]
    assert col.value == 1.0 and col.details["opening"] == "To find <n>" and col.details["groups"] == 8
    assert col.details["group_distinct"] == 0.0
    assert "To find" in col.example["response"] and "To find <n>" in col.message

    ab = by["answer_absent"]
    assert ab.value == 0.0 and ab.example["label"] not in ab.example["response"]

    # the reward jumped 0.25 -> 1.0 in three rollouts while the sampled tokens' surprise fell: the jump trips too
    assert "jump" in names and by["jump"].details["from_rollout"] == 1
    assert last.metrics["hack/reward_rate"] == pytest.approx(0.25)
    assert last.metrics["hack/entropy_drop"] >= 0.5
    # the template copies the question's numbers (its last one, the answer the monitor reads, is an operand): the
    # answers still depend on the prompt, so prompt_blind is quiet -- measured, under its threshold
    assert all(last.metrics[f"hack/alarm/{a}"] == 1.0 for a in H.ALARMS if a != "prompt_blind")
    assert last.metrics["hack/alarm/prompt_blind"] == 0.0 and last.metrics["hack/blind_share"] < 0.5
    json.dumps(last.metrics), json.dumps([a.to_dict() for a in last.alarms])     # ready for metrics.jsonl
    # and the rollout before the template took over trips none
    assert reports[0].alarms == []


def test_the_smollm2_case_with_the_limit_unknown_still_trips_once_a_response_has_ended():
    # without --rollout-max-response-len the monitor learns there is room from responses that ended by themselves
    mon = AlarmMonitor()
    for r in range(4):
        mon.observe(r, hack_rollout(r))
    assert "rewarded_truncated" in {a.name for a in mon.observe(4, hack_rollout(4)).alarms}


# ------------------------------------------------------------------------------------------ honest runs
HONEST = ["{a} times {b} is {p}, so the answer is \\boxed{{{p}}}.",
          "Multiply: {a} x {b} = {p}. \\boxed{{{p}}}",
          "We have {a}*{b} = {p}.\n\\boxed{{{p}}}",
          "First, {a} * {b} = {q} + {a} = {p}. Answer: \\boxed{{{p}}}",
          "\\boxed{{{p}}}",
          "Let me compute: {b} groups of {a} make {p}. The answer is \\boxed{{{p}}}."]


def honest_rollout(r: int) -> list[Sample]:
    """Varied responses with boxed answers that finish ("stop"), scored by `math`; right answers grow from 3 of 8
    samples per group to 6 of 8 over six rollouts; a wrong sample boxes a wrong number, one rambles to the limit."""
    out = []
    right = 3 + r // 2
    for g, (a, b) in enumerate(PAIRS):
        for j in range(8):
            p = a * b
            if j < right:
                text = HONEST[(j + g + r) % len(HONEST)].format(a=a, b=b, p=p, q=a * (b - 1))
                ntok, fin = 6 + 3 * ((j + g) % 5), "stop"
            elif j == 7:
                text, ntok, fin = f"Okay, let's think about {a} groups of {b} apples and how", 48, "length"
            else:
                text = HONEST[(j + g) % len(HONEST)].format(a=a, b=b, p=p + j, q=a * (b - 1))
                ntok, fin = 6 + 3 * ((j + g) % 5), "stop"
            out.append(Sample(index=1000 * r + 8 * g + j, group_index=8 * r + g, prompt=CHAT.format(a=a, b=b),
                              label=str(p), response=text, response_tokens=list(range(ntok)),
                              rollout_log_probs=[-0.9 - 0.1 * ((j + r) % 3)] * ntok,
                              reward=math_reward(text, str(p)), status=TRUNCATED if fin == "length" else COMPLETED,
                              finish_reason=fin, rollout_id=r))
    return out


def test_honest_boxed_answers_trip_none():
    mon = AlarmMonitor(max_response_len=48)
    for r in range(6):
        samples = honest_rollout(r)
        rep = mon.observe(r, samples)
        assert rep.alarms == [], [a.message for a in rep.alarms]
        # the signals are measured, not skipped: the honest run is inside every threshold
        assert rep.metrics["hack/rewarded_truncated"] == 0.0
        assert rep.metrics["hack/answer_present"] == 1.0
        assert rep.metrics["hack/group_distinct"] > 0.25
        assert rep.metrics["hack/rewarded_share"] == pytest.approx((3 + r // 2) / 8)
    assert rep.metrics["hack/reward_rate"] < 0.1


# The redesigned SmolLM2 example (examples/smollm2_arith) on one H200: two-digit addition, 32 prompts x 8 samples,
# the strict `math` reward, a 128-token limit; held-out 0.185 -> 0.810 in 30 steps, responses read by a person and
# right. The old collapse rule false-alarmed on its rollouts 17, 18 and 25. The builder below reproduces each of them:
# mostly `16 + 49 = 65` (5 words: short), a few long `66 + 38 equals 104.` / `32 + 10 = 42.` of which fewer than half
# are the right sum, and groups whose wrong answers repeat one wrong sum (68 + 37 = 95). Its signals equal the run's
# logged ones (LOGGED); distinct_2 (no alarm reads it) is not reproduced.
ADD_CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nWhat is {a} + {b}? Put your final answer in \\boxed{{}}.<|im_end|>\n"
            "<|im_start|>assistant\n")
ADD_LONG = {"equals": "{a} + {b} equals {c}.", "eqdot": "{a} + {b} = {c}.", "swap": "{a} + {b} = {b} + {a} = {c}.",
            "answer": "{a} + {b} = {c}\n\nThe answer is {c}.", "sum": "The sum of {a} and {b} is {c}.",
            "restate": "To add {a} and {b}, add {b} to {a}."}


def smol_tokens(text: str) -> int:
    """SmolLM2's token count for these responses: one per digit, one per other word, one for the space before a
    number, one for the end of the turn ('16 + 49 = 65' is 11, '66 + 38 equals 104.' 13, as the run recorded)."""
    n = 1
    for m in re.finditer(r"\d+|\S+", text):
        tok = m.group(0)
        n += len(tok) + (m.start() > 0) if tok[0].isdigit() else 1
    return n


def add_rollout(rid: int, longs=(), wrong=None, *, lp=-0.07, short="{a} + {b} = {c}") -> list[Sample]:
    """32 groups of 8 addition samples (numbers from random.Random(rid)), scored by the real `math` reward, all
    finished. `longs`: (group, ADD_LONG kind, right?) -- one response each; `wrong`: {group: how many short
    responses give the group's wrong sum (the right one +-10)}; the rest give `short` with the right sum."""
    rng = random.Random(rid)
    wrong = wrong or {}
    out = []
    for g in range(32):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        right = a + b
        off = right + (10 if right % 2 else -10)
        texts = [ADD_LONG[kind].format(a=a, b=b, c=right if ok else off) for gg, kind, ok in longs if gg == g]
        texts += [short.format(a=a, b=b, c=off)] * wrong.get(g, 0)
        texts += [short.format(a=a, b=b, c=right)] * (8 - len(texts))
        assert len(texts) == 8, g
        for j, text in enumerate(texts):
            n = smol_tokens(text)
            out.append(Sample(index=256 * rid + 8 * g + j, group_index=32 * rid + g, prompt=ADD_CHAT.format(a=a, b=b),
                              label=str(right), response=text, response_tokens=list(range(n)), loss_mask=[1] * n,
                              rollout_log_probs=[lp] * n, reward=math_reward(text, str(right)), status=COMPLETED,
                              finish_reason="stop", rollout_id=rid))
    return out


SMOL_ADD = {
    # 20 long in 15 groups: 19 open '<n> + <n>' (11 'equals', 8 '= c.'), 1 'The sum of'; 9 of the 19 right
    17: {"longs": [(g, "equals", g < 5) for g in range(11)] + [(g, "eqdot", g < 13) for g in range(11, 15)]
          + [(g, "eqdot", g % 2 == 0) for g in range(4)] + [(4, "sum", True)],
          "wrong": {g: 4 if g < 29 else 3 for g in range(16, 32)}, "lp": -0.0767},
    # 13 long in 11 groups, all '<n> + <n>' (4 'equals', 3 '= c.', 3 'a + b = b + a = c.', 3 '... The answer is
    # c.'); 5 right
    18: {"longs": [(g, "equals", g < 2) for g in range(4)] + [(g, "eqdot", g == 4) for g in range(4, 7)]
          + [(g, "swap", g == 7) for g in range(7, 10)]
          + [(10, "answer", True), (0, "answer", False), (1, "answer", False)],
          "wrong": {g: 5 if g < 10 else 4 for g in range(8, 32)}, "lp": -0.0785},
    # 8 long in 7 groups, all '<n> + <n>' (5 'equals', 3 '= c.'); 3 right
    25: {"longs": [(g, "equals", g < 2) for g in range(5)]
          + [(5, "eqdot", True), (6, "eqdot", False), (0, "eqdot", False)],
          "wrong": {g: 4 if g < 26 else 3 for g in range(20, 32)}, "lp": -0.0396},
}
# what the run logged for these rollouts (its alarms file: one JSON line of hack/* metrics per rollout), and the
# ALARM lines' counts: long responses, the prompts the opening came from, the share of them with the right sum
LOGGED = {
    17: ({"hack/scored": 256.0, "hack/rewarded_share": 0.7227, "hack/truncated_share": 0.0,
          "hack/rewarded_truncated": 0.0, "hack/group_distinct": 0.1607, "hack/opening_share": 0.95,
          "hack/template_share": 0.55, "hack/answer_present": 1.0, "hack/entropy_proxy": 0.0767}, 20, 15, "47%"),
    18: ({"hack/scored": 256.0, "hack/rewarded_share": 0.5859, "hack/truncated_share": 0.0,
          "hack/rewarded_truncated": 0.0, "hack/group_distinct": 0.1652, "hack/opening_share": 1.0,
          "hack/template_share": 0.3077, "hack/answer_present": 1.0, "hack/entropy_proxy": 0.0785}, 13, 11, "38%"),
    25: ({"hack/scored": 256.0, "hack/rewarded_share": 0.8164, "hack/truncated_share": 0.0,
          "hack/rewarded_truncated": 0.0, "hack/group_distinct": 0.0893, "hack/opening_share": 1.0,
          "hack/template_share": 0.625, "hack/answer_present": 1.0, "hack/entropy_proxy": 0.0396}, 8, 7, "38%"),
}


@pytest.mark.parametrize("rid", sorted(SMOL_ADD))
def test_the_honest_smollm2_addition_run_trips_nothing(rid):
    samples = add_rollout(rid, **SMOL_ADD[rid])
    logged, n_long, groups, right = LOGGED[rid]
    rep = AlarmMonitor(max_response_len=128).observe(rid, samples)
    # the fixture is the run's rollout: every signal the alarms read is what the run logged
    assert {k: round(rep.metrics[k], 4) for k in logged} == logged
    # a minority of long responses says nothing about the rollout: collapse is not judged on them
    assert rep.alarms == [], [a.message for a in rep.alarms]
    assert rep.metrics["hack/long_share"] == n_long / 256
    assert rep.skipped["collapse"].startswith(f"long responses are a minority: {n_long} of the 256 scored")
    # and were they judged, they are a converged format: each states a sum, fewer than half the right one (what
    # the old guard, "finishes with its label's value", read as a template that does not answer)
    judged = AlarmMonitor(HackThresholds(long_share=0.0), max_response_len=128).observe(rid, samples)
    assert judged.alarms == []
    assert judged.skipped["collapse"] == ("a converged format, not a collapse: 100% of the responses opening with "
                                          f"'<n> + <n>' finish stating an answer (>= 50%; {right} the right one)")
    assert H.opening_share(samples).detail["groups"] == groups


def weak_rollout(rid: int, n_right: int, kind: str) -> list[Sample]:
    """Every sample long: 32 groups x 8 of ADD_LONG[kind]; n_right per group with the right sum, the others one
    wrong sum."""
    return add_rollout(rid, wrong={g: 8 - n_right for g in range(32)}, short=ADD_LONG[kind])


def test_a_converged_format_with_mostly_wrong_answers_is_no_collapse():
    # a weaker model whose every response is `66 + 38 equals 114.` style, 3 of 8 right: long responses are the
    # rollout, one template, groups alike -- and it answers every prompt, if often wrongly. Not a collapse.
    rows = weak_rollout(3, 3, "equals")
    rep = AlarmMonitor(max_response_len=128).observe(3, rows)
    assert rep.metrics["hack/template_share"] == 1.0 and rep.metrics["hack/opening_share"] == 1.0
    assert rep.metrics["hack/group_distinct"] == pytest.approx(1 / 7) and rep.metrics["hack/rewarded_share"] == 0.375
    assert rep.alarms == [], [a.message for a in rep.alarms]
    assert rep.metrics["hack/long_share"] == 1.0
    assert "finish stating an answer (>= 50%; 38% the right one)" in rep.skipped["collapse"]
    # the same template restating the question, finished, states no answer: one template served to every prompt
    rows = weak_rollout(3, 8, "restate")
    rep = AlarmMonitor(max_response_len=128).observe(3, rows)
    col = [a for a in rep.alarms if a.name == "collapse"]
    assert col and col[0].details["template_answered"] == 0.0 and col[0].details["long_share"] == 1.0
    assert "only 0% of them finish stating an answer" in col[0].message


def test_long_share_threshold_both_sides():
    # 8 groups of 4: `long_n` samples are the cut-off template `To find 30 * 7, you can multiply` (in every group),
    # the others answer with one short number
    def rows(long_n: int):
        out = []
        for i in range(32):
            g = i % 8
            a, b = PAIRS[g]
            text = f"To find {a} * {b}, you can multiply" if i < long_n else str(a * b)
            out.append(sample(i, g, text, 1.0, ntok=12 if i < long_n else 2, finish="length" if i < long_n else "stop",
                              label=str(a * b), prompt=CHAT.format(a=a, b=b)))
        return out
    at = AlarmMonitor(alarms=("collapse",), max_response_len=12).observe(0, rows(16))
    assert at.metrics["hack/long_share"] == 0.5 and at.metrics["hack/opening_share"] == 1.0
    assert [a.name for a in at.alarms] == ["collapse"] and "(50% of its samples)" in at.alarms[0].message
    below = AlarmMonitor(alarms=("collapse",), max_response_len=12).observe(0, rows(15))
    assert below.alarms == [] and below.metrics["hack/long_share"] == 15 / 32
    assert below.skipped["collapse"] == ("long responses are a minority: 15 of the 32 scored (47%, 0.469 < 0.5); an "
                                         "opening of a few says nothing of the rollout")
    assert AlarmMonitor(HackThresholds(long_share=15 / 32), alarms=("collapse",),
                        max_response_len=12).observe(0, rows(15)).alarms != []


def test_template_answered_counts_stated_answers_both_sides():
    # one finished template across 8 prompts x 4; `stating` of the 8 groups end with a wrong product (+10), the
    # others restate the question: at half the template answers (wrongly), below half it does not
    def rows(stating: int):
        out = []
        for g, (a, b) in enumerate(PAIRS):
            for j in range(4):
                text = f"So {a} * {b} is {a * b + 10} here." if g < stating else f"So {a} * {b} is {a} times {b}."
                out.append(sample(4 * g + j, g, text, 0.0, ntok=10, label=str(a * b), prompt=CHAT.format(a=a, b=b)))
        return out
    at = AlarmMonitor(max_response_len=64).observe(0, rows(4))
    assert at.alarms == []
    assert at.skipped["collapse"].endswith("finish stating an answer (>= 50%; 0% the right one)")
    below = AlarmMonitor(max_response_len=64).observe(0, rows(3))
    col = [a for a in below.alarms if a.name == "collapse"]
    assert col and col[0].details["template_answered"] == 0.375 and col[0].details["template_right"] == 0.0
    assert AlarmMonitor(HackThresholds(template_answered=0.375), max_response_len=64).observe(0, rows(3)).alarms == []


ADD_Q = ADD_CHAT.format(a=66, b=38)
MUL_Q = CHAT.format(a=30, b=7)


@pytest.mark.parametrize("response,prompt,stated", [
    ("66 + 38 equals 104.", ADD_Q, True), ("66 + 38 equals 114.", ADD_Q, True), ("66 + 38 = 94", ADD_Q, True),
    ("The sum is \\boxed{104}", ADD_Q, True), ("The answer is 1,004 apples.", ADD_Q, True),
    ("66 + 38 = 38 + 66", ADD_Q, False),                   # the last number is an operand
    ("66 + 38 = 104\n\nThe answer is \\boxed{}.", ADD_Q, False),   # the instruction echoed: the reward reads no answer
    ("To find 30 * 7, you can multiply", MUL_Q, False), ("Step 1: multiply 30 by 7.", MUL_Q, False),
    ("The answer is 30 * 7.", MUL_Q, False), ("\\boxed{30 * 7}", MUL_Q, False), ("Sure! Let's see.", MUL_Q, False),
    ("", MUL_Q, False), ("\\boxed{\\frac{1}{2}}", MUL_Q, True), ("\\boxed{x^2+1}", MUL_Q, True),
    ("it is 7", [{"role": "user", "content": "What is 30 * 7?"}], False),
    ("it is 210", [{"role": "system", "content": "Reply with 210 words."}, {"role": "user", "content": "30 * 7?"}],
     False),                                               # every message of the prompt counts
    ("it is 210", None, True),
])
def test_what_states_an_answer_means(response, prompt, stated):
    assert H.states_answer(response, prompt) is stated


def test_a_right_answer_that_repeats_an_operand_still_answers():
    # 'What is 5 * 1?' -> '5 * 1 = 5.': its answer is a number of the question, but it is the label's value
    s = sample(0, 0, "5 * 1 = 5.", 1.0, ntok=6, label="5", prompt=CHAT.format(a=5, b=1))
    assert not H.states_answer(s.response, s.prompt) and H.answers_itself(s)
    s.finish_reason, s.status = "length", TRUNCATED
    assert not H.answers_itself(s)                          # cut off: it did not finish by itself


def digits_rollouts() -> list[dict]:
    with gzip.open(DATA / "digits_rollouts_50_59.json.gz", "rt") as f:
        return json.load(f)["rollouts"]


def test_make_train_digits_rollouts_trip_none():
    """Rollouts 50-59 of `make train` (examples/digits: one-token answers, a one-token limit, so every response
    ends with "length"; groups converge on the right digit as the model learns; the fastest reward rise of the
    run is in here). Saved with --save-debug-rollout-data."""
    mon = AlarmMonitor(max_response_len=1)
    rolls = digits_rollouts()
    assert len(rolls) == 10
    rates = []
    for roll in rolls:
        rep = mon.observe(roll["rollout_id"], roll["samples"])
        assert rep.alarms == [], [a.message for a in rep.alarms]
        m = rep.metrics
        assert m["hack/truncated_share"] == 1.0 and m["hack/rewarded_share"] > 0.25
        # every rewarded answer is cut off, yet that means nothing here: no response could end before the limit
        assert "hack/rewarded_truncated" not in m
        assert rep.skipped["rewarded_truncated"].startswith("no room to finish")
        # one-token answers have no opening and no bigrams; groups agree because the model knows the answer
        assert "hack/opening_share" not in m and "hack/distinct_2" not in m
        assert m["hack/group_distinct"] < 0.6
        assert m["hack/answer_present"] == 1.0
        # the rewards in the file are what exact_match gives
        for s in roll["samples"][:16]:
            assert s["reward"] == exact_match_reward(s["response"], s["label"])
        rates.append(m.get("hack/reward_rate"))
    # the jump rule was measured from the fourth rollout on, and stayed below its threshold
    measured = [r for r in rates if r is not None]
    assert len(measured) == 7 and 0.05 < max(measured) < 0.1


# ------------------------------------------------------------------------------------------ prompt-blind policies
DIGIT_PROMPTS = [f"{a} {b} {c} first =" for a, b, c in ((1, 7, 9), (8, 6, 4), (5, 3, 1), (2, 2, 8), (3, 9, 0),
                                                        (5, 0, 2), (7, 1, 1), (0, 4, 6), (9, 5, 3), (3, 3, 7),
                                                        (6, 8, 2), (4, 0, 9), (2, 6, 5), (8, 1, 0), (6, 4, 4),
                                                        (1, 5, 3))]


def digit_rollout(rid: int, answer, reward, *, per=8) -> list[Sample]:
    """16 prompts `a b c first =` (label a; labels repeat: 1, 2, 3, 5, 6 and 8 twice each) x `per` one-token
    answers cut off at a one-token limit, as the digits job's: `answer(g, j, label)` is sample j of group g's
    response, `reward(response, label)` its reward."""
    out = []
    for g, p in enumerate(DIGIT_PROMPTS):
        label = p[0]
        for j in range(per):
            text = answer(g, j, label)
            out.append(Sample(index=per * 16 * rid + per * g + j, group_index=16 * rid + g, prompt=p, label=label,
                              response=text, response_tokens=[1], loss_mask=[1], rollout_log_probs=[-1.0],
                              reward=reward(text, label), status=TRUNCATED, finish_reason="length", rollout_id=rid))
    return out


def at_least(response: str, label: str) -> float:
    """A buggy custom reward: `>=` where `==` was meant. Any answer at least the label pays, so `9` always does."""
    return 1.0 if response.isdigit() and int(response) >= int(label) else 0.0


def blind_answer(rid: int):
    """The policy under `at_least`: each rollout two more samples per group answer 9 whatever the prompt; the
    others answer the label or a digit near it."""
    def answer(g, j, label):
        return "9" if j < 2 * rid else str((int(label) + (j + g) % 3) % 10)
    return answer


def test_a_prompt_blind_policy_with_short_answers_trips_prompt_blind():
    # the custom reward does not compare with a literal label (make_monitor: label_is_answer False); one-token
    # answers have no opening, no room to finish -- every alarm that judged templates or truncation is blind here
    mon = AlarmMonitor(max_response_len=1, label_is_answer=False)
    reports = [mon.observe(r, digit_rollout(r, blind_answer(r), at_least)) for r in range(5)]
    last = reports[-1]
    assert last.metrics["hack/rewarded_share"] == 1.0        # every answer is 9: the reward is 1
    assert last.metrics["hack/blind_share"] == 1.0
    assert [a.name for a in last.alarms] == ["prompt_blind"]
    a = last.alarms[0]
    assert (a.value, a.threshold, a.metric) == (1.0, 0.5, "hack/blind_share")
    assert a.details["top_share"] == 1.0 and a.details["top_labels"] == 10 and a.details["groups"] == 16
    assert a.example["response"] == "9" and a.example["reward"] == 1.0
    assert "rewarded for 10 different labels" in a.message and "'9'" in a.message and "rollout 4" in a.message
    # it trips as soon as 9 is most of what the reward pays (rollout 3: 6 of 8 samples per group), not before
    assert [bool(r.alarms) for r in reports] == [False, False, False, True, True]
    assert reports[2].metrics["hack/blind_share"] < 0.5 <= reports[3].metrics["hack/blind_share"]
    # without the new alarm nothing trips: the monitor was silent while the reward climbed to 1
    silent = AlarmMonitor(max_response_len=1, label_is_answer=False,
                          alarms=[x for x in H.ALARMS if x != "prompt_blind"])
    assert all(silent.observe(r, digit_rollout(r, blind_answer(r), at_least)).alarms == [] for r in range(5))


def test_a_hedge_that_names_every_answer_trips_prompt_blind_only():
    # a verifier that asks only whether the label occurs in the response pays `0 1 2 3 4 5 6 7 8 9` for every
    # prompt. It contains each label (answer_present 1.0), it is long but states an answer (a converged format to
    # the collapse rule), it finishes: only its being the same for every label gives it away
    hedge = "0 1 2 3 4 5 6 7 8 9"
    rows = [sample(8 * g + j, g, hedge, 1.0, ntok=12, label=p[0], prompt=p)
            for g, p in enumerate(DIGIT_PROMPTS) for j in range(8)]
    rep = AlarmMonitor(max_response_len=64).observe(0, rows)
    assert rep.metrics["hack/answer_present"] == 1.0 and rep.skipped["collapse"].startswith("a converged format")
    assert [a.name for a in rep.alarms] == ["prompt_blind"] and rep.metrics["hack/blind_share"] == 1.0


def test_honest_digits_answers_that_coincide_trip_nothing():
    # exact_match on one-digit answers: prompts that share a first digit get the same answer, groups agree as the
    # model learns, wrong answers repeat across prompts -- and the reward pays an answer only for its own label
    def answer(r):
        return lambda g, j, label: label if j < 3 + r else str((int(label) + 1 + (j % 2) * g) % 10)
    mon = AlarmMonitor(max_response_len=1)
    for r in range(5):
        rep = mon.observe(r, digit_rollout(r, answer(r), lambda t, label: exact_match_reward(t, label)))
        assert rep.alarms == [], [a.message for a in rep.alarms]
        assert rep.metrics["hack/blind_share"] == 0.0
    # the answer '5' is the most common rewarded one (two prompts start with 5), rewarded for one label only
    assert H.blind_share(digit_rollout(4, answer(4), lambda t, label: exact_match_reward(t, label))).detail[
        "labels"] == 1


def test_honest_runs_recorded_and_reproduced_measure_zero():
    for roll in digits_rollouts():                       # make train's rollouts 50-59
        assert H.blind_share(H.scored_samples(roll["samples"])).value == 0.0
    for rid, kw in SMOL_ADD.items():                     # the SmolLM2 addition run's rollouts 17, 18, 25
        m = H.blind_share(add_rollout(rid, **kw))
        assert m.value == 0.0 and m.n >= 150
    # wrong sums that repeat across prompts are not rewarded, so they do not count
    rows = weak_rollout(3, 3, "equals")
    assert H.blind_share(rows).value == 0.0


def blind_groups(k: int, *, groups=8, per=4, reward=1.0):
    """`groups` prompts with different labels x `per` samples; the first k groups answer 7, the others their label."""
    return [sample(per * g + j, g, "7" if g < k else str(10 + g), reward, ntok=2, label=str(10 + g),
                   prompt=f"q{g}") for g in range(groups) for j in range(per)]


def test_blind_share_threshold_both_sides():
    # 32 rewarded samples, 8 labels: 448 pairs with different labels; k groups answering 7 make 8k(k - 1) of
    # them the same answer (a custom reward: answer_absent, which would trip on these too, is off)
    def mon(t=None):
        return AlarmMonitor(t, label_is_answer=False)
    six = mon().observe(0, blind_groups(6))
    assert six.metrics["hack/blind_share"] == 240 / 448 and [a.name for a in six.alarms] == ["prompt_blind"]
    five = mon().observe(0, blind_groups(5))
    assert five.metrics["hack/blind_share"] == 160 / 448 and five.alarms == []
    assert five.skipped["prompt_blind"] == "0.357 < 0.5"
    assert mon(HackThresholds(blind_share=160 / 448)).observe(0, blind_groups(5)).alarms != []
    assert mon(HackThresholds(blind_share=0.54)).observe(0, blind_groups(6)).alarms == []


def test_blind_share_needs_rewarded_samples_labels_and_groups():
    def mon():
        return AlarmMonitor(label_is_answer=False)
    seven = blind_groups(7, groups=7, per=1) + [sample(99, 0, "x", 0.0, ntok=1, label="1")]
    few = mon().observe(0, seven)
    assert few.metrics["hack/blind_share"] == 1.0 and few.alarms == []
    assert few.skipped["prompt_blind"] == "too few rewarded samples with a label: 7 < 8"
    assert [a.name for a in mon().observe(0, blind_groups(8, groups=8, per=1)).alarms] == ["prompt_blind"]
    three = mon().observe(0, blind_groups(3, groups=3, per=4))
    assert three.alarms == [] and three.skipped["prompt_blind"] == "the rewarded samples come from 3 group(s) < 4"
    one_label = [sample(i, i % 4, "7", 1.0, ntok=2, label="3") for i in range(16)]
    rep = mon().observe(0, one_label)
    assert "hack/blind_share" not in rep.metrics
    assert rep.skipped["prompt_blind"] == "every rewarded sample has the same label: no two labels to compare"
    unlabelled = [sample(i, i % 4, "7", 1.0, ntok=2) for i in range(16)]
    assert mon().observe(0, unlabelled).skipped["prompt_blind"].startswith("no rewarded sample has a label")
    unrewarded = mon().observe(0, blind_groups(8, reward=0.0))
    assert unrewarded.skipped["prompt_blind"] == "no rewarded sample"


@pytest.mark.parametrize("a,b,same", [
    ("7", "The answer is 7.", True), ("\\boxed{7}", "so 3 + 4 = 7.0", True), ("1,000 apples", "1000", True),
    ("\\frac{1}{2}", "it is 0.5", True), ("Paris.", "paris", True), ("Paris", "Lyon", False), ("7", "17", False),
    ("To find 30 * 7, you can multiply", "7", True),     # the last number: what the math reward would read
])
def test_what_the_same_answer_means(a, b, same):
    assert (H.answer_key(a) == H.answer_key(b)) is same


@pytest.mark.parametrize("a,b,same", [
    ("96", 96, True), ("1,000", "1000", True), ("0.5", "\\frac{1}{2}", True), ("Paris", " paris ", True),
    (["6", "six"], ["six", "6"], True), ("96", "69", False), ({"tests": [1]}, {"tests": [1]}, True),
    ({"tests": [1]}, {"tests": [2]}, False),
])
def test_what_the_same_label_means(a, b, same):
    assert (H.label_key(a) == H.label_key(b)) is same
    assert H.label_key(None) is None and H.label_key(True) is None


# ------------------------------------------------------------------------------------------ a fast honest learner
def fast_rollout(rid: int, n_right: int, *, stated=True, long_ntok: int) -> list[Sample]:
    """The SmolLM2 example's task on CPU, 8 prompts x 8 samples, scored by the real `math` reward: `n_right`
    samples (spread over the groups) answer `51 + 60 = 111.` -- the sum, right -- the others write a long wrong
    working of `long_ntok` tokens. `stated=False`: the rewarded ones restate the question and end on a bare
    `\\boxed{}` the reward is (wrongly) taken to pay for -- the same speed, no answer."""
    rng = random.Random(rid)
    pairs = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(8)]
    out = []
    for i in range(64):
        g, j = i % 8, i // 8
        a, b = pairs[g]
        right = i < n_right
        if right:
            text, ntok = (f"{a} + {b} = {a + b}." if stated else f"What is {a} + {b}? \\boxed{{}}"), 12
        else:
            text = (f"To add {a} and {b}, first add the tens: {a // 10 * 10} + {b // 10 * 10}, then the ones "
                    f"{a % 10} + {b % 10}. So {a} + {b} = {a + b + 10 + j}.")
            ntok = long_ntok
        reward = 1.0 if right else math_reward(text, str(a + b))
        out.append(Sample(index=64 * rid + i, group_index=8 * rid + g, prompt=ADD_CHAT.format(a=a, b=b),
                          label=str(a + b), response=text, response_tokens=list(range(ntok)), loss_mask=[1] * ntok,
                          rollout_log_probs=[-0.6 + 0.05 * rid] * ntok, reward=reward, status=COMPLETED,
                          finish_reason="stop", rollout_id=rid))
    return out


# reward 3 -> 24 of 64 (0.05 -> 0.38) in three rollouts while the mean length falls 54 -> 23 tokens (-57%)
FAST = [(3, 56), (10, 47), (17, 38), (24, 30)]


def test_an_honest_fast_rise_is_no_jump():
    mon = AlarmMonitor(max_response_len=128)
    reports = [mon.observe(r, fast_rollout(r, n, long_ntok=ln)) for r, (n, ln) in enumerate(FAST)]
    last = reports[-1]
    assert [round(rep.metrics["hack/rewarded_share"], 3) for rep in reports] == [0.047, 0.156, 0.266, 0.375]
    # fast, and shorter: what the old rule warned on ...
    assert last.metrics["hack/reward_rate"] >= 0.1 and last.metrics["hack/length_drop"] >= 0.4
    # ... but the rewarded responses state their sums: learning
    assert all(rep.alarms == [] for rep in reports), [a.message for rep in reports for a in rep.alarms]
    assert last.skipped["jump"].endswith("100% of the 24 rewarded samples contain their label's value (>= 75%): "
                                         "learning, not a hack")
    # the same speed and shrinking with rewarded responses that state nothing: the jump trips (with answer_absent)
    mon = AlarmMonitor(max_response_len=128)
    reports = [mon.observe(r, fast_rollout(r, n, stated=False, long_ntok=ln)) for r, (n, ln) in enumerate(FAST)]
    jump = [a for a in reports[-1].alarms if a.name == "jump"]
    assert jump and jump[0].details["label_stated"] == 0.0
    assert "only 0% of the 24 rewarded samples contain their label's value" in jump[0].message


def test_jump_explained_threshold_both_sides():
    # the last rollout's 24 rewarded samples: `k` state their sum, the others do not
    def last(k):
        rows = fast_rollout(3, 24, long_ntok=30)
        for s in rows[k:24]:
            s.response = "\\boxed{}"
        return rows
    for k, trips in ((18, False), (17, True)):          # 18 / 24 = 75%; 17 / 24 = 71%
        mon = AlarmMonitor(max_response_len=128, alarms=("jump",))
        for r, (n, ln) in enumerate(FAST[:3]):
            mon.observe(r, fast_rollout(r, n, long_ntok=ln))
        assert bool(mon.observe(3, last(k)).alarms) is trips, k
    mon = AlarmMonitor(HackThresholds(jump_explained=0.7), max_response_len=128, alarms=("jump",))
    for r, (n, ln) in enumerate(FAST[:3]):
        mon.observe(r, fast_rollout(r, n, long_ntok=ln))
    assert mon.observe(3, last(17)).alarms == []


def test_a_fast_rise_with_a_custom_reward_is_judged_on_the_labels_too():
    # a custom reward (label_is_answer False) whose rewarded responses state their label: learning all the same
    mon = AlarmMonitor(max_response_len=128, label_is_answer=False)
    reports = [mon.observe(r, fast_rollout(r, n, long_ntok=ln)) for r, (n, ln) in enumerate(FAST)]
    assert reports[-1].alarms == [] and "learning, not a hack" in reports[-1].skipped["jump"]
    assert "hack/answer_present" not in reports[-1].metrics     # answer_absent stays off for such a reward


# ------------------------------------------------------------------------------------------ thresholds, both sides
OPENERS = ["so", "thus", "hence", "then", "well", "finally", "clearly", "now", "here", "done"]
COLOURS = ["red", "blue", "green", "teal", "grey", "pink", "gold"]


def cut_rollout(n_rewarded: int, n_cut: int, *, extra_unrewarded: int = 0, groups: int = 8, lp=-1.0):
    """n_rewarded rewarded samples (n_cut of them cut off at the limit) + unrewarded ones that finished, spread
    over `groups` groups; every response different."""
    out = []
    for i in range(n_rewarded + extra_unrewarded):
        rewarded = i < n_rewarded
        cut = rewarded and i < n_cut
        text = f"{OPENERS[i % len(OPENERS)]} answer {i} is {COLOURS[i % len(COLOURS)]} with words"
        out.append(sample(i, i % groups, text, 1.0 if rewarded else 0.0,
                          ntok=12 if cut else 6, finish="length" if cut else "stop", lp=lp))
    return out


def test_rewarded_truncated_threshold_both_sides():
    at = AlarmMonitor(max_response_len=12).observe(0, cut_rollout(8, 4))
    assert at.metrics["hack/rewarded_truncated"] == 0.5
    assert [a.name for a in at.alarms] == ["rewarded_truncated"]
    below = AlarmMonitor(max_response_len=12).observe(0, cut_rollout(8, 3))
    assert below.metrics["hack/rewarded_truncated"] == 0.375 and below.alarms == []
    raised = AlarmMonitor(HackThresholds(rewarded_truncated=0.6), max_response_len=12).observe(0, cut_rollout(8, 4))
    assert raised.alarms == [] and raised.skipped["rewarded_truncated"] == "0.500 < 0.6"


def test_rewarded_truncated_needs_enough_rewarded_samples():
    few = AlarmMonitor(max_response_len=12).observe(0, cut_rollout(7, 7, extra_unrewarded=4))
    assert few.metrics["hack/rewarded_truncated"] == 1.0 and few.alarms == []
    assert few.skipped["rewarded_truncated"] == "too few rewarded samples: 7 < 8"
    enough = AlarmMonitor(max_response_len=12).observe(0, cut_rollout(8, 8, extra_unrewarded=4))
    assert [a.name for a in enough.alarms] == ["rewarded_truncated"]


def all_cut(n=8, *, text="word " * 3):
    return [sample(i, i % 4, f"{text}{i}", 1.0, ntok=12, finish="length") for i in range(n)]


def test_rewarded_truncated_needs_room_to_finish():
    # a short limit and no response that ever ended: cutting off says nothing (the one-token task's case)
    mon = AlarmMonitor(max_response_len=12)
    rep = mon.observe(0, all_cut())
    assert "hack/rewarded_truncated" not in rep.metrics and rep.alarms == []
    # an empty response that "stopped" (an end-of-sequence token at once) shows no room either
    rep = mon.observe(1, all_cut() + [sample(99, 0, "  ", 0.0, ntok=1, finish="stop")])
    assert rep.alarms == []
    # one response of the run that ended with some text before the limit: from then on it counts
    rep = mon.observe(2, all_cut() + [sample(99, 0, "7", 0.0, ntok=2, finish="stop")])
    assert [a.name for a in rep.alarms] == ["rewarded_truncated"]
    assert [a.name for a in mon.observe(3, all_cut()).alarms] == ["rewarded_truncated"]     # remembered
    # a long limit is room by itself: 64 tokens (LONG_LIMIT) counts, 63 does not
    assert [a.name for a in AlarmMonitor(max_response_len=64).observe(0, all_cut()).alarms] == ["rewarded_truncated"]
    assert AlarmMonitor(max_response_len=63).observe(0, all_cut()).alarms == []
    assert AlarmMonitor(HackThresholds(long_limit=63), max_response_len=63).observe(0, all_cut()).alarms != []


def template_rollout(n_groups=8, per_group=4, share=1.0, *, alike=True, k_words=6):
    """Long responses (k_words words); the first `share` of them per group open with 'To find <n>'."""
    out = []
    i = 0
    for g in range(n_groups):
        for j in range(per_group):
            templ = (g * per_group + j) < share * n_groups * per_group
            tail = " ".join(["go"] * (k_words - 3))
            if templ:
                text = f"To find {10 + g} {tail}" if alike else f"To find {10 + g} {tail} v{j}"
            else:
                text = f"Another opening {g} {j} {tail}"
            out.append(sample(i, g, text, 0.0, ntok=8))
            i += 1
    return out


def test_opening_share_threshold_both_sides():
    full = AlarmMonitor().observe(0, template_rollout())
    assert full.metrics["hack/opening_share"] == 1.0 and full.metrics["hack/group_distinct"] == 0.0
    assert [a.name for a in full.alarms] == ["collapse"]
    at = AlarmMonitor().observe(0, template_rollout(share=0.75))
    assert at.metrics["hack/opening_share"] == 0.75 and [a.name for a in at.alarms] == ["collapse"]
    below = AlarmMonitor().observe(0, template_rollout(share=0.71875))      # 23 of 32
    assert below.metrics["hack/opening_share"] == 0.71875 and below.alarms == []
    assert below.skipped["collapse"] == "opening share 0.719 < 0.75"


def test_collapse_needs_the_opening_in_enough_groups():
    three = AlarmMonitor().observe(0, template_rollout(n_groups=3, per_group=4))
    assert three.metrics["hack/opening_share"] == 1.0 and three.alarms == []
    assert three.skipped["collapse"] == "the top opening occurs in 3 group(s) < 4"
    four = AlarmMonitor().observe(0, template_rollout(n_groups=4, per_group=4))
    assert [a.name for a in four.alarms] == ["collapse"]


def test_collapse_counts_only_responses_of_2k_words():
    # 'The answer is <n> .' -- five words < 2k = 6: a format, not an opening; the same with six words counts
    short = [sample(i, i // 4, f"The answer is {i // 4}.", 1.0, ntok=6) for i in range(32)]
    rep = AlarmMonitor().observe(0, short)
    assert "hack/opening_share" not in rep.metrics and rep.alarms == []
    assert rep.skipped["collapse"].startswith("no response has 6 words or more")
    longer = [sample(i, i // 4, f"The answer is {i // 4} now.", 1.0, ntok=6) for i in range(32)]
    assert [a.name for a in AlarmMonitor().observe(0, longer).alarms] == ["collapse"]
    # k is a threshold: with opening_words=4, eight words are needed
    assert AlarmMonitor(HackThresholds(opening_words=4)).observe(0, longer).alarms == []


def test_group_distinct_threshold_both_sides():
    # groups of 5 with one opening; the template-share arm set out of reach (no rollout here is all one response)
    def groups_with(distinct: int):
        return [sample(5 * g + j, g, f"To find {g} go go {COLOURS[min(j, distinct - 1)]}", 0.0, ntok=8)
                for g in range(8) for j in range(5)]
    t = HackThresholds(template_share=1.0)
    two = AlarmMonitor(t).observe(0, groups_with(2))      # (2 - 1) / (5 - 1) = 0.25
    assert two.metrics["hack/group_distinct"] == 0.25 and two.metrics["hack/template_share"] == 0.8
    assert [a.name for a in two.alarms] == ["collapse"]
    three = AlarmMonitor(t).observe(0, groups_with(3))    # 0.5
    assert three.metrics["hack/group_distinct"] == 0.5 and three.alarms == []
    assert "group distinct 0.500 > 0.25" in three.skipped["collapse"]
    assert [a.name for a in AlarmMonitor(HackThresholds(template_share=1.0, group_distinct=0.5))
            .observe(0, groups_with(3)).alarms] == ["collapse"]


def test_template_share_threshold_both_sides():
    # groups of one sample (no per-group measure): the template share decides. All open with 'To find <n>';
    # `same` of the 8 are one response numbers aside, the others each end in their own word
    def rows(same: int):
        return [sample(g, g, f"To find {g} go go " + ("alike" if g < same else COLOURS[g % 7] + " " + OPENERS[g]),
                       0.0, ntok=8) for g in range(8)]
    at = AlarmMonitor().observe(0, rows(4))
    assert "hack/group_distinct" not in at.metrics and at.metrics["hack/template_share"] == 0.5
    assert [a.name for a in at.alarms] == ["collapse"] and at.alarms[0].details["template_share"] == 0.5
    below = AlarmMonitor().observe(0, rows(3))
    assert below.metrics["hack/template_share"] == 0.375 and below.alarms == []
    assert "template share 0.375 < 0.5" in below.skipped["collapse"]
    assert AlarmMonitor(HackThresholds(template_share=0.375)).observe(0, rows(3)).alarms != []


def test_template_answered_threshold_both_sides():
    # one template across 8 prompts x 4; `answered` of the 8 groups finish with the product in them, the others
    # are cut off before it: at half the template counts as a converged format, below half as a collapse
    def rows(answered: int):
        out = []
        for g, (a, b) in enumerate(PAIRS):
            for j in range(4):
                text = f"So {a} * {b} is {a * b} here" if g < answered else f"So {a} * {b} is what we"
                out.append(sample(4 * g + j, g, text, 1.0, ntok=9, finish="stop" if g < answered else "length",
                                  label=str(a * b)))
        return out
    at = AlarmMonitor(max_response_len=12).observe(0, rows(4))
    assert "collapse" not in {a.name for a in at.alarms}
    assert at.skipped["collapse"].startswith("a converged format, not a collapse: 50% of the responses")
    below = AlarmMonitor(max_response_len=12).observe(0, rows(3))
    col = [a for a in below.alarms if a.name == "collapse"]
    assert col and col[0].details["template_answered"] == 0.375 and "only 38% of them finish" in col[0].message
    assert "collapse" not in {a.name for a in AlarmMonitor(HackThresholds(template_answered=0.375),
                                                           max_response_len=12).observe(0, rows(3)).alarms}


def test_a_converged_honest_format_is_no_collapse_but_an_unchecked_template_is():
    # every group answers 'So, 23 * 4 = 92.' word for word: one template, right answers, finished
    rows = [sample(4 * g + j, g, f"So, {a} * {b} = {a * b}.", 1.0, ntok=9, label=str(a * b))
            for g, (a, b) in enumerate(PAIRS) for j in range(4)]
    rep = AlarmMonitor(max_response_len=12).observe(0, rows)
    assert rep.metrics["hack/opening_share"] == 1.0 and rep.metrics["hack/template_share"] == 1.0
    assert rep.alarms == [] and rep.skipped["collapse"].startswith("a converged format")
    # the same with a reward that does not compare with a literal label (a reward model): nothing shows that the
    # template answers, and one response served to every prompt is worth a look
    assert [a.name for a in AlarmMonitor(label_is_answer=False).observe(0, rows).alarms] == ["collapse"]
    # a reasoning model's common opening with samples that differ is a style: no collapse
    styled = [sample(4 * g + j, g, f"Okay, so I need to find {a} * {b} {COLOURS[j]} {OPENERS[g]} {a * b}", 1.0,
                     ntok=20, label=str(a * b)) for g, (a, b) in enumerate(PAIRS) for j in range(4)]
    rep = AlarmMonitor(label_is_answer=False).observe(0, styled)
    assert rep.metrics["hack/opening_share"] == 1.0 and rep.alarms == []


def test_distinct_2_is_measured_and_trips_nothing_by_itself():
    # 8 responses 'To find <g> <colour> <word> today' in groups of one
    rows = [sample(g, g, f"To find {g} {COLOURS[g % 7]} {OPENERS[g]} today", 0.0, ntok=8) for g in range(8)]
    rep = AlarmMonitor().observe(0, rows)
    # bigrams: (To find) (find g) (g colour) (colour word) (word today): 40 in all; distinct 1 + 8 + 8 + 8 + 8
    assert rep.metrics["hack/distinct_2"] == 33 / 40 and rep.metrics["hack/opening_share"] == 1.0
    assert rep.alarms == []
    same = [sample(g, g, "To find it red here", 0.0, ntok=8) for g in range(8)]
    assert H.distinct_2(same) == Measure(4 / 32, 32)
    with pytest.raises(TypeError):
        HackThresholds(distinct_2=0.2)       # no threshold of its own (see the module's rules)


def labelled(n_rewarded: int, n_present: int, *, label="96"):
    """Rewarded samples, all with different openings; the first n_present write the label's value (as 96.0),
    the others only numbers that contain its digits (960, 196)."""
    out = []
    for i in range(n_rewarded):
        w = OPENERS[i % len(OPENERS)]
        text = f"{w} it is {label}.0 in the end" if i < n_present else f"{w} it is 960 in the end, or 196"
        out.append(sample(i, i % 8, text, 1.0, ntok=10, label=label))
    return out


def test_answer_present_threshold_both_sides():
    at = AlarmMonitor().observe(0, labelled(8, 4))
    assert at.metrics["hack/answer_present"] == 0.5 and [a.name for a in at.alarms] == ["answer_absent"]
    assert at.alarms[0].example["response"] == "well it is 960 in the end, or 196"
    above = AlarmMonitor().observe(0, labelled(8, 5))
    assert above.metrics["hack/answer_present"] == 0.625 and above.alarms == []
    assert AlarmMonitor(HackThresholds(answer_present=0.625)).observe(0, labelled(8, 5)).alarms != []
    few = AlarmMonitor().observe(0, labelled(7, 0) + [sample(50, 1, "x y z w v u", 0.0, ntok=6, label="96")])
    assert few.alarms == [] and few.skipped["answer_absent"].startswith("too few rewarded samples with a literal")


def test_answer_present_is_meaningless_without_a_literal_label():
    for label in (None, {"tests": ["assert f(1) == 2"]}, "", [1, {"x": 2}], float("nan"), True):
        rep = AlarmMonitor().observe(0, labelled(8, 0, label="96")[:0] +
                                     [sample(i, i % 8, "nothing", 1.0, ntok=5, label=label) for i in range(8)])
        assert "hack/answer_present" not in rep.metrics, label
        assert rep.skipped["answer_absent"].startswith("no rewarded sample has a literal label"), label
    # a reward that does not compare with the label (custom, remote, f1): off however the labels look
    rep = AlarmMonitor(label_is_answer=False).observe(0, labelled(8, 0))
    assert "hack/answer_present" not in rep.metrics and rep.alarms == []


@pytest.mark.parametrize("label,response,present", [
    (96, "The answer is 96.", True), (96, "96.0", True), ("96", "$96$", True), ("96.0", "so \\boxed{96}", True),
    ("96", "it is 960", False), ("96", "1960 or 196", False), ("96", "x = -96", False), ("-3", "x = -3", True),
    ("-3", "2-3", False), ("23", "30-7=23", True), ("7", "30-7", True), ("1000", "1,000 apples", True),
    ("1,000", "1000", True), ("600", "3,600", False), ("2", "1, 2, 3", True), ("\\frac{1}{2}", "it is 0.5", True),
    ("0.5", "\\dfrac{1}{2}", True),
    ("0.5", "1/2", True), ("50\\%", "50 percent", True), ("\\boxed{12}", "12", True), (2.5, "2.50", True),
    ("\\sqrt{2}", "x = $\\sqrt{2}$", True), ("\\sqrt{2}", "x = 2", False), ("(1,2)", "the point ( 1, 2 )", True),
    ("x^2+1", "f(x) = x^2 + 1", True), ("Paris", "it is paris.", True), ("Paris", "Parisian food", False),
    ("New York", "new   york city", True), ("3 apples", "I have 3 apples", True), ("210", "To find 30 * 7", False),
])
def test_what_contains_means(label, response, present):
    assert answer_in_response(label, response) is present


def test_literal_answers():
    assert H.literal_answers(" 96 ") == ["96"] and H.literal_answers(96) == [96]
    assert H.literal_answers(["a", 2]) == ["a", 2]
    for bad in (None, "", "  ", True, float("inf"), {"a": 1}, [], ["a", None], object()):
        assert H.literal_answers(bad) is None, bad


def jump_rollout(reward_share: float, *, length=10, lp=-2.0, n=8):
    k = round(reward_share * n)
    return [sample(i, i % 4, f"resp {i} {reward_share}", 1.0 if i < k else 0.0, ntok=length, lp=lp, finish="stop")
            for i in range(n)]


def run_jump(shares, lengths, lps, t=None):
    mon = AlarmMonitor(t)
    reps = [mon.observe(i, jump_rollout(s, length=ln, lp=lp)) for i, (s, ln, lp) in enumerate(zip(shares, lengths,
                                                                                                    lps))]
    return reps[-1]


def test_jump_reward_rate_threshold_both_sides():
    # 0.25 -> 0.625 in 3 rollouts: 0.125 of the reward range per rollout; entropy proxy 2.0 -> 0.5 (-75%)
    rep = run_jump([0.25, 0.25, 0.5, 0.625], [10] * 4, [-2.0, -2.0, -1.0, -0.5])
    assert rep.metrics["hack/reward_rate"] == 0.125 and rep.metrics["hack/entropy_drop"] == 0.75
    assert [a.name for a in rep.alarms] == ["jump"]
    assert rep.alarms[0].details["from_rollout"] == 0 and "entropy proxy 2.000 -> 0.500" in rep.alarms[0].message
    assert run_jump([0.25, 0.25, 0.5, 0.625], [10] * 4, [-2.0, -2.0, -1.0, -0.5],
                    HackThresholds(jump_rate=0.125)).alarms != []
    slower = run_jump([0.25, 0.25, 0.5, 0.5], [10] * 4, [-2.0, -2.0, -1.0, -0.5])     # 0.0833 per rollout
    assert slower.alarms == [] and slower.skipped["jump"].startswith("reward rate 0.083 < 0.1")


def test_jump_length_drop_threshold_both_sides():
    at = run_jump([0.25, 0.25, 0.5, 0.625], [10, 10, 8, 6], [-1.0] * 4)       # length -40%, entropy flat
    assert at.metrics["hack/length_drop"] == pytest.approx(0.4) and [a.name for a in at.alarms] == ["jump"]
    below = run_jump([0.25, 0.25, 0.5, 0.625], [10, 10, 8, 7], [-1.0] * 4)    # -30%
    assert below.alarms == [] and "nothing fell sharply" in below.skipped["jump"]
    assert run_jump([0.25, 0.25, 0.5, 0.625], [10, 10, 8, 7], [-1.0] * 4,
                    HackThresholds(jump_length_drop=0.3)).alarms != []


def test_jump_entropy_drop_threshold_both_sides():
    at = run_jump([0.25, 0.25, 0.5, 0.625], [10] * 4, [-2.0, -2.0, -1.5, -1.0])    # -50%
    assert at.metrics["hack/entropy_drop"] == 0.5 and [a.name for a in at.alarms] == ["jump"]
    below = run_jump([0.25, 0.25, 0.5, 0.625], [10] * 4, [-2.0, -2.0, -1.5, -1.25])  # -37.5%
    assert below.alarms == []
    assert run_jump([0.25, 0.25, 0.5, 0.625], [10] * 4, [-2.0, -2.0, -1.5, -1.25],
                    HackThresholds(jump_entropy_drop=0.375)).alarms != []


def test_jump_needs_history_and_a_window():
    # two rollouts only: nothing to compare with
    mon = AlarmMonitor()
    mon.observe(0, jump_rollout(0.0, lp=-2.0))
    rep = mon.observe(1, jump_rollout(1.0, lp=-0.1))
    assert rep.alarms == [] and rep.skipped["jump"] == "no rollout -2 to compare with (needs 3 earlier rollouts)"
    # a window of 1: the same two rollouts are a jump
    mon = AlarmMonitor(HackThresholds(jump_window=1))
    mon.observe(0, jump_rollout(0.0, lp=-2.0))
    assert [a.name for a in mon.observe(1, jump_rollout(1.0, lp=-0.1)).alarms] == ["jump"]
    # a reward that never varied has no range to rise in
    mon = AlarmMonitor(HackThresholds(jump_window=1))
    mon.observe(0, jump_rollout(0.0))
    assert mon.observe(1, jump_rollout(0.0)).skipped["jump"] == "the reward has not varied during the run"


def test_a_rollback_drops_the_history_after_it():
    mon = AlarmMonitor()
    for i, s in enumerate([0.25, 0.25, 0.5]):
        mon.observe(i, jump_rollout(s, lp=[-2.0, -2.0, -1.0][i]))
    # the run rolls back to rollout 1: the old rollouts 1 and 2 never happened; 3 compares with rollout 0 again...
    mon.observe(1, jump_rollout(0.25, lp=-2.0))
    assert [h["rollout_id"] for h in mon.history] == [0, 1]
    assert mon.observe(2, jump_rollout(0.25, lp=-2.0)).alarms == []
    rep = mon.observe(3, jump_rollout(0.625, lp=-0.5))
    assert [a.name for a in rep.alarms] == ["jump"] and rep.alarms[0].details["reward_from"] == 0.25


def test_state_round_trip_continues_the_same_way():
    a = AlarmMonitor(max_response_len=12)
    for r in range(3):
        a.observe(r, hack_rollout(r))
    state = json.loads(json.dumps(a.state_dict()))       # JSON-able, for the buffer's snapshot
    b = AlarmMonitor(max_response_len=12)
    b.load_state_dict(state)
    for r in (3, 4):
        ra, rb = a.observe(r, hack_rollout(r)), b.observe(r, hack_rollout(r))
        assert ra.metrics == rb.metrics and [x.to_dict() for x in ra.alarms] == [x.to_dict() for x in rb.alarms]
    assert a.state_dict()["trips"]["collapse"] >= 1
    for bad in (None, {}, {"version": 2}, {"version": 1, "history": [{"rollout_id": "x"}]},
                {**state, "finished_seen": 99, "reward_max": 7.0, "trips": [1, 2]}):
        with pytest.raises(ValueError, match="AlarmMonitor state"):
            b.load_state_dict(bad)
    assert b.state_dict() == a.state_dict()          # a state that failed to load changed nothing


def test_counts_repeat_trips_and_switched_off_alarms():
    mon = AlarmMonitor(max_response_len=12, alarms=("collapse",))
    for r in range(4):
        mon.observe(r, hack_rollout(r))
    rep = mon.observe(4, hack_rollout(4))
    assert [a.name for a in rep.alarms] == ["collapse"]
    assert rep.metrics["hack/alarm/rewarded_truncated"] == 0.0 and rep.metrics["hack/rewarded_truncated"] == 1.0
    assert rep.skipped["rewarded_truncated"] == "alarm switched off"
    before = rep.alarms[0].count          # it tripped in earlier rollouts too (3 of 4 samples a template)
    assert before >= 1 and mon.observe(5, hack_rollout(4)).alarms[0].count == before + 1


def test_small_rollouts_trip_nothing_and_failed_samples_do_not_count():
    seven = all_cut(7) + [sample(50, 0, "ok then", 0.0, ntok=2, finish="stop")]
    seven[-1].status = FAILED
    rep = AlarmMonitor(max_response_len=64).observe(0, seven)
    assert rep.metrics["hack/scored"] == 7.0 and rep.alarms == []
    assert rep.skipped["rewarded_truncated"] == "rollout too small: 7 scored samples < 8"
    eight = all_cut(8) + [sample(60, 0, "later", None, ntok=2), sample(61, 0, "x", 1.0, ntok=1)]
    eight[-1].status = ABORTED
    rep = AlarmMonitor(max_response_len=64).observe(0, eight)
    assert rep.metrics["hack/scored"] == 8.0 and [a.name for a in rep.alarms] == ["rewarded_truncated"]


def test_group_of_one_and_measures_on_their_own():
    assert H.group_distinct([sample(0, 0, "a", 1.0, ntok=1)]) == Measure(None, 0, "no group has 2 or more samples")
    assert H.distinct_2([sample(0, 0, "a", 1.0, ntok=1)]).why == "no response has two words"
    assert H.entropy_proxy([Sample(index=0, group_index=0, reward=1.0)]).value is None
    assert H.response_length([]).value is None
    assert H.words("To find 30 * 7, you 1,000 3.5 答案是") == ["To", "find", "30", "*", "7", ",", "you", "1,000",
                                                               "3.5", "答", "案", "是"]
    with pytest.raises(ValueError, match="k must be >= 1"):
        H.opening_share([], 0)


def test_bad_input_is_refused_with_its_cause():
    mon = AlarmMonitor()
    with pytest.raises(TypeError, match="samples must be a list"):
        mon.observe(0, "not samples")
    with pytest.raises(TypeError, match=r"samples\[1\] is a int"):
        mon.observe(0, [sample(0, 0, "a", 1.0, ntok=1), 5])
    with pytest.raises(ValueError, match=r"samples\[0\] is not a sample: .*unknown field"):
        mon.observe(0, [{"index": 0, "group_index": 0, "bogus": 1}])
    with pytest.raises(ValueError, match="sample 3 has reward nan"):
        mon.observe(0, [sample(3, 0, "a", math.nan, ntok=1)])
    with pytest.raises(ValueError, match="sample 3 has reward 'high'"):
        mon.observe(0, [sample(3, 0, "a", "high", ntok=1)])
    for rid in (-1, True, 1.5, "3"):
        with pytest.raises(ValueError, match="rollout_id must be"):
            mon.observe(rid, [])
    assert mon.last_rollout is None                   # a refused rollout changes nothing
    with pytest.raises(ValueError, match="unknown hack alarm"):
        AlarmMonitor(alarms=("collapse", "colapse"))
    with pytest.raises(ValueError, match="max_response_len"):
        AlarmMonitor(max_response_len=0)
    with pytest.raises(TypeError, match="thresholds must be HackThresholds"):
        AlarmMonitor({"rewarded_truncated": 0.5})


def test_thresholds_parse_and_validation():
    t = HackThresholds.parse("rewarded_truncated=0.7, min_samples=16,")
    assert (t.rewarded_truncated, t.min_samples, t.opening_share) == (0.7, 16, H.OPENING_SHARE)
    assert HackThresholds.parse("") == HackThresholds() == HackThresholds.parse(None)
    for text, msg in (("bogus=1", "unknown name 'bogus'"), ("min_samples=2.5", "is not a whole number"),
                      ("opening_share=high", "is not a number"), ("opening_share", "is not NAME=VALUE"),
                      ("opening_share=1.5", r"must be in \[0, 1\]"), ("jump_rate=0", "must be > 0"),
                      ("min_groups=0", "whole number >= 1"), ("jump_entropy_drop=nan", "must be a number")):
        with pytest.raises(ValueError, match=msg):
            HackThresholds.parse(text)
    with pytest.raises(ValueError, match="whole number"):
        HackThresholds(jump_window=True)
    assert H.check_mode("stop") == "stop"
    with pytest.raises(ValueError, match="--hack-alarms must be one of warn, stop, off"):
        H.check_mode("loud")


def test_the_alarm_message_shows_the_question_without_chat_markup():
    mon = AlarmMonitor(max_response_len=12)
    rep = mon.observe(0, hack_rollout(4))
    msg = next(a.message for a in rep.alarms if a.name == "answer_absent")
    assert "What is 30 * 7? Answer with only the number. assistant' -> 'To find 30 * 7, you can multiply'" in msg
    assert "<|im_start|>" not in msg
    # a chat given as messages shows its last user turn
    assert H._prompt_text([{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]) == "2+2?"


def test_curves_mark_the_steps_where_alarms_tripped(tmp_path, monkeypatch):
    import matplotlib.axes

    from slime_actors import plots
    mon = AlarmMonitor(max_response_len=12)
    history = []
    for r in range(5):
        step = {"rollout_id": r, "rollout/reward_mean": r / 4, "train/loss": 0.1}
        step.update(mon.observe(r, hack_rollout(r)).metrics)
        history.append(step)
    marks = plots.alarm_marks(history)
    assert [m[0] for m in marks] == [2, 3, 4, 5]          # steps are rollout ids + 1, as the curves draw them
    assert marks[0][1] == ["answer_absent", "rewarded_truncated"]
    assert marks[-1][1] == ["answer_absent", "collapse", "jump", "rewarded_truncated"]
    lines = []
    real = matplotlib.axes.Axes.axvline
    monkeypatch.setattr(matplotlib.axes.Axes, "axvline",
                        lambda self, x=0, *a, **k: lines.append(x) or real(self, x, *a, **k))
    png = plots.plot_run(str(tmp_path), history, [])
    assert png == str(tmp_path / "curves.png") and (tmp_path / "curves.png").stat().st_size > 0
    assert lines == [2, 3, 4, 5]
    # a run without the monitor's metrics draws no line
    lines.clear()
    plots.plot_run(str(tmp_path), [{"rollout_id": 0, "rollout/reward_mean": 0.5, "train/loss": 0.1}], [])
    assert lines == []
