"""slime's flags that are not fields of this project's config: what a copy of slime's launch script gets here.

A slime launch script carries three kinds of flags besides the ones this project implements under slime's names
(slime_actors.config):

* Megatron-LM's own flags (slime passes them to Megatron): model architecture (`--num-layers 36`), parallel sizes,
  dropouts, the optimizer, memory and speed settings. `MEGATRON_FLAGS` lists the ones slime's scripts carry, each
  of one kind:
    "noop"   memory or speed only (`--sequence-parallel`, `--recompute-granularity full`): accepted, no effect here,
             the result is the same;
    "fixed"  a setting this project has fixed (`--optimizer adam`, `--attention-dropout 0.0`, `--lr-decay-style
             constant`): accepted when it names what this project does, refused with the reason otherwise (it would
             change the result);
    "arch"   the model's architecture, which comes from --hf-checkpoint's config.json here: a value given is checked
             against that file (refused when it differs), and otherwise accepted;
    "env"    a secret handed to the job's processes in the environment, never written to job files (--wandb-key);
    "alias"  slime's other name of one of this project's flags (--sglang-server-concurrency).
* slime's own flags that do nothing here, for the same reasons ("noop" / "fixed" entries of `SLIME_ACCEPTED`);
* slime's flags for features this project does not have: `SLIME_UNSUPPORTED` says why, and the parser refuses them
  with that reason (instead of a bare "unrecognized argument").

`check(values, hf_config)` turns the flags given into notes (one line per kind, printed at start) or raises
CompatError naming the flag. Every flag here also shows in `slime-actors train --help` with its note, and in
docs/flags.md.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable


class CompatError(ValueError):
    """A slime/Megatron flag with a value this project cannot honour; the message names the flag and why."""


@dataclass(frozen=True)
class CompatFlag:
    name: str                     # "--sequence-parallel"
    kind: str                     # "noop" | "fixed" | "arch" | "env" | "alias"
    type: type = bool             # bool: a switch; int / float / str: takes one value
    note: str = ""                # one line: why it has no effect / what is fixed / where the value comes from
    expect: Any = None            # fixed: the value(s) that mean what this project does (a tuple: any of them)
    hf: Callable[[dict], Any] | None = None   # arch: the value config.json implies (None: not determinable)
    nargs: str | None = None      # "+": takes several values
    origin: str = "megatron"      # "megatron" | "slime"
    env_var: str | None = None    # env: the environment variable the value goes to (kept out of job files)
    alias: str | None = None      # alias: the field (slime_actors.config) this is slime's other name of

    @property
    def dest(self) -> str:
        return self.name[2:].replace("-", "_")

    @property
    def switch(self) -> bool:
        return self.type is bool


def _key(*names: str) -> Callable[[dict], Any]:
    """The first of these config.json keys that is present (also under text_config, as multimodal configs nest it)."""
    def get(c: dict) -> Any:
        for src in (c, c.get("text_config") or {}):
            for n in names:
                if n in src and src[n] is not None:
                    return src[n]
        return None
    return get


def _head_dim(c: dict) -> Any:
    explicit = _key("head_dim")(c)
    if explicit is not None:
        return explicit
    hidden, heads = _key("hidden_size")(c), _key("num_attention_heads")(c)
    return hidden // heads if hidden and heads else None


def _gqa(c: dict) -> Any:
    kv, heads = _key("num_key_value_heads")(c), _key("num_attention_heads")(c)
    return None if kv is None or heads is None else kv < heads


def _untied(c: dict) -> Any:
    tied = _key("tie_word_embeddings")(c)
    return None if tied is None else not tied


def _swiglu(c: dict) -> Any:
    act = _key("hidden_act", "hidden_activation")(c)
    return None if act is None else act in ("silu", "swish")


_NOOP_PARALLEL = "a memory/speed option of Megatron's tensor parallelism; the result is the same without it"
_NOOP_MEM = "a memory option of Megatron (activation recomputation); the result is the same without it"
_NOOP_KERNEL = "a kernel/fusion choice of Megatron; the result is the same (to rounding) without it"
_ARCH = "model architecture, which comes from --hf-checkpoint's config.json here"

MEGATRON_FLAGS: list[CompatFlag] = [
    # -- parallelism and memory
    CompatFlag("--sequence-parallel", "noop", note=_NOOP_PARALLEL),
    CompatFlag("--context-parallel-size", "fixed", int, expect=1,
               note="context parallelism is not implemented here: 1 (every rank holds whole sequences)"),
    CompatFlag("--expert-model-parallel-size", "fixed", int, expect=1,
               note="expert parallelism is not implemented here: 1"),
    CompatFlag("--expert-tensor-parallel-size", "fixed", int, expect=1,
               note="expert tensor parallelism is not implemented here: 1"),
    CompatFlag("--recompute-granularity", "noop", str, note=_NOOP_MEM),
    CompatFlag("--recompute-method", "noop", str, note=_NOOP_MEM),
    CompatFlag("--recompute-num-layers", "noop", int, note=_NOOP_MEM),
    CompatFlag("--accumulate-allreduce-grads-in-fp32", "noop",
               note="gradients are reduced in the parameters' dtype (fp32 unless --bf16) here"),
    CompatFlag("--attention-softmax-in-fp32", "noop",
               note="attention softmax accumulates in fp32 in this project's backends (megatron-core's default, "
                    "PyTorch's attention kernels)"),
    CompatFlag("--attention-backend", "noop", str, note=_NOOP_KERNEL),
    CompatFlag("--no-rope-fusion", "noop", note=_NOOP_KERNEL),
    CompatFlag("--no-gradient-accumulation-fusion", "noop", note=_NOOP_KERNEL),
    CompatFlag("--no-masked-softmax-fusion", "noop", note=_NOOP_KERNEL),
    CompatFlag("--moe-permute-fusion", "noop", note=_NOOP_KERNEL),
    CompatFlag("--moe-grouped-gemm", "noop", note=_NOOP_KERNEL),
    CompatFlag("--moe-token-dispatcher-type", "noop", str, note=_NOOP_KERNEL),
    CompatFlag("--moe-enable-deepep", "noop", note=_NOOP_KERNEL),
    CompatFlag("--use-precision-aware-optimizer", "noop",
               note="the optimizer keeps fp32 states here (what the precision-aware optimizer keeps by default)"),
    CompatFlag("--optimizer-cpu-offload", "noop", note="a memory option; the optimizer stays on the GPU here"),
    CompatFlag("--overlap-cpu-optimizer-d2h-h2d", "noop", note="a speed option of --optimizer-cpu-offload"),
    CompatFlag("--overlap-grad-reduce", "noop", note="a speed option of Megatron's DDP"),
    CompatFlag("--overlap-param-gather", "noop", note="a speed option of Megatron's distributed optimizer"),
    CompatFlag("--distributed-backend", "noop", str, note="NCCL on GPU, gloo on CPU, chosen by --device here"),
    CompatFlag("--distributed-timeout-minutes", "noop", int,
               note="collective timeouts are the supervisor's here (docs/fault-tolerance.md)"),
    # -- the optimizer and its schedule (fixed here)
    CompatFlag("--optimizer", "fixed", str, expect="adam", note="Adam(W) is the optimizer here"),
    CompatFlag("--lr-decay-style", "fixed", str, expect="constant",
               note="the learning rate is constant (--lr) here; a decay schedule would change the result"),
    CompatFlag("--lr-warmup-iters", "fixed", int, expect=0, note="no learning-rate warm-up here"),
    CompatFlag("--lr-warmup-fraction", "fixed", float, expect=0.0, note="no learning-rate warm-up here"),
    CompatFlag("--min-lr", "noop", float, note="only a decay schedule reaches it; the learning rate is constant here"),
    CompatFlag("--adam-eps", "fixed", float, expect=1e-8, note="Adam's epsilon is 1e-8 here"),
    CompatFlag("--attention-dropout", "fixed", float, expect=0.0,
               note="dropout is off in both backends (Megatron's default is 0.1)"),
    CompatFlag("--hidden-dropout", "fixed", float, expect=0.0,
               note="dropout is off in both backends (Megatron's default is 0.1)"),
    # -- model architecture (config.json's)
    CompatFlag("--num-layers", "arch", int, _ARCH, hf=_key("num_hidden_layers", "num_layers")),
    CompatFlag("--hidden-size", "arch", int, _ARCH, hf=_key("hidden_size")),
    CompatFlag("--ffn-hidden-size", "arch", int, _ARCH, hf=_key("intermediate_size")),
    CompatFlag("--num-attention-heads", "arch", int, _ARCH, hf=_key("num_attention_heads")),
    CompatFlag("--group-query-attention", "arch", note=_ARCH, hf=_gqa),
    CompatFlag("--num-query-groups", "arch", int, _ARCH, hf=_key("num_key_value_heads")),
    CompatFlag("--kv-channels", "arch", int, _ARCH, hf=_head_dim),
    CompatFlag("--vocab-size", "arch", int, _ARCH, hf=_key("vocab_size")),
    CompatFlag("--padded-vocab-size", "arch", int, _ARCH + " (the embedding may be padded further)"),
    CompatFlag("--max-position-embeddings", "arch", int, _ARCH, hf=_key("max_position_embeddings")),
    CompatFlag("--seq-length", "arch", int, _ARCH),
    CompatFlag("--norm-epsilon", "arch", float, _ARCH, hf=_key("rms_norm_eps", "layer_norm_eps", "norm_epsilon")),
    CompatFlag("--rotary-base", "arch", float, _ARCH, hf=_key("rope_theta")),
    CompatFlag("--rotary-percent", "arch", float, _ARCH, hf=_key("partial_rotary_factor")),
    CompatFlag("--rotary-scaling-factor", "arch", float, _ARCH),
    CompatFlag("--swiglu", "arch", note=_ARCH, hf=_swiglu),
    CompatFlag("--untie-embeddings-and-output-weights", "arch", note=_ARCH, hf=_untied),
    CompatFlag("--disable-bias-linear", "arch", note=_ARCH),
    CompatFlag("--add-qkv-bias", "arch", note=_ARCH),
    CompatFlag("--qk-layernorm", "arch", note=_ARCH),
    CompatFlag("--use-rotary-position-embeddings", "arch", note=_ARCH),
    CompatFlag("--position-embedding-type", "arch", str, _ARCH),
    CompatFlag("--normalization", "arch", str, _ARCH),
    CompatFlag("--apply-layernorm-1p", "arch", note=_ARCH),
    CompatFlag("--num-experts", "arch", int, _ARCH, hf=_key("num_experts", "num_local_experts", "n_routed_experts")),
    CompatFlag("--moe-router-topk", "arch", int, _ARCH, hf=_key("num_experts_per_tok")),
    CompatFlag("--moe-ffn-hidden-size", "arch", int, _ARCH, hf=_key("moe_intermediate_size")),
    CompatFlag("--moe-shared-expert-intermediate-size", "arch", int, _ARCH,
               hf=_key("shared_expert_intermediate_size")),
    CompatFlag("--moe-layer-freq", "arch", str, _ARCH),
    CompatFlag("--moe-router-score-function", "arch", str, _ARCH),
    CompatFlag("--moe-router-dtype", "arch", str, _ARCH),
    CompatFlag("--moe-router-pre-softmax", "arch", note=_ARCH),
    CompatFlag("--moe-router-load-balancing-type", "arch", str, _ARCH),
    CompatFlag("--moe-router-enable-expert-bias", "arch", note=_ARCH),
    CompatFlag("--moe-router-bias-update-rate", "arch", float, _ARCH),
    CompatFlag("--moe-router-topk-scaling-factor", "arch", float, _ARCH),
    CompatFlag("--moe-aux-loss-coeff", "fixed", float, expect=0.0,
               note="no MoE auxiliary loss here (it would change the loss)"),
    CompatFlag("--spec", "arch", str, _ARCH + " (a Megatron layer spec module)", nargs="+"),
]

SLIME_ACCEPTED: list[CompatFlag] = [
    CompatFlag("--balance-data", "noop", origin="slime",
               note="a speed option (balances tokens over data-parallel ranks); each rank trains whole prompt groups "
                    "here"),
    CompatFlag("--balance-by-flops", "noop", origin="slime", note="a speed option of micro-batch packing"),
    CompatFlag("--log-probs-chunk-size", "noop", int, origin="slime", note="a memory option"),
    CompatFlag("--recompute-loss-function", "noop", origin="slime", note="a memory option"),
    CompatFlag("--data-pad-size-multiplier", "noop", int, origin="slime", note="a speed option (padding)"),
    CompatFlag("--use-distributed-post", "noop", origin="slime", note="a speed option of slime's HTTP client"),
    CompatFlag("--async-save", "noop", origin="slime", note="checkpoints are written synchronously here"),
    CompatFlag("--keep-old-actor", "noop", origin="slime",
               note="old log-probs are the trainer's before its update here (on-policy: its training forward's)"),
    CompatFlag("--offload", "noop", origin="slime",
               note="memory is not offloaded between phases here; with --colocate leave the trainer room with "
                    "--sglang-mem-fraction-static"),
    CompatFlag("--offload-train", "noop", origin="slime", note="see --offload"),
    CompatFlag("--offload-rollout", "noop", origin="slime", note="see --offload"),
    CompatFlag("--model-name", "noop", str, origin="slime",
               note="the architecture comes from --hf-checkpoint's config.json"),
    CompatFlag("--tb-project-name", "noop", str, origin="slime",
               note="TensorBoard events go to RUN_DIR/tensorboard (--use-tensorboard)"),
    CompatFlag("--tb-experiment-name", "noop", str, origin="slime", note="see --tb-project-name"),
    CompatFlag("--wandb-always-use-train-step", "noop", origin="slime",
               note="every metric is logged at its rollout id here (one step per rollout)"),
    CompatFlag("--update-weights-interval", "fixed", int, expect=1, origin="slime",
               note="the engines get the new weights after every training step here"),
    CompatFlag("--update-weight-mode", "fixed", str, expect="full", origin="slime",
               note="every weight update sends all weights here (no delta updates)"),
    CompatFlag("--wandb-key", "env", str, origin="slime", env_var="WANDB_API_KEY",
               note="W&B's API key, handed to wandb as $WANDB_API_KEY (kept out of job files; visible in the process "
                    "list: prefer WANDB_API_KEY or `wandb login`)"),
    CompatFlag("--sglang-server-concurrency", "alias", int, origin="slime", alias="rollout_concurrency",
               note="requests in flight per engine (this project's --rollout-concurrency, which wins when both "
                    "are given)"),
    CompatFlag("--train-env-vars", "noop", str, origin="slime",
               note="set environment variables for every actor in the topology's env table (docs/launch.md)"),
]

COMPAT: dict[str, CompatFlag] = {f.name: f for f in MEGATRON_FLAGS + SLIME_ACCEPTED}

# slime's flags for what this project does not have, grouped by the reason
_UNSUPPORTED_GROUPS: list[tuple[str, tuple[str, ...]]] = [
    ("on-policy distillation is not implemented here", (
        "--use-opd", "--opd-type", "--opd-kl-coef", "--opd-teacher-load", "--opd-teacher-ckpt-step")),
    ("off-policy sequence masking / routing replay / mismatch metrics are not implemented here (--use-tis is)", (
        "--use-opsm", "--opsm-delta", "--use-routing-replay", "--use-rollout-routing-replay",
        "--get-mismatch-metrics", "--custom-tis-function-path", "--use-rollout-logprobs")),
    ("multi-token prediction training is not implemented here", (
        "--enable-mtp-training", "--mtp-num-layers", "--mtp-loss-scaling-factor")),
    ("slime's Megatron plug-in hooks have no counterpart here (the trainer is this project's own)", (
        "--custom-megatron-init-path", "--custom-megatron-before-log-prob-hook-path",
        "--custom-megatron-before-train-step-hook-path", "--custom-model-provider-path", "--megatron-config-path",
        "--megatron-deepgemm-forward-layers", "--megatron-deepgemm-forward-modules",
        "--megatron-deepgemm-moe-forward-layers", "--megatron-deepgemm-moe-forward-modules", "--qwen-gdn-backend",
        "--allgather-cp", "--freeze-indexer", "--release-train")),
    ("parameter freezing is not implemented here: every parameter trains", (
        "--only-train-params-name-list", "--freeze-params-name-list")),
    ("slime's replacement points for its own rollout pipeline have no counterpart here: use "
     "--rollout-function-path, --custom-generate-function-path, --dynamic-sampling-filter-path or --custom-rm-path",
     ("--data-source-path", "--buffer-filter-path", "--rollout-data-postprocess-path", "--rollout-sample-hook-path",
      "--rollout-sample-filter-path", "--rollout-all-samples-process-path", "--custom-convert-samples-to-train-data-path",
      "--custom-reward-post-process-path", "--custom-advantage-function-path", "--custom-pg-loss-reducer-function-path",
      "--eval-function-path", "--custom-rollout-log-function-path", "--custom-eval-rollout-log-function-path",
      "--disable-rollout-global-dataset", "--disable-compute-advantages-and-returns", "--custom-config-path",
      "--custom-update-weight-post-write-path")),
    ("not implemented here: rewards are used as the reward function returns them, then normalized per "
     "--advantage-estimator", ("--disable-rewards-normalization",)),
    ("slime's external rollout buffer service is not used here (the buffer is an actor of the job)", (
        "--rollout-buffer-url", "--fetch-trajectory-retry-times", "--min-batch-collection-ratio",
        "--rollout-task-type", "--loss-mask-type")),
    ("slime's debugging and CI switches have no counterpart here (see docs/debugging.md: traces, replay, "
     "--save-debug-rollout-data)", (
        "--ci-test", "--ci-disable-kl-checker", "--ci-train-rollout-logprob-abs-diff-threshold", "--ci-save-grad-norm",
        "--ci-load-grad-norm", "--dump-details", "--save-debug-train-data", "--load-forge-rollout-data",
        "--load-debug-rollout-data-subsample", "--check-weight-update-equal", "--memory-snapshot-dir",
        "--memory-snapshot-num-steps", "--profile-target", "--memory-recorder", "--record-memory-history")),
    ("delta / local-checkpoint weight updates are not implemented here (--update-weight-transport disk writes "
     "whole HF directories)", (
        "--update-weight-delta-encoding", "--update-weight-delta-checksum", "--update-weight-disk-keep-files",
        "--update-weight-local-checkpoint-dir")),
    ("multimodal prompts are not supported here", ("--multimodal-keys",)),
    ("prefill/decode disaggregation is not implemented here (one engine per rollout worker; --sglang-<flag> passes "
     "flags to every engine)", ("--prefill-num-servers",)),
    ("its deployment files (prefill/decode disaggregation, several models) are not implemented here, and it cannot "
     "be passed through to SGLang as SGLang's own --config: SGLang's server settings go in the [sglang] table of the "
     "job's --config file, or as --sglang-<flag>", ("--sglang-config",)),
    ("not a flag here: a router this job starts takes --router-request-timeout-secs (every --router-<flag> is "
     "passed to the sglang-router)", ("--sglang-router-request-timeout-secs",)),
    ("not implemented here", (
        "--ref-ckpt-step", "--ref-update-interval", "--num-critic-only-steps", "--reset-optimizer-states",
        "--use-stateless-adam", "--use-unbiased-kl", "--use-rollout-entropy", "--mask-offpolicy-in-partial-rollout",
        "--rollout-skip-special-tokens", "--rollout-max-context-len", "--eval-max-context-len",
        "--eval-max-prompt-len", "--eval-min-new-tokens", "--eval-tool-key", "--eval-reward-key",
        "--log-multi-turn", "--log-reward-category", "--log-correct-samples", "--http-proxy",
        "--rollout-data-transport")),
]
SLIME_UNSUPPORTED: dict[str, str] = {name: why for why, names in _UNSUPPORTED_GROUPS for name in names}


def hf_config(path: str | None) -> tuple[dict | None, str | None]:
    """(config.json of a Hugging Face model directory, its path), or (None, None) when there is none to read."""
    if not path or not os.path.isdir(path):
        return None, None
    f = os.path.join(path, "config.json")
    try:
        with open(f) as fh:
            return json.load(fh), f
    except (OSError, ValueError):
        return None, None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))
    return a == b


def _show(flag: CompatFlag, value: Any) -> str:
    if flag.switch:
        return flag.name
    if isinstance(value, list):
        return f"{flag.name} {' '.join(str(v) for v in value)}"
    return f"{flag.name} {value}"


@dataclass
class CompatResult:
    noop: list[str] = field(default_factory=list)
    fixed: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    hf_path: str | None = None
    env: dict[str, str] = field(default_factory=dict)   # environment for the job's processes (secrets)

    def notes(self) -> list[str]:
        out = []
        if self.noop:
            out.append("accepted, no effect here (memory/speed settings; docs/flags.md says why): "
                       + ", ".join(self.noop))
        if self.fixed:
            out.append("accepted, what this project does anyway: " + ", ".join(self.fixed))
        if self.checked:
            out.append(f"model architecture from {self.hf_path}; these agree with it: " + ", ".join(self.checked))
        if self.unchecked:
            where = "--hf-checkpoint's config.json" if self.hf_path else "--hf-checkpoint (no config.json to check)"
            out.append(f"model architecture comes from {where}; accepted unchecked: " + ", ".join(self.unchecked))
        return out


def check(values: dict[str, Any], hf_checkpoint: str | None) -> CompatResult:
    """The compat flags given (`values`: flag name -> parsed value, only those given) against what this project
    does: CompatError naming the first that would change the result; else what to tell the user."""
    res = CompatResult()
    cfg, res.hf_path = hf_config(hf_checkpoint)
    for name, value in values.items():
        flag = COMPAT[name]
        shown = _show(flag, value)
        if flag.kind == "env":
            res.env[flag.env_var] = str(value)
        elif flag.kind == "alias":
            res.fixed.append(f"{shown} (--{flag.alias.replace('_', '-')})")
        elif flag.kind == "noop":
            res.noop.append(shown)
        elif flag.kind == "fixed":
            expect = flag.expect if isinstance(flag.expect, tuple) else (flag.expect,)
            if not any(_same(value, e) for e in expect):
                raise CompatError(f"{shown}: not supported: {flag.note}")
            res.fixed.append(shown)
        else:  # arch
            implied = flag.hf(cfg) if (flag.hf is not None and cfg is not None) else None
            if implied is None:
                res.unchecked.append(shown)
            elif flag.switch and value and not implied:
                raise CompatError(f"{shown}: {res.hf_path} describes a model without it ({_hf_desc(flag, cfg)}); "
                                  "the model trained is the one config.json describes -- drop the flag or use "
                                  "the matching checkpoint")
            elif not flag.switch and not _same(value, implied):
                raise CompatError(f"{shown}: {res.hf_path} says {implied} ({_hf_desc(flag, cfg)}); the model trained "
                                  "is the one config.json describes -- fix the flag or use the matching checkpoint")
            else:
                res.checked.append(shown)
    return res


def _hf_desc(flag: CompatFlag, cfg: dict) -> str:
    return {"--swiglu": f"hidden_act {cfg.get('hidden_act')!r}",
            "--group-query-attention": f"num_key_value_heads {cfg.get('num_key_value_heads')}, "
                                       f"num_attention_heads {cfg.get('num_attention_heads')}",
            "--untie-embeddings-and-output-weights": f"tie_word_embeddings {cfg.get('tie_word_embeddings')}",
            "--kv-channels": "head_dim (or hidden_size / num_attention_heads)",
            }.get(flag.name, "config.json")
