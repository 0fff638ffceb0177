"""Trainer rank 0's weight push (backends/weight_sync.WeightPusher) without processes: the workers' asks and the
broadcast sender are stand-ins, the backend is a few tensors. What it asks of whom, in what order, and what it keeps
between syncs (the broadcast group, the disk versions it wrote)."""

from __future__ import annotations

import asyncio
import sys
import typing

import pytest
import torch

from slime_actors.backends.weight_sync import WeightPusher
from slime_actors.config import JobConfig


class Backend:
    def __init__(self, parallel="ddp"):
        self.parallel = parallel
        self.weights = [("a", torch.arange(4, dtype=torch.float32)), ("b", torch.ones(2, 3, dtype=torch.bfloat16)),
                        ("c", torch.zeros(5, dtype=torch.int64))]
        self.gathered = 0

    def named_weights(self):
        self.gathered += 1
        yield from self.weights

    def weight_buckets(self, nbytes):
        yield self.weights[:2]
        yield self.weights[2:]

    def release_host_memory(self):
        return False


class Sender:
    """Stands in for DistributedWeightSender (which replay also replaces)."""
    made: typing.ClassVar[list] = []

    def __init__(self, addr, port, world, backend, name):
        self.args = (addr, world, backend, name)
        self.sent, self.closed = [], False
        Sender.made.append(self)

    def connect(self):
        pass

    def broadcast_bucket(self, bucket, flat):
        self.sent.append(([n for n, _ in bucket], flat))

    def close(self):
        self.closed = True


class Workers:
    def __init__(self, flattened=True, fail=None):
        self.calls, self.flattened, self.fail = [], flattened, fail

    async def ask(self, peer, method, body, timeout=None):
        self.calls.append((peer, method, body))
        if self.fail == (peer, method):
            raise ConnectionError(f"{peer} cut off")
        if method == "init_weights_group":
            return {"flattened_bucket": self.flattened}
        return {}


async def _blocking(fn, *args):
    return fn(*args)


def _pusher(tmp_path, workers, backend=None, **cfg):
    c = JobConfig()
    for k, v in cfg.items():
        section, name = k.split("__")
        setattr(getattr(c, section), name, v)
    Sender.made = []
    return WeightPusher(c, backend or Backend(), actor=workers, run_blocking=_blocking,
                        address=lambda: "127.0.0.1", run_dir=tmp_path, sender_factory=Sender)


def test_distributed_builds_the_group_once_and_sends_each_bucket(tmp_path):
    w = Workers()
    p = _pusher(tmp_path, w)
    info = asyncio.run(p.push(3, ["rollout/0", "rollout/1"], "distributed"))
    assert info["bytes"] == 16 + 12 + 40 and info["buckets"] == 2 and info["flattened_bucket"]
    assert info["transport"] == "distributed" and info["weight_version"] == 3
    (s,) = Sender.made
    assert s.args[1:3] == (3, "gloo") and s.sent == [(["a", "b"], True), (["c"], True)]
    inits = [c for c in w.calls if c[1] == "init_weights_group"]
    assert [(c[0], c[2]["rank_offset"], c[2]["world_size"]) for c in inits] == [("rollout/0", 1, 3),
                                                                                ("rollout/1", 2, 3)]
    updates = [c[2] for c in w.calls if c[1] == "update_weights_from_distributed"]
    assert [(u["names"], u["dtypes"], u["shapes"], u["flush_cache"]) for u in updates[::2]] == [
        (["a", "b"], ["float32", "bfloat16"], [[4], [2, 3]], False), (["c"], ["int64"], [[5]], True)]
    assert all(u["load_format"] == "flattened_bucket" and u["weight_version"] == 3 for u in updates)
    w.calls.clear()
    asyncio.run(p.push(4, ["rollout/0", "rollout/1"], "distributed"))    # same workers: the same group
    assert len(Sender.made) == 1 and not [c for c in w.calls if c[1] == "init_weights_group"]


def test_distributed_rebuilds_the_group_when_workers_change_or_a_sync_failed(tmp_path):
    w = Workers(flattened=False)
    p = _pusher(tmp_path, w)
    asyncio.run(p.push(1, ["rollout/0"], "distributed"))
    first = p.group_name
    asyncio.run(p.push(2, ["rollout/0", "rollout/1"], "distributed"))  # an engine joined: a new group
    assert Sender.made[0].closed and p.group_name != first
    assert ("rollout/0", "destroy_weights_group", {"group_name": first}) in w.calls
    assert all(u["load_format"] is None for _, m, u in w.calls if m == "update_weights_from_distributed")
    w.fail = ("rollout/1", "update_weights_from_distributed")
    with pytest.raises(ConnectionError, match="cut off"):
        asyncio.run(p.push(3, ["rollout/0", "rollout/1"], "distributed"))
    w.fail = None
    asyncio.run(p.push(4, ["rollout/0", "rollout/1"], "distributed"))  # the failed group is not reused
    assert len(Sender.made) == 3
    asyncio.run(p.push(5, ["rollout/0", "rollout/1"], "distributed", rebuild=True))  # an engine restarted
    assert len(Sender.made) == 4


