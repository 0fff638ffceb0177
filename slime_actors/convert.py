"""`slime-actors convert SRC DST`: model weights between this project's checkpoints, Megatron torch_dist checkpoints
(what slime and Megatron-LM save) and Hugging Face model directories.

    slime-actors convert RUN/ckpt OUT                      # our checkpoint (its newest iteration) -> HF directory
    slime-actors convert RUN/ckpt/iter_0000020 OUT         # one iteration of it
    slime-actors convert SLIME_CKPT OUT --hf-checkpoint M   # a torch_dist checkpoint (slime's iter_XXXXXXX/ or
                                                            #   release/, ours: trainer/dist/) -> HF directory
    slime-actors convert M OUT_DIST [--padded-vocab-size N] # an HF directory -> a torch_dist checkpoint

What SRC is decides the direction (slime_actors.checkpoints.detect_layout): a Hugging Face directory becomes a
torch_dist checkpoint, anything else becomes a Hugging Face directory. An HF output gets config, tokenizer and
other files from --hf-checkpoint (default: the model a checkpoint of ours was trained from, as its meta.json
records it), safetensors in HF names, and a `.slime-actors-export` marker. A torch_dist output is laid out as slime's
converter writes it -- OUT_DIST/latest_checkpointed_iteration.txt ("release") and OUT_DIST/release/ -- with
megatron-core GPTModel names of the local layer spec (this project's megatron backend; Transformer Engine's fused
layer-norm names are read, not written). Only weights are converted: optimizer state and RNG are not. DST must be
new or empty (or an HF export of ours, which is replaced). Dense Llama / Qwen2 / Qwen3 (megatron_convert.ArchSpec).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .safe_pickle import UnsafeCheckpointError
from .checkpoints import TRACKER, CheckpointError, detect_layout, read_meta, trainer_dir
from .json_files import JsonFileError, read_json_object

# Transformer Engine's fused names of the two per-layer norms (slime's default layer spec)
_TE_ALIASES = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
               "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}


class ConvertError(ValueError):
    """A source, destination or model that cannot be converted; the message says what was found."""


def _trainer_dir(src: Path) -> tuple[Path, dict]:
    """(the trainer state directory, the checkpoint's meta) of one of our checkpoints (root, iter or trainer/)."""
    lay = detect_layout(src)
    if lay.kind in ("ours", "ours-iter"):
        t = trainer_dir(lay.path)
        meta = read_meta(lay.path)
    else:
        t, meta = src, {}
    try:
        tmeta = read_json_object(t / "meta.json") if (t / "meta.json").is_file() else {}
    except JsonFileError as exc:
        raise ConvertError(f"the trainer's metadata {exc}") from None
    return t, {**meta, **tmeta}


def _hf_source(ns, meta: dict) -> Path:
    hf = ns.hf_checkpoint or meta.get("hf_checkpoint")
    if not hf:
        raise ConvertError(f"{ns.src}: say which model it is with --hf-checkpoint MODEL_DIR (a Hugging Face "
                           "directory of the same architecture: its config and tokenizer go into the output)")
    p = Path(hf)
    if not (p / "config.json").is_file():
        raise ConvertError(f"--hf-checkpoint {hf}: no config.json there" + (
            "" if ns.hf_checkpoint else " (recorded in the checkpoint's meta.json; give --hf-checkpoint)"))
    return p


def _torch_dist_dir(src: Path) -> Path:
    """The torch_dist directory of a source: slime's root (tracker -> iter / release), an iter dir, ours."""
    from .backends.torch_dist_io import is_torch_dist
    lay = detect_layout(src)
    if lay.kind == "megatron":
        return lay.path
    if lay.kind in ("ours", "ours-iter", "megatron-trainer"):
        t, _ = _trainer_dir(src)
        if (t / "dist").is_dir():
            return t / "dist"
    if is_torch_dist(src):
        return src
    raise ConvertError(f"{src}: {lay.detail}; not a torch_dist checkpoint")


def mcore_to_hf_tensors(spec, tensors: dict) -> list:
    """HF (name, tensor) pairs of a model given by megatron names (full tensors, per-layer names): TE fused norm
    names accepted, vocabulary padding dropped, every weight of the model required, nothing left over."""
    from .backends import megatron_convert as mc
    used = set()
    out = []
    for name in mc.mcore_names(spec):
        key = name
        if key not in tensors:
            m = mc.LAYER_RE.match(name)
            alias = m and _TE_ALIASES.get(m.group(2))
            if alias and f"decoder.layers.{m.group(1)}.{alias}" in tensors:
                key = f"decoder.layers.{m.group(1)}.{alias}"
            else:
                raise ConvertError(f"the checkpoint has no {name!r} (does --hf-checkpoint describe this model? "
                                   f"{spec.model_type}, {spec.num_layers} layers)")
        t = tensors[key]
        used.add(key)
        if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
            if t.shape[0] < spec.vocab_size:
                raise ConvertError(f"{key}: {t.shape[0]} rows, the config's vocab_size is {spec.vocab_size}")
            t = t[:spec.vocab_size]  # padding rows (a multiple of the tensor-parallel size, or 128)
        try:
            out.extend(mc.mcore_to_hf(spec, name, t))
        except mc.ConversionError as exc:
            raise ConvertError(f"{exc} (does --hf-checkpoint describe this model?)") from None
    if spec.tie_word_embeddings:
        used.add("output_layer.weight")  # a copy some pipeline layouts keep
    left = sorted(set(tensors) - used)
    if left:
        raise ConvertError(f"the checkpoint has weights the model of --hf-checkpoint has no place for: "
                           f"{', '.join(left[:5])}{' ...' if len(left) > 5 else ''} ({spec.model_type}, "
                           f"{spec.num_layers} layers; MoE and other layouts are not supported)")
    return out


def to_hf(ns) -> Path:
    from .backends.hf_export import check_export_target, export_hf
    src, dst = Path(ns.src), Path(ns.dst)
    lay = detect_layout(src)
    t, meta = _trainer_dir(src) if lay.kind in ("ours", "ours-iter", "torch-trainer", "megatron-trainer") \
        else (src, {})
    hf = _hf_source(ns, meta)
    check_export_target(dst, hf)
    info = {"converted_from": str(src.resolve())}
    if (t / "adapter").is_dir():   # the torch backend's LoRA adapters (backends/lora.py): merged into the base
        return export_hf(_merged_adapter(t / "adapter", hf), dst, hf,
                         {**info, "format": "torch backend LoRA checkpoint, merged into --hf-checkpoint"})
    if (t / "model.safetensors").is_file():  # the torch backend's state: HF names already
        from safetensors.torch import load_file
        sd = load_file(str(t / "model.safetensors"))
        _check_against_config(sd, hf)
        return export_hf(sd.items(), dst, hf, {**info, "format": "torch backend checkpoint"})
    from .backends.megatron_convert import ArchSpec, ConversionError
    from .backends.torch_dist_io import read_model_tensors
    dist = _torch_dist_dir(src)
    try:
        spec = ArchSpec.from_hf(hf)
        tensors = read_model_tensors(dist, spec.num_layers)
    except ConversionError as exc:
        raise ConvertError(str(exc)) from None
    pairs = mcore_to_hf_tensors(spec, tensors)
    return export_hf(pairs, dst, hf, {**info, "format": "torch_dist"})


def _merged_adapter(adapter: Path, hf: Path) -> list:
    """The base model of `hf` with the LoRA adapter directory merged in (peft's merge_and_unload), HF names, tied
    aliases left out."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from .backends.lora import LoraError, check_adapter_dir
    try:
        check_adapter_dir(adapter)
    except LoraError as exc:
        raise ConvertError(str(exc)) from None
    base = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    keep = {n for n, _ in model.named_parameters()}
    return [(k, v) for k, v in model.state_dict().items() if k in keep]


def _check_against_config(sd: dict, hf: Path) -> None:
    """The torch backend's weights against the model of --hf-checkpoint: the same names and shapes."""
    from safetensors import safe_open
    ref = {}
    for f in sorted(hf.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                ref[k] = tuple(h.get_slice(k).get_shape())
    if not ref:
        return
    if "lm_head.weight" not in sd:
        ref.pop("lm_head.weight", None)  # tied: the export drops the alias
    bad = [k for k in sd if k in ref and tuple(sd[k].shape) != ref[k]]
    extra, missing = sorted(set(sd) - set(ref)), sorted(set(ref) - set(sd))
    if bad or extra or missing:
        raise ConvertError(f"the checkpoint does not match the model of --hf-checkpoint {hf}: "
                           + "; ".join(x for x in (
                               bad and f"shapes differ for {', '.join(bad[:3])}",
                               extra and f"not in the model: {', '.join(extra[:3])}",
                               missing and f"missing: {', '.join(missing[:3])}") if x))


def to_torch_dist(ns) -> Path:
    import torch

    from .backends import megatron_convert as mc
    from .backends.torch_dist_io import write_model_tensors
    src, dst = Path(ns.src), Path(ns.dst)
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise ConvertError(f"{dst}: exists and is not empty; give a new directory")
    try:
        spec = mc.ArchSpec.from_hf(src)
        reader = mc.HFReader(src)
        tensors = dict(mc.hf_to_mcore(spec, reader.get))
    except (mc.ConversionError, FileNotFoundError) as exc:
        raise ConvertError(f"{src}: {exc}") from None
    pad = ns.padded_vocab_size or spec.vocab_size
    if pad < spec.vocab_size:
        raise ConvertError(f"--padded-vocab-size {pad} is smaller than the vocabulary ({spec.vocab_size})")
    for name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        if name in tensors and pad > spec.vocab_size:
            t = tensors[name]
            tensors[name] = torch.cat([t, t.new_zeros(pad - spec.vocab_size, *t.shape[1:])])
    write_model_tensors(dst / "release", tensors)
    (dst / TRACKER).write_text("release")
    return dst


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slime-actors convert", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", help="a checkpoint of ours (--save directory, iter_NNNNNNN/ or its trainer/), a torch_dist "
                               "checkpoint (slime's --save directory, iter_XXXXXXX/, release/), or an HF directory")
    p.add_argument("dst", help="the output directory (new or empty)")
    p.add_argument("--hf-checkpoint", default=None,
                   help="to HF: the model's Hugging Face directory (config and tokenizer are copied from it); "
                        "default: what a checkpoint of ours records")
    p.add_argument("--padded-vocab-size", type=int, default=None,
                   help="to torch_dist: pad embedding and output rows to this many (Megatron-LM pads the vocabulary "
                        "to a multiple of 128 x tensor-parallel size); default: the vocabulary size")
    return p


def main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    src = Path(ns.src)
    lay = detect_layout(src)
    try:
        if lay.kind in ("missing", "empty", "file"):
            raise ConvertError(f"{src}: {lay.detail}")
        if lay.kind == "unknown":
            raise ConvertError(f"{src}: {lay.detail}; expected a checkpoint of ours, a torch_dist checkpoint or a "
                               "Hugging Face model directory")
        if lay.kind == "hf":
            if ns.hf_checkpoint:
                raise ConvertError(f"{src} is a Hugging Face directory (converted to torch_dist); --hf-checkpoint is "
                                   "for the other direction")
            out = to_torch_dist(ns)
            print(f"torch_dist checkpoint written: {out} ({TRACKER}: release; {out / 'release'})")
        else:
            out = to_hf(ns)
            print(f"Hugging Face directory written: {out}")
    except (ConvertError, CheckpointError, UnsafeCheckpointError) as exc:
        print(f"slime-actors convert: error: {exc}", file=sys.stderr)
        return 2
    return 0

