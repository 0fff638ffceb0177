"""The data that flows through the buffer: samples (one prompt + one response) and the trainer's batch."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields
from typing import Any

# sample status
PENDING, COMPLETED, TRUNCATED, ABORTED, FAILED = "pending", "completed", "truncated", "aborted", "failed"
STATUSES = (PENDING, COMPLETED, TRUNCATED, ABORTED, FAILED)


@dataclass
class Sample:
    """One response to one prompt. Groups of `n_samples_per_prompt` share a `group_index`.

    `loss_mask`, `rollout_log_probs` have one entry per response token. `weight_version` is the version of the
    weights that generated the response (for a partial rollout continued across steps: the oldest one used;
    `weight_versions` lists them all). `reward` is the raw score; the trainer's advantages are derived from it.
    """

    index: int
    group_index: int
    prompt: Any = ""                 # str, or chat messages
    prompt_tokens: list[int] = field(default_factory=list)
    label: Any = None
    metadata: dict = field(default_factory=dict)
    response: str = ""
    response_tokens: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] = field(default_factory=list)
    reward: float | None = None
    weight_version: int = -1
    weight_versions: list[int] = field(default_factory=list)
    status: str = PENDING
    rollout_id: int = -1
    finish_reason: str | None = None
    error: str | None = None

    class Status:
        """slime's names for the statuses (`sample.status = Sample.Status.COMPLETED` in a ported function)."""
        PENDING, COMPLETED, TRUNCATED, ABORTED, FAILED = PENDING, COMPLETED, TRUNCATED, ABORTED, FAILED

    @property
    def tokens(self) -> list[int]:
        """Prompt and response tokens. Settable as in slime: `sample.tokens = prompt_ids + response_ids` keeps the
        current response length (set `sample.response_length` before or after, in either order)."""
        return self.prompt_tokens + self.response_tokens

    @tokens.setter
    def tokens(self, value: list[int]) -> None:
        value = list(value)
        n = min(len(self.response_tokens), len(value))
        self.prompt_tokens, self.response_tokens = value[:len(value) - n], value[len(value) - n:]

    @property
    def response_length(self) -> int:
        return len(self.response_tokens)

    @response_length.setter
    def response_length(self, n: int) -> None:
        """slime's way of saying which of `tokens` are the response: the last n."""
        every = self.tokens
        if not 0 <= int(n) <= len(every):
            raise ValueError(f"response_length {n} outside 0..{len(every)} (the sample has {len(every)} tokens)")
        cut = len(every) - int(n)
        self.prompt_tokens, self.response_tokens = every[:cut], every[cut:]

    def to_wire(self) -> dict:
        """A plain dict that shares nothing mutable with the sample (what dataclasses.asdict gives, ~20x faster:
        token lists are flat, and only the user's free-form fields -- prompt, label, metadata -- are deep-copied,
        when they are containers)."""
        return {"index": self.index, "group_index": self.group_index, "prompt": _plain_copy(self.prompt),
                "prompt_tokens": list(self.prompt_tokens), "label": _plain_copy(self.label),
                "metadata": _plain_copy(self.metadata), "response": self.response,
                "response_tokens": list(self.response_tokens), "loss_mask": list(self.loss_mask),
                "rollout_log_probs": list(self.rollout_log_probs), "reward": self.reward,
                "weight_version": self.weight_version, "weight_versions": list(self.weight_versions),
                "status": self.status, "rollout_id": self.rollout_id, "finish_reason": self.finish_reason,
                "error": self.error}

    def wire_view(self) -> dict:
        """What `to_wire` gives, sharing the sample's own lists and maps (no copies): for packing at once, before
        anything changes the sample (the buffer's log: buffer_state.event_view). msgpack packs it to the same bytes."""
        return {"index": self.index, "group_index": self.group_index, "prompt": self.prompt,
                "prompt_tokens": self.prompt_tokens, "label": self.label, "metadata": self.metadata,
                "response": self.response, "response_tokens": self.response_tokens, "loss_mask": self.loss_mask,
                "rollout_log_probs": self.rollout_log_probs, "reward": self.reward,
                "weight_version": self.weight_version, "weight_versions": self.weight_versions,
                "status": self.status, "rollout_id": self.rollout_id, "finish_reason": self.finish_reason,
                "error": self.error}

    @classmethod
    def from_wire(cls, d: dict) -> "Sample":
        names = _FIELDS
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"sample has unknown field(s) {sorted(unknown)}")
        return cls(**d)

    def reset_response(self) -> None:
        """Forget a generated response (the prompt is issued again)."""
        self.response, self.response_tokens, self.loss_mask, self.rollout_log_probs = "", [], [], []
        self.reward, self.status, self.finish_reason, self.error = None, PENDING, None, None
        self.weight_versions = []
        self.weight_version = -1


