"""The code reward (--rm-type code): run the response's program in the sandbox against the sample's tests.

    program = extract_program(response)            # the last fenced block, else the whole response
    tests = parse_tests(sample.label)              # AssertTests or StdioTests (docs/code-sandbox.md, "Labels")
    grade = await agrade_code(program, tests, runner, partial=False)   # CodeGrade(score, passed, total, result)

Two test formats, those of public code-RL data:

* assert-style (MBPP, HumanEval): {"tests": ["assert f(1) == 2", ...], "setup": "...", "entry_point": "f",
  "prefix": "..."} -- each test is run after the program, in the sandbox's grading harness (harness.py), which
  keeps the tests, their expected values and its verdict out of the program's reach. APPS's call-based form
  ({"fn_name": "f", "inputs": [[args...], ...], "outputs": [...]}) becomes this format.
* stdin/stdout (APPS, CodeContests, TACO): {"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]} -- the program runs
  once per case, a fresh cell each time, with the input on stdin; the expected output never enters the sandbox.
  Outputs compare after each line is split on whitespace and blank lines are dropped.

Score: 1.0 when every test passes, else 0.0; with `partial` (--code-partial-credit) the fraction passed.

Two shortcuts that change no score: a Python program that does not compile scores 0 without a sandbox run
(`compile()` parses, it runs nothing; only where this interpreter's version is the sandbox's), and a program
already graded against the same tests is not run again (the last CACHE_SIZE gradings of this process are kept).
The second assumes a program's result does not change between runs; one that passes by chance is graded once.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import sys
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field

from ..json_files import parse_json
from ..sandbox.runner import Limits, RunResult, Runner, SandboxError

__all__ = ["AssertTests", "StdioTests", "CodeGrade", "extract_program", "parse_tests", "agrade_code",
           "outputs_match", "code_reward", "code_runner", "close_code_runners"]

MAX_TESTS = 1000
CACHE_SIZE = 4096
SOLUTION = "solution.py"
MAIN = "main.py"
HARNESS_MARGIN = 0.5     # the harness reports this many seconds before the run's wall-clock timeout

_FENCE = re.compile(r"^[ \t]*```[^\n`]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)
_OPEN_FENCE = re.compile(r"^[ \t]*```[^\n`]*\n", re.M)


def extract_program(response: str | None) -> str:
    """The program in a response: the content of its last fenced block (```python ... ```, any language tag);
    an opening fence never closed (a response cut at the token limit) counts from it to the end; no fence: the
    whole response."""
    text = response or ""
    blocks = list(_FENCE.finditer(text))
    last_end = blocks[-1].end() if blocks else 0
    opens = [m for m in _OPEN_FENCE.finditer(text) if m.start() >= last_end]
    if opens:
        return text[opens[0].end():]
    if blocks:
        return blocks[-1].group(1)
    return text


@dataclass(frozen=True)
class AssertTests:
    tests: tuple[str, ...]
    setup: str = ""
    prefix: str = ""          # code placed before the program (HumanEval's prompt, for completions)


@dataclass(frozen=True)
class StdioTests:
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass
class CodeGrade:
    score: float
    passed: int
    total: int
    result: str                  # what happened, in words: "all 3 tests passed", "test 2: AssertionError", ...
    timed_out: bool = False
    details: dict = field(default_factory=dict)


def _text(v, what: str) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return "\n".join(v)
    raise ValueError(f"{what} must be a string (or a list of lines), got {type(v).__name__}")


def parse_tests(label) -> AssertTests | StdioTests:
    """A sample's tests from its label (a dict, or the same as a JSON string). ValueError naming what is wrong."""
    if label is None:
        raise ValueError("the sample has no label: --rm-type code needs its tests there (set --label-key)")
    if isinstance(label, str):
        try:
            label = parse_json(label)
        except ValueError as exc:
            raise ValueError(f"a code label must be a JSON object (or a dict), got text that is not JSON: {exc}") \
                from None
    if not isinstance(label, dict):
        raise ValueError(f"a code label must be an object with 'tests' or 'inputs'/'outputs', got "
                         f"{type(label).__name__}")
    if "input_output" in label:            # APPS / TACO rows keep the cases as a JSON string under this key
        inner = label["input_output"]
        label = {**label, **(parse_json(inner) if isinstance(inner, str) else inner)}
    prefix = _text(label.get("prefix", ""), "'prefix'")
    if "fn_name" in label and label.get("fn_name"):
        return _call_based(label, prefix)
    tests = next((label[k] for k in ("tests", "test_list", "test") if k in label), None)
    if tests is not None:
        if isinstance(tests, str):
            tests = [tests]
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise ValueError("'tests' must be a non-empty list of strings (each a test program) or one string")
        entry = label.get("entry_point")
        if entry:
            if not isinstance(entry, str) or not entry.isidentifier():
                raise ValueError(f"'entry_point' must be a Python name, got {entry!r}")
            tests = [*tests[:-1], tests[-1] + f"\ncheck({entry})\n"] if len(tests) == 1 else \
                [*tests, f"check({entry})"]
        setup = "\n".join(_text(label[k], f"'{k}'") for k in ("setup", "test_setup_code", "test_imports")
                          if label.get(k))
        return AssertTests(tuple(tests[:MAX_TESTS]), setup, prefix)
    if "inputs" in label or "outputs" in label:
        ins, outs = label.get("inputs"), label.get("outputs")
        if not isinstance(ins, list) or not isinstance(outs, list) or not ins:
            raise ValueError("'inputs' and 'outputs' must be non-empty lists")
        if len(ins) != len(outs):
            raise ValueError(f"'inputs' has {len(ins)} cases and 'outputs' {len(outs)}")
        return StdioTests(tuple(_text(x, f"inputs[{i}]") for i, x in enumerate(ins[:MAX_TESTS])),
                          tuple(_text(x, f"outputs[{i}]") for i, x in enumerate(outs[:MAX_TESTS])))
    raise ValueError(f"a code label needs 'tests' (assert-style) or 'inputs' and 'outputs' (stdin/stdout); "
                     f"it has {sorted(label)}")


