"""How many GPUs this machine gives the job: counted, never assumed.

    gpus = count_gpus()       # GpuCount(count=1, source="NVML (the driver's count) with CUDA_VISIBLE_DEVICES='0'")
    gpus.describe()           # "1 GPU visible (NVML (the driver's count) with CUDA_VISIBLE_DEVICES='0')"

The count is the driver's, through NVML (libnvidia-ml, which every NVIDIA driver installs; read with ctypes, in
milliseconds) where the torch installed here is a CUDA build and CUDA_VISIBLE_DEVICES is unset or a list of distinct
indices -- importing torch to ask it took the head 4.8 s of a job's start on one H100 machine. Otherwise it is
torch's (`torch.cuda.device_count()`, which honours CUDA_VISIBLE_DEVICES in every form CUDA takes: UUIDs, MIG
devices). Either is lowered to Slurm's where this process runs in a Slurm allocation that grants fewer
(SLURM_GPUS_ON_NODE, else the `--gpus-per-node` of the job, SLURM_GPUS_PER_NODE). A CPU build of torch, an empty
CUDA_VISIBLE_DEVICES or a machine without a driver count 0, and `detail` says which. Counting initialises no CUDA
context (no GPU memory is taken).

slime_actors.launch.placement checks a job's placement against this count before any process starts; a rollout
worker whose job did not say `--num-gpus-per-node` counts here too.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GpuCount:
    count: int
    source: str              # where the number comes from
    detail: str = ""         # why there are none (a CPU build of torch, an empty CUDA_VISIBLE_DEVICES, ...)
    memory_bytes: int | None = None   # the first GPU's memory (sizes a colocated engine's share), when known

    def describe(self) -> str:
        n = f"{self.count} GPU{'' if self.count == 1 else 's'} visible"
        return f"{n} ({self.source}{'; ' + self.detail if self.detail else ''})"


def slurm_gpus(environ: Mapping[str, str]) -> tuple[int, str] | None:
    """The GPUs a Slurm allocation grants on this node, and the variable that says so; None outside one."""
    for name in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        raw = environ.get(name, "").strip()
        m = re.fullmatch(r"(?:[\w.-]+:)*(\d+)(?:\(.*\))?", raw)   # "4", "h200:4", "gpu:h200:4", "4(x2)"
        if m:
            return int(m.group(1)), f"{name}={raw}"
    return None


def _torch_count(environ: Mapping[str, str]) -> tuple[int, str]:
    try:
        import torch
    except ImportError as exc:
        return 0, f"torch cannot be imported: {exc}"
    if torch.version.cuda is None:
        return 0, f"torch {torch.__version__} is a CPU build"
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip() in ("", "-1", "NoDevFiles"):
        return 0, f"CUDA_VISIBLE_DEVICES={cvd!r} hides every GPU"
    n = torch.cuda.device_count()
    return n, "" if n else "no CUDA device or driver found"


def count_gpus(environ: Mapping[str, str] | None = None,
               torch_count: Callable[[Mapping[str, str]], tuple[int, str]] | None = None,
               nvml: Any = None) -> GpuCount:
    """This machine's GPUs as this process sees them. `torch_count` (tests): stands in for torch's count (and NVML
    is not asked); `nvml` (tests): stands in for the NVML library."""
    env = os.environ if environ is None else environ
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    seen = None if torch_count is not None else _nvml_count(env, nvml)
    if seen is not None:
        n, memory = seen
        who, detail = "NVML", "" if n else "the driver reports no GPU"
        source = "NVML (the driver's count)"
    else:
        n, detail = (torch_count or _torch_count)(env)
        who, source = "torch", "torch.cuda.device_count()"
        memory = _gpu_memory() if n and torch_count is None else None
    if cvd is not None:
        source += f" with CUDA_VISIBLE_DEVICES={cvd!r}"
    slurm = slurm_gpus(env)
    if slurm is not None and slurm[0] < n:
        return GpuCount(slurm[0], f"{slurm[1]}; {who} sees {n}", detail, memory)
    return GpuCount(n, source, detail, memory)


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def torch_is_cuda_build() -> bool:
    """Whether the torch installed here is a CUDA build, from its files (CUDA builds ship lib/libtorch_cuda.so),
    without importing it."""
    import importlib.util
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return False
    where = list(spec.submodule_search_locations or []) if spec is not None else []
    return any(os.path.exists(os.path.join(d, "lib", "libtorch_cuda.so")) for d in where)


def _nvml_count(environ: Mapping[str, str], lib: Any = None) -> tuple[int, int | None] | None:
    """(the GPUs CUDA will see, the smallest one's memory in bytes) from NVML, or None where torch must count: torch
    is not a CUDA build (its count says why there are none), NVML is missing or fails, or CUDA_VISIBLE_DEVICES is in
    another form than distinct indices (CUDA's rules for UUIDs and MIG devices are torch's to apply). Indices are
    taken as CUDA takes them: up to the first one the machine does not have. The library is the driver's own,
    loaded with ctypes rather than through nvidia-ml-py (pynvml, a thin ctypes wrapper of the same calls): that
    package is SGLang's dependency, not this project's, and a job with the local engine would count through torch
    again. NVML's total memory is the card's
    (85.52 GB on an H100 80GB, where CUDA reports 85.02 GB): a colocated engine's share is sized 0.6 % smaller."""
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    wanted = None
    if cvd is not None:
        parts = [p.strip() for p in cvd.split(",")]
        if not all(p.isdigit() for p in parts) or len(set(map(int, parts))) != len(parts):
            return None
        wanted = [int(p) for p in parts]
    if lib is None:
        if not torch_is_cuda_build():
            return None
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            return None
    try:
        if lib.nvmlInit_v2() != 0:
            return None
    except AttributeError:
        return None
    try:
        count = ctypes.c_uint(0)
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        have = count.value
        visible = list(range(have)) if wanted is None else list(itertools.takewhile(lambda i: i < have, wanted))
        memory: list[int] = []
        for i in visible:
            handle, mem = ctypes.c_void_p(), _NvmlMemory()
            if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0 or \
                    lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) != 0:
                return None
            memory.append(int(mem.total))
        return len(visible), (min(memory) if memory else None)
    finally:
        lib.nvmlShutdown()


def _gpu_memory() -> int | None:
    try:
        import torch
        return int(torch.cuda.get_device_properties(0).total_memory)
    except Exception:
        return None


def training_device(spec: str, rank: int):
    """The torch device a trainer rank computes on, made current: `--device` as given, and for a bare "cuda" the GPU
    of this rank on its node (LOCAL_RANK where a launcher sets it, else rank modulo the GPUs visible)."""
    import torch
    dev = torch.device(spec)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda but no CUDA device is available")
        if dev.index is None:
            local = int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))
            dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    return dev
