"""The embedded local engine: a Hugging Face causal LM behind the subset of SGLang's native HTTP API that the rollout
worker uses, so one rollout code path serves both (see docs/sglang.md and tests/data/sglang_api_0.5.15.post1.json).

    python -m slime_actors.backends.local_engine --model-path DIR --host 127.0.0.1 --port 30000 \
        [--config KEYS.yaml | --api-key KEY --admin-api-key KEY] [--device cpu|cuda|cuda:N] [--dtype float32] \
        [--max-running-requests 64] [--random-seed S] [--weight-version default] [--context-length N]

Keys work as in SGLang (engine_auth.py): --api-key for generation and info, --admin-api-key for weight updates,
pause / continue, abort and cache flushes; a `--config` YAML file may hold them, as SGLang reads it.

SGLang launch flags are accepted under SGLang's names; --mem-fraction-static caps the engine's GPU memory, the ones
with no meaning here (CUDA graphs, radix cache, kernels ...) are accepted and ignored, and multi-GPU parallelism (--tp-size etc. > 1) is
refused with a clear error.

One module per job:

* params.py    -- SGLang's request checks (sampling parameters, /generate bodies, control bodies); no model, no server
* scheduler.py -- the model and one scheduler thread: continuous batching with a key/value cache, sampling, aborts,
                  pauses and weight loads between steps
* server.py    -- the HTTP endpoints on aiohttp (the main thread's event loop) and the API-key check
* cli.py       -- the command line (`__main__.py` runs it)
"""

from importlib import import_module

# The public names, imported when first used: `params` alone needs neither torch nor aiohttp.
_HOME = {
    **dict.fromkeys(("MULTI_DEVICE_FLAGS", "build_parser", "main", "merge_config_file", "parse_args"), "cli"),
    **dict.fromkeys(("GENERATE_UNSUPPORTED", "SAMPLING_DEFAULTS", "SAMPLING_EPS", "SAMPLING_UNSUPPORTED", "SCHEMAS",
                     "SGLANG_API_VERSION", "TOP_K_ALL", "GenerateItem", "RequestError", "SamplingParams",
                     "parse_generate", "parse_sampling_params", "validate_struct"), "params"),
    **dict.fromkeys(("Engine", "Req", "resolve_device", "resolve_dtype"), "scheduler"),
    **dict.fromkeys(("HEALTH_CHECK_TIMEOUT", "Server", "serve"), "server"),
}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{home}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
