"""Async HTTP client for a generation engine speaking SGLang's native API: a real SGLang server (checked against
SGLang 0.5.15.post1, tests/data/sglang_api_0.5.15.post1.json) or the embedded local engine.

    client = EngineClient("http://127.0.0.1:30000", keys=EngineKeys(api_key, admin_key), timeout=600,
                          max_concurrency=256)
    raw = await client.generate(input_ids, {"max_new_tokens": 64, "temperature": 1.0}, return_logprob=True)
    out = parse_generate_output(raw)      # output_ids, logprobs, finish_reason, weight_version, ...
    await client.close()

Every request carries the key SGLang wants for its endpoint (`Authorization: Bearer`): the admin key on weight
updates, pause / continue, abort and cache flushes, the API key everywhere else (engine_auth.py). /server_info
answers come back without the secrets SGLang puts in them. Every request body uses only SGLang's field names for
that endpoint. Errors: a non-2xx answer raises EngineError
(status, endpoint, the server's message); an engine that cannot be reached raises EngineUnavailable; a request that
runs past its timeout raises EngineTimeout (also an EngineError). Answers are read with a bound (http_answers.py):
`max_answer_bytes` (1 GiB) for /generate -- a batch of 64 responses of 32k tokens with their log-probs is ~100 MB --
and 16 MiB for the rest (a health check, an abort, /server_info: a few KB); past it an EngineError, read no further,
so an engine behind `--engine-url` that answers without end does not fill the rollout worker's memory.
/generate answers are parsed one per turn of the event loop (`answer_turns`, loop_turns.py): answers that come back
together are handled one after another with the loop's other work -- replies to read -- between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from slime_actors.backends.engine_auth import EngineKeys, redact_server_info
from slime_actors.http_answers import AnswerTooLarge, read_answer
from slime_actors.json_files import parse_json
from slime_actors.log import get_logger
from slime_actors.loop_turns import LoopTurns

log = get_logger(component="engine_client")

DEFAULT_GROUP_NAME = "weight_update_group"


class EngineError(RuntimeError):
    """The engine answered with an error status (or an answer that is not what the endpoint promises)."""

    def __init__(self, endpoint: str, status: int | None, message: str, body: Any = None):
        self.endpoint, self.status, self.message, self.body = endpoint, status, message, body
        super().__init__(f"{endpoint}: HTTP {status}: {message}" if status is not None else f"{endpoint}: {message}")


class EngineUnavailable(EngineError):
    """Connection refused / reset / server gone: the engine process is not (or no longer) serving."""


class EngineTimeout(EngineError):
    """The request took longer than its timeout."""


class EngineAnswerTooLarge(EngineError):
    """An answer over the client's bound, read no further: the engine's doing, and it would do it again."""


def _server_message(body: Any, text: str) -> str:
    """Pull the human message out of SGLang's error shapes: {"error": {"message"}}, {"error": str},
    {"message": ...} (ErrorResponse / success=false answers), or plain text."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
        if "message" in body:
            return str(body["message"])
        if body.get("error_message"):   # SGLang's LoRAUpdateOutput
            return str(body["error_message"])
        if "detail" in body:
            return str(body["detail"])
    return (text or "").strip()[:2000] or "(empty body)"


@dataclass
class GenerateOutput:
    output_ids: list[int]
    logprobs: list[float] | None
    finish_reason: dict
    weight_version: str | None
    prompt_tokens: int | None
    completion_tokens: int
    text: str | None = None
    rid: str | None = None
    e2e_latency: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def finish_type(self) -> str:
        return self.finish_reason.get("type", "unknown")

    @property
    def aborted(self) -> bool:
        return self.finish_type == "abort"

    @property
    def truncated(self) -> bool:
        return self.finish_type == "length"


_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)