_FIELDS = {f.name for f in fields(Sample)}


def _plain_copy(v):
    """A deep copy of JSON-like data (dicts, lists, tuples of scalars); anything else is returned as it is."""
    t = type(v)
    if t is dict:
        return {k: _plain_copy(x) for k, x in v.items()}
    if t is list or t is tuple:
        return [_plain_copy(x) for x in v]
    return v


def batch_from_samples(samples: list[Sample], packed: bool = False, columns: dict | None = None) -> dict:
    """The trainer's view of a list of samples: parallel lists, one entry per sample (docs/architecture.md); with
    `roles` (each sample's metadata["role"], "" for none) when any sample has one: advantages are then normalized
    per (group, role) -- episode_samples.advantage_groups.

    `packed`: the per-token columns (tokens, loss_masks, rollout_log_probs) as `pack_rows` makes them -- one flat
    array's bytes and the rows' lengths -- instead of a list per sample (the trainer's get_batch asks so; the RL update
    unpacks them, backends/batching.py `unpack_batch`; `batch_as_lists` gives back the lists). `columns`: those three
    made already, for these samples in this order (`packed_columns` of each group, `join_columns`)."""
    roles = [r if isinstance(r := (s.metadata or {}).get("role"), str) else "" for s in samples]
    if packed:
        made = columns if columns is not None else packed_columns(samples)
        tokens, masks, rollout_log_probs = made["tokens"], made["loss_masks"], made["rollout_log_probs"]
    else:
        tokens = [s.tokens for s in samples]
        masks = [s.loss_mask for s in samples]
        rollout_log_probs = [s.rollout_log_probs for s in samples]
    return ({"roles": roles} if any(roles) else {}) | {
        "sample_index": [s.index for s in samples],
        "group_index": [s.group_index for s in samples],
        "tokens": tokens,
        "prompt_lengths": [len(s.prompt_tokens) for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "loss_masks": masks,
        "rollout_log_probs": rollout_log_probs,
        "rewards": [float(s.reward if s.reward is not None else 0.0) for s in samples],
        "weight_versions": [s.weight_version for s in samples],
    }


def packed_columns(samples: list[Sample]) -> dict:
    """The batch's per-token columns of `samples`, packed (`pack_rows`): what batch_from_samples(packed=True) holds
    under PACKED_KEYS. The buffer makes them for each group as it is handed in, while it waits for the rest of the
    rollout, and joins them at its end (`join_columns`): a shard of 128 samples of 300 tokens took 2 ms to pack on the
    2-vCPU VM, after the rollout was complete, while the trainer waited for it."""
    return {"tokens": pack_rows([s.tokens for s in samples], "int", "tokens"),
            "loss_masks": pack_rows([s.loss_mask for s in samples], "mask", "loss_masks"),
            "rollout_log_probs": pack_rows([s.rollout_log_probs for s in samples], "float32", "rollout_log_probs")}


def join_columns(parts: list[dict]) -> dict | None:
    """`packed_columns` of consecutive runs of samples, as one: the same bytes packing them all at once gives -- or
    None where a column's parts differ in dtype (one group's token ids need int64, another's fit int32; a mask that
    is not 0/1 in one): the caller packs the whole then."""
    if not parts:
        return None
    out = {}
    for key in PACKED_KEYS:
        cols = [p[key] for p in parts]
        dtype = cols[0]["dtype"]
        if any(c["dtype"] != dtype for c in cols):
            return None
        out[key] = {"dtype": dtype, "lengths": [n for c in cols for n in c["lengths"]],
                    "data": b"".join(c["data"] for c in cols)}
    return out


PACKED_KEYS = ("tokens", "loss_masks", "rollout_log_probs")   # the batch's per-token columns
# A packed column: {"dtype": one of these, "lengths": [per row], "data": the rows' values, flat, little-endian}.
# The trainer takes loss masks and rollout log-probs as float32 tensors whichever way they come (rl_update._prepare),
# so float32 here loses nothing it uses; token ids are int32 unless one does not fit, masks uint8 while every entry
# is an integer 0..255.
PACKED_DTYPES = ("uint8", "int32", "int64", "float32")


def pack_rows(rows: list, kind: str, name: str = "column") -> dict:
    """Per-sample rows of numbers as one packed column; `kind` "int" (token ids), "mask" or "float32". One pass in C
    over all the rows chained (numpy's fromiter; a mask's rows as bytes), not an array built per row: 0.20 ms for
    128 rows of 110 token ids against 0.23 on the 2-vCPU VM. A row that is not numbers is a ValueError naming it."""
    import itertools

    import numpy as np
    lengths = [len(r) for r in rows]
    n = sum(lengths)
    if kind == "mask":
        try:
            return {"dtype": "uint8", "lengths": lengths, "data": b"".join(map(bytes, rows))}  # (integers 0..255)
        except (TypeError, ValueError):
            kind = "float32"
    if kind not in ("int", "float32"):
        raise ValueError(f"pack_rows: kind must be 'int', 'mask' or 'float32', got {kind!r}")
    try:
        flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64 if kind == "int" else np.float32,
                           count=n)
    except (TypeError, ValueError, OverflowError):
        for i, r in enumerate(rows):
            try:
                np.array(r, dtype=np.int64 if kind == "int" else np.float32)
            except (TypeError, ValueError, OverflowError) as exc:
                raise ValueError(f"{name}: row {i} is not a list of {'integers' if kind == 'int' else 'numbers'} "
                                 f"({exc})") from None
        raise
    if kind == "float32" and np.isnan(flat).any():   # numpy makes None a NaN (an engine's missing log-prob is NaN)
        for i, r in enumerate(rows):
            if None in r:
                raise ValueError(f"{name}: row {i} is not a list of numbers (it holds None)")
    if kind == "int" and (not n or (int(flat.min()) >= -2**31 and int(flat.max()) < 2**31)):
        flat = flat.astype(np.int32)
    if sys.byteorder != "little":
        flat = flat.astype(flat.dtype.newbyteorder("<"))
    return {"dtype": flat.dtype.name, "lengths": lengths, "data": flat.tobytes()}


