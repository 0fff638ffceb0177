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

import os
from dataclasses import dataclass, field
from typing import Any, Callable

from .json_files import read_small_json


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
    if _key("kv_lora_rank")(c) is not None:   # multi-latent attention: Megatron's MLA has dims of its own
        return None
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


def _model_type_in(*types: str) -> Callable[[dict], Any]:
    """A switch config.json implies by the model type alone (GLM4's extra layer norms, say)."""
    def get(c: dict) -> Any:
        mt = _key("model_type")(c)
        return None if mt is None else mt in types
    return get


def _mla(c: dict) -> Any:
    """Multi-latent attention: config.json has a kv_lora_rank (DeepSeek-V2/V3, Kimi-K2, Moonlight)."""
    return _key("kv_lora_rank")(c) is not None if _key("model_type")(c) is not None else None


def _rope_type(kind: str) -> Callable[[dict], Any]:
    def get(c: dict) -> Any:
        scaling = _key("rope_scaling")(c)
        if _key("model_type")(c) is None:
            return None
        return isinstance(scaling, dict) and (scaling.get("rope_type") or scaling.get("type")) == kind
    return get


def _rope(name: str) -> Callable[[dict], Any]:
    def get(c: dict) -> Any:
        scaling = _key("rope_scaling")(c)
        return scaling.get(name) if isinstance(scaling, dict) else None
    return get


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
               note="gradients are reduced in fp32 here (megatron: grad_reduce_in_fp32; torch: the fp32 weights' "
                    "gradients, with or without --bf16)"),
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
    CompatFlag("--rotary-scaling-factor", "arch", float, _ARCH, hf=_rope("factor")),
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
    CompatFlag("--moe-router-topk-scaling-factor", "arch", float, _ARCH, hf=_key("routed_scaling_factor")),
    CompatFlag("--moe-aux-loss-coeff", "fixed", float, expect=0.0,
               note="no MoE auxiliary loss here (it would change the loss)"),
    CompatFlag("--spec", "arch", str, _ARCH + " (a Megatron layer spec module)", nargs="+"),
    # -- model families (slime's scripts/models/*.sh): GLM4, Qwen3-MoE, DeepSeek-V3 / Kimi-K2 / Moonlight
    CompatFlag("--post-self-attn-layernorm", "arch", note=_ARCH + " (GLM4's layer norm after attention)",
               hf=_model_type_in("glm4", "glm")),
    CompatFlag("--post-mlp-layernorm", "arch", note=_ARCH + " (GLM4's layer norm after the MLP)",
               hf=_model_type_in("glm4", "glm")),
    CompatFlag("--rotary-interleaved", "arch", note=_ARCH + " (GLM4's interleaved rotary embedding)",
               hf=_model_type_in("glm4", "glm")),
    CompatFlag("--moe-token-drop-policy", "noop", str,
               note="MoE layers here are dropless (no expert capacity factor), so no token is dropped whatever the "
                    "policy"),
    CompatFlag("--multi-latent-attention", "arch", note=_ARCH + " (DeepSeek's multi-latent attention)", hf=_mla),
    CompatFlag("--q-lora-rank", "arch", int, _ARCH, hf=_key("q_lora_rank")),
    CompatFlag("--kv-lora-rank", "arch", int, _ARCH, hf=_key("kv_lora_rank")),
    CompatFlag("--qk-head-dim", "arch", int, _ARCH, hf=_key("qk_nope_head_dim")),
    CompatFlag("--qk-pos-emb-head-dim", "arch", int, _ARCH, hf=_key("qk_rope_head_dim")),
    CompatFlag("--v-head-dim", "arch", int, _ARCH, hf=_key("v_head_dim")),
    CompatFlag("--mscale", "arch", float, _ARCH + " (YaRN rope scaling)", hf=_rope("mscale")),
    CompatFlag("--mscale-all-dim", "arch", float, _ARCH + " (YaRN rope scaling)", hf=_rope("mscale_all_dim")),
    CompatFlag("--moe-router-group-topk", "arch", int, _ARCH + " (groups each token's experts come from)",
               hf=_key("topk_group")),
    CompatFlag("--moe-router-num-groups", "arch", int, _ARCH + " (expert groups of the router)", hf=_key("n_group")),
    CompatFlag("--decoder-last-pipeline-num-layers", "noop", int,
               note="how Megatron splits layers over pipeline stages; the result is the same"),
    CompatFlag("--decoder-first-pipeline-num-layers", "noop", int,
               note="how Megatron splits layers over pipeline stages; the result is the same"),
    # -- more of slime's scripts/models/*.sh (Llama 3.x, Qwen3-Next)
    CompatFlag("--use-rope-scaling", "arch", note=_ARCH + " (Llama 3's rope scaling)", hf=_rope_type("llama3")),
    CompatFlag("--no-position-embedding", "arch", note=_ARCH + " (no learned position embeddings: rotary ones)"),
    CompatFlag("--make-vocab-size-divisible-by", "noop", int,
               note="Megatron's padding of the embedding; the model's vocabulary is config.json's"),
    CompatFlag("--no-check-for-nan-in-loss-and-grad", "noop", note="a check of Megatron's; the result is the same"),
    CompatFlag("--transformer-impl", "noop", str, note=_NOOP_KERNEL),
    CompatFlag("--use-gated-attention", "arch", note=_ARCH),
    CompatFlag("--attention-output-gate", "arch", note=_ARCH),
    CompatFlag("--moe-shared-expert-gate", "arch", note=_ARCH),
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
        "--load-debug-rollout-data-subsample", "--check-weight-update-equal")),
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
    config = read_small_json(f)
    return (config, f) if config is not None else (None, None)


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
    errors: list[str] = field(default_factory=list)     # flags whose value this project cannot honour
    family: str | None = None                           # what is supported for the model's family (one line)

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
        if self.family:
            out.append(self.family)
        return out


