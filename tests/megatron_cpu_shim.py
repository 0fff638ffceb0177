"""megatron-core on CPU, for tests only (it has no CPU path of its own): `install()` points its CUDA allocations at the
CPU and skips its CUDA RNG tracker, so the megatron backend runs over gloo, slowly, where there is no GPU.

It patches torch process-wide -- Hugging Face models must not run in the same process after it -- so it goes only
into processes that run megatron and nothing else:

* spawned ranks of a test (tests/test_megatron_backend.py calls `install()` in each);
* the trainer ranks of a whole job: give the trainer role the class `CpuShimTrainerRank` in a topology
  (`topology(...)` writes one) and run it with `slime-actors launch` (tests/test_megatron_colocated.py).

Without it the backend refuses `--device cpu` (megatron_backend.MegatronBackend.init), naming this file.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from slime_actors.actors.trainer import TrainerRank
from slime_actors.log import get_logger

HERE = Path(__file__).resolve()
log = get_logger(component="megatron_cpu_shim")
_installed = False


def install() -> None:
    """Let megatron-core's modules run on CPU (it allocates on ``torch.cuda.current_device()`` and forks the CUDA
    RNG tracker around dropout). Never on a machine with CUDA; once per process."""
    global _installed
    if _installed:
        return
    if torch.cuda.is_available():
        raise RuntimeError("the megatron CPU shim must not be used on a machine with CUDA")
    cpu = torch.device("cpu")
    torch.cuda.current_device = lambda: cpu
    torch.cuda.synchronize = lambda *a, **k: None

    class _Stream:  # stream bookkeeping around collectives: nothing to order on CPU
        def wait_event(self, *a):
            pass

        def wait_stream(self, *a):
            pass

        def synchronize(self):
            pass

    torch.cuda.current_stream = lambda *a, **k: _Stream()
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()

    def on_cpu(fn):  # megatron-core writes device="cuda" in places: send those to the CPU
        def wrapped(*a, **k):
            d = k.get("device")
            if d is not None and torch.device(d).type == "cuda":
                k["device"] = cpu
            return fn(*a, **k)
        return wrapped

    for name in ("tensor", "zeros", "ones", "empty", "full", "arange", "zeros_like", "ones_like", "empty_like",
                 "full_like", "rand", "randn", "as_tensor"):
        setattr(torch, name, on_cpu(getattr(torch, name)))
    torch.Tensor.cuda = lambda self, *a, **k: self
    type_of = torch.Tensor.type

    def tensor_type(self, *a, **k):  # megatron asserts param.type() == "torch.cuda.FloatTensor" and the like
        if a or k:
            return type_of(self, *a, **k)
        t = type_of(self)
        return t.replace("torch.", "torch.cuda.", 1) if self.device.type == "cpu" else t

    torch.Tensor.type = tensor_type
    torch.nn.Module.cuda = lambda self, *a, **k: self
    from megatron.core import tensor_parallel
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    _installed = True
    log.warning("megatron-core has no CPU path: running it on CPU through a test shim (slow; tests only)")


class CpuShimTrainerRank(TrainerRank):
    """A trainer rank with the shim installed before its backend is built (a topology's `class` for the trainer
    role: `CLASS` below)."""

    role = "trainer"

    async def on_start(self) -> None:
        install()
        await super().on_start()


CLASS = f"{HERE}:CpuShimTrainerRank"


def topology(path: Path, trainers: int = 1, rollouts: int = 1, rewards: int = 1) -> Path:
    """A one-host topology like `slime-actors train`'s (docs/launch.md), its trainer ranks CpuShimTrainerRank."""
    path.write_text(f"""[nodes.local]

[roles.buffer]

[roles.reward]
count = {rewards}

[roles.rollout]
count = {rollouts}

[roles.trainer]
count = {trainers}
class = "{CLASS}"
""")
    return path
