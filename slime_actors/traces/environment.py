"""What decides the last bits of a run's floats, recorded with its traces so a replay elsewhere can say which differ.

The same code on the same inputs gives bit-identical floats only where the same kernels run in the same order. On
CPU that is decided by (measured on the digits job's trainer: docs/reproducibility.md):

* the libraries: torch (its ATen kernels), the BLAS it calls (MKL on x86: the version string), oneDNN, numpy,
  transformers (the model's code);
* the CPU: ATen picks a kernel per instruction set (`ATEN_CPU_CAPABILITY`: default, avx2, avx512), and MKL picks
  its own code path from the CPU's model and features (`MKL_ENABLE_INSTRUCTIONS`, `MKL_CBWR` pin it); either one
  changes the bits of a matmul or a reduction;
* threads: how a reduction is split (`torch.get_num_threads()`, `OMP_NUM_THREADS`);
* on a GPU: the device, CUDA/cuDNN versions and the TF32 / deterministic-algorithm switches.

Two parts, because importing torch costs an actor's start-up a second or more:

* `machine()` -- without importing torch: Python, the CPU (model, family, the instruction-set flags kernels choose
  by, how many cores this process may use), the versions of the numeric packages (from their metadata), and the
  environment variables that steer the kernels. Every trace header holds it (`environment`).
* `torch_runtime()` -- what torch itself decided (threads, CPU capability, BLAS and oneDNN versions, GPU and its
  switches): an actor that computes with torch records it once it has set torch up, as the input `environment`
  (the trainer does, after building its model).

`differences(recorded, here)` lists what differs, for replay's report (slime_actors/traces/replay.py) and trace diff.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from typing import Any

INPUT_NAME = "environment"  # the recorded input holding torch_runtime()

# CPU flags (Linux /proc/cpuinfo names) that kernels are chosen by
KERNEL_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni",
                "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "avx_vnni", "asimd", "sve")
PACKAGES = ("torch", "numpy", "transformers", "safetensors", "megatron-core", "sglang")
# environment variables that change which kernel runs or how work is split
ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS",
            "MKL_DEBUG_CPU_TYPE", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "CUBLAS_WORKSPACE_CONFIG",
            "NVIDIA_TF32_OVERRIDE", "CUDA_VISIBLE_DEVICES", "PYTHONHASHSEED")

_machine_cache: dict | None = None


def _cpuinfo() -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read(200_000)
    except OSError:
        text = ""
    first = text.split("\n\n", 1)[0]
    fields = {}
    for line in first.splitlines():
        k, sep, v = line.partition(":")
        if sep:
            fields[k.strip()] = v.strip()
    model = fields.get("model name") or fields.get("Model") or platform.processor() or platform.machine()
    out["model"] = re.sub(r"\s+", " ", model)
    for k, name in (("vendor_id", "vendor"), ("cpu family", "family"), ("model", "model_id"),
                    ("stepping", "stepping"), ("CPU implementer", "implementer"), ("CPU part", "part")):
        if k in fields:
            out[name] = fields[k]
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    out["flags"] = [f for f in KERNEL_FLAGS if f in flags]
    try:
        out["usable_cores"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        out["usable_cores"] = os.cpu_count() or 0
    out["cores"] = os.cpu_count() or 0
    return out


def _versions(dists: tuple[str, ...]) -> dict[str, str]:
    """Installed versions, from the `NAME-VERSION.dist-info` folder names on sys.path (importlib.metadata costs an
    actor's start-up ~35 ms of imports; this a directory listing or two)."""
    want = {re.sub(r"[-_.]+", "_", d).lower(): d for d in dists}
    out: dict[str, str] = {}
    for entry in sys.path:
        if len(out) == len(want):
            break
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for n in names:
            if not n.endswith((".dist-info", ".egg-info")):
                continue
            stem = n.rsplit(".", 1)[0]
            name, sep, version = stem.partition("-")
            dist = want.get(re.sub(r"[-_.]+", "_", name).lower())
            if sep and dist is not None and dist not in out:
                out[dist] = version
    return {d: out[d] for d in dists if d in out}


def machine() -> dict[str, Any]:
    """The cheap part (no torch import): Python, CPU, numeric packages, kernel-steering environment variables."""
    global _machine_cache
    if _machine_cache is None:
        pkgs = _versions(PACKAGES)
        _machine_cache = {"python": platform.python_version(), "platform": f"{sys.platform}-{platform.machine()}",
                          "cpu": _cpuinfo(), "packages": pkgs}
    out = dict(_machine_cache)
    out["env"] = {k: os.environ[k] for k in ENV_VARS if k in os.environ}
    return out


def torch_runtime() -> dict[str, Any]:
    """What torch decided in this process: threads, CPU capability, BLAS / oneDNN versions, GPU and its switches.
    Call it after torch is set up (it imports torch)."""
    import torch
    out: dict[str, Any] = {"version": torch.__version__, "threads": torch.get_num_threads(),
                           "interop_threads": torch.get_num_interop_threads()}
    try:
        out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception:
        pass
    try:
        cfg = torch.__config__.show()
    except Exception:
        cfg = ""
    m = re.search(r"Math Kernel Library Version ([^\n]+?) for", cfg)
    if m:
        out["mkl"] = m.group(1).strip()
    m = re.search(r"(?:MKL-DNN|oneDNN) (v[\d.]+)", cfg)
    if m:
        out["onednn"] = m.group(1)
    m = re.search(r"BLAS_INFO=(\w+)", cfg)
    if m:
        out["blas"] = m.group(1)
    out["deterministic_algorithms"] = bool(torch.are_deterministic_algorithms_enabled())
    out["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        dev = torch.cuda.current_device()
        out["cuda"] = {"device": torch.cuda.get_device_name(dev), "version": torch.version.cuda,
                       "capability": ".".join(map(str, torch.cuda.get_device_capability(dev))),
                       "cudnn": torch.backends.cudnn.version(),
                       "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
                       "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
                       "cudnn_deterministic": bool(torch.backends.cudnn.deterministic)}
    return out


def here(with_torch: bool | None = None) -> dict[str, Any]:
    """This process's environment in the recorded form: machine() and, when torch is imported (or `with_torch`),
    torch_runtime() under "torch"."""
    out = machine()
    if with_torch or (with_torch is None and "torch" in sys.modules):
        try:
            out["torch"] = torch_runtime()
        except Exception:
            pass
    return out


def flatten(env: dict, prefix: str = "") -> dict[str, Any]:
    """{"cpu": {"model": "X"}} -> {"cpu.model": "X"} (lists stay values; an empty map has no entries)."""
    out: dict[str, Any] = {}
    for k, v in env.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


# what describes the machine without deciding any bits: not reported as a difference
_NOT_DECIDING = ("cpu.cores", "cpu.stepping", "env.CUDA_VISIBLE_DEVICES")


def differences(recorded: dict, current: dict) -> list[tuple[str, Any, Any]]:
    """(key, recorded, here) for every entry that differs, keys dotted ("cpu.model", "torch.threads"). A part the
    recording lacks (torch's, for an actor that never used torch) is not compared; an env variable set on one side
    only is."""
    a, b = flatten(recorded), flatten(current)
    out = []
    for k in sorted(set(a) | set(b)):
        if k in _NOT_DECIDING:
            continue
        top = k.split(".", 1)[0]
        if top not in recorded or top not in current:
            if top != "env":
                continue
        va, vb = a.get(k, "<unset>"), b.get(k, "<unset>")
        if va != vb:
            out.append((k, va, vb))
    return out


def describe(diffs: list[tuple[str, Any, Any]], limit: int = 6) -> str:
    parts = [f"{k} {_short(a)} -> {_short(b)}" for k, a, b in diffs[:limit]]
    if len(diffs) > limit:
        parts.append(f"... ({len(diffs) - limit} more)")
    return "; ".join(parts)


def _short(v: Any) -> str:
    s = ",".join(map(str, v)) if isinstance(v, list) else str(v)
    return repr(s if len(s) <= 60 else s[:57] + "...")
