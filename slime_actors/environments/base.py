"""The environment API: a multi-turn task as a class of a few lines (docs/adding-an-environment.md).

    from slime_actors.environments import Env, Step

    class Calculator(Env):
        max_turns = 3                                   # or --max-turns

        async def step(self, sample, turn):             # the model ended a turn: what does the world answer?
            if "call tool" in turn.text:
                return Step(f"result : {digit_sum(sample.prompt)}")     # text, or chat messages
            return Step(done=True)                      # (a reward=... here skips the reward function)

The framework (slime_actors/environments/runner.py) owns the rest: the prompt's tokens, the model's tokens with
their log-probs (loss mask 1), the observation's tokens (loss mask 0), the token budget, aborts, weight versions and
the number of turns. One instance serves every episode of a rollout worker, many at once: per-episode state goes in
`self.episode.state` (a dict of the running episode) or, when it should reach the trainer's logs, in
`sample.metadata`.

Calls, in order: `setup()` once per worker before its first episode, then per episode `reset(sample)`, `step(sample,
turn)` after each model turn, `close(sample)` at the end (done, turn or token limit, abort, error), and
`teardown()` when the worker stops. Methods may be coroutines or plain functions (a plain one runs on the worker's
event loop: keep it quick). Everything they return is recorded in the worker's trace, so a replay of the worker
serves their answers without running them (`slime-actors replay`); tool calls made through `self.call_tool` are
recorded too.
"""

from __future__ import annotations

import contextvars
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

Observation = Any  # str | dict (one chat message) | list[dict] (chat messages) | None


class EnvError(RuntimeError):
    """An environment call failed (raised, timed out, or returned something that is not its API's); the message names
    the environment class, the call and the sample."""


@dataclass
class Step:
    """What `Env.step` returns.

    observation: what the model sees next -- text (its tokens are appended as they are), a chat message
        {"role": ..., "content": ...} or a list of them (rendered with the tokenizer's chat template as the turn that
        follows the model's, without re-rendering earlier turns), or None (the model continues at once);
    done: the episode is over (the observation, if any, is not appended);
    reward: a number: the sample's reward is the sum of the rewards its steps gave, and no reward function is called
        for it (leave it None to have --rm-type / --custom-rm-path score the finished response);
    metadata: merged into `sample.metadata` (JSON-like values: it is traced and stored).
    """
    observation: Observation = None
    done: bool = False
    reward: float | None = None
    metadata: dict | None = None


@dataclass
class ModelTurn:
    """One turn of the model, as `Env.step` sees it."""
    index: int                     # 0 for the first turn of the episode
    text: str                      # the turn decoded (special tokens left out)
    token_ids: list[int]           # the tokens the model produced (never re-tokenized)
    finish_reason: str             # "stop" or "length" (the token budget ran out mid-turn: the episode ends)
    weight_version: int            # the weights that produced it
    turns_left: int | None         # model turns still allowed after this one (None: no limit but the token budget)
    tokens_left: int               # response tokens still allowed after this one
    messages: list[dict] | None = None  # chat episodes: the conversation so far, this turn last (role assistant)

    @property
    def last(self) -> bool:
        """No turn can follow this one (turn limit, token budget, or cut at the budget): an observation is not
        appended whatever `step` returns."""
        return self.finish_reason == "length" or self.tokens_left <= 0 or self.turns_left == 0


@dataclass
class EpisodeContext:
    """The running episode, as `Env.episode` gives it inside reset / step / close and tool calls."""
    id: str                        # unique per episode in the run (work id, sample index, attempt)
    sample_index: int
    evaluation: bool               # an evaluation episode (no training)
    state: dict = field(default_factory=dict)   # the env's own per-episode state (not traced, not stored)
    engine: Any = None             # the worker's engine handle (generate(input_ids, sampling_params) -> dict)
    sampling_params: dict = field(default_factory=dict)
    tool: Callable[..., Awaitable[Any]] | None = None   # how tool calls are made (recorded by the worker)


# the running episode of the current task (set by the runner around each environment call)
CURRENT_EPISODE: contextvars.ContextVar[EpisodeContext | None] = contextvars.ContextVar("slime_actors_episode",
                                                                                        default=None)


