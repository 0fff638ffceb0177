"""A rollout worker: one generation engine process (the local engine or SGLang) and the HTTP client that drives it.

It pulls prompt groups from the buffer (bounded by `--rollout-concurrency` samples in flight), generates
`n_samples_per_prompt` responses per prompt through the engine, has a reward worker score them, and hands the group
back. Work it cannot finish -- the rollout ended, the engine died or hung -- goes back to the buffer (with partial
responses under --partial-rollout), so nothing is lost.

The engine is supervised here: if its process exits, or (with --use-fault-tolerance) it fails `/health_generate`,
it is killed and started again, and the controller re-syncs it to the current weight version before it serves.

Custom generation (`args`: the job's flags as slime passes them, a read-only flat view -- slime_actors.config.FlatArgs):
  --custom-generate-function-path pkg.mod.fn   async fn(args, sample, sampling_params, engine) -> Sample
      called per sample; may call `await engine.generate(input_ids, sampling_params)` several times (multi-turn,
      tool use) and must fill sample.response_tokens, loss_mask (0 for tokens the model did not produce),
      rollout_log_probs, response and status. See examples/tool_use/.
  --custom-generate-function-path pkg.mod.fn   async fn(args, sample, sampling_params[, evaluation]) -> Sample
      slime's signature: the function POSTs SGLang's /generate body to http://{args.sglang_router_ip}:
      {args.sglang_router_port}/generate itself. That address is a proxy of this worker
      (backends/generate_proxy.py) forwarding to its engine with the job's key, recorded in the trace; with a
      retriever (--retriever-corpus / --retriever-url) `args.retriever_url` is likewise this worker's loopback
      /retrieve proxy (actors/rollout_retrieval.py; functions of the other style call engine.retrieve). The sample
      takes slime's writes (`sample.tokens = ...`, `sample.response_length = n`, `Sample.Status.COMPLETED`); a
      loss mask left empty becomes all ones, and the weight version is the engine's when the call began.
  --rollout-function-path pkg.mod.fn           async fn(args, samples, sampling_params, engine) -> list[Sample]
      called per group instead (e.g. generation that needs the whole group).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time

from ..config import JobConfig
from ..handles import Handle
from ..mailbox.errors import MailboxError, RemoteError
from ..messages import Scores, WorkGroup
from ..retry import RetryPolicy, retry
from ..types import ABORTED, COMPLETED, FAILED, PENDING, TRUNCATED, Sample
from .base import Actor, handler


REWARD_WAIT_S = 300.0  # how long a rollout worker keeps asking while no reward worker answers at all
# asks to the buffer, repeated while it restarts (any mailbox error, as a restart can answer with one)
RELEASE_RETRY = RetryPolicy(attempts=5, base=0.5, factor=2.0, max_delay=5.0, retry_on=(MailboxError,))
SUBMIT_RETRY = RetryPolicy(attempts=20, base=0.2, factor=2.0, max_delay=5.0, retry_on=(MailboxError,))
RETURN_RETRY = RetryPolicy(attempts=10, base=0.2, factor=2.0, max_delay=5.0, retry_on=(MailboxError,))


class EngineHandle:
    """What custom generate functions get: the engine's client, the tokenizer, and a generate() shortcut."""

    def __init__(self, worker: "RolloutWorker"):
        self._w = worker
        self.tokenizer = worker.tokenizer

    @property
    def weight_version(self) -> int:
        return self._w.weight_version

    async def generate(self, input_ids: list[int], sampling_params: dict) -> dict:
        """One /generate call with log-probs. Returns {output_ids, logprobs, finish_reason, weight_version};
        finish_reason is SGLang's finish_reason.type: "stop", "length" or "abort" (the engine was paused / aborted)."""
        return await self._w._generate_raw(input_ids, sampling_params)

    async def retrieve(self, queries: list[str], topk: int | None = None, return_scores: bool = True) -> dict:
        """Search-R1's {"result": [...]} from the job's retriever (--retriever-corpus or --retriever-url), recorded
        (actors/rollout_retrieval.py); RetrieverError when it refuses or no replica answers."""
        if self._w.retriever is None:
            raise RuntimeError("this job has no retriever: give --retriever-corpus (or --retriever-url)")
        return await self._w.retriever.retrieve(queries, topk, return_scores)


def submit_key(work_id: str, lease: int, first: Sample) -> str:
    """The idempotency key of a group's submission: a retry of the same submission (its reply lost on a cut link)
    gets the buffer's cached answer, while the same group leased again -- `lease` is the buffer's count of its
    leases, the group's `attempt` -- is a new submission. (Without the lease, a group re-issued while its first
    submission was in flight, then leased back to the same worker, found its new submission answered with the
    first one's refusal from the cache, and stayed leased to a worker that had let it go.)"""
    return f"{work_id}:{lease}:{first.index}:{first.weight_version}:{len(first.response_tokens)}"


