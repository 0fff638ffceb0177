"""Scoring samples: pick the reward function from the flags, call it, turn its answer into a float.

Which function (first match wins):
  1. --custom-rm-path: a user function, loaded by `slime_actors.plugins.load_function` —
     `async def fn(args, sample) -> float` (or sync); with --group-rm `fn(args, samples) -> list[float]`.
  2. sample.metadata["rm_type"], when a row carries its own reward type (slime's convention).
  3. --rm-type: a built-in (BUILTIN_RMS: math, boxed_math, dapo, boxed, exact_match, exact_match_ci, f1,
     deepscaler, remote_rm, random, code) or one added with `register_reward`. `code` runs the response's program
     in the sandbox against the label's tests (slime_actors/rewards/code.py, docs/code-sandbox.md). "boxed_<type>" scores the last \\boxed{}
     of the response with <type> (e.g. boxed_f1). The math rules (math, boxed_math, deepscaler) grade the final
     answer (docs/adding-a-reward-actor.md); their math-verify work has a hard deadline (--math-grading-timeout)
     in any thread, and a sample that runs past it scores 0 and is marked metadata["reward_timed_out"].

What a function may return: a number (bool, int, float, numpy/torch scalar), or a dict from which --reward-key
picks the reward (default key "reward"). Anything else, or NaN/inf, is an error.

Failures. A reward function that raises (or returns something unusable, or runs past `timeout`) never loses the
sample: `compute_reward` raises `RewardError` naming the reward type, the sample index and the cause, and the
caller decides to retry or mark the sample failed (`score_batch` collects these per sample instead of raising).
Configuration problems — no reward chosen, an unknown --rm-type, a --custom-rm-path that cannot be loaded — are
`RewardConfigError` and are raised as they are (no sample could ever be scored); `check_reward_args(args)` finds
them at startup.

A --group-rm function called through `compute_reward` gets a one-sample group. Built-ins under --group-rm score
each sample of the group concurrently.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import random
from collections.abc import Callable
from dataclasses import replace

from slime_actors.plugins import PluginError, load_function
from slime_actors.rewards import rules
from slime_actors.rewards.code import code_reward
from slime_actors.rewards.remote import remote_rm

__all__ = ["RewardError", "RewardConfigError", "BUILTIN_RMS", "register_reward", "check_reward_args",
           "compute_reward", "compute_group_rewards", "score_batch", "score_samples", "to_reward"]


class RewardError(RuntimeError):
    """Scoring failed for a sample (or a group, then `sample_index` is a list); the sample itself is intact."""

    def __init__(self, rm_type: str, sample_index, cause: BaseException):
        self.rm_type, self.sample_index, self.cause = rm_type, sample_index, cause
        what = f"samples {sample_index}" if isinstance(sample_index, list) else f"sample {sample_index}"
        super().__init__(f"reward {rm_type!r} failed for {what}: {type(cause).__name__}: {cause}")


class RewardConfigError(ValueError):
    """The flags do not name a usable reward function."""


def _rule(fn):
    def score(args, sample):
        return fn(sample.response, sample.label)
    score.__name__ = fn.__name__
    return score


def _exact_match(args, sample):
    return rules.exact_match_reward(sample.response, sample.label)


def _exact_match_ci(args, sample):
    return rules.exact_match_reward(sample.response, sample.label, ignore_case=True)


async def _graded(args, sample, response: str | None, boxed_only: bool = False) -> float:
    g = await rules.agrade_math(response, sample.label, args.math_grading_timeout, boxed_only=boxed_only)
    if g.timed_out:   # the reward worker reports it (rollout/reward_timeouts)
        sample.metadata["reward_timed_out"] = True
    return g.score


async def _math(args, sample):
    return await _graded(args, sample, sample.response)


async def _boxed_math(args, sample):
    return await _graded(args, sample, sample.response, boxed_only=True)


async def _deepscaler(args, sample):
    answer = rules.strip_thinking(sample.response or "")
    if answer is None:
        rules._labels(sample.label)      # a missing label is still an error
        return 0.0
    return await _graded(args, sample, answer)


def _dapo(args, sample):
    return rules.dapo_reward(sample.response, sample.label)


def _random(args, sample):
    return float(random.randint(0, 1))


BUILTIN_RMS: dict[str, Callable] = {
    "math": _math,
    "boxed_math": _boxed_math,
    "dapo": _dapo,
    "boxed": _rule(rules.boxed_reward),
    "exact_match": _exact_match,
    "exact_match_ci": _exact_match_ci,
    "f1": _rule(rules.f1_reward),
    "deepscaler": _deepscaler,
    "remote_rm": remote_rm,
    "random": _random,
    "code": code_reward,
}


_SHIPPED = frozenset(BUILTIN_RMS)


def register_reward(name: str, fn: Callable | None = None):
    """Add a reward type usable as --rm-type NAME: `register_reward("mine", fn)` or as a decorator. A built-in's
    name is refused (ValueError): the rollout workers send a built-in's samples without their token lists
    (actors/rollout.py `text_only`), which a function of yours may need."""
    if name in _SHIPPED or (name.startswith("boxed_") and name[len("boxed_"):] in _SHIPPED):
        raise ValueError(f"register_reward: {name!r} is a built-in reward type's name (or boxed_<built-in>, which "
                         "scores the last \\boxed{} with it); register yours under another name")

    def deco(f):
        BUILTIN_RMS[name] = f
        return f
    return deco(fn) if fn is not None else deco


def _builtin(rm_type: str) -> Callable:
    fn = BUILTIN_RMS.get(rm_type)
    if fn is not None:
        return fn
    if rm_type.startswith("boxed_") and rm_type[len("boxed_"):] in BUILTIN_RMS:
        inner = BUILTIN_RMS[rm_type[len("boxed_"):]]

        def boxed(args, sample):
            return inner(args, replace(sample, response=rules.extract_boxed(sample.response or "") or ""))
        return boxed
    raise RewardConfigError(f"unknown reward type {rm_type!r}: built-ins are {sorted(BUILTIN_RMS)} "
                            "(or boxed_<type>), or use --custom-rm-path")


def _resolve(args, sample=None, group: bool | None = None) -> tuple[str, Callable, bool]:
    """(name for messages, function, called with a group). `group` overrides --group-rm."""
    path = args.custom_rm_path
    if path:
        try:
            fn = load_function(path, flag="--custom-rm-path")
        except PluginError as exc:
            raise RewardConfigError(str(exc)) from exc
        return path, fn, bool(args.group_rm if group is None else group)
    meta = getattr(sample, "metadata", None)
    rm_type = meta.get("rm_type") if isinstance(meta, dict) else None
    rm_type = (rm_type or args.rm_type or "").strip()
    if not rm_type:
        raise RewardConfigError("no reward function: set --rm-type or --custom-rm-path")
    return rm_type, _builtin(rm_type), False


def check_reward_args(args) -> str:
    """Raise RewardConfigError if the flags name no usable reward function; the name of the one they name."""
    name, _, _ = _resolve(args)
    if name == "remote_rm" and not args.rm_url:
        raise RewardConfigError("--rm-type remote_rm needs --rm-url")
    if name == "code":
        from slime_actors.rewards.code import code_runner
        from slime_actors.sandbox import SandboxUnavailable
        try:
            code_runner(args).plan      # probes the machine: refuses where the network cannot be cut
        except SandboxUnavailable as exc:
            raise RewardConfigError(f"--rm-type code: {exc}") from None
    return name


def to_reward(value, args=None) -> float:
    """A reward function's answer as a finite float (a dict is read at --reward-key, default "reward")."""
    if isinstance(value, dict):
        key = (args.reward_key if args is not None else None) or "reward"
        if key not in value:
            raise ValueError(f"reward function returned a dict without key {key!r} (keys: {sorted(value)}); "
                             "set --reward-key")
        value = value[key]
    if isinstance(value, (str, bytes)) or value is None or not hasattr(value, "__float__"):
        raise TypeError(f"reward function returned {type(value).__name__} {value!r:.100}, expected a number")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"reward function returned {out}, expected a finite number")
    return out