def _dumps(body: Any) -> bytes:
    """A request's JSON body: orjson where it can (what json writes as NaN or Infinity, orjson writes as null; a
    request body holds none), else json (a type orjson does not take: json raises as aiohttp's json= did)."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return json.dumps(body).encode()


def _loads(raw: bytes) -> Any:
    """An engine's JSON answer. orjson parses a batched /generate answer (8 answers of 190 tokens with their
    log-prob triples, 68 KB) in 0.28 ms against json's 0.68 (2-vCPU VM): a rollout worker parses one per group, and
    the last groups of a rollout arrive together. NaN and Infinity -- Python's json writes them, orjson refuses
    them -- go to json. A ValueError when neither parses it (also when nested too deep for either)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return parse_json(raw)


def parse_generate_output(resp: dict) -> GenerateOutput:
    """One /generate answer (one element of a batched answer) -> GenerateOutput.

    Token ids come from meta_info.output_token_logprobs ([logprob, token_id, text]) when present (what slime uses),
    else from output_ids; the two must agree when both are there."""
    if not isinstance(resp, dict) or "meta_info" not in resp:
        raise EngineError("/generate", None, f"malformed generate output: {str(resp)[:300]}")
    meta = resp["meta_info"]
    lp_triples = meta.get("output_token_logprobs")
    ids = resp.get("output_ids")
    logprobs = None
    if lp_triples is not None:
        # (map with itemgetter: ~3x faster than a comprehension over the triples, for 8 answers of 190 tokens
        # ~0.2 ms a group on a 2-vCPU VM; a rollout's last groups are handled one after another)
        first = list(map(_FIRST, lp_triples))
        logprobs = list(map(float, first)) if None not in first else \
            [float(x) if x is not None else float("nan") for x in first]
        lp_ids = list(map(int, map(_SECOND, lp_triples)))
        if ids is not None and list(ids) != lp_ids:
            raise EngineError("/generate", None, f"output_ids and output_token_logprobs disagree "
                                                 f"({len(ids)} vs {len(lp_ids)} tokens)")
        output_ids = lp_ids
    elif ids is None:
        raise EngineError("/generate", None, "generate output has neither output_ids nor output_token_logprobs")
    else:
        output_ids = list(map(int, ids))
    finish = meta.get("finish_reason") or {"type": "unknown"}
    if isinstance(finish, str):  # defensive: some front ends flatten it
        finish = {"type": finish}
    completion = meta.get("completion_tokens")
    return GenerateOutput(
        output_ids=output_ids, logprobs=logprobs, finish_reason=dict(finish),
        weight_version=meta.get("weight_version"), prompt_tokens=meta.get("prompt_tokens"),
        completion_tokens=int(completion) if completion is not None else len(output_ids), text=resp.get("text"),
        rid=meta.get("id"), e2e_latency=meta.get("e2e_latency"))


def _dtype_str(d: Any) -> str:
    return str(d).removeprefix("torch.")


# How long an idle connection to an engine is kept for reuse: shorter than the server keeps it. SGLang's uvicorn
# closes a connection idle for 5 s (SGLANG_TIMEOUT_KEEP_ALIVE, uvicorn's default too); a request sent on one just as
# the server closes it fails with "Server disconnected" -- on one H100 it failed a group of the first rollout after
# the first weight sync (the rollout connections idle for exactly that long), and the group was generated again.
KEEPALIVE_S = 3.0
GENERATE_MAX_ANSWER_BYTES = 1 << 30
CONTROL_MAX_ANSWER_BYTES = 16 << 20


