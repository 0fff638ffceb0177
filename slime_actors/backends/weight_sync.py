"""Trainer-side weight sync to generation engines (SGLang or the local engine), and the pieces both sides share.
`WeightPusher` (at the end) is what trainer rank 0 does for one `sync_weights`, over the pieces below.

Two paths, both speaking SGLang 0.5.15.post1's protocol (tests/data/sglang_api_0.5.15.post1.json):

* disk: ``save_weights_to_disk(named_weights, out_dir, source_model_dir)`` writes a Hugging Face directory
  (safetensors + config + tokenizer files copied from the source model); the rollout worker then calls the
  engine's ``/update_weights_from_disk`` with ``model_path=out_dir``.
* distributed broadcast: the trainer's rank 0 is rank 0 (and the TCPStore master) of a separate process group;
  each engine joins it as rank ``rank_offset`` through ``/init_weights_update_group``. For each bucket the rollout
  worker posts ``/update_weights_from_distributed`` (names, dtypes, shapes) while the trainer broadcasts the same
  tensors, in the same order, from rank 0 -- one broadcast per tensor, or one uint8 broadcast of the whole bucket
  with ``load_format="flattened_bucket"``::

      sender = DistributedWeightSender("127.0.0.1", port, world_size=1 + n_engines, backend="gloo")
      # concurrently: sender.connect()  and  client.init_weights_update_group(addr, port, rank_offset=1, ...)
      for bucket in backend.weight_buckets(bucket_bytes):
          meta = bucket_metadata(bucket)
          # concurrently: sender.broadcast_bucket(bucket)  and  client.update_weights_from_distributed(**meta, ...)
      # concurrently: sender.close()  and  client.destroy_weights_update_group()  (NCCL's destroy waits for peers)

The group is built the way SGLang builds it (``init_custom_process_group`` in sglang/srt/utils/common.py): a TCP
rendezvous store at master_address:master_port, wrapped in ``PrefixStore(group_name)``, then torch's process-group
helper. It does not touch (or need) the process's default group, so a torchrun trainer rank can create it next
to its training group.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from slime_actors.backends.engine_process import find_free_port  # noqa: F401 (weight_sync's users)
from slime_actors.env import WEIGHT_SYNC_ADDR, WEIGHT_SYNC_TIMEOUT
from slime_actors.log import get_logger
from slime_actors.role_handles import RolloutHandle

from .listen import address_towards, limit_collectives, tcp_store

log = get_logger(component="weight_sync")

DEFAULT_GROUP_NAME = "weight_update_group"  # SGLang's default group_name
WEIGHT_SYNC_TIMEOUT_S: float = WEIGHT_SYNC_TIMEOUT.get()
WEIGHT_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".msgpack", ".h5")
WEIGHT_INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


# -- small shared helpers ---------------------------------------------------------------------------------

def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16": the form SGLang expects (it does getattr(torch, name))."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """"bfloat16" or "torch.bfloat16" -> torch.bfloat16; anything else raises ValueError."""
    attr = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(attr, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return attr


def bucket_metadata(bucket: Iterable[tuple[str, torch.Tensor]]) -> dict:
    """names / dtypes / shapes of a bucket, as /update_weights_from_distributed takes them."""
    names, dtypes, shapes = [], [], []
    for name, t in bucket:
        names.append(name)
        dtypes.append(dtype_name(t.dtype))
        shapes.append(list(t.shape))
    return {"names": names, "dtypes": dtypes, "shapes": shapes}


def flatten_bucket(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """One uint8 tensor: each tensor's bytes (row-major), concatenated in order ("flattened_bucket" layout)."""
    tensors = [t.detach() for t in tensors]
    if not tensors:
        raise ValueError("cannot flatten an empty bucket")
    slots = bucket_slots([t.dtype for t in tensors], [t.shape for t in tensors], tensors[0].device)
    if slots is None:  # mixed dtypes with an unaligned offset: byte views and a concatenation
        return torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for t in tensors])
    flat, views = slots
    copy_tensors(views, tensors)
    return flat