def _call_based(label: dict, prefix: str) -> AssertTests:
    """APPS's call-based cases: fn_name called with each input's arguments (a method of class Solution when the
    program defines one); the expected value is the output, or the output's only element (APPS wraps them)."""
    fn = label["fn_name"]
    if not isinstance(fn, str) or not fn.isidentifier():
        raise ValueError(f"'fn_name' must be a Python name, got {fn!r}")
    ins, outs = label.get("inputs"), label.get("outputs")
    if not isinstance(ins, list) or not isinstance(outs, list) or not ins or len(ins) != len(outs):
        raise ValueError("call-based tests need 'inputs' and 'outputs': lists of the same, non-zero length")
    setup = ("def __target():\n"
             "    if 'Solution' in globals():\n"
             f"        return getattr(Solution(), {fn!r})\n"
             f"    return {fn}\n")
    tests = []
    for a, out in zip(ins[:MAX_TESTS], outs[:MAX_TESTS]):
        args = a if isinstance(a, list) else [a]
        tests.append(f"__r = __target()(*{json.dumps(args)!s})\n"
                     f"__e = {json.dumps(out)!s}\n"
                     "assert __r == __e or (isinstance(__e, list) and len(__e) == 1 and __r == __e[0]) "
                     "or (isinstance(__r, tuple) and list(__r) == __e)\n")
    # JSON's true/false/null in the literals: make them Python's
    setup += "true, false, null = True, False, None\n"
    return AssertTests(tuple(tests), setup, prefix)


def _lines(text: str) -> list[list[str]]:
    return [line.split() for line in text.replace("\r\n", "\n").split("\n") if line.strip()]


def outputs_match(got: str, expected: str) -> bool:
    """stdin/stdout comparison: equal after each line is split on whitespace and blank lines are dropped."""
    return _lines(got) == _lines(expected)


async def agrade_code(program: str, tests: AssertTests | StdioTests, runner: Runner, partial: bool = False,
                      limits: Limits | None = None) -> CodeGrade:
    """Run `program` against `tests` in `runner`'s sandbox; raises SandboxError/SandboxUnavailable only when the
    sandbox itself fails (a program that fails, hangs or misbehaves scores 0 for it)."""
    source = (tests.prefix + program) if isinstance(tests, AssertTests) and tests.prefix else program
    total = len(tests.tests) if isinstance(tests, AssertTests) else len(tests.inputs)
    if not program.strip():
        return CodeGrade(0.0, 0, total, "no program in the response")
    bad = _syntax_error(source, runner)
    if bad:
        return CodeGrade(0.0, 0, total, f"the program does not compile: {bad}")
    key = (hashlib.sha256(source.encode()).hexdigest(), tests, partial, limits, id(runner))
    hit = _cache.get(key)
    if hit is not None:
        _cache.move_to_end(key)
        return CodeGrade(hit.score, hit.passed, hit.total, hit.result, hit.timed_out, {"cached": True})
    if isinstance(tests, StdioTests):
        grade = await _grade_stdio(program, tests, runner, partial, limits)
    else:
        grade = await _grade_asserts(source, tests, runner, partial, limits)
    _cache[key] = grade
    while len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    return grade


_cache: "OrderedDict[tuple, CodeGrade]" = OrderedDict()


def _syntax_error(source: str, runner: Runner) -> str | None:
    """Why `source` is not Python the sandbox's interpreter would accept, or None (also None when that
    interpreter is another version than this one: then the sandbox decides)."""
    if runner.python_version() != sys.version_info[:2]:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, "solution.py", "exec", dont_inherit=True)
    except SyntaxError as e:
        return f"SyntaxError: {e.msg} (line {e.lineno})"
    except (ValueError, MemoryError, RecursionError) as e:
        return f"{type(e).__name__}: {str(e)[:100]}"
    return None


