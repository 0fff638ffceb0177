"""The trainer-rank interface: what a training backend (torch, megatron) offers the trainer actor.

A backend owns one rank's model(s), optimizer and forward/backward. The RL update itself -- reference and old
log-probs, advantages, the policy loss, micro-batches and optimizer steps -- is written once, in
`slime_actors.backends.rl_update.rl_update`, on top of these primitives, so both backends compute the same thing.

The trainer actor initialises torch.distributed (gloo on CPU, NCCL on GPU) before constructing the backend; ranks
of the training group are 0..world_size-1. A batch is the dict made by `slime_actors.types.batch_from_samples`:
parallel lists with one entry per sample -- tokens (prompt + response), prompt_lengths, response_lengths,
loss_masks, rollout_log_probs, rewards, group_index, sample_index, weight_versions -- plus, once rl_update has
computed them, per-sample tensors: old_log_probs, ref_log_probs, values, advantages, returns.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist

from ..config import JobConfig

# loss_fn(micro_batch, log_probs, entropies, values) -> (loss to backpropagate, metrics of this micro-batch)
# log_probs / entropies: one 1-D tensor per sample over its response tokens; values likewise (critic) or None.
LossFn = Callable[[dict, list[torch.Tensor], list[torch.Tensor], list[torch.Tensor] | None],
                  tuple[torch.Tensor, dict[str, float]]]


class TrainingBackend(ABC):
    """One rank of the training group: what the trainer actor, the RL update and the weight sync use of it."""

    def __init__(self, cfg: JobConfig, rank: int, world_size: int):
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.weight_version = 0  # bumped by the trainer after each update that engines receive
        # the rank's data-parallel replica and their number: which shard of a rollout it trains on (the ranks of one
        # Megatron tensor/pipeline group train on the same one); a backend without model parallelism: its rank
        self.data_parallel_rank, self.data_parallel_size = rank, world_size
        # how the replicas share the model: "none" (one rank), "ddp", "fsdp" (gathering the full weights is then a
        # collective every rank takes part in, as under Megatron's model parallelism)
        self.parallel = "none"

    def reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """`t` reduced ("sum" or "max") across the data-parallel replicas (the RL update's statistics): an all-reduce
        over the default process group when torch.distributed is initialised, else `t`."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return t
        dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
        x = t.detach().to(dev).clone()
        dist.all_reduce(x, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
        return x.to(t.device)

    def release_host_memory(self) -> bool:
        """After an update (--trainer-release-memory; and after gathering the full weights for a sync under FSDP or
        Megatron): the memory this process's allocator freed (activations, gradients, gathered copies) goes back to
        the OS instead of staying in malloc's heaps for the next update (docs/performance.md, "Trainer memory on CPU"). Returns whether it was asked for and done."""
        if not self.cfg.train.trainer_release_memory:
            return False
        from ..mailbox import allocator
        return allocator.trim()

    # -- set-up ------------------------------------------------------------------------------------------
    @abstractmethod
    def init(self) -> None:
        """Build the actor model (and reference model, critic, optimizer) from --hf-checkpoint."""

    # -- forward passes (no grad) ------------------------------------------------------------------------
    @abstractmethod
    def compute_log_probs(self, batch: dict, model: str = "actor", with_entropy: bool = False
                          ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """Log-probs (fp32, CPU) of each sample's response tokens under `model` ("actor" or "ref"), computed at
        --rollout-temperature; with_entropy adds the per-token entropy."""

    def compute_values(self, batch: dict) -> list[torch.Tensor]:
        """Critic values per response token (PPO); backends without a critic raise."""
        raise NotImplementedError(f"{type(self).__name__} has no critic (needed by --advantage-estimator ppo)")

    # -- training ----------------------------------------------------------------------------------------
    @abstractmethod
    def train_micro_batches(self, micro_batches: list[dict], loss_fn: LossFn, train_critic: bool = False
                            ) -> dict[str, float]:
        """Forward + backward over the micro-batches of one optimizer step, accumulating gradients (the loss_fn's
        loss is already scaled for accumulation). Returns summed metrics of this rank."""

    @abstractmethod
    def optimizer_step(self, critic: bool = False) -> float:
        """Clip gradients (--clip-grad), step, zero grads. Returns the gradient norm before clipping."""

    # -- weights -----------------------------------------------------------------------------------------
    @abstractmethod
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights in Hugging Face names and layouts (gathered across model-parallel ranks); meaningful on
        rank 0, which sends them to the engines. Tensors may live on the training device."""

    def weight_buckets(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """named_weights grouped into buckets of about `bucket_bytes` each (a tensor larger than that is alone)."""
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, t in self.named_weights():
            nbytes = t.numel() * t.element_size()
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.append((name, t))
            size += nbytes
        if bucket:
            yield bucket

    # -- checkpoints -------------------------------------------------------------------------------------
    @abstractmethod
    def save(self, path: str, save_optim: bool = True) -> None:
        """Save this rank's model (and optimizer) state under `path` (a directory shared by the ranks)."""

    @abstractmethod
    def load(self, path: str, load_optim: bool = True) -> None:
        """Restore what `save` wrote."""

    def save_hf(self, path: str, info: dict | None = None) -> None:
        """Export the actor as a Hugging Face directory (`hf_export.export_hf`; `info` goes into its marker).
        Every rank calls it; rank 0 writes."""
        raise NotImplementedError

    # -- LoRA (--lora-rank; the torch backend's, docs/lora.md) ---------------------------------------------------
    def adapter_weights(self) -> dict[str, torch.Tensor]:
        """The LoRA adapters' tensors in PEFT's names, on the CPU (--lora-sync adapter: what the engines load).
        Under FSDP gathering them is a collective: every rank calls it."""
        raise NotImplementedError(f"{type(self).__name__} has no LoRA adapters (--lora-rank: the torch backend)")

    def adapter_config(self) -> dict:
        """The adapters' PEFT config (adapter_config.json's content)."""
        raise NotImplementedError(f"{type(self).__name__} has no LoRA adapters (--lora-rank: the torch backend)")


def set_tf32(enabled: bool) -> None:
    """--tf32 on a GPU: this process's fp32 matmuls in TF32 (`torch.set_float32_matmul_precision("high")`, what
    transformers' TrainingArguments(tf32=True) turns on); off: torch's default, full fp32 matmuls, left as it is.
    Callers ask it only for a GPU ("high" may change CPU matmuls too). The trainer's recorded environment
    (recorder/environment.py) names the precision, so a replay elsewhere sees which."""
    if enabled:
        torch.set_float32_matmul_precision("high")
