"""The pickles a checkpoint holds, read without running code from them.

A pickle is a program: unpickling it calls whatever callables it names (`os.system` as easily as a dataclass), so
a checkpoint from elsewhere is read here only through allow-lists:

    md = read_dcp_metadata(dir)         # DCP's `.metadata`: only the classes torch.distributed.checkpoint and
                                        #   megatron-core store there (DCP_CLASSES, torch dtypes, pathlib paths)
    check_torch_dist(dir)               # `.metadata`, every non-tensor entry and a legacy `common.pt`: allowed classes
                                        #   only (what megatron-core's dist_checkpointing will unpickle when it loads)
    obj = load_torch_file(path)         # torch.load(weights_only=True): tensors, containers, numbers, strings

Anything else raises UnsafeCheckpointError naming the class and the file; nothing the pickle names beyond the
allow-list is ever imported or called. The tensor data of DCP (`*.distcp`) is read by torch itself with
`weights_only=True`; safetensors files hold no code at all.

Why a hand-written unpickler for `.metadata` rather than torch's `weights_only` one: torch's accepts only what
`torch.save` of tensors needs and refuses DCP's dataclasses unless registered process-wide
(`torch.serialization.add_safe_globals`, which would widen every other torch.load of the process too); the
pickle module's documented way to restrict globals is `Unpickler.find_class`, which is what this does.
"""

from __future__ import annotations

import argparse
import builtins
import collections
import io
import os
import pathlib
import pickle
import re
import types
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import metadata as _dcp_md
from torch.distributed.checkpoint import planner as _dcp_planner

METADATA_FILE = ".metadata"
COMMON_FILE = "common.pt"   # megatron-core's legacy non-tensor state of a torch_dist checkpoint


class UnsafeCheckpointError(ValueError):
    """A checkpoint file whose pickle names a class outside the allow-list (or is not a pickle at all)."""

    def __init__(self, path: str | os.PathLike, what: str, detail: str = ""):
        self.path, self.what = str(path), what
        super().__init__(f"{path}: refused to load -- {what}{detail}. Nothing in it was run; a checkpoint of "
                         "torch.distributed.checkpoint / megatron-core holds only tensors and the classes listed in "
                         "docs/security.md (\"Loading checkpoints\")")


@dataclass
class MCoreMetadata(_dcp_md.Metadata):
    """Stand-in for megatron-core's `MCoreMetadata` (dist_checkpointing/strategies/torch.py, Oct-Dec 2025): DCP's
    Metadata plus `mcore_data` ({key: {"nd_reformulated_orig_global_shape": shape}}). Read into this class, so
    loading needs neither megatron-core nor its import."""

    mcore_data: dict | None = None


@dataclass(frozen=True)
class MCoreSavePlan(_dcp_planner.SavePlan):
    """Stand-in for megatron-core's `MCoreSavePlan` (the same months): a SavePlan plus `mcore_data`. megatron-core
    keeps every rank's save plan in the metadata (`all_local_plans`, to reuse them on the next save)."""

    mcore_data: dict | None = None


def _dcp_classes() -> dict[tuple[str, str], Any]:
    from torch.distributed.checkpoint import filesystem as _fs
    md = "torch.distributed.checkpoint.metadata"
    out: dict[tuple[str, str], Any] = {
        (md, n): getattr(_dcp_md, n) for n in (
            "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
            "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")}
    out[("torch.distributed.checkpoint.filesystem", "_StorageInfo")] = _fs._StorageInfo
    out[("torch.distributed.checkpoint.filesystem", "_StoragePrefix")] = _fs._StoragePrefix
    # megatron-core (since Feb 2025; seen in 0.16) stores every rank's save plan there: `Metadata.all_local_plans`
    pl = "torch.distributed.checkpoint.planner"
    for n in ("SavePlan", "WriteItem", "WriteItemType", "TensorWriteData", "BytesIOWriteData"):
        out[(pl, n)] = getattr(_dcp_planner, n)
    # torch <= 2.1 pickled the tensor properties under their old home
    old = "torch.distributed._shard.sharded_tensor.metadata"
    out[(old, "TensorProperties")] = _dcp_md.TensorProperties
    out[(old, "MEM_FORMAT_ENCODING")] = _dcp_md._MEM_FORMAT_ENCODING
    out[("megatron.core.dist_checkpointing.strategies.torch", "MCoreMetadata")] = MCoreMetadata
    out[("megatron.core.dist_checkpointing.strategies.torch", "MCoreSavePlan")] = MCoreSavePlan
    out[("torch", "Size")] = torch.Size
    out[("torch.serialization", "_get_layout")] = torch.serialization._get_layout  # (a dict lookup by name)
    for name in dir(torch):  # torch.float32, torch.bfloat16, ...: dtype objects, not callables
        if isinstance(getattr(torch, name, None), torch.dtype):
            out[("torch", name)] = getattr(torch, name)
    # StorageMeta.checkpoint_id is the path a job saved to (megatron-core passes a Path)
    for mod in ("pathlib", "pathlib._local"):
        for n in ("Path", "PosixPath", "PurePath", "PurePosixPath", "WindowsPath", "PureWindowsPath"):
            out[(mod, n)] = getattr(pathlib, n)
    out[("collections", "OrderedDict")] = collections.OrderedDict
    for n in ("set", "frozenset", "complex"):
        out[("builtins", n)] = getattr(builtins, n)
    return out


DCP_CLASSES: dict[tuple[str, str], Any] = _dcp_classes()