class EngineClient:
    """One engine's HTTP API. Create and use it inside one event loop; close() when done. Idle connections are
    reused for `keepalive` seconds (KEEPALIVE_S)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 600.0,
                 max_concurrency: int = 256, connect_timeout: float = 10.0, admin_key: str | None = None,
                 keys: EngineKeys | None = None, keepalive: float | None = None,
                 max_answer_bytes: int = GENERATE_MAX_ANSWER_BYTES):
        self.base_url = base_url.rstrip("/")
        if "://" not in self.base_url:
            self.base_url = "http://" + self.base_url
        self.keys = (keys or EngineKeys()).fill(EngineKeys(api_key, admin_key))
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self.max_concurrency, self.max_answer_bytes = max_concurrency, max_answer_bytes
        self.keepalive = KEEPALIVE_S if keepalive is None else keepalive
        self._sem: asyncio.Semaphore | None = None
        self._session: aiohttp.ClientSession | None = None      # /generate: at most max_concurrency at once
        self._control: aiohttp.ClientSession | None = None      # everything else: never queued behind generation
        self.request_hook = None  # callable(method, path, json_body, params) -- used by the contract tests
        # where /generate goes: this engine, or an sglang-router in front of several (control stays here)
        self.generate_base_url: str | None = None
        # the LoRA adapter (its name on the engine) every /generate uses unless its body names one; None: the base
        self.lora_path: str | None = None
        # /generate answers are parsed one per turn of the event loop (loop_turns.py): a rollout's last groups come back
        # together, and what the worker does with each answer -- parse, record, decode, send it to scoring -- runs in
        # the task that asked, right after this; replies read between two answers are then taken between them
        self.answer_turns = LoopTurns()

    # -- plumbing ---------------------------------------------------------------------------------------
    @property
    def api_key(self) -> str | None:
        return self.keys.api_key

    def _headers(self, path: str, admin: bool | None = None) -> dict:
        if admin is None:
            return self.keys.headers_for(path)
        key = (self.keys.admin_key or self.keys.api_key) if admin else self.keys.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._sem = asyncio.Semaphore(self.max_concurrency)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_concurrency, force_close=False,
                                               keepalive_timeout=self.keepalive))
        return self._session

    async def _get_control_session(self) -> aiohttp.ClientSession:
        """Health probes, pauses, aborts and weight updates get their own connections: a health probe must not wait
        behind max_concurrency hung generations (it would never time out), nor an abort behind what it aborts."""
        if self._control is None or self._control.closed:
            self._control = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                limit=32, force_close=False, keepalive_timeout=self.keepalive))
        return self._control

    async def _request(self, method: str, path: str, body: Any = None, params: dict | None = None,
                       timeout: float | None = None, expect: str = "json", ok_statuses: Sequence[int] = (),
                       base_url: str | None = None, admin: bool | None = None) -> Any:
        """Send one request; returns (status, parsed body). Raises EngineError / EngineUnavailable / EngineTimeout.
        The key is the one `path` needs (engine_auth), or the admin key / API key where `admin` says so."""
        if self.request_hook is not None:
            self.request_hook(method, path, body, params)
        base = (base_url or self.base_url).rstrip("/")
        generation = path == "/generate"
        session = await (self._get_session() if generation else self._get_control_session())
        t = self.timeout if timeout is None else timeout
        to = aiohttp.ClientTimeout(total=t, connect=min(self.connect_timeout, t) if t else self.connect_timeout)
        headers = self._headers(path, admin)
        data = None
        if body is not None:   # (as aiohttp's json= would send it, ~30 us a group's request sooner: orjson)
            data, headers = _dumps(body), {**headers, "Content-Type": "application/json"}
        async with (self._sem if generation else contextlib.nullcontext()):
            try:
                async with session.request(method, base + path, data=data, params=params, timeout=to,
                                           headers=headers) as resp:
                    status = resp.status
                    raw = await read_answer(resp, self.max_answer_bytes if generation else CONTROL_MAX_ANSWER_BYTES)
            except AnswerTooLarge as exc:
                raise EngineAnswerTooLarge(path, exc.status, f"an answer of more than {exc.limit:,} bytes, read no "
                                           "further (not an engine's answer to this request)") from None
            except asyncio.TimeoutError:
                raise EngineTimeout(path, None, f"no answer within {t} s from {base}") from None
            except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError,
                    aiohttp.ClientOSError) as e:
                raise EngineUnavailable(path, None, f"cannot reach {base}: {e}") from None
            except aiohttp.ClientError as e:
                raise EngineError(path, None, f"request failed: {e!r}") from None
        parsed: Any = None
        if generation:
            await self.answer_turns.take()
        if raw:
            try:
                parsed = _loads(raw)
            except ValueError:
                parsed = None
        if not (200 <= status < 300) and status not in ok_statuses:
            text = raw.decode("utf-8", "replace")
            raise EngineError(path, status, _server_message(parsed, text), parsed if parsed is not None else text)
        if expect == "json":
            if parsed is None:
                raise EngineError(path, status, f"expected JSON, got {raw[:200].decode('utf-8', 'replace')!r}")
            return status, parsed
        return status, raw.decode("utf-8", "replace")

    async def _post_result(self, path: str, body: dict, timeout: float | None = None) -> dict:
        """POST to an endpoint answering {"success", "message", ...}; success=false raises EngineError."""
        status, out = await self._request("POST", path, body, timeout=timeout, ok_statuses=(400,))
        if not isinstance(out, dict) or not out.get("success", False):
            raise EngineError(path, status, _server_message(out, str(out)), out)
        return out

    async def close(self) -> None:
        for sess in (self._session, self._control):
            if sess is not None and not sess.closed:
                await sess.close()
        self._session = self._control = None

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    # -- generation -------------------------------------------------------------------------------------
    async def generate(self, input_ids: list[int] | list[list[int]], sampling_params: dict | list[dict],
                       return_logprob: bool = True, rid: str | list[str] | None = None,
                       timeout: float | None = None, **extra) -> dict | list[dict]:
        """POST /generate; returns SGLang's raw answer (a list for batched input_ids). `extra` may carry other
        GenerateReqInput fields (e.g. logprob_start_len, return_text_in_logprobs)."""
        body: dict[str, Any] = {"input_ids": input_ids, "sampling_params": sampling_params,
                                "return_logprob": return_logprob}
        if rid is not None:
            body["rid"] = rid
        if self.lora_path is not None:
            body["lora_path"] = self.lora_path
        body.update(extra)
        _, out = await self._request("POST", "/generate", body, timeout=timeout, base_url=self.generate_base_url)
        return out

    async def generate_body(self, body: dict, timeout: float | None = None) -> tuple[int, Any]:
        """POST /generate with `body` as given (SGLang's GenerateReqInput: input_ids or text, sampling_params,
        ...): (status, answer). A 4xx answer is returned, not raised (backends/generate_proxy.py passes it on).
        The client's LoRA adapter goes in unless the body names one."""
        if self.lora_path is not None and body.get("lora_path") is None:
            body = {**body, "lora_path": self.lora_path}
        return await self._request("POST", "/generate", body, timeout=timeout, base_url=self.generate_base_url,
                                   ok_statuses=range(400, 500))

    # -- health -----------------------------------------------------------------------------------------
    async def health(self, timeout: float = 5.0) -> bool:
        try:
            await self._request("GET", "/health", timeout=timeout, expect="text")
            return True
        except EngineError:
            return False

    async def health_generate(self, timeout: float = 30.0) -> bool:
        try:
            await self._request("GET", "/health_generate", timeout=timeout, expect="text")
            return True
        except EngineError:
            return False

    # -- control ----------------------------------------------------------------------------------------
    async def flush_cache(self) -> bool:
        """True when flushed; False when the engine refused because requests are running or waiting (400)."""
        status, _ = await self._request("POST", "/flush_cache", expect="text", ok_statuses=(400,))
        return status == 200

    async def start_profile(self, output_dir: str, num_steps: int | None = None, activities: list[str] | None = None,
                            record_shapes: bool = True) -> None:
        """SGLang's POST /start_profile: the engine's torch profiler, its traces written to `output_dir` (a path on
        the engine's host) when /stop_profile comes, or after num_steps steps."""
        body: dict[str, Any] = {"output_dir": output_dir, "record_shapes": record_shapes}
        if num_steps is not None:
            body["num_steps"] = num_steps
        if activities is not None:
            body["activities"] = activities
        await self._request("POST", "/start_profile", body, expect="text")

    async def stop_profile(self) -> None:
        await self._request("POST", "/stop_profile", {}, expect="text")

    async def abort_request(self, rid: str | None = None, abort_all: bool = False) -> None:
        """Abort requests whose rid starts with `rid` (SGLang matches by prefix), or all of them."""
        await self._request("POST", "/abort_request", {"rid": rid or "", "abort_all": bool(abort_all)},
                            expect="text")

    async def pause_generation(self, mode: str = "abort") -> dict:
        """mode: "abort" (abort in-flight requests; SGLang's default), "in_place" or "retract"."""
        _, out = await self._request("POST", "/pause_generation", {"mode": mode})
        return out

    async def continue_generation(self) -> dict:
        _, out = await self._request("POST", "/continue_generation", {})
        return out

    # -- weights ----------------------------------------------------------------------------------------
    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None,
                                       load_format: str | None = None, abort_all_requests: bool = False,
                                       flush_cache: bool = True, timeout: float | None = None) -> dict:
        body = {"model_path": str(model_path), "load_format": load_format, "abort_all_requests": abort_all_requests,
                "weight_version": weight_version, "flush_cache": flush_cache}
        return await self._post_result("/update_weights_from_disk", body, timeout)

    async def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                        world_size: int, group_name: str = DEFAULT_GROUP_NAME,
                                        backend: str = "nccl", timeout: float | None = None) -> dict:
        body = {"master_address": master_address, "master_port": int(master_port), "rank_offset": int(rank_offset),
                "world_size": int(world_size), "group_name": group_name, "backend": backend}
        return await self._post_result("/init_weights_update_group", body, timeout)

    async def update_weights_from_distributed(self, names: list[str], dtypes: list, shapes: list[list[int]],
                                              group_name: str = DEFAULT_GROUP_NAME,
                                              weight_version: str | None = None, flush_cache: bool = True,
                                              load_format: str | None = None, abort_all_requests: bool = False,
                                              timeout: float | None = None) -> dict:
        body = {"names": list(names), "dtypes": [_dtype_str(d) for d in dtypes],
                "shapes": [[int(s) for s in shape] for shape in shapes], "group_name": group_name,
                "flush_cache": flush_cache, "abort_all_requests": abort_all_requests,
                "weight_version": weight_version, "load_format": load_format}
        return await self._post_result("/update_weights_from_distributed", body, timeout)

    async def destroy_weights_update_group(self, group_name: str = DEFAULT_GROUP_NAME) -> dict:
        return await self._post_result("/destroy_weights_update_group", {"group_name": group_name})

    async def update_weights_from_tensor(self, serialized_named_tensors: list[str], load_format: str | None = None,
                                         flush_cache: bool = True, abort_all_requests: bool = False,
                                         weight_version: str | None = None, timeout: float | None = None) -> dict:
        """POST /update_weights_from_tensor (colocated engines). `serialized_named_tensors` holds one payload per
        tensor-parallel rank of the engine, each SGLang's own serialization of the tensors as a base64 string
        (`serialize_named_tensors`): they carry CUDA IPC handles, so the engine must run on the same host."""
        body = {"serialized_named_tensors": list(serialized_named_tensors), "load_format": load_format,
                "flush_cache": flush_cache, "abort_all_requests": abort_all_requests,
                "weight_version": weight_version}
        return await self._post_result("/update_weights_from_tensor", body, timeout)

    async def update_weights_from_ipc(self, names: list[str], dtypes: list, shapes: list[list[int]], handle: dict,
                                      weight_version: str | None = None, flush_cache: bool = True,
                                      abort_all_requests: bool = False, timeout: float | None = None) -> dict:
        """POST /update_weights_from_ipc -- the local engine's colocated update (not an SGLang endpoint): one
        flattened bucket named by `handle` (weight_sync.share_bucket: a CUDA IPC handle or a shared-memory file),
        which must stay alive until this returns."""
        body = {"names": list(names), "dtypes": [_dtype_str(d) for d in dtypes],
                "shapes": [[int(s) for s in shape] for shape in shapes], "handle": dict(handle),
                "flush_cache": flush_cache, "abort_all_requests": abort_all_requests,
                "weight_version": weight_version}
        return await self._post_result("/update_weights_from_ipc", body, timeout)

    async def load_lora_adapter(self, lora_name: str, lora_path: str, pinned: bool = False,
                                timeout: float | None = None) -> dict:
        """POST /load_lora_adapter: the PEFT adapter directory `lora_path` (on the engine's host) under `lora_name`
        (SGLang needs --enable-lora). Answers SGLang's LoRAUpdateOutput: success, error_message, loaded_adapters."""
        body = {"lora_name": lora_name, "lora_path": str(lora_path), "pinned": bool(pinned)}
        return await self._post_result("/load_lora_adapter", body, timeout)

    async def unload_lora_adapter(self, lora_name: str, timeout: float | None = None) -> dict:
        """POST /unload_lora_adapter: the engine lets requests that use it finish, then drops it."""
        return await self._post_result("/unload_lora_adapter", {"lora_name": lora_name}, timeout)

    async def update_weight_version(self, new_version: str, abort_all_requests: bool = False) -> dict:
        return await self._post_result("/update_weight_version", {"new_version": new_version,
                                                                  "abort_all_requests": abort_all_requests})

    # -- info -------------------------------------------------------------------------------------------
    async def get_model_info(self) -> dict:
        """GET /model_info (SGLang 0.5.15.post1; /get_model_info is its deprecated alias, tried on 404)."""
        try:
            _, out = await self._request("GET", "/model_info")
        except EngineError as e:
            if e.status != 404:
                raise
            _, out = await self._request("GET", "/get_model_info")
        return out

    async def get_server_info(self) -> dict:
        """GET /server_info: the server's launch arguments, `version`, and per-DP `internal_states`
        (/get_server_info is the deprecated alias, tried on 404)."""
        try:
            _, out = await self._request("GET", "/server_info")
        except EngineError as e:
            if e.status != 404:
                raise
            _, out = await self._request("GET", "/get_server_info")
        # SGLang lists its launch arguments here, keys included: each secret field becomes set / not set
        return redact_server_info(out)

    async def get_weight_version(self) -> str:
        """The engine's weight version. SGLang 0.5.15.post1 answers 404 on /get_weight_version (deprecated) and
        reports it in /model_info, so that is where it is read."""
        info = await self.get_model_info()
        if "weight_version" not in info:
            raise EngineError("/model_info", 200, "no weight_version in the answer", info)
        return str(info["weight_version"])


