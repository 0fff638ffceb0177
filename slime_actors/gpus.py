"""How many GPUs this machine gives the job: counted, never assumed.

    gpus = count_gpus()       # GpuCount(count=1, source="torch.cuda.device_count() with CUDA_VISIBLE_DEVICES='0'")
    gpus.describe()           # "1 GPU visible (torch.cuda.device_count() with CUDA_VISIBLE_DEVICES='0')"

The count is torch's (`torch.cuda.device_count()`, which honours CUDA_VISIBLE_DEVICES), lowered to Slurm's where
this process runs in a Slurm allocation that grants fewer (SLURM_GPUS_ON_NODE, else the `--gpus-per-node` of the
job, SLURM_GPUS_PER_NODE). A CPU build of torch, an empty CUDA_VISIBLE_DEVICES or a machine without a driver count
0, and `detail` says which. Counting initialises no CUDA context (no GPU memory is taken).

slime_actors.launch.placement checks a job's placement against this count before any process starts; a rollout
worker whose job did not say `--num-gpus-per-node` counts here too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass


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
               torch_count: Callable[[Mapping[str, str]], tuple[int, str]] | None = None) -> GpuCount:
    """This machine's GPUs as this process sees them. `torch_count` (tests): stands in for torch's count."""
    env = os.environ if environ is None else environ
    n, detail = (torch_count or _torch_count)(env)
    source = "torch.cuda.device_count()"
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        source += f" with CUDA_VISIBLE_DEVICES={cvd!r}"
    memory = _gpu_memory() if n and torch_count is None else None
    slurm = slurm_gpus(env)
    if slurm is not None and slurm[0] < n:
        return GpuCount(slurm[0], f"{slurm[1]}; torch sees {n}", detail, memory)
    return GpuCount(n, source, detail, memory)


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
