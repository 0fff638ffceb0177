"""Drive an environment without a cluster: in a notebook, a script or a test.

    from slime_actors.environments.harness import EnvHarness, ScriptedModel, LocalModel

    h = EnvHarness("examples/tool_use/env.py:DigitSum", "tiny:digits", max_turns=3, max_response_len=16)
    ep = await h.run("3 4 5 first =", ScriptedModel(h.tokenizer, ["call tool", "2"]))   # the turns you script
    print(ep.show())                        # the prompt, then each stretch of the response: [model] or [env]
    ep.sample.loss_mask, ep.sample.response, ep.tools                                     # what a trainer gets

    model = LocalModel("tiny:digits")       # or the model itself, in this process (the local engine's scheduler)
    ep = await h.run("3 4 5 first =", model, label="3")

The episode runs through the same code as in a rollout worker (runner.py, episode.py, chat.py): same tokens, same
masks, same errors; what the worker adds is only the recording of each call in its trace. `run_sync` runs one
episode from plain Python (outside an event loop). `setup()` runs before the first episode, `teardown()` on
`await h.close()` (or `async with EnvHarness(...) as h`).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

from ..types import Sample
from .base import Env, maybe_await
from .chat import ChatTurns
from .loading import load_env
from .runner import EnvCalls, run_episode


def load_tokenizer(spec: Any):
    """A tokenizer object as it is, or a checkpoint (directory, tiny:NAME, smollm2:135m)'s."""
    if not isinstance(spec, (str, os.PathLike)):
        return spec
    from ..tokenizer import load_tokenizer as load_dir_tokenizer
    return load_dir_tokenizer(_checkpoint(str(spec)))


def _checkpoint(spec: str) -> str:
    if os.path.isdir(spec):
        return spec
    from ..models.resolve import model_cache, resolve_checkpoint
    return resolve_checkpoint(spec, model_cache())


class ScriptedModel:
    """A model that says what it is told: `turns` in order, each text (finish "stop") or (text, finish_reason);
    its tokens are the tokenizer's encoding of the text, each with log-prob `logprob`. `calls` keeps every request
    (input_ids, sampling_params)."""

    def __init__(self, tokenizer: Any, turns: list, logprob: float = -0.5, weight_version: int = 0):
        self.tokenizer = tokenizer
        self.turns = [(t, "stop") if isinstance(t, str) else tuple(t) for t in turns]
        self.logprob = float(logprob)
        self.weight_version = weight_version
        self.calls: list[tuple[list[int], dict]] = []

    async def generate(self, input_ids: list[int], sampling_params: dict) -> dict:
        self.calls.append((list(input_ids), dict(sampling_params)))
        if not self.turns:
            raise RuntimeError(f"ScriptedModel: asked for turn {len(self.calls)}, but the script has no more")
        text, finish = self.turns.pop(0)
        ids = [int(t) for t in self.tokenizer(text, add_special_tokens=False)["input_ids"]]
        left = int(sampling_params.get("max_new_tokens", len(ids)))
        if len(ids) > left:
            ids, finish = ids[:left], "length"
        return {"output_ids": ids, "logprobs": [self.logprob] * len(ids), "finish_reason": finish,
                "weight_version": str(self.weight_version)}


class LocalModel:
    """The local engine's model and scheduler in this process (no HTTP server): `generate` as a rollout worker's
    engine answers it (sampled tokens, their log-probs, SGLang's finish reasons)."""

    def __init__(self, checkpoint: str, device: str = "cpu", seed: int = 0, dtype: str = "float32"):
        from ..backends.local_engine.cli import build_parser
        from ..backends.local_engine.scheduler import Engine
        args = build_parser().parse_args(["--model-path", _checkpoint(checkpoint), "--device", device,
                                          "--random-seed", str(seed), "--dtype", dtype, "--weight-version", "0"])
        self.engine = Engine(args)
        self.engine.start()
        self.tokenizer = self.engine.tokenizer
        self.weight_version = 0

    async def generate(self, input_ids: list[int], sampling_params: dict) -> dict:
        from ..backends.engine_client import parse_generate_output
        from ..backends.local_engine.params import parse_generate
        from ..backends.local_engine.scheduler import Req
        e = self.engine
        items, _ = parse_generate({"input_ids": list(input_ids), "sampling_params": dict(sampling_params),
                                   "return_logprob": True}, vocab_size=e.vocab_size, context_len=e.context_len,
                                  tokenize=None)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        req = Req(**vars(items[0]))
        req.on_done = lambda out: loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(out))
        e.submit([req])
        out = parse_generate_output(await fut)
        return {"output_ids": list(out.output_ids), "logprobs": list(out.logprobs),
                "finish_reason": out.finish_type, "weight_version": out.weight_version}

    def close(self) -> None:
        self.engine.stop()


