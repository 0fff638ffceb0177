"""A trainer rank: one process of the training group (torch.distributed: gloo on CPU, NCCL on GPU).

Ranks pull their shard of a finished rollout from the buffer (whole prompt groups, so group-relative advantages are
computed locally), run the RL update (`slime_actors.backends.rl_update`) on the training backend (torch or
megatron), and rank 0 pushes new weights to the rollout workers (`slime_actors.backends.weight_sync.WeightPusher`):
in buckets over a broadcast group it forms with the engines (`--update-weight-transport distributed`), through
safetensors on disk (`disk`), or by posting to colocated engines itself (`colocated`).

The training group is this role's own process group (not every process of a job is a trainer: under torchrun the
other ranks play the buffer, rollout workers, ...). Its rendezvous goes through the controller: each rank asks
`controller/0 trainer_join`, rank 0 offering its address and a free port for the group's store; the controller
answers every rank once all have joined, with that address, a generation number and the checkpoint to load. When a
rank dies the whole group restarts (the controller tells the survivors `abort_group`, they exit with code 75 and
their supervisor starts them again), joins a new generation and loads the last checkpoint (docs/fault-tolerance.md).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from typing import TYPE_CHECKING

from ..env import TRACE_BATCH_LIMIT, TRAINER_ADDR
from ..handles import outcome_seen
from ..backends.listen import limit_collectives, tcp_store
from ..checkpoints import read_meta, trainer_dir
from ..mailbox.errors import MailboxError, RemoteError, transient
from ..mailbox.mailbox import current_cause
from ..messages import Joined, TrainBatch
from ..retry import RetryPolicy, retry
from ..role_handles import BufferHandle, ControllerHandle
from .base import Actor, handler

if TYPE_CHECKING:   # (importing torch takes seconds: the backends are imported when the rank starts)
    from ..backends.training import TrainingBackend
    from ..backends.weight_sync import WeightPusher
    from ..profiler import TrainProfiler

GROUP_TIMEOUT_S = 1800.0  # the training group's collectives and store (torch.distributed timeout)
# asks worth repeating while their peer restarts (mailbox.errors.transient): the join (the head may not be up yet;
# an error the controller's handler raised is not retried) and get_batch (it only reads), each for 600 s
JOIN_RETRY = RetryPolicy(attempts=None, deadline=600, base=1.0, factor=1.0, max_delay=1.0, retry_on=(MailboxError,),
                         retry_if=lambda exc: not isinstance(exc, RemoteError))
# the next rollout's shard, asked for once a rank trained (`_fetch_ahead`): how long the buffer keeps the ask (a
# rollout longer than this is fetched when `train` comes, as ever), and how long `train` waits for its answer, which
# the buffer sent when it told the controller the rollout was complete (a longer wait: something failed; fetched)
NEXT_BATCH_WAIT_S = 3600.0
NEXT_BATCH_LATE_S = 10.0
BATCH_RETRY = RetryPolicy(attempts=None, deadline=600, base=0.4, factor=2.0, max_delay=2.0, retry_on=(MailboxError,),
                          retry_if=transient)


class TrainerRank(Actor):
    role = "trainer"
    needs_job = True
    backend: TrainingBackend   # (on_start)
    profiler: TrainProfiler    # (on_start, with the backend)

    def __init__(self, index: int = 0, **config):
        super().__init__(index, **config)
        # (self.backend: the training backend, and self.profiler, made with it: on_start)
        self.rank = index
        self.world_size = 1
        self.weights: WeightPusher | None = None  # rank 0 pushes weights, the others take part (on_start)
        self.generation: int | None = None  # of the training group this rank joined
        self.controller, self.buffer = ControllerHandle(self, "controller/0"), BufferHandle(self, "buffer/0")
        # the shard of the next rollout, asked for once this rank trained on one (`_fetch_ahead`): (its rollout id,
        # the wait_batch ask)
        self._next_batch: tuple[int, asyncio.Future] | None = None

    # ------------------------------------------------------------------------------------------ lifecycle
    async def on_start(self) -> None:
        cfg = self.cfg
        self.rank = self.index  # the rank in the training group (not torchrun's RANK: other roles have ranks too)
        self.world_size = cfg.train.n_ranks
        if self.tracer is not None and not self.replaying:
            # the batch (get_batch's reply, over the trace's body limit) is kept in the trace as it came in, up to
            # SLIME_ACTORS_TRACE_BATCH_LIMIT: a replay of this rank trains on it (docs/trace-format.md)
            for method in ("get_batch", "wait_batch"):
                self.mailbox.full_replies[method] = (self.runtime.trace_batch_limit, f"over {TRACE_BATCH_LIMIT.name}")
        from .. import startup_timeline as timeline
        with timeline.phase("rendezvous"):
            rdzv = await self._rendezvous()
        await self.run_blocking(self._init, rdzv)
        self.generation = rdzv.generation
        await self.controller.tell.trainer_ready(self.rank, self.generation,
                                                 weight_version=self.backend.weight_version)
        self.log.info("trainer rank ready", rank=self.rank, world_size=self.world_size, generation=self.generation,
                      backend=self.cfg.train.train_backend, version=self.backend.weight_version)

    async def _rendezvous(self) -> Joined:
        import socket
        addr = reachable_address(self.runtime)
        port = 0
        if self.rank == 0:  # (not weight_sync.find_free_port: importing torch here would stall the heartbeats)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((addr, 0))
                port = sock.getsockname()[1]
        pid = os.getpid()
        # the head may still be starting (torchrun, Slurm: every process starts at once): keep knocking for 600 s
        return await retry(lambda: self.controller.trainer_join(self.rank, self.world_size, addr, port, pid,
                                                                ask_timeout=3600),
                           JOIN_RETRY, what="trainer_join (controller not reachable yet)", log=self.log,
                           started=time.monotonic())

    def _init(self, rdzv: Joined) -> None:
        import datetime

        from .. import startup_timeline as timeline
        with timeline.phase("import torch"):
            import torch
            import torch.distributed as dist
        cfg = self.cfg
        # every generator a rank's code may draw from (as Megatron's _set_random_seed): a run is reproducible, and
        # so is its checkpoint's RNG state (docs/reproducibility.md)
        import random

        import numpy as np
        random.seed(cfg.run.seed + self.rank)
        np.random.seed((cfg.run.seed + self.rank) % (1 << 32))
        torch.manual_seed(cfg.run.seed + self.rank)
        from ..backends.training import set_tf32
        set_tf32(cfg.train.tf32 and cfg.run.device == "cuda")
        if cfg.run.device == "cuda":
            gpus = torch.cuda.device_count()
            if gpus == 0:
                from ..config import StartupError
                cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
                raise StartupError(f"--device cuda but trainer/{self.rank} sees no GPU (torch {torch.__version__}, "
                                   + ("CUDA_VISIBLE_DEVICES unset" if cvd is None else f"CUDA_VISIBLE_DEVICES={cvd!r}")
                                   + "): use --device cpu, or run where a GPU is visible")
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", self.rank)) % gpus)
        if self.world_size > 1 and not dist.is_initialized():
            backend = "nccl" if cfg.run.device == "cuda" else "gloo"
            timeout = datetime.timedelta(seconds=GROUP_TIMEOUT_S)
            # our own store, hosted by trainer rank 0 (an init_method URL would, under torchrun, make every rank a
            # client of torchrun's agent store instead: TORCHELASTIC_USE_AGENT_STORE)
            # (its server listens on the address rank 0 offered alone; gloo / NCCL on this rank's interface)
            limit_collectives(reachable_address(self.runtime))
            store = tcp_store(rdzv.master_addr, rdzv.master_port, self.world_size, is_master=self.rank == 0,
                              timeout=timeout, wait_for_workers=False)
            dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world_size,
                                    timeout=timeout)
        backend_class: type[TrainingBackend]
        if cfg.train.train_backend == "megatron":
            from ..backends.megatron_backend import MegatronBackend
            backend_class = MegatronBackend
        else:
            from ..backends.torch_backend import TorchBackend
            backend_class = TorchBackend
        from ..profiler import TrainProfiler
        self.profiler = TrainProfiler(cfg.debug, self.rank, self.runtime.run_dir, self.name,
                                      quiet=self.expect_silence)
        self.profiler.start_memory_history()
        self.backend = backend_class(cfg, self.rank, self.world_size)
        with timeline.phase("model load"):
            self.backend.init()
        from ..recorder import environment
        # what decides the bits of its floats (threads, kernels, BLAS), with its trace: a replay elsewhere names
        # what differs (docs/reproducibility.md)
        self.record_input(environment.INPUT_NAME, environment.torch_runtime())
        from ..backends.weight_sync import WeightPusher
        self.weights = WeightPusher(cfg, self.backend, actor=self, run_blocking=self.run_blocking,
                                    address=lambda: reachable_address(self.runtime), run_dir=self.runtime.run_dir,
                                    sender_factory=self.host.weight_sender)  # (replay's needs no engines)
        if self.rank == 0:
            self.weights.warm_up()   # SGLang's serializer imported while the engines start, not in the first sync
        ckpt = Path(rdzv.checkpoint) if rdzv.checkpoint else None  # the controller picks it
        if ckpt is not None:
            self.backend.load(str(trainer_dir(ckpt)), load_optim=not cfg.checkpoint.no_save_optim)
            self.backend.weight_version = read_meta(ckpt).get("weight_version", 0)
            self.log.info("resumed from checkpoint", path=str(ckpt), weight_version=self.backend.weight_version)

    async def on_stop(self) -> None:
        self._drop_next_batch()   # (asked after the last rollout: none comes)
        if self.weights is not None:
            self.weights.close()

    @handler
    def abort_group(self, generation: int, reason: str = "") -> dict:
        """The training group of `generation` is broken (a rank died): leave it, exit 75, be restarted."""
        if generation != self.generation:
            return {"left": False}  # a newer incarnation, or not joined yet: not ours
        self.log.error("leaving the broken training group; exiting to be restarted", generation=generation,
                       reason=reason)
        if self.tracer is not None:
            self.tracer.close()
        asyncio.get_running_loop().call_later(0.05, os._exit, 75)
        return {"left": True}

    # ------------------------------------------------------------------------------------------ training
    @handler
    async def train(self, rollout_id: int, batch_id: str | None = None) -> dict:
        from ..backends.rl_update import rl_update
        t0 = time.monotonic()
        batch = await self._batch(rollout_id, batch_id)   # (packed: rl_update makes its tensors)
        t1 = time.monotonic()
        cause = current_cause.get()  # (trace id, this train ask's id): named in the profiler's ranges
        metrics = await self.run_blocking(self._update, rl_update, batch, rollout_id, cause[1] if cause else None)
        metrics = {k: float(v) for k, v in metrics.items()}
        metrics["time/get_batch"] = t1 - t0
        metrics["time/train_compute"] = time.monotonic() - t1
        if rollout_id + 1 < self.cfg.run.n_rollouts:
            self._fetch_ahead(rollout_id + 1)
        # The batch -- by now its tokens as lists of Python ints and its other columns as lists of per-sample tensors:
        # tens of thousands of objects at a real step's size -- is freed once this reply is out. Left to this frame's
        # exit it was freed before the reply, on the step's critical path (the controller's weight sync waits for
        # it): 0.2-0.5 ms a step for the digits job on the 2-vCPU VM.
        asyncio.get_running_loop().call_soon(batch.clear)
        return metrics

    def _fetch_ahead(self, rollout_id: int) -> None:
        """Ask the buffer now for this rank's shard of rollout `rollout_id` (wait_batch: answered once the rollout
        is complete, when the controller is told so too), so the shard is here when the controller's `train` comes:
        the step's training starts on that ask's arrival, not after a get_batch round trip."""
        rank, world_size = self.backend.data_parallel_rank, self.backend.data_parallel_size
        self._drop_next_batch()
        task = asyncio.ensure_future(self.buffer.wait_batch(rollout_id, rank, world_size, packed=True,
                                                            timeout=NEXT_BATCH_WAIT_S,
                                                            ask_timeout=NEXT_BATCH_WAIT_S + 60))
        task.add_done_callback(outcome_seen)
        self._next_batch = (rollout_id, task)

    def _drop_next_batch(self) -> None:
        if self._next_batch is not None:
            self._next_batch[1].cancel()
            self._next_batch = None

    async def _batch(self, rollout_id: int, batch_id: str | None) -> dict:
        """This rank's shard of rollout `rollout_id`: the one fetched ahead when it is batch `batch_id` (the
        controller's word: wait_rollout's), else pulled now. A fetch ahead that failed, was answered with nothing,
        is another rollout's or does not come within NEXT_BATCH_LATE_S is set aside."""
        ahead, self._next_batch = self._next_batch, None
        if ahead is not None:
            rid, task = ahead
            try:
                if rid == rollout_id and batch_id is not None:
                    await asyncio.wait([task], timeout=NEXT_BATCH_LATE_S)
                    got = task.result() if task.done() and not task.cancelled() and task.exception() is None \
                        else None
                    if isinstance(got, dict) and got.get("batch_id") == batch_id \
                            and isinstance(got.get("batch"), dict):
                        return TrainBatch.from_wire(got["batch"]).wire
                    self.log.info("the shard fetched ahead is not the rollout's; fetching it", rollout_id=rollout_id,
                                  expected=batch_id, got=got.get("batch_id") if isinstance(got, dict) else None)
            finally:   # (also when this train is cancelled while it waits: the ask is not left waiting)
                task.cancel()
        return (await self._get_batch(rollout_id)).wire

    def _update(self, rl_update, batch: dict, rollout_id: int, cause: str | None) -> dict:
        """The RL update of one rollout, profiled as --use-pytorch-profiler asks (slime_actors/profiler.py)."""
        prof = self.profiler
        from ..gpu_memory import PhasePeaks, both, cuda_stats
        peaks = PhasePeaks(cuda_stats())   # the GPU memory of each part, with the step's metrics (gpu_memory.py)
        with prof.phase("train_overall", rollout_id, cause):
            metrics = rl_update(self.backend, self.cfg, batch, rollout_id,
                                phase=both(lambda target: prof.phase(target, rollout_id, cause), peaks.phase))
        metrics.update(peaks.metrics())
        prof.after_step(rollout_id)
        # the update's activations and gradients went back into malloc's heaps: to the OS with them
        # (--trainer-release-memory; docs/performance.md, "Trainer memory on CPU")
        self.backend.release_host_memory()
        return metrics

    async def _get_batch(self, rollout_id: int) -> TrainBatch:
        """This rank's shard; retried while the buffer restarts (get_batch only reads, so a retry is harmless)."""
        # by data-parallel replica: the ranks of one Megatron tensor/pipeline group train on the same shard
        rank, world_size = self.backend.data_parallel_rank, self.backend.data_parallel_size
        # (packed: its per-token columns as three byte strings, not a number per token to decode: types.pack_rows)
        return await retry(lambda: self.buffer.get_batch(rollout_id, rank, world_size, packed=True, ask_timeout=600),
                           BATCH_RETRY, what="get_batch", log=self.log, started=time.monotonic())

    @handler
    async def log_probs(self, samples: list) -> list:
        from ..types import Sample, batch_from_samples
        batch = batch_from_samples([Sample.from_wire(s) for s in samples])
        lps, _ = await self.run_blocking(self.backend.compute_log_probs, batch, "actor")
        return [lp.tolist() for lp in lps]

    # ------------------------------------------------------------------------------------------ weights
    @handler
    async def sync_weights(self, weight_version: int, workers: list, transport: str | None = None,
                           rebuild: bool = False) -> dict:
        weights = self.weights
        if weights is None:
            raise RuntimeError(f"{self.name}: no weights to sync, its backend has not started")
        if self.rank != 0:
            # the controller asks every rank: gathering full weights is a collective under FSDP (and Megatron
            # model parallelism), so the other ranks take part and rank 0 sends
            participated = await weights.take_part()
            self.backend.weight_version = weight_version
            return {"rank": self.rank, "participated": participated}
        info = await weights.push(weight_version, workers, transport or self.cfg.weights.update_weight_transport,
                                  rebuild=rebuild)
        self.backend.weight_version = weight_version
        self.log.info("weights synced", **{k: info[k] for k in ("seconds", "bytes", "buckets", "transport")},
                      workers=len(workers), version=weight_version)
        return info

    # ------------------------------------------------------------------------------------------ checkpoints
    @handler
    async def save(self, path: str, save_optim: bool = True) -> None:
        await self.run_blocking(self.backend.save, str(trainer_dir(path)), save_optim)

    @handler
    async def save_hf(self, path: str, rollout_id: int | None = None) -> None:
        """Every rank: --save-hf's export after `rollout_id` (rank 0 writes the directory)."""
        await self.run_blocking(self.backend.save_hf, path, {"rollout_id": rollout_id})


def reachable_address(runtime) -> str:
    """The address other hosts reach this process at (for the trainer group's and the weight sync's stores)."""
    given = TRAINER_ADDR.get()
    if given:
        return given
    if runtime is None or runtime.transport != "tcp":
        return "127.0.0.1"
    if runtime.advertise:
        return runtime.advertise
    if runtime.host not in ("0.0.0.0", "", "*", "::"):
        return runtime.host
    import socket
    return socket.gethostbyname(socket.gethostname())

