"""LoRA through peft, the parts the trainer, the engines and the launcher share: which modules get adapters, the
adapters' names and files, merged weights.

    targets = resolve_targets(linear_module_names(model), ["all-linear"], exclude=None)  # ["down_proj", ...]
    peft_model = get_peft_model(model, lora_config(cfg.lora, targets))
    tensors = adapter_state(peft_model)            # PEFT's names: "base_model.model.<module>.lora_A.weight"
    write_adapter_dir(out, tensors, adapter_config(peft_model))    # adapter_model.safetensors, adapter_config.json
    check_adapter_dir(out, max_rank=8, allowed=...)                 # what an engine checks before loading one
    for name, t in merged_weights(peft_model): ...                  # HF names, base + scale * B @ A

An adapter directory is PEFT's: `adapter_config.json` (LoraConfig's fields) and `adapter_model.safetensors`
(tensors named `base_model.model.<module>.lora_A.weight` / `lora_B.weight`), which `PeftModel.from_pretrained`,
SGLang's `/load_lora_adapter` and vLLM read. Only safetensors: a directory with pickled weights (`.bin`) is refused.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..json_files import JsonFileError, read_json_object

ALL_LINEAR = "all-linear"
ADAPTER_NAME = "default"              # peft's name of the trainer's one adapter
ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
LORA_CKPT_DIR = "adapter"             # a torch checkpoint's adapters: trainer/adapter/ (a PEFT adapter directory)
# SGLang 0.5.15.post1's --lora-target-modules choices (sglang/srt/utils/common.py SUPPORTED_LORA_TARGET_MODULES,
# besides "all"): an adapter on any other module cannot be served by SGLang
SGLANG_LORA_TARGETS = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "kv_a_proj_with_mqa", "q_b_proj",
                                 "kv_b_proj", "wq_b", "wk", "weights_proj", "gate_proj", "up_proj", "down_proj",
                                 "qkv_proj", "gate_up_proj", "embed_tokens", "lm_head"})
_LORA_KEY = re.compile(r"^(?P<module>.+)\.(?P<kind>lora_A|lora_B)\.weight$")


class LoraError(ValueError):
    """A LoRA setting or adapter directory that cannot be used; the message names it."""


# -- which modules ------------------------------------------------------------------------------------------------

def linear_module_names(model: nn.Module) -> dict[str, int]:
    """The linear layers' short names (the last part of the module name: q_proj, down_proj, ...) with how many
    modules have each, the output head (the output embeddings) left out, as peft's all-linear leaves it out."""
    head = None
    get_out = getattr(model, "get_output_embeddings", None)
    if callable(get_out):
        head = get_out()
    out: dict[str, int] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and mod is not head and name:
            short = name.rsplit(".", 1)[-1]
            out[short] = out.get(short, 0) + 1
    return out


def resolve_targets(available: dict[str, int] | set[str], targets: list[str], exclude: list[str] | None = None
                    ) -> list[str]:
    """The short module names that get adapters: `targets` (all-linear: every name in `available`) less `exclude`.
    LoraError naming every unknown name (and the model's) -- all at once."""
    names = sorted(available)
    unknown = [t for t in targets if t != ALL_LINEAR and t not in available]
    unknown_ex = [t for t in exclude or [] if t not in available]
    problems = []
    if unknown:
        problems.append(f"--lora-target-modules {' '.join(unknown)}: no linear layer of that name")
    if unknown_ex:
        problems.append(f"--lora-exclude-modules {' '.join(unknown_ex)}: no linear layer of that name")
    if problems:
        raise LoraError("; ".join(problems) + f" (the model's linear layers: {' '.join(names)})")
    chosen = names if ALL_LINEAR in targets else sorted(set(targets))
    chosen = [n for n in chosen if n not in set(exclude or [])]
    if not chosen:
        raise LoraError("--lora-exclude-modules leaves no module for an adapter (the model's linear layers: "
                        f"{' '.join(names)})")
    return chosen


