"""The embedded local engine: a Hugging Face causal LM behind the subset of SGLang's native HTTP API that the rollout
worker uses, so one rollout code path serves both (see docs/sglang.md and tests/data/sglang_api_0.5.15.post1.json).

    python -m slime_actors.backends.local_engine --model-path DIR --host 127.0.0.1 --port 30000 \
        [--config KEYS.yaml | --api-key KEY --admin-api-key KEY] [--device cpu|cuda|cuda:N] [--dtype float32] \
        [--max-running-requests 64] [--random-seed S] [--weight-version default] [--context-length N]

Keys work as in SGLang (engine_auth.py): --api-key for generation and info, --admin-api-key for weight updates,
pause / continue, abort and cache flushes; a `--config` YAML file may hold them, as SGLang reads it.

SGLang launch flags are accepted under SGLang's names; the ones with no meaning here (memory fractions, CUDA
graphs, radix cache, kernels ...) are accepted and ignored, and multi-GPU parallelism (--tp-size etc. > 1) is
refused with a clear error.

Inside: an aiohttp server on the main thread's event loop, and one scheduler thread that owns the model. The
scheduler does continuous batching with a key/value cache: requests that arrive are prefilled together
(left-padded, with attention masks and position ids), then join the running batch, which decodes one token per
step for every running request; finished requests leave the batch at once. Everything that touches the model
(weight loads, cache changes, aborts, pauses) runs on the scheduler thread between steps.

Numerics follow the trainer's convention: the log-prob of a sampled token is
``log_softmax(logits.float() / T)[token]`` (T = 1 for greedy, i.e. temperature < 1e-6), computed before top-k /
top-p filtering -- what SGLang 0.5.15.post1 returns by default (layers/sampler.py). Weights and activations stay in
the --dtype given (float32 by default; no autocast), so a full forward of prompt + response in the trainer
reproduces the returned log-probs to ~1e-6 on CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import random
import re
import signal
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from slime_actors.log import get_logger, setup_logging

log = get_logger(component="local_engine")

SGLANG_API_VERSION = "0.5.15.post1"
SAMPLING_EPS = 1e-6
TOP_K_ALL = 1 << 30
HEALTH_CHECK_TIMEOUT = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", 20))

# SamplingParams' API fields in SGLang 0.5.15.post1 (python/sglang/srt/sampling/sampling_params.py) with defaults.
SAMPLING_DEFAULTS: dict[str, Any] = {
    "max_new_tokens": 128, "stop": None, "stop_token_ids": None, "stop_regex": None, "temperature": 1.0,
    "top_p": 1.0, "top_k": TOP_K_ALL, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
    "repetition_penalty": 1.0, "min_new_tokens": 0, "n": 1, "json_schema": None, "regex": None, "ebnf": None,
    "structural_tag": None, "ignore_eos": False, "skip_special_tokens": True, "spaces_between_special_tokens": True,
    "no_stop_trim": False, "custom_params": None, "stream_interval": None, "logit_bias": None,
    "sampling_seed": None,
}
# Accepted by SGLang, not implemented here: a non-default value is refused (400) rather than silently ignored.
SAMPLING_UNSUPPORTED = ("min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "json_schema",
                        "regex", "ebnf", "structural_tag", "logit_bias")
# GenerateReqInput fields that change what SGLang computes and that this engine does not implement.
GENERATE_UNSUPPORTED = {"input_embeds": None, "image_data": None, "video_data": None, "audio_data": None,
                        "top_logprobs_num": (None, 0), "token_ids_logprob": (None, []), "stream": False,
                        "return_hidden_states": False, "return_routed_experts": False, "lora_path": None,
                        "custom_logit_processor": None, "session_params": None, "session_id": None,
                        "return_entropy": False, "positional_embed_overrides": None}


class RequestError(Exception):
    """A request the engine refuses: `status` and a JSON `body` shaped like SGLang's answer for the same case."""

    def __init__(self, status: int, body: Any):
        super().__init__(str(body))
        self.status, self.body = status, body


def value_error(message: str) -> RequestError:
    """What SGLang's /generate answers for a ValueError: 400 {"error": {"message": ...}}."""
    return RequestError(400, {"error": {"message": message}})


def validation_error(message: str) -> RequestError:
    """What SGLang answers when FastAPI rejects the body: 400 with an OpenAI-style ErrorResponse."""
    return RequestError(400, {"object": "error", "message": message, "type": "Bad Request", "param": None,
                              "code": 400})


def type_error(message: str) -> RequestError:
    """SGLang lets a TypeError in sampling params escape /generate: HTTP 500 (there, a plain-text body)."""
    return RequestError(500, {"error": {"message": message, "type": "TypeError"}})


# -- request validation ----------------------------------------------------------------------------------------

def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check(cond: bool, loc: str, msg: str) -> None:
    if not cond:
        raise validation_error(f"1 validation error: body.{loc}: {msg}")


@dataclass
class SamplingParams:
    max_new_tokens: int | None = 128
    stop_strs: list[str] = field(default_factory=list)
    stop_regex: list[str] = field(default_factory=list)
    stop_token_ids: set[int] = field(default_factory=set)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL
    min_new_tokens: int = 0
    n: int = 1
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.top_k == 1