@dataclass(frozen=True)
class Family:
    """A model family of slime's scripts/models/*.sh whose flags go beyond a dense Llama-like model."""
    name: str
    model_types: tuple[str, ...]     # config.json model_type values of the family
    flags: tuple[str, ...]           # the flags that name the family in a slime script
    hf_class: str                    # what transformers runs it as (the torch backend, the local engine)
    more: str = ""                   # what else is worth knowing


FAMILIES = [
    Family("GLM4", ("glm4", "glm"), ("--post-self-attn-layernorm", "--post-mlp-layernorm", "--rotary-interleaved"),
           "Glm4ForCausalLM"),
    Family("Qwen3-MoE", ("qwen3_moe",), ("--moe-token-drop-policy",), "Qwen3MoeForCausalLM",
           "every rank holds every expert (no expert parallelism, dropless routing)"),
    Family("DeepSeek-V3 (multi-latent attention, MoE)", ("deepseek_v3", "deepseek_v2", "kimi_k2"),
           ("--multi-latent-attention", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim",
            "--v-head-dim", "--mscale", "--mscale-all-dim", "--moe-router-group-topk", "--moe-router-num-groups"),
           "DeepseekV3ForCausalLM", "every rank holds every expert (no expert parallelism): a model of this size "
           "needs memory no single GPU has"),
]
MEGATRON_MODEL_TYPES = ("llama", "qwen2", "qwen3")   # what the megatron backend converts (megatron_convert.py)


def _family_note(values: dict[str, Any], cfg: dict | None, train_backend: str | None) -> tuple[str | None,
                                                                                               str | None]:
    """(a note saying what is supported for the model's family, an error when the backend cannot run it)."""
    mt = _key("model_type")(cfg) if cfg is not None else None
    fam = next((f for f in FAMILIES if mt in f.model_types), None) or \
        next((f for f in FAMILIES if any(n in values for n in f.flags)), None)
    error = None
    if train_backend == "megatron" and mt is not None and mt not in MEGATRON_MODEL_TYPES:
        error = (f"--train-backend megatron: the model is {mt!r} (config.json's model_type) and the megatron backend "
                 f"converts dense {', '.join(MEGATRON_MODEL_TYPES)} models only; use --train-backend torch, which "
                 "runs any model transformers has")
    if fam is None:
        return None, error
    more = f"; {fam.more}" if fam.more else ""
    return (f"model family {fam.name}: the torch backend and the local engine run it through transformers "
            f"({fam.hf_class}); the megatron backend does not (dense {', '.join(MEGATRON_MODEL_TYPES)} only); "
            f"SGLang serves it as SGLang does{more}"), error


def check(values: dict[str, Any], hf_checkpoint: str | None, train_backend: str | None = None) -> CompatResult:
    """The compat flags given (`values`: flag name -> parsed value, only those given) against what this project
    does and the model's config.json: `errors` names every one that would change the result; the rest become
    notes for the user."""
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
                res.errors.append(f"{shown}: not supported: {flag.note}")
            else:
                res.fixed.append(shown)
        else:  # arch
            implied = flag.hf(cfg) if (flag.hf is not None and cfg is not None) else None
            if implied is None:
                res.unchecked.append(shown)
            elif flag.switch and value and not implied:
                res.errors.append(f"{shown}: {res.hf_path} describes a model without it ({_hf_desc(flag, cfg)}); "
                                  "the model trained is the one config.json describes -- drop the flag or use "
                                  "the matching checkpoint")
            elif not flag.switch and not _same(value, implied):
                res.errors.append(f"{shown}: {res.hf_path} says {implied} ({_hf_desc(flag, cfg)}); the model "
                                  "trained is the one config.json describes -- fix the flag or use the matching "
                                  "checkpoint")
            else:
                res.checked.append(shown)
    res.family, error = _family_note(values, cfg, train_backend)
    if error:
        res.errors.append(error)
    return res


