"""--rm-type code: extracting the program, the label formats (with errors that name the problem), the two test
formats graded in the sandbox, and programs that try to fool the grader -- each scores 0 where the honest
program scores 1. Also the reward paths: compute_reward with --rm-type code, the built-in reward worker and
CodeRewardActor answering a rollout worker's `score`."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile

import pytest
from helpers import job_config, untouchable

from slime_actors.actors.reward import CodeRewardActor, RewardWorker
from slime_actors.rewards import compute_reward
from slime_actors.rewards.code import (AssertTests, StdioTests, agrade_code, close_code_runners, extract_program,
                                       outputs_match, parse_tests)
from slime_actors.rewards.dispatch import RewardConfigError, check_reward_args
from slime_actors.sandbox import Limits, Policy, Runner
from slime_actors.types import Sample

LIMITS = Limits(timeout=4.0, cpu=2.0, memory_mb=256, file_mb=16, processes=32, output_bytes=64 << 10)


@pytest.fixture(scope="module")
def runner():
    root = tempfile.mkdtemp(prefix="sbx-code-")
    r = Runner(Policy(), LIMITS, concurrency=2, root=root)
    yield r
    r.close()
    shutil.rmtree(root, ignore_errors=True)


def grade(runner, program, tests, partial=False):
    return asyncio.run(agrade_code(program, tests, runner, partial=partial))


# ------------------------------------------------------------------------------------------------ extraction
@pytest.mark.parametrize("response, program", [
    ("def f(): pass", "def f(): pass"),
    ("Here:\n```python\nx = 1\n```\nand better:\n```py\nx = 2\n```\nDone.", "x = 2\n"),
    ("```\nplain\n```", "plain\n"),
    ("text\n```python\ncut at the token limit", "cut at the token limit"),
    ("```python\na = 1\n```\nthen\n```python\nb = 2", "b = 2"),
    ("", ""),
    (None, ""),
])
def test_extract_program(response, program):
    assert extract_program(response) == program


# ------------------------------------------------------------------------------------------------ labels
def test_label_formats():
    assert parse_tests({"tests": ["assert f() == 1"]}) == AssertTests(("assert f() == 1",))
    assert parse_tests('{"test_list": ["assert f() == 1"], "test_setup_code": "import math"}') == \
        AssertTests(("assert f() == 1",), "import math")
    he = parse_tests({"test": "def check(candidate):\n    assert candidate(1) == 2\n", "entry_point": "inc",
                      "prefix": "def inc(x):\n"})
    assert he.tests[-1].endswith("check(inc)\n") and he.prefix == "def inc(x):\n"
    assert parse_tests({"inputs": ["1\n"], "outputs": [["2", "3"]]}) == StdioTests(("1\n",), ("2\n3",))
    apps = parse_tests({"input_output": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})})
    assert apps == StdioTests(("1 2\n",), ("3\n",))


@pytest.mark.parametrize("label, message", [
    (None, "no label"),
    ("not json", "JSON object"),
    ([1, 2], "object with 'tests'"),
    ({"tests": []}, "non-empty list"),
    ({"tests": [1]}, "non-empty list"),
    ({"inputs": [], "outputs": []}, "non-empty lists"),
    ({"inputs": ["1", "2"], "outputs": ["1"]}, "has 2 cases and 'outputs' 1"),
    ({"inputs": [3], "outputs": ["3"]}, "inputs[0] must be a string"),
    ({"tests": ["assert 1"], "entry_point": "not a name"}, "'entry_point' must be a Python name"),
    ({"fn_name": "f(x)", "inputs": [[1]], "outputs": [1]}, "'fn_name' must be a Python name"),
    ({"question": "?"}, "has ['question']"),
])
def test_bad_labels_name_the_problem(label, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse_tests(label)


def test_output_comparison_is_whitespace_tolerant():
    assert outputs_match("1  2\r\n3\n\n", "1 2\n3")
    assert outputs_match("  7 ", "7\n")
    assert not outputs_match("1 2 3", "1 2\n3")
    assert not outputs_match("7", "7.0")


# ------------------------------------------------------------------------------------------------ both formats
ADD = AssertTests(("assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"))
SUM = StdioTests(("1 2\n", "5 5\n", "-3 3\n"), ("3\n", "10\n", "0\n"))


def test_assert_style(runner):
    assert grade(runner, "def add(a, b):\n    return a + b\n", ADD).score == 1.0
    wrong = grade(runner, "def add(a, b):\n    return 3\n", ADD)
    assert wrong.score == 0.0 and wrong.passed == 1 and "AssertionError" in wrong.result
    assert grade(runner, "def add(a, b):\n    return 3\n", ADD, partial=True).score == pytest.approx(1 / 3)
    broken = grade(runner, "def add(a, b) return", ADD)
    assert broken.score == 0.0 and "SyntaxError" in broken.result
    assert grade(runner, "", ADD).result == "no program in the response"


def test_assert_style_humaneval_and_call_based(runner):
    he = parse_tests({"test": "def check(candidate):\n    assert candidate([1, 2]) == [2, 3]\n"
                              "    assert candidate([]) == []\n", "entry_point": "incr_list",
                      "prefix": "def incr_list(l: list):\n    \"\"\"Return the list with each element + 1.\"\"\"\n"})
    assert grade(runner, "    return [x + 1 for x in l]\n", he).score == 1.0
    assert grade(runner, "    return l\n", he).score == 0.0
    apps = parse_tests({"fn_name": "twoSum", "inputs": [[[2, 7, 11], 9], [[3, 3], 6]], "outputs": [[[0, 1]], [0, 1]]})
    leet = ("class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n"
            "        for i, x in enumerate(nums):\n            if target - x in seen:\n"
            "                return [seen[target - x], i]\n            seen[x] = i\n")
    assert grade(runner, leet, apps).score == 1.0
    assert grade(runner, leet.replace("return [seen[target - x], i]", "return [0, 0]"), apps).score == 0.0


def test_values_cross_as_plain_data(runner):
    t = AssertTests(("assert f() == (1, [2.5, None], {'a': {3, 4}}, b'x', 10 ** 30, frozenset({1}))",
                     "assert list(gen(3)) == [0, 1, 2]", "assert isinstance(f()[1], list)",
                     "import math\nassert math.isnan(nan())", "assert C(2).double() == 4",
                     "try:\n    boom()\nexcept ValueError as e:\n    assert 'bad' in str(e)\nelse:\n    assert False"))
    prog = ("def f():\n    return (1, [2.5, None], {'a': {3, 4}}, b'x', 10 ** 30, frozenset({1}))\n"
            "def gen(n):\n    yield from range(n)\n"
            "def nan():\n    return float('nan')\n"
            "class C:\n    def __init__(self, x):\n        self.x = x\n    def double(self):\n        return 2 * self.x\n"
            "def boom():\n    raise ValueError('bad input')\n")
    g = grade(runner, prog, t)
    assert g.score == 1.0, g


def test_stdin_stdout(runner):
    honest = "import sys\nfor line in sys.stdin:\n    a, b = map(int, line.split())\n    print(a + b)\n"
    assert grade(runner, honest, SUM).score == 1.0
    half = grade(runner, "a, b = map(int, input().split())\nprint(a + b if a > 0 else 1)\n", SUM, partial=True)
    assert half.score == pytest.approx(2 / 3)
    crash = grade(runner, "raise SystemExit(3)", SUM)
    assert crash.score == 0.0 and "exit code 3" in crash.result


# ------------------------------------------------------------------------------------------------ fooling the grader
HONEST_ADD = "def add(a, b):\n    return a + b\n"
CHEATS = {
    "prints PASS": "print('PASS')\nprint('all tests passed')\n",
    "exits 0 early": "import os\nos._exit(0)\n",
    "sys.exit(0)": "import sys\nsys.exit(0)\n",
    "patches builtins and sys.exit": ("import builtins, sys\nbuiltins.AssertionError = type('A', (Exception,), {})\n"
                                      "sys.exit = lambda *a: None\nbuiltins.print = lambda *a, **k: None\n"
                                      "def add(a, b):\n    return -999\n"),
    "always-equal object": ("class Yes:\n    def __eq__(self, other):\n        return True\n"
                            "    __hash__ = object.__hash__\ndef add(a, b):\n    return Yes()\n"),
    "int subclass that equals all": ("class Yes(int):\n    def __eq__(self, other):\n        return True\n"
                                     "    __hash__ = int.__hash__\ndef add(a, b):\n    return Yes(-999)\n"),
    "reads the tests": ("import os, glob\nseen = ''\nfor p in glob.glob('**', recursive=True) + "
                        "['/proc/%d/fd/0' % os.getppid(), '/proc/%d/cmdline' % os.getppid(), "
                        "'/proc/%d/environ' % os.getppid(), '/proc/%d/mem' % os.getppid()]:\n"
                        "    try:\n        seen += open(p, errors='replace').read()\n    except Exception:\n"
                        "        pass\nimport re\nexpected = {}\nfor a, b, c in re.findall(r'add\\((-?\\d+), (-?\\d+)\\) == "
                        "(-?\\d+)', seen):\n    expected[(int(a), int(b))] = int(c)\n"
                        "def add(a, b):\n    return expected.get((a, b), -999)\n"),
    "edits the test file": ("import glob\nfor p in glob.glob('*'):\n    if p != 'solution.py':\n"
                            "        open(p, 'w').write('')\nopen('tests.py', 'w').write('')\n"
                            "def add(a, b):\n    return -999\n"),
    "forges a verdict line": ("import sys, json\nfor t in ('', 'x' * 32, '0' * 32):\n"
                              "    sys.__stdout__.write(t + ' ' + json.dumps({'passed': [True] * 3}) + '\\n')\n"
                              "    sys.__stdout__.flush()\n"
                              "import os\nos.write(1, b'{\"passed\": [true, true, true]}\\n')\n"
                              "def add(a, b):\n    return -999\n"),
    "kills the tester": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "ptraces the tester": ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                           "print(libc.ptrace(16, os.getppid(), 0, 0))\ndef add(a, b):\n    return -999\n"),
    "hangs in the test": "def add(a, b):\n    while True:\n        pass\n",
}


STDIO_CHEATS = {
    "prints PASS": "print('PASS')",
    "reads expected outputs": ("import glob\nfor p in glob.glob('**', recursive=True) + glob.glob('/tmp/**'):\n"
                               "    try:\n        print(open(p).read())\n    except Exception:\n        pass\n"),
    "exits 0 silently": "import os\nos._exit(0)",
}


@pytest.mark.parametrize("tests, name", [(ADD, n) for n in sorted(CHEATS)] + [(SUM, n) for n in sorted(STDIO_CHEATS)],
                         ids=[f"assert: {n}" for n in sorted(CHEATS)] + [f"stdio: {n}" for n in sorted(STDIO_CHEATS)])
def test_a_program_cannot_fool_the_grader(runner, tests, name):
    program = (CHEATS if tests is ADD else STDIO_CHEATS)[name]
    g = grade(runner, program, tests, partial=True)
    assert g.score == 0.0, (name, g)


def test_the_honest_program_still_passes_after_the_cheats(runner):
    g = grade(runner, HONEST_ADD + "# after the cheats\n", ADD)
    assert g.score == 1.0 and "cached" not in g.details


# ------------------------------------------------------------------------------------------------ reward paths
SMALL = dict(rm_type="code", sandbox_timeout=4.0, sandbox_memory_mb=256, sandbox_concurrency=2)


def code_sample(i: int, response: str) -> Sample:
    label = {"tests": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"]}
    return Sample(index=i, group_index=0, prompt="write add", response=response, label=label)


def test_rm_type_code_through_compute_reward():
    args = job_config(**SMALL).flat()
    try:
        s = code_sample(0, "```python\n" + HONEST_ADD + "```")
        untouchable(s)   # (a text-only reward: the rollout workers send it no token lists; reading one raises)
        assert asyncio.run(compute_reward(args, s)) == 1.0
        assert s.metadata["code"] == {"passed": 2, "total": 2, "result": "all 2 tests passed"}
        assert asyncio.run(compute_reward(args, code_sample(1, "def add(a, b): return 1"))) == 0.0
        partial = job_config(**SMALL, code_partial_credit=True).flat()
        assert asyncio.run(compute_reward(partial, code_sample(2, "def add(a, b): return 0"))) == 0.5
    finally:
        close_code_runners()


def test_rm_type_code_refuses_at_start_where_the_network_stays_open(monkeypatch):
    from slime_actors.sandbox import layers
    monkeypatch.setattr(layers, "probe", lambda python=None: {"root": True, "pid": True, "mount": True,
                                                              "net": "EPERM", "ipc": True, "uts": True,
                                                              "landlock": True, "seccomp": "not installed"})
    close_code_runners()
    try:
        with pytest.raises(RewardConfigError, match="--sandbox-allow-network"):
            check_reward_args(job_config(**SMALL).flat())
        check_reward_args(job_config(**SMALL, sandbox_allow_network=True).flat())
    finally:
        close_code_runners()


def test_sandbox_flags_are_checked():
    from slime_actors.config import ConfigError
    for bad, msg in (({"sandbox_timeout": 0}, "--sandbox-timeout must be > 0"),
                     ({"sandbox_memory_mb": 8}, "--sandbox-memory-mb must be >= 64"),
                     ({"sandbox_concurrency": 0}, "--sandbox-concurrency must be >= 1")):
        with pytest.raises(ConfigError, match=msg):
            job_config(**{**SMALL, **bad})


def ask_score(actor, samples):
    return asyncio.run(type(actor)._handlers["score"].fn(actor, samples=samples, group=False))


@pytest.mark.parametrize("cls", [RewardWorker, CodeRewardActor])
def test_reward_actors_grade_code(cls):
    actor = cls(0, args=job_config(**SMALL).to_dict())
    samples = [code_sample(0, HONEST_ADD).to_wire(), code_sample(1, CHEATS["prints PASS"]).to_wire(),
               Sample(index=2, group_index=0, response=HONEST_ADD, label="not json").to_wire()]

    async def go():
        await actor.setup()
        try:
            return await type(actor)._handlers["score"].fn(actor, samples=samples, group=False)
        finally:
            await actor.teardown()
    rep = asyncio.run(go())
    assert rep["rewards"][:2] == [1.0, 0.0]
    assert rep["rewards"][2] is None and "JSON object" in rep["errors"][2]
    if cls is CodeRewardActor:
        assert actor.counters["programs"] == 2 and actor.counters["programs_passed"] == 1


def test_a_program_that_does_not_compile_is_not_run_and_one_graded_is_not_run_again(runner):
    before = runner.stats["runs"]
    g = grade(runner, "def add(a, b) return a + b", ADD)
    assert g.score == 0.0 and "does not compile" in g.result and runner.stats["runs"] == before
    program = HONEST_ADD + "# graded once\n"
    first = grade(runner, program, ADD)
    assert runner.stats["runs"] == before + 1 and "cached" not in first.details
    again = grade(runner, program, ADD)
    assert runner.stats["runs"] == before + 1 and again.details == {"cached": True}
    assert (again.score, again.passed, again.result) == (first.score, first.passed, first.result)
    # other tests, or partial credit, are another grading
    grade(runner, program, ADD, partial=True)
    assert runner.stats["runs"] == before + 2
