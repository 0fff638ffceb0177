"""How a rollout worker generates its samples: the built-in single-turn path, an environment's episodes, the user's
generate functions (this project's and slime's) and group functions. The per-sample bookkeeping is
`slime_actors.environments.Episode`'s in every case (slime's functions fill the sample in themselves: `settle`
completes and checks it).

What the user names (`args`: the job's flags as slime passes them, a read-only flat view -- config.FlatArgs):
  --rollout-interaction-env-path pkg.mod:Class  an environment (slime_actors.environments.Env): multi-turn episodes,
      reset -> model turn -> step -> observation ..., every call recorded in the trace (docs/adding-an-environment.md)
  --custom-generate-function-path pkg.mod.fn   async fn(args, sample, sampling_params[, evaluation]) -> Sample
      slime's signature: the function POSTs SGLang's /generate body to http://{args.sglang_router_ip}:
      {args.sglang_router_port}/generate itself. That address is a proxy of this worker
      (backends/generate_proxy.py) forwarding to its engine with the job's key, recorded in the trace; with a
      retriever (--retriever-corpus / --retriever-url) `args.retriever_url` is likewise this worker's loopback
      /retrieve proxy (actors/rollout_retrieval.py; functions of the other style and environments call
      engine.retrieve). The sample
      takes slime's writes (`sample.tokens = ...`, `sample.response_length = n`, `Sample.Status.COMPLETED`); a
      loss mask left empty becomes all ones, and the weight version is the engine's when the call began.
  --custom-generate-function-path pkg.mod.fn   @engine_generate async fn(args, sample, sampling_params, engine)
      this project's: `engine` is an EngineHandle (generate(), tokenizer, episode(sample, sampling_params) -> an
      Episode that does the bookkeeping). Marked with @engine_generate (or, as before the mark existed, told apart
      by its 4th parameter).
  --rollout-function-path pkg.mod.fn           async fn(args, samples, sampling_params, engine) -> list[Sample]
      called per group instead (e.g. generation that needs the whole group).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import itertools
import json
import time
from typing import TYPE_CHECKING, Any, Callable

import msgpack

from ..environments.base import EnvError, maybe_await
from ..environments.chat import ChatTurns
from ..environments.episode import Episode, check_aligned, settle
from ..environments.runner import EnvCalls, no_answer, run_episode
from ..episode_samples import EPISODE_KEY
from ..plugins import PluginError, load_function, positional_arity, takes_keyword
from ..types import ABORTED, COMPLETED, FAILED, TRUNCATED, Sample
from .recorded_engine import request_key

if TYPE_CHECKING:
    from ..backends.generate_proxy import GenerateProxy
    from ..config import FlatArgs
    from ..environments.base import Env
    from .rollout import RolloutWorker
    from .rollout_agents import AgentProxy
    from .rollout_frozen import FrozenEngine

FLAG = "--custom-generate-function-path"


class EngineHandle:
    """What this project's generate and group functions get: the engine, the tokenizer, the bookkeeping."""

    def __init__(self, generation: "Generation"):
        self._g = generation

    @property
    def tokenizer(self) -> Any:
        return self._g.w.tokenizer

    @property
    def weight_version(self) -> int:
        return self._g.w.weight_version

    async def generate(self, input_ids: list[int], sampling_params: dict) -> dict:
        """One /generate call with log-probs. Returns {output_ids, logprobs, finish_reason, weight_version};
        finish_reason is SGLang's finish_reason.type: "stop", "length" or "abort" (the engine was paused / aborted)."""
        return await self._g.raw(input_ids, sampling_params)

    async def generate_many(self, input_ids: list[list[int]], sampling_params: list[dict]) -> list[dict]:
        """Several prompts in one /generate call (SGLang's batched form): one answer, as `generate` gives it, per
        prompt, in order. Each request is scheduled by the engine as if sent alone; the call returns when the last
        has finished. One HTTP request instead of many: what the built-in path does for a group's samples."""
        if len(input_ids) != len(sampling_params):
            raise ValueError(f"generate_many: {len(input_ids)} prompts but {len(sampling_params)} sampling params")
        return await self._g.raw_many(input_ids, sampling_params)

    @property
    def frozen(self) -> Any:
        """The worker's second engine (--frozen-engine-checkpoint), never updated: `await engine.frozen.generate(
        input_ids, sampling_params)` for a role a fixed model plays (actors/rollout_frozen.py)."""
        if self._g.frozen is None:
            raise RuntimeError("this job has no frozen engine: give --frozen-engine-checkpoint")
        return self._g.frozen

    async def retrieve(self, queries: list[str], topk: int | None = None, return_scores: bool = True) -> dict:
        """Search-R1's {"result": [...]} from the job's retriever (--retriever-corpus or --retriever-url), recorded
        (actors/rollout_retrieval.py); RetrieverError when it refuses or no replica answers."""
        if self._g.w.retriever is None:
            raise RuntimeError("this job has no retriever: give --retriever-corpus (or --retriever-url)")
        return await self._g.w.retriever.retrieve(queries, topk, return_scores)

    def episode(self, sample: Sample, sampling_params: dict) -> Episode:
        """The bookkeeping of `sample`'s response: `await ep.generate(engine, sampling_params)`, `ep.add_observation
        (ids)`, ..., `return ep.finish()` (environments/episode.py)."""
        return Episode(sample, sampling_params["max_new_tokens"], self.tokenizer)

    async def score(self, samples: list[Sample]) -> list[float]:
        """The job's reward (--rm-type, --custom-rm-path, a reward actor) of each sample's response, asked of a
        reward worker now -- for an episode that shapes its agents' rewards from an outcome (docs/multi-agent.md).
        RuntimeError naming the sample when one cannot be scored."""
        w = self._g.w
        res = await w._ask_reward(f"reward/{w.index % max(1, w.cfg.reward.num_reward_workers)}", list(samples))
        out = []
        for s, r, e in zip(samples, res.rewards, res.errors):
            if e is not None or r is None:
                raise RuntimeError(f"sample {s.index}: the reward function failed: {e or 'no reward'}")
            out.append(float(r))
        return out


