"""Reward actors: `RewardActor`, the base class of your own, `RewardWorker`, the built-in one, and
`CodeRewardActor`, which grades programs in the sandbox (--rm-type code as an actor of its own).

    class Judge(RewardActor):
        async def setup(self):                            # once, before the actor serves (load a model here)
            self.model = await self.run_blocking(load_judge, "judge.pt")

        async def score(self, sample: Sample) -> float:   # or score_batch(self, samples) -> list[float]
            return float(sample.response.strip() == sample.label)

Run it with `--reward-actor-class pkg.mod:Judge` (or `path/to/file.py:Judge`). The base class plays the role
`reward` and answers the `score` message the rollout workers send (slime_actors/messages.py): it decodes the samples
once, calls your method, turns each answer into a reward or a per-sample error, counts (`scored`, `reward_errors`,
`reward_timeouts`) and replies in the shape the rollout workers expect. Three forms, define one or more:

- `score(self, sample) -> float` scores one sample; the samples of a request are scored concurrently (at most
  --reward-batch-size at once).
- `score_batch(self, samples) -> list[float]` scores all of a request's samples in one call (a judge model's batch).
- `score_group(self, samples) -> list[float]` scores one prompt's group at once; used under --group-rm, and always
  when it is the only form defined.

An answer may be a number (bool, int, float, numpy/torch scalar) or a dict read at --reward-key. A `score` that
raises, or an exception instance in the list `score_batch`/`score_group` returns, fails that sample only; a batch
or group call that raises fails its samples. A failed sample loses nothing: it comes back with an error instead of
a reward, the rollout worker retries it (on another reward worker if there is one), and a group that still cannot be
scored is handed to the buffer as failed, where it is recorded and replaced by a fresh prompt. Set
`sample.metadata["reward_timed_out"] = True` on a sample whose scorer gave up in time and returned a fallback: it is
counted in `rollout/reward_timeouts`.

Also at hand: `self.cfg` (the job's typed config: `self.cfg.reward.rm_type`, ...), `self.log`, `self.counters`,
`self.run_blocking(fn, ...)` for CPU-heavy work, `teardown()` when the actor stops, and extra `@handler` methods.

The earlier wire form keeps working: an `Actor` (or a `RewardActor`) with role `reward` whose `@handler` `score`
takes the declared fields `(samples: list, group: bool = False)` and returns `{rewards, errors}` answers the
message itself. docs/adding-a-reward-actor.md has the whole story.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from ..config import JobConfig, RewardSection
from ..eval_config import EVAL_SET_KEY, grader_config, own_graders
from ..messages import BadRequest
from ..rewards.dispatch import RewardConfigError, RewardError, to_reward
from ..types import Sample
from .base import Actor, handler

SCORERS = ("score", "score_batch", "score_group")
WIRE_FIELDS = {"samples", "group"}   # the declared fields of reward.score

NEW_FORM = ("    class MyJudge(RewardActor):\n"
            "        async def score(self, sample: Sample) -> float:\n"
            "            return float(sample.response.strip() == sample.label)\n"
            "(or `async def score_batch(self, samples) -> list[float]`; docs/adding-a-reward-actor.md)")


class RewardActor(Actor):
    """Base class of a reward actor: define `score`, `score_batch` or `score_group` (module docstring)."""

    role = "reward"

    def __init_subclass__(cls, **kw):
        _check_scorers(cls)
        super().__init_subclass__(**kw)

    def __init__(self, index: int = 0, **config: Any):
        super().__init__(index, **config)
        if not any(_overrides(type(self), m) for m in SCORERS):
            raise TypeError(f"{type(self).__name__} does not score: a RewardActor defines one of "
                            f"{', '.join(SCORERS)}, e.g.\n{NEW_FORM}")
        self.counters.update({"scored": 0, "reward_errors": 0, "reward_timeouts": 0})
        # held-out sets with a reward of their own (--eval-config): their samples are graded with it, not by you
        self.eval_graders = {name: grader_config(self.cfg, s) for name, s in own_graders(self.cfg).items()}
        if self.eval_graders and getattr(getattr(type(self), "score", None), "_slime_handler", None) == "score":
            raise TypeError(f"{type(self).__name__} answers reward.score itself (the earlier wire form), so it "
                            f"cannot leave the held-out sets {sorted(self.eval_graders)} to the rewards --eval-config "
                            f"gives them: define score / score_batch instead:\n{NEW_FORM}")

    # ------------------------------------------------------------------------------------------ yours to define
    async def setup(self) -> None:
        """Called once before the actor serves: load a model, open a pool. Requests wait until it returns; one
        that raises ends the actor's start (the launcher reports it)."""

    async def teardown(self) -> None:
        """Called once when the actor stops."""

    async def score(self, sample: Sample) -> float:
        """The reward of one sample."""
        raise NotImplementedError

    async def score_batch(self, samples: list[Sample]) -> list:
        """The rewards of a request's samples, in order (an exception instance in place of a sample's reward fails
        only that sample). By default: `score` on each, at most --reward-batch-size at once."""
        if not _overrides(type(self), "score"):   # only score_group is defined: score whole groups
            return await self._by_group(samples)
        sem = asyncio.Semaphore(max(1, self.cfg.reward.reward_batch_size))

        async def one(s: Sample):
            async with sem:
                return await _call(self.score, s)
        return await asyncio.gather(*(one(s) for s in samples), return_exceptions=True)

    async def score_group(self, samples: list[Sample]) -> list:
        """The rewards of one group (the samples of one prompt), in order. By default: `score_batch`."""
        return await self.score_batch(samples)

    # ------------------------------------------------------------------------------------------ the wire
    async def on_start(self) -> None:
        await self.setup()
        if self.eval_graders:   # each held-out set's own reward, loaded and checked before the actor serves
            await self.run_blocking(_check_graders, self.eval_graders)

    async def on_stop(self) -> None:
        await self.teardown()

    @handler(name="score")
    async def _score_request(self, samples: list, group: bool = False) -> dict:
        """reward.score: decode the samples once, score them, reply {rewards, errors, timed_out}."""
        parsed = [_decode(i, raw) for i, raw in enumerate(samples)]
        group = bool(group or self.cfg.reward.group_rm)
        by_set: dict[str, list[int]] = {}    # samples of an eval set with a reward of its own (--eval-config)
        mine: list[int] = []                 # the others: yours to score
        for i, s in enumerate(parsed):
            name = s.metadata.get(EVAL_SET_KEY) if isinstance(s.metadata, dict) else None
            if name in self.eval_graders:
                by_set.setdefault(name, []).append(i)
            else:
                mine.append(i)
        answers: list = [None] * len(parsed)
        if mine or not parsed:
            todo = [parsed[i] for i in mine]
            if group and _overrides(type(self), "score_group") or not todo:
                got = await self._by_group(todo)
            else:
                got = await self._call_scorer("score_batch", todo)
            for i, a in zip(mine, got):
                answers[i] = a
        for name, idx in by_set.items():
            for i, a in zip(idx, await self._grade_eval_set(name, [parsed[i] for i in idx])):
                answers[i] = a
        rewards: list[float | None] = []
        errors: list[str | None] = []
        for s, value in zip(parsed, answers):
            r, e = self._outcome(s, value)
            rewards.append(r)
            errors.append(e)
        timed_out = [bool(s.metadata.get("reward_timed_out")) for s in parsed]
        self._account(rewards, errors, timed_out)
        return {"rewards": rewards, "errors": errors, "timed_out": timed_out}

    async def _grade_eval_set(self, name: str, samples: list[Sample]) -> list:
        """The rewards of an eval set's samples by the set's own reward (--eval-config), one sample at a time."""
        from ..rewards import score_batch
        rewards, errors = await score_batch(self.eval_graders[name].flat(), samples, group=False,
                                            concurrency=self.cfg.reward.reward_batch_size)
        return [r if e is None else e for r, e in zip(rewards, errors)]

    async def _by_group(self, samples: list[Sample]) -> list:
        groups: dict[Any, list[int]] = {}
        for i, s in enumerate(samples):
            groups.setdefault(s.group_index, []).append(i)
        out: list = [None] * len(samples)
        results = await asyncio.gather(*(self._call_scorer("score_group", [samples[i] for i in idx])
                                         for idx in groups.values()))
        for idx, answers in zip(groups.values(), results):
            for i, a in zip(idx, answers):
                out[i] = a
        return out

    async def _call_scorer(self, method: str, samples: list[Sample]) -> list:
        """`method`'s answers for `samples`, one per sample; a call that raises or answers the wrong number of
        rewards fails every one of them (RewardConfigError is raised: no sample could ever be scored)."""
        try:
            answers = await _call(getattr(self, method), samples)
            if isinstance(answers, tuple):
                answers = list(answers)
            if not isinstance(answers, list):
                raise TypeError(f"{method} returned {type(answers).__name__}, expected a list of "
                                f"{len(samples)} rewards")
            if len(answers) != len(samples):
                raise ValueError(f"{method} returned {len(answers)} rewards for {len(samples)} samples")
            return answers
        except RewardConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 -- the user's method: its samples fail, nothing is lost
            err = exc if isinstance(exc, RewardError) else \
                RewardError(f"{type(self).__name__}.{method}", [s.index for s in samples], exc)
            return [err] * len(samples)

    def _outcome(self, s: Sample, value: Any) -> tuple[float | None, str | None]:
        if isinstance(value, BaseException):
            if isinstance(value, RewardError):
                return None, str(value)
            return None, str(RewardError(f"{type(self).__name__}.score", s.index, value))
        try:
            return to_reward(value, self.cfg.reward), None
        except (TypeError, ValueError) as exc:
            return None, str(RewardError(f"{type(self).__name__}.score", s.index, exc))

    def _account(self, rewards: list, errors: list, timed_out: list[bool]) -> None:
        n_err = sum(e is not None for e in errors)
        n_timeouts = sum(timed_out)
        self.counters["scored"] += len(rewards) - n_err
        self.counters["reward_errors"] += n_err
        self.counters["reward_timeouts"] += n_timeouts
        if n_err:
            first = next(e for e in errors if e is not None)
            self.log.warning("reward function failed", samples=n_err, of=len(rewards), first_error=first)
        if n_timeouts:
            self.log.warning("scoring ran out of time for some samples (metadata.reward_timed_out)",
                             samples=n_timeouts, of=len(rewards), **self.timeout_log_fields())

    def timeout_log_fields(self) -> dict:
        """Extra fields for the log line that reports timed-out samples."""
        return {}