class RolloutWorker(Actor):
    role = "rollout"

    def __init__(self, index: int = 0, **config):
        super().__init__(index, **config)
        self.cfg = JobConfig.from_dict(config["args"])
        self.plugin_args = self.cfg.flat()   # what custom generate / rollout functions get (slime's `args`)
        self.weight_version = -1          # version the engine holds; -1 until the controller says
        self.engine = None                # EngineProcess
        self.client = None                # EngineClient
        self.tokenizer = None
        self.generate_fn = None
        self.slime_generate = False       # generate_fn has slime's signature (args, sample, sampling_params)
        self.slime_args = None            # the flat view it gets: the router address is self.proxy's
        self.proxy = None                 # GenerateProxy for slime-style generate functions
        self.retriever = None             # RetrieverLink (actors/rollout_retrieval.py) when the job has a retriever
        self.group_fn = None
        self._resumed: asyncio.Event | None = None
        self._engine_ok: asyncio.Event | None = None
        self._inflight: dict[str, asyncio.Task] = {}
        self._capacity = 0                # samples generated at once (--rollout-concurrency)
        self._generating = 0              # samples being generated now (not Actor._busy: handlers running)
        self._restarting = False
        self.engine_restarts = 0
        self.engine_url = None            # the engine itself (control endpoints); generation may go via a router
        self.router = None                # EngineProcess of the sglang-router this worker started (rollout/0)
        self.router_url = None
        self._router_ready = asyncio.Event()
        self._engine_paused: str | None = None  # the /pause_generation mode the engine is paused in
        self._pause_lock = asyncio.Lock()  # pause/resume run in arrival order
        self._updating = 0                # weight updates in progress (health probes wait)
        self._direct_update_restarts = 0  # engine_restarts when a colocated (direct) weight update began
        self._engine_caps: dict = {}
        self.keys = None                  # the engines' HTTP keys (engine_auth.EngineKeys), from the environment
        self.counters.update({"groups": 0, "samples": 0, "aborted_groups": 0, "reward_retries": 0})
        self.buffer, self.controller = Handle(self, "buffer/0"), Handle(self, "controller/0")

    # ------------------------------------------------------------------------------------------ lifecycle
    async def on_start(self) -> None:
        a = self.cfg
        self._resumed = asyncio.Event()
        self._engine_ok = asyncio.Event()
        self._capacity = max(a.engine.rollout_concurrency, a.rollout.n_samples_per_prompt,
                             a.eval.n_samples_per_eval_prompt)
        from ..backends.engine_auth import EngineKeys
        self.keys = EngineKeys.from_env() or EngineKeys()  # the launcher's; none: --engine-auth false
        # importing transformers takes seconds: off the loop so heartbeats keep going, and while the engine starts
        # (its start is the longest part of this worker's)
        tokenizer = asyncio.ensure_future(self.run_blocking(_timed, "tokenizer", _load_tokenizer,
                                                            a.model.hf_checkpoint))
        try:
            await self._start_up(tokenizer)
        finally:
            if not tokenizer.done():
                tokenizer.cancel()
            elif not tokenizer.cancelled():
                tokenizer.exception()   # (retrieved: a failed start reports the engine's cause, not this one)

    async def _start_up(self, tokenizer: asyncio.Future) -> None:
        a = self.cfg
        from ..plugins import load_function
        if a.rollout.custom_generate_function_path:
            self.generate_fn = load_function(a.rollout.custom_generate_function_path,
                                             flag="--custom-generate-function-path")
            self.slime_generate = generate_style(self.generate_fn, a.rollout.custom_generate_function_path) == "slime"
        if a.rollout.rollout_function_path:
            self.group_fn = load_function(a.rollout.rollout_function_path)
        await self._start_router()
        from ..launch import timeline
        with timeline.phase("engine start"):   # (first: the buffer, asked next, may still be loading its prompts)
            await self._start_engine()
        await self._release_previous()
        self.tokenizer = await tokenizer
        if self.slime_generate:
            await self._start_proxy()
        if a.retriever.enabled:
            from .rollout_retrieval import RetrieverLink
            self.retriever = RetrieverLink(self)
            if self.slime_generate:   # one URL for the function: args.retriever_url is this worker's proxy
                await self.retriever.start_proxy()
        self.spawn(self._pull_loop(), name="pull")
        self.spawn(self._watch_engine(), name="engine-watch")

    async def on_stop(self) -> None:
        self._restarting = True  # the engine's exit from here on is expected
        for t in list(self._inflight.values()):
            t.cancel()
        await self._router_forget()
        if self.client is not None:
            await self.client.close()
        if self.engine is not None:
            await self.run_blocking(self.engine.stop)
        if self.router is not None:
            await self.run_blocking(self.router.stop)
        if self.proxy is not None:
            await self.recorded_async("proxy.stop", self.proxy.stop)  # (as its start: not in a replay)
        if self.retriever is not None:
            await self.retriever.stop()

    async def _start_proxy(self) -> None:
        """slime-style generate functions reach the engine at args.sglang_router_ip/_port: this worker's proxy."""
        import dataclasses

        from ..backends.generate_proxy import GenerateProxy

        async def forward(body: dict):
            await self._engine_ok.wait()
            return await self.client.generate_body(body)
        self.proxy = GenerateProxy(forward)
        # (recorded: a replay starts no proxy -- the function's results are recorded, _generate_slime_style)
        host, port = await self.recorded_async("proxy.start", self.proxy.start)
        engine = dataclasses.replace(self.cfg.engine, sglang_router_ip=host, sglang_router_port=port)
        self.slime_args = dataclasses.replace(self.cfg, engine=engine).flat()
        self.log.info("slime-style generate function: its engine address is this worker's proxy",
                      url=f"http://{host}:{port}", function=self.cfg.rollout.custom_generate_function_path)

    # ------------------------------------------------------------------------------------------ the engine
    def _multi_host(self) -> bool:
        return self.runtime is not None and self.runtime.transport == "tcp"

    def _engine_command(self, port: int) -> tuple[str, list[str]]:
        """(module, argv) of this worker's engine: backends/sglang_launch.py builds it for both engines. Its keys go
        in a --config file under RUN_DIR/keys (0600), not on the command line."""
        from ..backends.sglang_launch import engine_command, engine_host
        multi = self._multi_host()
        host = engine_host(self.cfg, multi, self.runtime.node_address() if multi else None)
        if host in ("0.0.0.0", "::", "[::]", "*"):
            self.log.warning(f"--sglang-host {host}: the engine listens on every interface; only its keys keep other "
                             "hosts out" + ("" if self.keys.any else " -- and it has none (--engine-auth false)"))
        config = None
        if self.keys.any:
            config = self.keys.write_engine_config(os.path.join(self.runtime.run_dir, "keys",
                                                                f"engine-{self.index}.yaml"))
        return engine_command(self.cfg, self.index, port, host=host, config=config)

    def _engine_line(self, line: str) -> None:
        """The engine's output, line by line, into this actor's log (and RUN_DIR/logs/engine-<i>.log)."""
        low = line.lower()
        if "traceback" in low or "error" in low:
            self.log.warning("engine", line=line)
        else:
            self.log.info("engine", line=line)

    async def _start_engine(self) -> None:
        from ..backends.engine_client import EngineClient
        from ..backends.engine_process import launch_engine
        from ..backends.engine_process import find_free_port as free_port
        a = self.cfg
        if a.engine.rollout_external_engine_addrs:
            addrs = a.engine.rollout_external_engine_addrs
            url = addrs[self.index % len(addrs)]
            url = url if url.startswith("http") else f"http://{url}"
            self.engine = None
        else:
            # what the engine's start-up gives (its port, its pid, the checks' verdict) is recorded: replay runs
            # this same code with no engine (RecordedProcess)
            port = self.recorded("engine.port", free_port)
            module, flags = self._engine_command(port)
            from ..backends.sglang_launch import check_engine_flags
            checked = await self.recorded_async("engine.check_flags", self.run_blocking, check_engine_flags, module,
                                                flags)  # SGLangFlagError names a flag
            log_path = os.path.join(self.runtime.run_dir, "logs", f"engine-{self.index}.log")
            t0 = time.monotonic()
            self.log.info("starting engine", module=module, flags=self.keys.redact(" ".join(flags)),
                          checked_against=checked)
            # started from the loop's thread: the engine is told to die with it (PR_SET_PDEATHSIG)
            self.engine = RecordedProcess(self, "engine", lambda: launch_engine(
                module, flags, env=dict(os.environ), log_path=log_path, wait=False, on_line=self._engine_line,
                redact=self.keys.secrets))
            await self.recorded_async("engine.wait_healthy", self.run_blocking, self.engine.wait_healthy,
                                      a.engine.rollout_health_check_first_wait + 600)
            url = _http_url(self.engine.host, port)
            self.log.info("engine up", module=module, url=url, pid=self.engine.pid,
                          seconds=round(time.monotonic() - t0, 1))
        if self.client is not None:
            await self.client.close()
        self.client = RecordedEngine(self, EngineClient(url, keys=self.keys,
                                                        max_concurrency=a.engine.rollout_concurrency))
        if self.router_url:  # generation goes through the router; control stays with this engine
            getattr(self.client, "_client", self.client).generate_base_url = self.router_url
        self.engine_url = url
        self._engine_paused, self._updating = None, 0
        version = 0
        if self.engine is None:
            await self._check_external_keys(url)
            version = await self._external_version()  # someone else's engine: whatever it holds now
        self._engine_caps = await self._capabilities()
        if self.engine is None and not self.replaying:
            from ..backends.engine_auth import engine_warnings
            for w in engine_warnings(url, self._engine_caps.get("auth", {})):
                self.log.warning(w)
        await self._router_register()
        self.weight_version = version
        self._engine_ok.set()
        await self.controller.tell.engine_ready(self.name, version)

    async def _check_external_keys(self, url: str) -> None:
        """An external engine that refuses our key (or our lack of one) is a configuration error: say so and stop,
        instead of failing every request."""
        from ..backends.engine_client import EngineError
        try:
            await self.client.get_model_info()
        except EngineError as exc:
            if exc.status in (401, 403):
                raise RuntimeError(f"external engine {url} refuses this job's requests (HTTP {exc.status}): give its "
                                   "keys with --engine-api-key-file / --engine-admin-api-key-file or "
                                   "SLIME_ACTORS_ENGINE_API_KEY / SLIME_ACTORS_ENGINE_ADMIN_KEY") from None

    async def _external_version(self) -> int:
        """The weight version an external engine reports in /model_info: "default" (its launch weights, taken as
        the --hf-checkpoint ones) is 0, a number is that version, anything else -1 (the controller re-syncs it)."""
        from ..backends.engine_client import EngineError
        try:
            v = await self.client.get_weight_version()
        except EngineError as exc:
            self.log.warning("external engine: no weight version", error=str(exc))
            return -1
        return 0 if v == "default" else _int_version(v, -1)

    async def _capabilities(self) -> dict:
        from ..backends.engine_client import EngineError, supports_flattened_bucket
        try:
            info = await self.client.get_server_info()
        except EngineError as exc:
            self.log.warning("engine has no /server_info; assuming per-tensor weight broadcasts", error=str(exc))
            return {"flattened_bucket": False, "tp_size": 1, "version": None}
        return {"flattened_bucket": supports_flattened_bucket(info), "tp_size": int(info.get("tp_size") or 1),
                "version": info.get("version"),
                "auth": {k: info[k] for k in ("api_key", "admin_api_key") if k in info}}  # set or not (redacted)

    # ------------------------------------------------------------------------------------------ the router
    async def _start_router(self) -> None:
        """--use-sglang-router: rollout/0 starts the router (unless --sglang-router-ip names one); every worker
        learns its URL and, once its engine is up, registers the engine there."""
        a = self.cfg
        if not a.engine.use_sglang_router:
            return
        if a.engine.sglang_router_ip:
            self.router_url = f"http://{a.engine.sglang_router_ip}:{a.engine.sglang_router_port}"
        elif self.index == 0:
            from ..backends.engine_process import launch_engine
            from ..backends.sglang_launch import check_router_flags, router_command
            from ..backends.engine_process import find_free_port as free_port
            # (what the router's start-up gives is recorded, as the engine's: replay runs this with no router)
            port = a.engine.sglang_router_port or self.recorded("router.port", free_port)
            # rollout workers on other hosts send generation here: then it listens on this node's address
            host = self.runtime.node_address() if self._multi_host() else "127.0.0.1"
            module, flags = router_command(a, host, port, prometheus_port=self.recorded("router.metrics_port",
                                                                                        free_port), keys=self.keys)
            await self.recorded_async("router.check_flags", self.run_blocking, check_router_flags, flags)
            self.log.info("starting sglang-router", flags=self.keys.redact(" ".join(flags)))
            self.router = RecordedProcess(self, "router", lambda: launch_engine(
                module, flags, env=dict(os.environ), wait=False, on_line=self._engine_line,
                log_path=os.path.join(self.runtime.run_dir, "logs", "sglang-router.log"), redact=self.keys.secrets))
            await self.recorded_async("router.wait_healthy", self.run_blocking, self.router.wait_healthy, 300)
            self.router_url = _http_url(host, port)
        else:
            while self.router_url is None:
                try:
                    self.router_url = (await Handle(self, "rollout/0").router_url(ask_timeout=600)).url
                except MailboxError as exc:
                    self.log.warning("waiting for rollout/0's router", error=str(exc))
                    await asyncio.sleep(1.0)
        self._router_ready.set()
        self.log.info("generation goes through the sglang-router", url=self.router_url)

    async def _router_register(self) -> None:
        if not self.router_url or not self.engine_url:
            return
        from ..backends.engine_client import RouterClient
        rc = RecordedEngine(self, RouterClient(self.router_url, keys=self.keys), "router")
        try:
            if not await rc.has_worker(self.engine_url):
                await rc.add_worker(self.engine_url, api_key=self.keys.api_key)
                self.log.info("engine registered with the router", engine=self.engine_url, router=self.router_url)
        finally:
            await rc.close()

    async def _router_forget(self) -> None:
        if not self.router_url or not self.engine_url:
            return
        from ..backends.engine_client import EngineError, RouterClient
        rc = RecordedEngine(self, RouterClient(self.router_url, timeout=10, keys=self.keys), "router")
        try:
            await rc.remove_worker(self.engine_url)
        except EngineError as exc:
            self.log.warning("could not remove the engine from the router", error=str(exc))
        finally:
            await rc.close()

    async def _watch_engine(self) -> None:
        a = self.cfg
        await asyncio.sleep(a.engine.rollout_health_check_first_wait)
        # clock readings that decide something are recorded inputs (self.monotonic()): replay takes the same turns
        last_probe = last_router = self.monotonic() if a.engine.use_fault_tolerance or self.router_url else 0.0
        while True:
            await asyncio.sleep(0.5)
            if self._restarting or self.client is None or not self.running:
                continue
            reason = None
            code = self.engine.poll() if self.engine is not None else None
            if code is not None:
                reason = f"engine process exited with code {code}"
            elif a.engine.use_fault_tolerance \
                    and self.monotonic() - last_probe >= a.engine.rollout_health_check_interval:
                last_probe = self.monotonic()
                # a paused engine does not generate (SGLang reports it unhealthy after 20 s), and one that is
                # loading weights answers /health_generate only when done: then only /health, which SGLang's HTTP
                # server answers at once -- an engine that hangs (or is stopped) mid-update or while paused is still
                # caught, instead of holding the weight sync until its timeout
                quiet = self._engine_paused is not None or self._updating > 0
                try:
                    if quiet:
                        ok = await self.client.health(timeout=a.engine.rollout_health_check_timeout)
                    else:
                        ok = await self.client.health_generate(timeout=a.engine.rollout_health_check_timeout)
                except RuntimeError:  # the client was closed under us (stopping or restarting)
                    continue
                if not ok and not self._restarting:
                    if quiet:
                        reason = (f"engine failed /health within {a.engine.rollout_health_check_timeout}s (while "
                                  f"{'updating weights' if self._updating else 'paused'})")
                    elif self._engine_paused is None and self._updating == 0:
                        reason = f"engine failed /health_generate within {a.engine.rollout_health_check_timeout}s"
            if reason:
                await self._recover(reason)
            elif self.router_url and self._engine_ok.is_set() and self.monotonic() - last_router > 10:
                last_router = self.monotonic()  # a restarted router forgets its workers: register again
                try:
                    await self._router_register()
                except Exception as exc:
                    self.log.warning("router registration check failed", error=repr(exc))

    async def _release_previous(self) -> None:
        """A new incarnation holds no work: whatever the buffer still has leased to this name (a previous process
        of it was killed) is re-issued now, before this one pulls (same sender, so no race with get_work)."""
        try:
            res = await retry(lambda: self.buffer.release_worker(self.name, reason="restarted", ask_timeout=30),
                              RELEASE_RETRY, what="release_worker (a previous incarnation's groups)", log=self.log,
                              clock=self.monotonic)  # (recorded clock readings, as every retry's here)
        except MailboxError as exc:  # the buffer re-issues them when their lease runs out
            self.log.warning("could not release a previous incarnation's groups", error=str(exc))
            return
        if res.requeued:
            self.log.warning("re-issued the groups of this worker's previous process", groups=res.requeued)

    async def _recover(self, reason: str) -> None:
        self._restarting = True
        self._engine_ok.clear()
        self._resumed.clear()  # serve again only once the controller re-synced the new engine and resumes us
        self.engine_restarts += 1
        self.weight_version = -1  # unknown until the new engine is up (it starts from the launch weights)
        self.log.error("engine failed; restarting it", reason=reason, restarts=self.engine_restarts)
        try:
            # in-flight work cannot finish on this engine: hand it back so the buffer re-issues it
            for t in list(self._inflight.values()):
                t.cancel()
            await asyncio.sleep(0)
            try:
                await self.buffer.release_worker(self.name, reason=reason, ask_timeout=30)
            except MailboxError as exc:
                self.log.warning("could not release groups", error=str(exc))
            await self._router_forget()
            if self.engine is not None:
                # a hung engine does not act on SIGTERM: SIGKILL its process group after a short grace
                await self.run_blocking(self.engine.stop, 2.0 if "health" in reason else 15.0)
            else:  # an external engine: nothing to restart here; wait until it answers again
                await self._wait_external_healthy()
            await self._start_engine()
        finally:
            self._restarting = False

    async def _wait_external_healthy(self) -> None:
        a = self.cfg
        delay = 1.0
        while not await self.client.health_generate(timeout=a.engine.rollout_health_check_timeout):
            self.log.warning("external engine still unhealthy", url=self.engine_url)
            await asyncio.sleep(delay)
            delay = min(30.0, delay * 2)

    async def _generate_raw(self, input_ids: list[int], sampling_params: dict) -> dict:
        await self._engine_ok.wait()
        # the engine's answer is the nondeterministic input here: recorded in the trace, served back on replay
        return await self.recorded_async("engine.generate", self._generate_live, input_ids, sampling_params,
                                         key=request_key(input_ids, sampling_params))

    async def _generate_live(self, input_ids: list[int], sampling_params: dict) -> dict:
        from ..backends.engine_client import parse_generate_output
        t0 = time.time()
        resp = await self.client.generate(input_ids, sampling_params, return_logprob=True)
        out = parse_generate_output(resp)
        # `started`: when the request went out (the trace stamps the answer's arrival), for time-inside-generation
        return {"output_ids": list(out.output_ids), "logprobs": list(out.logprobs),
                "finish_reason": out.finish_type, "weight_version": out.weight_version, "started": t0}

    # ------------------------------------------------------------------------------------------ work
    async def _pull_loop(self) -> None:
        a = self.cfg
        poll_key, poll_seq = None, 0
        pid = self.recorded("pid", os.getpid)  # in the idempotency keys (a restarted worker's keys are new)
        while True:
            await self._resumed.wait()
            await self._engine_ok.wait()
            free = (self._capacity - self._generating) // max(1, a.rollout.n_samples_per_prompt)
            if free < 1:
                await asyncio.sleep(0.01)
                continue
            restarts = self.engine_restarts
            if poll_key is None:
                poll_seq += 1
                poll_key = f"get_work:{pid}:{poll_seq}"
            try:
                # an idempotency key: if the reply is lost (a cut link, a reconnect) the retry gets the same groups
                # from the buffer's cache instead of leaving them leased to us and never seen
                work = await self.buffer.get_work(self.name, free, wait=1.0, ask_timeout=10, idem=poll_key)
            except MailboxError as exc:
                if isinstance(exc, RemoteError):
                    poll_key = None
                self.log.warning("get_work failed; retrying", error=str(exc))
                await asyncio.sleep(0.5)
                continue
            poll_key = None
            if restarts != self.engine_restarts or not self._engine_ok.is_set():
                # the engine failed while we asked: this work must not run on the new engine before its re-sync
                for group in work.groups:
                    self.spawn(self._return(group.work_id, None, "engine restarted"), name="return")
                continue
            for group in work.groups:
                task = self.spawn(self._process_group(group), name=f"group:{group.work_id}")
                self._inflight[group.work_id] = task

    def _seed(self, sample: Sample, attempt: int) -> int:
        h = hashlib.blake2b(f"{self.cfg.data.rollout_seed}:{sample.index}:{attempt}".encode(), digest_size=4)
        return int.from_bytes(h.digest(), "little") & 0x7FFFFFFF

    async def _process_group(self, group: WorkGroup) -> None:
        wid = group.work_id
        samples = [Sample.from_wire(s) for s in group.samples]
        sp = dict(group.sampling_params)
        n = len(samples)
        self._generating += n
        try:
            try:
                if self.group_fn is not None:
                    samples = await self.group_fn(self.plugin_args, samples, sp, EngineHandle(self))
                else:
                    evaluation = group.kind == "eval"
                    samples = await asyncio.gather(*(self._generate(s, sp, group.attempt, evaluation)
                                                     for s in samples))
            finally:
                self._generating -= n
            if any(s.status == ABORTED for s in samples):
                await self._return(wid, samples, "aborted")
                return
            await self._score(samples, group.kind)
            self.counters["groups"] += 1
            self.counters["samples"] += n
            await self._submit(wid, samples, group.attempt)
        except asyncio.CancelledError:
            # the engine is being restarted or the worker stops: the buffer gets the group back via release_worker
            raise
        except Exception as exc:  # an engine error: give the group back, it will be generated again
            self.log.error("group failed; returning it", work_id=wid, error=repr(exc))
            await self._return(wid, None, f"error: {exc!r}")
        finally:
            self._inflight.pop(wid, None)

    async def _generate(self, sample: Sample, sp: dict, attempt: int, evaluation: bool = False) -> Sample:
        if self.generate_fn is not None and self.slime_generate:
            return await self._generate_slime_style(sample, sp, evaluation)
        if self.generate_fn is not None:
            return await self.generate_fn(self.plugin_args, sample, dict(sp), EngineHandle(self))
        params = dict(sp)
        done = len(sample.response_tokens)
        params["max_new_tokens"] = max(0, sp["max_new_tokens"] - done)
        if params["max_new_tokens"] == 0:
            sample.status = TRUNCATED
            return sample
        params["sampling_seed"] = self._seed(sample, attempt)
        version_at_start = self.weight_version
        out = await self._generate_raw(sample.prompt_tokens + sample.response_tokens, params)
        sample.response_tokens = sample.response_tokens + out["output_ids"]
        sample.rollout_log_probs = sample.rollout_log_probs + out["logprobs"]
        sample.loss_mask = sample.loss_mask + [1] * len(out["output_ids"])
        sample.response = self.tokenizer.decode(sample.response_tokens, skip_special_tokens=True)
        fr = out["finish_reason"]
        sample.finish_reason = fr
        sample.status = ABORTED if fr == "abort" else TRUNCATED if fr == "length" else COMPLETED
        version = _int_version(out["weight_version"], version_at_start)
        sample.weight_versions = sample.weight_versions + [version]
        sample.weight_version = min(sample.weight_versions)
        return sample

    async def _generate_slime_style(self, sample: Sample, sp: dict, evaluation: bool) -> Sample:
        """slime's generate(args, sample, sampling_params[, evaluation]); what slime's function leaves unset is
        filled in as slime would: an all-ones loss mask, the decoded response, the weight version."""
        from ..plugins import takes_keyword
        version = self.weight_version
        fn = self.generate_fn
        kw = {"evaluation": evaluation} if takes_keyword(fn, "evaluation") else {}
        # The function reaches the engine over HTTP (this worker's proxy), which a replay cannot do: what it returns
        # is a recorded input (keyed by the request), and a replay takes that instead of calling it again.
        key = request_key(sample.prompt_tokens, {**sp, "index": sample.index, "evaluation": evaluation})
        made = []

        async def call() -> dict:
            res = await fn(self.slime_args, sample, dict(sp), **kw)
            if not isinstance(res, Sample):
                raise TypeError(f"--custom-generate-function-path {self.cfg.rollout.custom_generate_function_path} "
                                f"returned {type(res).__name__}, expected the Sample it was given")
            made.append(res)
            return res.to_wire()
        wire = await self.recorded_async("generate_fn", call, key=key)
        if made:
            out = made[0]
        else:  # replay: the sample as the function left it
            out = sample
            for name, value in Sample.from_wire(wire).__dict__.items():
                setattr(out, name, value)
        n = len(out.response_tokens)
        if not out.loss_mask:
            out.loss_mask = [1] * n
        if len(out.loss_mask) != n:
            raise ValueError(f"custom generate function: sample {out.index} has {n} response tokens but a loss mask "
                             f"of {len(out.loss_mask)}")
        if not out.response and n:
            out.response = self.tokenizer.decode(out.response_tokens, skip_special_tokens=True)
        if out.status == PENDING:
            out.status = COMPLETED if n else FAILED
            if not n:
                out.error = "the custom generate function produced no response"
        if not out.weight_versions:
            out.weight_versions = [version]
            out.weight_version = version
        return out

    async def _ask_reward(self, who: str, todo: list[Sample]) -> Scores:
        """One score ask; while no reward worker answers at all (killed, restarting) keep trying for up to
        REWARD_WAIT_S seconds -- scoring is pure, so a retry is harmless -- instead of
        spending the group's attempts, which are for reward functions that fail."""
        a = self.cfg
        wait = REWARD_WAIT_S
        t0 = None  # from the first failure (a recorded clock reading: replay takes the same turns)
        k = 0
        while True:
            target = who if k == 0 else f"reward/{(self.index + k) % max(1, a.reward.num_reward_workers)}"
            try:
                return await Handle(self, target).score([s.to_wire() for s in todo], group=a.reward.group_rm,
                                                        ask_timeout=300)
            except MailboxError as exc:
                from ..mailbox.errors import RemoteError
                if isinstance(exc, RemoteError) and exc.type != "MailboxError":
                    raise
                if t0 is None:
                    t0 = self.monotonic()
                elif self.monotonic() - t0 > wait:
                    raise
                k += 1
                self.log.warning("reward worker unavailable; retrying", reward=target, error=str(exc))
                await asyncio.sleep(min(2.0, 0.2 * k))

    async def _score(self, samples: list[Sample], kind: str) -> None:
        a = self.cfg
        todo = [s for s in samples if s.status != FAILED]
        last_errors: dict[int, str] = {}
        for attempt in range(3):
            if not todo:
                return
            who = f"reward/{(self.index + attempt) % max(1, a.reward.num_reward_workers)}"
            try:
                res = await self._ask_reward(who, todo)
            except MailboxError as exc:
                self.log.warning("reward worker unavailable; trying another", reward=who, error=str(exc))
                for s in todo:
                    last_errors[s.index] = f"{who}: {exc}"
                self.counters["reward_retries"] += 1
                await asyncio.sleep(0.2 * (attempt + 1))
                continue
            failed = []
            timed_out = res.timed_out   # [] when a reward actor of your own leaves it out
            for i, (s, r, e) in enumerate(zip(todo, res.rewards, res.errors)):
                if e is None and r is not None:
                    s.reward = float(r)
                    if i < len(timed_out) and timed_out[i]:
                        s.metadata["reward_timed_out"] = True
                else:
                    last_errors[s.index] = e or "no reward"
                    failed.append(s)
            if failed and attempt < 2:
                self.counters["reward_retries"] += 1
            todo = failed if not a.reward.group_rm else (samples if failed else [])
        for s in todo:  # still failing after retries: the group is recorded as failed (buffer keeps it)
            s.status = FAILED
            s.error = f"reward failed: {last_errors.get(s.index, 'unknown')}"

    async def _submit(self, wid: str, samples: list[Sample], lease: int) -> None:
        wire = [s.to_wire() for s in samples]
        idem = submit_key(wid, lease, samples[0])
        try:  # the buffer may be restarting: keep the group and try again (the same key: applied at most once)
            res = await retry(lambda: self.buffer.submit(self.name, wid, wire, ask_timeout=60, idem=idem),
                              SUBMIT_RETRY, what="submit", log=self.log, clock=self.monotonic, work_id=wid)
        except MailboxError as exc:
            self.log.error("gave up submitting a group; the buffer will re-issue it", work_id=wid, error=str(exc))
            return
        if not res.accepted:
            self.log.warning("buffer refused a group", work_id=wid, reason=res.reason)

    async def _return(self, wid: str, samples: list[Sample] | None, reason: str) -> None:
        self.counters["aborted_groups"] += 1
        given = {"reason": reason} if samples is None else {"reason": reason, "samples": [s.to_wire() for s in samples]}
        try:
            await retry(lambda: self.buffer.return_work(self.name, wid, **given, ask_timeout=30), RETURN_RETRY,
                        what="return_work", log=self.log, clock=self.monotonic, work_id=wid)
        except MailboxError as exc:  # the buffer re-issues the group when its lease runs out
            self.log.warning("gave up returning a group", work_id=wid, error=str(exc))

    # ------------------------------------------------------------------------------------------ handlers
    @handler
    async def resume(self, weight_version: int) -> None:
        async with self._pause_lock:
            if weight_version != self.weight_version:
                # a restarted engine serves only once it holds the current weights (the controller re-syncs it)
                self.log.warning("not resuming: the engine does not hold the weight version asked for",
                                 asked=weight_version, engine=self.weight_version)
                return
            if self._engine_paused is not None and self._engine_ok.is_set():
                await self.client.continue_generation()
                self.log.info("engine continued", paused_mode=self._engine_paused)
            self._engine_paused = None
            self._resumed.set()

    @handler
    async def pause(self, abort: bool = False) -> dict:
        """Stop pulling and pause the engine (/pause_generation) in --pause-generation-mode (abort=True: abort).
        abort: in-flight requests come back aborted and their groups go back to the buffer (partial responses kept
        under --partial-rollout); retract / in_place: they wait in the engine and finish after resume."""
        async with self._pause_lock:
            self._resumed.clear()
            n = len(self._inflight)
            mode = "abort" if abort else self.cfg.engine.pause_generation_mode
            if self._engine_paused is None and self._engine_ok.is_set():
                await self.client.pause_generation(mode)
                self._engine_paused = mode
                self.log.info("engine paused", mode=mode, in_flight=n)
            return {"in_flight": n, "mode": self._engine_paused or mode}

    @handler
    async def end_rollout(self, rollout_id: int) -> dict:
        """Stop pulling, abort generation in flight, wait until those groups went back to the buffer."""
        self._resumed.clear()
        n = len(self._inflight)
        if n:
            await self.client.abort_request(abort_all=True)
            deadline = self.monotonic() + 60  # recorded clock readings: replay takes the same turns
            while self._inflight and self.monotonic() < deadline:
                await asyncio.sleep(0.01)
        return {"aborted": n, "returned": n - len(self._inflight)}

    @handler
    async def init_weights_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                 group_name: str, backend: str) -> dict:
        await self._engine_ok.wait()
        self._updating += 1
        try:
            res = await self.client.init_weights_update_group(master_address, master_port, rank_offset, world_size,
                                                              group_name, backend)
        finally:
            self._updating -= 1
        # the trainer sends flattened buckets only when every engine of the group takes them
        return {**res, "flattened_bucket": bool(self._engine_caps.get("flattened_bucket"))}

    def _flush(self, flush_cache: bool) -> bool:
        """SGLang asserts that the cache flush after a weight update succeeds, which it cannot while requests wait
        in an engine paused with retract / in_place: no flush then (their prefix cache entries stay)."""
        return bool(flush_cache) and self._engine_paused not in ("retract", "in_place")

    async def _update(self, weight_version: int, call) -> dict:
        """Run one weight-update call to the engine. If the engine was restarted meanwhile (it hung, or died, during
        the update), the answer -- even a success from the old process -- says nothing about the engine now
        serving, which holds its launch weights: the update fails, and the controller re-syncs the new one."""
        restarts = self.engine_restarts
        if self._restarting:
            raise RuntimeError(f"{self.name}: the engine is restarting; weight version {weight_version} not loaded")
        self._updating += 1
        try:
            res = await call()
        finally:
            self._updating = max(0, self._updating - 1)
        self._loaded(weight_version, restarts)
        return res

    def _loaded(self, weight_version: int, restarts_at_start: int) -> None:
        """An update that began at `restarts_at_start` finished: the engine holds `weight_version` -- unless it was
        restarted since (the new one holds its launch weights), which fails the update."""
        if self.engine_restarts != restarts_at_start or self._restarting:
            raise RuntimeError(f"{self.name}: the engine was restarted during the update to weight version "
                               f"{weight_version}; the new engine does not hold it")
        self.weight_version = weight_version

    @handler
    async def update_weights_from_distributed(self, names: list, dtypes: list, shapes: list, group_name: str,
                                              weight_version: int, flush_cache: bool = True,
                                              load_format: str | None = None) -> dict:
        return await self._update(weight_version, lambda: self.client.update_weights_from_distributed(
            names, dtypes, shapes, group_name, weight_version=str(weight_version), flush_cache=self._flush(flush_cache),
            load_format=load_format))

    @handler
    async def destroy_weights_group(self, group_name: str) -> None:
        await self.client.destroy_weights_update_group(group_name)

    @handler
    async def update_weights_from_disk(self, model_path: str, weight_version: int) -> dict:
        await self._engine_ok.wait()
        return await self._update(weight_version, lambda: self.client.update_weights_from_disk(
            model_path, weight_version=str(weight_version), flush_cache=self._flush(True)))

    @handler
    async def weight_update(self, active: bool, weight_version: int | None = None) -> dict:
        """The trainer updates this engine directly (/update_weights_from_tensor, colocated): hold health probes
        while `active`; at the end, the version the engine now holds."""
        if active:
            await self._engine_ok.wait()
            self._updating += 1
            self._direct_update_restarts = self.engine_restarts
        else:
            self._updating = max(0, self._updating - 1)
            if weight_version is not None:
                self._loaded(weight_version, self._direct_update_restarts)
        return {"engine_url": self.engine_url, "paused": self._engine_paused,
                "flush_cache": self._flush(True), "tp_size": int(self._engine_caps.get("tp_size", 1))}

    @handler
    async def router_url(self) -> dict:
        """rollout/0: the URL of the sglang-router it started (waits until it is up)."""
        await self._router_ready.wait()
        return {"url": self.router_url}

    @handler
    def held_groups(self) -> list:
        """Work ids this worker holds (generating, scoring or handing in): the buffer reconciles after a restart."""
        return sorted(self._inflight)

    @handler
    async def engine_info(self) -> dict:
        healthy = await self.client.health() if self.client is not None else False
        return {"url": self.client.base_url if self.client else None, "weight_version": self.weight_version,
                "healthy": healthy, "pid": self.engine.pid if self.engine else None,
                "restarts": self.engine_restarts, "in_flight": len(self._inflight),
                "resumed": self._resumed.is_set(), "engine_url": self.engine_url, "router_url": self.router_url,
                "paused": self._engine_paused, "updating": self._updating, **self._engine_caps}

    @handler
    async def kill_engine(self, hang: bool = False) -> dict:
        import signal
        if self.engine is None:
            raise RuntimeError("this worker attaches to an external engine; nothing to kill")
        self.engine.signal(signal.SIGSTOP if hang else signal.SIGKILL)
        return {"pid": self.engine.pid}