# -- engine capabilities ------------------------------------------------------------------------------------------

# The SGLang version whose API this client was checked against (tests/data/sglang_api_0.5.15.post1.json).
CHECKED_SGLANG_VERSION = (0, 5, 15)


def parse_version(v: str | None) -> tuple[int, ...] | None:
    """"0.5.15.post1" -> (0, 5, 15); None when it is not a plain version."""
    import re
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(v or ""))
    return tuple(int(x) for x in m.groups() if x is not None) if m else None


def supports_flattened_bucket(server_info: dict) -> bool:
    """Whether the engine takes load_format="flattened_bucket" on /update_weights_from_distributed: the local engine
    and SGLang from the version checked here on (older ones get one broadcast per tensor)."""
    version = str(server_info.get("version", ""))
    if "local engine" in version:
        return True
    parsed = parse_version(version)
    return parsed is not None and parsed >= CHECKED_SGLANG_VERSION


# what serialize_named_tensors imports from SGLang (in the trainer process)
SGLANG_SERIALIZER_MODULES = ("sglang.srt.utils", "sglang.srt.utils.patch_torch", "sglang.srt.weight_sync.tensor_bucket")


def import_sglang_serializer() -> float | None:
    """Import SGLang's serializer modules (SGLANG_SERIALIZER_MODULES) ahead of the first weight update: the first
    import of `sglang.srt.utils` takes seconds (2.5 s in a trainer on one H100), which would otherwise land in the
    first colocated weight sync. Returns the seconds it took, None when SGLang is not importable (the sync itself
    then says so, as before). Safe to call from a thread (Python's import lock)."""
    import importlib
    import time
    t0 = time.monotonic()
    for i, name in enumerate(SGLANG_SERIALIZER_MODULES):
        try:
            importlib.import_module(name)
        except ImportError:
            if i == 0:
                return None   # (the later two are optional: serialize_named_tensors does without them)
    return time.monotonic() - t0