def parse_sampling_params(raw: Any, vocab_size: int) -> SamplingParams:
    """SGLang's SamplingParams(**raw) + __post_init__ + verify(), with its error classes."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise validation_error("sampling_params: Input should be a valid dictionary")
    unknown = [k for k in raw if k not in SAMPLING_DEFAULTS]
    if unknown:
        raise type_error(f"Unexpected keyword argument {unknown[0]!r} in sampling_params")
    p = {**SAMPLING_DEFAULTS, **{k: v for k, v in raw.items()}}
    for k in SAMPLING_UNSUPPORTED:
        v = p[k]
        if v is not None and v != SAMPLING_DEFAULTS[k]:
            raise value_error(f"sampling_params.{k}={v!r} is not supported by the local engine")
    if p["custom_params"] not in (None, {}):
        raise value_error("sampling_params.custom_params is not supported by the local engine")
    # None means "default" for the non-optional fields (SGLang's __post_init__)
    for k, default in (("temperature", 1.0), ("top_p", 1.0), ("top_k", -1), ("min_new_tokens", 0), ("n", 1),
                       ("ignore_eos", False), ("skip_special_tokens", True), ("no_stop_trim", False),
                       ("spaces_between_special_tokens", True)):
        if p[k] is None:
            p[k] = default
    try:
        temperature, top_p, top_k = float(p["temperature"]), float(p["top_p"]), int(p["top_k"])
        min_new = int(p["min_new_tokens"])
        max_new = None if p["max_new_tokens"] is None else int(p["max_new_tokens"])
        n = int(p["n"])
        seed = None if p["sampling_seed"] is None else int(p["sampling_seed"])
        if any(isinstance(p[k], (str, list, dict)) for k in ("temperature", "top_p", "top_k", "min_new_tokens",
                                                               "max_new_tokens", "n", "sampling_seed")):
            raise TypeError("a numeric sampling parameter has a non-numeric value")
        stop = p["stop"]
        stop = [stop] if isinstance(stop, str) else list(stop or [])
        stop_regex = p["stop_regex"]
        stop_regex = [stop_regex] if isinstance(stop_regex, str) else list(stop_regex or [])
        if not all(isinstance(s, str) for s in stop + stop_regex):
            raise TypeError("stop / stop_regex must be strings")
        stop_ids = {int(t) for t in (p["stop_token_ids"] or []) if t is not None}
        for r in stop_regex:
            re.compile(r)
    except (TypeError, ValueError, re.error) as e:
        raise type_error(f"invalid sampling_params: {e}") from None
    if 0 <= temperature < SAMPLING_EPS:  # greedy, as SGLang: temperature 1 and top_k 1
        temperature, top_k = 1.0, 1
    if top_k == -1:
        top_k = TOP_K_ALL
    if not math.isfinite(temperature) or temperature < 0.0:
        raise value_error(f"temperature must be a non-negative finite number, got {temperature}.")
    if not 0.0 < top_p <= 1.0:
        raise value_error(f"top_p must be in (0, 1], got {top_p}.")
    if top_k < 1:
        raise value_error(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    if min_new < 0:
        raise value_error(f"min_new_tokens must be in [0, max_new_tokens], got {min_new}.")
    if max_new is not None:
        if max_new < 0:
            raise value_error(f"max_new_tokens must be at least 0, got {max_new}.")
        if min_new > max_new:
            raise value_error(f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {min_new}.")
    if n < 1:
        raise value_error(f"n must be at least 1, got {n}.")
    bad = [t for t in stop_ids if not 0 <= t < vocab_size]
    if bad:
        raise value_error(f"stop_token_ids {bad} outside the vocabulary [0, {vocab_size})")
    return SamplingParams(max_new_tokens=max_new, stop_strs=[s for s in stop if s], stop_regex=stop_regex,
                          stop_token_ids=stop_ids, temperature=temperature, top_p=top_p, top_k=top_k,
                          min_new_tokens=min_new, n=n, ignore_eos=bool(p["ignore_eos"]),
                          skip_special_tokens=bool(p["skip_special_tokens"]),
                          spaces_between_special_tokens=bool(p["spaces_between_special_tokens"]),
                          no_stop_trim=bool(p["no_stop_trim"]), sampling_seed=seed)


# -- requests and the scheduler --------------------------------------------------------------------------------

@dataclass(eq=False)
class Req:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    return_text_in_logprobs: bool = False
    seq: int = 0
    internal: bool = False  # health probes: never aborted by users, no output built
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    input_logprobs: list | None = None
    finish: dict | None = None
    generator: torch.Generator | None = None
    created: float = field(default_factory=time.time)
    on_done: Callable[[dict], None] | None = None
    num_retractions: int = 0

    @property
    def max_new(self) -> int:
        return self.params.max_new_tokens


class Engine:
    """The model, its tokenizer and the scheduler thread."""

    def __init__(self, args: argparse.Namespace):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        self.args = args
        self.device = resolve_device(args.device, args.base_gpu_id)
        self.dtype = resolve_dtype(args.dtype)
        if args.random_seed is not None:
            torch.manual_seed(args.random_seed)
        self.rng = random.Random(args.random_seed)
        self.model_path = args.model_path
        self.tokenizer_path = args.tokenizer_path or args.model_path
        self.tokenizer = None
        if not args.skip_tokenizer_init:
            self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path,
                                                           trust_remote_code=args.trust_remote_code)
        kw = dict(dtype=self.dtype, trust_remote_code=args.trust_remote_code)
        try:
            self.model = AutoModelForCausalLM.from_pretrained(args.model_path, attn_implementation="sdpa", **kw)
        except (ValueError, ImportError):
            self.model = AutoModelForCausalLM.from_pretrained(args.model_path, attn_implementation="eager", **kw)
        self.model.to(self.device).eval()
        self.config = self.model.config
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.context_len = int(args.context_length or getattr(self.config, "max_position_embeddings", 0) or 4096)
        self.eos_ids = self._eos_ids()
        self.max_running = int(args.max_running_requests or 64)
        self.weight_version = args.weight_version

        self.cv = threading.Condition()
        self.waiting: collections.deque[Req] = collections.deque()
        self.running: list[Req] = []
        self.commands: collections.deque = collections.deque()  # (fn, needs_idle, barrier_seq, on_done)
        self.paused = False
        self.stopping = False
        self.seq = 0
        self.heartbeat = time.monotonic()
        self.steps = 0
        # batch state: per-layer keys/values [B, H, T, D] in a DynamicCache, a mask [B, T], rows = self.running
        self.cache = None
        self.mask: torch.Tensor | None = None
        self.groups: dict[str, Any] = {}
        self.receivers: dict[str, Any] = {}  # group name -> weight_sync.BucketReceiver (flattened buckets)
        self.groups_lock = threading.Lock()
        self._fwd_params: set | None = None
        self.thread = threading.Thread(target=self._loop, name="local-engine-scheduler", daemon=True)

    # -- setup helpers --
    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for src in (getattr(self.model, "generation_config", None), self.config):
            e = getattr(src, "eos_token_id", None) if src is not None else None
            if isinstance(e, int):
                ids.add(e)
            elif isinstance(e, (list, tuple)):
                ids.update(int(x) for x in e)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return ids

    def start(self) -> None:
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive() and not self.stopping

    def stop(self) -> None:
        with self.cv:
            self.stopping = True
            self.cv.notify_all()
        self.thread.join(10)

    # -- called from the event loop (any thread) --
    def submit(self, reqs: list[Req]) -> None:
        with self.cv:
            if self.stopping or not self.thread.is_alive():
                for r in reqs:
                    r.finish = {"type": "abort", "message": "engine shutting down"}
                    self._emit(r)
                return
            for r in reqs:
                self.seq += 1
                r.seq = self.seq
                if r.generator is None:
                    r.generator = torch.Generator(device="cpu")
                    seed = r.params.sampling_seed if r.params.sampling_seed is not None else self.rng.getrandbits(62)
                    r.generator.manual_seed(int(seed) & ((1 << 63) - 1))
                self.waiting.append(r)
            self.cv.notify_all()

    def command(self, fn: Callable[[], Any], on_done: Callable[[Any, BaseException | None], None],
                needs_idle: bool = False) -> None:
        """Run fn() on the scheduler thread between steps. needs_idle: first let the requests that arrived before
        it finish (SGLang's model-update lock) -- unless the engine is paused, where it runs at once."""
        with self.cv:
            self.commands.append((fn, needs_idle, self.seq, on_done))
            self.cv.notify_all()

    # -- scheduler thread --
    def _loop(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        try:
            while True:
                with self.cv:
                    self.heartbeat = time.monotonic()
                    self._run_commands()
                    if self.stopping:
                        break
                    admit = self._admit()
                    work = bool(admit) or (bool(self.running) and not self.paused)
                    if not work:
                        self.cv.wait(timeout=0.5)
                        continue
                try:
                    with torch.inference_mode():
                        if admit:
                            self._prefill(admit)
                        else:
                            self._decode()
                    self.steps += 1
                except Exception as e:  # a failed step fails its requests, the engine keeps serving
                    log.error("step failed", error=repr(e), tb=traceback.format_exc())
                    with self.cv:
                        failed = list(self.running) + [r for r in admit if r not in self.running]
                        self._clear_batch()
                        for r in failed:
                            if r.finish is None:
                                r.finish = {"type": "abort", "message": f"engine error: {e!r}",
                                            "status_code": 500, "err_type": "InternalServerError"}
                            self._emit(r)
        finally:
            with self.cv:
                for r in list(self.running) + list(self.waiting):
                    if r.finish is None:
                        r.finish = {"type": "abort", "message": "engine shutting down"}
                        self._emit(r)
                self.running.clear()
                self.waiting.clear()
                for fn, _, _, on_done in self.commands:
                    on_done(None, RuntimeError("engine shutting down"))
                self.commands.clear()

    def _blocked_by_barrier(self) -> int | None:
        """The lowest barrier seq of a pending idle-command (requests after it wait), or None."""
        seqs = [b for _, idle, b, _ in self.commands if idle]
        return min(seqs) if seqs else None

    def _run_commands(self) -> None:
        while self.commands:
            fn, needs_idle, barrier, on_done = self.commands[0]
            if needs_idle and not self.paused:
                busy = any(r.seq <= barrier for r in self.running) or any(r.seq <= barrier for r in self.waiting)
                if busy:
                    return
            self.commands.popleft()
            try:
                res, err = fn(), None
            except BaseException as e:  # noqa: BLE001 - reported to the caller
                res, err = None, e
            try:
                on_done(res, err)
            except Exception:
                log.error("command callback failed", tb=traceback.format_exc())

    def _admit(self) -> list[Req]:
        if self.paused or not self.waiting:
            return []
        barrier = self._blocked_by_barrier()
        room = self.max_running - len(self.running)
        out = []
        keep = collections.deque()
        while self.waiting:
            r = self.waiting.popleft()
            if r.finish is not None:
                continue
            if r.max_new is not None and r.max_new - len(r.output_ids) <= 0:
                r.finish = {"type": "length", "length": r.max_new}
                self._emit(r)
                continue
            if len(out) < room and (barrier is None or r.seq <= barrier):
                out.append(r)
            else:
                keep.append(r)
        self.waiting = keep
        return out

    # -- model steps --
    def _forward(self, input_ids, attention_mask, position_ids, cache, logits_to_keep):
        from transformers import DynamicCache
        if cache is None:
            cache = DynamicCache()
        if self._fwd_params is None:
            import inspect
            self._fwd_params = set(inspect.signature(self.model.forward).parameters)
        kw = {"cache" if "cache" in self._fwd_params else "past_key_values": cache}
        if "cache_position" in self._fwd_params:  # transformers < 5.2x wants it; later versions derive it
            past = attention_mask.shape[1] - input_ids.shape[1]
            kw["cache_position"] = torch.arange(past, past + input_ids.shape[1], device=self.device)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, logits_to_keep=logits_to_keep, **kw)
        new_cache = getattr(out, "cache", None)
        if new_cache is None:
            new_cache = getattr(out, "past_key_values", None)
        return out.logits, (new_cache if new_cache is not None else cache)

    def _prefill(self, reqs: list[Req]) -> None:
        seqs = [r.prompt_ids + r.output_ids for r in reqs]
        L = max(len(s) for s in seqs)
        ids = torch.zeros((len(reqs), L), dtype=torch.long)
        mask = torch.zeros((len(reqs), L), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, L - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, L - len(s):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        want_input = [r.return_logprob and r.logprob_start_len >= 0 and not r.output_ids for r in reqs]
        logits, cache = self._forward(ids, mask, pos, None, 0 if any(want_input) else 1)
        for i, r in enumerate(reqs):
            if want_input[i]:
                r.input_logprobs = self._input_logprobs(logits[i, L - len(seqs[i]):], seqs[i], r.logprob_start_len)
        last = logits[:, -1, :]
        self._merge(cache, mask, reqs)
        self._sample_and_check(last, reqs)

    def _input_logprobs(self, logits: torch.Tensor, ids: list[int], start: int) -> list:
        """SGLang's input_token_logprobs: log_softmax of the raw logits (no temperature), None for position 0."""
        lp = torch.log_softmax(logits.float(), dim=-1)
        out = []
        for pos in range(start, len(ids)):
            out.append(None if pos == 0 else float(lp[pos - 1, ids[pos]]))
        return out

    def _decode(self) -> None:
        B = len(self.running)
        ids = torch.tensor([[r.output_ids[-1]] for r in self.running], dtype=torch.long, device=self.device)
        pos = self.mask.sum(-1, keepdim=True)
        mask = torch.cat([self.mask, torch.ones((B, 1), dtype=self.mask.dtype, device=self.device)], dim=1)
        logits, self.cache = self._forward(ids, mask, pos, self.cache, 1)
        self.mask = mask
        self._sample_and_check(logits[:, -1, :], self.running)

    # -- cache bookkeeping --
    @staticmethod
    def _kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if hasattr(cache, "layers"):
            return [(layer.keys, layer.values) for layer in cache.layers]
        return list(zip(cache.key_cache, cache.value_cache))  # older transformers

    @staticmethod
    def _cache_from(kv: list[tuple[torch.Tensor, torch.Tensor]]):
        from transformers import DynamicCache
        return DynamicCache(kv)

    def _merge(self, cache, mask: torch.Tensor, reqs: list[Req]) -> None:
        if not self.running:
            self.cache, self.mask, self.running = cache, mask, list(reqs)
            return
        old, new = self._kv(self.cache), self._kv(cache)
        T = max(self.mask.shape[1], mask.shape[1])

        def lpad(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
            if n == 0:
                return t
            shape = list(t.shape)
            shape[dim] = n
            return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)

        a, b = T - self.mask.shape[1], T - mask.shape[1]
        kv = [(torch.cat([lpad(ko, a, 2), lpad(kn, b, 2)]), torch.cat([lpad(vo, a, 2), lpad(vn, b, 2)]))
              for (ko, vo), (kn, vn) in zip(old, new)]
        self.mask = torch.cat([lpad(self.mask, a, 1), lpad(mask, b, 1)])
        self.cache = self._cache_from(kv)
        self.running = self.running + list(reqs)

    def _release_finished(self) -> None:
        """Drop finished rows from the batch (and left padding no row needs any more); emit their outputs."""
        done = [r for r in self.running if r.finish is not None]
        if not done:
            return
        keep = [i for i, r in enumerate(self.running) if r.finish is None]
        for r in done:
            self._emit(r)
        if not keep:
            self.running, self.cache, self.mask = [], None, None
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        mask = self.mask.index_select(0, idx)
        lead = int((mask.cumsum(-1) == 0).sum(-1).min())
        kv = [(k.index_select(0, idx)[:, :, lead:], v.index_select(0, idx)[:, :, lead:])
              for k, v in self._kv(self.cache)]
        self.cache, self.mask = self._cache_from(kv), mask[:, lead:].contiguous()
        self.running = [self.running[i] for i in keep]

    def _clear_batch(self) -> None:
        self.running, self.cache, self.mask = [], None, None

    # -- sampling --
    def _sample_and_check(self, logits: torch.Tensor, reqs: list[Req]) -> None:
        logits = logits.float()
        # min_new_tokens: stop tokens are masked before sampling (SGLang's penalizer does the same to the logits)
        for i, r in enumerate(reqs):
            if r.params.min_new_tokens and len(r.output_ids) < r.params.min_new_tokens:
                ban = set(r.params.stop_token_ids) | (set() if r.params.ignore_eos else self.eos_ids)
                if ban:
                    logits[i, list(ban)] = float("-inf")
        temps = torch.tensor([r.params.temperature for r in reqs], dtype=torch.float32, device=logits.device)
        logp = torch.log_softmax(logits / temps[:, None], dim=-1)
        logp.clamp_(min=torch.finfo(logp.dtype).min)  # as SGLang: no -inf in the answers
        tokens = torch.argmax(logits, dim=-1)
        sampled = [i for i, r in enumerate(reqs) if not r.params.greedy]
        if sampled:
            sidx = torch.tensor(sampled, device=logits.device)
            probs = logp.index_select(0, sidx).exp()
            ps, pi = probs.sort(dim=-1, descending=True)
            V = ps.shape[-1]
            ks = torch.tensor([min(reqs[i].params.top_k, V) for i in sampled], device=logits.device)
            tp = torch.tensor([reqs[i].params.top_p for i in sampled], dtype=ps.dtype, device=logits.device)
            ps = ps.masked_fill(torch.arange(V, device=logits.device)[None, :] >= ks[:, None], 0.0)
            ps = ps.masked_fill((ps.cumsum(-1) - ps) > tp[:, None], 0.0)  # SGLang's top-p rule
            cdf = ps.cumsum(-1)
            u = torch.cat([torch.rand(1, generator=reqs[i].generator, dtype=torch.float64) for i in sampled])
            thresh = (u.to(logits.device) * cdf[:, -1].double()).to(cdf.dtype)[:, None]
            pick = torch.searchsorted(cdf, thresh, right=True).clamp(max=V - 1)
            # never land on a zero-probability entry (rounding at the top of the cdf)
            pick = torch.minimum(pick, (ps > 0).sum(-1, keepdim=True) - 1)
            tokens[sidx] = pi.gather(-1, pick).squeeze(-1)
        toks = tokens.tolist()
        lps = logp.gather(-1, tokens[:, None]).squeeze(-1).tolist()
        for r, t, lp in zip(reqs, toks, lps):
            r.output_ids.append(int(t))
            r.logprobs.append(float(lp))
            self._check_finish(r)
        self._release_finished()

    def _check_finish(self, r: Req) -> None:
        """SGLang's order: length, then stop strings / regex, then eos / stop_token_ids (not with ignore_eos)."""
        p, n, t = r.params, len(r.output_ids), r.output_ids[-1]
        limit = p.max_new_tokens if p.max_new_tokens is not None else self.context_len - len(r.prompt_ids)
        if n >= limit or len(r.prompt_ids) + n >= self.context_len:
            r.finish = {"type": "length", "length": limit if p.max_new_tokens is not None else n}
            return
        if (p.stop_strs or p.stop_regex) and self.tokenizer is not None:
            tail = self.tokenizer.decode(r.output_ids[-self._tail_len(p):])
            for s in p.stop_strs:
                if s in tail:
                    r.finish = {"type": "stop", "matched": s}
                    return
            for rx in p.stop_regex:
                if re.search(rx, tail):
                    r.finish = {"type": "stop", "matched": rx}
                    return
        if not p.ignore_eos and (t in p.stop_token_ids or t in self.eos_ids):
            r.finish = {"type": "stop", "matched": t}

    def _tail_len(self, p: SamplingParams) -> int:
        n = 1
        for s in p.stop_strs:
            n = max(n, len(self.tokenizer.encode(s, add_special_tokens=False)) + 1)
        if p.stop_regex:
            n = max(n, 64)
        return n

    # -- outputs --
    def _emit(self, r: Req) -> None:
        if r.on_done is None:
            return
        cb, r.on_done = r.on_done, None
        try:
            cb(self.build_output(r))
        except Exception:
            log.error("output callback failed", rid=r.rid, tb=traceback.format_exc())

    def build_output(self, r: Req) -> dict:
        ids = list(r.output_ids)
        meta: dict[str, Any] = {
            "id": r.rid, "finish_reason": r.finish, "prompt_tokens": len(r.prompt_ids),
            "weight_version": self.weight_version, "num_retractions": r.num_retractions,
        }
        out: dict[str, Any] = {}
        if self.tokenizer is not None:
            text_ids = ids
            f = r.finish or {}
            if not r.params.no_stop_trim and isinstance(f.get("matched"), int) and not isinstance(
                    f.get("matched"), bool) and text_ids:
                text_ids = text_ids[:-1]
            text = self.tokenizer.decode(text_ids, skip_special_tokens=r.params.skip_special_tokens)
            if isinstance(f.get("matched"), str) and f["matched"] in r.params.stop_strs:
                pos = text.find(f["matched"])
                if pos >= 0:
                    text = text[:pos + len(f["matched"])] if r.params.no_stop_trim else text[:pos]
            out["text"] = text
        out["output_ids"] = ids
        if r.return_logprob:
            texts = [None] * len(ids)
            if r.return_text_in_logprobs and self.tokenizer is not None:
                texts = [self.tokenizer.decode([t]) for t in ids]
            meta["input_token_logprobs"] = [[lp, tid, None] for lp, tid in zip(
                r.input_logprobs or [], (r.prompt_ids[max(r.logprob_start_len, 0):] if r.input_logprobs else []))]
            meta["output_token_logprobs"] = [[lp, tid, tx] for lp, tid, tx in zip(r.logprobs, ids, texts)]
            meta["output_token_logprobs_length"] = len(ids)
        meta.update({"reasoning_tokens": 0, "completion_tokens": len(ids), "cached_tokens": 0,
                     "e2e_latency": time.time() - r.created})
        out["meta_info"] = meta
        return out

    # -- control (scheduler thread) --
    def abort_from_http(self, rid: str, abort_all: bool, message: str | None = None) -> int:
        """POST /abort_request as SGLang 0.5.15.post1 handles it (TokenizerManager.abort_request, one tokenizer
        worker): unless abort_all, the rid must be a request the server holds right now -- an unknown rid, a parent
        rid of a parallel-sampling request (its requests are "rid_0", "rid_1", ...) or a bare prefix is ignored;
        a known rid then goes to the scheduler, which aborts every request whose rid starts with it (seen on an H200,
        docs/sglang.md)."""
        if not abort_all:
            if not rid or all(r.rid != rid for r in (*self.waiting, *self.running)
                              if r.finish is None and not r.internal):
                return 0
        return self.abort(rid, abort_all, message)

    def abort(self, rid: str | None, abort_all: bool, message: str | None = None) -> int:
        """The scheduler's abort (SGLang's Scheduler.abort_request): rid matches by prefix; an empty rid without
        abort_all does nothing."""
        if not abort_all and not rid:
            return 0
        n = 0
        for r in list(self.waiting):
            if r.finish is None and not r.internal and (abort_all or r.rid.startswith(rid)):
                r.finish = {"type": "abort", "message": message or "Abort in waiting queue"}
                self._emit(r)
                n += 1
        self.waiting = collections.deque(r for r in self.waiting if r.finish is None)
        for r in self.running:
            if r.finish is None and not r.internal and (abort_all or r.rid.startswith(rid)):
                r.finish = {"type": "abort", "message": message or "Aborted", "status_code": None,
                            "err_type": None}
                n += 1
        self._release_finished()
        return n

    def pause(self, mode: str) -> None:
        self.paused = True
        if mode == "abort":
            self.abort(None, abort_all=True)
        elif mode == "retract":
            # running requests go back to the front of the queue and are recomputed (prompt + output so far)
            for r in reversed(self.running):
                r.num_retractions += 1
                self.waiting.appendleft(r)
            self._clear_batch()

    def resume(self) -> None:
        self.paused = False

    def load_named_weights(self, named: list[tuple[str, torch.Tensor]]) -> int:
        params = dict(self.model.named_parameters(remove_duplicate=False))
        params.update(dict(self.model.named_buffers(remove_duplicate=False)))
        unknown = [n for n, _ in named if n not in params]
        if unknown:
            raise ValueError(f"{len(unknown)} weight name(s) not in the model, e.g. {unknown[:4]}")
        bad = [(n, list(t.shape), list(params[n].shape)) for n, t in named if tuple(t.shape) != tuple(params[n].shape)]
        if bad:
            raise ValueError(f"shape mismatch (name, given, expected): {bad[:4]}")
        with torch.no_grad():
            from slime_actors.backends.weight_sync import copy_tensors
            copy_tensors([params[n] for n, _ in named], [t.to(device=params[n].device) for n, t in named])
        return len(named)

    def flush(self) -> bool:
        """SGLang flushes only when nothing is running or waiting. There is no prefix cache here to drop."""
        return not self.running and not any(r.finish is None for r in self.waiting)


def resolve_device(device: str | None, base_gpu_id: int = 0) -> torch.device:
    if device in (None, "", "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    d = torch.device(device)
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda given but CUDA is not available")
        if d.index is None:
            d = torch.device("cuda", base_gpu_id)
        torch.cuda.set_device(d)
    return d


def resolve_dtype(name: str) -> torch.dtype:
    return {"auto": torch.float32, "float": torch.float32, "float32": torch.float32, "half": torch.float16,
            "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


# -- HTTP -------------------------------------------------------------------------------------------------------

# which endpoint takes which key: SGLang's rule, in one place (engine_auth: ADMIN_PATHS, refusal_status)
from slime_actors.backends.engine_auth import REDACTED, refusal_status  # noqa: E402

# body schemas of the msgspec-struct endpoints: field -> (check, default or REQUIRED). Unknown keys are ignored.
REQUIRED = object()
_STR, _OSTR = (lambda v: isinstance(v, str)), (lambda v: v is None or isinstance(v, str))
_INT, _BOOL = _is_int, (lambda v: isinstance(v, bool))
_OBOOL = lambda v: v is None or isinstance(v, bool)  # noqa: E731
_BASE = {"rid": (_OSTR, None), "http_worker_ipc": (_OSTR, None)}
SCHEMAS = {
    "AbortReq": {**_BASE, "abort_all": (_BOOL, False), "finished_reason": (lambda v: v is None or isinstance(v, dict),
                                                                           None),
                 "abort_message": (_OSTR, None)},
    "PauseGenerationReqInput": {**_BASE, "mode": (lambda v: v in ("abort", "retract", "in_place"), "abort")},
    "ContinueGenerationReqInput": {**_BASE, "torch_empty_cache": (_BOOL, True)},
    "UpdateWeightFromDiskReqInput": {**_BASE, "model_path": (_STR, REQUIRED), "load_format": (_OSTR, None),
                                     "abort_all_requests": (_BOOL, False), "weight_version": (_OSTR, None),
                                     "is_async": (_BOOL, False), "torch_empty_cache": (_BOOL, False),
                                     "keep_pause": (_BOOL, False), "recapture_cuda_graph": (_BOOL, False),
                                     "token_step": (_INT, 0), "flush_cache": (_BOOL, True),
                                     "manifest": (lambda v: v is None or isinstance(v, dict), None)},
    "InitWeightsUpdateGroupReqInput": {**_BASE, "master_address": (_STR, REQUIRED), "master_port": (_INT, REQUIRED),
                                       "rank_offset": (_INT, REQUIRED), "world_size": (_INT, REQUIRED),
                                       "group_name": (_STR, "weight_update_group"), "backend": (_STR, "nccl")},
    "UpdateWeightsFromDistributedReqInput": {
        **_BASE, "names": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), REQUIRED),
        "dtypes": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), REQUIRED),
        "shapes": (lambda v: isinstance(v, list) and all(isinstance(s, list) and all(_is_int(i) for i in s)
                                                         for s in v), REQUIRED),
        "group_name": (_STR, "weight_update_group"), "flush_cache": (_BOOL, True),
        "abort_all_requests": (_BOOL, False), "weight_version": (_OSTR, None), "load_format": (_OSTR, None),
        "torch_empty_cache": (_BOOL, False)},
    "DestroyWeightsUpdateGroupReqInput": {**_BASE, "group_name": (_STR, "weight_update_group")},
    "UpdateWeightsFromTensorReqInput": {**_BASE, "serialized_named_tensors": (lambda v: isinstance(v, list), REQUIRED),
                                        "load_format": (_OSTR, None), "flush_cache": (_BOOL, True),
                                        "abort_all_requests": (_BOOL, False), "weight_version": (_OSTR, None),
                                        "disable_draft_model": (_OBOOL, None), "torch_empty_cache": (_BOOL, False)},
    "UpdateWeightVersionReqInput": {**_BASE, "new_version": (_STR, REQUIRED), "abort_all_requests": (_BOOL, True)},
    # ours (not SGLang's): a colocated trainer's bucket by CUDA IPC / shared-memory handle (weight_sync.share_bucket)
    "UpdateWeightsFromIPCReqInput": {
        **_BASE, "names": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), REQUIRED),
        "dtypes": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), REQUIRED),
        "shapes": (lambda v: isinstance(v, list) and all(isinstance(s, list) and all(_is_int(i) for i in s)
                                                         for s in v), REQUIRED),
        "handle": (lambda v: isinstance(v, dict) and isinstance(v.get("kind"), str) and _is_int(v.get("numel")),
                   REQUIRED),
        "flush_cache": (_BOOL, True), "abort_all_requests": (_BOOL, False), "weight_version": (_OSTR, None)},
}


