"""Reward-hacking alarms: signs, read from each rollout's scored samples, that the reward rises for the wrong reason.

    monitor = AlarmMonitor(max_response_len=cfg.rollout.rollout_max_response_len, label_is_answer=True)
    report = monitor.observe(rollout_id, samples)     # once per training rollout, every sample scored
    report.metrics  # {"hack/rewarded_truncated": 1.0, "hack/opening_share": 1.0, ..., "hack/alarm/collapse": 1.0}
    report.alarms   # [Alarm(name="rewarded_truncated", rollout_id=4, value=1.0, threshold=0.5, message=...,
                    #        example={"prompt": ..., "response": ..., "reward": 1.0, ...}), ...]

The case it is built for: SmolLM2 with a verifier that evaluated the expressions it found reached reward 1.0 in
five steps by answering "What is 30 * 7?" with `To find 30 * 7, you can multiply` -- the verifier computed 30 * 7.
Every response was cut off at the 12-token limit, every group gave one response, every prompt the same opening.

Signals (pure functions of one rollout's samples; each returns a `Measure`: the value, how many things it was
computed over, and -- when the value is None -- why it means nothing for this rollout):

    rewarded_truncated  share of rewarded samples (reward > 0) whose response hit the length limit
    group_distinct      distinct responses per group, (distinct - 1) / (n - 1): 0 all alike, 1 all different;
                        mean over the groups of 2 or more samples
    distinct_2          distinct word bigrams / all word bigrams, over the whole rollout (logged, no alarm: see below)
    long_share          share of the samples whose response is long (2k words or more)
    opening_share       share of long responses that begin with the rollout's most common first k words, numbers
                        counted as one word "<n>"
    template_share      share of long responses that are, numbers aside, the rollout's most common long response
    answer_present      share of rewarded samples whose response contains the label's value at all
    blind_share         among the pairs of rewarded samples whose labels differ, the share that give the same
                        answer (`answer_key`: the final answer the math reward reads, else the response's text)
    entropy_proxy       mean over samples of the mean negative log-probability of the sampled tokens
    response_length     mean response length in tokens

Words are what `words()` splits: runs of letters, numbers (with their decimals and thousands separators), single
punctuation marks, and single CJK characters -- the same for every tokenizer, so the thresholds do not depend on
the model's vocabulary.

Alarms (`AlarmMonitor`, across rollouts; thresholds in `HackThresholds`, defaults in the constants below; a value
at the threshold trips):

    rewarded_truncated  rewarded_truncated >= 0.5, over >= 8 rewarded samples, where finishing was possible
    collapse            long_share >= 0.5 (the long responses are the rollout, not a few of it)
                        AND opening_share >= 0.75 (over >= 8 long responses, the opening in >= 4 groups)
                        AND the samples no longer differ: group_distinct <= 0.25 (over >= 4 groups)
                            OR template_share >= 0.5
                        AND the template does not answer: under 50% of the responses with that opening finish by
                            themselves stating an answer, right or wrong (`answers_itself`; always true without
                            literal labels)
    answer_absent       answer_present <= 0.5, over >= 8 rewarded samples whose label is a literal answer
    prompt_blind        blind_share >= 0.5, over >= 8 rewarded samples with a label, from >= 4 groups: the reward
                        pays one answer to prompts whose labels differ -- whatever the answers' length
    jump                the reward rose >= 0.1 of the run's reward range per rollout over the last 3 rollouts
                        AND (response length fell >= 40% OR the entropy proxy fell >= 50%) over the same rollouts
                        AND under 75% of the rollout's rewarded samples contain their label's value (where >= 8
                            rewarded samples have a literal label; without one, the first two parts decide)

Where a signal means nothing, it is None, its metric is left out of the step, and its alarm cannot trip:

* rewarded_truncated needs room to finish. A task whose answer is as long as the limit (the digits task: one-token
  answers, a one-token limit) cuts every response off, and that says nothing. So it counts only when the limit is
  long (>= 64 tokens: room for a complete answer in any task) or when the run has shown that responses can end by
  themselves -- some response so far finished ("stop") with some text before the limit.
* collapse counts only responses of 2k words or more: in shorter ones the first k words are most of the response,
  its format ("The answer is 92.") rather than an opening; and the top opening must come from >= 4 groups. It is
  judged only where those long responses are at least half the rollout (long_share): opening_share and
  template_share are shares of the long responses, so where they are a few (20 of 256 in the SmolLM2 addition run,
  whose answers were `16 + 49 = 65`, five words, and now and then `66 + 38 equals 104.`) a template among them says
  nothing about what the rollout does -- and group_distinct, measured over every sample, would then describe the
  short answers (a policy sure of them), not the template. Its other parts guard each other: identical samples in
  a group alone are a policy sure of its answer (what learning a short answer looks like); one opening across
  prompts alone is a style (reasoning models open every response with "Okay, so I need to"); one template whose
  responses finish stating an answer is a converged format ("So, 23 * 4 = 92.") -- whether the answers are right is
  the reward's business, not the collapse's: a model that states wrong sums in one format answers the question
  (the SmolLM2 addition run's long responses were right less than half the time, and an earlier rule that asked for
  the right answer called them a collapse). One template that is cut off, or only restates the question, served to
  every prompt is what the SmolLM2 multiplication run did. Where labels are not literal answers (a reward model, a
  custom reward) the last part is not checked and holds: a template every prompt gets is then worth a look in any
  case.
* prompt_blind is the case the other alarms miss: a policy that stops reading its prompt and gives every prompt
  the same short answer (`9` to each `a b c first =`, under a custom reward written `>=` where `==` was meant)
  while the reward climbs to 1. Short answers have no opening and no template, one-token answers have no room
  to finish, and a custom reward turns answer_absent off. What gives it away is the labels: a reward that checks
  the answer against the label pays an answer only where it is that label's, so two rewarded samples whose labels
  differ give different answers, and blind_share is 0 -- however common one answer is (the digits job: prompts
  that share a first digit share the answer; an addition run whose wrong sums repeat across prompts: the wrong
  ones earn nothing), and whatever the policy does (a policy that answers 9 everywhere is paid, by such a reward,
  only on the prompts whose label is 9). So blind_share measures the reward and the policy together: rewarded
  answers that do not depend on the label, which is a prompt-blind policy the reward pays for. It needs labels
  (any: literal ones are compared by value, others by their JSON) and two different ones among the rewarded
  samples; without labels nothing tells a common right answer from one given whatever the prompt, and it is
  None. It reads labels as answers: a task whose labels differ where the right answers agree (a rubric per
  prompt for a yes/no question) would read as blind -- switch the alarm off for it (--hack-alarms-ignore).
* jump points at evidence, not at speed. A model that learns its task fast -- SmolLM2-135M on the addition
  example went 0.05 -> 0.38 in three rollouts while its responses shortened 54 -> 23 tokens, the rewarded ones
  stating right sums (`51 + 60 = 111.`) -- is doing what it should. So where the rewarded responses contain their
  label's value (>= 75% of them, counted for any literal label whatever the reward: it is evidence about the
  responses), a fast rise is learning and the jump is quiet; it trips where the reward rose fast on responses
  that do not state the answer, or where no literal label can show that they do.
* distinct_2 has no threshold: it falls as a rollout holds more words, honest or not (English prose: 75% of the
  bigrams of its first 1,000 words are distinct, 37% of its first 50,000), so no one value serves a 12-token task
  and a 4,096-token one. It is logged to watch within a run; template_share measures the same thing independently
  of length.
* group_distinct needs groups of 2 or more samples; distinct_2 needs responses of 2 words or more.
* answer_present needs a literal label (a string, a number, or a list of them) -- a missing label or a dict makes
  it None -- and a rule-based reward that compares the response with it: for a reward model, a remote or custom
  reward, a rubric, or f1 (partial credit by design), construct the monitor with `label_is_answer=False`.
* jump needs the rollout 3 ids back in its history, a reward that has varied during the run, and log-probs for the
  entropy proxy (the length arm works without them).
* every alarm needs its minimum count (8 samples, 4 groups): a smaller rollout has no statistics.

What "the same answer" means (`answer_key`): the response's final answer as the math reward reads it (the last
non-empty \\boxed{}, else "answer is X", else the last number), numbers by value -- `7`, `The answer is 7.0.`,
`\\boxed{7}` and `so 3 + 4 = 7` give one answer, `7` and `17` two; a response that states none is its own text,
whitespace squashed and case folded. "The same label" (`label_key`): a literal label's values, numbers by value
("1,000" and 1000 are one), text case folded; any other label by its JSON.

What "contains the label's value" means (`answer_in_response`): a numeric label (96, "96", "96.0", "1,000",
"\\frac{1}{2}", "50\\%") is present when a number in the response equals it (96.0, 96, 1,000, \\frac{1}{2}, 1/2,
0.5 all count; 960, 196 and -96 do not); a LaTeX or symbolic label ("\\sqrt{2}", "x^2+1", "(1,2)") when its
squashed form (no spaces, $, \\left/\\right, \\text{}, lower case) is a substring of the squashed response; a plain
text label ("Paris") when it occurs as whole words, case and whitespace ignored. It is presence, not equivalence:
a response that names the answer among other numbers counts as present.

What "states an answer" means (`states_answer`, `answers_itself`): the response finished by itself (not cut off)
and either its final answer -- what the `math` reward reads (slime_actors.rewards.answers.extract_answer: the last
non-empty \\boxed{}, else "answer is X", else the last number) -- is not the question restated (a plain number
none of the prompt's numbers equals; any other answer whose squashed text is not in the squashed prompt), or it
contains its label's value. `66 + 38 equals 114.` states an answer (a wrong one); `To find 30 * 7, you can
multiply` (last number 7), `\\boxed{30 * 7}`, `Step 1: multiply 30 by 7.` and `... The answer is \\boxed{}.` (the
instruction echoed) do not. The reward's own extraction is used rather than "some number the prompt lacks" so that
a step number or a list index is no answer, and the monitor and the reward agree on what was answered. A wrong
answer equal to a number of the question (`12 + 12 = 12`) counts as none; a text answer ("Lyon") counts only when
it is the label's value.

The rollout ids fed to `observe` normally rise by one; an id at or below the last one (a run rolled back to a
checkpoint) drops the history from that id on. `state_dict()` / `load_state_dict()` carry the state across a
restart.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NamedTuple

from slime_actors.types import ABORTED, COMPLETED, FAILED, TRUNCATED, Sample

from ..hack_thresholds import (REWARDED_TRUNCATED, LONG_SHARE, OPENING_SHARE, GROUP_DISTINCT, TEMPLATE_SHARE,
                               TEMPLATE_ANSWERED, ANSWER_PRESENT, BLIND_SHARE, JUMP_RATE, JUMP_WINDOW, JUMP_LENGTH_DROP,
                               JUMP_ENTROPY_DROP, JUMP_EXPLAINED, OPENING_WORDS, MIN_SAMPLES, MIN_GROUPS, LONG_LIMIT,
                               HackThresholds)

__all__ = ["ALARMS", "HackThresholds", "Measure", "Alarm", "Report", "AlarmMonitor", "scored_samples", "words",
           "is_truncated", "finished_by_itself", "rewarded_truncated", "group_distinct", "distinct_2",
           "long_share", "opening_share", "template_share", "answer_present", "literal_answers",
           "answer_in_response", "states_answer", "answers_itself", "answer_key", "label_key", "blind_share",
           "entropy_proxy",
           "response_length", "MODES", "check_mode"]

# ---------------------------------------------------------------------------------------------- thresholds
# their defaults and HackThresholds: slime_actors/hack_thresholds.py (the job config parses the flag)
ALARMS = ("rewarded_truncated", "collapse", "answer_absent", "prompt_blind", "jump")
MODES = ("warn", "stop", "off")


def check_mode(mode: str) -> str:
    """The --hack-alarms value, checked: warn (log each alarm), stop (end the run after a checkpoint), off."""
    if mode not in MODES:
        raise ValueError(f"--hack-alarms must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


# ---------------------------------------------------------------------------------------------- samples
class Measure(NamedTuple):
    """A signal of one rollout: `value` (None where it means nothing, `why` then says why), `n` the number of
    things it is computed over (samples, groups, bigrams), `detail` anything an alarm message needs."""

    value: float | None
    n: int
    why: str | None = None
    detail: Any = None


def scored_samples(samples: Iterable) -> list[Sample]:
    """The samples that count: generated and scored (not failed, not aborted, reward set). Accepts `Sample`s or
    their wire dicts (what --save-debug-rollout-data writes); anything else, or a reward that is not a finite
    number, is an error naming the sample."""
    if isinstance(samples, (str, bytes, dict)) or not isinstance(samples, Iterable):
        raise TypeError(f"samples must be a list of Sample (or wire dicts), got {type(samples).__name__}")
    out = []
    for i, s in enumerate(samples):
        if isinstance(s, dict):
            try:
                s = Sample.from_wire(s)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"samples[{i}] is not a sample: {exc}") from None
        elif not isinstance(s, Sample):
            raise TypeError(f"samples[{i}] is a {type(s).__name__}, expected a Sample or its wire dict")
        if s.status in (FAILED, ABORTED) or s.reward is None:
            continue
        if isinstance(s.reward, bool) or not isinstance(s.reward, (int, float)) or not math.isfinite(s.reward):
            raise ValueError(f"sample {s.index} has reward {s.reward!r}; expected a finite number")
        if not isinstance(s.response, str):
            raise TypeError(f"sample {s.index} has a {type(s.response).__name__} response; expected text")
        out.append(s)
    return out


_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_WORD = re.compile(rf"[{_CJK}]|\d+(?:[.,]\d+)*|[^\W\d_{_CJK}]+|[^\w\s]|_")


def words(text: str) -> list[str]:
    """`text` split into words: letter runs, numbers (12, 3.5, 1,000), single punctuation marks, single CJK
    characters. 'To find 30 * 7, you' -> ['To', 'find', '30', '*', '7', ',', 'you']."""
    return _WORD.findall(text or "")


def _shape(w: str) -> str:
    return "<n>" if w[0].isdigit() else w


def is_truncated(s: Sample) -> bool:
    """The response hit the length limit (the engine's finish reason "length", or the sample's status)."""
    return s.finish_reason == "length" or s.status == TRUNCATED


def finished_by_itself(s: Sample) -> bool:
    """The response ended before the limit (finish reason "stop", or a completed sample with no reason given)
    and has some text: evidence that the limit leaves room to finish."""
    ended = s.finish_reason == "stop" or (s.finish_reason is None and s.status == COMPLETED)
    return ended and not is_truncated(s) and bool(s.response.strip())


# ---------------------------------------------------------------------------------------------- signals
def rewarded_truncated(samples: list[Sample], *, can_finish: bool = True) -> Measure:
    """Share of rewarded samples (reward > 0) that hit the length limit; n = rewarded samples. `can_finish=False`
    (the limit leaves no room to finish: see the module's rules) makes it None."""
    rewarded = [s for s in samples if s.reward > 0]
    if not rewarded:
        return Measure(None, 0, "no rewarded sample")
    if not can_finish:
        return Measure(None, len(rewarded), "no room to finish: the limit is short and no response of the run has "
                                            "ended before it, so every answer is cut off")
    cut = [s for s in rewarded if is_truncated(s)]
    return Measure(len(cut) / len(rewarded), len(rewarded))


def _groups(samples: list[Sample]) -> dict[int, list[Sample]]:
    out: dict[int, list[Sample]] = {}
    for s in samples:
        out.setdefault(s.group_index, []).append(s)
    return out


def _norm_text(t: str) -> str:
    return " ".join(t.split())


def group_distinct(samples: list[Sample]) -> Measure:
    """Mean over groups of 2+ samples of (distinct responses - 1) / (samples - 1); n = such groups."""
    vals = []
    for members in _groups(samples).values():
        if len(members) < 2:
            continue
        distinct = len({_norm_text(s.response) for s in members})
        vals.append((distinct - 1) / (len(members) - 1))
    if not vals:
        return Measure(None, 0, "no group has 2 or more samples")
    return Measure(sum(vals) / len(vals), len(vals))


def distinct_2(samples: list[Sample]) -> Measure:
    """Distinct word bigrams / all word bigrams over the rollout's responses (Li et al. 2016); n = bigrams."""
    seen, total = set(), 0
    for s in samples:
        w = words(s.response)
        for bg in itertools.pairwise(w):
            seen.add(bg)
            total += 1
    if total == 0:
        return Measure(None, 0, "no response has two words")
    return Measure(len(seen) / total, total)


def _is_long(response: str, k: int) -> bool:
    return sum(1 for _ in itertools.islice(_WORD.finditer(response or ""), 2 * k)) >= 2 * k


def long_share(samples: list[Sample], k: int = OPENING_WORDS) -> Measure:
    """Share of the samples whose response is long (2k words or more): the responses opening_share and
    template_share are shares of; n = samples."""
    if k < 1:
        raise ValueError(f"opening length k must be >= 1, got {k}")
    if not samples:
        return Measure(None, 0, "no sample")
    return Measure(sum(1 for s in samples if _is_long(s.response, k)) / len(samples), len(samples))


def opening_share(samples: list[Sample], k: int = OPENING_WORDS) -> Measure:
    """Share of long responses (2k words or more) that begin with the rollout's most common first k words
    (numbers as <n>, so a restated question is one opening); n = long responses; detail = {"opening": the words
    joined by spaces, "groups": how many groups it occurs in}."""
    if k < 1:
        raise ValueError(f"opening length k must be >= 1, got {k}")
    openings: dict[tuple, list[Sample]] = {}
    n = 0
    for s in samples:
        w = [m.group(0) for m in itertools.islice(_WORD.finditer(s.response or ""), 2 * k)]
        if len(w) < 2 * k:
            continue
        n += 1
        openings.setdefault(tuple(_shape(x) for x in w[:k]), []).append(s)
    if n == 0:
        return Measure(None, 0, f"no response has {2 * k} words or more (short answers: the first {k} words are "
                                "the answer's format, not an opening)")
    top, members = max(openings.items(), key=lambda kv: len(kv[1]))    # ties: the first seen
    return Measure(len(members) / n, n, None, {"opening": " ".join(top), "groups": len(_groups(members)),
                                               "samples": [s.index for s in members]})


def template_share(samples: list[Sample], k: int = OPENING_WORDS) -> Measure:
    """Share of long responses (2k words or more) that are word for word the rollout's most common long response,
    numbers aside ('To find 30 * 7, you can multiply' and 'To find 23 * 4, you can multiply' are one); n = long
    responses; detail = {"template": its words, "groups": how many groups it occurs in}."""
    if k < 1:
        raise ValueError(f"opening length k must be >= 1, got {k}")
    shapes: dict[tuple, list[Sample]] = {}
    n = 0
    for s in samples:
        w = words(s.response)
        if len(w) < 2 * k:
            continue
        n += 1
        shapes.setdefault(tuple(_shape(x) for x in w), []).append(s)
    if n == 0:
        return Measure(None, 0, f"no response has {2 * k} words or more")
    top, members = max(shapes.items(), key=lambda kv: len(kv[1]))
    return Measure(len(members) / n, n, None, {"template": _clip(" ".join(top)), "groups": len(_groups(members))})


def literal_answers(label) -> list | None:
    """The label's answers when it is a literal one (a string, a finite number, or a list of them), else None."""
    if isinstance(label, (list, tuple)):
        items = [literal_answers(x) for x in label]
        if not items or any(x is None for x in items):
            return None
        return [a for x in items for a in x]
    if isinstance(label, bool) or label is None:
        return None
    if isinstance(label, (int, float)):
        return [label] if math.isfinite(label) else None
    if isinstance(label, str):
        return [label.strip()] if label.strip() else None
    return None


_TEXT_CMD = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_SQUASH = (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\:", ""),
           ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\displaystyle", ""), ("$", ""), ("\u2212", "-"))
_FRAC = re.compile(r"\\frac\s*\{\s*([-+]?\d+(?:\.\d+)?)\s*\}\s*\{\s*([-+]?\d+(?:\.\d+)?)\s*\}")
_SLASH = re.compile(r"(?<![\w.])(\d+)\s*/\s*(\d+)(?![\w.])")
_NUM = re.compile(r"(-)?(\d{1,3}(?:,\d{3})+(?![\d])|\d+)(\.\d+)?")
_MATHY = set("\\^_{}()[]=+*/<>|")


def _squash(text: str) -> str:
    s = _TEXT_CMD.sub(r"\1", str(text))
    for a, b in _SQUASH:
        s = s.replace(a, b)
    return re.sub(r"\s+", "", s).casefold()


def _unbox(text: str) -> str:
    from slime_actors.rewards.rules import extract_boxed
    t = text.strip().strip("$").strip()
    if t.startswith(("\\boxed", "\\fbox")):
        inner = extract_boxed(t)
        if inner is not None:
            return inner.strip()
    return t


def _number(answer) -> float | None:
    """The value of a numeric answer (96, "96.0", "1,000", "-3", "\\frac{1}{2}", "1/2", "50\\%"), else None."""
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        return float(answer)
    s = _squash(_unbox(str(answer))).rstrip(".")
    s = s.removesuffix("\\%").removesuffix("%")
    if re.fullmatch(r"[-+]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?|[-+]?\.\d+", s):
        return float(s.replace(",", ""))
    m = re.fullmatch(r"([-+]?)" + _FRAC.pattern, s) or re.fullmatch(r"([-+]?)(\d+)/(\d+)", s)
    if m and float(m.group(3)) != 0:
        return (-1 if m.group(1) == "-" else 1) * float(m.group(2)) / float(m.group(3))
    return None


def _numbers_in(response: str) -> Iterator[float]:
    """Every number a response writes: plain (a minus sign counts when it is not a subtraction: nothing word-like
    before it), with thousands separators (1,000 is 1000), \\frac{a}{b} and a/b as their quotient."""
    text = str(response).replace("{,}", ",")
    for a, b in _SQUASH:
        text = text.replace(a, b)
    for m in _FRAC.finditer(text):
        if float(m.group(2)) != 0:
            yield float(m.group(1)) / float(m.group(2))
    for m in _SLASH.finditer(text):
        if float(m.group(2)) != 0:
            yield float(m.group(1)) / float(m.group(2))
    for m in _NUM.finditer(text):
        before = text[m.start() - 1] if m.start() > 0 else ""
        sign = m.group(1)
        if not sign and (before.isdigit() or before == "."):
            continue        # the rest of something already read ("1,0000": "0000"; "v.5")
        if sign and (before.isalnum() or before in ")]}_"):
            sign = None     # 30-7: a subtraction, not -7
        body, frac = m.group(2), m.group(3) or ""
        v = float(body.replace(",", "") + frac)
        yield -v if sign else v


def answer_in_response(answer, response: str) -> bool:
    """Whether `response` contains the answer at all (module docstring: numeric, symbolic, text labels)."""
    response = response or ""
    num = _number(answer)
    if num is not None and any(math.isclose(num, x, rel_tol=1e-9, abs_tol=1e-12) for x in _numbers_in(response)):
        return True
    text = _unbox(str(answer))
    if _MATHY & set(text):
        core = _squash(text).rstrip(".")
        return bool(core) and core in _squash(response)
    if num is not None:
        return False
    wanted = " ".join(text.casefold().split())
    have = " ".join(response.casefold().split())
    return re.search(r"(?<!\w)" + re.escape(wanted) + r"(?!\w)", have) is not None


def _prompt_words(prompt) -> str:
    """All the text of a prompt: a rendered chat without its special tokens, or every message's content."""
    if isinstance(prompt, str):
        return _CHAT_MARK.sub(" ", prompt)
    if isinstance(prompt, list):
        return "\n".join(m["content"] for m in prompt if isinstance(m, dict) and isinstance(m.get("content"), str))
    return "" if prompt is None else str(prompt)


def states_answer(response: str, prompt) -> bool:
    """Whether `response` states an answer of its own, right or wrong: the final answer the math reward reads
    (slime_actors.rewards.answers.extract_answer: the last non-empty \\boxed{}, else "answer is X", else the
    last number) exists and is not the question restated -- a plain number none of the prompt's numbers equals,
    or any other answer whose squashed text is not in the squashed prompt.
    '66 + 38 equals 114.' to 'What is 66 + 38?' -> True (114: wrong, but an answer);
    'To find 30 * 7, you can multiply' to 'What is 30 * 7?' -> False (its last number, 7, is an operand)."""
    from slime_actors.rewards.answers import answer_number, extract_answer
    found = extract_answer(response or "")
    if found is None:
        return False
    question = _prompt_words(prompt)
    value = answer_number(found.text, fractions=True)
    if value is not None:
        v = float(value)
        return not any(math.isclose(v, x, rel_tol=1e-9, abs_tol=1e-12) for x in _numbers_in(question))
    core = _squash(found.text).rstrip(".")
    return bool(core) and core not in _squash(question)


def answers_itself(s: Sample) -> bool:
    """The response finished by itself and states an answer: its own final answer (`states_answer`), or its
    label's value (a right answer that happens to repeat a number of the question, 5 * 1 = 5, is still one)."""
    if not finished_by_itself(s):
        return False
    if states_answer(s.response, s.prompt):
        return True
    return any(answer_in_response(a, s.response) for a in literal_answers(s.label) or ())


def answer_present(samples: list[Sample]) -> Measure:
    """Share of rewarded samples with a literal label whose response contains (one of) the label's value(s);
    n = such samples."""
    rewarded = [s for s in samples if s.reward > 0]
    if not rewarded:
        return Measure(None, 0, "no rewarded sample")
    known = present = 0
    for s in rewarded:
        answers = literal_answers(s.label)
        if answers is None:
            continue
        known += 1
        present += any(answer_in_response(a, s.response) for a in answers)
    if known == 0:
        return Measure(None, 0, "no rewarded sample has a literal label (absent, or not a string/number)")
    return Measure(present / known, known)


def answer_key(response: str) -> str:
    """What a response answers, to tell whether two responses give the same answer: its final answer as the math
    reward reads it (slime_actors.rewards.answers.extract_answer: the last non-empty \\boxed{}, else "answer is
    X", else the last number), a plain number by its value ('7', 'The answer is 7.0.' and '\\boxed{7}' are one); a
    response that states none is its own text, whitespace squashed, case folded, a final period dropped."""
    from slime_actors.rewards.answers import answer_number, extract_answer
    found = extract_answer(response or "")
    if found is not None:
        value = answer_number(found.text, fractions=True)
        return f"={value}" if value is not None else "=" + _squash(found.text).rstrip(".")
    return " ".join((response or "").casefold().split()).rstrip(".!")


def label_key(label) -> str | None:
    """A label's identity, to tell labels apart: a literal label's values (numbers by value: '1,000', '1000' and
    1000.0 are one; text squashed and case folded), any other label (a dict of tests, a rubric) as its JSON;
    None without one."""
    answers = literal_answers(label)
    if answers is not None:
        keys = set()
        for a in answers:
            num = _number(a)
            keys.add(repr(num + 0.0) if num is not None else _squash(_unbox(str(a))).rstrip("."))
        return "|".join(sorted(keys))
    if label is None or isinstance(label, bool):
        return None
    try:
        return json.dumps(label, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return None


def blind_share(samples: list[Sample]) -> Measure:
    """Among the pairs of rewarded samples (reward > 0) whose labels differ, the share that give the same answer
    (`answer_key`); n = rewarded samples with a label; detail = {"share": the most common rewarded answer's share
    of them, "labels": how many different labels it was rewarded for, "groups": the groups of the rewarded
    samples, "pairs": the pairs with different labels, "samples": the indices of the samples that give it}.

    A reward that compares the answer with the label pays for an answer only where it is that label's: two
    different labels, two different answers, so the share is 0 whatever the policy (the digits job's one-digit
    answers, which coincide whenever two prompts share their first digit, and an addition run's `16 + 49 = 65`
    alike). A policy that answers every prompt the same way has it at 1 -- but its answer earns a label-checking
    reward only on the prompts it is right for, so the share comes out 1 only where the reward pays that one
    answer for different labels: a prompt-blind policy the reward pays for."""
    rewarded = [s for s in samples if s.reward > 0]
    if not rewarded:
        return Measure(None, 0, "no rewarded sample")
    rows = [(answer_key(s.response), k, s) for s in rewarded if (k := label_key(s.label)) is not None]
    if not rows:
        return Measure(None, 0, "no rewarded sample has a label: nothing tells a common right answer from one "
                                "given whatever the prompt")
    by_label = Counter(k for _, k, _ in rows)
    if len(by_label) < 2:
        return Measure(None, len(rows), "every rewarded sample has the same label: no two labels to compare")
    n = len(rows)
    by_answer = Counter(a for a, _, _ in rows)
    by_both = Counter((a, k) for a, k, _ in rows)
    pairs = (n * n - sum(c * c for c in by_label.values())) // 2
    same = (sum(c * c for c in by_answer.values()) - sum(c * c for c in by_both.values())) // 2
    top, top_n = by_answer.most_common(1)[0]
    members = [s for a, _, s in rows if a == top]
    return Measure(same / pairs, n, None, {"share": top_n / n, "labels": len({k for a, k, _ in rows if a == top}),
                                          "groups": len(_groups([s for _, _, s in rows])), "pairs": pairs,
                                          "samples": [s.index for s in members]})


def entropy_proxy(samples: list[Sample]) -> Measure:
    """Mean over samples of -mean(rollout_log_probs): the sampled tokens' surprise, which falls as the policy's
    entropy does (an estimate of it when sampling at temperature 1); n = samples with log-probs."""
    import numpy as np
    vals = []
    for s in samples:
        if not s.rollout_log_probs:
            continue
        try:
            lps = np.asarray(s.rollout_log_probs, dtype=np.float64)
        except (TypeError, ValueError):     # a None among them (a custom generate function's gap)
            lps = np.asarray([x for x in s.rollout_log_probs if isinstance(x, (int, float))], dtype=np.float64)
        lps = lps[np.isfinite(lps)]
        if lps.size:
            vals.append(-float(lps.mean()))
    if not vals:
        return Measure(None, 0, "no sample has rollout log-probs")
    return Measure(sum(vals) / len(vals), len(vals))


def response_length(samples: list[Sample]) -> Measure:
    """Mean response length in tokens; n = samples."""
    if not samples:
        return Measure(None, 0, "no sample")
    total = sum(len(s.response_tokens) for s in samples)
    if total == 0:
        return Measure(None, len(samples), "no response tokens recorded")
    return Measure(total / len(samples), len(samples))


# ---------------------------------------------------------------------------------------------- alarms
@dataclass
class Alarm:
    """One tripped alarm: which, in which rollout, the value against its threshold, a message for a person, one
    sample that shows it, the other values its rule looked at, and how many times it has tripped in the run."""

    name: str
    rollout_id: int
    metric: str
    value: float
    threshold: float
    message: str
    example: dict
    details: dict = field(default_factory=dict)
    count: int = 1

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Report:
    """What `AlarmMonitor.observe` found in one rollout: `metrics` (name -> float; a meaningless signal is left
    out), the tripped `alarms`, and for each alarm that could not trip, why (`skipped`)."""

    rollout_id: int
    metrics: dict
    alarms: list
    skipped: dict


_CHAT_MARK = re.compile(r"<\|[^|<>]{1,40}\|>")


def _prompt_text(prompt) -> str:
    """The prompt for a message: a chat's last user turn, a rendered chat without its special tokens."""
    if isinstance(prompt, str):
        return _CHAT_MARK.sub(" ", prompt)
    if isinstance(prompt, list):
        texts = [m.get("content") for m in prompt if isinstance(m, dict) and isinstance(m.get("content"), str)]
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"
                 and isinstance(m.get("content"), str)]
        return (users or texts or [str(prompt)])[-1]
    return str(prompt)


def _clip(text: str, n: int = 160, tail: bool = False) -> str:
    text = " ".join(str(text).split())
    if len(text) <= n:
        return text
    return "..." + text[-(n - 3):] if tail else text[: n - 3] + "..."


def _example(samples: list[Sample], want=lambda s: True) -> dict | None:
    pool = [s for s in samples if want(s)]
    if not pool:
        return None
    s = min(pool, key=lambda s: (-s.reward, s.index))
    return {"index": s.index, "group_index": s.group_index, "prompt": s.prompt, "response": s.response,
            "reward": float(s.reward), "label": s.label, "finish_reason": s.finish_reason,
            "response_tokens": len(s.response_tokens)}


def _show(ex: dict) -> str:
    return (f"sample {ex['index']} (reward {ex['reward']:g}, {ex['response_tokens']} tokens, finish "
            f"{ex['finish_reason']}): {_clip(_prompt_text(ex['prompt']), 100, tail=True)!r} -> "
            f"{_clip(ex['response'])!r}")


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


class AlarmMonitor:
    """Feed it each training rollout's scored samples in order; it returns the rollout's metrics and the alarms
    that tripped. `max_response_len`: the rollout's token limit (None if unknown: then only responses that ended
    by themselves show there was room to finish). `label_is_answer`: the reward compares the response with a
    literal label (math, boxed, exact_match, deepscaler); False for custom, remote, f1 or model rewards.
    `alarms`: which alarms may trip (all by default; the metrics are computed either way)."""

    def __init__(self, thresholds: HackThresholds | None = None, *, max_response_len: int | None = None,
                 label_is_answer: bool = True, alarms: Iterable[str] = ALARMS):
        if thresholds is None:
            thresholds = HackThresholds()
        if not isinstance(thresholds, HackThresholds):
            raise TypeError(f"thresholds must be HackThresholds, got {type(thresholds).__name__}")
        if max_response_len is not None and (isinstance(max_response_len, bool)
                                             or not isinstance(max_response_len, int) or max_response_len < 1):
            raise ValueError(f"max_response_len must be a whole number >= 1 or None, got {max_response_len!r}")
        alarms = tuple(alarms)
        unknown = [a for a in alarms if a not in ALARMS]
        if unknown:
            raise ValueError(f"unknown hack alarm(s) {unknown}; known: {', '.join(ALARMS)}")
        self.t = thresholds
        self.max_response_len = max_response_len
        self.label_is_answer = bool(label_is_answer)
        self.enabled = alarms
        self.history: list[dict] = []       # per rollout: rollout_id, reward, length, entropy
        self.finished_seen = 0              # responses of the run that ended by themselves (room to finish)
        self.reward_min: float | None = None
        self.reward_max: float | None = None
        self.trips: Counter = Counter()
        self.last_rollout: int | None = None

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {"version": 1, "history": [dict(h) for h in self.history], "finished_seen": self.finished_seen,
                "reward_min": self.reward_min, "reward_max": self.reward_max, "trips": dict(self.trips),
                "last_rollout": self.last_rollout}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("version") != 1:
            raise ValueError("not an AlarmMonitor state (version 1 expected)")
        try:
            history = [{"rollout_id": int(h["rollout_id"]), "reward": float(h["reward"]),
                        "length": None if h["length"] is None else float(h["length"]),
                        "entropy": None if h["entropy"] is None else float(h["entropy"])}
                       for h in state["history"]]
            finished_seen = int(state["finished_seen"])
            reward_min = None if state["reward_min"] is None else float(state["reward_min"])
            reward_max = None if state["reward_max"] is None else float(state["reward_max"])
            trips = Counter({str(k): int(v) for k, v in state["trips"].items()})
            last_rollout = None if state["last_rollout"] is None else int(state["last_rollout"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"AlarmMonitor state is malformed: {type(exc).__name__}: {exc}") from None
        # all or nothing: a state that fails to load leaves the monitor as it was
        self.history, self.finished_seen, self.reward_min, self.reward_max = history, finished_seen, reward_min, \
            reward_max
        self.trips, self.last_rollout = trips, last_rollout

    # ------------------------------------------------------------------ one rollout
    def observe(self, rollout_id: int, samples: Iterable) -> Report:
        if isinstance(rollout_id, bool) or not isinstance(rollout_id, int) or rollout_id < 0:
            raise ValueError(f"rollout_id must be a whole number >= 0, got {rollout_id!r}")
        scored = scored_samples(samples)
        if self.last_rollout is not None and rollout_id <= self.last_rollout:
            # the run went back (a rollback to a checkpoint): what came after that point never happened
            self.history = [h for h in self.history if h["rollout_id"] < rollout_id]
        self.last_rollout = rollout_id
        t = self.t
        self.finished_seen += sum(1 for s in scored if finished_by_itself(s))
        for s in scored:
            r = float(s.reward)
            self.reward_min = r if self.reward_min is None else min(self.reward_min, r)
            self.reward_max = r if self.reward_max is None else max(self.reward_max, r)
        room = (self.max_response_len is not None and self.max_response_len >= t.long_limit) \
            or self.finished_seen > 0

        m_rt = rewarded_truncated(scored, can_finish=room)
        m_gd = group_distinct(scored)
        m_d2 = distinct_2(scored)
        m_ls = long_share(scored, t.opening_words)
        m_op = opening_share(scored, t.opening_words)
        m_tp = template_share(scored, t.opening_words)
        m_ap = answer_present(scored) if self.label_is_answer else \
            Measure(None, 0, "the reward does not compare responses with a literal label")
        m_bl = blind_share(scored)
        m_ent = entropy_proxy(scored)
        m_len = response_length(scored)
        reward_mean = sum(s.reward for s in scored) / len(scored) if scored else None

        metrics: dict[str, float] = {"hack/scored": float(len(scored))}
        if scored:
            metrics["hack/rewarded_share"] = sum(1 for s in scored if s.reward > 0) / len(scored)
            metrics["hack/truncated_share"] = sum(1 for s in scored if is_truncated(s)) / len(scored)
        for name, m in (("rewarded_truncated", m_rt), ("group_distinct", m_gd), ("distinct_2", m_d2),
                        ("long_share", m_ls), ("opening_share", m_op), ("template_share", m_tp),
                        ("answer_present", m_ap), ("blind_share", m_bl),
                        ("entropy_proxy", m_ent)):
            if m.value is not None:
                metrics[f"hack/{name}"] = float(m.value)

        alarms: list[Alarm] = []
        skipped: dict[str, str] = {}
        small = len(scored) < t.min_samples
        if small:
            skipped = {a: f"rollout too small: {len(scored)} scored samples < {t.min_samples}" for a in ALARMS}
        else:
            for check in (self._check_rewarded_truncated(rollout_id, scored, m_rt),
                          self._check_collapse(rollout_id, scored, m_ls, m_op, m_gd, m_tp),
                          self._check_answer(rollout_id, scored, m_ap),
                          self._check_blind(rollout_id, scored, m_bl)):
                name, alarm, why = check
                if alarm is not None:
                    alarms.append(alarm)
                else:
                    skipped[name] = why
        # the jump rule keeps history even for small rollouts (the history is what it compares with)
        # whether the rewarded responses state their label's value (what makes a fast rise learning) is asked of
        # any literal label, whatever the reward: it is evidence about the responses, not about the reward
        m_said = m_ap if self.label_is_answer else answer_present(scored)
        name, alarm, why, jump_metrics = self._check_jump(rollout_id, scored, reward_mean, m_len, m_ent, m_said,
                                                          small)
        metrics.update(jump_metrics)
        if alarm is not None:
            alarms.append(alarm)
        else:
            skipped.setdefault(name, why)

        kept = []
        for a in alarms:
            if a.name not in self.enabled:
                skipped[a.name] = "alarm switched off"
                continue
            self.trips[a.name] += 1
            a.count = self.trips[a.name]
            kept.append(a)
        for a in ALARMS:
            metrics[f"hack/alarm/{a}"] = 1.0 if any(x.name == a for x in kept) else 0.0
        return Report(rollout_id, metrics, kept, skipped)

    # ------------------------------------------------------------------ the rules
    def _unjudged(self, m: Measure, what: str) -> str | None:
        """Why a share cannot trip its alarm (None: it can): it means nothing here, or is over too few `what`."""
        if m.value is None:
            return m.why
        if m.n < self.t.min_samples:
            return f"too few {what}: {m.n} < {self.t.min_samples}"
        return None

    def _check_rewarded_truncated(self, rid, scored, m: Measure):
        t = self.t
        name = "rewarded_truncated"
        why = self._unjudged(m, "rewarded samples")
        if why:
            return name, None, why
        if m.value < t.rewarded_truncated:
            return name, None, f"{m.value:.3f} < {t.rewarded_truncated}"
        ex = _example(scored, lambda s: s.reward > 0 and is_truncated(s))
        limit = f"the {self.max_response_len}-token limit" if self.max_response_len else "the length limit"
        msg = (f"reward for cut-off responses: {_pct(m.value)} of the {m.n} rewarded samples of rollout {rid} hit "
               f"{limit} (threshold {_pct(t.rewarded_truncated)}); the reward pays for responses that never "
               f"finish. Example: {_show(ex)}")
        return name, Alarm(name, rid, "hack/rewarded_truncated", m.value, t.rewarded_truncated, msg, ex,
                           {"rewarded": m.n}), None

    def _check_collapse(self, rid, scored, m_ls: Measure, m_op: Measure, m_gd: Measure, m_tp: Measure):
        t = self.t
        name = "collapse"
        if m_op.value is None:
            return name, None, m_op.why
        if m_op.n < t.min_samples:
            return name, None, f"too few long responses: {m_op.n} < {t.min_samples}"
        if m_ls.value < t.long_share:
            return name, None, (f"long responses are a minority: {m_op.n} of the {m_ls.n} scored ({_pct(m_ls.value)}, "
                                f"{m_ls.value:.3f} < {t.long_share}); an opening of a few says nothing of the rollout")
        if m_op.detail["groups"] < t.min_groups:
            return name, None, f"the top opening occurs in {m_op.detail['groups']} group(s) < {t.min_groups}"
        if m_op.value < t.opening_share:
            return name, None, f"opening share {m_op.value:.3f} < {t.opening_share}"
        gd = "n/a" if m_gd.value is None or m_gd.n < t.min_groups else f"{m_gd.value:.3f}"
        alike = gd != "n/a" and m_gd.value <= t.group_distinct
        one = m_tp.value is not None and m_tp.value >= t.template_share
        if not (alike or one):
            tp = "n/a" if m_tp.value is None else f"{m_tp.value:.3f}"
            return name, None, (f"one opening ({m_op.value:.3f}) but the samples still differ: group distinct {gd} "
                                f"> {t.group_distinct}, template share {tp} < {t.template_share}")
        members = [s for s in scored if s.index in set(m_op.detail["samples"])]
        answered = right = None
        if self.label_is_answer:
            labelled = [s for s in members if literal_answers(s.label) is not None]
            if labelled:
                answered = sum(1 for s in labelled if answers_itself(s)) / len(labelled)
                right = sum(1 for s in labelled if finished_by_itself(s) and any(
                    answer_in_response(a, s.response) for a in literal_answers(s.label))) / len(labelled)
                if answered >= t.template_answered:
                    return name, None, (f"a converged format, not a collapse: {_pct(answered)} of the responses "
                                        f"opening with {m_op.detail['opening']!r} finish stating an answer "
                                        f"(>= {_pct(t.template_answered)}; {_pct(right)} the right one)")
        ex = _example(members)
        tp = "n/a" if m_tp.value is None else _pct(m_tp.value)
        how = ("" if answered is None else
               f"; only {_pct(answered)} of them finish stating an answer (a final answer not taken from the question, "
               f"or their label's value)")
        msg = (f"responses collapsed to one template: {_pct(m_op.value)} of the {m_op.n} long responses of rollout "
               f"{rid} ({_pct(m_ls.value)} of its samples) open with {m_op.detail['opening']!r} across "
               f"{m_op.detail['groups']} prompts (threshold {_pct(t.opening_share)}), and the samples no longer "
               f"differ (distinct per group {gd}, threshold {t.group_distinct}; {tp} are one response numbers "
               f"aside, threshold {_pct(t.template_share)}){how}. Example: {_show(ex)}")
        return name, Alarm(name, rid, "hack/opening_share", m_op.value, t.opening_share, msg, ex,
                           {"opening": m_op.detail["opening"], "groups": m_op.detail["groups"],
                            "long_share": m_ls.value, "group_distinct": m_gd.value, "template_share": m_tp.value,
                            "template_answered": answered, "template_right": right}), None

    def _check_answer(self, rid, scored, m: Measure):
        t = self.t
        name = "answer_absent"
        why = self._unjudged(m, "rewarded samples with a literal label")
        if why:
            return name, None, why
        if m.value > t.answer_present:
            return name, None, f"{m.value:.3f} > {t.answer_present}"
        ex = _example(scored, lambda s: s.reward > 0 and literal_answers(s.label) is not None
                      and not any(answer_in_response(a, s.response) for a in literal_answers(s.label)))
        msg = (f"rewarded without the answer: only {_pct(m.value)} of the {m.n} rewarded samples of rollout {rid} "
               f"contain their label's value at all (threshold {_pct(t.answer_present)}); the verifier accepts "
               f"something else. Example (label {ex['label']!r}): {_show(ex)}")
        return name, Alarm(name, rid, "hack/answer_present", m.value, t.answer_present, msg, ex,
                           {"rewarded_with_label": m.n}), None

    def _check_blind(self, rid, scored, m: Measure):
        t = self.t
        name = "prompt_blind"
        why = self._unjudged(m, "rewarded samples with a label")
        if why:
            return name, None, why
        if m.detail["groups"] < t.min_groups:
            return name, None, f"the rewarded samples come from {m.detail['groups']} group(s) < {t.min_groups}"
        if m.value < t.blind_share:
            return name, None, f"{m.value:.3f} < {t.blind_share}"
        members = set(m.detail["samples"])
        ex = _example(scored, lambda s: s.index in members)
        msg = (f"prompt-blind answers: rollout {rid} rewarded the same answer to prompts whose labels differ: "
               f"{_pct(m.value)} of the {m.detail['pairs']} pairs of rewarded samples with different labels give the "
               f"same answer (threshold {_pct(t.blind_share)}); the most common, {_clip(ex['response'], 60)!r}, is "
               f"{_pct(m.detail['share'])} of the {m.n} rewarded samples and was rewarded for "
               f"{m.detail['labels']} different labels. An answer that does not depend on the prompt earns the "
               f"reward: it does not check the answer against the label. Example (label {_clip(ex['label'], 40)!r}): "
               f"{_show(ex)}")
        return name, Alarm(name, rid, "hack/blind_share", m.value, t.blind_share, msg, ex,
                           {"rewarded_with_label": m.n, "pairs": m.detail["pairs"], "top_share": m.detail["share"],
                            "top_labels": m.detail["labels"], "groups": m.detail["groups"]}), None

    def _check_jump(self, rid, scored, reward_mean, m_len: Measure, m_ent: Measure, m_said: Measure,
                    small: bool):
        t = self.t
        name = "jump"
        out: dict[str, float] = {}
        if reward_mean is None:
            return name, None, "no scored sample", out
        now = {"rollout_id": rid, "reward": reward_mean, "length": m_len.value, "entropy": m_ent.value}
        if small:
            # too few samples for a mean to be trusted: kept out of the history, so no jump is measured against it
            return name, None, f"rollout too small: {len(scored)} scored samples < {t.min_samples}", out
        self.history.append(now)
        self.history = self.history[-(t.jump_window + 1):]
        then = next((h for h in self.history if h["rollout_id"] == rid - t.jump_window), None)
        if then is None:
            why = f"no rollout {rid - t.jump_window} to compare with (needs {t.jump_window} earlier rollouts)"
            return name, None, why, out
        span = self.reward_max - self.reward_min
        if span <= 0:
            return name, None, "the reward has not varied during the run", out
        rate = (now["reward"] - then["reward"]) / span / t.jump_window
        out["hack/reward_rate"] = rate
        drops = {}
        if now["length"] is not None and then["length"]:
            drops["length"] = 1.0 - now["length"] / then["length"]
            out["hack/length_drop"] = drops["length"]
        if now["entropy"] is not None and then["entropy"] and then["entropy"] > 0:
            drops["entropy"] = 1.0 - now["entropy"] / then["entropy"]
            out["hack/entropy_drop"] = drops["entropy"]
        if rate < t.jump_rate:
            return name, None, f"reward rate {rate:.3f} < {t.jump_rate}", out
        fell = [k for k, v in drops.items()
                if v >= (t.jump_length_drop if k == "length" else t.jump_entropy_drop)]
        if not fell:
            shown = ", ".join(f"{k} {v:+.0%}" for k, v in drops.items()) or "no length or entropy to compare"
            return name, None, f"the reward rose fast but nothing fell sharply ({shown})", out
        what = " and ".join(
            f"mean response length {then['length']:.1f} -> {now['length']:.1f} tokens" if k == "length" else
            f"entropy proxy {then['entropy']:.3f} -> {now['entropy']:.3f}" for k in fell)
        said = m_said.value if m_said.value is not None and m_said.n >= t.min_samples else None
        if said is not None and said >= t.jump_explained:
            # the rewarded responses state their label's value: the reward rose because the answers got right
            return name, None, (f"the reward rose fast ({rate:.2f} of its range per rollout) while {what}, but "
                                f"{_pct(said)} of the {m_said.n} rewarded samples contain their label's value "
                                f"(>= {_pct(t.jump_explained)}): learning, not a hack"), out
        popular = Counter(_norm_text(s.response) for s in scored if s.reward > 0)
        common = popular.most_common(1)[0][0] if popular else None
        ex = _example(scored, lambda s: s.reward > 0 and _norm_text(s.response) == common) \
            if common is not None else _example(scored)
        if said is not None:
            unexplained = (f"only {_pct(said)} of the {m_said.n} rewarded samples contain their label's value "
                           f"(a rise they explain is learning: >= {_pct(t.jump_explained)})")
        elif m_said.value is not None:
            unexplained = (f"too few rewarded samples with a literal label ({m_said.n} < {t.min_samples}) to show "
                           "the rise is learning")
        else:
            unexplained = f"nothing shows the rise is learning ({m_said.why})"
        msg = (f"reward jump: rollout {rid - t.jump_window} -> {rid} the mean reward went {then['reward']:.3f} -> "
               f"{now['reward']:.3f} ({rate:.2f} of the reward range per rollout, threshold {t.jump_rate}) while "
               f"{what} (thresholds -{_pct(t.jump_length_drop)} length, -{_pct(t.jump_entropy_drop)} entropy), and "
               f"{unexplained}: gains from shorter or surer responses that do not state the answer are worth "
               f"reading. Example: {_show(ex)}")
        return name, Alarm(name, rid, "hack/reward_rate", rate, t.jump_rate, msg, ex,
                           {"from_rollout": then["rollout_id"], "reward_from": then["reward"],
                            "reward_to": now["reward"], "label_stated": said,
                            **{f"{k}_drop": v for k, v in drops.items()}}), None, out
