"""The local engine's HTTP side: SGLang's native endpoints on aiohttp, in the main thread's event loop, in front of
the scheduler thread (scheduler.Engine). Bodies are checked by params.py; the API keys are checked before any
handler runs, by SGLang's rule (engine_auth.py: --api-key for generation and info, --admin-api-key for weight
updates, pause / continue, abort and cache flushes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import traceback
import uuid
from typing import Any, Callable

import torch

from slime_actors import gc_watch
from slime_actors.backends.engine_auth import REDACTED, refusal_status
from slime_actors.json_files import parse_json
from slime_actors.log import get_logger

from .params import SGLANG_API_VERSION, RequestError, parse_generate, validate_struct, validation_error
from .scheduler import Engine, Req, SamplingParams

log = get_logger(component="local_engine")

HEALTH_CHECK_TIMEOUT = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", 20))


def json_response(body: Any, status: int = 200):
    from aiohttp import web
    return web.json_response(body, status=status, dumps=lambda o: json.dumps(o, allow_nan=True))


class Server:
    def __init__(self, engine: Engine, args: argparse.Namespace):
        self.engine, self.args = engine, args
        self.loop: asyncio.AbstractEventLoop | None = None
        self.http_alive_since = time.time()
        self.refused = 0  # requests refused for a missing or wrong key
        # LoRA adapters new requests may name (SGLang's LoRA registry): an adapter joins once loaded and leaves as
        # its unload begins, so a request is never admitted with an adapter on its way out
        self.lora_registry: set[str] = set()

    # -- plumbing --
    def make_app(self):
        from aiohttp import web
        app = web.Application(middlewares=[self.auth_middleware, self.error_middleware],
                              client_max_size=1 << 30)
        r = app.router
        r.add_route("POST", "/generate", self.generate)
        r.add_route("PUT", "/generate", self.generate)
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health_generate)
        r.add_get("/flush_cache", self.flush_cache)
        r.add_post("/flush_cache", self.flush_cache)
        r.add_post("/abort_request", self.abort_request)
        for path, fn in (("/start_profile", self.start_profile), ("/stop_profile", self.stop_profile)):
            r.add_get(path, fn)
            r.add_post(path, fn)
        r.add_post("/pause_generation", self.pause_generation)
        r.add_post("/continue_generation", self.continue_generation)
        r.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        r.add_post("/init_weights_update_group", self.init_weights_update_group)
        r.add_post("/update_weights_from_distributed", self.update_weights_from_distributed)
        r.add_post("/destroy_weights_update_group", self.destroy_weights_update_group)
        r.add_post("/update_weights_from_tensor", self.update_weights_from_tensor)
        r.add_post("/update_weights_from_ipc", self.update_weights_from_ipc)
        r.add_post("/update_weight_version", self.update_weight_version)
        r.add_post("/load_lora_adapter", self.load_lora_adapter)
        r.add_post("/unload_lora_adapter", self.unload_lora_adapter)
        r.add_get("/model_info", self.model_info)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/get_weight_version", self.get_weight_version)
        r.add_get("/weight_version", self.get_weight_version)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_server_info", self.server_info)
        return app

    @property
    def auth_middleware(self):
        """SGLang's key check (engine_auth.refusal_status), before any handler runs: a refused request changes
        nothing."""
        from aiohttp import web

        @web.middleware
        async def mw(request, handler):
            a = self.args
            status = refusal_status(request.method, request.path, request.headers.get("Authorization"),
                                    a.api_key, a.admin_api_key)
            if status is not None:
                self.refused += 1
                return json_response({"error": "Unauthorized"}, status)
            return await handler(request)
        return mw

    @property
    def error_middleware(self):
        from aiohttp import web

        @web.middleware
        async def mw(request, handler):
            try:
                return await handler(request)
            except RequestError as e:
                return json_response(e.body, e.status)
            except web.HTTPException as e:
                if e.status >= 400:
                    return json_response({"object": "error", "message": e.reason, "type": str(e.status),
                                          "param": None, "code": e.status}, e.status)
                raise
            except asyncio.CancelledError:
                raise
            except Exception as e:  # never let one request take the server down
                log.error("handler failed", path=request.path, error=repr(e), tb=traceback.format_exc())
                return json_response({"error": {"message": f"{type(e).__name__}: {e}"}}, 500)
        return mw

    async def body(self, request) -> Any:
        raw = await request.read()
        if not raw:
            raise validation_error("body: Field required")
        try:
            return parse_json(raw)
        except ValueError as e:
            raise validation_error(f"JSON decode error: {e}") from None

    def run_on_scheduler(self, fn: Callable[[], Any], needs_idle: bool = False) -> asyncio.Future:
        fut = self.loop.create_future()

        def done(res, err):
            def set_():
                if fut.done():
                    return
                if err is not None:
                    fut.set_exception(err)
                else:
                    fut.set_result(res)
            self.loop.call_soon_threadsafe(set_)
        self.engine.command(fn, done, needs_idle=needs_idle)
        return fut


    # -- /generate --
    def parse_generate(self, body: Any) -> tuple[list[Req], bool]:
        """The requests of a /generate body (params.parse_generate against this engine's model), and whether it
        was a single one."""
        e = self.engine
        tokenize = None if e.tokenizer is None else (lambda text: e.tokenizer(text)["input_ids"])
        items, single = parse_generate(body, vocab_size=e.vocab_size, context_len=e.context_len, tokenize=tokenize)
        return [Req(**vars(item)) for item in items], single

    async def generate(self, request):
        if not self.engine.alive():
            return json_response({"error": {"message": "engine is shutting down"}}, 503)
        body = await self.body(request)
        reqs, single = self.parse_generate(body)
        self.check_lora_paths(reqs)
        futs = []
        for r in reqs:
            fut = self.loop.create_future()
            r.on_done = (lambda f: (lambda out: self.loop.call_soon_threadsafe(
                lambda: f.done() or f.set_result(out))))(fut)
            futs.append(fut)
        self.engine.submit(reqs)
        try:
            outs = await asyncio.gather(*futs)
        except asyncio.CancelledError:  # client went away: abort what it asked for, like SGLang
            rids = [r.rid for r in reqs]
            self.engine.command(lambda: [self.engine.abort(x, False) for x in rids], lambda *_: None)
            raise
        return json_response(outs[0] if single else outs)

    def check_lora_paths(self, reqs: list[Req]) -> None:
        """Every lora_path names a loaded adapter (SGLang's check, a 400 with its message)."""
        from .params import value_error
        wanted = {r.lora_path for r in reqs if r.lora_path}
        if not wanted:
            return
        if self.engine.adapters is None:
            raise value_error("LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
        missing = sorted(wanted - self.lora_registry)
        if missing:
            raise value_error(f"The following requested LoRA adapters are not loaded: {missing[0]}\n"
                              f"Loaded adapters: {sorted(self.lora_registry)}.")

    # -- LoRA adapters (SGLang's /load_lora_adapter, /unload_lora_adapter: LoRAUpdateOutput answers) --
    def _lora_answer(self, ok: bool, error: str | None, loaded: dict | None = None):
        return json_response({"success": ok, "error_message": error, "loaded_adapters": loaded},
                             200 if ok else 400)

    async def load_lora_adapter(self, request):
        b = validate_struct("LoadLoRAAdapterReqInput", await self.body(request))
        e = self.engine
        if e.adapters is None:
            return self._lora_answer(False, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
        try:
            loaded = await self.run_on_scheduler(lambda: e.adapters.load(b["lora_name"], b["lora_path"],
                                                                         b["pinned"]))
        except Exception as err:  # a bad directory, a name in use, peft's refusal: the engine keeps serving
            log.error("load_lora_adapter failed", name=b["lora_name"], path=b["lora_path"], error=repr(err))
            return self._lora_answer(False, str(err))
        self.lora_registry.add(b["lora_name"])
        log.info("LoRA adapter loaded", name=b["lora_name"], path=b["lora_path"], loaded=sorted(loaded))
        return self._lora_answer(True, None, loaded)

    async def unload_lora_adapter(self, request):
        b = validate_struct("UnloadLoRAAdapterReqInput", await self.body(request))
        e, name = self.engine, b["lora_name"]
        if e.adapters is None:
            return self._lora_answer(False, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
        if name not in self.lora_registry:
            return self._lora_answer(False, f"LoRA with name {name} does not exist. Loaded LoRAs: "
                                            f"{sorted(self.lora_registry)}")
        self.lora_registry.discard(name)   # no new request may use it; those that do finish first (as SGLang)
        while await self.run_on_scheduler(lambda: e.adapter_in_use(name)):
            await asyncio.sleep(0.02)
        try:
            loaded = await self.run_on_scheduler(lambda: e.adapters.unload(name))
        except Exception as err:
            return self._lora_answer(False, str(err))
        log.info("LoRA adapter unloaded", name=name, loaded=sorted(loaded))
        return self._lora_answer(True, None, loaded)

    # -- health --
    async def health(self, request):
        from aiohttp import web
        return web.Response(status=200 if self.engine.alive() else 503)

    async def health_generate(self, request):
        """A 1-token greedy generation must come back within SGLANG_HEALTH_CHECK_TIMEOUT. While paused (no
        generation by design) the scheduler's heartbeat stands in for it."""
        from aiohttp import web
        e = self.engine
        if not e.alive():
            return web.Response(status=503)
        if e.paused or e.running:
            fresh = time.monotonic() - e.heartbeat < HEALTH_CHECK_TIMEOUT
            return web.Response(status=200 if fresh else 503)
        fut = self.loop.create_future()
        r = Req(rid=f"HEALTH_CHECK_{uuid.uuid4().hex}", prompt_ids=[0], internal=True,
                params=SamplingParams(max_new_tokens=1, temperature=1.0, top_k=1))
        r.on_done = lambda out: self.loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(out))
        e.submit([r])
        try:
            await asyncio.wait_for(fut, HEALTH_CHECK_TIMEOUT)
            return web.Response(status=200)
        except asyncio.TimeoutError:
            log.error("health check failed: no generation within timeout", timeout=HEALTH_CHECK_TIMEOUT)
            return web.Response(status=503)

    # -- control --
    async def flush_cache(self, request):
        from aiohttp import web
        ok = await self.run_on_scheduler(self.engine.flush)
        if ok:
            return web.Response(text="Cache flushed.\nPlease check backend logs for more details. (When there are "
                                     "running or waiting requests, the operation will not be performed.)\n")
        return web.Response(status=400, text="Cache not flushed because there are pending requests.\n")

    async def start_profile(self, request):
        """SGLang's /start_profile (ProfileReqInput): the torch profiler on the scheduler thread, for num_steps
        steps or until /stop_profile; traces go to output_dir (default $SGLANG_TORCH_PROFILER_DIR, else /tmp)."""
        from aiohttp import web
        raw = await request.read()
        try:
            b = parse_json(raw) if raw.strip() else {}
        except ValueError as e:
            raise validation_error(f"JSON decode error: {e}") from None
        if not isinstance(b, dict):
            raise validation_error("body: Input should be a valid dictionary")
        unknown = sorted(set(b) - PROFILE_FIELDS)
        if unknown:
            raise validation_error(f"Unexpected keyword argument {unknown[0]!r} in ProfileReqInput")
        out = b.get("output_dir") or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
        err = await self.run_on_scheduler(lambda: self.engine.start_profile(
            str(out), b.get("num_steps"), b.get("activities"), bool(b.get("record_shapes")),
            bool(b.get("with_stack")), b.get("profile_prefix")))
        if err:
            return web.Response(status=400, text=err + "\n")
        return web.Response(text="Start profiling.\n")

    async def stop_profile(self, request):
        from aiohttp import web
        err = await self.run_on_scheduler(self.engine.stop_profile)
        if err:
            return web.Response(status=400, text=err + "\n")
        return web.Response(text="Stop profiling. This will take some time.\n")

    async def abort_request(self, request):
        from aiohttp import web
        b = validate_struct("AbortReq", await self.body(request))
        rid, abort_all, msg = b["rid"] or "", b["abort_all"], b["abort_message"]
        await self.run_on_scheduler(lambda: self.engine.abort_from_http(rid, abort_all, msg))
        return web.Response(status=200)

    async def pause_generation(self, request):
        b = validate_struct("PauseGenerationReqInput", await self.body(request))
        await self.run_on_scheduler(lambda: self.engine.pause(b["mode"]))
        log.info("generation paused", mode=b["mode"])
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request):
        validate_struct("ContinueGenerationReqInput", await self.body(request))
        await self.run_on_scheduler(self.engine.resume)
        log.info("generation continued")
        return json_response({"message": "Generation continued successfully.", "status": "ok"})

    def _abort_all_first(self, b: dict) -> None:
        if b.get("abort_all_requests"):
            self.engine.command(lambda: self.engine.abort(None, True), lambda *_: None)

    async def update_weights_from_disk(self, request):
        b = validate_struct("UpdateWeightFromDiskReqInput", await self.body(request))
        e = self.engine
        if b["load_format"] not in (None, "auto", "safetensors"):
            return json_response({"success": False, "message": f"load_format {b['load_format']!r} is not supported "
                                  "by the local engine (auto / safetensors)", "num_paused_requests": 0}, 400)
        self._abort_all_first(b)

        def load():
            from slime_actors.backends.weight_sync import load_weights_from_disk
            n = e.load_named_weights(list(load_weights_from_disk(b["model_path"])))
            e.model_path = b["model_path"]
            if b["weight_version"] is not None:
                e.weight_version = b["weight_version"]
            return n
        try:
            n = await self.run_on_scheduler(load, needs_idle=True)
        except Exception as err:
            log.error("update_weights_from_disk failed", error=repr(err))
            return json_response({"success": False, "message": f"Failed to update weights: {err}.",
                                  "num_paused_requests": 0}, 400)
        msg = "Succeeded to update model weights."
        if b["weight_version"] is not None:
            msg += f" Weight version updated to {b['weight_version']}."
        log.info("weights updated from disk", path=b["model_path"], tensors=n, weight_version=e.weight_version)
        return json_response({"success": True, "message": msg, "num_paused_requests": 0})

    async def init_weights_update_group(self, request):
        b = validate_struct("InitWeightsUpdateGroupReqInput", await self.body(request))
        from slime_actors.backends.weight_sync import init_weights_update_group
        e = self.engine
        backend = b["backend"]
        if e.device.type == "cpu" and backend == "nccl":
            return json_response({"success": False, "message": "Failed to initialize custom process group: backend "
                                  "nccl needs a CUDA device; this engine runs on cpu (use backend gloo)."}, 400)
        with e.groups_lock:
            if b["group_name"] in e.groups:
                return json_response({"success": False, "message": f"Failed to initialize custom process group: "
                                      f"group {b['group_name']!r} already exists."}, 400)
        try:
            pg = await asyncio.to_thread(init_weights_update_group, b["master_address"], b["master_port"],
                                         b["rank_offset"], b["world_size"], b["group_name"], backend)
        except Exception as err:
            log.error("init_weights_update_group failed", error=repr(err))
            return json_response({"success": False,
                                  "message": f"Failed to initialize custom process group: {err}."}, 400)
        with e.groups_lock:
            e.groups[b["group_name"]] = (pg, backend)
        return json_response({"success": True, "message": "Succeeded to initialize custom process group."})

    async def destroy_weights_update_group(self, request):
        b = validate_struct("DestroyWeightsUpdateGroupReqInput", await self.body(request))
        from slime_actors.backends.weight_sync import destroy_weights_update_group
        e = self.engine
        with e.groups_lock:
            pg, _ = e.groups.pop(b["group_name"], (None, None))
            e.receivers.pop(b["group_name"], None)
        if pg is None:
            return json_response({"success": False, "message": "The group to be destroyed does not exist."}, 400)
        try:  # not on the scheduler: with NCCL the destroy waits for the trainer's side to destroy too
            await asyncio.to_thread(destroy_weights_update_group, pg)
        except Exception as err:
            return json_response({"success": False, "message": f"Failed to destroy custom process group: {err}."},
                                 400)
        return json_response({"success": True, "message": "Succeeded to destroy custom process group."})

    async def update_weights_from_distributed(self, request):
        b = validate_struct("UpdateWeightsFromDistributedReqInput", await self.body(request))
        from slime_actors.backends.weight_sync import dtype_from_name
        e = self.engine
        names, dtypes, shapes = b["names"], b["dtypes"], b["shapes"]
        if not (len(names) == len(dtypes) == len(shapes)):
            return json_response({"success": False, "message": "names, dtypes and shapes differ in length"}, 400)
        with e.groups_lock:
            pg, _ = e.groups.get(b["group_name"], (None, None))
        if pg is None:
            return json_response({"success": False, "message": f"Group {b['group_name']} not in "
                                  f"{list(e.groups)}. Please call `init_weights_update_group` first."}, 400)
        try:
            tdtypes = [dtype_from_name(d) for d in dtypes]
        except ValueError as err:
            return json_response({"success": False, "message": f"Failed to update parameter online: {err}."}, 400)
        if b["load_format"] not in (None, "flattened_bucket"):
            return json_response({"success": False, "message": f"load_format {b['load_format']!r} is not supported "
                                  "by the local engine (None or 'flattened_bucket')"}, 400)
        self._abort_all_first(b)

        def recv():
            n = e.receive_weights(b["group_name"], names, tdtypes, shapes, b["load_format"] == "flattened_bucket")
            if b["weight_version"] is not None:
                e.weight_version = b["weight_version"]
            return n
        try:
            n = await self.run_on_scheduler(recv, needs_idle=True)
        except Exception as err:
            log.error("update_weights_from_distributed failed", error=repr(err))
            return json_response({"success": False, "message": f"Failed to update parameter online: {err}. The full "
                                  "weights of the ModelRunner are partially updated. Please discard the whole "
                                  "weights."}, 400)
        msg = "Succeeded to update parameter online."
        if b["weight_version"] is not None:
            msg += f" Weight version updated to {b['weight_version']}."
        log.info("weights updated from distributed", tensors=n, weight_version=e.weight_version)
        return json_response({"success": True, "message": msg})

    async def update_weights_from_ipc(self, request):
        """Colocated update (this engine's own endpoint, not SGLang's): one flattened bucket in the trainer's memory,
        named by a CUDA IPC handle (GPU) or a shared-memory file (CPU) -- weight_sync.share_bucket. The tensors are
        copied into the model before the answer; the trainer frees the bucket after it."""
        b = validate_struct("UpdateWeightsFromIPCReqInput", await self.body(request))
        from slime_actors.backends.weight_sync import bucket_nbytes, dtype_from_name, open_shared_bucket, \
            unflatten_bucket
        e = self.engine
        names, dtypes, shapes, handle = b["names"], b["dtypes"], b["shapes"], b["handle"]
        if not (len(names) == len(dtypes) == len(shapes)):
            return json_response({"success": False, "message": "names, dtypes and shapes differ in length"}, 400)
        try:
            tdtypes = [dtype_from_name(d) for d in dtypes]
            if bucket_nbytes(tdtypes, shapes) != int(handle["numel"]):
                raise ValueError(f"the bucket has {handle['numel']} bytes, the tensors "
                                 f"{bucket_nbytes(tdtypes, shapes)}")
        except ValueError as err:
            return json_response({"success": False, "message": f"Failed to update weights: {err}."}, 400)
        self._abort_all_first(b)

        def load():
            flat = open_shared_bucket(handle, e.device)
            named = unflatten_bucket(flat, names, tdtypes, shapes)
            n = e.load_named_weights(named)
            if e.device.type == "cuda":
                torch.cuda.synchronize(e.device)  # copied before the trainer may free its memory
            del named, flat
            if b["weight_version"] is not None:
                e.weight_version = b["weight_version"]
            return n
        try:
            n = await self.run_on_scheduler(load, needs_idle=True)
        except Exception as err:
            log.error("update_weights_from_ipc failed", error=repr(err))
            return json_response({"success": False, "message": f"Failed to update weights: {err}."}, 400)
        msg = "Succeeded to update model weights."
        if b["weight_version"] is not None:
            msg += f" Weight version updated to {b['weight_version']}."
        log.info("weights updated from ipc", tensors=n, kind=handle.get("kind"), weight_version=e.weight_version)
        return json_response({"success": True, "message": msg})

    async def update_weights_from_tensor(self, request):
        validate_struct("UpdateWeightsFromTensorReqInput", await self.body(request))
        return json_response({"success": False, "message": "update_weights_from_tensor is not supported by the local "
                              "engine: its payload is SGLang's pickled MultiprocessingSerializer format"}, 400)

    async def update_weight_version(self, request):
        b = validate_struct("UpdateWeightVersionReqInput", await self.body(request))
        self._abort_all_first(b)
        self.engine.weight_version = b["new_version"]
        return json_response({"success": True, "message": f"Weight version updated to {b['new_version']}",
                              "new_version": b["new_version"]})

    # -- info --
    async def model_info(self, request):
        e = self.engine
        return json_response({
            "model_path": e.model_path, "tokenizer_path": self.args.tokenizer_path, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": e.weight_version,
            "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": getattr(e.config, "model_type", None),
            "architectures": getattr(e.config, "architectures", None)})

    async def get_weight_version(self, request):
        # SGLang 0.5.15.post1 answers 404 here (deprecated); the weight version is in /model_info.
        return json_response({"object": "error", "message": "Endpoint '/get_weight_version' or '/weight_version' is "
                              "deprecated. Please use '/model_info' instead.", "type": "404", "param": None,
                              "code": 404}, 404)

    async def server_info(self, request):
        e, a = self.engine, self.args
        return json_response({"model_path": e.model_path, "tokenizer_path": a.tokenizer_path, "host": a.host,
                              "port": a.port, "tp_size": 1, "dtype": a.dtype, "device": str(e.device),
                              "max_running_requests": e.max_running, "context_length": e.context_len,
                              "random_seed": a.random_seed, "weight_version": e.weight_version,
                              "enable_lora": e.adapters is not None, "max_lora_rank": a.max_lora_rank,
                              "lora_target_modules": a.lora_target_modules,
                              # SGLang answers its keys here, in clear; the local engine only whether it has them
                              "api_key": REDACTED if a.api_key else None,
                              "admin_api_key": REDACTED if a.admin_api_key else None,
                              "refused_requests": self.refused,
                              "version": f"slime-actors local engine (SGLang API {SGLANG_API_VERSION})",
                              "internal_states": [{"paused": e.paused, "running": len(e.running),
                                                   "waiting": len(e.waiting), "steps": e.steps}]})



async def serve(args: argparse.Namespace) -> None:
    from aiohttp import web
    engine = await asyncio.to_thread(Engine, args)
    engine.start()
    server = Server(engine, args)
    server.loop = asyncio.get_running_loop()
    runner = web.AppRunner(server.make_app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, reuse_address=True)
    await site.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        server.loop.add_signal_handler(sig, stop.set)
    settled = gc_watch.settle(log)   # (what start-up built, frozen before it is ready: slime_actors/gc_watch.py)
    log.info("local engine ready", url=f"http://{args.host}:{args.port}", model=args.model_path,
             device=str(engine.device), dtype=str(engine.dtype), max_running_requests=engine.max_running,
             weight_version=engine.weight_version, mem_fraction_static=args.mem_fraction_static,
             ignored_sglang_flags=args.ignored_flags or None, gc_frozen=settled["frozen"] if settled else None)
    print(f"The server is fired up and ready to roll! (local engine at http://{args.host}:{args.port})",
          file=sys.stderr, flush=True)
    await stop.wait()
    log.info("local engine stopping")
    await asyncio.to_thread(engine.stop)  # in-flight requests come back aborted, then the HTTP side closes
    await runner.cleanup()


# SGLang 0.5.15.post1's ProfileReqInput fields (io_struct.py)
PROFILE_FIELDS = frozenset(("output_dir", "start_step", "num_steps", "activities", "profile_by_stage", "with_stack",
                            "record_shapes", "merge_profiles", "profile_prefix", "profile_stages", "rid"))