def _decode(i: int, raw: Any) -> Sample:
    if not isinstance(raw, dict):
        raise BadRequest(f"reward.score: samples[{i}] must be a map of a sample's fields, got {type(raw).__name__}")
    try:
        return Sample.from_wire(raw)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"reward.score: samples[{i}] is not a sample: {exc}") from None


async def _call(fn, *a):
    out = fn(*a)
    if inspect.isawaitable(out):
        out = await out
    return out


def _overrides(cls: type, method: str) -> bool:
    return getattr(cls, method) is not getattr(RewardActor, method)


def _params(fn) -> list[inspect.Parameter]:
    return list(inspect.signature(fn).parameters.values())[1:]


def _check_scorers(cls: type) -> None:
    """Refuse, when the class is defined, a scoring method whose shape the base class cannot call."""
    own = vars(cls)
    for m in SCORERS:
        fn = own.get(m)
        if fn is None:
            continue
        if not callable(fn):
            raise TypeError(f"{cls.__name__}.{m} must be a method, got {type(fn).__name__}:\n{NEW_FORM}")
        params = _params(fn)
        if getattr(fn, "_slime_handler", None) is not None:
            # the wire form (the handler answers reward.score itself): kept working; anything else is a mix-up
            if m == "score" and fn._slime_handler == "score" and {p.name for p in params} <= WIRE_FIELDS \
                    and "samples" in {p.name for p in params}:
                continue
            raise TypeError(f"{cls.__name__}.{m}: a RewardActor answers the `score` message itself; define "
                            f"{m} as a plain method, without @handler:\n{NEW_FORM}")
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = [p for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        what = "sample" if m == "score" else "samples"
        if not positional or len(required) > 1:
            names = ", ".join(p.name for p in params) or "nothing"
            raise TypeError(f"{cls.__name__}.{m} must take one argument, the {what} (`{m}(self, {what})`), "
                            f"but takes {names}:\n{NEW_FORM}")


class RewardWorker(RewardActor):
    """The built-in reward worker: scores with the configured reward function (--rm-type, --custom-rm-path,
    --group-rm; slime_actors/rewards/dispatch.py)."""

    def __init__(self, index: int = 0, **config):
        super().__init__(index, **config)
        self.plugin_args = self.cfg.flat()   # what reward functions get (slime's `args`)

    async def setup(self) -> None:
        # import the reward modules and load a custom function before serving, off the event loop, so the first
        # `score` does not stall the mailbox and bad paths fail at start-up; start the math grading processes
        # (each imports sympy and math-verify: about a second) when a math rule is configured
        problem = await self.run_blocking(_prepare, self.cfg.reward, self.plugin_args)
        if problem:
            self.log.warning("math grading processes did not start: labels that are plain numbers are graded, "
                             "others fail with this error", error=problem)
        if (self.cfg.reward.rm_type or "") == "code" and not self.cfg.reward.custom_rm_path:
            from ..rewards.code import code_runner
            runner = code_runner(self.plugin_args)
            self.log.info("sandbox ready", layers=runner.plan.describe(), concurrency=runner.concurrency)

    async def teardown(self) -> None:
        from ..rewards.code import close_code_runners
        from ..rewards.grading import close_grading_pool
        close_grading_pool()
        _log_cpu(self.log, close_code_runners())

    async def score_batch(self, samples: list[Sample]) -> list:
        return await self._dispatch(samples, group=False)

    async def score_group(self, samples: list[Sample]) -> list:
        return await self._dispatch(samples, group=True)

    async def _by_group(self, samples: list[Sample]) -> list:
        # rewards.score_batch groups the samples itself, all of a request's groups under one --reward-batch-size
        return await self._dispatch(samples, group=True)

    async def _dispatch(self, samples: list[Sample], group: bool) -> list:
        from ..rewards import score_batch
        rewards, errors = await score_batch(self.plugin_args, samples, group=group,
                                            concurrency=self.cfg.reward.reward_batch_size)
        return [r if e is None else e for r, e in zip(rewards, errors)]

    def timeout_log_fields(self) -> dict:
        # the math rules' deadline: a sample past it scores 0
        return {"timeout_s": self.cfg.reward.math_grading_timeout}


class CodeRewardActor(RewardActor):
    """Scores programs in the sandbox, as a reward actor of its own (scale out with more of them):

        --reward-actor-class slime_actors.actors.reward:CodeRewardActor --num-reward-workers 4 --sandbox-concurrency 8

    It grades exactly as `--rm-type code` (slime_actors/rewards/code.py: the response's program against the
    sample's tests) with the job's --sandbox-* flags; on top it logs the sandbox's layers once ready, counts
    programs, passes and timeouts, and answers `sandbox_stats` (runs, timeouts, errors, truncated outputs, the
    layers in use). `--rm-type code` on the built-in workers needs no class; this one is for a job that wants
    these counters, or code graded by other workers than its other rewards."""

    async def setup(self) -> None:
        from ..rewards.code import code_runner
        self.runner = code_runner(self.cfg.flat())
        runner = self.runner
        plan = await self.run_blocking(lambda: runner.plan)      # probes the machine; SandboxUnavailable ends start
        self.log.info("sandbox ready", layers=plan.describe(), concurrency=runner.concurrency,
                      timeout_s=runner.limits.timeout, memory_mb=runner.limits.memory_mb)
        self.counters.update({"programs": 0, "programs_passed": 0, "program_timeouts": 0})

    async def teardown(self) -> None:
        from ..rewards.code import close_code_runners
        _log_cpu(self.log, close_code_runners())

    async def score(self, sample: Sample) -> float:
        from ..rewards.code import agrade_code, extract_program, parse_tests
        tests = parse_tests(sample.label)
        g = await agrade_code(extract_program(sample.response), tests, self.runner,
                              partial=self.cfg.reward.code_partial_credit)
        self.counters["programs"] += 1
        self.counters["programs_passed"] += g.passed == g.total
        self.counters["program_timeouts"] += g.timed_out
        sample.metadata["code"] = {"passed": g.passed, "total": g.total, "result": g.result[:300]}
        return g.score

    @handler
    def sandbox_stats(self) -> dict:
        return {**self.runner.stats, "layers": self.runner.plan.describe(), "concurrency": self.runner.concurrency}


def _log_cpu(log, sandbox: dict) -> None:
    """The worker's CPU time when it stops: its own, and its children's (the grading processes and sandboxes it
    has stopped, with every program they ran); bench/sandbox.py reads it."""
    import resource
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    log.info("reward worker cpu", self_s=round(me.ru_utime + me.ru_stime, 3),
             children_s=round(kids.ru_utime + kids.ru_stime, 3), programs=sandbox.get("runs", 0),
             program_timeouts=sandbox.get("timeouts", 0), console=False)


MATH_RULES = ("math", "boxed_math", "deepscaler")


def _check_graders(graders: dict[str, JobConfig]) -> None:
    """Load each eval set's own reward (a custom function is imported here); RewardConfigError naming the set."""
    from ..rewards import check_reward_args
    for name, cfg in graders.items():
        try:
            check_reward_args(cfg.flat())
        except RewardConfigError as exc:
            raise RewardConfigError(f"--eval-config: set {name!r}: {exc}") from None


def _prepare(rw: RewardSection, args) -> str | None:
    """Check the reward flags (raises); start the grading processes for a math rule. Returns why they could not
    start (math-verify missing, say), or None. `args`: the flat view reward functions get."""
    from ..rewards import GradingError, check_reward_args, grading_pool
    if rw.reward_actor_class is None or rw.rm_type or rw.custom_rm_path:
        check_reward_args(args)
    pool = grading_pool(rw.math_grading_processes)
    if (rw.rm_type or "").removeprefix("boxed_") in MATH_RULES and not rw.custom_rm_path:
        try:
            pool.warm_up()
        except GradingError as exc:
            return str(exc)
    return None
