"""Hugging Face <-> Megatron-core weight conversion for dense Llama / Qwen2 / Qwen3 models, as pure tensor mapping.

No megatron-core import here: the mapping is testable anywhere, and the megatron backend uses it for loading
(``--hf-checkpoint``), for ``--save-hf`` export and for weight sync (``named_weights`` yields HF names/layouts).

    spec = ArchSpec.from_hf("/path/to/hf_dir")                   # or a config dict / PretrainedConfig
    full = dict(hf_to_mcore(spec, hf_state_dict.__getitem__))       # Megatron names, unsharded
    shard = tp_shard(spec, name, full[name], tp_rank, tp_size)      # what tensor-parallel rank tp_rank holds
    full_again = tp_gather(spec, name, [shard_0, shard_1, ...])     # inverse of tp_shard
    hf_pairs = mcore_to_hf(spec, name, full_again)                  # [(hf_name, tensor), ...]

Megatron names are those of ``GPTModel`` built with ``get_gpt_layer_local_spec`` (no Transformer Engine), with
*global* layer indices (``decoder.layers.{i}.``); a pipeline stage holding layers ``[off, off + n)`` numbers them
``0 .. n-1`` locally (`to_local_name` / `to_global_name`). Transformer Engine's fused names
(``linear_qkv.layer_norm_weight``, ``linear_fc1.layer_norm_weight``) are understood on the way back too.

Layouts (Megatron side):

* ``self_attention.linear_qkv.weight`` ``[(nq + 2 nkv) * d, hidden]``: per query group g (``num_key_value_heads``
  groups of ``nq / nkv`` query heads), the rows of its query heads, then its key head, then its value head.
  Tensor parallelism splits it row-wise into ``tp`` contiguous chunks (whole groups; ``nkv % tp == 0``).
  Qwen2's q/k/v biases interleave the same way (``linear_qkv.bias``).
* ``mlp.linear_fc1.weight`` ``[2 * ffn, hidden]``: ``cat(gate, up)`` (SwiGLU: ``silu(gate) * up``). Tensor rank r
  holds ``cat(gate_r, up_r)`` -- each half split separately -- not a plain row chunk of the full tensor.
* ``linear_proj`` / ``linear_fc2``: split along the input dimension (row-parallel); embedding and output layer
  along the vocabulary, padded with zero rows to a multiple of ``tp`` (`padded_vocab_size`); norms replicated.
* Qwen3's ``self_attn.q_norm`` / ``k_norm`` are ``self_attention.q_layernorm`` / ``k_layernorm`` (per head).
* Tied embeddings (``tie_word_embeddings``): no ``lm_head.weight`` in HF and no ``output_layer.weight`` on the
  first pipeline stage; a last stage that is not the first holds a copy, loaded from ``model.embed_tokens``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..json_files import read_json_object

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")

LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
HF_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")

# per-layer Megatron suffix -> HF suffix (single tensors; qkv and fc1 are merged from several HF tensors)
_LAYER_DIRECT = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",   # TE spec
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",     # TE spec
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
_GLOBAL_DIRECT = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}

# tensor-parallel layout of each Megatron tensor (by suffix)
REPLICATED, ROWS, COLS, VOCAB, SWIGLU = "replicated", "rows", "cols", "vocab", "swiglu"


class ConversionError(ValueError):
    """A tensor name, shape or model configuration the converter does not handle; the message says which."""


def _cfg_get(hf_config: Any, key: str, default=None):
    if isinstance(hf_config, dict):
        v = hf_config.get(key, default)
    else:
        v = getattr(hf_config, key, default)
    return default if v is None else v


@dataclass(frozen=True)
class ArchSpec:
    """What the converter and the model builder need from a Hugging Face config."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    max_position_embeddings: int

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_query_groups

    @property
    def qkv_rows(self) -> int:
        return (self.num_attention_heads + 2 * self.num_query_groups) * self.head_dim

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_hf(cls, config: Any) -> "ArchSpec":
        """From an HF model directory (its config.json), a config dict, or a transformers PretrainedConfig."""
        if isinstance(config, (str, os.PathLike)):
            p = Path(config)
            config = read_json_object(p / "config.json" if p.is_dir() else p)
        mt = str(_cfg_get(config, "model_type", "")).lower()
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ConversionError(f"model_type {mt!r} is not supported by the megatron backend "
                                  f"(dense {', '.join(SUPPORTED_MODEL_TYPES)})")
        hidden = int(_cfg_get(config, "hidden_size"))
        heads = int(_cfg_get(config, "num_attention_heads"))
        kv = int(_cfg_get(config, "num_key_value_heads", heads))
        head_dim = int(_cfg_get(config, "head_dim", hidden // heads))
        act = str(_cfg_get(config, "hidden_act", "silu"))
        if act not in ("silu", "swish"):
            raise ConversionError(f"hidden_act {act!r}: only SwiGLU (silu) MLPs are supported")
        if heads % kv:
            raise ConversionError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
        if _cfg_get(config, "mlp_bias", False):
            raise ConversionError("mlp_bias=True is not supported")
        attn_bias = bool(_cfg_get(config, "attention_bias", False))
        if mt == "qwen2":
            qkv_bias = True
            if attn_bias:
                raise ConversionError("qwen2 with attention_bias is not a known layout")
        elif attn_bias:
            raise ConversionError(f"{mt} with attention_bias=True (an o_proj bias too) is not supported")
        else:
            qkv_bias = False
        if _cfg_get(config, "use_sliding_window", False):
            raise ConversionError("sliding-window attention is not supported")
        rope = _cfg_get(config, "rope_parameters", None) or {}
        scaling = _cfg_get(config, "rope_scaling", None) or {}
        rope_type = (rope.get("rope_type") or rope.get("type") or scaling.get("rope_type") or scaling.get("type")
                     or "default")
        if rope_type != "default":
            raise ConversionError(f"rope type {rope_type!r} is not supported (plain RoPE only)")
        theta = _cfg_get(config, "rope_theta", None)
        if theta is None:
            theta = rope.get("rope_theta", 10000.0)
        return cls(model_type=mt, num_layers=int(_cfg_get(config, "num_hidden_layers")), hidden_size=hidden,
                   num_attention_heads=heads, num_query_groups=kv, head_dim=head_dim,
                   ffn_hidden_size=int(_cfg_get(config, "intermediate_size")),
                   vocab_size=int(_cfg_get(config, "vocab_size")),
                   norm_eps=float(_cfg_get(config, "rms_norm_eps", 1e-6)), rope_theta=float(theta),
                   tie_word_embeddings=bool(_cfg_get(config, "tie_word_embeddings", False)), qkv_bias=qkv_bias,
                   qk_norm=(mt == "qwen3"),
                   max_position_embeddings=int(_cfg_get(config, "max_position_embeddings", 4096)))

    def check_parallel(self, tp: int, pp: int) -> None:
        """Raise ConversionError when the model cannot be split tp x pp ways."""
        if self.num_query_groups % tp:
            raise ConversionError(f"num_key_value_heads {self.num_query_groups} is not divisible by "
                                  f"--tensor-model-parallel-size {tp}")
        if self.ffn_hidden_size % tp:
            raise ConversionError(f"intermediate_size {self.ffn_hidden_size} is not divisible by tp={tp}")
        if self.num_layers % pp:
            raise ConversionError(f"num_hidden_layers {self.num_layers} is not divisible by "
                                  f"--pipeline-model-parallel-size {pp}")


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    """The vocabulary rounded up to a multiple of tp (Megatron's vocab-parallel layers need equal shards)."""
    return -(-vocab_size // tp) * tp


# -- names ---------------------------------------------------------------------------------------------------

def mcore_names(spec: ArchSpec, output_layer: bool | None = None) -> list[str]:
    """Every Megatron parameter name of the full model (global layer indices), in HF order. ``output_layer``:
    include ``output_layer.weight`` (default: when the embeddings are not tied)."""
    if output_layer is None:
        output_layer = not spec.tie_word_embeddings
    names = ["embedding.word_embeddings.weight"]
    for i in range(spec.num_layers):
        p = f"decoder.layers.{i}."
        names += [p + "input_layernorm.weight", p + "self_attention.linear_qkv.weight"]
        if spec.qkv_bias:
            names.append(p + "self_attention.linear_qkv.bias")
        if spec.qk_norm:
            names += [p + "self_attention.q_layernorm.weight", p + "self_attention.k_layernorm.weight"]
        names += [p + "self_attention.linear_proj.weight", p + "pre_mlp_layernorm.weight",
                  p + "mlp.linear_fc1.weight", p + "mlp.linear_fc2.weight"]
    names.append("decoder.final_layernorm.weight")
    if output_layer:
        names.append("output_layer.weight")
    return names


def hf_shapes(spec: ArchSpec, name: str) -> list[tuple[str, tuple[int, ...]]]:
    """The HF (name, shape) pairs that the Megatron tensor ``name`` (global) exports to, in order."""
    h, d, ffn = spec.hidden_size, spec.head_dim, spec.ffn_hidden_size
    nq, nkv = spec.num_attention_heads, spec.num_query_groups
    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return [(_GLOBAL_DIRECT[name], (spec.vocab_size, h))]
    if name == "decoder.final_layernorm.weight":
        return [("model.norm.weight", (h,))]
    m = LAYER_RE.match(name)
    if not m:
        raise ConversionError(f"unknown Megatron tensor {name!r}")
    i, rest = int(m.group(1)), m.group(2)
    p = f"model.layers.{i}."
    if rest == "self_attention.linear_qkv.weight":
        return [(p + "self_attn.q_proj.weight", (nq * d, h)), (p + "self_attn.k_proj.weight", (nkv * d, h)),
                (p + "self_attn.v_proj.weight", (nkv * d, h))]
    if rest == "self_attention.linear_qkv.bias":
        return [(p + "self_attn.q_proj.bias", (nq * d,)), (p + "self_attn.k_proj.bias", (nkv * d,)),
                (p + "self_attn.v_proj.bias", (nkv * d,))]
    if rest == "mlp.linear_fc1.weight":
        return [(p + "mlp.gate_proj.weight", (ffn, h)), (p + "mlp.up_proj.weight", (ffn, h))]
    shapes = {"input_layernorm.weight": (h,), "self_attention.linear_qkv.layer_norm_weight": (h,),
              "self_attention.linear_proj.weight": (h, nq * d), "self_attention.q_layernorm.weight": (d,),
              "self_attention.k_layernorm.weight": (d,), "pre_mlp_layernorm.weight": (h,),
              "mlp.linear_fc1.layer_norm_weight": (h,), "mlp.linear_fc2.weight": (h, ffn)}
    if rest not in shapes:
        raise ConversionError(f"unknown Megatron tensor {name!r}")
    return [(p + _LAYER_DIRECT[rest], shapes[rest])]


def hf_names(spec: ArchSpec) -> list[str]:
    """Every HF weight name of the model, in export order (tied: no lm_head.weight)."""
    return [n for name in mcore_names(spec) for n, _ in hf_shapes(spec, name)]


def to_local_name(name: str, layer_offset: int) -> str:
    """Global Megatron name -> the name on a pipeline stage whose first layer is ``layer_offset``."""
    m = LAYER_RE.match(name)
    return name if not m else f"decoder.layers.{int(m.group(1)) - layer_offset}.{m.group(2)}"


def to_global_name(name: str, layer_offset: int) -> str:
    m = LAYER_RE.match(name)
    return name if not m else f"decoder.layers.{int(m.group(1)) + layer_offset}.{m.group(2)}"


def layer_of(name: str) -> int | None:
    m = LAYER_RE.match(name)
    return int(m.group(1)) if m else None


def strip_prefixes(name: str) -> str:
    """Drop wrapper prefixes (DDP / Float16Module ``module.``) of a Megatron parameter name."""
    while name.startswith("module."):
        name = name[len("module."):]
    return name


# -- QKV and SwiGLU layouts ------------------------------------------------------------------------------------

def merge_qkv(spec: ArchSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """HF q/k/v (weights ``[n*d, hidden]`` or biases ``[n*d]``) -> Megatron's per-group interleaved linear_qkv."""
    g, hpg, d = spec.num_query_groups, spec.heads_per_group, spec.head_dim
    tail = tuple(q.shape[1:])
    for t, rows, what in ((q, g * hpg * d, "q"), (k, g * d, "k"), (v, g * d, "v")):
        if t.shape[0] != rows or tuple(t.shape[1:]) != tail:
            raise ConversionError(f"{what}_proj has shape {tuple(t.shape)}, expected ({rows}, *{tail})")
    qkv = torch.cat([q.reshape(g, hpg * d, *tail), k.reshape(g, d, *tail), v.reshape(g, d, *tail)], dim=1)
    return qkv.reshape(g * (hpg + 2) * d, *tail)


def split_qkv(spec: ArchSpec, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of merge_qkv (the full, unsharded tensor)."""
    g, hpg, d = spec.num_query_groups, spec.heads_per_group, spec.head_dim
    if qkv.shape[0] != spec.qkv_rows:
        raise ConversionError(f"linear_qkv has {qkv.shape[0]} rows, expected {spec.qkv_rows}")
    tail = tuple(qkv.shape[1:])
    x = qkv.reshape(g, (hpg + 2) * d, *tail)
    q, k, v = torch.split(x, [hpg * d, d, d], dim=1)
    return q.reshape(g * hpg * d, *tail), k.reshape(g * d, *tail), v.reshape(g * d, *tail)


def merge_fc1(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if gate.shape != up.shape:
        raise ConversionError(f"gate_proj {tuple(gate.shape)} and up_proj {tuple(up.shape)} differ")
    return torch.cat([gate, up], dim=0)


def split_fc1(fc1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    gate, up = fc1.chunk(2, dim=0)
    return gate, up


# -- HF <-> Megatron (full tensors) ------------------------------------------------------------------------------

def hf_to_mcore_tensor(spec: ArchSpec, name: str, get: Callable[[str], torch.Tensor]) -> torch.Tensor:
    """The full Megatron tensor ``name`` (global layer index) built from HF tensors read with ``get(hf_name)``."""
    if name == "output_layer.weight" and spec.tie_word_embeddings:
        return get("model.embed_tokens.weight")
    if name in _GLOBAL_DIRECT:
        return get(_GLOBAL_DIRECT[name])
    m = LAYER_RE.match(name)
    if not m:
        raise ConversionError(f"unknown Megatron tensor {name!r}")
    i, rest = int(m.group(1)), m.group(2)
    if not 0 <= i < spec.num_layers:
        raise ConversionError(f"{name}: layer {i} outside the model's {spec.num_layers} layers")
    p = f"model.layers.{i}."
    if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = rest.rsplit(".", 1)[1]
        return merge_qkv(spec, *(get(f"{p}self_attn.{x}_proj.{kind}") for x in "qkv"))
    if rest == "mlp.linear_fc1.weight":
        return merge_fc1(get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight"))
    if rest in _LAYER_DIRECT:
        return get(p + _LAYER_DIRECT[rest])
    raise ConversionError(f"unknown Megatron tensor {name!r}")


def hf_to_mcore(spec: ArchSpec, get: Callable[[str], torch.Tensor], names: list[str] | None = None
                ) -> Iterator[tuple[str, torch.Tensor]]:
    """(Megatron name, full tensor) for ``names`` (default: the whole model, `mcore_names`)."""
    for name in names if names is not None else mcore_names(spec):
        yield name, hf_to_mcore_tensor(spec, name, get)


def mcore_to_hf(spec: ArchSpec, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The HF (name, tensor) pairs of the full Megatron tensor ``name`` (global layer index). q/k/v and
    gate/up come back as views of ``tensor``."""
    name = strip_prefixes(name)
    expect = hf_shapes(spec, name)
    m = LAYER_RE.match(name)
    rest = m.group(2) if m else None
    if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        parts = list(split_qkv(spec, tensor))
    elif rest == "mlp.linear_fc1.weight":
        parts = list(split_fc1(tensor))
    else:
        parts = [tensor]
    out = []
    for (hf_name, shape), t in zip(expect, parts):
        if tuple(t.shape) != tuple(shape):
            raise ConversionError(f"{name} -> {hf_name}: shape {tuple(t.shape)}, expected {tuple(shape)}")
        out.append((hf_name, t))
    return out


def mcore_state_to_hf(spec: ArchSpec, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A full Megatron state dict (global names, unsharded, unpadded) -> HF state dict (tied: no lm_head)."""
    out: dict[str, torch.Tensor] = {}
    for name in mcore_names(spec):
        if name not in state:
            raise ConversionError(f"Megatron state has no {name!r}")
        out.update(mcore_to_hf(spec, name, state[name]))
    return out


# -- tensor parallelism ----------------------------------------------------------------------------------------

def tp_layout(name: str) -> str:
    """How tensor parallelism splits the Megatron tensor ``name``: replicated, rows, cols, vocab or swiglu."""
    name = strip_prefixes(name)
    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return VOCAB
    if name == "decoder.final_layernorm.weight":
        return REPLICATED
    m = LAYER_RE.match(name)
    rest = m.group(2) if m else name
    if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        return ROWS
    if rest == "mlp.linear_fc1.weight":
        return SWIGLU
    if rest in ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight"):
        return COLS
    if rest.endswith("norm.weight") or rest.endswith("layer_norm_weight") or rest.endswith("layernorm.weight"):
        return REPLICATED
    raise ConversionError(f"no tensor-parallel layout known for {name!r}")


def tp_shard(spec: ArchSpec, name: str, full: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """The part of the full tensor that tensor-parallel rank ``tp_rank`` of ``tp_size`` holds (a copy)."""
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank {tp_rank} outside tp_size {tp_size}")
    layout = tp_layout(name)
    if layout == REPLICATED or tp_size == 1 and layout != VOCAB:
        return full.clone()
    if layout == VOCAB:
        padded = padded_vocab_size(full.shape[0], tp_size)
        if padded != full.shape[0]:
            full = torch.cat([full, full.new_zeros(padded - full.shape[0], *full.shape[1:])])
        return full.chunk(tp_size, dim=0)[tp_rank].clone()
    if layout == ROWS:
        if full.shape[0] % tp_size:
            raise ConversionError(f"{name}: {full.shape[0]} rows do not split {tp_size} ways")
        return full.chunk(tp_size, dim=0)[tp_rank].clone()
    if layout == COLS:
        if full.shape[1] % tp_size:
            raise ConversionError(f"{name}: {full.shape[1]} columns do not split {tp_size} ways")
        return full.chunk(tp_size, dim=1)[tp_rank].clone()
    gate, up = split_fc1(full)
    if gate.shape[0] % tp_size:
        raise ConversionError(f"{name}: ffn size {gate.shape[0]} does not split {tp_size} ways")
    return torch.cat([gate.chunk(tp_size, 0)[tp_rank], up.chunk(tp_size, 0)[tp_rank]]).clone()


def tp_gather(spec: ArchSpec, name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """The full tensor from every tensor-parallel rank's shard (in rank order); inverse of tp_shard (vocab
    padding removed). Replicated tensors: the first shard."""
    layout = tp_layout(name)
    if layout == REPLICATED or len(shards) == 1 and layout != VOCAB:
        return shards[0]
    if layout == VOCAB:
        return torch.cat(shards, dim=0)[:spec.vocab_size]
    if layout == ROWS:
        return torch.cat(shards, dim=0)
    if layout == COLS:
        return torch.cat(shards, dim=1)
    halves = [split_fc1(s) for s in shards]
    return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)


def mcore_local_shapes(spec: ArchSpec, name: str, tp_size: int) -> tuple[int, ...]:
    """Shape of a tensor-parallel rank's shard of the Megatron tensor ``name``."""
    full = _mcore_full_shape(spec, name)
    layout = tp_layout(name)
    if layout == VOCAB:
        return (padded_vocab_size(full[0], tp_size) // tp_size, *full[1:])
    if layout in (ROWS, SWIGLU):
        return (full[0] // tp_size, *full[1:])
    if layout == COLS:
        return (full[0], full[1] // tp_size)
    return full


def _mcore_full_shape(spec: ArchSpec, name: str) -> tuple[int, ...]:
    shapes = [s for _, s in hf_shapes(spec, name)]
    if len(shapes) == 1:
        return tuple(shapes[0])
    return (sum(s[0] for s in shapes), *shapes[0][1:])


# -- reading HF checkpoints --------------------------------------------------------------------------------------

class HFReader:
    """Lazy access to the tensors of an HF model directory's safetensors files (one handle per file)."""

    def __init__(self, model_dir: str | os.PathLike, device: str | torch.device = "cpu"):
        from safetensors import safe_open
        self.dir = Path(model_dir)
        files = sorted(self.dir.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in {self.dir}")
        self._handles = {}
        self.where: dict[str, str] = {}
        for f in files:
            h = safe_open(str(f), framework="pt", device=str(device))
            self._handles[f.name] = h
            for k in h.keys():
                self.where[k] = f.name

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def keys(self) -> list[str]:
        return list(self.where)

    def get(self, name: str) -> torch.Tensor:
        f = self.where.get(name)
        if f is None:
            raise ConversionError(f"{self.dir}: no tensor {name!r} in the checkpoint")
        return self._handles[f].get_tensor(name)

    __getitem__ = get
