"""Megatron's torch_dist checkpoints (megatron-core `dist_checkpointing`, the format slime saves) read and written
with `torch.distributed.checkpoint` alone: no megatron-core, no process group, no GPU.

    tensors = read_model_tensors(dir)                # {megatron name (global layer index): full tensor}
    write_model_tensors(dir, {name: tensor, ...})    # a torch_dist directory megatron-core's dist_checkpointing loads

A torch_dist directory holds `.metadata` (the DCP metadata: every key's global shape and dtype), `__R_0.distcp`
files (the data), `metadata.json` ({"sharded_backend": "torch_dist", ...}) and, in older checkpoints, `common.pt`
(newer ones keep the non-tensor state as a `common_state` object inside). Model tensors are stored under
megatron-core's sharded keys: the layers of a TransformerBlock stacked along a first axis
(`decoder.layers.self_attention.linear_qkv.weight` of shape [num_layers, ...]); the per-layer norms under Transformer
Engine's fused names for the local layer spec too (STORAGE_NAMES); tensor-parallel shards as parts of one global
tensor (the fused QKV rows; `linear_fc1` as cat(gate, up) -- megatron's SwiGLU factory stores the gate halves of
every rank first; the vocabulary padded to the saving layout's padded size). Keys of the optimizer (`optimizer.*`),
RNG, `_extra_state` and common objects are not model weights.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import torch

from .megatron_convert import LAYER_RE, ConversionError
from .safe_pickle import safe_reader

CONFIG = {"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch",
          "common_backend_version": 1}
_STACKED_RE = re.compile(r"^decoder\.layers\.(?!\d+\.)(.+)$")
_NOT_WEIGHTS = ("optimizer.", "rng_state", "common_state", "rerun_state")


def _reader(path: str | os.PathLike):
    """A DCP reader whose `.metadata` is unpickled through safe_pickle's allow-list (a checkpoint from elsewhere
    runs no code); the tensor data torch reads with weights_only=True."""
    return safe_reader(path)


def is_torch_dist(path: str | os.PathLike) -> bool:
    p = Path(path)
    return (p / ".metadata").is_file()


def tensor_metadata(path: str | os.PathLike) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """{key: (global shape, dtype)} of every tensor in the checkpoint (model, optimizer, ...)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    if not is_torch_dist(path):
        raise ConversionError(f"{path}: no .metadata -- not a torch_dist checkpoint directory")
    md = _reader(path).read_metadata()
    return {k: (tuple(v.size), v.properties.dtype) for k, v in md.state_dict_metadata.items()
            if isinstance(v, TensorStorageMetadata)}


def model_keys(meta: dict) -> dict:
    """The model's tensors among a checkpoint's keys (not optimizer state, RNG, extra state)."""
    return {k: v for k, v in meta.items() if not k.startswith(_NOT_WEIGHTS) and "_extra_state" not in k}


def read_model_tensors(path: str | os.PathLike, num_layers: int | None = None) -> dict[str, torch.Tensor]:
    """Every model tensor of the torch_dist checkpoint at `path`, full (tensor-parallel shards joined) and with
    per-layer names (`decoder.layers.{i}.`: stacked keys are split along their first axis)."""
    from torch.distributed.checkpoint import load
    keys = model_keys(tensor_metadata(path))
    if not keys:
        raise ConversionError(f"{path}: a torch_dist checkpoint without model tensors (only "
                              f"{', '.join(sorted(tensor_metadata(path))[:5]) or 'non-tensor entries'})")
    state = {k: torch.empty(shape, dtype=dtype) for k, (shape, dtype) in keys.items()}
    with warnings.catch_warnings():  # "torch.distributed is disabled ...": one process, as intended
        warnings.simplefilter("ignore", UserWarning)
        load(state, storage_reader=_reader(path), no_dist=True)
    out: dict[str, torch.Tensor] = {}
    for k, t in state.items():
        m = _STACKED_RE.match(k)
        if m:
            if num_layers is not None and t.shape[0] != num_layers:
                raise ConversionError(f"{path}: {k} stacks {t.shape[0]} layers, the model config has {num_layers}")
            for i in range(t.shape[0]):
                out[f"decoder.layers.{i}.{m.group(1)}"] = t[i]
        else:
            out[k] = t
    return out


# megatron-core stores the local layer spec's norms under Transformer Engine's fused names (GPTModel's
# sharded_state_dict_keys_map), so checkpoints of both specs use these keys
STORAGE_NAMES = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
                 "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}
# layer modules that save an `_extra_state` object (megatron-core's parallel linears: None for the local spec)
_EXTRA_STATE = ("self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2")


def write_model_tensors(path: str | os.PathLike, tensors: dict[str, torch.Tensor]) -> Path:
    """Write a torch_dist checkpoint of model tensors given by megatron name (global layer indices, full tensors)
    as megatron-core's GPTModel saves one: layers stacked, norms under their storage names, the parallel linears'
    (empty) extra state, `metadata.json` and an empty legacy `common.pt`. `path` must be new or empty."""
    from torch.distributed.checkpoint import DefaultSavePlanner, FileSystemWriter, save
    out = Path(path)
    if out.exists() and any(out.iterdir()):
        raise ConversionError(f"{out}: not empty")
    out.mkdir(parents=True, exist_ok=True)
    layers: dict[str, dict[int, torch.Tensor]] = {}
    state: dict = {}
    for name, t in tensors.items():
        m = LAYER_RE.match(name)
        if m:
            layers.setdefault(STORAGE_NAMES.get(m.group(2), m.group(2)), {})[int(m.group(1))] = t
        else:
            state[name] = t.contiguous()
    n_layers = 0
    for suffix, per in layers.items():
        n = max(per) + 1
        if sorted(per) != list(range(n)):
            raise ConversionError(f"decoder.layers.*.{suffix}: layers {sorted(set(range(n)) - set(per))} missing")
        state[f"decoder.layers.{suffix}"] = torch.stack([per[i] for i in range(n)])
        n_layers = n
    for module in _EXTRA_STATE:  # (an object is stored as its torch.save bytes; megatron wraps it in a list)
        if f"decoder.layers.{module}.weight" in state:
            for i in range(n_layers):
                state[f"decoder.layers.{module}._extra_state/shard_{i}_{n_layers}"] = [None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        save(state, storage_writer=FileSystemWriter(str(out)), planner=DefaultSavePlanner(flatten_state_dict=False),
             no_dist=True)
    torch.save({}, out / "common.pt")
    (out / "metadata.json").write_text(json.dumps(CONFIG))
    return out