def test_disk_removes_only_the_versions_it_wrote(tmp_path):
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text("{}")
    disk = tmp_path / "weights"
    (disk / "users").mkdir(parents=True)
    w = Workers()
    p = _pusher(tmp_path, w, model__hf_checkpoint=str(src), weights__update_weight_disk_dir=str(disk))
    asyncio.run(p.push(1, ["rollout/0"], "disk"))
    info = asyncio.run(p.push(2, ["rollout/0"], "disk"))
    assert sorted(x.name for x in disk.iterdir()) == ["users", "v000002"]
    assert (disk / "v000002" / "config.json").exists() and info["buckets"] == 1 and info["bytes"] > 0
    assert [b for _, m, b in w.calls if m == "update_weights_from_disk"] == [
        {"model_path": str(disk / "v000001"), "weight_version": 1},
        {"model_path": str(disk / "v000002"), "weight_version": 2}]


def test_an_unknown_transport_is_refused_before_anything_is_sent(tmp_path):
    w = Workers()
    p = _pusher(tmp_path, w)
    with pytest.raises(ValueError, match="weight transport 'carrier-pigeon' is not supported by the torch backend"):
        asyncio.run(p.push(1, ["rollout/0"], "carrier-pigeon"))
    assert w.calls == [] and Sender.made == []


@pytest.mark.parametrize("parallel,backend,takes_part", [("ddp", "torch", False), ("fsdp", "torch", True),
                                                         ("ddp", "megatron", True)])
def test_other_ranks_take_part_when_gathering_is_a_collective(tmp_path, parallel, backend, takes_part):
    b = Backend(parallel)
    p = _pusher(tmp_path, Workers(), b, train__train_backend=backend)
    assert asyncio.run(p.take_part()) is takes_part and b.gathered == int(takes_part)


@pytest.fixture
def fake_sglang(tmp_path, monkeypatch):
    """A stand-in `sglang` package whose serializer module records the thread that imported it."""
    for name in [m for m in list(sys.modules) if m.split(".")[0] == "sglang"]:
        monkeypatch.delitem(sys.modules, name)
    root = tmp_path / "site"
    files = {"sglang/__init__.py": "", "sglang/srt/__init__.py": "",
             "sglang/srt/utils/__init__.py": "import threading\nIMPORTED_IN = threading.current_thread().name\n",
             "sglang/srt/utils/patch_torch.py": "", "sglang/srt/weight_sync/__init__.py": "",
             "sglang/srt/weight_sync/tensor_bucket.py": ""}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    monkeypatch.syspath_prepend(str(root))
    yield
    for name in [m for m in list(sys.modules) if m.split(".")[0] == "sglang"]:
        del sys.modules[name]


@pytest.mark.parametrize("cfg", [dict(engine__rollout_engine="sglang"),
                                 dict(engine__rollout_external_engine_addrs=["127.0.0.1:30000"])])
def test_warm_up_imports_sglangs_serializer_in_a_thread_for_colocated_sglang(tmp_path, fake_sglang, cfg):
    p = _pusher(tmp_path, Workers(), weights__update_weight_transport="colocated", **cfg)
    thread = p.warm_up()
    assert thread is not None and thread.name == "sglang-serializer-import"
    thread.join(30)
    assert not thread.is_alive()
    assert sys.modules["sglang.srt.utils"].IMPORTED_IN == "sglang-serializer-import"   # not the caller's thread
    assert "sglang.srt.weight_sync.tensor_bucket" in sys.modules
    assert p.warm_up() is thread   # once


@pytest.mark.parametrize("cfg", [dict(engine__rollout_engine="local", weights__update_weight_transport="colocated"),
                                 dict(engine__rollout_engine="sglang", weights__update_weight_transport="distributed"),
                                 dict(engine__rollout_engine="sglang", weights__update_weight_transport="colocated",
                                      lora__lora_rank=8, lora__lora_sync="adapter")])
def test_warm_up_imports_nothing_when_the_updates_do_not_use_sglangs_serializer(tmp_path, fake_sglang, cfg):
    p = _pusher(tmp_path, Workers(), **cfg)
    assert p.warm_up() is None
    assert "sglang.srt.utils" not in sys.modules


def test_warm_up_without_sglang_installed_ends_quietly(tmp_path, monkeypatch):
    from slime_actors.backends.engine_client import import_sglang_serializer
    for name in [m for m in list(sys.modules) if m.split(".")[0] == "sglang"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "sglang", None)   # (import sglang raises ImportError)
    assert import_sglang_serializer() is None
    p = _pusher(tmp_path, Workers(), weights__update_weight_transport="colocated", engine__rollout_engine="sglang")
    thread = p.warm_up()
    thread.join(30)
    assert not thread.is_alive()