def validate_struct(schema_name: str, body: Any) -> dict:
    if not isinstance(body, dict):
        raise validation_error("body: Input should be a valid dictionary")
    out = {}
    for name, (check, default) in SCHEMAS[schema_name].items():
        if name not in body:
            if default is REQUIRED:
                raise validation_error(f"1 validation error for {schema_name}: body.{name}: Field required")
            out[name] = default
            continue
        if not check(body[name]):
            raise validation_error(f"1 validation error for {schema_name}: body.{name}: "
                                   f"Input has the wrong type or value ({body[name]!r})")
        out[name] = body[name]
    return out


def json_response(body: Any, status: int = 200):
    from aiohttp import web
    return web.json_response(body, status=status, dumps=lambda o: json.dumps(o, allow_nan=True))


class Server:
    def __init__(self, engine: Engine, args: argparse.Namespace):
        self.engine, self.args = engine, args
        self.loop: asyncio.AbstractEventLoop | None = None
        self.http_alive_since = time.time()
        self.refused = 0  # requests refused for a missing or wrong key

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
        r.add_post("/pause_generation", self.pause_generation)
        r.add_post("/continue_generation", self.continue_generation)
        r.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        r.add_post("/init_weights_update_group", self.init_weights_update_group)
        r.add_post("/update_weights_from_distributed", self.update_weights_from_distributed)
        r.add_post("/destroy_weights_update_group", self.destroy_weights_update_group)
        r.add_post("/update_weights_from_tensor", self.update_weights_from_tensor)
        r.add_post("/update_weights_from_ipc", self.update_weights_from_ipc)
        r.add_post("/update_weight_version", self.update_weight_version)
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
            return json.loads(raw)
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
        e = self.engine
        if not isinstance(body, dict):
            raise validation_error("body: Input should be a valid dictionary or object to extract fields from")
        for k, allowed in GENERATE_UNSUPPORTED.items():
            if k not in body or body[k] is None:
                continue
            v = body[k]
            ok = v in allowed if isinstance(allowed, tuple) else v == allowed
            if not ok:
                raise value_error(f"{k}={v!r} is not supported by the local engine")
        text, input_ids = body.get("text"), body.get("input_ids")
        if text is not None:
            _check(isinstance(text, str) or (isinstance(text, list) and all(isinstance(t, str) for t in text)),
                   "text", "Input should be a valid string or list of strings")
        if input_ids is not None:
            _check(isinstance(input_ids, list), "input_ids", f"must be list or null; got {type(input_ids).__name__}")
            if input_ids and isinstance(input_ids[0], list):
                _check(all(isinstance(row, list) and all(_is_int(i) for i in row) for row in input_ids),
                       "input_ids", "elements must be int")
            else:
                _check(all(_is_int(i) for i in input_ids), "input_ids", "elements must be int")
        for k in ("return_logprob",):
            v = body.get(k)
            _check(v is None or isinstance(v, bool) or (isinstance(v, list) and all(isinstance(x, bool) for x in v)),
                   k, "Input should be a valid boolean")
        for k in ("return_text_in_logprobs", "stream", "log_metrics"):
            if k in body:
                _check(isinstance(body[k], bool), k, "Input should be a valid boolean")
        rid = body.get("rid")
        _check(rid is None or isinstance(rid, str) or (isinstance(rid, list) and all(isinstance(x, str) for x in rid)),
               "rid", "Input should be a valid string")
        sp = body.get("sampling_params")
        _check(sp is None or isinstance(sp, dict) or (isinstance(sp, list) and all(isinstance(x, dict) for x in sp)),
               "sampling_params", "Input should be a valid dictionary or list")
        lsl = body.get("logprob_start_len")
        _check(lsl is None or _is_int(lsl) or (isinstance(lsl, list) and all(_is_int(x) for x in lsl)),
               "logprob_start_len", "Input should be a valid integer")

        if text is None and input_ids is None:
            raise value_error("Either text, input_ids or input_embeds should be provided.")
        if input_ids is not None:
            if len(input_ids) == 0:
                raise value_error("input_ids cannot be empty.")
            single = _is_int(input_ids[0])
            prompts = [input_ids] if single else input_ids
        else:
            if e.tokenizer is None:
                raise value_error("text input needs the tokenizer (the engine was started with --skip-tokenizer-init)")
            single = isinstance(text, str)
            texts = [text] if single else text
            prompts = [e.tokenizer(t)["input_ids"] for t in texts]
        bs = len(prompts)

        def per_item(v, default):
            if isinstance(v, list):
                if len(v) != bs:
                    raise value_error(f"expected {bs} values, got {len(v)}")
                return v
            return [default if v is None else v] * bs

        sps = per_item(sp, {})
        params = [parse_sampling_params(x, e.vocab_size) for x in sps]
        n = params[0].n
        if any(p.n != n for p in params):
            raise value_error("The parallel_sample_num should be the same for all samples in sample params.")
        rlp = per_item(body.get("return_logprob"), False)
        lsls = per_item(lsl, -1)
        if n > 1:
            single = False
        if isinstance(rid, list):
            if len(rid) != bs:
                raise value_error("The specified rids length mismatch with the batch_size for batch processing.")
            rids = rid
        elif single:
            rids = [rid or uuid.uuid4().hex]
        else:
            total = bs * n
            rids = [f"{rid}_{i}" for i in range(total)] if rid else [uuid.uuid4().hex for _ in range(total)]
        reqs = []
        for j in range(n):  # SGLang expands parallel samples as [all prompts] * n
            for i, prompt in enumerate(prompts):
                k = j * bs + i
                if any((not _is_int(t)) or t < 0 or t >= e.vocab_size for t in prompt):
                    raise value_error(f"The input_ids {prompt} contains values greater than the vocab size "
                                      f"({e.vocab_size}).")
                if not prompt:
                    raise value_error("input_ids cannot be empty.")
                if len(prompt) >= e.context_len:
                    raise value_error(f"The input ({len(prompt)} tokens) is longer than the model's context "
                                      f"length ({e.context_len} tokens).")
                p = params[i]
                if p.max_new_tokens is not None and p.max_new_tokens + len(prompt) > e.context_len:
                    raise value_error(
                        f"Requested token count exceeds the model's maximum context length of {e.context_len} "
                        f"tokens. You requested a total of {p.max_new_tokens + len(prompt)} tokens: {len(prompt)} "
                        f"tokens from the input messages and {p.max_new_tokens} tokens for the completion. Please "
                        f"reduce the number of tokens in the input messages or the completion to fit within the "
                        f"limit.")
                if lsls[i] > len(prompt):
                    raise value_error(f"logprob_start_len={lsls[i]} is higher than the number of input tokens "
                                      f"{len(prompt)}. Please use a smaller logprob_start_len.")
                r_id = rids[k] if len(rids) > k else f"{rids[i]}_{j}"
                reqs.append(Req(rid=r_id, prompt_ids=list(prompt), params=p, return_logprob=bool(rlp[i]),
                                logprob_start_len=int(lsls[i]),
                                return_text_in_logprobs=bool(body.get("return_text_in_logprobs", False))))
        if len({r.rid for r in reqs}) != len(reqs):
            raise value_error(f"Duplicate request IDs detected within the request: {[r.rid for r in reqs]}")
        return reqs, single

    async def generate(self, request):
        if not self.engine.alive():
            return json_response({"error": {"message": "engine is shutting down"}}, 503)
        body = await self.body(request)
        reqs, single = self.parse_generate(body)
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
        from slime_actors.backends.weight_sync import broadcast, dtype_from_name
        e = self.engine
        names, dtypes, shapes = b["names"], b["dtypes"], b["shapes"]
        if not (len(names) == len(dtypes) == len(shapes)):
            return json_response({"success": False, "message": "names, dtypes and shapes differ in length"}, 400)
        with e.groups_lock:
            pg, group_backend = e.groups.get(b["group_name"], (None, None))
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
        comm_device = e.device if group_backend == "nccl" else torch.device("cpu")

        def recv():
            if b["load_format"] == "flattened_bucket":  # one buffer per group, views cached per bucket layout
                from slime_actors.backends.weight_sync import BucketReceiver
                rx = e.receivers.get(b["group_name"])
                if rx is None or rx.device != comm_device:
                    rx = e.receivers[b["group_name"]] = BucketReceiver(comm_device)
                named = rx.receive(pg, names, tdtypes, shapes)
            else:
                named = []
                for name, dt, shape in zip(names, tdtypes, shapes):
                    t = torch.empty(shape, dtype=dt, device=comm_device)
                    broadcast(t, pg)
                    named.append((name, t))
            e.load_named_weights(named)
            if b["weight_version"] is not None:
                e.weight_version = b["weight_version"]
            return len(named)
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
                              # SGLang answers its keys here, in clear; the local engine only whether it has them
                              "api_key": REDACTED if a.api_key else None,
                              "admin_api_key": REDACTED if a.admin_api_key else None,
                              "refused_requests": self.refused,
                              "version": f"slime-actors local engine (SGLang API {SGLANG_API_VERSION})",
                              "internal_states": [{"paused": e.paused, "running": len(e.running),
                                                   "waiting": len(e.waiting), "steps": e.steps}]})


