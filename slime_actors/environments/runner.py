"""One episode of an environment: reset, then model turn -> step -> observation until it is over.

    sample = await run_episode(env, sample, sampling_params, engine, calls=EnvCalls(env), chat=ChatTurns(tok),
                               episode_id="train-3:12:1", max_turns=4)

`engine` is anything with `tokenizer` and `async generate(input_ids, sampling_params) -> {output_ids, logprobs,
finish_reason, weight_version}`: a rollout worker's engine handle, or the harness's models (harness.py). The
bookkeeping is `Episode`'s (episode.py), chat turns are `ChatTurns`' (chat.py). How the env is called is `calls`':
`EnvCalls` calls it directly (the harness); a rollout worker's subclass records every call in its trace and serves
the recorded answers in a replay.

The episode ends when the env says done, after --max-turns model turns, when the token budget is spent (a turn cut
mid-way, or an observation that does not fit: `truncated`), or when the engine aborts a turn (`aborted`: a rollout
worker gives the group back without its partial responses; an episode does not resume where it stopped -- the env's
state is gone -- so a sample that comes with a response starts over from reset). `step` sees every turn that was not
aborted, the last one too (its observation is then not appended: `turn.last`), so it can give the episode's reward.
`close` runs at every end.

An env that raises, times out (--env-timeout) or answers out of its API makes `run_episode` raise EnvError naming
the env class, the call, the sample and the turn, after the sample was finished as `failed` with that error.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import msgpack

from ..log import get_logger
from ..tokenizer import decode_text
from ..types import ABORTED, FAILED, Sample
from .base import (CURRENT_EPISODE, Env, EnvError, EpisodeContext, ModelTurn, check_prompt, check_step,
                   maybe_await)
from .chat import ChatTemplateError, ChatTurns
from .episode import Episode

log = get_logger(component="env")


def no_answer(value: Any, where: str) -> None:
    """The check of calls that answer nothing (setup, close, teardown)."""
    return None


class EnvCalls:
    """Calls an env's methods for the runner: with the episode as `env.episode`, a timeout, and every failure as an
    EnvError naming the env, the call and the sample. `tools` collects the episode's tool calls when given a list
    (the harness shows them)."""

    def __init__(self, env: Env, timeout: float | None = None, tools: list | None = None):
        self.env = env
        self.name = type(env).__name__
        self.timeout = timeout
        self.tools = tools

    async def call(self, what: str, key: str, ctx: EpisodeContext, sample: Sample, fn: Callable, args: tuple,
                   check: Callable[[Any, str], Any] = no_answer) -> Any:
        """`fn(*args)` checked by `check`; the sample's metadata as the call left it."""
        answer = await self.run(what, key, ctx, sample, fn, args, check)
        sample.metadata = answer["metadata"]
        return answer["value"]

    async def run(self, what: str, key: str, ctx: EpisodeContext, sample: Sample | None, fn: Callable, args: tuple,
                  check: Callable[[Any, str], Any] = no_answer) -> dict:
        """The call itself, as plain data (what a rollout worker records): {value, metadata}."""
        where = self.where(what, sample, key)
        token = CURRENT_EPISODE.set(ctx)
        try:
            try:
                async with asyncio.timeout(self.timeout):
                    value = await maybe_await(fn(*args))
            except TimeoutError:
                raise EnvError(f"{where} did not answer within {self.timeout:g} s (--env-timeout)") from None
            except EnvError:
                raise
            except Exception as exc:
                raise EnvError(f"{where} raised {type(exc).__name__}: {exc}") from exc
        finally:
            CURRENT_EPISODE.reset(token)
        answer = {"value": check(value, where), "metadata": None if sample is None else sample.metadata}
        try:   # what the answer holds is recorded (a worker's trace): plain data only
            msgpack.packb(answer, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise EnvError(f"{where}: its answer or sample.metadata holds something that is not plain data ({exc}): "
                           "keep numbers, strings, lists and dicts there (other state: self.episode.state)") from None
        return answer

    def where(self, what: str, sample: Sample | None, key: str = "") -> str:
        turn = key.rsplit(":", 1)[-1] if what == "step" else None
        return (f"environment {self.name}.{what}" + ("" if sample is None else f" (sample {sample.index}"
                + ("" if turn is None else f", turn {turn}") + ")"))

    def tool_caller(self, key: str) -> Callable:
        """`Env.call_tool` inside the episode `key`: runs the tool; the harness keeps a list of what was called."""
        async def tool(name: str, fn: Callable, args: tuple, kwargs: dict) -> Any:
            t0 = time.monotonic()
            try:
                result = await maybe_await(fn(*args, **kwargs))
            except Exception as exc:
                self._tool_done(name, args, kwargs, None, f"{type(exc).__name__}: {exc}", time.monotonic() - t0)
                raise
            self._tool_done(name, args, kwargs, result, None, time.monotonic() - t0)
            return result
        return tool

    def _tool_done(self, name: str, args: tuple, kwargs: dict, result: Any, error: str | None,
                   seconds: float) -> None:
        if self.tools is not None:
            self.tools.append({"tool": name, "args": list(args), "kwargs": dict(kwargs), "result": result,
                               "error": error, "seconds": seconds})


async def run_episode(env: Env, sample: Sample, sampling_params: dict, engine: Any, *, calls: EnvCalls,
                      chat: ChatTurns, episode_id: str, max_turns: int | None = None, evaluation: bool = False,
                      seed: int | None = None) -> Sample:
    """Run one episode of `env` on `sample` (its response built by an Episode) and return the sample."""
    if sample.response_tokens:       # an aborted attempt of this episode: the env's state is gone, start over
        sample.reset_response()
    tok = engine.tokenizer
    ep = Episode(sample, sampling_params["max_new_tokens"], tok)
    ctx = EpisodeContext(episode_id, sample.index, evaluation, engine=engine, sampling_params=dict(sampling_params),
                         tool=calls.tool_caller(episode_id))
    limit = max_turns if max_turns is not None else env.max_turns
    rewards: list[float] = []
    failure: EnvError | None = None
    try:
        first = await calls.call("reset", f"{episode_id}:reset", ctx, sample, env.reset, (sample,), check_prompt)
        messages = _first_prompt(sample, first, chat, calls.where("reset", sample))
        i = 0
        while limit is None or i < limit:
            params = dict(sampling_params)
            if seed is not None:    # one seed per turn, fixed by the sample's (a rerun samples the same)
                params["sampling_seed"] = (seed + 7919 * i) & 0x7FFFFFFF
            grown = len(ep.response)
            out = await ep.generate(engine, params)
            if out is None or ep.status == ABORTED:
                break
            ids = list(out["output_ids"])
            text = decode_text(tok, ids)
            if messages is not None:
                messages = messages + [{"role": "assistant", "content": text}]
            turn = ModelTurn(i, text, ids, out["finish_reason"], ep.versions[-1],
                             None if limit is None else limit - i - 1, ep.tokens_left, messages)
            step = await calls.call("step", f"{episode_id}:step:{i}", ctx, sample, env.step, (sample, turn),
                                    check_step)
            i += 1
            if step["reward"] is not None:
                rewards.append(step["reward"])
            if step["metadata"]:
                sample.metadata = {**sample.metadata, **step["metadata"]}
            if step["done"] or turn.last:
                break
            obs = step["observation"]
            if isinstance(obs, str):
                obs_ids = chat.encode(obs)
            elif obs is not None:
                try:
                    obs_ids = chat.continuation(ep.response, obs)
                except ChatTemplateError as exc:
                    raise EnvError(f"{calls.where('step', sample, str(i - 1))}: its observation: {exc}") from None
                messages = None if messages is None else messages + obs
            else:
                obs_ids = []
            if not ep.add_observation(obs_ids) or len(ep.response) == grown:
                break   # cut at the budget; or the turn added nothing at all (no end otherwise)
    except EnvError as exc:
        failure = exc
    finally:
        try:
            await calls.call("close", f"{episode_id}:close", ctx, sample, env.close, (sample,))
        except EnvError as exc:
            if failure is None:
                failure = exc
            else:
                log.warning("environment close failed after an earlier error", error=str(exc))
    if rewards:
        sample.reward = float(sum(rewards))
    if failure is not None:
        ep.finish(FAILED, error=str(failure))
        raise failure
    return ep.finish()


def _first_prompt(sample: Sample, first: Any, chat: ChatTurns, where: str) -> list[dict] | None:
    """Set the sample's prompt (and its tokens) from reset's answer; the conversation so far when it is a chat."""
    try:
        if first is None:
            if sample.prompt_tokens:
                return [dict(m) for m in sample.prompt] if isinstance(sample.prompt, list) else None
            first = sample.prompt
        if isinstance(first, str):
            sample.prompt, sample.prompt_tokens = first, chat.encode(first)
            return None
        tools = sample.metadata.get("tools") if isinstance(sample.metadata, dict) else None
        _, sample.prompt_tokens = chat.prompt_ids(first, tools)
        sample.prompt = first
        return [dict(m) for m in first]
    except ChatTemplateError as exc:
        raise EnvError(f"{where}: its prompt: {exc}") from None