def _score(passed: int, total: int, partial: bool) -> float:
    if total <= 0:
        return 0.0
    return passed / total if partial else float(passed == total)


async def _grade_asserts(source: str, tests: AssertTests, runner: Runner, partial: bool,
                         limits: Limits | None) -> CodeGrade:
    total = len(tests.tests)
    limits = limits or runner.limits
    token = secrets.token_hex(16)
    stdin = json.dumps({"token": token, "setup": tests.setup, "tests": list(tests.tests)}).encode()
    r = await runner.arun(harness={"solution": SOLUTION, "deadline": max(0.1, limits.timeout - HARNESS_MARGIN)},
                          files={SOLUTION: source}, stdin=stdin, limits=limits)
    if r.error:
        raise SandboxError(r.error)
    verdict = _verdict(r, token)
    if verdict is None:
        return CodeGrade(0.0, 0, total, f"no verdict from the tests ({r.describe()})", timed_out=r.timed_out)
    passed_list = [bool(p) for p in verdict.get("passed", [])][:total]
    passed = sum(passed_list)
    if verdict.get("load_error"):
        result = f"the program failed: {verdict['load_error']}"
    elif verdict.get("setup_error"):
        result = f"the tests' setup failed: {verdict['setup_error']}"
    elif passed == total:
        result = f"all {total} tests passed"
    else:
        first = next(i for i, p in enumerate(passed_list + [False] * total) if not p)
        err = (verdict.get("errors") or [None] * total)[first] if first < total else None
        result = f"{total - passed} of {total} tests failed; test {first}: {err}"
    return CodeGrade(_score(passed, total, partial), passed, total, result,
                     timed_out=bool(verdict.get("timed_out")) or r.timed_out)


def _verdict(r: RunResult, token: str) -> dict | None:
    """The harness's verdict: the line that starts with the token (only the harness knows it)."""
    for line in r.stdout.decode("utf-8", errors="replace").splitlines()[::-1]:
        if line.startswith(token + " "):
            try:
                v = json.loads(line[len(token) + 1:])
            except ValueError:
                return None
            return v if isinstance(v, dict) else None
    return None


async def _grade_stdio(program: str, tests: StdioTests, runner: Runner, partial: bool,
                       limits: Limits | None) -> CodeGrade:
    total = len(tests.inputs)
    passed = 0
    first_fail = None
    timed_out = False
    for i, (inp, expected) in enumerate(zip(tests.inputs, tests.outputs)):
        r = await runner.arun(python_file=MAIN, files={MAIN: program}, stdin=inp.encode(), limits=limits)
        if r.error:
            raise SandboxError(r.error)
        ok = r.exit_code == 0 and not r.stdout_truncated and outputs_match(
            r.stdout.decode("utf-8", errors="replace"), expected)
        if ok:
            passed += 1
            continue
        timed_out = timed_out or r.timed_out
        if first_fail is None:
            first_fail = f"case {i}: " + ("wrong output" if r.exit_code == 0 else r.describe())
        if not partial:
            break
    result = f"all {total} cases passed" if passed == total else f"{total - passed} of {total} cases failed" \
        if partial else f"failed at {first_fail}"
    if first_fail and partial:
        result += f"; first: {first_fail}"
    return CodeGrade(_score(passed, total, partial), passed, total, result, timed_out=timed_out)


# ------------------------------------------------------------------------------------------------ --rm-type code
_runners: dict[tuple, Runner] = {}


def code_runner(args) -> Runner:
    """This process's sandbox for the job's --sandbox-* flags (made on first use; its plan probes the machine)."""
    from ..sandbox.layers import Policy
    key = (args.sandbox_timeout, args.sandbox_memory_mb, args.sandbox_concurrency, args.sandbox_allow_network,
           args.sandbox_python)
    r = _runners.get(key)
    if r is None:
        r = Runner(Policy(allow_network=bool(args.sandbox_allow_network), python=args.sandbox_python or None),
                   Limits(timeout=float(args.sandbox_timeout), memory_mb=int(args.sandbox_memory_mb)),
                   concurrency=args.sandbox_concurrency or None)
        _runners[key] = r
    return r


def close_code_runners() -> dict:
    """Stop this process's sandboxes (their jail servers end and are reaped: their CPU time counts in this
    process's children from then on); their counters, summed."""
    total: dict = {}
    for r in _runners.values():
        r.close()
        for k, v in r.stats.items():
            total[k] = total.get(k, 0) + v
    _runners.clear()
    return total


async def code_reward(args, sample) -> float:
    """--rm-type code: the sample's program against its tests (the label), 1 if all pass (the fraction passed
    with --code-partial-credit). What happened goes to sample.metadata["code"]."""
    tests = parse_tests(sample.label)
    grade = await agrade_code(extract_program(sample.response), tests, code_runner(args),
                              partial=bool(args.code_partial_credit))
    sample.metadata["code"] = {"passed": grade.passed, "total": grade.total, "result": grade.result[:300]}
    return grade.score
