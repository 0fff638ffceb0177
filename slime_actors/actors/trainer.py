"""A trainer rank: one process of the training group (torch.distributed: gloo on CPU, NCCL on GPU).

Ranks pull their shard of a finished rollout from the buffer (whole prompt groups, so group-relative advantages are
computed locally), run the RL update (`slime_actors.backends.rl_update`) on the training backend (torch or
megatron), and rank 0 pushes new weights to the rollout workers: in buckets over a broadcast group it forms with
the engines (`--update-weight-transport distributed`), or through safetensors on disk (`disk`).

The process group is set up from RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (torchrun or our launcher set them).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import time
from pathlib import Path

from .base import Actor, handler


class TrainerRank(Actor):
    role = "trainer"

    def __init__(self, index: int = 0, **config):
        super().__init__(index, **config)
        self.args = argparse.Namespace(**config["args"])
        self.backend = None
        self.rank = index
        self.world_size = 1
        self._sender = None
        self._group_workers: tuple = ()
        self._group_name = ""
        self._group_seq = 0
        self._flattened = False  # every engine of the group takes load_format="flattened_bucket"

    # ------------------------------------------------------------------------------------------ lifecycle
    async def on_start(self) -> None:
        await self.run_blocking(self._init)
        self.log.info("trainer rank ready", rank=self.rank, world_size=self.world_size,
                      backend=self.args.train_backend, version=self.backend.weight_version)

    def _init(self) -> None:
        import torch
        import torch.distributed as dist
        a = self.args
        self.rank = int(os.environ.get("RANK", self.index))
        self.world_size = int(os.environ.get("WORLD_SIZE", a.actor_num_nodes * a.actor_num_gpus_per_node))
        torch.manual_seed(a.seed + self.rank)
        if a.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", self.rank)) % torch.cuda.device_count())
        if self.world_size > 1 and not dist.is_initialized():
            backend = "nccl" if a.device == "cuda" else "gloo"
            dist.init_process_group(backend, rank=self.rank, world_size=self.world_size)
        if a.train_backend == "megatron":
            from ..backends.megatron_backend import MegatronBackend as Backend
        else:
            from ..backends.torch_backend import TorchBackend as Backend
        self.backend = Backend(a, self.rank, self.world_size)
        self.backend.init()
        ckpt = latest_checkpoint(a.load) if a.load else None
        if ckpt is not None:
            self.backend.load(str(ckpt / "trainer"), load_optim=not a.no_save_optim)
            self.backend.weight_version = read_meta(ckpt).get("weight_version", 0)
            self.log.info("resumed from checkpoint", path=str(ckpt), weight_version=self.backend.weight_version)

    async def on_stop(self) -> None:
        if self._sender is not None:
            self._sender.close()

    # ------------------------------------------------------------------------------------------ training
    @handler
    async def train(self, rollout_id: int) -> dict:
        from ..backends.rl_update import rl_update
        t0 = time.monotonic()
        batch = await self.ask("buffer/0", "get_batch", {"rollout_id": rollout_id, "rank": self.rank,
                                                         "world_size": self.world_size}, timeout=600)
        self._record_batch(batch)
        t1 = time.monotonic()
        metrics = await self.run_blocking(rl_update, self.backend, self.args, batch, rollout_id)
        metrics = {k: float(v) for k, v in metrics.items()}
        metrics["time/get_batch"] = t1 - t0
        metrics["time/train_compute"] = time.monotonic() - t1
        return metrics

    def _record_batch(self, batch: dict) -> None:
        """Keep the batch in the trace when its get_batch reply was over the trace's body limit (then the reply is
        recorded by size and checksum only), so `slime-actors replay` can train on it again.
        SLIME_ACTORS_TRACE_BATCH_LIMIT (bytes, default 256 MiB) bounds what is kept."""
        if self.tracer is None or self.replaying:
            return
        from ..mailbox.codec import encode_body
        body, _, refs = encode_body(batch)
        size = len(body) + sum(r.nbytes for r in refs)
        if size <= self.runtime.trace_body_limit:
            return  # the reply's body is in the trace already
        if size <= int(os.environ.get("SLIME_ACTORS_TRACE_BATCH_LIMIT", 256 << 20)):
            self.record_input("get_batch", batch)
        else:
            self.record_input("get_batch", {"__omitted__": True, "size": size,
                                            "why": "over SLIME_ACTORS_TRACE_BATCH_LIMIT"})

    @handler
    async def log_probs(self, samples: list) -> list:
        from ..types import Sample, batch_from_samples
        batch = batch_from_samples([Sample.from_wire(s) for s in samples])
        lps, _ = await self.run_blocking(self.backend.compute_log_probs, batch, "actor")
        return [lp.tolist() for lp in lps]

    # ------------------------------------------------------------------------------------------ weights
    @handler
    async def sync_weights(self, weight_version: int, workers: list, transport: str | None = None) -> dict:
        if self.rank != 0:
            raise RuntimeError(f"sync_weights goes to trainer rank 0, not rank {self.rank}")
        transport = transport or self.args.update_weight_transport
        t0 = time.monotonic()
        if transport == "disk":
            info = await self._sync_disk(weight_version, workers)
        elif transport == "distributed":
            info = await self._sync_distributed(weight_version, workers)
        elif transport == "colocated":
            info = await self._sync_tensor(weight_version, workers)
        else:
            raise ValueError(f"weight transport {transport!r} is not supported by the {self.args.train_backend} "
                             "backend here (use distributed, disk or colocated)")
        self.backend.weight_version = weight_version
        info.update(seconds=time.monotonic() - t0, transport=transport, weight_version=weight_version)
        self.log.info("weights synced", **{k: info[k] for k in ("seconds", "bytes", "buckets", "transport")},
                      workers=len(workers), version=weight_version)
        return info

    async def _sync_disk(self, version: int, workers: list) -> dict:
        from ..backends.weight_sync import save_weights_to_disk
        base = Path(self.args.update_weight_disk_dir or os.path.join(self.runtime.run_dir, "weights"))
        path = base / f"v{version:06d}"
        nbytes = await self.run_blocking(
            lambda: save_weights_to_disk(self.backend.named_weights(), str(path), self.args.hf_checkpoint))
        await asyncio.gather(*(self.ask(w, "update_weights_from_disk", {"model_path": str(path),
                                                                       "weight_version": version}, timeout=600)
                               for w in workers))
        for old in base.glob("v*"):
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
        return {"bytes": int(nbytes or 0), "buckets": 1}

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
        name = f"slime-weights-{self._group_seq}"
        port = free_port()
        addr = os.environ.get("SLIME_ACTORS_WEIGHT_SYNC_ADDR", "127.0.0.1")
        backend = "nccl" if self.args.device == "cuda" else "gloo"
        world = 1 + len(workers)
        sender = DistributedWeightSender(addr, port, world, backend, name)
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
        for bucket, last in _with_last(self.backend.weight_buckets(self.args.update_weight_buffer_size)):
            names = [n for n, _ in bucket]
            dtypes = [str(t.dtype).removeprefix("torch.") for _, t in bucket]
            shapes = [list(t.shape) for _, t in bucket]
            body = {"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": self._group_name,
                    "weight_version": version, "flush_cache": last,  # flush once, after the last bucket
                    "load_format": "flattened_bucket" if flat else None}
            await asyncio.gather(self.run_blocking(self._sender.broadcast_bucket, bucket, flat),
                                 *(self.ask(w, "update_weights_from_distributed", body, timeout=600)
                                   for w in workers))
            nbytes += sum(t.numel() * t.element_size() for _, t in bucket)
            nbuckets += 1
        return {"bytes": nbytes, "buckets": nbuckets, "flattened_bucket": flat}

    async def _sync_tensor(self, version: int, workers: list) -> dict:
        """Colocated engines (same host, sharing GPUs): /update_weights_from_tensor with CUDA IPC handles made by
        SGLang's serializer. The trainer posts to each engine itself, so the pickled payload never becomes an actor
        message; the worker holds its health probes meanwhile and learns the new version at the end."""
        from ..backends.engine_client import EngineClient, serialize_named_tensors
        if self.args.device != "cuda":
            raise ValueError("--update-weight-transport colocated shares CUDA tensors with the engines: it needs "
                             "--device cuda (use distributed or disk on CPU)")
        infos = await asyncio.gather(*(self.ask(w, "weight_update", {"active": True}, timeout=600) for w in workers))
        clients = [EngineClient(i["engine_url"], api_key=self.args.engine_api_key, timeout=600) for i in infos]
        nbytes = nbuckets = 0
        fmt = None
        try:
            for bucket, last in _with_last(self.backend.weight_buckets(self.args.update_weight_buffer_size)):
                payloads: dict[int, tuple] = {}
                for tp in {int(i["tp_size"]) for i in infos}:
                    payloads[tp] = await self.run_blocking(serialize_named_tensors, bucket, tp)
                await asyncio.gather(*(
                    c.update_weights_from_tensor(payloads[int(i["tp_size"])][0],
                                                 load_format=payloads[int(i["tp_size"])][1],
                                                 flush_cache=last and bool(i["flush_cache"]),
                                                 weight_version=str(version))
                    for c, i in zip(clients, infos)))
                fmt = next(iter(payloads.values()))[1]
                nbytes += sum(t.numel() * t.element_size() for _, t in bucket)
                nbuckets += 1
                del payloads  # the engines copied the tensors before answering
        finally:
            await asyncio.gather(*(c.close() for c in clients))
            await asyncio.gather(*(self._quiet(self.ask(w, "weight_update", {"active": False,
                                                                              "weight_version": version}, timeout=60))
                                   for w in workers))
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
    async def save_hf(self, path: str) -> None:
        await self.run_blocking(self.backend.save_hf, path)


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


def latest_checkpoint(root: str | os.PathLike | None) -> Path | None:
    """The newest iter_NNNNNNN directory under `root` that has a complete marker, or `root` itself if it is one."""
    if not root:
        return None
    root = Path(root)
    if (root / "meta.json").exists():
        return root
    marker = root / "latest_checkpointed_iteration.txt"
    if marker.exists():
        p = root / f"iter_{int(marker.read_text().strip()):07d}"
        if (p / "meta.json").exists():
            return p
    cands = sorted(p for p in root.glob("iter_*") if (p / "meta.json").exists())
    return cands[-1] if cands else None


def read_meta(ckpt: Path) -> dict:
    import json
    return json.loads((ckpt / "meta.json").read_text())