async def _call(fn, *a):
    out = fn(*a)
    if inspect.isawaitable(out):
        out = await out
    return out


def _group_values(values, n: int) -> list:
    if isinstance(values, tuple):
        values = list(values)
    if not isinstance(values, list):
        raise TypeError(f"group reward function returned {type(values).__name__}, expected a list of {n} rewards")
    if len(values) != n:
        raise ValueError(f"group reward function returned {len(values)} rewards for {n} samples")
    return values


async def compute_reward(args, sample, group: bool | None = None) -> float:
    """The reward of one sample. Raises RewardError (the function failed; see the module docstring) or
    RewardConfigError (the flags are wrong). `group` overrides --group-rm."""
    name, fn, group = _resolve(args, sample, group)
    try:
        if group:
            value = _group_values(await _call(fn, args, [sample]), 1)[0]
        else:
            value = await _call(fn, args, sample)
        return to_reward(value, args)
    except (RewardError, RewardConfigError):
        raise
    except Exception as exc:
        raise RewardError(name, sample.index, exc) from exc


async def compute_group_rewards(args, samples: list, group: bool | None = None) -> list[float]:
    """Rewards of one group of samples: one call of the --group-rm function, or each sample concurrently.
    Raises RewardError (for a group function: naming all the group's sample indices; otherwise the first
    failing sample's error) or RewardConfigError. `group` overrides --group-rm."""
    if not samples:
        return []
    name, fn, group = _resolve(args, samples[0], group)
    if not group:
        results = await asyncio.gather(*(compute_reward(args, s, False) for s in samples), return_exceptions=True)
        for r in results:
            if isinstance(r, RewardConfigError):
                raise r
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return list(results)
    try:
        values = _group_values(await _call(fn, args, list(samples)), len(samples))
        return [to_reward(v, args) for v in values]
    except (RewardError, RewardConfigError):
        raise
    except Exception as exc:
        raise RewardError(name, [s.index for s in samples], exc) from exc


