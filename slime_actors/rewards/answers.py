"""A response's final answer, and numbers read exactly -- pure string work in linear time, no math-verify.

    extract_answer(r"so 12 * 8 = 96.")                 -> Answer("96", "number")
    extract_answer(r"The answer is $\\frac{1}{2}$.")   -> Answer(r"$\\frac{1}{2}$", "stated")
    extract_answer(r"... \\boxed{96} apples")          -> Answer("96", "boxed")
    extract_answer("To calculate 12 * 8, multiply")    -> Answer("8", "number")     (not 96: no answer was given)
    gold_number("1,024") -> Fraction(1024);  gold_number(r"3\\sqrt{2}") -> None   (not a plain number)
    answer_number(r"96 \\text{ apples}", fractions=False) -> Fraction(96)
    answer_number(r"12 \\times 8", fractions=False)      -> None                   (arithmetic, not a number)

The rules (docs/adding-a-reward-actor.md, *How `math` grades*):

1. The answer is the content of the last non-empty \\boxed{...} / \\fbox{...}; else the last explicit final-answer
   form -- "answer is X", "answer: X" (any case; "The final answer is", "**Answer:**" included) or "#### X" -- whose X
   starts like a math answer (a digit, a sign, ".", "$", "\\", "(", "[", "{"), X running to the end of its line
   and cut at the first ". "; else the last number-like value of the response (an integer, a decimal, a number
   with thousands commas, \\frac{a}{b}; a sign when it is not a subtraction).
2. A gold label that is a plain number (an integer or decimal, optionally with thousands commas; or a fraction
   of integers: a/b, \\frac{a}{b}) is compared exactly: the answer, after its last "=", must itself be a plain
   number (with unit words, $, \\text{}, %, a trailing period allowed around it) of the same value. An integer
   gold takes no fraction. So `12 * 8` and `\\boxed{12 \\times 8}` are not answers to 96; `12 * 8 = 96` is.
3. Any other gold label (3\\sqrt{2}, (-\\infty, 2), \\{1, 2\\}, x = 5 ...) is compared by math-verify
   (slime_actors.rewards.grading, in a process with a deadline).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from fractions import Fraction

__all__ = ["Answer", "extract_answer", "boxed_answer", "extract_boxed", "iter_boxed", "gold_number", "answer_number",
           "strip_math_delimiters"]

_BOX_CMDS = ("\\boxed", "\\fbox")


@dataclass(frozen=True)
class Answer:
    text: str
    source: str   # "boxed", "stated" (an explicit final-answer form) or "number" (the last number-like value)


def extract_boxed(text: str | None) -> str | None:
    """Contents of the last top-level \\boxed{...} (or \\fbox{...}, or `\\boxed x`) in `text`, None if there is none
    or it is unbalanced. Escaped braces (\\{ \\}) do not count as nesting."""
    last = None
    for box in iter_boxed(text):
        last = box
    return last


def iter_boxed(text: str | None):
    """The contents of every top-level \\boxed{...} / \\fbox{...} / `\\boxed x` of `text`, in order, up to the
    first unbalanced one."""
    if not text:
        return
    i = 0
    n = len(text)
    while True:
        starts = [(text.find(c, i), c) for c in _BOX_CMDS]
        starts = [(s, c) for s, c in starts if s >= 0]
        if not starts:
            return
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
                return
            yield text[j + 1:k]
            i = k + 1
        elif cmd == "\\boxed" and j > s + len(cmd):    # "\boxed 5": up to whitespace or $
            m = re.match(r"[^\s$]+", text[j:])
            if m:
                yield m.group(0)
                i = j + m.end()
            else:
                i = j
        else:
            i = j


# "answer is X", "answer: X", "Answer = X", "#### X" (markdown bold around "answer" allowed); X up to the line's end
_FINAL = re.compile(r"(?:\banswer\b\**[ \t]*(?:is\b|:|=)|####)[ \t]*:?[ \t]*([^\n]*)", re.IGNORECASE)
_MATHY_START = re.compile(r"[*_ \t]*[-+\d.$\\(\[{]")
# number-like values: \frac{a}{b} (\dfrac, \tfrac), numbers with thousands commas, integers and decimals
_NUMBER = re.compile(r"\\[dt]?frac\{\s*\d+\s*\}\{\s*\d+\s*\}|\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)|\d+(?:\.\d+)?")
_SIGN_BEFORE = set(" \t\n=(:[{$")


def boxed_answer(response: str | None) -> Answer | None:
    """The last non-empty \\boxed{} of the response (an empty one is the instruction echoed, not an answer)."""
    boxed = None
    for box in iter_boxed(response):
        if box.strip():
            boxed = box
    return Answer(boxed.strip(), "boxed") if boxed is not None else None


def extract_answer(response: str | None) -> Answer | None:
    """The response's final answer (rule 1 of the module docstring), or None when it states none."""
    if not response:
        return None
    boxed = boxed_answer(response)
    if boxed is not None:
        return boxed
    stated = None
    for m in _FINAL.finditer(response):
        x = m.group(1)
        if _MATHY_START.match(x):
            stated = x
    if stated is not None:
        x = re.split(r"\.(?=\s|$)", stated, maxsplit=1)[0]
        x = x.strip().strip("*_").strip()
        if x:
            return Answer(x, "stated")
    last = None
    for m in _NUMBER.finditer(response):
        last = m
    if last is None:
        return None
    s = last.start()
    sign = ""
    if s > 0 and response[s - 1] in "-+" and (s == 1 or response[s - 2] in _SIGN_BEFORE):
        sign = "-" if response[s - 1] == "-" else ""
    return Answer(sign + last.group(0), "number")


