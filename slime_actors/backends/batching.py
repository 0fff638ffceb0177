"""Split a trainer batch into optimizer-step mini-batches and micro-batches, and pad micro-batches into tensors.

A batch is the dict of parallel per-sample lists made by `slime_actors.types.batch_from_samples` (plus per-sample
tensors added by rl_update). Every list whose length is the number of samples is a per-sample field; other
entries are carried along unchanged.

    unpack_batch(batch)                                    # the trainer's get_batch reply: packed columns -> rows
    validate_batch(batch)                                  # ValueError naming the first bad sample
    for step_idx in mini_batch_indices(n, num_steps):      # one optimizer step each
        mb = select(batch, step_idx)
        for idx in micro_batch_indices([len(t) for t in mb["tokens"]], micro_batch_size=2): ...
    ids, attn, pos = pad_tokens(token_lists, pad_id=0)     # right padding
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..config import TrainSection

PER_SAMPLE_REQUIRED = ("tokens", "prompt_lengths", "response_lengths", "loss_masks")


def unpack_batch(batch: dict) -> dict:
    """A batch whose per-token columns came packed (`get_batch(..., packed=True)`, types.pack_rows), in place, as the
    RL update takes it: tokens as a list of ints per sample, as ever; loss masks and rollout log-probs as a float32
    tensor per sample (views of one array: what rl_update._prepare makes of lists). A column that is already a list
    stays as it is. ValueError naming the column for a malformed one (wrong dtype, lengths, size, or row count).
    Returns `batch`."""
    from ..types import PACKED_KEYS, unpack_lists, unpack_rows
    n = len(batch["sample_index"]) if isinstance(batch.get("sample_index"), list) else None
    for key in PACKED_KEYS:
        column = batch.get(key)
        if not isinstance(column, dict):
            continue
        name = f"batch[{key!r}]"
        if key == "tokens":
            rows = unpack_lists(column, name)
            count = len(rows)
        else:
            flat, lengths = unpack_rows(column, name)
            rows = list(torch.from_numpy(flat.astype("float32")).split(lengths))
            count = len(lengths)
        if n is not None and count != n:
            raise ValueError(f"{name} has {count} rows for {n} samples")
        batch[key] = rows
    return batch


def num_samples(batch: dict) -> int:
    return len(batch["tokens"])


def _sample_name(batch: dict, i: int) -> str:
    idx = batch.get("sample_index")
    if idx is not None and i < len(idx):
        return f"sample {i} (sample_index={idx[i]})"
    return f"sample {i}"


def validate_batch(batch: dict, require_rollout_log_probs: bool = False) -> None:
    """Check the per-sample fields agree; raise ValueError naming the first inconsistent sample.

    tokens = prompt + response, so len(tokens) == prompt_length + response_length; loss_masks (and
    rollout_log_probs, when given for a sample) have one entry per response token; the prompt has at least one
    token (the first response token is predicted from it).
    """
    for key in PER_SAMPLE_REQUIRED:
        if key not in batch:
            raise ValueError(f"batch has no {key!r}")
    n = num_samples(batch)
    for key, value in batch.items():
        if key in PER_SAMPLE_REQUIRED and len(value) != n:
            raise ValueError(f"batch[{key!r}] has {len(value)} entries for {n} samples")
    rlp = batch.get("rollout_log_probs")
    for i in range(n):
        name = _sample_name(batch, i)
        t, p, r = len(batch["tokens"][i]), int(batch["prompt_lengths"][i]), int(batch["response_lengths"][i])
        if p < 1:
            raise ValueError(f"{name}: prompt_length {p} < 1 (the first response token needs a prompt token)")
        if r < 0:
            raise ValueError(f"{name}: negative response_length {r}")
        if t != p + r:
            raise ValueError(f"{name}: {t} tokens != prompt_length {p} + response_length {r}")
        m = len(batch["loss_masks"][i])
        if m != r:
            raise ValueError(f"{name}: loss_mask has {m} entries for response_length {r}")
        if rlp is not None and i < len(rlp):
            k = len(rlp[i])
            if (k or require_rollout_log_probs) and k != r:
                raise ValueError(f"{name}: rollout_log_probs has {k} entries for response_length {r}")
        for key in ("old_log_probs", "ref_log_probs", "values", "advantages", "returns"):
            v = batch.get(key)
            if v is not None and len(v) == n and len(v[i]) != r:
                raise ValueError(f"{name}: {key} has {len(v[i])} entries for response_length {r}")


def select(batch: dict, indices: Sequence[int]) -> dict:
    """The sub-batch of the given sample indices (per-sample lists indexed; other entries copied by reference)."""
    n = num_samples(batch)
    out = {}
    for key, value in batch.items():
        if isinstance(value, (list, tuple)) and len(value) == n:
            out[key] = [value[i] for i in indices]
        elif isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == n and key != "tokens":
            out[key] = value[list(indices)]
        else:
            out[key] = value
    return out


def mini_batch_indices(n: int, num_steps: int) -> list[list[int]]:
    """Split samples 0..n-1, in order, into ``num_steps`` contiguous chunks as equal as possible (the first ones
    take the remainder). With n = num_steps * k each chunk has k samples (k = global_batch_size / world_size).
    Chunks may be empty when n < num_steps; every rank still takes num_steps optimizer steps."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    base, extra = divmod(n, num_steps)
    out, start = [], 0
    for s in range(num_steps):
        size = base + (1 if s < extra else 0)
        out.append(list(range(start, start + size)))
        start += size
    return out


