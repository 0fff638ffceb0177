"""The local engine's scheduler: one thread that owns the model and runs continuous batching with a key/value cache.

Requests that arrive are prefilled together (left-padded, with attention masks and position ids), then join the
running batch, which decodes one token per step for every running request; finished requests leave the batch at
once. Everything that touches the model (weight loads, cache changes, aborts, pauses) runs on this thread between
steps: other threads hand it work with `Engine.submit` and `Engine.command`.

Numerics follow the trainer's convention: the log-prob of a sampled token is
``log_softmax(logits.float() / T)[token]`` (T = 1 for greedy, i.e. temperature < 1e-6), computed before top-k /
top-p filtering -- what SGLang 0.5.15.post1 returns by default (layers/sampler.py). Weights and activations stay in
the --dtype given (float32 by default; no autocast), so a full forward of prompt + response in the trainer
reproduces the returned log-probs to ~1e-6 on CPU.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import re
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from slime_actors.log import get_logger

from .params import GenerateItem, SamplingParams

log = get_logger(component="local_engine")


@dataclass(eq=False)
class Req(GenerateItem):
    """A request in the scheduler: what /generate asked for (GenerateItem) and how far it got."""
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
        self.mem_fraction = getattr(args, "mem_fraction_static", None)
        if self.device.type == "cuda" and self.mem_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(self.mem_fraction, self.device)
        self.dtype = resolve_dtype(args.dtype)
        if getattr(args, "enable_tf32_matmul", False) and self.device.type == "cuda":   # SGLang's flag:
            torch.set_float32_matmul_precision("high")   # this process's fp32 matmuls in TF32 (CPU: untouched)
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
        self.lora_enabled = bool(getattr(args, "enable_lora", False))
        self.adapters = None   # adapters.Adapters with --enable-lora: the model goes through it
        if self.lora_enabled:
            from .adapters import Adapters
            self.adapters = Adapters(self.model, getattr(args, "max_lora_rank", None),
                                     getattr(args, "lora_target_modules", None))
        self.config = self.model.config
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.context_len = int(args.context_length or getattr(self.config, "max_position_embeddings", 0) or 4096)
        self.eos_ids = self._eos_ids()
        self.max_running = int(args.max_running_requests or 64)
        # SGLang's --enable-deterministic-inference: a request's numbers do not depend on the batch it ran in
        self.deterministic = bool(getattr(args, "enable_deterministic_inference", False))
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
        # bucket layout -> (flat buffer, [(parameter, its view of the buffer)]): buckets received in place, the
        # buffer being the parameters' own storage (receive_weights)
        self.in_place: dict[tuple, tuple[torch.Tensor, list]] = {}
        # --keep-host-memory off (the default): weights received in place, malloc's free memory given back to the OS
        # when a batch empties and after a weight update
        self.release_memory = not bool(getattr(args, "keep_host_memory", False))
        self.trims = 0   # malloc_trim calls made (release_memory)
        self.groups_lock = threading.Lock()
        self._fwd_params: set | None = None
        self.profile: dict | None = None  # the torch profiler while /start_profile runs it
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
                    with torch.inference_mode(), self._profiled(admit):
                        if admit:
                            self._prefill(admit)
                        else:
                            self._decode()
                    self.steps += 1
                    if not self.running and not self.waiting:
                        self._release_host_memory()  # the batch's caches and activations went back to malloc
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

    # -- profiling: SGLang's /start_profile and /stop_profile (server.py); scheduler thread --
    def start_profile(self, output_dir: str, num_steps: int | None, activities: list[str] | None,
                      record_shapes: bool, with_stack: bool, prefix: str | None) -> str | None:
        """Start the torch profiler on this thread (it records the thread that starts it); None, or why not."""
        if self.profile is not None:
            return "Profiling is already in progress. Call /stop_profile first."
        from torch.profiler import ProfilerActivity, profile, record_function

        from slime_actors.profiler import mark_clock
        acts = [ProfilerActivity.CPU]
        if self.device.type == "cuda" and (activities is None or "GPU" in activities):
            acts.append(ProfilerActivity.CUDA)
        prof = profile(activities=acts, record_shapes=record_shapes, with_stack=with_stack,
                       profile_memory=activities is not None and "MEM" in activities)
        prof.start()
        profile_id = f"{time.time():.6f}"
        self.profile = {"prof": prof, "dir": output_dir, "id": profile_id, "left": num_steps, "prefix": prefix,
                        "clock": mark_clock(record_function), "steps": 0}
        log.info("profiling", output_dir=output_dir, num_steps=num_steps, profile_id=profile_id)
        return None

    def stop_profile(self) -> str | None:
        """Stop the profiler and write <output_dir>/[<prefix>-]<profile id>-TP-0.trace.json.gz (SGLang's name) and
        the clock marker's wall-clock time beside it (.clock.json); None, or why not."""
        if self.profile is None:
            return "Profiling is not in progress. Call /start_profile first."
        p, self.profile = self.profile, None
        p["prof"].stop()
        d = Path(p["dir"])
        d.mkdir(parents=True, exist_ok=True)
        stem = (f"{p['prefix']}-" if p["prefix"] else "") + f"{p['id']}-TP-0"
        p["prof"].export_chrome_trace(str(d / f"{stem}.trace.json.gz"))
        (d / f"{stem}.clock.json").write_text(json.dumps({"pid": os.getpid(), "engine": "local", "clock": p["clock"],
                                                          "steps": p["steps"],
                                                          "trace": f"{stem}.trace.json.gz"}))
        log.info("profile written", path=str(d / f"{stem}.trace.json.gz"), steps=p["steps"])
        return None

    @contextlib.contextmanager
    def _profiled(self, admit: list):
        """A step inside the profiler: a range named prefill or decode, with the step number and the rids."""
        if self.profile is None:
            yield
            return
        from torch.profiler import record_function
        rows = admit or self.running
        rids = ",".join(r.rid for r in rows[:16]) + (",..." if len(rows) > 16 else "")
        with record_function(f"{'prefill' if admit else 'decode'} step {self.steps} [{len(rows)}] rids={rids}"):
            yield
        self.profile["steps"] += 1
        if self.profile["left"] is not None:
            self.profile["left"] -= 1
            if self.profile["left"] <= 0:
                self.stop_profile()

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
    def _forward(self, input_ids, attention_mask, position_ids, cache, logits_to_keep, reqs: list[Req]):
        if self.deterministic and input_ids.shape[0] > 1:
            return self._forward_rows(input_ids, attention_mask, position_ids, cache, logits_to_keep, reqs)
        return self._forward_batch(input_ids, attention_mask, position_ids, cache, logits_to_keep, reqs)

    def _forward_rows(self, input_ids, attention_mask, position_ids, cache, logits_to_keep, reqs: list[Req]):
        """--enable-deterministic-inference: every row of the batch runs alone, on its own tokens only (no left
        padding from the other rows), so a request's logits and cache are the same bits whatever ran beside it.
        Without it, the shapes of a batch -- which requests arrived together, how long the longest is -- decide
        which kernel blocking the matmuls and attention use, and so the last bits of every request's log-probs
        (docs/reproducibility.md). The rows' results are padded back into the batch's layout."""
        B, L = input_ids.shape
        T = attention_mask.shape[1]
        past_T = T - L
        kv = self._kv(cache) if cache is not None else None
        logits_rows, kv_rows = [], []
        for i in range(B):
            m = attention_mask[i]
            n_new = int(m[past_T:].sum())
            n_past = int(m[:past_T].sum()) if past_T else 0
            ids = input_ids[i:i + 1, L - n_new:]
            pos = position_ids[i:i + 1, L - n_new:]
            mask = torch.ones((1, n_past + n_new), dtype=attention_mask.dtype, device=attention_mask.device)
            row_cache = None
            if kv is not None and n_past:
                row_cache = self._cache_from([(k[i:i + 1, :, past_T - n_past:past_T],
                                               v[i:i + 1, :, past_T - n_past:past_T]) for k, v in kv])
            logits, new = self._forward_batch(ids, mask, pos, row_cache, logits_to_keep, reqs[i:i + 1])
            keep = L if logits_to_keep == 0 else min(logits_to_keep, L)
            logits_rows.append(_lpad(logits, keep - logits.shape[1], 1))
            kv_rows.append([(_lpad(k, T - k.shape[2], 2), _lpad(v, T - v.shape[2], 2)) for k, v in self._kv(new)])
        logits = torch.cat(logits_rows)
        layers = [(torch.cat([r[j][0] for r in kv_rows]), torch.cat([r[j][1] for r in kv_rows]))
                  for j in range(len(kv_rows[0]))]
        return logits, self._cache_from(layers)

    def _forward_batch(self, input_ids, attention_mask, position_ids, cache, logits_to_keep, reqs: list[Req]):
        from transformers import DynamicCache
        if cache is None:
            cache = DynamicCache()
        if self._fwd_params is None:
            import inspect
            self._fwd_params = set(inspect.signature(self.model.forward).parameters)
        kw = {"cache" if "cache" in self._fwd_params else "past_key_values": cache}
        model = self.model
        if self.adapters is not None:   # each row with its own LoRA adapter (or none)
            model = self.adapters.model()
            kw.update(self.adapters.forward_kwargs([r.lora_path for r in reqs]))
        if "cache_position" in self._fwd_params:  # transformers < 5.2x wants it; later versions derive it
            past = attention_mask.shape[1] - input_ids.shape[1]
            kw["cache_position"] = torch.arange(past, past + input_ids.shape[1], device=self.device)
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
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
        logits, cache = self._forward(ids, mask, pos, None, 0 if any(want_input) else 1, reqs)
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
        logits, self.cache = self._forward(ids, mask, pos, self.cache, 1, self.running)
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

        a, b = T - self.mask.shape[1], T - mask.shape[1]
        kv = [(torch.cat([_lpad(ko, a, 2), _lpad(kn, b, 2)]), torch.cat([_lpad(vo, a, 2), _lpad(vn, b, 2)]))
              for (ko, vo), (kn, vn) in zip(old, new)]
        self.mask = torch.cat([_lpad(self.mask, a, 1), _lpad(mask, b, 1)])
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

    def adapter_in_use(self, name: str) -> bool:
        """Whether a request that is not finished runs (or waits) with the LoRA adapter `name`."""
        return any(r.lora_path == name and r.finish is None for r in (*self.running, *self.waiting))

    def load_named_weights(self, named: list[tuple[str, torch.Tensor]]) -> int:
        params = self._weight_targets([n for n, _ in named])
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

    def _release_host_memory(self) -> bool:
        """malloc's free memory back to the OS (glibc's malloc_trim, shared with the trainer: mailbox.allocator.trim)
        -- the key/value cache, activations and logits of a batch once it is done, the old weights after an update;
        otherwise the heaps keep them resident while the trainer works (docs/performance.md, "Engine memory on
        CPU"). Only with host memory (a CUDA engine's tensors are not malloc's) and unless --keep-host-memory."""
        if not self.release_memory:
            return False
        from slime_actors.mailbox import allocator
        self.trims += 1
        return allocator.trim()

    def _weight_targets(self, names: list[str]) -> dict[str, torch.Tensor]:
        """The model's parameters and buffers by name, LoRA-wrapped layers under their plain names too."""
        params = dict(self.model.named_parameters(remove_duplicate=False))
        params.update(dict(self.model.named_buffers(remove_duplicate=False)))
        if self.adapters is not None and self.adapters.peft is not None:
            # LoRA layers wrap the linear layers: "x.q_proj.weight" lives at "x.q_proj.base_layer.weight"
            for name in names:
                mod, _, leaf = name.rpartition(".")
                if name not in params and f"{mod}.base_layer.{leaf}" in params:
                    params[name] = params[f"{mod}.base_layer.{leaf}"]
        return params

    def receive_weights(self, group_name: str, names: list[str], dtypes: list, shapes: list,
                        flattened: bool) -> int:
        """One bucket of /update_weights_from_distributed, broadcast by the trainer in the group `group_name`, into
        the model (scheduler thread). A flattened bucket whose tensors are each a whole parameter of the same dtype,
        shape and device, none twice, is received in place: the first time into a fresh buffer whose views then
        become the parameters' storage (the old storage is freed), every later time with the same layout straight
        into that storage -- one copy of the weights, no copy step. Otherwise (or with --keep-host-memory) into the
        group's receive buffer (weight_sync.BucketReceiver, kept between syncs) and copied into the model. Returns
        the tensors loaded."""
        from slime_actors.backends.weight_sync import BucketReceiver, broadcast, bucket_slots
        with self.groups_lock:
            pg, group_backend = self.groups.get(group_name, (None, None))
        if pg is None:
            raise ValueError(f"Group {group_name} not in {list(self.groups)}. Please call "
                             "`init_weights_update_group` first.")
        comm_device = self.device if group_backend == "nccl" else torch.device("cpu")
        if not flattened:
            named = []
            for name, dt, shape in zip(names, dtypes, shapes):
                t = torch.empty(shape, dtype=dt, device=comm_device)
                broadcast(t, pg)
                named.append((name, t))
            return self.load_named_weights(named)
        key = (tuple(names), tuple(str(d) for d in dtypes), tuple(tuple(int(x) for x in s) for s in shapes))
        entry = self.in_place.get(key) if self.release_memory else None
        if entry is not None and all(p.data_ptr() == v.data_ptr() for p, v in entry[1]):
            broadcast(entry[0], pg)                      # into the parameters themselves
            return len(names)
        targets = self._in_place_targets(names, dtypes, shapes, comm_device) if self.release_memory else None
        slots = bucket_slots(dtypes, shapes, comm_device) if targets is not None else None
        if slots is None or any(v.data_ptr() % 64 for v in slots[1]):   # (the kernels see aligned weights as before)
            rx = self.receivers.get(group_name)
            if rx is None or rx.device != comm_device:
                rx = self.receivers[group_name] = BucketReceiver(comm_device)
            n = self.load_named_weights(rx.receive(pg, names, dtypes, shapes))
            self._release_host_memory()
            return n
        flat, views = slots
        broadcast(flat, pg)
        with torch.no_grad():
            for p, v in zip(targets, views):
                p.data = v                               # the old storage goes (unless something else holds it)
        self.in_place[key] = (flat, list(zip(targets, views)))
        # a layout whose parameters moved to another buffer is dropped (its buffer goes with its last parameter)
        self.in_place = {k: e for k, e in self.in_place.items() if all(p.data_ptr() == v.data_ptr() for p, v in e[1])}
        self.receivers.pop(group_name, None)             # a receive buffer from before is not needed any more
        self._release_host_memory()
        return len(names)

    def _in_place_targets(self, names: list[str], dtypes: list, shapes: list,
                          device: torch.device) -> list[torch.nn.Parameter] | None:
        """The parameters a flattened bucket can become the storage of (see receive_weights), or None."""
        params = self._weight_targets(names)
        out: list[torch.nn.Parameter] = []
        for name, dt, shape in zip(names, dtypes, shapes):
            p = params.get(name)
            if (not isinstance(p, torch.nn.Parameter) or p.dtype != dt or p.device != device
                    or tuple(p.shape) != tuple(int(x) for x in shape)):
                return None
            out.append(p)
        return out if len({id(p) for p in out}) == len(out) else None

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
        n = torch.cuda.device_count()
        if d.index >= n:
            raise SystemExit(f"--device {device} --base-gpu-id {base_gpu_id}: GPU {d.index} does not exist ({n} "
                             f"visible, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        torch.cuda.set_device(d)
    return d


def resolve_dtype(name: str) -> torch.dtype:
    return {"auto": torch.float32, "float": torch.float32, "float32": torch.float32, "half": torch.float16,
            "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def _lpad(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    """`t` with `n` zeros in front along `dim`."""
    if n <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)