def unpack_rows(column: Any, name: str = "column"):
    """(flat numpy array, lengths) of a packed column, checked: a ValueError naming `name` and what is wrong (its
    dtype, a length, the size of its data) -- the column came over the wire."""
    import numpy as np
    if not isinstance(column, dict) or set(column) != {"dtype", "lengths", "data"}:
        raise ValueError(f"{name}: a packed column is a map of dtype, lengths and data, got "
                         f"{sorted(column) if isinstance(column, dict) else type(column).__name__}")
    dtype, lengths, data = column["dtype"], column["lengths"], column["data"]
    if dtype not in PACKED_DTYPES:
        raise ValueError(f"{name}: dtype {dtype!r} is not one of {', '.join(PACKED_DTYPES)}")
    if not isinstance(lengths, list) or not all(type(x) is int and x >= 0 for x in lengths):
        raise ValueError(f"{name}: lengths must be a list of non-negative integers")
    if not isinstance(data, (bytes, bytearray)):
        raise ValueError(f"{name}: data must be bytes, got {type(data).__name__}")
    dt = np.dtype(dtype).newbyteorder("<")
    if len(data) != sum(lengths) * dt.itemsize:
        raise ValueError(f"{name}: data holds {len(data)} bytes; {sum(lengths)} {dtype} values need "
                         f"{sum(lengths) * dt.itemsize}")
    return np.frombuffer(data, dtype=dt), lengths


def unpack_lists(column: Any, name: str = "column") -> list[list]:
    """A packed column's rows as Python lists (`unpack_rows`, checked the same way)."""
    flat, lengths = unpack_rows(column, name)
    values, rows, at = flat.tolist(), [], 0
    for n in lengths:
        rows.append(values[at:at + n])
        at += n
    return rows


def batch_as_lists(batch: dict) -> dict:
    """A batch with its packed columns (if any) as a list per sample -- the trainer's batch as a trace recorded it,
    read the way it read before it came packed (tokens as ints; loss masks and log-probs as float32 values)."""
    return {k: unpack_lists(v, f"batch[{k!r}]") if k in PACKED_KEYS and isinstance(v, dict) else v
            for k, v in batch.items()}