def generate_style(fn, path: str) -> str:
    """"engine" for this project's generate(args, sample, sampling_params, engine) -- marked @engine_generate, or
    with a 4th parameter that is not slime's `evaluation` --, "slime" for slime's generate(args, sample,
    sampling_params[, evaluation]); PluginError naming the path otherwise."""
    mark = getattr(fn, "__slime_actors_generate__", None)   # @engine_generate
    if mark in ("engine", "slime"):
        return mark
    required, most = positional_arity(fn)
    try:
        names = [p.name for p in inspect.signature(fn).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        names = []
    if most is None or (most >= 4 and required <= 4 and names[3:4] != ["evaluation"]):
        return "engine"
    if required <= 3 <= most:
        return "slime"
    raise PluginError(f"{FLAG} {path}: expected async generate(args, sample, sampling_params) (slime's) or "
                      "generate(args, sample, sampling_params, engine), got "
                      f"{required} required of {most} positional parameters", kind="not_callable", path=path)


class Generation:
    """The generate -> sample part of a rollout worker `w` (its engine: `w.client`, its supervisor's)."""

    def __init__(self, worker: "RolloutWorker"):
        self.w = worker
        self.cfg = worker.cfg
        self.generate_fn: Callable[..., Any] | None = None
        self.slime_generate = False       # generate_fn has slime's signature (args, sample, sampling_params)
        self.slime_args: FlatArgs | None = None  # the flat view it gets: the router address is self.proxy's
        self.proxy: GenerateProxy | None = None  # for slime-style generate functions
        self.group_fn: Callable[..., Any] | None = None
        self.env: Env | None = None       # the environment (--rollout-interaction-env-path)
        self.env_calls: RecordedEnvCalls | None = None
        self.chat: ChatTurns | None = None
        self.frozen: FrozenEngine | None = None  # FrozenEngine (actors/rollout_frozen.py) with --frozen-engine-checkpoint
        self.agent_fn: Callable[..., Any] | None = None  # --agent-function-path: an agent written against a chat API
        self.agents: AgentProxy | None = None  # its endpoint, AgentProxy (actors/rollout_agents.py)
        self.handle = EngineHandle(self)

    # ------------------------------------------------------------------------------------------ lifecycle
    def load(self) -> None:
        """The user's functions and environment (PluginError naming the flag when one cannot be loaded)."""
        rollout_cfg, w = self.cfg.rollout, self.w
        if rollout_cfg.custom_generate_function_path:
            self.generate_fn = load_function(rollout_cfg.custom_generate_function_path, flag=FLAG)
            self.slime_generate = generate_style(self.generate_fn, rollout_cfg.custom_generate_function_path) == "slime"
        if rollout_cfg.rollout_function_path:
            self.group_fn = load_function(rollout_cfg.rollout_function_path)
        if rollout_cfg.agent_function_path:
            self.agent_fn = load_function(rollout_cfg.agent_function_path, flag="--agent-function-path")
        if rollout_cfg.rollout_interaction_env_path:
            from ..environments.loading import load_env
            self.env = load_env(rollout_cfg.rollout_interaction_env_path, w.plugin_args,
                                json.loads(rollout_cfg.env_kwargs or "{}"))
            self.env_calls = RecordedEnvCalls(w, self.env, rollout_cfg.env_timeout)
        from ..data import chat_template_kwargs
        self.chat = ChatTurns(w.tokenizer, chat_template_kwargs(self.cfg.data))

    async def start(self) -> None:
        """Once the engine serves: slime's functions get their proxy, the job's retriever its link (and a proxy for
        slime's functions), the environment its setup()."""
        w = self.w
        if self.slime_generate:
            await self._start_proxy()
        if self.cfg.retriever.enabled:
            from .rollout_retrieval import RetrieverLink
            w.retriever = link = RetrieverLink(w)
            if self.slime_generate:   # one URL for the function: args.retriever_url is this worker's proxy
                await link.start_proxy()
        if self.agent_fn is not None:
            from .rollout_agents import AgentProxy
            self.agents = AgentProxy(w)
            # (recorded, as the other proxies' starts: a replay starts none -- the episodes are recorded whole)
            url = await w.recorded_async("agents.proxy.start", self.agents.start)
            w.log.info("agents' chat endpoint (OpenAI and Anthropic APIs)", url=url,
                       agent=self.cfg.rollout.agent_function_path)
        if self.cfg.engine.frozen_engine_checkpoint:
            from .rollout_frozen import FrozenEngine
            self.frozen = FrozenEngine(w)
            await self.frozen.start()
        if self.env is not None:
            await self._env_lifecycle("setup", self.env.setup)
            self.w.log.info("environment set up", env=self.cfg.rollout.rollout_interaction_env_path)

    async def stop(self) -> None:
        if self.proxy is not None:
            await self.w.recorded_async("proxy.stop", self.proxy.stop)  # (as its start: not in a replay)
        if self.env is not None:
            try:
                await self._env_lifecycle("teardown", self.env.teardown)
            except EnvError as exc:
                self.w.log.error("environment teardown failed", error=str(exc))
        if self.w.retriever is not None:
            await self.w.retriever.stop()
        if self.frozen is not None:
            await self.frozen.stop()
        if self.agents is not None:
            await self.w.recorded_async("agents.proxy.stop", self.agents.stop)

    async def _env_lifecycle(self, what: str, fn: Callable) -> None:
        """The environment's setup / teardown, recorded: a replay serves the outcome instead of running it."""
        assert self.env_calls is not None  # (made with the environment)
        await self.w.recorded_async(f"env.{what}", self.env_calls.run, what, "", None, None, fn, ())

    async def _start_proxy(self) -> None:
        """slime-style generate functions reach the engine at args.sglang_router_ip/_port: this worker's proxy."""
        import dataclasses

        from ..backends.generate_proxy import GenerateProxy
        w = self.w

        async def forward(body: dict):
            await w._engine_ok.wait()
            return await w.engine_client.generate_body(body)
        self.proxy = proxy = GenerateProxy(forward)
        # (recorded: a replay starts no proxy -- the function's results are recorded, _slime_style)
        host, port = await w.recorded_async("proxy.start", proxy.start)
        engine = dataclasses.replace(self.cfg.engine, sglang_router_ip=host, sglang_router_port=port)
        self.slime_args = dataclasses.replace(self.cfg, engine=engine).flat()
        w.log.info("slime-style generate function: its engine address is this worker's proxy",
                   url=f"http://{host}:{port}", function=self.cfg.rollout.custom_generate_function_path)

    # ------------------------------------------------------------------------------------------ the engine
    async def raw(self, input_ids: list[int], sampling_params: dict) -> dict:
        """The one place the engine is asked to generate. Its answer is the nondeterministic input here: recorded
        in the trace, served back on replay."""
        await self.w._engine_ok.wait()
        return await self.w.recorded_async("engine.generate", self._live, input_ids, sampling_params,
                                           key=request_key(input_ids, sampling_params))

    async def raw_many(self, input_ids: list[list[int]], sampling_params: list[dict]) -> list[dict]:
        """`raw` for several prompts in one batched /generate: each answer recorded under its own request's key, as
        if each had been asked alone (a replay, and the trace tools, see the same inputs either way)."""
        await self.w._engine_ok.wait()
        keys = [request_key(ids, sp) for ids, sp in zip(input_ids, sampling_params)]
        return await self.w.recorded_many_async("engine.generate", self._live_many, input_ids, sampling_params,
                                                keys=keys)

    async def _live(self, input_ids: list[int], sampling_params: dict) -> dict:
        t0 = time.time()
        resp = await self.w.engine_client.generate(input_ids, sampling_params, return_logprob=True)
        return _answer(resp, t0)

    async def _live_many(self, input_ids: list[list[int]], sampling_params: list[dict]) -> list[dict]:
        t0 = time.time()
        resp = await self.w.engine_client.generate(input_ids, sampling_params, return_logprob=True)
        if not isinstance(resp, list) or len(resp) != len(input_ids):
            got = f"a list of {len(resp)}" if isinstance(resp, list) else type(resp).__name__
            raise RuntimeError(f"the engine's batched /generate answer is {got}, expected a list of "
                               f"{len(input_ids)} answers")
        return [_answer(r, t0) for r in resp]

    def seed(self, sample: Sample, attempt: int) -> int:
        h = hashlib.blake2b(f"{self.cfg.data.rollout_seed}:{sample.index}:{attempt}".encode(), digest_size=4)
        return int.from_bytes(h.digest(), "little") & 0x7FFFFFFF

    # ------------------------------------------------------------------------------------------ generating
    async def group(self, samples: list[Sample], sp: dict, attempt: int, kind: str, work_id: str) -> list[Sample]:
        """The group's samples, generated: its own, then those its episodes added (episode_samples.py)."""
        if self.group_fn is not None:
            out = await self.group_fn(self.w.plugin_args, samples, sp, self.handle)
        elif self.env is None and self.agent_fn is None and self.generate_fn is None and len(samples) > 1:
            out = await self._built_in_group(samples, sp, attempt)
        else:
            made = await asyncio.gather(*(self.sample(s, sp, attempt, kind == "eval", work_id) for s in samples))
            episodes = [episode_result(s, m, self._made_by()) for s, m in zip(samples, made)]
            out = [e[0] for e in episodes] + [x for e in episodes for x in e[1:]]
        for s in out:   # what a user's function made must line up too: else the sample fails, saying why
            if s.status not in (ABORTED, FAILED):
                try:
                    check_aligned(s)
                except ValueError as exc:
                    s.status, s.error = FAILED, f"{self._made_by()}: {exc}"
                    self.w.log.error("a sample does not line up; it fails", error=s.error, work_id=work_id)
        return list(out)

    async def _built_in_group(self, samples: list[Sample], sp: dict, attempt: int) -> list[Sample]:
        """The built-in single-turn path for a whole group: what `sample` does for each, with the group's requests in
        one batched /generate -- one HTTP request for the engine to parse and the worker to send instead of one per
        sample (on one H100 the requests of a rollout's 128 went out over 30 ms, one after another)."""
        episodes = [Episode(s, sp["max_new_tokens"], self.w.tokenizer, count_turns=False) for s in samples]
        todo = [ep for ep in episodes if ep.tokens_left > 0]
        if todo:
            before = int(self.handle.weight_version)
            answers = await self.raw_many([ep.context for ep in todo],
                                          [dict(sp, sampling_seed=self.seed(ep.sample, attempt),
                                                max_new_tokens=ep.tokens_left) for ep in todo])
            for ep, answer in zip(todo, answers):
                ep.add_answer(answer, before)
        out = []
        for ep in episodes:
            if ep.turns:
                out.append(ep.finish())
            else:   # nothing left of its budget (a partial response already at the limit)
                ep.sample.status = TRUNCATED
                out.append(ep.sample)
        return out

    def _made_by(self) -> str:
        rollout_cfg = self.cfg.rollout
        return (f"--rollout-function-path {rollout_cfg.rollout_function_path}" if self.group_fn is not None else
                f"{FLAG} {rollout_cfg.custom_generate_function_path}" if self.generate_fn is not None else "generation")

    async def sample(self, sample: Sample, sp: dict, attempt: int, evaluation: bool = False,
                     work_id: str = "") -> Sample | list[Sample]:
        """The episode of `sample`: the sample, or (a generate function's choice) a list of samples -- several
        agents' turns, say -- of which the first stands for `sample` (episode_result)."""
        if self.env is not None:
            return await self._episode(sample, sp, attempt, evaluation, work_id)
        if self.agent_fn is not None:
            return await self._agent_episode(sample, sp, attempt, work_id)
        if self.generate_fn is not None and self.slime_generate:
            return await self._slime_style(sample, sp, evaluation)
        if self.generate_fn is not None:
            return await self.generate_fn(self.w.plugin_args, sample, dict(sp), self.handle)
        ep = Episode(sample, sp["max_new_tokens"], self.w.tokenizer, count_turns=False)
        if ep.tokens_left == 0:
            sample.status = TRUNCATED
            return sample
        await ep.generate(self.handle, dict(sp, sampling_seed=self.seed(sample, attempt)))
        return ep.finish()

    async def _episode(self, sample: Sample, sp: dict, attempt: int, evaluation: bool, work_id: str) -> Sample:
        rollout_cfg, w = self.cfg.rollout, self.w
        assert self.env is not None and self.env_calls is not None and self.chat is not None  # (load(): an env)
        try:
            return await run_episode(self.env, sample, sp, self.handle, calls=self.env_calls, chat=self.chat,
                                     episode_id=f"{work_id}:{sample.index}:{attempt}", max_turns=rollout_cfg.max_turns,
                                     evaluation=evaluation, seed=self.seed(sample, attempt))
        except EnvError as exc:   # the sample is finished as failed, with the error
            w.counters["env_errors"] += 1
            w.log.error("environment failed", error=str(exc), sample=sample.index, work_id=work_id,
                        then="the job stops (--env-error stop)" if rollout_cfg.env_error == "stop" else
                        "the sample fails; its group is recorded as failed and replaced")
            if rollout_cfg.env_error == "stop":
                await w.job_failed(f"{w.name}: {exc}")
            return sample

    async def _agent_episode(self, sample: Sample, sp: dict, attempt: int, work_id: str) -> Sample | list[Sample]:
        """The user's agent on one episode (--agent-function-path), against this worker's chat endpoint with a key
        of the episode's own; its calls become the episode's samples -- one per branch of its conversation
        (agents/trajectory.py) --, rewarded by what the agent returned: a number is the reward; a string (or None:
        the last call's text) is the answer the job's reward grades. The agent's run is a recorded input as a whole
        (`agent.episode`): a replay serves its samples without running it. An agent that raises, times out
        (--env-timeout) or makes no call fails the sample, saying why."""
        from .rollout_agents import reward_of, run_agent
        w, rollout_cfg = self.w, self.cfg.rollout
        episode = f"{work_id}:{sample.index}:{attempt}"

        agents = self.agents
        assert agents is not None

        async def call() -> dict:
            session = agents.open(episode, sp, self.seed(sample, attempt))
            try:
                result = await run_agent(self.agent_fn, sample, str(agents.url), session.key, rollout_cfg.env_timeout)
            finally:
                agents.close(session)
            reward, answer = reward_of(result)
            made = session.trajectory.samples(sample, w.tokenizer)
            if not made:
                raise RuntimeError("the agent made no call of the chat API")
            return {"samples": [s.to_wire() for s in made], "reward": reward,
                    "answer": answer if answer is not None else session.texts[-1]}
        try:
            got = await w.recorded_async("agent.episode", call, key=episode)
        except Exception as exc:   # the sample fails with the reason; its group is recorded as failed
            w.counters["env_errors"] += 1
            sample.status, sample.error = FAILED, f"--agent-function-path {rollout_cfg.agent_function_path}: " + (
                f"did not finish within {rollout_cfg.env_timeout:g} s (--env-timeout)" if isinstance(exc, TimeoutError)
                else f"{type(exc).__name__}: {exc}")
            w.log.error("agent failed", error=sample.error, sample=sample.index, work_id=work_id)
            return sample
        samples = [Sample.from_wire(x) for x in got["samples"]]
        reward = got["reward"]
        if reward is None:   # the answer, graded by the job's reward (asked now: a replay asks it again)
            probe = Sample(index=sample.index, group_index=sample.group_index, prompt=sample.prompt,
                           label=sample.label, metadata=dict(sample.metadata), response=got["answer"],
                           status=COMPLETED)
            reward = (await self.handle.score([probe]))[0]
        for s in samples:
            s.reward = float(reward)
            s.metadata["agent_answer"] = got["answer"]
        return samples if len(samples) > 1 else samples[0]

    async def _slime_style(self, sample: Sample, sp: dict, evaluation: bool) -> Sample | list[Sample]:
        """slime's generate(args, sample, sampling_params[, evaluation]); what it leaves unset is filled in as slime
        would (`settle`)."""
        w = self.w
        version = w.weight_version
        fn = self.generate_fn
        assert fn is not None  # (load(): a slime-style function)
        kw = {"evaluation": evaluation} if takes_keyword(fn, "evaluation") else {}
        # The function reaches the engine over HTTP (this worker's proxy), which a replay cannot do: what it returns
        # is a recorded input (keyed by the request), and a replay takes that instead of calling it again.
        key = request_key(sample.prompt_tokens, {**sp, "index": sample.index, "evaluation": evaluation})
        made = []

        async def call() -> dict | list:
            res = await fn(self.slime_args, sample, dict(sp), **kw)
            many = isinstance(res, (list, tuple)) and bool(res) and all(isinstance(x, Sample) for x in res)
            if not isinstance(res, Sample) and not many:
                raise TypeError(f"{FLAG} {self.cfg.rollout.custom_generate_function_path} returned "
                                f"{type(res).__name__}, expected the Sample it was given (or a list of Samples)")
            made.append(res)
            return [x.to_wire() for x in res] if many else res.to_wire()
        wire = await w.recorded_async("generate_fn", call, key=key)
        if made:
            out = made[0]
        elif isinstance(wire, list):   # replay: the samples the function returned
            out = [Sample.from_wire(x) for x in wire]
        else:  # replay: the sample as the function left it
            out = sample
            for name, value in Sample.from_wire(wire).__dict__.items():
                setattr(out, name, value)
        if isinstance(out, (list, tuple)):
            return [settle(x, w.tokenizer, version, "custom generate function") for x in out]
        return settle(out, w.tokenizer, version, "custom generate function")


def _answer(resp: Any, started: float) -> dict:
    """One /generate answer as the worker keeps it; `started`: when the request went out (the trace stamps the
    answer's arrival), for the time inside generation."""
    from ..backends.engine_client import parse_generate_output
    out = parse_generate_output(resp)
    if out.logprobs is None:
        raise RuntimeError("the engine's /generate answer has no output_token_logprobs (asked for them)")
    return {"output_ids": list(out.output_ids), "logprobs": list(out.logprobs),
            "finish_reason": out.finish_type, "weight_version": out.weight_version, "started": started}


def episode_result(origin: Sample, made: Any, who: str) -> list[Sample]:
    """An episode's samples (episode_samples.py): the first stands for `origin` -- its index, group and rollout --,
    the others are added to the group (`metadata["episode_of"]` = origin's index; the buffer numbers them).
    TypeError naming `who` for anything else than a Sample or a non-empty list of distinct Samples."""
    if isinstance(made, Sample):
        return [made]
    if not isinstance(made, (list, tuple)) or not made or not all(isinstance(x, Sample) for x in made) \
            or len({id(x) for x in made}) != len(made):
        raise TypeError(f"{who}: returned {type(made).__name__}; expected a Sample, or a non-empty list of distinct "
                        "Samples (the episode's, the first standing for the sample it was given)")
    first, rest = made[0], list(made[1:])
    first.index, first.group_index, first.rollout_id = origin.index, origin.group_index, origin.rollout_id
    first.metadata = {k: v for k, v in first.metadata.items() if k != EPISODE_KEY}
    for x in rest:
        x.index, x.group_index, x.rollout_id = -1, origin.group_index, origin.rollout_id
        x.metadata = {**x.metadata, EPISODE_KEY: origin.index}
    return [first, *rest]


class RecordedEnvCalls(EnvCalls):
    """A rollout worker's environment calls: each one's answer (or error) is a recorded input of the worker's
    trace, `env.<call>` keyed by episode and turn, and a replay serves it instead of calling the environment; each
    tool call is recorded too (`env.tool`: name, arguments, result or error, seconds; for reading, not replayed)."""

    def __init__(self, worker: "RolloutWorker", env: Any, timeout: float | None):
        super().__init__(env, timeout)
        self.worker = worker

    async def call(self, what: str, key: str, ctx, sample: Sample, fn: Callable, args: tuple,
                   check: Callable[[Any, str], Any] = no_answer) -> Any:
        answer = await self.worker.recorded_async(f"env.{what}", self.run, what, key, ctx, sample, fn, args, check,
                                                  key=key)
        sample.metadata = answer["metadata"]
        return answer["value"]

    def tool_caller(self, key: str) -> Callable:
        count = itertools.count()

        async def tool(name: str, fn: Callable, args: tuple, kwargs: dict) -> Any:
            call = {"tool": name, "args": _plain(list(args)), "kwargs": _plain(kwargs)}
            at, t0 = f"{key}:{next(count)}", time.monotonic()
            try:
                result = await maybe_await(fn(*args, **kwargs))
            except Exception as exc:
                self.worker.record_input("env.tool", {**call, "error": f"{type(exc).__name__}: {exc}"[:2000],
                                                      "seconds": time.monotonic() - t0}, key=at)
                raise
            self.worker.record_input("env.tool", {**call, "result": _plain(result),
                                                  "seconds": time.monotonic() - t0}, key=at)
            return result
        return tool


def _plain(v: Any) -> Any:
    """`v` when it can be recorded as it is, else its repr (cut at 2000 characters)."""
    try:
        msgpack.packb(v, use_bin_type=True)
        return v
    except (TypeError, ValueError, OverflowError):
        return repr(v)[:2000]