def bucket_slots(dtypes: list, shapes: list, device, out: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
    """A uint8 buffer in the flattened_bucket layout (``out`` when given and large enough) and a typed view of it
    per tensor, to copy into or read from without per-tensor byte views. None when an offset is not a multiple of
    its dtype's size (mixed dtypes): then only the byte layout works."""
    sizes, off = [], 0
    for dt, shape in zip(dtypes, shapes):
        dt = dtype_from_name(dt) if isinstance(dt, str) else dt
        if off % dt.itemsize:
            return None
        n = 1
        for d in shape:
            n *= int(d)
        sizes.append((off, n, dt, [int(d) for d in shape]))
        off += n * dt.itemsize
    flat = out[:off] if out is not None and out.numel() >= off else torch.empty(off, dtype=torch.uint8,
                                                                                 device=device)
    return flat, [flat[o:o + n * dt.itemsize].view(dt).view(shape) for o, n, dt, shape in sizes]


def copy_tensors(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """dst[i].copy_(src[i]) for all i, batched into as few kernel launches as torch allows."""
    if not dst:
        return
    # torch fuses a list of contiguous same-dtype copies into a few kernels; one strided tensor in the list (a q/k/v
    # slice of a fused QKV weight) drops the whole list to one launch per tensor, so those go separately
    fast = [(d, s) for d, s in zip(dst, src) if d.is_contiguous() and s.is_contiguous() and d.dtype == s.dtype]
    slow = [(d, s) for d, s in zip(dst, src) if not (d.is_contiguous() and s.is_contiguous() and d.dtype == s.dtype)]
    for part in (fast, slow):
        if not part:
            continue
        try:
            torch._foreach_copy_([d for d, _ in part], [s for _, s in part])
        except (RuntimeError, AttributeError, TypeError):  # older torch / device mix: one at a time
            for d, s in part:
                d.copy_(s)


def bucket_nbytes(dtypes: list, shapes: list) -> int:
    total = 0
    for dt, shape in zip(dtypes, shapes):
        n = 1
        for s in shape:
            n *= int(s)
        total += n * dtype_from_name(dt).itemsize if isinstance(dt, str) else n * dt.itemsize
    return total


def unflatten_bucket(flat: torch.Tensor, names: list[str], dtypes: list, shapes: list
                     ) -> list[tuple[str, torch.Tensor]]:
    """Inverse of flatten_bucket: views into `flat` with each tensor's dtype and shape."""
    out, off = [], 0
    for name, dt, shape in zip(names, dtypes, shapes):
        dtype = dtype_from_name(dt) if isinstance(dt, str) else dt
        n = 1
        for s in shape:
            n *= int(s)
        nbytes = n * dtype.itemsize
        if off + nbytes > flat.numel():
            raise ValueError(f"flattened bucket too small for {name} ({flat.numel()} bytes)")
        chunk = flat[off:off + nbytes]
        if (flat.storage_offset() + off) % dtype.itemsize:  # mixed dtypes: a view needs aligned storage
            chunk = chunk.clone()
        out.append((name, chunk.view(dtype).reshape([int(s) for s in shape])))
        off += nbytes
    if off != flat.numel():
        raise ValueError(f"flattened bucket has {flat.numel()} bytes, metadata describes {off}")
    return out


# -- the weight-update process group (both sides) ---------------------------------------------------------

@contextlib.contextmanager
def _no_default_group_split():
    """torch would try to split a new NCCL communicator from a default group bound to a device; the weight-update
    group has different members (the engines), so hide the binding while the group is created."""
    pg = None
    if dist.is_available() and dist.is_initialized():
        pg = dist.distributed_c10d._get_default_group()
    saved = getattr(pg, "bound_device_id", None) if pg is not None else None
    if saved is not None:
        pg.bound_device_id = None
    try:
        yield
    finally:
        if saved is not None:
            pg.bound_device_id = saved


def init_weights_update_group(master_address: str, master_port: int, rank: int, world_size: int,
                              group_name: str = DEFAULT_GROUP_NAME, backend: str = "gloo",
                              timeout_s: float | None = None):
    """Create (and join) the weight-update process group; blocks until all `world_size` ranks have joined.
    Rank 0 hosts the TCPStore. Returns the ProcessGroup; broadcast with `broadcast(t, pg)`."""
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world
    if not group_name:
        raise ValueError("group_name cannot be empty")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world_size {world_size}")
    timeout = timedelta(seconds=timeout_s or WEIGHT_SYNC_TIMEOUT_S)
    # the store's server listens on master_address alone, this rank's gloo / NCCL on its interface towards it
    limit_collectives(master_address if rank == 0 else address_towards(master_address, int(master_port)))
    store = tcp_store(master_address, int(master_port), world_size, is_master=(rank == 0), timeout=timeout,
                      wait_for_workers=False, multi_tenant=True)
    store = PrefixStore(group_name, store)
    params = inspect.signature(_new_process_group_helper).parameters
    opts = {"backend_options": None} if "backend_options" in params else {"pg_options": None}
    with _no_default_group_split():
        pg, _ = _new_process_group_helper(world_size, rank, [], Backend(backend), store, group_name=group_name,
                                          timeout=timeout, **opts)
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    log.info("weight update group joined", group=group_name, rank=rank, world_size=world_size, backend=backend,
             master=f"{master_address}:{master_port}")
    return pg


def broadcast(tensor: torch.Tensor, pg) -> None:
    """Broadcast `tensor` from rank 0 of the weight-update group (in place on receivers)."""
    try:
        dist.broadcast(tensor, group=pg, group_src=0)
    except TypeError:  # torch without group_src
        dist.broadcast(tensor, src=0, group=pg)


def destroy_weights_update_group(pg) -> None:
    if pg is not None:
        dist.destroy_process_group(pg)


class BucketReceiver:
    """The engine side of flattened buckets: receives each into one buffer kept across calls, with its typed views
    cached per bucket layout (names, dtypes, shapes), so a repeated sync costs the broadcast and one batched copy.
    Use the views before the next receive (they alias the buffer)."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self._buffer: torch.Tensor | None = None
        self._views: dict = {}

    def receive(self, pg, names: list[str], dtypes: list, shapes: list) -> list[tuple[str, torch.Tensor]]:
        key = (tuple(names), tuple(str(d) for d in dtypes), tuple(tuple(int(x) for x in s) for s in shapes))
        entry = self._views.get(key)
        if entry is None:
            nbytes = bucket_nbytes(dtypes, shapes)
            if self._buffer is None or self._buffer.numel() < nbytes:
                self._buffer, self._views = torch.empty(nbytes, dtype=torch.uint8, device=self.device), {}
            slots = bucket_slots(dtypes, shapes, self.device, self._buffer)
            if slots is None:  # unaligned mixed dtypes: a fresh buffer, byte views
                flat = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
                broadcast(flat, pg)
                return unflatten_bucket(flat, names, dtypes, shapes)
            entry = (slots[0], list(zip(names, slots[1])))
            if len(self._views) < 256:
                self._views[key] = entry
        flat, named = entry
        broadcast(flat, pg)
        return named


# -- disk ---------------------------------------------------------------------------------------------------

def save_weights_to_disk(named_weights: Iterable[tuple[str, torch.Tensor]], out_dir: str | os.PathLike,
                         source_model_dir: str | os.PathLike, max_shard_bytes: int = 4 << 30) -> Path:
    """Write an HF model directory at `out_dir`: the weights as safetensors (sharded above `max_shard_bytes`,
    with an index), and every non-weight file of `source_model_dir` (config.json, generation_config.json,
    tokenizer files, chat template, ...) copied. Old weight files in out_dir are removed first. Returns out_dir."""
    from safetensors.torch import save_file
    out, src = Path(out_dir), Path(source_model_dir)
    out.mkdir(parents=True, exist_ok=True)
    for p in out.iterdir():
        if p.is_file() and (p.name.endswith(WEIGHT_FILE_SUFFIXES) or p.name in WEIGHT_INDEX_FILES):
            p.unlink()
    if src.resolve() != out.resolve():
        for p in src.iterdir():
            if p.is_file() and not p.name.endswith(WEIGHT_FILE_SUFFIXES) and p.name not in WEIGHT_INDEX_FILES:
                shutil.copy2(p, out / p.name)

    shards: list[dict[str, torch.Tensor]] = [{}]
    sizes = [0]
    seen_ptrs: set[int] = set()
    total = 0
    for name, t in named_weights:
        t = t.detach().to("cpu")
        if t.data_ptr() in seen_ptrs or not t.is_contiguous():  # tied / shared storage: safetensors refuses it
            t = t.contiguous().clone()
        seen_ptrs.add(t.data_ptr())
        nbytes = t.numel() * t.element_size()
        if shards[-1] and sizes[-1] + nbytes > max_shard_bytes:
            shards.append({})
            sizes.append(0)
        if name in shards[-1] or any(name in s for s in shards):
            raise ValueError(f"duplicate weight name {name!r}")
        shards[-1][name] = t
        sizes[-1] += nbytes
        total += nbytes
    if not shards[0]:
        raise ValueError("no weights to save")
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(out / fname), metadata={"format": "pt"})
            weight_map.update({k: fname for k in shard})
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    log.info("weights saved", out_dir=str(out), tensors=sum(len(s) for s in shards), bytes=total,
             shards=len(shards))
    return out


def load_weights_from_disk(model_dir: str | os.PathLike) -> Iterable[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) from the safetensors files of an HF model directory (CPU)."""
    from safetensors import safe_open
    d = Path(model_dir)
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {d}")
    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as fh:
            for k in fh.keys():
                yield k, fh.get_tensor(k)


# -- trainer side of the broadcast ----------------------------------------------------------------------------

class DistributedWeightSender:
    """Rank 0 of the weight-update group: owns the TCPStore and broadcasts buckets to the engines."""

    def __init__(self, master_address: str, master_port: int, world_size: int, backend: str = "gloo",
                 group_name: str = DEFAULT_GROUP_NAME, timeout_s: float | None = None,
                 device: str | torch.device | None = None):
        if world_size < 2:
            raise ValueError("world_size counts the trainer and every engine rank: at least 2")
        self.master_address, self.master_port = master_address, int(master_port)
        self.world_size, self.backend, self.group_name = world_size, backend, group_name
        self.timeout_s = timeout_s
        if device is None:
            device = "cuda" if backend == "nccl" else "cpu"
        self.device = torch.device(device)
        self.pg = None
        self._buffer: torch.Tensor | None = None  # flattened buckets reuse one buffer and their slot views
        self._slots: dict = {}

    def connect(self) -> None:
        """Create the group as rank 0 (blocks until every engine has joined via /init_weights_update_group)."""
        if self.pg is not None:
            return
        self.pg = init_weights_update_group(self.master_address, self.master_port, 0, self.world_size,
                                            self.group_name, self.backend, self.timeout_s)

    def broadcast_bucket(self, bucket: list[tuple[str, torch.Tensor]], flattened: bool = False) -> dict:
        """Broadcast the bucket's tensors from rank 0, in order (one uint8 tensor when flattened). Returns its
        metadata (names / dtypes / shapes), the body the engines must be given for the same bucket."""
        if self.pg is None:
            raise RuntimeError("DistributedWeightSender.connect() first")
        meta = bucket_metadata(bucket)
        with torch.no_grad():
            if flattened:
                broadcast(self._flatten([t for _, t in bucket]), self.pg)
            else:
                for _, t in bucket:
                    broadcast(t.detach().to(self.device).contiguous(), self.pg)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return meta

    def _flatten(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """flatten_bucket into a buffer kept across calls: a bucket with the same dtypes and shapes as an earlier one
        (the next sync's) reuses its slot views, so it costs one batched copy. Safe because broadcast_bucket
        synchronises before it returns."""
        key = tuple((t.dtype, tuple(t.shape)) for t in tensors)
        entry = self._slots.get(key)
        if entry is None:
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
            if self._buffer is None or self._buffer.numel() < nbytes:
                self._buffer, self._slots = torch.empty(nbytes, dtype=torch.uint8, device=self.device), {}
            entry = bucket_slots([t.dtype for t in tensors], [t.shape for t in tensors], self.device, self._buffer)
            if len(self._slots) < 256:
                self._slots[key] = entry
        if entry is None:  # mixed dtypes, unaligned: the plain byte layout
            return flatten_bucket([t.to(self.device) for t in tensors])
        flat, views = entry
        copy_tensors(views, [t.to(self.device) for t in tensors])
        return flat

    def release_buffer(self) -> bool:
        """Drop the flat buffer kept across calls (the next flattened bucket allocates a new one); whether one was
        held."""
        held = self._buffer is not None
        self._buffer, self._slots = None, {}
        return held

    def close(self) -> None:
        self.release_buffer()
        if self.pg is not None:
            try:
                destroy_weights_update_group(self.pg)
            finally:
                self.pg = None

    def __enter__(self):
        self.connect()
        return self

    def __exit__(self, *exc):
        self.close()


# -- colocated: the engine maps the trainer's bucket (CUDA IPC on GPU, shared memory on CPU) ---------------------
#
# For the local engine (/update_weights_from_ipc): the trainer flattens a bucket into one uint8 tensor on its device
# and describes it by a JSON-able handle; the engine opens the same memory, copies into its parameters and answers,
# then the trainer drops the bucket. No bytes go through host memory on GPU (CUDA IPC), and nothing is pickled: the
# handle is a dict of ints, booleans and base64 strings. SGLang's own /update_weights_from_tensor takes its pickled
# serializer's payload instead (engine_client.serialize_named_tensors).

import base64
import itertools

_SHM_SEQ = itertools.count()


def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(bytes(b)).decode()


def _unb64(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s)


def cuda_device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


class SharedBucket:
    """A flattened bucket shared with a colocated engine: ``handle`` (JSON-able) names the memory; keep the object
    until every engine has answered, then `release` it."""

    def __init__(self, handle: dict, tensor: torch.Tensor, path: str | None = None):
        self.handle, self.tensor, self.path = handle, tensor, path
        self.nbytes = int(tensor.numel())

    def release(self) -> None:
        cuda = self.tensor is not None and self.tensor.is_cuda
        self.tensor = None
        if cuda:
            torch.cuda.ipc_collect()  # free blocks the engines have let go of
        if self.path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.path = None


def share_bucket(bucket: list[tuple[str, torch.Tensor]]) -> SharedBucket:
    """Flatten the bucket (flatten_bucket's layout) on its tensors' device and make a handle for it: a CUDA IPC
    handle of the uint8 tensor when it is on a GPU (named by the GPU's UUID, as engines may number GPUs
    differently), else a file in /dev/shm holding its bytes."""
    with torch.no_grad():
        flat = flatten_bucket([t for _, t in bucket])
    if flat.is_cuda:
        from torch.multiprocessing.reductions import reduce_tensor
        _, args = reduce_tensor(flat)
        (_cls, _size, _stride, tensor_offset, _storage_cls, _dtype, device, handle, storage_size_bytes,
         storage_offset_bytes, _grad, ref_counter_handle, ref_counter_offset, event_handle, event_sync_required) = args
        h = {"kind": "cuda_ipc", "device_uuid": cuda_device_uuid(device), "handle": _b64(handle),
             "storage_size_bytes": int(storage_size_bytes), "storage_offset_bytes": int(storage_offset_bytes),
             "ref_counter_handle": _b64(ref_counter_handle), "ref_counter_offset": int(ref_counter_offset),
             "event_handle": _b64(event_handle), "event_sync_required": bool(event_sync_required),
             "tensor_offset": int(tensor_offset), "numel": int(flat.numel())}
        return SharedBucket(h, flat)
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    import tempfile
    fd, path = tempfile.mkstemp(prefix=f"slime-actors-bucket-{os.getpid()}-{next(_SHM_SEQ)}-", suffix=".bin",
                                dir=base)
    with os.fdopen(fd, "wb") as f:
        f.write(flat.numpy().tobytes())
    return SharedBucket({"kind": "shm", "path": path, "numel": int(flat.numel())}, flat, path)


def open_shared_bucket(handle: dict, device: torch.device) -> torch.Tensor:
    """The engine side of share_bucket: the bucket as a uint8 tensor (on the GPU: the trainer's memory itself;
    valid until the trainer releases it). Raises ValueError for a handle this engine cannot open."""
    kind = handle.get("kind")
    numel = int(handle["numel"])
    if kind == "shm":
        path = handle["path"]
        if not os.path.exists(path):
            raise ValueError(f"shared bucket {path} does not exist (is the trainer on another host?)")
        return torch.from_file(path, shared=False, size=numel, dtype=torch.uint8).to(device)
    if kind != "cuda_ipc":
        raise ValueError(f"unknown shared bucket kind {kind!r}")
    if device.type != "cuda":
        raise ValueError("a CUDA IPC bucket needs an engine on a GPU (this one runs on cpu)")
    uuid = handle["device_uuid"]
    index = next((i for i in range(torch.cuda.device_count()) if cuda_device_uuid(i) == uuid), None)
    if index is None:
        raise ValueError(f"the trainer's GPU {uuid} is not visible to this engine: colocated sync needs the "
                         "engine on the trainer's GPU")
    from torch.multiprocessing.reductions import rebuild_cuda_tensor
    return rebuild_cuda_tensor(torch.Tensor, (numel,), (1,), int(handle["tensor_offset"]), torch.storage.TypedStorage,
                               torch.uint8, index, _unb64(handle["handle"]), int(handle["storage_size_bytes"]),
                               int(handle["storage_offset_bytes"]), False, _unb64(handle["ref_counter_handle"]),
                               int(handle["ref_counter_offset"]), _unb64(handle["event_handle"]),
                               bool(handle["event_sync_required"]))


# -- trainer rank 0's push: one sync of the backend's weights to the rollout workers ------------------------------

class WeightPusher:
    """What trainer rank 0 does for a `sync_weights`: push the training backend's weights to the rollout workers by
    one of three transports (--update-weight-transport), keeping what lasts between syncs -- the broadcast group and
    its members, the disk versions written. The other ranks `take_part` (gathering full weights is a collective under
    FSDP and Megatron model parallelism).

    The actor hands it what it needs of itself: `actor` (what asks the workers, through typed handles: anything
    with `ask(peer, method, body, timeout=...)`),
    `run_blocking(fn, *args)` (a thread, so the loop keeps answering), `address()` (the address other hosts reach
    this process at; the environment's SLIME_ACTORS_WEIGHT_SYNC_ADDR wins), the run directory (disk versions go to
    RUN/weights unless --update-weight-disk-dir), and optionally the broadcast sender's class (replay passes one that
    needs no engines; default DistributedWeightSender, looked up at each group build).

    * disk: the weights as an HF directory per version, then each worker's `update_weights_from_disk`; only versions
      this pusher wrote are removed.
    * distributed: a broadcast group with the workers' engines (rebuilt when the workers change or a sync failed),
      then per bucket the broadcast and each worker's `update_weights_from_distributed` at once.
    * colocated: per bucket, a post to each engine itself (SGLang: its serializer's CUDA IPC payload; the local
      engine: a handle of the flattened bucket), the workers holding their health probes meanwhile (`weight_update`).

    With --lora-rank and --lora-sync adapter none of these: the adapters alone (PEFT's names, CPU tensors, a few MB)
    go to each worker in one message (`load_lora_adapter`), which writes them as a PEFT adapter directory next to
    its engine and loads it there (SGLang's /load_lora_adapter). With --lora-sync merged the transports above carry
    the merged weights.
    """

    TRANSPORTS = ("disk", "distributed", "colocated")

    def __init__(self, cfg, backend, *, actor, run_blocking: Callable[..., Awaitable], address: Callable[[], str],
                 run_dir: str | os.PathLike, sender_factory: Callable[..., DistributedWeightSender] | None = None):
        self.cfg, self.backend = cfg, backend
        self.actor, self.run_blocking, self.address, self.run_dir = actor, run_blocking, address, run_dir
        self.sender_factory = sender_factory
        self.sender: DistributedWeightSender | None = None
        self.group_workers: tuple = ()  # the workers of the broadcast group; () : build a new one at the next sync
        self.group_name = ""
        self._group_seq = 0
        self.flattened = False  # every engine of the group takes load_format="flattened_bucket"
        self.disk_versions: list[Path] = []  # weight directories written by the disk transport
        self._warm: threading.Thread | None = None   # warm_up's import of SGLang's serializer

    def uses_sglang_serializer(self) -> bool:
        """Whether this job's weight updates go through SGLang's serializer: colocated SGLang engines (launched by
        the job or external), full weights (not LoRA adapters alone)."""
        engine = self.cfg.engine
        return (self.cfg.weights.update_weight_transport == "colocated" and not self.adapters_only()
                and (engine.rollout_engine == "sglang" or bool(engine.rollout_external_engine_addrs)))

    def warm_up(self) -> threading.Thread | None:
        """Rank 0, at start-up: when the updates go through SGLang's serializer, import it in a background thread
        while the engines start (SGLang takes minutes), instead of in the first weight sync, where it cost 2.5 s on
        one H100 (docs/peer-comparison.md). Returns the thread (None: nothing to import)."""
        if not self.uses_sglang_serializer() or self._warm is not None:
            return self._warm
        from .engine_client import import_sglang_serializer

        def run() -> None:
            try:
                seconds = import_sglang_serializer()
            except Exception as exc:   # (the first sync imports it again and reports what fails)
                log.warning("importing SGLang's serializer ahead of the first weight sync failed", error=repr(exc))
                return
            if seconds is not None:
                log.info("SGLang's serializer imported ahead of the first weight sync", seconds=round(seconds, 2))

        self._warm = threading.Thread(target=run, name="sglang-serializer-import", daemon=True)
        self._warm.start()
        return self._warm

    async def take_part(self) -> bool:
        """A rank other than 0: take part in gathering the full weights when that is a collective (Megatron, FSDP);
        True when it did."""
        fsdp = self.backend.parallel == "fsdp"
        if self.adapters_only():
            if fsdp:
                await self.run_blocking(self.backend.adapter_weights)
            return fsdp
        if self.cfg.train.train_backend == "megatron" or fsdp:
            def gather() -> None:
                for _ in self.backend.named_weights():
                    pass
                self.backend.release_host_memory()   # the gathered copies went back into malloc's heaps
            await self.run_blocking(gather)
            return True
        return False

    def release(self) -> bool:
        """After a sync (--trainer-release-memory): the broadcast's flat buffer dropped -- on a 135M-parameter fp32
        model 510 MiB kept between syncs; a block that size is mapped on its own, so freeing it gives it back to the
        OS (docs/performance.md, "Trainer memory on CPU"). Returns whether one was dropped."""
        if not self.cfg.train.trainer_release_memory:
            return False
        drop = getattr(self.sender, "release_buffer", None)   # (a sender that keeps no buffer has none: replay's)
        return bool(drop()) if drop is not None else False

    def adapters_only(self) -> bool:
        """--lora-rank with --lora-sync adapter: the engines get the LoRA adapters, not weights."""
        return self.cfg.lora.lora_rank > 0 and self.cfg.lora.lora_sync == "adapter"

    async def push(self, version: int, workers: list, transport: str | None, rebuild: bool = False) -> dict:
        """Rank 0: send the current weights as `version` to `workers` by `transport`; `rebuild`: an engine of the
        group restarted (the broadcast group it was in is gone with it). Returns bytes, buckets, seconds, transport,
        weight_version (and the transport's own fields)."""
        if rebuild:
            self.group_workers = ()
        t0 = time.monotonic()
        if self.adapters_only():
            transport = "lora-adapter"
            info = await self._adapters(version, workers)
        elif transport == "disk":
            info = await self._disk(version, workers)
        elif transport == "distributed":
            info = await self._distributed(version, workers)
        elif transport == "colocated":
            info = await self._colocated(version, workers)
        else:
            raise ValueError(f"weight transport {transport!r} is not supported by the {self.cfg.train.train_backend} "
                             "backend here (use distributed, disk or colocated)")
        info.update(seconds=time.monotonic() - t0, transport=transport, weight_version=version)
        self.release()
        return info

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()

    def worker(self, name: str) -> RolloutHandle:
        """A rollout worker (`rollout/i`), to ask."""
        return RolloutHandle(self.actor, name)

    async def _disk(self, version: int, workers: list) -> dict:
        base = Path(self.cfg.weights.update_weight_disk_dir or os.path.join(self.run_dir, "weights"))
        path = base / f"v{version:06d}"
        await self.run_blocking(
            lambda: save_weights_to_disk(self.backend.named_weights(), str(path), self.cfg.model.hf_checkpoint))
        nbytes = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        await asyncio.gather(*(self.worker(w).update_weights_from_disk(str(path), version, ask_timeout=600)
                               for w in workers))
        # only versions this rank wrote go (--update-weight-disk-dir may be a directory that holds other things)
        for old in self.disk_versions:
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
        self.disk_versions = [path]
        return {"bytes": int(nbytes), "buckets": 1}

    async def _adapters(self, version: int, workers: list) -> dict:
        """The LoRA adapters to every worker, which loads them into its engine (see the class docstring)."""
        from .lora import nbytes
        tensors = await self.run_blocking(self.backend.adapter_weights)
        config = self.backend.adapter_config()
        await asyncio.gather(*(self.worker(w).load_lora_adapter(version, tensors, config, ask_timeout=600)
                               for w in workers))
        return {"bytes": nbytes(tensors.values()), "buckets": 1, "tensors": len(tensors)}

    async def _ensure_group(self, workers: tuple) -> None:
        if self.sender is not None and self.group_workers == workers:
            return
        if self.sender is not None:  # membership changed (a restarted engine): rebuild the group
            old, old_name = self.group_workers, self.group_name
            # both sides at once: with NCCL, destroying the group waits for the peers to destroy it too
            sender, self.sender = self.sender, None
            await asyncio.gather(*(_quiet(self.worker(w).destroy_weights_group(old_name, ask_timeout=30))
                                   for w in old),
                                 _quiet(self.run_blocking(sender.close)), return_exceptions=True)
        self._group_seq += 1
        name = f"slime-weights-{os.getpid()}-{self._group_seq}"  # unique: a restarted rank 0 starts again at 1
        addr = WEIGHT_SYNC_ADDR.get() or self.address()
        port = find_free_port(addr)
        backend = "nccl" if self.cfg.run.device == "cuda" else "gloo"
        world = 1 + len(workers)
        sender = (self.sender_factory or DistributedWeightSender)(addr, port, world, backend, name)
        _, *replies = await asyncio.gather(
            self.run_blocking(sender.connect),
            *(self.worker(w).init_weights_group(addr, port, i + 1, world, name, backend, ask_timeout=300)
              for i, w in enumerate(workers)))
        self.sender, self.group_workers, self.group_name = sender, workers, name
        self.flattened = all(isinstance(r, dict) and r.get("flattened_bucket") for r in replies)

    async def _distributed(self, version: int, workers: list) -> dict:
        await self._ensure_group(tuple(workers))
        nbytes = nbuckets = 0
        flat = self.flattened  # one uint8 broadcast per bucket (SGLang's "flattened_bucket"), else one per tensor
        for bucket, last in with_last(self.backend.weight_buckets(self.cfg.weights.update_weight_buffer_size)):
            body = {**bucket_metadata(bucket), "group_name": self.group_name,
                    "weight_version": version, "flush_cache": last,  # flush once, after the last bucket
                    "load_format": "flattened_bucket" if flat else None}
            # wait for every part, the broadcast too, before failing: a worker's ask can fail (its host was cut off
            # and declared down) while the broadcast thread still runs; a retry must not start a new group under it
            res = await asyncio.gather(self.run_blocking(self.sender.broadcast_bucket, bucket, flat),
                                       *(self.worker(w).update_weights_from_distributed(**body, ask_timeout=600)
                                         for w in workers), return_exceptions=True)
            for r in res:
                if isinstance(r, BaseException):
                    self.group_workers = ()  # the next sync builds a new group
                    raise r
            nbytes += sum(t.numel() * t.element_size() for _, t in bucket)
            nbuckets += 1
        return {"bytes": nbytes, "buckets": nbuckets, "flattened_bucket": flat}

    async def _colocated(self, version: int, workers: list) -> dict:
        """Colocated engines (same host, sharing GPUs). SGLang: /update_weights_from_tensor with CUDA IPC handles made
        by SGLang's serializer; the local engine: /update_weights_from_ipc with a JSON handle of the flattened bucket
        (share_bucket: CUDA IPC on GPU, a shared-memory file on CPU; nothing pickled). Rank 0 posts to each engine
        itself, so no payload becomes an actor message; the worker holds its health probes meanwhile and learns the
        new version at the end."""
        from .engine_auth import EngineKeys
        from .engine_client import EngineClient, serialize_named_tensors
        if self._warm is not None:   # warm_up's import still running (an engine that started fast): let it finish
            await self.run_blocking(self._warm.join)
        infos = await asyncio.gather(*(self.worker(w).weight_update(True, ask_timeout=600) for w in workers))
        keys = EngineKeys.from_env()  # the job's engine keys (the launcher's environment); admin key: the updates
        clients = [EngineClient(i.engine_url, keys=keys, timeout=600) for i in infos]
        nbytes = nbuckets = 0
        fmt = None
        sent = False
        try:
            servers = await asyncio.gather(*(c.get_server_info() for c in clients))
            local = ["local engine" in str(s.get("version", "")) for s in servers]
            if self.cfg.run.device != "cuda" and not all(local):
                raise ValueError("--update-weight-transport colocated shares CUDA tensors with SGLang engines: it "
                                 "needs --device cuda (use distributed or disk on CPU)")
            for bucket, last in with_last(self.backend.weight_buckets(self.cfg.weights.update_weight_buffer_size)):
                payloads: dict[int, tuple] = {}
                for tp in {i.tp_size for i, loc in zip(infos, local) if not loc}:
                    payloads[tp] = await self.run_blocking(serialize_named_tensors, bucket, tp)
                shared = await self.run_blocking(share_bucket, bucket) if any(local) else None
                meta = bucket_metadata(bucket)
                try:
                    await asyncio.gather(*(
                        c.update_weights_from_ipc(**meta, handle=shared.handle, weight_version=str(version),
                                                  flush_cache=last and i.flush_cache) if loc else
                        c.update_weights_from_tensor(payloads[i.tp_size][0], load_format=payloads[i.tp_size][1],
                                                     flush_cache=last and i.flush_cache,
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
            done = await asyncio.gather(*(self.worker(w).weight_update(False, weight_version=version if sent else None,
                                                                       ask_timeout=60)
                                          for w in workers), return_exceptions=True)
        for r in done:
            if isinstance(r, BaseException):
                raise r
        return {"bytes": nbytes, "buckets": nbuckets, "load_format": fmt}


async def _quiet(aw):
    """`await aw`, None instead of an error (tearing down a group whose peers may be gone)."""
    try:
        return await aw
    except Exception:
        return None


def with_last(items):
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