@dataclass
class EpisodeResult:
    """A finished episode: the sample as a trainer would get it, and the tool calls made."""
    sample: Sample
    tools: list[dict] = field(default_factory=list)
    tokenizer: Any = None

    def segments(self) -> list[tuple[str, bool]]:
        """The response in stretches of one loss-mask value: (text, trained)."""
        s, out = self.sample, []
        start = 0
        for i in range(1, len(s.response_tokens) + 1):
            if i == len(s.response_tokens) or s.loss_mask[i] != s.loss_mask[start]:
                out.append((self.tokenizer.decode(s.response_tokens[start:i], skip_special_tokens=False),
                            bool(s.loss_mask[start])))
                start = i
        return out

    def show(self) -> str:
        s = self.sample
        lines = [f"prompt: {s.prompt!r}"]
        lines += [f"{'[model]' if trained else '[env]  '} {text!r}" for text, trained in self.segments()]
        lines.append(f"status {s.status}, {len(s.response_tokens)} tokens ({sum(s.loss_mask)} trained), turns "
                     f"{s.metadata.get('turns')}, reward {s.reward}" + (f", error: {s.error}" if s.error else ""))
        lines += [f"tool {t['tool']}{tuple(t['args'])} -> {t['error'] or repr(t['result'])}" for t in self.tools]
        return "\n".join(lines)


class EnvHarness:
    """Runs episodes of one environment (an Env, its class, or a --rollout-interaction-env-path string) with a
    tokenizer (an object, or a checkpoint: directory, tiny:NAME, smollm2:135m) and the job's episode settings."""

    def __init__(self, env: Env | type | str, tokenizer: Any, *, max_turns: int | None = None,
                 max_response_len: int = 64, sampling_params: dict | None = None, env_kwargs: dict | None = None,
                 args: Any = None, chat_template_kwargs: dict | None = None, timeout: float | None = None):
        if isinstance(env, str):
            env = load_env(env, args, env_kwargs)
        elif isinstance(env, type):
            env = env(args, **(env_kwargs or {}))
        self.env = env
        self.tokenizer = load_tokenizer(tokenizer)
        self.chat = ChatTurns(self.tokenizer, chat_template_kwargs)
        self.max_turns = max_turns
        self.sampling_params = {"temperature": 1.0, **(sampling_params or {}), "max_new_tokens": max_response_len}
        self.timeout = timeout
        self._set_up = False
        self._episodes = 0

    async def setup(self) -> None:
        if not self._set_up:
            await maybe_await(self.env.setup())
            self._set_up = True

    async def close(self) -> None:
        if self._set_up:
            await maybe_await(self.env.teardown())
            self._set_up = False

    async def __aenter__(self) -> "EnvHarness":
        await self.setup()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def run(self, prompt: str | list | Sample, model: Any, *, label: Any = None, metadata: dict | None = None,
                  evaluation: bool = False) -> EpisodeResult:
        """One episode on `prompt` (text, chat messages, or a Sample) with `model` (ScriptedModel, LocalModel, or
        anything with `tokenizer` and `async generate(input_ids, sampling_params)`)."""
        await self.setup()
        if isinstance(prompt, Sample):
            sample = prompt
        else:
            sample = Sample(index=self._episodes, group_index=self._episodes, prompt=prompt, label=label,
                            metadata=dict(metadata or {}))
        self._episodes += 1
        if getattr(model, "tokenizer", None) is None:
            model.tokenizer = self.tokenizer
        tools: list[dict] = []
        calls = EnvCalls(self.env, self.timeout, tools)
        await run_episode(self.env, sample, self.sampling_params, model, calls=calls, chat=self.chat,
                          episode_id=f"harness:{sample.index}", max_turns=self.max_turns, evaluation=evaluation)
        return EpisodeResult(sample, tools, self.tokenizer)

    def run_sync(self, prompt: str | list | Sample, model: Any, **kw: Any) -> EpisodeResult:
        """`run` from code outside an event loop (a notebook has one: there, `await h.run(...)`)."""
        return asyncio.run(self.run(prompt, model, **kw))
