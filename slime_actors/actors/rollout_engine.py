"""A rollout worker's engine, supervised: its start (the local engine or SGLang, or an external one), the
sglang-router, the watch that restarts an engine whose process exits or (with --use-fault-tolerance) fails
`/health_generate`, the engine's pauses, and its weight updates. `EngineSupervisor` is the part of `RolloutWorker`
(actors/rollout.py) that does this; generation (actors/rollout_generate.py) reaches the engine through `self.client`.

What an engine tells the worker -- its port and pid at launch, its exit codes, its answers -- is recorded in the
worker's trace (`RecordedProcess`, `RecordedEngine`), so `slime-actors replay` runs this same code with no engine.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import time

from typing import TYPE_CHECKING, Any

from ..backends.engine_auth import EngineKeys
from ..environments.episode import int_version
from ..mailbox.errors import MailboxError
from ..role_handles import BufferHandle, ControllerHandle, RolloutHandle
from .base import Actor, handler

if TYPE_CHECKING:
    from ..backends.engine_client import EngineClient


def request_key(input_ids: list[int], sampling_params: dict) -> str:
    """Which request an engine answer belongs to (answers to concurrent requests come back in any order)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(repr((list(input_ids), sorted(sampling_params.items()))).encode())
    return h.hexdigest()


class EngineSupervisor(Actor):
    """The engine half of a rollout worker (RolloutWorker derives from it): its state is set by
    `_init_engine_state`, its handlers are the worker's."""

    # the worker's (actors/rollout.py), used here
    buffer: BufferHandle
    controller: ControllerHandle
    _inflight: dict[str, asyncio.Task]

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

    @property
    def engine_client(self) -> RecordedEngine:
        """The engine's client; a RuntimeError before there is one (the engine has not started)."""
        if self.client is None:
            raise RuntimeError(f"{self.name}: its engine has not started")
        return self.client

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
        cfg = self.cfg
        if cfg.engine.rollout_external_engine_addrs:
            addrs = cfg.engine.rollout_external_engine_addrs
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
                module, flags, env=self._engine_env(), log_path=log_path, wait=False, on_line=self._engine_line,
                redact=self.keys.secrets))
            await self.recorded_async("engine.wait_healthy", self.run_blocking, self.engine.wait_healthy,
                                      cfg.engine.rollout_health_check_first_wait + 600)
            url = _http_url(self.engine.host, port)
            self.log.info("engine up", module=module, url=url, pid=self.engine.pid,
                          seconds=round(time.monotonic() - t0, 1))
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
            self.router_url = _http_url(host, port)
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
        cfg = self.cfg
        delay = 1.0
        while not await self.engine_client.health_generate(timeout=cfg.engine.rollout_health_check_timeout):
            self.log.warning("external engine still unhealthy", url=self.engine_url)
            await asyncio.sleep(delay)
            delay = min(30.0, delay * 2)

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
                await self.engine_client.continue_generation()
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
                await self.engine_client.pause_generation(mode)
                self._engine_paused = mode
                self.log.info("engine paused", mode=mode, in_flight=n)
            return {"in_flight": n, "mode": self._engine_paused or mode}

    @handler
    async def init_weights_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                 group_name: str, backend: str) -> dict:
        await self._engine_ok.wait()
        self._updating += 1
        try:
            res = await self.engine_client.init_weights_update_group(master_address, master_port, rank_offset,
                                                                     world_size, group_name, backend)
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
        return await self._update(weight_version, lambda: self.engine_client.update_weights_from_distributed(
            names, dtypes, shapes, group_name, weight_version=str(weight_version), flush_cache=self._flush(flush_cache),
            load_format=load_format))

    @handler
    async def destroy_weights_group(self, group_name: str) -> None:
        await self.engine_client.destroy_weights_update_group(group_name)

    @handler
    async def update_weights_from_disk(self, model_path: str, weight_version: int) -> dict:
        await self._engine_ok.wait()
        return await self._update(weight_version, lambda: self.engine_client.update_weights_from_disk(
            model_path, weight_version=str(weight_version), flush_cache=self._flush(True)))

    @handler
    async def load_lora_adapter(self, weight_version: int, tensors: dict, config: dict) -> dict:
        """--lora-sync adapter (weight_sync.WeightPusher): the trainer's LoRA adapters for `weight_version`, written
        as a PEFT adapter directory under RUN_DIR/lora/, loaded into the engine as "v<version>" and named by every
        generation from then on; the engine's weight version moves with it. The adapter before stays loaded (a
        request paused in place may still use it); older ones are unloaded."""
        from ..backends.engine_client import EngineError
        from ..backends.lora import write_adapter_dir
        await self._engine_ok.wait()
        name, loaded = f"v{weight_version}", self._lora_loaded
        base = os.path.join(self.runtime.run_dir, "lora", self.name.replace("/", "-"))
        # (a replay takes the same step without writing: the recording kept the tensors' checksums only)
        await self.run_blocking(write_adapter_dir if not self.replaying else lambda *_: None,
                                os.path.join(base, name), tensors, config)

        async def call():
            if name in loaded:   # a retried sync of this version
                await self.engine_client.unload_lora_adapter(name)
                loaded.remove(name)
            await self.engine_client.load_lora_adapter(name, os.path.join(base, name))
            loaded.append(name)
            return await self.engine_client.update_weight_version(str(weight_version))
        await self._update(weight_version, call)
        self.engine_client.unwrapped.lora_path = name
        while len(loaded) > 2:
            old = loaded.pop(0)
            try:
                await self.engine_client.unload_lora_adapter(old)
            except EngineError as exc:
                self.log.warning("could not unload an old LoRA adapter", adapter=old, error=str(exc))
            if not self.replaying:
                shutil.rmtree(os.path.join(base, old), ignore_errors=True)
        return {"lora_name": name, "loaded": list(loaded)}

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
    close; not generate, which `Generation.raw` (rollout_generate.py) records parsed) are recorded in the trace as `<prefix>.<method>`, and
    under replay served from it."""

    _LOCAL = frozenset(("generate",))

    def __init__(self, actor: Actor, client: Any, prefix: str = "engine"):
        self._actor, self._client, self._prefix = actor, client, prefix

    @property
    def unwrapped(self) -> Any:
        """The client itself (EngineClient, RouterClient; a test's stand-in)."""
        return self._client

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
        self._actor, self._name = actor, name
        self._proc: Any = None   # the EngineProcess (backends/engine_process.py); None under replay

        def start() -> dict:
            self._proc = launch()
            return {"pid": self._proc.pid, "host": self._proc.host}
        info = actor.recorded(f"{name}.launch", start)
        self.pid, self.host = info["pid"], info["host"]

    def poll(self) -> int | None:
        proc = self._proc   # (under replay None: the recorded answer is served, the lambda not called)
        return self._actor.recorded(f"{self._name}.poll", lambda: proc.poll() if proc is not None else None)

    def wait_healthy(self, timeout: float) -> None:
        if self._proc is not None:
            self._proc.wait_healthy(timeout)

    def stop(self, *args) -> None:
        if self._proc is not None:
            self._proc.stop(*args)

    def signal(self, sig: int) -> None:
        if self._proc is not None:
            os.kill(self._proc.pid, sig)


def _http_url(host: str, port: int) -> str:
    """The URL a server listening on `host` is reached at from this host (a wildcard: the loopback)."""
    if host in ("0.0.0.0", "", "*", "::", "[::]"):
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6
    return f"http://{host}:{int(port)}"


def _load_tokenizer(path: str):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path)