class _AllowListUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals of `allowed` ({(module, name): object}); anything else raises
    before it is imported. Persistent ids (torch storages) are refused: DCP metadata has none."""

    def __init__(self, f, allowed: dict[tuple[str, str], Any], path: Path):
        super().__init__(f)
        self.allowed, self.path = allowed, path

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self.allowed[(module, name)]
        except KeyError:
            raise UnsafeCheckpointError(self.path, f"its pickle names {module}.{name}, which is not a class "
                                                   "torch.distributed.checkpoint or megatron-core stores in "
                                                   "checkpoint metadata") from None

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpointError(self.path, f"its pickle refers to external storage ({str(pid)[:80]})")


def read_dcp_metadata(path: str | os.PathLike) -> _dcp_md.Metadata:
    """DCP's `.metadata` of the torch_dist directory `path` (or the file itself), through the allow-list."""
    p = Path(path)
    f = p / METADATA_FILE if p.is_dir() else p
    try:
        with open(f, "rb") as fh:
            md = _AllowListUnpickler(fh, DCP_CLASSES, f).load()
    except UnsafeCheckpointError:
        raise
    except FileNotFoundError:
        raise
    except Exception as exc:  # a truncated or garbled file: pickle raises many kinds
        raise UnsafeCheckpointError(f, "not a readable DCP metadata pickle", f" ({type(exc).__name__}: {exc})") \
            from None
    if not isinstance(md, _dcp_md.Metadata):
        raise UnsafeCheckpointError(f, f"it holds a {type(md).__name__}, not DCP Metadata")
    return md


_GLOBAL_RE = re.compile(r"(?:GLOBAL|global) ([\w.]+)")


def load_torch_file(path: str | os.PathLike | io.BytesIO, *, name: str | None = None, mmap: bool = False) -> Any:
    """torch.load(weights_only=True) on CPU; a pickle naming anything beyond tensors and plain data raises
    UnsafeCheckpointError naming that class and the file (`name` for a buffer)."""
    where = name or str(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        m = _GLOBAL_RE.search(str(exc))
        what = f"its pickle names {m.group(1)}" if m else "its pickle holds more than tensors and plain data"
        raise UnsafeCheckpointError(where, what, " (torch.load weights_only=True refused it)") from None
    except (RuntimeError, zipfile.BadZipFile, EOFError) as exc:
        if isinstance(exc, RuntimeError) and "weights_only" not in str(exc).lower() \
                and "zip" not in str(exc).lower() and "magic" not in str(exc).lower():
            raise
        raise UnsafeCheckpointError(where, "not a torch.save file torch can read safely",
                                    f" ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]})") from None


# plain-data classes megatron-core keeps among a checkpoint's objects (its own safe_globals.py registers these and
# its enums with torch when it is imported; these are allowed even where it is not, or is older)
PLAIN_OBJECTS = [io.BytesIO, argparse.Namespace, types.SimpleNamespace, pathlib.PosixPath]


def _check_object(value: io.BytesIO, where: str) -> None:
    """A non-tensor DCP entry: torch.save bytes (megatron-core's ShardedObjects hold the object's own torch.save
    bytes; DCP's default planner wraps them in one more torch.save of a BytesIO, whose content is checked too)."""
    with torch.serialization.safe_globals(PLAIN_OBJECTS):
        obj = load_torch_file(value, name=where)
    if isinstance(obj, io.BytesIO) and obj.getvalue()[:2] in (b"PK", b"\x80\x02", b"\x80\x03", b"\x80\x04",
                                                              b"\x80\x05"):
        load_torch_file(io.BytesIO(obj.getvalue()), name=where)


def check_torch_dist(path: str | os.PathLike) -> _dcp_md.Metadata:
    """Check everything megatron-core's dist_checkpointing unpickles when it loads the torch_dist directory `path`:
    `.metadata` (allow-list), each non-tensor entry (torch's weights_only unpickler) and a legacy `common.pt`
    (idem). Tensor data is read later by torch with weights_only=True. Returns the metadata."""
    from torch.distributed.checkpoint import DefaultLoadPlanner, load
    p = Path(path)
    md = read_dcp_metadata(p)
    objects = {k: io.BytesIO() for k, v in md.state_dict_metadata.items()
               if isinstance(v, _dcp_md.BytesStorageMetadata)}
    if objects:
        files = {idx.fqn: info.relative_path for idx, info in (md.storage_data or {}).items()}
        refused: list[UnsafeCheckpointError] = []

        class Planner(DefaultLoadPlanner):
            def load_bytes(self, read_item, value):
                fqn = read_item.dest_index.fqn
                try:
                    _check_object(value, f"{p / files.get(fqn, '?')} (entry {fqn!r})")
                except UnsafeCheckpointError as exc:
                    refused.append(exc)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            load(objects, storage_reader=safe_reader(p), planner=Planner(flatten_state_dict=False), no_dist=True)
        if refused:
            raise refused[0]
    if (p / COMMON_FILE).is_file():
        with torch.serialization.safe_globals(PLAIN_OBJECTS):
            load_torch_file(p / COMMON_FILE)
    return md


def safe_reader(path: str | os.PathLike):
    """A DCP FileSystemReader whose `.metadata` goes through the allow-list (tensors: torch's weights_only load)."""
    from torch.distributed.checkpoint import FileSystemReader

    class Reader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            md = read_dcp_metadata(self.path)
            if getattr(md, "storage_meta", None) is None:
                md.storage_meta = _dcp_md.StorageMeta()
            md.storage_meta.load_id = self.load_id
            if getattr(md, "planner_data", None) is None:
                md.planner_data = {}
            return md
    return Reader(str(path))


__all__ = ["UnsafeCheckpointError", "DCP_CLASSES", "read_dcp_metadata", "check_torch_dist", "load_torch_file",
           "safe_reader", "MCoreMetadata", "MCoreSavePlan"]