def fixed_micro_batches(n: int, micro_batch_size: int) -> list[list[int]]:
    """Consecutive groups of ``micro_batch_size`` samples (the last may be smaller)."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    return [list(range(i, min(i + micro_batch_size, n))) for i in range(0, n, micro_batch_size)]


def dynamic_micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """First-fit decreasing bin packing of sample lengths into micro-batches of at most ``max_tokens`` tokens
    (the sum of the samples' lengths). A sample longer than the budget gets a micro-batch of its own. Indices
    inside a micro-batch are sorted; micro-batches are ordered by their first index."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        n = int(lengths[i])
        for b in range(len(bins)):
            if loads[b] + n <= max_tokens:
                bins[b].append(i)
                loads[b] += n
                break
        else:
            bins.append([i])
            loads.append(n)
    bins = [sorted(b) for b in bins]
    bins.sort(key=lambda b: b[0])
    return bins


def micro_batch_indices(lengths: Sequence[int], micro_batch_size: int = 1, max_tokens: int | None = None,
                        dynamic: bool = False, min_count: int = 0) -> list[list[int]]:
    """Micro-batches for one mini-batch: fixed size, or dynamic by a token budget. ``min_count`` pads the list
    with empty micro-batches (so every rank runs the same number of forward passes, as FSDP needs)."""
    if dynamic:
        if not max_tokens:
            raise ValueError("dynamic micro-batches need max_tokens (--max-tokens-per-gpu)")
        mbs = dynamic_micro_batches(lengths, max_tokens)
    else:
        mbs = fixed_micro_batches(len(lengths), micro_batch_size)
    while len(mbs) < min_count:
        mbs.append([])
    return mbs


def micro_batches_from_config(train: TrainSection, lengths: Sequence[int], min_count: int = 0) -> list[list[int]]:
    """``micro_batch_indices`` with --micro-batch-size / --use-dynamic-batch-size / --max-tokens-per-gpu."""
    return micro_batch_indices(lengths, micro_batch_size=train.micro_batch_size, max_tokens=train.max_tokens_per_gpu,
                               dynamic=train.use_dynamic_batch_size, min_count=min_count)


def forward_micro_batches(train: TrainSection, lengths: Sequence[int], min_count: int = 0,
                          fits_tokens: int | None = None) -> list[list[int]]:
    """Micro-batches of a no-grad pass (reference / old-policy log-probs, critic values): packed by length up to
    --log-probs-max-tokens-per-gpu tokens, else up to `fits_tokens` (the backend's estimate of what its device
    holds), else the training micro-batches. A no-grad forward keeps no activations, so it can take more at once."""
    budget = train.log_probs_max_tokens_per_gpu or fits_tokens
    if budget:
        return micro_batch_indices(lengths, max_tokens=budget, dynamic=True, min_count=min_count)
    return micro_batches_from_config(train, lengths, min_count=min_count)


def pad_tokens(token_lists: Sequence[Sequence[int]], pad_id: int = 0, device: torch.device | str | None = None,
               pad_to_multiple_of: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad sequences into ``(input_ids [B, T], attention_mask [B, T], position_ids [B, T])``.

    attention_mask is 1 on real tokens; position_ids count 0, 1, ... from each sequence's start (pad positions
    continue the count; they are masked out). With right padding and causal attention a real token never
    attends to padding, so its outputs match an unpadded forward."""
    b = len(token_lists)
    t = max((len(x) for x in token_lists), default=0)
    t = max(1, math.ceil(t / pad_to_multiple_of) * pad_to_multiple_of)
    ids = torch.full((b, t), int(pad_id), dtype=torch.long)
    mask = torch.zeros((b, t), dtype=torch.long)
    for i, toks in enumerate(token_lists):
        n = len(toks)
        if n:
            ids[i, :n] = torch.as_tensor(list(toks), dtype=torch.long)
            mask[i, :n] = 1
    pos = torch.arange(t, dtype=torch.long).unsqueeze(0).expand(b, t).contiguous()
    if device is not None:
        ids, mask, pos = ids.to(device), mask.to(device), pos.to(device)
    return ids, mask, pos