class RecordedEngine:
    """The engine client (or the router's) as the worker uses it: the answers of its calls (weights, aborts, health,
    close; not generate, which `_generate_raw` records parsed) are recorded in the trace as `<prefix>.<method>`, and
    under replay served from it."""

    _LOCAL = frozenset(("generate",))

    def __init__(self, actor: Actor, client, prefix: str = "engine"):
        self._actor, self._client, self._prefix = actor, client, prefix

    def __getattr__(self, name: str):
        fn = getattr(self._client, name)
        if name in self._LOCAL or not asyncio.iscoroutinefunction(fn):
            return fn

        async def call(*args, **kwargs):
            return await self._actor.recorded_async(f"{self._prefix}.{name}", fn, *args, **kwargs)
        return call


class RecordedProcess:
    """A process the worker started (its engine), as the worker sees it: what it learns of the process -- its pid
    and host at launch, its exit code when polled -- is a recorded input, so replay runs the same code with no
    process (waits, stops and signals then do nothing)."""

    def __init__(self, actor: Actor, name: str, launch):
        self._actor, self._name, self._proc = actor, name, None

        def start() -> dict:
            self._proc = launch()
            return {"pid": self._proc.pid, "host": self._proc.host}
        info = actor.recorded(f"{name}.launch", start)
        self.pid, self.host = info["pid"], info["host"]

    def poll(self) -> int | None:
        return self._actor.recorded(f"{self._name}.poll", lambda: self._proc.poll())

    def wait_healthy(self, timeout: float) -> None:
        if self._proc is not None:
            self._proc.wait_healthy(timeout)

    def stop(self, *args) -> None:
        if self._proc is not None:
            self._proc.stop(*args)

    def signal(self, sig: int) -> None:
        if self._proc is not None:
            os.kill(self._proc.pid, sig)


def request_key(input_ids: list[int], sampling_params: dict) -> str:
    """Which request an engine answer belongs to (answers to concurrent requests come back in any order)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(repr((list(input_ids), sorted(sampling_params.items()))).encode())
    return h.hexdigest()


def generate_style(fn, path: str) -> str:
    """"slime" for slime's generate(args, sample, sampling_params[, evaluation]), "engine" for this project's
    generate(args, sample, sampling_params, engine); PluginError naming the path otherwise."""
    import inspect

    from ..plugins import PluginError, positional_arity
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
    raise PluginError(f"--custom-generate-function-path {path}: expected async generate(args, sample, "
                      "sampling_params) (slime's) or generate(args, sample, sampling_params, engine), got "
                      f"{required} required of {most} positional parameters", kind="not_callable", path=path)


def _http_url(host: str, port: int) -> str:
    """The URL a server listening on `host` is reached at from this host (a wildcard: the loopback)."""
    if host in ("0.0.0.0", "", "*", "::", "[::]"):
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6
    return f"http://{host}:{int(port)}"


def _timed(name: str, fn, *args):
    from ..launch import timeline
    with timeline.phase(name):
        return fn(*args)


def _load_tokenizer(path: str):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path)


def _int_version(v, default: int) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default