def model_linear_names(hf_dir: str) -> dict[str, int]:
    """linear_module_names of the model in `hf_dir` (a Hugging Face directory), built on the meta device: no
    weights are read, nothing is allocated."""
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.from_pretrained(hf_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return linear_module_names(model)


def spec_linear_names(spec: str) -> dict[str, int] | None:
    """linear_module_names for --hf-checkpoint as given: a directory, or the built-in tiny:NAME / smollm2:135m
    (both Llama: read from their config without making them). None when there is nothing to read."""
    if spec.startswith(("tiny:", "smollm2:")):
        from transformers import AutoModelForCausalLM

        from ..models.tiny import tiny_config
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(tiny_config(64))
        return linear_module_names(model)
    if not (Path(spec) / "config.json").is_file():
        return None
    return model_linear_names(spec)


# -- the trainer's adapter ----------------------------------------------------------------------------------------

def lora_config(lo, targets: list[str]):
    """peft's LoraConfig of the job's --lora-* flags (`lo`: config.LoraSection) on the resolved `targets`."""
    from peft import LoraConfig
    return LoraConfig(r=int(lo.lora_rank), lora_alpha=float(lo.lora_alpha), lora_dropout=float(lo.lora_dropout),
                      target_modules=list(targets), bias="none", task_type="CAUSAL_LM")


def adapter_config(peft_model, base_model_name_or_path: str | None = None) -> dict:
    """The adapter_config.json of the trainer's adapter (JSON-able: sets become sorted lists)."""
    cfg = peft_model.peft_config[ADAPTER_NAME]
    d = cfg.to_dict()
    if base_model_name_or_path is not None:
        d["base_model_name_or_path"] = base_model_name_or_path
    return json.loads(json.dumps(d, default=lambda o: sorted(o) if isinstance(o, (set, frozenset)) else str(o)))


def to_peft_names(state: dict[str, torch.Tensor], adapter: str = ADAPTER_NAME) -> dict[str, torch.Tensor]:
    """A full state dict of a peft model (module names, `.lora_A.<adapter>.weight`) -> the adapter's tensors under
    PEFT's saved names (`.lora_A.weight`); everything else is left out."""
    out = {}
    tag = f".{adapter}."
    for k, v in state.items():
        if ".lora_A." in k or ".lora_B." in k:
            name = k.replace(tag, ".")
            if _LORA_KEY.match(name):
                out[name] = v
    return out


def from_peft_names(tensors: dict[str, torch.Tensor], adapter: str = ADAPTER_NAME) -> dict[str, torch.Tensor]:
    """Inverse of to_peft_names: `x.lora_A.weight` -> `x.lora_A.<adapter>.weight` (a module's state dict key)."""
    out = {}
    for k, v in tensors.items():
        m = _LORA_KEY.match(k)
        if m is None:
            raise LoraError(f"{k!r} is not an adapter tensor name (expected <module>.lora_A.weight / lora_B.weight)")
        out[f"{m['module']}.{m['kind']}.{adapter}.weight"] = v
    return out


def merged_weights(peft_model, state: dict[str, torch.Tensor] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's weights in HF names with each adapter merged in (W + scale * B @ A, peft's
    `get_delta_weight`), without touching the model: what an engine without LoRA loads, and --lora-save-merged's
    export. `state`: the peft model's full state dict when the caller has it (FSDP gathers it), else read here."""
    from peft.tuners.lora import LoraLayer
    if state is None:
        state = peft_model.state_dict()
    deltas: dict[str, torch.Tensor] = {}
    for name, mod in peft_model.named_modules():
        if isinstance(mod, LoraLayer) and ADAPTER_NAME in mod.lora_A:
            prefix = name + "."
            a = state.get(prefix + f"lora_A.{ADAPTER_NAME}.weight")
            b = state.get(prefix + f"lora_B.{ADAPTER_NAME}.weight")
            if a is None or b is None:
                raise LoraError(f"{name}: its adapter is not in the state dict")
            scale = mod.scaling[ADAPTER_NAME]
            deltas[_hf_name(prefix + "base_layer.weight")] = (b.float() @ a.float()) * scale
    for k, v in state.items():
        if ".lora_A." in k or ".lora_B." in k or ".lora_dropout." in k:
            continue
        name = _hf_name(k)
        d = deltas.get(name)
        yield name, (v if d is None else (v.float() + d.to(v.device)).to(v.dtype))


def _hf_name(key: str) -> str:
    """A peft model's state dict key -> the base model's HF name."""
    for p in ("base_model.model.",):
        if key.startswith(p):
            key = key[len(p):]
    return key.replace(".base_layer.", ".")


# -- adapter directories ------------------------------------------------------------------------------------------

def write_adapter_dir(out: str | os.PathLike, tensors: dict[str, Any], config: dict) -> Path:
    """PEFT's adapter directory at `out`: adapter_model.safetensors (torch tensors or numpy arrays) and
    adapter_config.json, written next to it and renamed into place, so a directory that is there is complete."""
    from safetensors.torch import save_file
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    if tmp.exists():
        import shutil
        shutil.rmtree(tmp)
    tmp.mkdir()
    ts = {k: (torch.from_numpy(v) if not isinstance(v, torch.Tensor) else v).detach().cpu().contiguous()
          for k, v in tensors.items()}
    save_file(ts, str(tmp / ADAPTER_FILE), metadata={"format": "pt"})
    (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=1, sort_keys=True))
    if out.exists():
        import shutil
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def check_adapter_dir(path: str | os.PathLike, max_rank: int | None = None,
                      allowed_targets: set[str] | None = None) -> dict:
    """An adapter directory an engine is asked to load, checked before peft reads it: PEFT's files, safetensors
    only, a LoRA config with sane values (rank within `max_rank`, targets among `allowed_targets` when given), every
    tensor an adapter tensor of the rank. Returns its config; LoraError naming every problem found."""
    p = Path(path)
    if not p.is_dir():
        raise LoraError(f"{p}: no such adapter directory")
    problems = []
    if not (p / ADAPTER_CONFIG).is_file():
        problems.append(f"no {ADAPTER_CONFIG}")
    if not (p / ADAPTER_FILE).is_file():
        pickled = [x.name for x in p.glob("*.bin")]
        problems.append(f"no {ADAPTER_FILE}" + (f" ({', '.join(pickled)} is pickled: only safetensors are loaded)"
                                                 if pickled else ""))
    if problems:
        raise LoraError(f"{p}: not a PEFT adapter directory: {'; '.join(problems)}")
    try:
        config = read_json_object(p / ADAPTER_CONFIG)
    except JsonFileError as exc:
        raise LoraError(str(exc)) from None
    r, alpha = config.get("r"), config.get("lora_alpha")
    if config.get("peft_type", "LORA") != "LORA":
        problems.append(f"peft_type {config.get('peft_type')!r} (only LORA)")
    if not (isinstance(r, int) and not isinstance(r, bool) and r > 0):
        problems.append(f"r {r!r} (a positive integer)")
    elif max_rank is not None and r > max_rank:
        problems.append(f"r {r} is above --max-lora-rank {max_rank}")
    if not (isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and alpha > 0):
        problems.append(f"lora_alpha {alpha!r} (a positive number)")
    for key in ("use_dora", "use_rslora", "fan_in_fan_out"):
        if config.get(key):
            problems.append(f"{key} is not supported")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        problems.append("rank_pattern / alpha_pattern are not supported")
    if config.get("modules_to_save"):
        problems.append("modules_to_save (full copies of modules) is not supported")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    if not (isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets)):
        problems.append(f"target_modules {targets!r} (a list of module names)")
    elif allowed_targets is not None:
        short = {t.rsplit(".", 1)[-1] for t in targets}
        extra = sorted(short - set(allowed_targets))
        if extra:
            problems.append(f"target_modules {' '.join(extra)} outside --lora-target-modules "
                            f"{' '.join(sorted(allowed_targets))}")
    if not problems:
        from safetensors import safe_open
        try:
            with safe_open(str(p / ADAPTER_FILE), framework="pt", device="cpu") as fh:
                for k in fh.keys():
                    m = _LORA_KEY.match(k)
                    shape = fh.get_slice(k).get_shape()
                    if m is None:
                        problems.append(f"tensor {k!r} is not an adapter tensor")
                    elif len(shape) != 2 or (shape[0] if m["kind"] == "lora_A" else shape[1]) != r:
                        problems.append(f"tensor {k} has shape {list(shape)}, not of rank {r}")
                    if len(problems) > 4:
                        break
        except Exception as exc:  # noqa: BLE001 -- a damaged file: say so
            problems.append(f"{ADAPTER_FILE} cannot be read: {exc}")
    if problems:
        raise LoraError(f"{p}: {'; '.join(problems)}")
    return config


def nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(int(t.numel()) * t.element_size() for t in tensors)