def serialize_named_tensors(named_tensors: list, tp_size: int = 1,
                            flattened: bool = True) -> tuple[list[str], str | None]:
    """The body of /update_weights_from_tensor for these tensors, made with SGLang's own serializer
    (`sglang.srt.utils.MultiprocessingSerializer`, which pickles CUDA IPC handles: SGLang's HTTP payload, never an
    actor message). Returns (serialized_named_tensors, load_format): one base64 payload per TP rank of the engine
    (each rank maps the full tensors and takes its shard), and "flattened_bucket" when the tensors travel as one
    `FlattenedTensorBucket`. Needs the `sglang` package; the tensors must stay alive until the engine answered."""
    try:
        from sglang.srt.utils import MultiprocessingSerializer
    except ImportError as exc:
        raise RuntimeError("/update_weights_from_tensor needs SGLang's serializer (the sglang package) in the "
                           f"trainer process: {exc}; use --update-weight-transport distributed or disk") from None
    try:
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
        monkey_patch_torch_reductions()  # CUDA IPC handles name the device by UUID (engines see other indices)
    except ImportError:
        pass
    load_format = None
    payload: object = [(name, t) for name, t in named_tensors]
    if flattened:
        try:
            from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket
        except ImportError:
            FlattenedTensorBucket = None
        if FlattenedTensorBucket is not None and getattr(FlattenedTensorBucket, "supports_multi_dtypes", False):
            bucket = FlattenedTensorBucket(named_tensors=list(payload))
            payload = {"flattened_tensor": bucket.get_flattened_tensor(), "metadata": bucket.get_metadata()}
            load_format = "flattened_bucket"
    data = MultiprocessingSerializer.serialize(payload, output_str=True)
    return [data] * max(1, int(tp_size)), load_format


