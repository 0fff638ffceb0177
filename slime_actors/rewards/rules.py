"""Rule-based rewards: answer extraction and comparison (no model, no network).

    extract_boxed(r"so \\boxed{\\frac{1}{2}}.")   -> r"\\frac{1}{2}"   (last \\boxed{...}/\\fbox{...}, nested braces)
    math_reward("... \\boxed{0.5}", r"\\frac{1}{2}")  -> 1.0          (the final answer, graded; see below)
    math_reward("To calculate 12 * 8, multiply", "96") -> 0.0       (restating the question is no answer)
    grade_math(response, label) -> Grade(score, answer, timed_out)   (what math_reward decided, and why)
    boxed_only_math_reward, dapo_reward, boxed_reward, exact_match_reward, f1_reward

Each takes (response, label) and returns a float in [0, 1] (dapo_reward: +1 / -1, as slime's dapo). A label may
be a list of acceptable answers (the best score counts). A missing label (None) is a ValueError: the rule has
nothing to compare with (set --label-key).

math_reward grades the response's final answer only: extraction and the comparison of plain numbers are in
slime_actors.rewards.answers (the rules, exactly), anything symbolic goes to math-verify in a grading process with
a hard deadline (slime_actors.rewards.grading): past it the item scores 0 and counts as timed out, in any thread.
docs/adding-a-reward-actor.md states the rules and how they differ from slime's math, deepscaler and dapo.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass

from .answers import Answer, answer_number, boxed_answer, extract_answer, extract_boxed, gold_number
from .grading import DEFAULT_TIMEOUT, grading_pool

__all__ = ["extract_boxed", "normalize_boxed", "math_reward", "grade_math", "agrade_math", "Grade",
           "boxed_only_math_reward", "dapo_reward", "boxed_reward", "exact_match_reward", "f1_reward",
           "strip_thinking"]


def strip_thinking(response: str) -> str | None:
    """The part after the last </think>, None if the response has an unfinished <think> (no </think>)."""
    if "</think>" in response:
        return response.rsplit("</think>", 1)[1]
    if "<think>" in response:
        return None
    return response


_BOX_CMDS = ("\\boxed", "\\fbox")
_TEXT_CMD = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")


def normalize_boxed(ans) -> str:
    """A light normal form for comparing short answers as strings: no spaces, $, \\left/\\right, spacing commands,
    \\text{} wrappers, degree signs, trailing period; \\dfrac/\\tfrac -> \\frac; lower case."""
    s = str(ans).strip()
    inner = extract_boxed(s)
    if inner is not None and s.lstrip("$ ").startswith(_BOX_CMDS):
        s = inner
    s = _TEXT_CMD.sub(r"\1", s)
    for a, b in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\:", ""),
                 ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("^\\circ", ""), ("^{\\circ}", ""), ("\\%", ""),
                 ("$", ""), ("\\displaystyle", "")):
        s = s.replace(a, b)
    s = re.sub(r"\s+", "", s)
    s = s.rstrip(".")
    return s.lower()


def _labels(label) -> list:
    if label is None:
        raise ValueError("sample has no label to compare with (set --label-key)")
    return list(label) if isinstance(label, (list, tuple)) else [label]


def boxed_reward(response: str, label) -> float:
    """1.0 when the last \\boxed{...} of the response equals the label (or the label's own \\boxed{}) after
    `normalize_boxed`; 0.0 otherwise, and when the response has no box."""
    got = extract_boxed(response or "")
    if got is None:
        return 0.0
    got = normalize_boxed(got)
    return 1.0 if any(got == normalize_boxed(lab) for lab in _labels(label)) else 0.0


def exact_match_reward(response: str, label, ignore_case: bool = False, normalize_whitespace: bool = True) -> float:
    """1.0 when response and label are equal after strip() (and collapsing runs of whitespace; and case folding
    with `ignore_case`)."""
    def norm(s):
        s = str(s).strip()
        if normalize_whitespace:
            s = " ".join(s.split())
        return s.casefold() if ignore_case else s
    r = norm(response or "")
    return 1.0 if any(r == norm(lab) for lab in _labels(label)) else 0.0


def _squad_normalize(s: str) -> str:
    s = str(s).lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1_reward(response: str, label) -> float:
    """Token-level F1 between response and label after SQuAD normalization (lower case, no punctuation or
    articles); yes/no/noanswer must match exactly (slime's rm_hub f1)."""
    best = 0.0
    for lab in _labels(label):
        pred, gold = _squad_normalize(response or ""), _squad_normalize(lab)
        if (pred in ("yes", "no", "noanswer") or gold in ("yes", "no", "noanswer")) and pred != gold:
            continue
        p_toks, g_toks = pred.split(), gold.split()
        same = sum((Counter(p_toks) & Counter(g_toks)).values())
        if same == 0:
            continue
        precision, recall = same / len(p_toks), same / len(g_toks)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


@dataclass(frozen=True)
class Grade:
    score: float                 # 1.0 or 0.0
    answer: Answer | None        # the final answer found (None: the response states none)
    timed_out: bool = False      # math-verify ran out of time (the score is then 0)


def _plan(answer: Answer | None, label) -> tuple[Grade | None, list[str]]:
    """A grade decided here (plain numbers), or the labels math-verify must compare the answer with."""
    labels = _labels(label)
    if answer is None:
        return Grade(0.0, None), []
    symbolic = []
    for lab in labels:
        gold = gold_number(lab)
        if gold is not None:
            got = answer_number(answer.text, fractions=gold.denominator != 1)
            if got is not None and got == gold:
                return Grade(1.0, answer), []
        elif str(lab).strip():
            symbolic.append(str(lab))
    if not symbolic:
        return Grade(0.0, answer), []
    return None, symbolic


def grade_math(response: str | None, label, timeout: float = DEFAULT_TIMEOUT, boxed_only: bool = False) -> Grade:
    """The math grade of a response: its final answer (the last \\boxed{}; else "answer is X" / "Answer: X" /
    "#### X"; else its last number), compared with the label -- exactly for a plain-number label, by math-verify
    (within `timeout` seconds, in any thread) for anything else. `boxed_only`: only a \\boxed{} answer counts."""
    answer = _answer(response, boxed_only)
    grade, symbolic = _plan(answer, label)
    if grade is not None:
        return grade
    out = grading_pool().verify(symbolic, answer.text, answer.source, timeout)
    return Grade(float(out["score"]), answer, bool(out.get("timed_out")))


async def agrade_math(response: str | None, label, timeout: float = DEFAULT_TIMEOUT, boxed_only: bool = False
                      ) -> Grade:
    """`grade_math` for an event loop: math-verify's wait happens in a pool thread."""
    answer = _answer(response, boxed_only)
    grade, symbolic = _plan(answer, label)
    if grade is not None:
        return grade
    out = await grading_pool().averify(symbolic, answer.text, answer.source, timeout)
    return Grade(float(out["score"]), answer, bool(out.get("timed_out")))


def _answer(response: str | None, boxed_only: bool) -> Answer | None:
    return boxed_answer(response) if boxed_only else extract_answer(response)


def math_reward(response: str, label, timeout: float = DEFAULT_TIMEOUT) -> float:
    """1.0 when the response's final answer equals the label, else 0.0 (see `grade_math`). A response that only
    restates the question (`12 * 8`) has no answer equal to 96; `12 * 8 = 96` has."""
    return grade_math(response, label, timeout).score


def boxed_only_math_reward(response: str, label, timeout: float = DEFAULT_TIMEOUT) -> float:
    """`math_reward` where only a \\boxed{} (or \\fbox{}) answer counts: no box, no reward."""
    return grade_math(response, label, timeout, boxed_only=True).score


# ------------------------------------------------------------------------------------------------ dapo
# slime's `dapo` (rm_hub/math_dapo_utils.py, from DAPO / the Minerva harness): the last "Answer: X" line of the
# response's final 300 characters, normalized, must equal the integer label as a string; +1 or -1.
_DAPO_ANSWER = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)
_DAPO_REPLACE = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
                 (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_DAPO_REMOVE = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
                "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
                "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
                "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
                ",\\!", "{,}", '"', "\\dots", "<|im_end|>", "<|endoftext|>")


_DAPO_UNWRAP = tuple(re.compile(rf"\\{cmd}\{{(.*?)\}}") for cmd in ("text", "textbf", "overline"))


def _dapo_normalize(text: str) -> str:
    """DAPO's answer normal form: the text after the last "=", without spaces, articles, dollar signs, unit words
    and LaTeX wrappers (the first $...$ pair's content, \\text{}, \\textbf{}, \\overline{}, \\boxed{}), with
    \\fracab / \\sqrta spelled out and thousands commas dropped from a number."""
    s = str(text).split("=")[-1]
    for a, b in _DAPO_REPLACE:
        s = s.replace(a, b)
    for w in _DAPO_REMOVE:
        s = s.replace(w, "")
    first = s.find("$")
    second = s.find("$", first + 1) if first >= 0 else -1
    if first >= 0 and second > first and "\n" not in s[:second]:
        s = f"${s[first + 1:second]}$"
    for unwrap in _DAPO_UNWRAP:
        s = unwrap.sub(r"\1", s)
    box = s.find("\\boxed{")
    close = s.rfind("}")
    if box >= 0 and close > box:
        s = s[:box] + s[box + len("\\boxed{"):close] + s[close + 1:]
    s = re.sub(r"frac([^{])(.)", r"frac{\1}{\2}", s)
    s = re.sub(r"sqrt([^{])", r"sqrt{\1}", s)
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def dapo_reward(response: str, label) -> float:
    """slime's `dapo` rule: +1.0 when the last "Answer: X" of the response's final 300 characters, normalized
    (the text after its last "=", units and LaTeX wrappers removed), is the integer label; -1.0 otherwise,
    including no "Answer:" line. A label that is not an integer is a ValueError (DAPO's answers are integers)."""
    golds = []
    for lab in _labels(label):
        g = _dapo_normalize(lab)
        try:
            golds.append(str(int(float(g))))
        except ValueError:
            raise ValueError(f"dapo grades integer answers; label {lab!r} is not an integer") from None
    found = _DAPO_ANSWER.findall((response or "")[-300:])
    pred = _dapo_normalize(found[-1]) if found else None
    return 1.0 if pred is not None and pred in golds else -1.0
