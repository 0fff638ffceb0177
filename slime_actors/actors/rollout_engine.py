"""A rollout worker's engine, supervised: its start (the local engine or SGLang, or an external one), the
sglang-router, the watch that restarts an engine whose process exits or (with --use-fault-tolerance) fails
`/health_generate`. `EngineSupervisor` is the part of `RolloutWorker` (actors/rollout.py) that does this; it
derives from `EngineWeights` (actors/rollout_weights.py: pauses and weight updates), and generation
(actors/rollout_generate.py) reaches the engine through `self.client`.

What an engine tells the worker -- its port and pid at launch, its exit codes, its answers -- is recorded in the
worker's trace (`RecordedProcess`, `RecordedEngine`: actors/recorded_engine.py), so `slime-actors replay` runs this
same code with no engine.
"""

from __future__ import annotations

import asyncio
import os
import time

from typing import TYPE_CHECKING, Any

from ..backends.engine_auth import EngineKeys
from ..environments.episode import int_version
from ..mailbox.errors import MailboxError
from ..role_handles import BufferHandle, ControllerHandle, RolloutHandle
from .base import handler
from .recorded_engine import RecordedEngine, RecordedProcess, http_url
from .rollout_weights import EngineWeights

if TYPE_CHECKING:
    from ..backends.engine_client import EngineClient

# engine lines that speak of an error SGLang ignores: at its start it imports every model module it has and says so
# of each whose optional kernels are not installed (34 lines on a GPU machine without cutlass): not the user's news
ENGINE_NOISE = ("ignore import error when loading",)