class RouterClient:
    """The sglang-router's worker registry (sglang-router 0.3.2, as slime uses it): POST /workers {url,
    worker_type, api_key} registers an engine (the router answers 202 and adds it in the background; it sends
    that key to the engine), GET /workers lists {"workers": [{"id", "url", ...}]}, DELETE /workers/{id} removes
    one. With `keys`, /workers requests carry the admin key (the router's control-plane key, see
    sglang_launch.router_command)."""

    def __init__(self, base_url: str, timeout: float = 30.0, keys: EngineKeys | None = None):
        self._c = EngineClient(base_url, timeout=timeout, max_concurrency=8, keys=keys)
        self.base_url = self._c.base_url

    async def health(self, timeout: float = 5.0) -> bool:
        return await self._c.health(timeout)

    async def list_workers(self) -> list[dict]:
        _, out = await self._c._request("GET", "/workers", admin=True)
        workers = out.get("workers", []) if isinstance(out, dict) else out
        if not isinstance(workers, list):
            raise EngineError("/workers", 200, f"unexpected answer {str(out)[:200]}", out)
        return workers

    async def add_worker(self, url: str, api_key: str | None = None) -> None:
        body: dict[str, Any] = {"url": url, "worker_type": "regular"}
        if api_key:
            body["api_key"] = api_key
        await self._c._request("POST", "/workers", body, expect="text", admin=True)

    async def remove_worker(self, url: str) -> bool:
        """Remove the worker registered at `url`; False if the router does not list it."""
        for w in await self.list_workers():
            if str(w.get("url", "")).rstrip("/") == url.rstrip("/"):
                await self._c._request("DELETE", f"/workers/{w['id']}", expect="text", admin=True)
                return True
        return False

    async def has_worker(self, url: str) -> bool:
        return any(str(w.get("url", "")).rstrip("/") == url.rstrip("/") for w in await self.list_workers())

    async def close(self) -> None:
        await self._c.close()
