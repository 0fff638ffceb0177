"""Rule-based rewards: answer extraction and comparison (no model, no network).

    extract_boxed(r"so \\boxed{\\frac{1}{2}}.")   -> r"\\frac{1}{2}"   (last \\boxed{...}/\\fbox{...}, nested braces)
    math_reward("... \\boxed{0.5}", r"\\frac{1}{2}")  -> 1.0          (math-verify equivalence)
    boxed_reward, exact_match_reward, f1_reward

Each takes (response, label) and returns a float in [0, 1]. A label may be a list of acceptable answers (the best
score counts). A missing label (None) is a ValueError: the rule has nothing to compare with (set --label-key).
"""

from __future__ import annotations

import re
import string
import threading
from collections import Counter

__all__ = ["extract_boxed", "normalize_boxed", "math_reward", "boxed_reward", "exact_match_reward", "f1_reward",
           "strip_thinking"]

_BOX_CMDS = ("\\boxed", "\\fbox")


def extract_boxed(text: str | None) -> str | None:
    """Contents of the last top-level \\boxed{...} (or \\fbox{...}, or `\\boxed x`) in `text`, None if there is none
    or it is unbalanced. Escaped braces (\\{ \\}) do not count as nesting."""
    if not text:
        return None
    found = None
    i = 0
    n = len(text)
    while True:
        starts = [(text.find(c, i), c) for c in _BOX_CMDS]
        starts = [(s, c) for s, c in starts if s >= 0]
        if not starts:
            return found
        s, cmd = min(starts)
        j = s + len(cmd)
        if j < n and (text[j].isalpha()):          # e.g. \boxedfoo: another command
            i = j
            continue
        while j < n and text[j] == " ":
            j += 1
        if j < n and text[j] == "{":
            depth, k = 0, j
            while k < n:
                ch = text[k]
                if ch == "\\":
                    k += 2
                    continue
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                    if depth == 0:
                        break
                k += 1
            if k >= n:           # unbalanced: nothing after this can be a complete box either
                return found
            found = text[j + 1:k]
            i = k + 1
        elif cmd == "\\boxed" and j > s + len(cmd):    # "\boxed 5": up to whitespace or $
            m = re.match(r"[^\s$]+", text[j:])
            if m:
                found = m.group(0)
                i = j + m.end()
            else:
                i = j
        else:
            i = j


def strip_thinking(response: str) -> str | None:
    """The part after the last </think>, None if the response has an unfinished <think> (no </think>)."""
    if "</think>" in response:
        return response.rsplit("</think>", 1)[1]
    if "<think>" in response:
        return None
    return response


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


def _gold_candidates(label: str):
    from math_verify import parse
    label = str(label).strip()
    if not label:
        return []
    timeout = _timeout()
    gold = parse(label, parsing_timeout=timeout)
    if not gold and "$" not in label and "\\boxed" not in label:
        gold = parse(f"${label}$", parsing_timeout=timeout)
    return gold


def _timeout():
    # math-verify's timeouts use signal.alarm, which only works in the main thread
    return 5 if threading.current_thread() is threading.main_thread() else None


def math_reward(response: str, label) -> float:
    """1.0 when math-verify finds the response's answer (its last \\boxed{} first, else any answer-like
    expression) equivalent to the label (0.5 == \\frac{1}{2}, 1/2, ...); 0.0 otherwise, including unparsable
    input. Runs math-verify with its 5 s timeouts in the main thread, without them elsewhere."""
    from math_verify import parse, verify
    labels = _labels(label)
    response = response or ""
    timeout = _timeout()
    try:
        boxed = extract_boxed(response)
        pred = parse(f"\\boxed{{{boxed}}}", parsing_timeout=timeout) if boxed is not None else []
        if not pred:
            pred = parse(response, parsing_timeout=timeout)
        if not pred:
            return 0.0
        for lab in labels:
            gold = _gold_candidates(lab)
            if gold and verify(gold, pred, timeout_seconds=timeout):
                return 1.0
    except Exception:          # math-verify is best-effort: anything it cannot handle scores 0
        return 0.0
    return 0.0