def _name(args, sample) -> str:
    try:
        return _resolve(args, sample)[0]
    except RewardConfigError:
        return str(args.rm_type)


async def score_batch(args, samples: list, concurrency: int = 64, timeout: float | None = None,
                      group: bool | None = None) -> tuple[list[float | None], list[RewardError | None]]:
    """Score many samples concurrently (at most `concurrency` calls in flight; with --group-rm one call per group,
    grouped by `group_index`). Returns (rewards, errors), parallel to `samples`: a reward and None, or None and
    the RewardError (a call past `timeout` seconds is one, caused by TimeoutError; a sync function that blocks
    cannot be interrupted, so the timeout only bounds awaiting code). RewardConfigError is raised. `group`
    overrides --group-rm."""
    n = len(samples)
    rewards: list[float | None] = [None] * n
    errors: list[RewardError | None] = [None] * n
    sem = asyncio.Semaphore(max(1, concurrency))
    group = bool(args.group_rm if group is None else group)
    group_mode = group and bool(args.custom_rm_path)

    if group_mode:
        groups: dict = {}
        for i, s in enumerate(samples):
            groups.setdefault(s.group_index, []).append(i)
        units = list(groups.values())
    else:
        units = [[i] for i in range(n)]

    async def run(idx: list[int]):
        members = [samples[i] for i in idx]
        async with sem:
            try:
                coro = compute_group_rewards(args, members, group) if group_mode \
                    else compute_reward(args, members[0], group)
                out = await (asyncio.wait_for(coro, timeout) if timeout else coro)
                out = out if group_mode else [out]
                for i, r in zip(idx, out):
                    rewards[i] = r
            except RewardConfigError:
                raise
            except RewardError as exc:
                for i in idx:
                    errors[i] = exc
            except TimeoutError:
                where = [s.index for s in members] if group_mode else members[0].index
                err = RewardError(_name(args, members[0]), where,
                                  TimeoutError(f"no reward within {timeout} s"))
                for i in idx:
                    errors[i] = err

    tasks = [asyncio.ensure_future(run(u)) for u in units]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return rewards, errors


async def score_samples(args, samples: list, group: bool | None = None, concurrency: int = 64,
                        timeout: float | None = None) -> tuple[list[float | None], list[str | None]]:
    """`score_batch` for messages: errors as strings. `group` overrides --group-rm."""
    rewards, errors = await score_batch(args, samples, concurrency=concurrency, timeout=timeout, group=group)
    return rewards, [None if e is None else str(e) for e in errors]
