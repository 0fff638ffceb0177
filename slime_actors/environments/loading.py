"""The environment a job names (--rollout-interaction-env-path), built for a rollout worker.

    env = load_env("examples/tool_use/env.py:DigitSum", args, {"modulus": 10})

The path names an `Env` subclass ("pkg.mod:Class", "pkg.mod.Class" or "file.py:Class"), constructed as
`Class(args, **env_kwargs)`; or, as slime's multi-turn examples have it (examples/geo3k_vlm_multi_turn: the same
flag name, in slime's --custom-config-path file), a module -- "pkg.env_mod" or "path/env_mod.py" -- with
`build_env(sample=..., args=...)`, whose environment objects have `reset()`, `step(response_text) -> (observation,
done, info)`, `close()` and a `format_observation(observation) -> chat message` (theirs or the module's); such a
module runs unchanged behind this API (`SlimeEnv`), with --max-turns as its `args.max_turns`.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from ..plugins import PluginError, load_function
from .base import Env, Step

FLAG = "--rollout-interaction-env-path"


def load_env(path: str, args: Any = None, kwargs: dict | None = None) -> Env:
    """The environment `path` names, constructed (PluginError naming the flag when it cannot be)."""
    kwargs = dict(kwargs or {})
    if ":" not in path and (path.endswith(".py") or _is_module(path)):
        build = load_function(f"{path}:build_env", flag=FLAG)
        return SlimeEnv(build, args, **kwargs)
    obj = load_function(path, flag=FLAG)
    if isinstance(obj, type) and issubclass(obj, Env):
        try:
            return obj(args, **kwargs)
        except TypeError as exc:
            raise PluginError(f"{FLAG} {path}: {obj.__name__}(args, **env_kwargs) failed: {exc} (env_kwargs: "
                              f"{sorted(kwargs)})", kind="not_callable", path=path) from None
    if getattr(obj, "__name__", "") == "build_env":
        return SlimeEnv(obj, args, **kwargs)
    what = "a class that is not a slime_actors.environments.Env" if isinstance(obj, type) else "not a class"
    raise PluginError(f"{FLAG} {path}: {what}; name a subclass of slime_actors.environments.Env (or a module with "
                      "slime's build_env)", kind="not_callable", path=path)


def _is_module(path: str) -> bool:
    if not all(p.isidentifier() for p in path.split(".")):
        return False
    try:
        importlib.import_module(path)
    except ImportError:
        return False
    return True


class SlimeEnv(Env):
    """A module of slime's interaction environments behind this API: one object of `build_env` per episode."""

    def __init__(self, build_env, args: Any = None, **kwargs: Any):
        super().__init__(args, **kwargs)
        self.build = build_env
        self.module = inspect.getmodule(build_env)

    async def reset(self, sample) -> None:
        try:
            env = self.build(sample=sample, args=self.args, **self.kwargs)
        except TypeError:
            env = self.build(sample, self.args)
        self.episode.state["env"] = env
        env.reset()      # its observation is not used: the prompt is the sample's (as in slime's rollout)
        return None

    async def step(self, sample, turn) -> Step:
        env = self.episode.state["env"]
        observation, done, _info = env.step(turn.text)
        if done:
            return Step(done=True)
        fmt = getattr(env, "format_observation", None) or getattr(self.module, "format_observation", None)
        message = fmt(observation) if fmt is not None else {"role": "tool", "content": str(observation)}
        return Step([message])

    async def close(self, sample) -> None:
        env = self.episode.state.pop("env", None)
        if env is not None and hasattr(env, "close"):
            env.close()