# -- command line ----------------------------------------------------------------------------------------------

# Every other launch flag of SGLang 0.5.15.post1 (the table recorded from its ServerArgs, sglang_flags.py) is accepted
# and ignored -- memory fractions, CUDA graphs, radix cache, kernels, ... -- so one launch line serves both engines;
# the ones given are logged at start-up. A flag SGLang does not have is an error, as it would be for SGLang.
MULTI_DEVICE_FLAGS = {"tp_size": "--tp-size", "dp_size": "--dp-size", "pp_size": "--pp-size", "ep_size": "--ep-size"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m slime_actors.backends.local_engine",
                                description="Local HF engine speaking SGLang's native HTTP API (see docs/sglang.md)")
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--api-key", default=None)
    p.add_argument("--admin-api-key", default=None)
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--dp-size", "--data-parallel-size", type=int, default=1)
    p.add_argument("--pp-size", "--pipeline-parallel-size", type=int, default=1)
    p.add_argument("--ep-size", "--expert-parallel-size", type=int, default=1)
    p.add_argument("--dtype", default="auto", choices=["auto", "half", "float16", "bfloat16", "float", "float32"],
                   help="auto = float32 here (SGLang's auto would pick fp16/bf16); no mixed precision")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available)")
    p.add_argument("--base-gpu-id", type=int, default=0)
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument("--max-running-requests", "--max-batch-size", dest="max_running_requests", type=int, default=64)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--weight-version", default="default")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--skip-tokenizer-init", action="store_true")
    p.add_argument("--log-level", default=None)
    p.add_argument("--log-dir", default=None, help="(local) write JSON logs under LOG_DIR/logs/")
    from slime_actors.backends.sglang_flags import SERVER_FLAGS
    ours = {o for a in p._actions for o in a.option_strings}
    for f, nargs in SERVER_FLAGS.items():
        if f in ours:
            continue
        dest = "ignored__" + f[2:].replace("-", "_")
        if nargs == 0:
            p.add_argument(f, dest=dest, action="store_true", help=argparse.SUPPRESS)
        else:
            p.add_argument(f, dest=dest, nargs=nargs, default=None, help=argparse.SUPPRESS)
    return p


