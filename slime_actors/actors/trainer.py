"""A trainer rank: one process of the training group (torch.distributed: gloo on CPU, NCCL on GPU).

Ranks pull their shard of a finished rollout from the buffer (whole prompt groups, so group-relative advantages are
computed locally), run the RL update (`slime_actors.backends.rl_update`) on the training backend (torch or
megatron), and rank 0 pushes new weights to the rollout workers: in buckets over a broadcast group it forms with
the engines (`--update-weight-transport distributed`), or through safetensors on disk (`disk`).

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
import shutil
import time
from pathlib import Path

from .. import env as E
from ..checkpoints import latest_checkpoint, read_meta  # noqa: F401 (also imported from here)
from ..config import JobConfig
from .base import Actor, handler

GROUP_TIMEOUT_S = 1800.0  # the training group's collectives and store (torch.distributed timeout)


class TrainerRank(Actor):
    role = "trainer"

    def __init__(self, index: int = 0, **config):
        super().__init__(index, **config)
        self.cfg = JobConfig.from_dict(config["args"])
        self.backend = None
        self.rank = index
        self.world_size = 1
        self._sender = None
        self._group_workers: tuple = ()
        self._group_name = ""
        self._group_seq = 0
        self._flattened = False  # every engine of the group takes load_format="flattened_bucket"
        self.generation: int | None = None  # of the training group this rank joined
        self._disk_versions: list[Path] = []  # weight directories written by --update-weight-transport disk

    # ------------------------------------------------------------------------------------------ lifecycle
    async def on_start(self) -> None:
        a = self.cfg
        self.rank = self.index  # the rank in the training group (not torchrun's RANK: other roles have ranks too)
        self.world_size = a.train.n_ranks
        rdzv = await self._rendezvous()
        await self.run_blocking(self._init, rdzv)
        self.generation = rdzv["generation"]
        await self.tell("controller/0", "trainer_ready", {"rank": self.rank, "generation": self.generation,
                                                          "weight_version": self.backend.weight_version})
        self.log.info("trainer rank ready", rank=self.rank, world_size=self.world_size, generation=self.generation,
                      backend=self.cfg.train.train_backend, version=self.backend.weight_version)

    async def _rendezvous(self) -> dict:
        import socket
        addr = reachable_address(self.runtime)
        port = 0
        if self.rank == 0:  # (not weight_sync.find_free_port: importing torch here would stall the heartbeats)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((addr, 0))
                port = sock.getsockname()[1]
        body = {"rank": self.rank, "world_size": self.world_size, "addr": addr, "port": port, "pid": os.getpid()}
        from ..mailbox.errors import MailboxError, RemoteError
        t0 = time.monotonic()
        while True:  # the head may still be starting (torchrun, Slurm: every process starts at once)
            try:
                return await self.ask("controller/0", "trainer_join", body, timeout=3600)
            except RemoteError:
                raise
            except MailboxError as exc:
                if time.monotonic() - t0 > 600:
                    raise
                self.log.warning("controller not reachable yet; retrying the join", error=str(exc))
                await asyncio.sleep(1.0)

    def _init(self, rdzv: dict) -> None:
        import datetime

        import torch
        import torch.distributed as dist
        a = self.cfg
        torch.manual_seed(a.run.seed + self.rank)
        if a.run.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", self.rank)) % torch.cuda.device_count())
        if self.world_size > 1 and not dist.is_initialized():
            backend = "nccl" if a.run.device == "cuda" else "gloo"
            timeout = datetime.timedelta(seconds=GROUP_TIMEOUT_S)
            # our own store, hosted by trainer rank 0 (an init_method URL would, under torchrun, make every rank a
            # client of torchrun's agent store instead: TORCHELASTIC_USE_AGENT_STORE)
            store = dist.TCPStore(rdzv["master_addr"], rdzv["master_port"], self.world_size,
                                  is_master=self.rank == 0, timeout=timeout, wait_for_workers=False)
            dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world_size,
                                    timeout=timeout)
        if a.train.train_backend == "megatron":
            from ..backends.megatron_backend import MegatronBackend as Backend
        else:
            from ..backends.torch_backend import TorchBackend as Backend
        self.backend = Backend(a, self.rank, self.world_size)
        self.backend.init()
        ckpt = Path(rdzv["checkpoint"]) if rdzv.get("checkpoint") else None  # the controller picks it
        if ckpt is not None:
            self.backend.load(str(ckpt / "trainer"), load_optim=not a.checkpoint.no_save_optim)
            self.backend.weight_version = read_meta(ckpt).get("weight_version", 0)
            self.log.info("resumed from checkpoint", path=str(ckpt), weight_version=self.backend.weight_version)

    async def on_stop(self) -> None:
        if self._sender is not None:
            self._sender.close()

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
    async def train(self, rollout_id: int) -> dict:
        from ..backends.rl_update import rl_update
        t0 = time.monotonic()
        batch = await self._get_batch(rollout_id)
        self._record_batch(batch)
        t1 = time.monotonic()
        metrics = await self.run_blocking(rl_update, self.backend, self.cfg, batch, rollout_id)
        metrics = {k: float(v) for k, v in metrics.items()}
        metrics["time/get_batch"] = t1 - t0
        metrics["time/train_compute"] = time.monotonic() - t1
        return metrics

    async def _get_batch(self, rollout_id: int) -> dict:
        """This rank's shard; retried while the buffer restarts (get_batch only reads, so a retry is harmless)."""
        from ..mailbox.errors import MailboxError, RemoteError
        t0 = time.monotonic()
        attempt = 0
        while True:
            try:
                # by data-parallel replica: the ranks of one Megatron tensor/pipeline group train on the same shard
                shard = {"rank": getattr(self.backend, "data_parallel_rank", self.rank),
                         "world_size": getattr(self.backend, "data_parallel_size", self.world_size)}
                return await self.ask("buffer/0", "get_batch", {"rollout_id": rollout_id, **shard}, timeout=600)
            except RemoteError as exc:
                if exc.type != "MailboxError" or time.monotonic() - t0 > 600:
                    raise
            except MailboxError as exc:
                if time.monotonic() - t0 > 600:
                    raise
                self.log.warning("get_batch failed; retrying", error=str(exc))
            attempt += 1
            await asyncio.sleep(min(2.0, 0.2 * 2 ** attempt))

    def _record_batch(self, batch: dict) -> None:
        """Keep the batch in the trace when its get_batch reply was over the trace's body limit (then the reply is
        recorded by size and checksum only), so `slime-actors replay` can train on it again.
        The runtime's trace_batch_limit (SLIME_ACTORS_TRACE_BATCH_LIMIT, bytes) bounds what is kept."""
        if self.tracer is None or self.replaying:
            return
        from ..mailbox.codec import encode_body
        body, _, refs = encode_body(batch)
        size = len(body) + sum(r.nbytes for r in refs)
        if size <= self.runtime.trace_body_limit:
            return  # the reply's body is in the trace already
        if size <= self.runtime.trace_batch_limit:
            self.record_input("get_batch", batch)
        else:
            self.record_input("get_batch", {"__omitted__": True, "size": size,
                                            "why": f"over {E.TRACE_BATCH_LIMIT.name}"})

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
        if self.rank != 0:
            # the controller asks every rank: gathering full weights is a collective under FSDP (and Megatron
            # model parallelism), so the other ranks take part and rank 0 sends
            if self.cfg.train.train_backend == "megatron" or getattr(self.backend, "parallel", "ddp") == "fsdp":
                await self.run_blocking(lambda: [None for _ in self.backend.named_weights()])
                self.backend.weight_version = weight_version
                return {"rank": self.rank, "participated": True}
            self.backend.weight_version = weight_version
            return {"rank": self.rank, "participated": False}
        transport = transport or self.cfg.weights.update_weight_transport
        if rebuild:  # an engine of the group restarted: the broadcast group it was in is gone with it
            self._group_workers = ()
        t0 = time.monotonic()
        if transport == "disk":
            info = await self._sync_disk(weight_version, workers)
        elif transport == "distributed":
            info = await self._sync_distributed(weight_version, workers)
        elif transport == "colocated":
            info = await self._sync_tensor(weight_version, workers)
        else:
            raise ValueError(f"weight transport {transport!r} is not supported by the {self.cfg.train.train_backend} "
                             "backend here (use distributed, disk or colocated)")
        self.backend.weight_version = weight_version
        info.update(seconds=time.monotonic() - t0, transport=transport, weight_version=weight_version)
        self.log.info("weights synced", **{k: info[k] for k in ("seconds", "bytes", "buckets", "transport")},
                      workers=len(workers), version=weight_version)
        return info

    async def _sync_disk(self, version: int, workers: list) -> dict:
        from ..backends.weight_sync import save_weights_to_disk
        base = Path(self.cfg.weights.update_weight_disk_dir or os.path.join(self.runtime.run_dir, "weights"))
        path = base / f"v{version:06d}"
        await self.run_blocking(
            lambda: save_weights_to_disk(self.backend.named_weights(), str(path), self.cfg.model.hf_checkpoint))
        nbytes = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        await asyncio.gather(*(self.ask(w, "update_weights_from_disk", {"model_path": str(path),
                                                                       "weight_version": version}, timeout=600)
                               for w in workers))
        # only versions this rank wrote go (--update-weight-disk-dir may be a directory that holds other things)
        for old in self._disk_versions:
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
        self._disk_versions = [path]
        return {"bytes": int(nbytes), "buckets": 1}

    async def _ensure_group(self, workers: tuple) -> None:
        from ..backends.weight_sync import DistributedWeightSender, find_free_port as free_port
        if self._sender is not None and self._group_workers == workers:
            return
        if self._sender is not None:  # membership changed (a restarted engine): rebuild the group
            old, old_name = self._group_workers, self._group_name
            # both sides at once: with NCCL, destroying the group waits for the peers to destroy it too
            sender, self._sender = self._sender, None
            await asyncio.gather(*(self._quiet(self.ask(w, "destroy_weights_group", {"group_name": old_name},
                                                        timeout=30)) for w in old),
                                 self._quiet(self.run_blocking(sender.close)), return_exceptions=True)
        self._group_seq += 1
        name = f"slime-weights-{os.getpid()}-{self._group_seq}"  # unique: a restarted rank 0 starts again at 1
        addr = E.WEIGHT_SYNC_ADDR.get() or reachable_address(self.runtime)
        port = free_port(addr)
        backend = "nccl" if self.cfg.run.device == "cuda" else "gloo"
        world = 1 + len(workers)
        sender = (self.host.weight_sender or DistributedWeightSender)(addr, port, world, backend, name)
        _, *replies = await asyncio.gather(
            self.run_blocking(sender.connect),
            *(self.ask(w, "init_weights_group", {"master_address": addr, "master_port": port, "rank_offset": i + 1,
                                                 "world_size": world, "group_name": name, "backend": backend},
                       timeout=300) for i, w in enumerate(workers)))
        self._sender, self._group_workers, self._group_name = sender, workers, name
        self._flattened = all(isinstance(r, dict) and r.get("flattened_bucket") for r in replies)

    async def _sync_distributed(self, version: int, workers: list) -> dict:
        await self._ensure_group(tuple(workers))
        nbytes = nbuckets = 0
        flat = self._flattened  # one uint8 broadcast per bucket (SGLang's "flattened_bucket"), else one per tensor
        for bucket, last in _with_last(self.backend.weight_buckets(self.cfg.weights.update_weight_buffer_size)):
            names = [n for n, _ in bucket]
            dtypes = [str(t.dtype).removeprefix("torch.") for _, t in bucket]
            shapes = [list(t.shape) for _, t in bucket]
            body = {"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": self._group_name,
                    "weight_version": version, "flush_cache": last,  # flush once, after the last bucket
                    "load_format": "flattened_bucket" if flat else None}
            # wait for every part, the broadcast too, before failing: a worker's ask can fail (its host was cut off
            # and declared down) while the broadcast thread still runs; a retry must not start a new group under it
            res = await asyncio.gather(self.run_blocking(self._sender.broadcast_bucket, bucket, flat),
                                       *(self.ask(w, "update_weights_from_distributed", body, timeout=600)
                                         for w in workers), return_exceptions=True)
            for r in res:
                if isinstance(r, BaseException):
                    self._group_workers = ()  # the next sync builds a new group
                    raise r
            nbytes += sum(t.numel() * t.element_size() for _, t in bucket)
            nbuckets += 1
        return {"bytes": nbytes, "buckets": nbuckets, "flattened_bucket": flat}

    async def _sync_tensor(self, version: int, workers: list) -> dict:
        """Colocated engines (same host, sharing GPUs). SGLang: /update_weights_from_tensor with CUDA IPC handles made
        by SGLang's serializer; the local engine: /update_weights_from_ipc with a JSON handle of the flattened bucket
        (weight_sync.share_bucket: CUDA IPC on GPU, a shared-memory file on CPU; nothing pickled). The trainer posts
        to each engine itself, so no payload becomes an actor message; the worker holds its health probes meanwhile
        and learns the new version at the end."""
        from ..backends.engine_auth import EngineKeys
        from ..backends.engine_client import EngineClient, serialize_named_tensors
        from ..backends.weight_sync import bucket_metadata, share_bucket
        infos = await asyncio.gather(*(self.ask(w, "weight_update", {"active": True}, timeout=600) for w in workers))
        keys = EngineKeys.from_env()  # the job's engine keys (the launcher's environment); admin key: the updates
        clients = [EngineClient(i["engine_url"], keys=keys, timeout=600) for i in infos]
        nbytes = nbuckets = 0
        fmt = None
        sent = False
        try:
            servers = await asyncio.gather(*(c.get_server_info() for c in clients))
            local = ["local engine" in str(s.get("version", "")) for s in servers]
            if self.cfg.run.device != "cuda" and not all(local):
                raise ValueError("--update-weight-transport colocated shares CUDA tensors with SGLang engines: it "
                                 "needs --device cuda (use distributed or disk on CPU)")
            for bucket, last in _with_last(self.backend.weight_buckets(self.cfg.weights.update_weight_buffer_size)):
                payloads: dict[int, tuple] = {}
                for tp in {int(i["tp_size"]) for i, loc in zip(infos, local) if not loc}:
                    payloads[tp] = await self.run_blocking(serialize_named_tensors, bucket, tp)
                shared = await self.run_blocking(share_bucket, bucket) if any(local) else None
                meta = bucket_metadata(bucket)
                try:
                    await asyncio.gather(*(
                        c.update_weights_from_ipc(**meta, handle=shared.handle, weight_version=str(version),
                                                  flush_cache=last and bool(i["flush_cache"])) if loc else
                        c.update_weights_from_tensor(payloads[int(i["tp_size"])][0],
                                                     load_format=payloads[int(i["tp_size"])][1],
                                                     flush_cache=last and bool(i["flush_cache"]),
                                                     weight_version=str(version))
                        for c, i, loc in zip(clients, infos, local)))
                finally:
                    if shared is not None:
                        shared.release()  # the engines copied the tensors before answering
                fmt = next(iter(payloads.values()))[1] if payloads else "ipc"
                nbytes += sum(t.numel() * t.element_size() for _, t in bucket)
                nbuckets += 1
                del payloads
            sent = True
        finally:
            await asyncio.gather(*(c.close() for c in clients))
            # the workers learn the version only when every bucket went in; one whose engine was restarted meanwhile
            # refuses it (the new engine holds its launch weights), and the sync fails so the controller re-syncs
            done = await asyncio.gather(*(self.ask(w, "weight_update", {"active": False, "weight_version":
                                                                        version if sent else None}, timeout=60)
                                          for w in workers), return_exceptions=True)
        for r in done:
            if isinstance(r, BaseException):
                raise r
        return {"bytes": nbytes, "buckets": nbuckets, "load_format": fmt}

    @staticmethod
    async def _quiet(coro):
        try:
            return await coro
        except Exception:
            return None

    # ------------------------------------------------------------------------------------------ checkpoints
    @handler
    async def save(self, path: str, save_optim: bool = True) -> None:
        await self.run_blocking(self.backend.save, os.path.join(path, "trainer"), save_optim)

    @handler
    async def save_hf(self, path: str, rollout_id: int | None = None) -> None:
        """Every rank: --save-hf's export after `rollout_id` (rank 0 writes the directory)."""
        await self.run_blocking(self.backend.save_hf, path, {"rollout_id": rollout_id})


def reachable_address(runtime) -> str:
    """The address other hosts reach this process at (for the trainer group's and the weight sync's stores)."""
    given = E.TRAINER_ADDR.get()
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


def _with_last(items):
    """(item, is_last) for each item of an iterator (one item of lookahead)."""
    it = iter(items)
    try:
        prev = next(it)
    except StopIteration:
        return
    for item in it:
        yield prev, False
        prev = item
    yield prev, True