def _hf_desc(flag: CompatFlag, cfg: dict) -> str:
    return {"--swiglu": f"hidden_act {cfg.get('hidden_act')!r}",
            "--group-query-attention": f"num_key_value_heads {cfg.get('num_key_value_heads')}, "
                                       f"num_attention_heads {cfg.get('num_attention_heads')}",
            "--untie-embeddings-and-output-weights": f"tie_word_embeddings {cfg.get('tie_word_embeddings')}",
            "--kv-channels": "head_dim (or hidden_size / num_attention_heads)",
            }.get(flag.name, f"model_type {cfg.get('model_type')!r}" if flag.name in _FAMILY_SWITCHES else
                  "config.json")


_FAMILY_SWITCHES = ("--post-self-attn-layernorm", "--post-mlp-layernorm", "--rotary-interleaved",
                    "--multi-latent-attention")


# ---------------------------------------------------------------------------------------------------------------
# slime's function paths (the values of --rollout-function-path, --dynamic-sampling-filter-path, ... in its
# scripts): mapped to this project's built-ins, or refused with the reason -- at parse time, not in an actor

SLIME_FUNCTIONS: dict[str, str | None] = {   # slime's path -> this project's (None: the built-in; the flag unset)
    "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std":
        "slime_actors.filters.check_reward_nonzero_std",
    "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std_with_fallback":
        "slime_actors.filters.check_reward_nonzero_std_with_fallback",
    "slime.rollout.sglang_rollout.generate_rollout": None,   # slime's default rollout: the built-in one here
    "slime.rollout.sglang_rollout.generate": None,           # slime's default generate function: the built-in one
    "slime.rollout.rm_hub.async_rm": None,                   # slime's reward dispatcher: --rm-type picks it here
    "slime.rollout.rm_hub.batched_async_rm": None,
}
SLIME_FUNCTIONS_REFUSED: dict[str, str] = {
    "slime.rollout.sft_rollout.generate_rollout":
        "slime's SFT rollout (training on the dataset's own responses) is not implemented here; --loss-type "
        "sft_loss trains on the engines' responses",
    "slime.rollout.fully_async_rollout.generate_rollout_fully_async":
        "slime's fully asynchronous rollout is not implemented here; --async-train generates the next rollout while "
        "the trainer trains on this one",
    "slime.rollout.on_policy_distillation.reward_func": "on-policy distillation is not implemented here",
    "slime.rollout.on_policy_distillation.post_process_rewards": "on-policy distillation is not implemented here",
    "slime.rollout.sleep_rollout.sleep": "slime's profiling stub has no counterpart here",
}
# (section, field, what this project offers instead) of each flag that names a function
FUNCTION_FLAGS = (
    ("rollout", "dynamic_sampling_filter_path", "slime_actors.filters.check_reward_nonzero_std (or "
                                                "..._with_fallback)"),
    ("rollout", "rollout_function_path", "leave the flag out: the built-in rollout"),
    ("rollout", "custom_generate_function_path", "leave the flag out: the built-in generate"),
    ("reward", "custom_rm_path", "--rm-type (math, deepscaler, dapo, f1, remote_rm, ...)"),
    ("algorithm", "custom_loss_function_path", "--loss-type policy_loss or sft_loss"),
    ("reward", "reward_actor_class", "leave the flag out: the built-in reward workers"),
)


def map_function_paths(job: Any, problems: list) -> list[str]:
    """slime's function paths in the job's flags as this project's (in place); a slime path with no counterpart is
    a problem naming the flag and why. Returns the notes (what was mapped)."""
    notes = []
    for section, name, instead in FUNCTION_FLAGS:
        sec = getattr(job, section)
        path = getattr(sec, name)
        if not isinstance(path, str) or not path.startswith(("slime.", "slime_plugins.")):
            continue
        option = "--" + name.replace("_", "-")
        if path in SLIME_FUNCTIONS:
            ours = SLIME_FUNCTIONS[path]
            setattr(sec, name, ours)
            notes.append(f"{option} {path}: slime's function, here " + (ours or "the built-in one (the flag unset)"))
        elif path in SLIME_FUNCTIONS_REFUSED:
            problems.append(f"{option} {path}: {SLIME_FUNCTIONS_REFUSED[path]}")
        else:
            problems.append(f"{option} {path}: a module of slime, which slime-actors does not include (slime's "
                            f"plug-ins take slime's objects); here: {instead}, or a function of your own")
    return notes
