"""Log-probs and entropies from vocab-parallel logits (megatron backend, tensor parallel): 2 and 3 gloo ranks, each
holding a slice of the vocabulary (the last one padded), against the full log_softmax -- values and gradients."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from slime_actors.algo.logprobs import entropy_from_logits, log_probs_from_logits
from slime_actors.backends.weight_sync import find_free_port

N, V = 7, 11  # 11 tokens: padded to 12 on 2 or 3 ranks


def _case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(N, V, generator=g) * 3
    target = torch.randint(0, V, (N,), generator=g)
    g_lp = torch.randn(N, generator=g)
    g_ent = torch.randn(N, generator=g)
    return logits, target, g_lp, g_ent


def _rank(rank: int, world: int, port: int, out: str) -> None:
    from slime_actors.backends.megatron_backend import vocab_parallel_log_probs
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    logits, target, g_lp, g_ent = _case()
    padded = -(-V // world) * world
    full = torch.cat([logits, torch.full((N, padded - V), 123.0)], dim=1)  # garbage in the padding columns
    per = padded // world
    local = full[:, rank * per:(rank + 1) * per].clone().requires_grad_(True)
    lp, ent = vocab_parallel_log_probs(local, target, rank * per, V, None)
    (lp * g_lp).sum().add((ent * g_ent).sum()).backward()
    grads = [torch.zeros_like(local) for _ in range(world)]
    dist.all_gather(grads, local.grad)
    if rank == 0:
        torch.save({"lp": lp.detach(), "ent": ent.detach(), "grad": torch.cat(grads, dim=1)[:, :V]}, out)
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_vocab_parallel_log_probs_match_full_softmax(tmp_path, world):
    out = str(tmp_path / "r.pt")
    mp.start_processes(_rank, args=(world, find_free_port(), out), nprocs=world, start_method="spawn")
    got = torch.load(out, weights_only=True)
    logits, target, g_lp, g_ent = _case()
    x = logits.clone().requires_grad_(True)
    lp = log_probs_from_logits(x, target)
    ent = entropy_from_logits(x)
    (lp * g_lp).sum().add((ent * g_ent).sum()).backward()
    assert torch.allclose(got["lp"], lp.detach(), atol=1e-5)
    assert torch.allclose(got["ent"], ent.detach(), atol=1e-5)
    assert torch.allclose(got["grad"], x.grad, atol=1e-5)
    assert float(x.grad.abs().max()) > 0.1


def test_single_slice_equals_plain_log_softmax():
    """One rank holding the whole vocabulary (group of one): the same numbers as algo.logprobs."""
    from slime_actors.backends.megatron_backend import vocab_parallel_log_probs
    port = find_free_port()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    pg_made = False
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        pg_made = True
    try:
        logits, target, _, _ = _case(1)
        lp, ent = vocab_parallel_log_probs(logits, target, 0, V, None)
        assert torch.allclose(lp, log_probs_from_logits(logits, target), atol=1e-6)
        assert torch.allclose(ent, entropy_from_logits(logits), atol=1e-6)
    finally:
        if pg_made:
            dist.destroy_process_group()
