"""SGLang's request checks, without a server or a model: the sampling parameters, the body of /generate and the
bodies of the control endpoints, refused with the status and JSON body SGLang 0.5.15.post1 answers for the same case
(its FastAPI validation, SamplingParams.__post_init__ / verify, the tokenizer manager's checks). The scheduler runs
what passes; the server turns a RequestError into its answer.
"""

from __future__ import annotations

import math
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

SGLANG_API_VERSION = "0.5.15.post1"
SAMPLING_EPS = 1e-6
TOP_K_ALL = 1 << 30

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
                        "return_hidden_states": False, "return_routed_experts": False,
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


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


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


@dataclass(eq=False)
class GenerateItem:
    """One request of a /generate body, checked: what the scheduler runs (scheduler.Req adds its state)."""
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    return_text_in_logprobs: bool = False
    lora_path: str | None = None   # the name of a loaded LoRA adapter (SGLang's field; None: the base model)


def parse_generate(body: Any, *, vocab_size: int, context_len: int,
                   tokenize: Callable[[str], list[int]] | None) -> tuple[list[GenerateItem], bool]:
    """SGLang's GenerateReqInput: the body of a /generate, checked (FastAPI's validation, then normalize_batch_and_
    arguments and the tokenizer manager's checks), with SGLang's error classes. Returns the requests -- parallel
    samples (n > 1) expanded as SGLang does, [all prompts] * n -- and whether the body was a single request (the
    answer is then one object, not a list). `tokenize` turns a text into token ids (None: text is refused)."""
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
    lora = body.get("lora_path")
    _check(lora is None or isinstance(lora, str) or (isinstance(lora, list) and all(x is None or isinstance(x, str)
                                                                                   for x in lora)),
           "lora_path", "Input should be a valid string or list of strings")
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
        if tokenize is None:
            raise value_error("text input needs the tokenizer (the engine was started with --skip-tokenizer-init)")
        single = isinstance(text, str)
        texts = [text] if single else text
        prompts = [tokenize(t) for t in texts]
    bs = len(prompts)

    def per_item(v, default):
        if isinstance(v, list):
            if len(v) != bs:
                raise value_error(f"expected {bs} values, got {len(v)}")
            return v
        return [default if v is None else v] * bs

    sps = per_item(sp, {})
    params = [parse_sampling_params(x, vocab_size) for x in sps]
    n = params[0].n
    if any(p.n != n for p in params):
        raise value_error("The parallel_sample_num should be the same for all samples in sample params.")
    rlp = per_item(body.get("return_logprob"), False)
    loras = lora if isinstance(lora, list) else [lora] * bs
    if len(loras) != bs:
        raise value_error(f"expected {bs} values, got {len(loras)}")
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
            if any((not _is_int(t)) or t < 0 or t >= vocab_size for t in prompt):
                raise value_error(f"The input_ids {prompt} contains values greater than the vocab size "
                                  f"({vocab_size}).")
            if not prompt:
                raise value_error("input_ids cannot be empty.")
            if len(prompt) >= context_len:
                raise value_error(f"The input ({len(prompt)} tokens) is longer than the model's context "
                                  f"length ({context_len} tokens).")
            p = params[i]
            if p.max_new_tokens is not None and p.max_new_tokens + len(prompt) > context_len:
                raise value_error(
                    f"Requested token count exceeds the model's maximum context length of {context_len} "
                    f"tokens. You requested a total of {p.max_new_tokens + len(prompt)} tokens: {len(prompt)} "
                    f"tokens from the input messages and {p.max_new_tokens} tokens for the completion. Please "
                    f"reduce the number of tokens in the input messages or the completion to fit within the "
                    f"limit.")
            if lsls[i] > len(prompt):
                raise value_error(f"logprob_start_len={lsls[i]} is higher than the number of input tokens "
                                  f"{len(prompt)}. Please use a smaller logprob_start_len.")
            r_id = rids[k] if len(rids) > k else f"{rids[i]}_{j}"
            reqs.append(GenerateItem(rid=r_id, prompt_ids=list(prompt), params=p, return_logprob=bool(rlp[i]),
                                     logprob_start_len=int(lsls[i]), lora_path=loras[i] or None,
                                     return_text_in_logprobs=bool(body.get("return_text_in_logprobs", False))))
    if len({r.rid for r in reqs}) != len(reqs):
        raise value_error(f"Duplicate request IDs detected within the request: {[r.rid for r in reqs]}")
    return reqs, single


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
    "LoadLoRAAdapterReqInput": {**_BASE, "lora_name": (_STR, REQUIRED), "lora_path": (_STR, REQUIRED),
                                "pinned": (_BOOL, False), "lora_id": (_OSTR, None)},
    "UnloadLoRAAdapterReqInput": {**_BASE, "lora_name": (_STR, REQUIRED), "lora_id": (_OSTR, None)},
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