class Env:
    """Base class of an environment. `__init__(args, **kwargs)`: `args` is the job's flags (slime's flat view,
    `args.max_turns`, ...), `kwargs` the --env-kwargs table. Keep the constructor cheap (it also runs in a replay);
    open clients, pools and sandboxes in `setup()`."""

    max_turns: int | None = None   # model turns per episode when --max-turns is not given (None: the budget only)

    def __init__(self, args: Any = None, **kwargs: Any):
        self.args = args
        self.kwargs = kwargs

    async def setup(self) -> None:
        """Once per rollout worker, before its first episode."""

    async def teardown(self) -> None:
        """Once per rollout worker, when it stops."""

    async def reset(self, sample) -> str | list[dict] | None:
        """The episode's first prompt: None (the sample's prompt as the data prepared it), text (tokenized as it
        is), or chat messages (rendered with the chat template, generation prompt added; the sample's tools too).
        The sample's `prompt` becomes what is returned."""
        return None

    async def step(self, sample, turn: ModelTurn) -> Step:
        """The model ended a turn: the observation, and whether the episode is done."""
        raise NotImplementedError(f"{type(self).__name__} must define step(sample, turn)")

    async def close(self, sample) -> None:
        """The episode ended (whatever the reason): release what it held."""

    @property
    def episode(self) -> EpisodeContext:
        """The running episode (inside reset / step / close)."""
        ctx = CURRENT_EPISODE.get()
        if ctx is None:
            raise RuntimeError(f"{type(self).__name__}.episode is only known inside reset, step and close")
        return ctx

    async def call_tool(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` (awaited when it is a coroutine), recorded in the worker's trace as one tool call
        (name, arguments, result or error, seconds)."""
        ctx = CURRENT_EPISODE.get()
        if ctx is None or ctx.tool is None:
            return await maybe_await(fn(*args, **kwargs))
        return await ctx.tool(name, fn, args, kwargs)


def engine_generate(fn: Callable) -> Callable:
    """Mark a --custom-generate-function-path function as this project's `generate(args, sample, sampling_params,
    engine)` (not slime's 3-argument form): `engine.episode(sample, sampling_params)` gives it the bookkeeping."""
    fn.__slime_actors_generate__ = "engine"
    return fn


async def maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


# ------------------------------------------------------------------------------------------------ normalizing
def is_message(m: Any) -> bool:
    return isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m


def check_prompt(value: Any, where: str) -> str | list[dict] | None:
    """reset's answer: None, a non-empty string or a non-empty list of chat messages."""
    if value is None or (isinstance(value, str) and value):
        return value
    if isinstance(value, (list, tuple)) and value and all(is_message(m) for m in value):
        return [dict(m) for m in value]
    raise EnvError(f"{where} returned {_show(value)}; expected None, a non-empty string or a list of chat messages "
                   "({'role': ..., 'content': ...})")


def check_step(value: Any, where: str) -> dict:
    """step's answer as plain data: {observation, done, reward, metadata}."""
    if not isinstance(value, Step):
        raise EnvError(f"{where} returned {_show(value)}; expected a Step(observation, done=..., reward=..., "
                       "metadata=...)")
    obs = value.observation
    if is_message(obs):
        obs = [dict(obs)]
    elif isinstance(obs, (list, tuple)):
        if not all(is_message(m) for m in obs):
            raise EnvError(f"{where}: the observation is a list but not of chat messages ({_show(obs)})")
        obs = [dict(m) for m in obs]
    elif obs is not None and not isinstance(obs, str):
        raise EnvError(f"{where}: the observation must be text, a chat message, a list of them or None; got "
                       f"{_show(obs)}")
    reward = value.reward
    if reward is not None:
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(float(reward)):
            raise EnvError(f"{where}: reward must be a finite number or None, got {_show(reward)}")
        reward = float(reward)
    meta = value.metadata
    if meta is not None and not isinstance(meta, dict):
        raise EnvError(f"{where}: metadata must be a dict or None, got {_show(meta)}")
    return {"observation": obs, "done": bool(value.done), "reward": reward, "metadata": meta}


def _show(v: Any) -> str:
    text = repr(v)
    return f"{type(v).__name__} {text[:120]}{'...' if len(text) > 120 else ''}"
