"""Trainer-side weight sync helpers (the broadcast itself is exercised against the engine in test_local_engine)."""

from __future__ import annotations

import json

import pytest
import torch

from slime_actors.backends.weight_sync import (DistributedWeightSender, bucket_metadata, bucket_nbytes, dtype_from_name,
                                               dtype_name, find_free_port, flatten_bucket, load_weights_from_disk,
                                               save_weights_to_disk, unflatten_bucket)
from slime_actors.models.tiny import make_tiny_model


def test_dtype_names_are_sglangs():
    assert dtype_name(torch.bfloat16) == "bfloat16" and dtype_name(torch.float32) == "float32"
    assert dtype_from_name("torch.float16") is torch.float16 and dtype_from_name("bfloat16") is torch.bfloat16
    with pytest.raises(ValueError):
        dtype_from_name("float33")
    with pytest.raises(ValueError):
        dtype_from_name("nn")  # an attribute of torch that is not a dtype


def test_flattened_bucket_round_trip_mixed_dtypes():
    bucket = [("a", torch.arange(6, dtype=torch.float32).reshape(2, 3)),
              ("b", torch.tensor([1.5, -2], dtype=torch.bfloat16)),
              ("c", torch.tensor([[7]], dtype=torch.int64)), ("d", torch.randn(3, 2).t())]  # non-contiguous
    meta = bucket_metadata(bucket)
    assert meta == {"names": ["a", "b", "c", "d"], "dtypes": ["float32", "bfloat16", "int64", "float32"],
                    "shapes": [[2, 3], [2], [1, 1], [2, 3]]}
    flat = flatten_bucket([t for _, t in bucket])
    assert flat.dtype == torch.uint8 and flat.numel() == bucket_nbytes(meta["dtypes"], meta["shapes"])
    out = unflatten_bucket(flat, meta["names"], meta["dtypes"], meta["shapes"])
    for (n1, t1), (n2, t2) in zip(bucket, out):
        assert n1 == n2 and t2.dtype == t1.dtype and torch.equal(t1, t2)
    with pytest.raises(ValueError):
        unflatten_bucket(flat[:-1], meta["names"], meta["dtypes"], meta["shapes"])


@pytest.mark.parametrize("max_shard_bytes", [4 << 30, 20_000])
def test_save_weights_to_disk_makes_a_loadable_hf_dir(tmp_path, max_shard_bytes):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    src = make_tiny_model(tmp_path / "src", seed=0)
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    # named_parameters(remove_duplicate=False) includes the tied lm_head.weight, sharing storage
    named = list(model.named_parameters(remove_duplicate=False))
    out = save_weights_to_disk(named, tmp_path / "out", src, max_shard_bytes=max_shard_bytes)
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    if max_shard_bytes < 1 << 20:
        index = json.loads((out / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 1
    again = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    for (n, p), (n2, p2) in zip(model.state_dict().items(), again.state_dict().items()):
        assert n == n2 and torch.equal(p, p2), n
    assert AutoTokenizer.from_pretrained(str(out))("3 + 4")["input_ids"]
    names = {n for n, _ in load_weights_from_disk(out)}
    assert "model.embed_tokens.weight" in names
    # saving again into the same directory replaces the weights, never mixes old shards in
    save_weights_to_disk(named[:3], out, src)
    assert len({n for n, _ in load_weights_from_disk(out)}) == 3


def test_sender_validates_and_needs_connect():
    with pytest.raises(ValueError):
        DistributedWeightSender("127.0.0.1", find_free_port(), world_size=1)
    s = DistributedWeightSender("127.0.0.1", find_free_port(), world_size=2)
    with pytest.raises(RuntimeError):
        s.broadcast_bucket([("a", torch.zeros(1))])
    s.close()