# ------------------------------------------------------------------------------------------------ plain numbers
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_DROP = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "\\displaystyle", "{,}", "\\$", "$", "**",
         "^\\circ", "^{\\circ}", "\\%", "%", "\\(", "\\)")
_INT = r"(?:\d{1,3}(?:,\d{3})+|\d+)"
_DEC = rf"(?:{_INT}(?:\.\d+)?|\.\d+)"
_FRAC = r"(?:\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}|\\[dt]?frac(\d)(\d)|(\d+)\s*/\s*(\d+))"
_PLAIN = re.compile(rf"^\s*([-+]?)\s*(?:{_FRAC}|({_DEC}))\s*$")
# an answer: sign, number, optional unit words, then the end or a boundary (punctuation, an opening parenthesis)
# (each unit word is taken whole -- the lookahead -- so a long word cannot be split in exponentially many ways)
_LEADING = re.compile(rf"^\s*([-+]?)\s*(?:{_FRAC}|({_DEC}))((?:\s*[A-Za-z][A-Za-z']*(?![A-Za-z']))*)\s*"
                      r"(?:$|[,;:!?.)(])")


def strip_math_delimiters(s: str) -> str:
    """`s` without surrounding $...$, \\(...\\), \\[...\\] and whitespace."""
    s = s.strip()
    for a, b in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(s) >= len(a) + len(b) and s.startswith(a) and s.endswith(b):
            return s[len(a):len(s) - len(b)].strip()
    return s


def _clean(s: str) -> str:
    s = _TEXT_WRAP.sub(r" \1 ", s)
    for d in _DROP:
        s = s.replace(d, " " if d.startswith("\\") and d not in ("\\$",) else "")
    return s.strip()


def _value(m: re.Match, first_group: int) -> tuple[Fraction, bool]:
    """(value, is_fraction) from a _PLAIN / _LEADING match whose sign is group 1 and frac groups follow."""
    g = m.groups()
    sign = -1 if g[0] == "-" else 1
    fa, fb, sa, sb, pa, pb, dec = g[first_group:first_group + 7]
    for num, den in ((fa, fb), (sa, sb), (pa, pb)):
        if num is not None:
            if int(den) == 0:
                raise ZeroDivisionError
            return sign * Fraction(int(num), int(den)), True
    return sign * Fraction(dec.replace(",", "")), False


def gold_number(label) -> Fraction | None:
    """The label's value when it is a plain number (rule 2), else None."""
    if isinstance(label, bool):
        return None
    if isinstance(label, int):
        return Fraction(label)
    return _gold_number(str(label))


@functools.lru_cache(maxsize=4096)
def _gold_number(label: str) -> Fraction | None:
    """(Cached: a group's samples share their label -- a group of 8 math samples scored in 0.333 ms instead of
    0.376 on a 2-vCPU VM --; a Fraction is immutable.)"""
    s = label.strip()
    boxed = extract_boxed(s)
    if boxed is not None and s.lstrip("$ ").startswith(_BOX_CMDS):
        s = boxed
    s = strip_math_delimiters(s)
    m = _PLAIN.match(s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac"))
    if m is None:
        return None
    try:
        return _value(m, 1)[0]
    except ZeroDivisionError:
        return None


def answer_number(answer: str, fractions: bool) -> Fraction | None:
    """The value of an extracted answer that is a plain number (rule 2): the text after its last "=", cleaned of
    $, \\text{}, spacing commands, %, degree signs, may hold a number, then unit words, then the end or a
    punctuation mark. Anything else (an operator after the number, a word before it) is None. Fractions (a/b,
    \\frac{a}{b}) count only with `fractions`."""
    s = _clean(answer)
    if "=" in s:
        s = s.rsplit("=", 1)[1]
    m = _LEADING.match(s)
    if m is None:
        return None
    try:
        value, is_frac = _value(m, 1)
    except ZeroDivisionError:
        return None
    if is_frac and not fractions:
        return None
    return value