def merge_config_file(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """SGLang's `--config FILE` (server_args.prepare_server_args, server_args_config_parser.py): a YAML mapping of
    flag names (as written: `api-key`, not `api_key`) to values, whose flags go before the command line's, so the
    command line wins. true adds a switch, false leaves it out; a list gives the values after one flag. One --config
    at most, a .yaml / .yml file. (`--config=FILE` is read too: SGLang would ignore it -- and the keys in it.)"""
    at = [i for i, a in enumerate(argv) if a == "--config" or a.startswith("--config=")]
    if not at:
        return argv
    if len(at) > 1:
        parser.error("--config: multiple config files specified; only one is allowed")
    i = at[0]
    if argv[i] == "--config":
        if i + 1 >= len(argv):
            parser.error("--config: no config file given")
        path, rest = argv[i + 1], argv[:i] + argv[i + 2:]
    else:
        path, rest = argv[i].split("=", 1)[1], argv[:i] + argv[i + 1:]
    if not path.lower().endswith((".yaml", ".yml")):
        parser.error(f"--config {path}: the config file must be YAML (.yaml or .yml)")
    try:
        import yaml
        with open(path) as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        parser.error(f"--config {path}: no such file")
    except OSError as exc:
        parser.error(f"--config {path}: cannot read it: {exc}")
    except Exception as exc:  # noqa: BLE001 -- yaml.YAMLError and what it wraps
        parser.error(f"--config {path}: not valid YAML: {exc}")
    data = {} if data is None else data
    if not isinstance(data, dict):
        parser.error(f"--config {path}: the file must hold a mapping of flag names to values")
    switches = {o for act in parser._actions if isinstance(act, argparse._StoreTrueAction) for o in act.option_strings}
    out: list[str] = []
    for key, value in data.items():
        flag = f"--{key}"
        if isinstance(value, bool):
            if flag in switches:
                out += [flag] if value else []
            else:
                out += [flag, str(value).lower()]
        elif isinstance(value, list):
            out += [flag, *map(str, value)] if value else []
        elif isinstance(value, dict):
            out += [flag, json.dumps(value)]
        else:
            out += [flag, str(value)]
    return out + rest


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    argv = merge_config_file(list(sys.argv[1:] if argv is None else argv), p)
    args = p.parse_args(argv)
    for dest, flag in MULTI_DEVICE_FLAGS.items():
        if getattr(args, dest) != 1:
            p.error(f"{flag} {getattr(args, dest)}: the local engine runs one model replica on one device; "
                    f"use SGLang (sglang.launch_server) for {flag} > 1")
    args.ignored_flags = sorted("--" + k[len("ignored__"):].replace("_", "-") for k, v in vars(args).items()
                                if k.startswith("ignored__") and v not in (None, False))
    return args


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
    log.info("local engine ready", url=f"http://{args.host}:{args.port}", model=args.model_path,
             device=str(engine.device), dtype=str(engine.dtype), max_running_requests=engine.max_running,
             weight_version=engine.weight_version, ignored_sglang_flags=args.ignored_flags or None)
    print(f"The server is fired up and ready to roll! (local engine at http://{args.host}:{args.port})",
          file=sys.stderr, flush=True)
    await stop.wait()
    log.info("local engine stopping")
    await asyncio.to_thread(engine.stop)  # in-flight requests come back aborted, then the HTTP side closes
    await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    setup_logging(run_dir=args.log_dir, name=f"local_engine-{args.port}", level=args.log_level)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args))
    # Leave without running native finalizers: a communicator whose peer is gone can block exit for minutes.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