class EngineSupervisor(EngineWeights):
    """The engine half of a rollout worker (RolloutWorker derives from it): its state is set by
    `_init_engine_state`, its handlers are the worker's."""

    # the worker's (actors/rollout.py), used here
    buffer: BufferHandle
    controller: ControllerHandle
    _ahead: dict[str, Any]

    def _init_engine_state(self) -> None:
        self.weight_version = -1          # version the engine holds; -1 until the controller says
        self.engine: RecordedProcess | None = None  # the engine process it started (None: an external engine)
        self.client: RecordedEngine | None = None   # the engine's client (engine_client: once it has one)
        self._resumed = asyncio.Event()   # the controller said resume (cleared by pause, end_rollout)
        self._engine_ok = asyncio.Event()  # the engine serves at the controller's weights
        self._restarting = False
        self.engine_restarts = 0
        self.engine_url: str | None = None  # the engine itself (control endpoints); generation may go via a router
        self.router: RecordedProcess | None = None  # the sglang-router this worker started (rollout/0)
        self.router_url: str | None = None
        self._router_ready = asyncio.Event()
        self._engine_paused: str | None = None  # the /pause_generation mode the engine is paused in
        self._pause_lock = asyncio.Lock()  # pause/resume run in arrival order
        self._updating = 0                # weight updates in progress (health probes wait)
        self._direct_update_restarts = 0  # engine_restarts when a colocated (direct) weight update began
        self._engine_caps: dict = {}
        self._lora_loaded: list[str] = []  # --lora-sync adapter: the adapters the engine holds, oldest first
        self.keys = EngineKeys()          # the engines' HTTP keys, from the environment (on_start); none: no auth
        self._engine_module = ""          # the engine's module and when it was launched (_launch_engine)
        self._engine_t0 = 0.0
        self._launched_command: tuple[str, list[str]] | None = None   # checked by _check_launched_engine

    async def _stop_engine(self) -> None:
        """The worker stops: forget the router, close the client, stop the engine and the router it started."""
        self._restarting = True  # the engine's exit from here on is expected
        await self._router_forget()
        if self.client is not None:
            await self.client.close()
        if self.engine is not None:
            await self.run_blocking(self.engine.stop)
        if self.router is not None:
            await self.run_blocking(self.router.stop)

    # ------------------------------------------------------------------------------------------ the engine
    def _multi_host(self) -> bool:
        return self.runtime is not None and self.runtime.transport == "tcp"

    def _engine_env(self) -> dict[str, str]:
        """The engine's environment: this process's, and on one host its gloo / NCCL groups (SGLang's own, the
        weight-update group) listening on the loopback (backends/listen.py)."""
        from ..backends.listen import collective_env
        env = dict(os.environ)
        if not self._multi_host():
            env.update(collective_env("127.0.0.1", env))
        return env

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
        """The engine's output, line by line, into this actor's log (and RUN_DIR/logs/engine-<i>.log): a line that
        speaks of an error or a traceback as a warning (on the console too), the rest, and the errors SGLang says
        it ignores (ENGINE_NOISE), as info."""
        low = line.lower()
        if ("traceback" in low or "error" in low) and not any(n in low for n in ENGINE_NOISE):
            self.log.warning("engine", line=line)
        else:
            self.log.info("engine", line=line)

    async def _start_engine(self) -> None:
        """Start this worker's engine (or attach to an external one) and wait until it serves (an engine restart);
        the worker's first start launches it, loads its tokenizer meanwhile and then waits (actors/rollout.py)."""
        port = await self._launch_engine()
        try:
            await self._check_launched_engine()
        except BaseException:
            await self._stop_engine()
            raise
        await self._engine_serving(port)

    async def _launch_engine(self) -> int | None:
        """Launch the engine process and return its port without waiting for it (None: an external engine, nothing
        to launch); `_check_launched_engine` checks its command line meanwhile. Everything it imports is imported
        here, on the loop, before the worker's tokenizer thread imports transformers (see `preimport_engine_path`)."""
        from ..backends.engine_process import launch_engine
        from ..backends.engine_process import find_free_port as free_port
        self.engine = None
        self._launched_command = None
        if self.cfg.engine.rollout_external_engine_addrs:
            return None
        # what the engine's start-up gives (its port, its pid, the checks' verdict) is recorded: replay runs
        # this same code with no engine (RecordedProcess)
        port = self.recorded("engine.port", free_port)
        module, flags = self._engine_command(port)
        log_path = os.path.join(self.runtime.run_dir, "logs", f"engine-{self.index}.log")
        self._engine_t0 = time.monotonic()
        self.log.info("starting engine", module=module, flags=self.keys.redact(" ".join(flags)))
        # started from the loop's thread: the engine is told to die with it (PR_SET_PDEATHSIG)
        self.engine = RecordedProcess(self, "engine", lambda: launch_engine(
            module, flags, env=self._engine_env(), log_path=log_path, wait=False, on_line=self._engine_line,
            redact=self.keys.secrets))
        self._engine_module = module
        self._launched_command = (module, flags)
        return port

    async def _check_launched_engine(self) -> None:
        """The launched engine's command line checked on this host: SGLang's own parser where `sglang` imports here
        (16 s for that import on one H100), else the recorded table. It runs while the engine starts, not before:
        the head checked the same flags before any process started (launch/checks.py), so this is the word of this
        host's SGLang, which a worker on another node may have in another version. SGLangFlagError names a refused
        flag; the caller stops the engine."""
        from ..backends.sglang_launch import check_engine_flags
        if self._launched_command is None:
            return
        module, flags = self._launched_command
        checked = await self.recorded_async("engine.check_flags", self.run_blocking, check_engine_flags, module,
                                            flags)
        self.log.info("engine flags checked", module=module, checked_against=checked)

    async def _engine_serving(self, port: int | None) -> None:
        """Wait for the engine `_launch_engine` started (port None: the external one) to answer /health, then
        connect to it, register it with the router and tell the controller it is ready."""
        from ..backends.engine_client import EngineClient
        cfg = self.cfg
        engine, addrs = self.engine, cfg.engine.rollout_external_engine_addrs
        if port is None or engine is None:
            if not addrs:
                raise RuntimeError("no engine was launched and no external one is named "
                                   "(--rollout-external-engine-addrs)")
            url = addrs[self.index % len(addrs)]
            url = url if url.startswith("http") else f"http://{url}"
        else:
            await self.recorded_async("engine.wait_healthy", self.run_blocking, engine.wait_healthy,
                                      cfg.engine.rollout_health_check_first_wait + 600)
            url = http_url(engine.host, port)
            self.log.info("engine up", module=self._engine_module, url=url, pid=engine.pid,
                          seconds=round(time.monotonic() - self._engine_t0, 1))
        if self.client is not None:
            await self.client.close()
        client = EngineClient(url, keys=self.keys, max_concurrency=cfg.engine.rollout_concurrency)
        if self.router_url:  # generation goes through the router; control stays with this engine
            client.generate_base_url = self.router_url
        self.client = RecordedEngine(self, client)
        self.engine_url = url
        self._engine_paused, self._updating, self._lora_loaded = None, 0, []
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
        if self.cfg.debug.profile_step_start == 0:
            await self._engine_profile(0)  # --profile-target rollout from the first rollout

    async def _engine_profile(self, rollout_id: int) -> None:
        """--use-pytorch-profiler --profile-target rollout: as rollout `rollout_id` starts, start or stop the engine's
        profiler through SGLang's endpoints (the local engine has them too); its traces go to
        RUN_DIR/profiles/engine-<this worker>/ (slime_actors/profiler.py)."""
        from ..backends.engine_client import EngineError
        from ..profiler import engine_profile_window, profiles_dir
        what = engine_profile_window(self.cfg.debug, rollout_id)
        if what is None:
            return
        out = str(profiles_dir(self.runtime.run_dir).resolve() / f"engine-{self.name.replace('/', '-')}")
        try:
            if what == "start":
                await self.recorded_async("engine.start_profile", self.engine_client.start_profile, out)
            else:
                await self.recorded_async("engine.stop_profile", self.engine_client.stop_profile)
        except EngineError as exc:
            self.log.warning("engine profiler", action=what, error=str(exc))
        else:
            self.log.info("engine profiler", action=what, rollout_id=rollout_id, output_dir=out)

    async def _check_external_keys(self, url: str) -> None:
        """An external engine that refuses our key (or our lack of one) is a configuration error: say so and stop,
        instead of failing every request."""
        from ..backends.engine_client import EngineError
        try:
            await self.engine_client.get_model_info()
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
            v = await self.engine_client.get_weight_version()
        except EngineError as exc:
            self.log.warning("external engine: no weight version", error=str(exc))
            return -1
        return 0 if v == "default" else int_version(v, -1)

    async def _capabilities(self) -> dict:
        from ..backends.engine_client import EngineError, supports_flattened_bucket
        try:
            info = await self.engine_client.get_server_info()
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
        cfg = self.cfg
        if not cfg.engine.use_sglang_router:
            return
        if cfg.engine.sglang_router_ip:
            self.router_url = f"http://{cfg.engine.sglang_router_ip}:{cfg.engine.sglang_router_port}"
        elif self.index == 0:
            from ..backends.engine_process import launch_engine
            from ..backends.sglang_launch import check_router_flags, router_command
            from ..backends.engine_process import find_free_port as free_port
            # (what the router's start-up gives is recorded, as the engine's: replay runs this with no router)
            port = cfg.engine.sglang_router_port or self.recorded("router.port", free_port)
            # rollout workers on other hosts send generation here: then it listens on this node's address
            host = self.runtime.node_address() if self._multi_host() else "127.0.0.1"
            module, flags = router_command(cfg, host, port, prometheus_port=self.recorded("router.metrics_port",
                                                                                        free_port), keys=self.keys)
            await self.recorded_async("router.check_flags", self.run_blocking, check_router_flags, flags)
            self.log.info("starting sglang-router", flags=self.keys.redact(" ".join(flags)))
            self.router = RecordedProcess(self, "router", lambda: launch_engine(
                module, flags, env=dict(os.environ), wait=False, on_line=self._engine_line,
                log_path=os.path.join(self.runtime.run_dir, "logs", "sglang-router.log"), redact=self.keys.secrets))
            await self.recorded_async("router.wait_healthy", self.run_blocking, self.router.wait_healthy, 300)
            self.router_url = http_url(host, port)
        else:
            while self.router_url is None:
                try:
                    self.router_url = (await RolloutHandle(self, "rollout/0").router_url(ask_timeout=600)).url
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
        cfg = self.cfg
        await asyncio.sleep(cfg.engine.rollout_health_check_first_wait)
        # clock readings that decide something are recorded inputs (self.monotonic()): replay takes the same turns
        last_probe = last_router = self.monotonic() if cfg.engine.use_fault_tolerance or self.router_url else 0.0
        while True:
            await asyncio.sleep(0.5)
            if self._restarting or self.client is None or not self.running:
                continue
            reason = None
            code = self.engine.poll() if self.engine is not None else None
            if code is not None:
                reason = f"engine process exited with code {code}"
            elif cfg.engine.use_fault_tolerance \
                    and self.monotonic() - last_probe >= cfg.engine.rollout_health_check_interval:
                last_probe = self.monotonic()
                # a paused engine does not generate (SGLang reports it unhealthy after 20 s), and one that is
                # loading weights answers /health_generate only when done: then only /health, which SGLang's HTTP
                # server answers at once -- an engine that hangs (or is stopped) mid-update or while paused is still
                # caught, instead of holding the weight sync until its timeout
                quiet = self._engine_paused is not None or self._updating > 0
                try:
                    if quiet:
                        ok = await self.engine_client.health(timeout=cfg.engine.rollout_health_check_timeout)
                    else:
                        ok = await self.engine_client.health_generate(timeout=cfg.engine.rollout_health_check_timeout)
                except RuntimeError:  # the client was closed under us (stopping or restarting)
                    continue
                if not ok and not self._restarting:
                    if quiet:
                        reason = (f"engine failed /health within {cfg.engine.rollout_health_check_timeout}s (while "
                                  f"{'updating weights' if self._updating else 'paused'})")
                    elif self._engine_paused is None and self._updating == 0:
                        reason = f"engine failed /health_generate within {cfg.engine.rollout_health_check_timeout}s"
            if reason:
                await self._recover(reason)
            elif self.router_url and self._engine_ok.is_set() and self.monotonic() - last_router > 10:
                last_router = self.monotonic()  # a restarted router forgets its workers: register again
                try:
                    await self._router_register()
                except Exception as exc:
                    self.log.warning("router registration check failed", error=repr(exc))

    async def _recover(self, reason: str) -> None:
        self._restarting = True
        self._engine_ok.clear()
        self._resumed.clear()  # serve again only once the controller re-synced the new engine and resumes us
        self.engine_restarts += 1
        self.weight_version = -1  # unknown until the new engine is up (it starts from the launch weights)
        self.log.error("engine failed; restarting it", reason=reason, restarts=self.engine_restarts,
                       in_flight=len(self._inflight))   # (groups it was generating: handed back below)
        try:
            # in-flight work cannot finish on this engine: hand it back so the buffer re-issues it
            for t in list(self._inflight.values()):
                t.cancel()
            self._ahead.clear()   # (groups taken ahead, not started: released with the rest)
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
        cfg = self.cfg
        delay = 1.0
        while not await self.engine_client.health_generate(timeout=cfg.engine.rollout_health_check_timeout):
            self.log.warning("external engine still unhealthy", url=self.engine_url)
            await asyncio.sleep(delay)
            delay = min(30.0, delay * 2)

    # ------------------------------------------------------------------------------------------ handlers
    @handler
    async def router_url(self) -> dict:
        """rollout/0: the URL of the sglang-router it started (waits until it is up)."""
        await self._router_ready.wait()
        return {"url": self.router_url}

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


def preimport_engine_path() -> None:
    """Import what a worker's loop runs while its tokenizer thread imports transformers (the engine's health wait
    and connection, the router, the release of a previous incarnation's groups, the user's functions' loader): an
    import on the loop then would wait on the module locks that thread holds, and a loop that waits sends no
    heartbeats (the actor is declared down under load). Each of these is imported lazily elsewhere, so a process
    that never starts an engine does not pay for it."""
    import importlib
    for name in ("aiohttp", "slime_actors.backends.engine_client", "slime_actors.backends.engine_process",
                 "slime_actors.backends.sglang_launch", "slime_actors.backends.listen",
                 "slime_actors.startup_timeline", "slime_actors.plugins", "slime_actors.data",
                 "slime_actors.environments.loading", "concurrent.futures.thread"):
        importlib.import_module(name)
