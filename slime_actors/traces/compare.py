"""Comparing message bodies: what counts as the same (used by `trace diff` and `replay`).

Bodies are compared after decoding, field by field. Floats agree within a tolerance (|a-b| <= atol + rtol*|b|),
arrays recorded by checksum agree when dtype, shape and checksum do, and fields that measure the machine rather than
the computation (wall-clock durations, process ids, host names, ports) are left out: which ones depends on the use
(`VOLATILE_DIFF` for two runs, `volatile_for_replay(role)` for a replay).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Fields that differ between two runs of one config however deterministic the computation: timings, process and
# host identity, free ports, wall-clock stamps.
# An entry ending in "/" leaves out every key that starts with it ("time/": the trainer's timings).
VOLATILE_DIFF = frozenset(("ts", "time", "seconds", "pid", "host", "uptime", "endpoint", "url", "started",
                           "finished", "deadline", "dur_ns", "train_time", "master_port", "master_address",
                           "traceback", "trace_records", "restarts", "port", "addr", "master_addr", "group_name",
                           "token", "time/",
                           # what the timing of a run decides: how many requests were still running when a rollout
                           # had its groups (end_rollout aborts them and hands their groups back)
                           "aborted", "returned"))

# A replay reproduces the computation and the recorded clocks, so fewer fields are left out; what remains measures
# real elapsed time the recording did not keep (the trainer's timings) or the machine the replay runs on.
_REPLAY_ALL = frozenset(("pid", "host", "uptime", "endpoint", "traceback"))
_REPLAY_ROLE = {
    # the training group's rendezvous (a free port, this process's pid in the weight group's name)
    "trainer": frozenset(("train_time", "seconds", "master_port", "master_address", "master_addr", "port", "addr",
                          "group_name", "time/")),
    "controller": frozenset(("seconds", "time", "time/")),
}


def volatile_for_replay(role: str) -> frozenset:
    return _REPLAY_ALL | _REPLAY_ROLE.get(role, frozenset())


@dataclass
class Difference:
    path: str          # e.g. "rewards[3]", "samples[0].response", "" for the whole body
    a: Any             # recorded / run A
    b: Any             # replayed / run B

    def __str__(self) -> str:
        where = f"field {self.path}" if self.path else "body"
        return f"{where}: {short(self.a)} vs {short(self.b)}"


def short(v: Any, n: int = 160) -> str:
    from .query import render_value
    return render_value(v, n)


def first_difference(a: Any, b: Any, *, rtol: float = 1e-6, atol: float = 1e-9,
                     volatile: frozenset = VOLATILE_DIFF, path: str = "") -> Difference | None:
    """The first place (depth first, keys in a's order) where `a` and `b` differ, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        if _is_array(a) or _is_array(b):
            return _array_diff(a, b, path)
        rows_a, rows_b = _packed_rows(a), _packed_rows(b)
        if rows_a is not None and rows_b is not None:   # (a packed batch column: compared row by row, as lists)
            return first_difference(rows_a, rows_b, rtol=rtol, atol=atol, volatile=volatile, path=path)
        for k in a:
            if _skip(k, volatile):
                continue
            p = f"{path}.{k}" if path else str(k)
            if k not in b:
                return Difference(p, a[k], "<missing>")
            d = first_difference(a[k], b[k], rtol=rtol, atol=atol, volatile=volatile, path=p)
            if d is not None:
                return d
        for k in b:
            if k not in a and not _skip(k, volatile):
                return Difference(f"{path}.{k}" if path else str(k), "<missing>", b[k])
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, rtol=rtol, atol=atol, volatile=volatile,
                                 path=f"{path}[{i}]")
            if d is not None:
                return d
        if len(a) != len(b):
            return Difference(f"{path}.length" if path else "length", len(a), len(b))
        return None
    if _num(a) and _num(b):
        if isinstance(a, bool) or isinstance(b, bool) or (isinstance(a, int) and isinstance(b, int)):
            return None if a == b else Difference(path, a, b)
        fa, fb = float(a), float(b)
        if math.isnan(fa) and math.isnan(fb):
            return None
        if fa == fb or abs(fa - fb) <= atol + rtol * abs(fb):
            return None
        return Difference(path, a, b)
    if hasattr(a, "shape") or hasattr(b, "shape"):  # arrays kept in full (--trace-keep-arrays)
        return _full_array_diff(a, b, path, rtol, atol)
    if type(a) is not type(b) or a != b:
        return Difference(path, a, b)
    return None


def _packed_rows(d: dict) -> list[list] | None:
    """A packed column of the trainer's batch (types.pack_rows) as its rows, or None for any other map."""
    if set(d) != {"dtype", "lengths", "data"}:
        return None
    from ..types import unpack_lists
    try:
        return unpack_lists(d)
    except ValueError:
        return None


def _skip(k, volatile) -> bool:
    if not isinstance(k, str):
        return False
    if k in volatile:
        return True
    return any(k.startswith(p) for p in volatile if p.endswith("/"))


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) or isinstance(v, bool)


def _is_array(d: dict) -> bool:
    return "__array__" in d and "shape" in d


def _array_diff(a: dict, b: dict, path: str) -> Difference | None:
    if not (_is_array(a) and _is_array(b)):
        return Difference(path, a, b)
    for k in ("__array__", "shape", "hash"):
        if k == "hash" and a.get(k) and b.get(k) and len(a[k]) != len(b[k]):
            continue  # checksums of two algorithms (a CRC-32 recording against an XXH3 one): not comparable
        if a.get(k) != b.get(k):
            return Difference(f"{path}.{'dtype' if k == '__array__' else k}" if path else k, a.get(k), b.get(k))
    return None


def _full_array_diff(a, b, path, rtol, atol) -> Difference | None:
    import numpy as np
    try:
        x, y = np.asarray(a), np.asarray(b)
    except Exception:
        return Difference(path, a, b)
    if x.shape != y.shape or x.dtype != y.dtype:
        return Difference(path + ".shape", f"{x.dtype}{list(x.shape)}", f"{y.dtype}{list(y.shape)}")
    if x.dtype.kind in "fc":
        bad = ~np.isclose(x, y, rtol=rtol, atol=atol, equal_nan=True)
    else:
        bad = x != y
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        return Difference(f"{path}{list(i)}", x[i].item(), y[i].item())
    return None


# ---------------------------------------------------------------------------------------------- float vs logic
FLOAT, FLOAT_ARRAY, LOGIC = "float", "float-array", "logic"


@dataclass
class LeafDifference:
    """One place where two bodies differ at all (no tolerance): `kind` FLOAT (two numbers, one of them a float),
    FLOAT_ARRAY (a float array: its values, or -- recorded by checksum -- only its checksum), or LOGIC (anything
    else: an int, a string, a shape, a key or a list element that is there on one side only)."""

    path: str
    a: Any
    b: Any
    kind: str
    rel: float | None = None   # FLOAT / a float array kept in full: the largest |a-b| / max(|a|, |b|)
    abs: float | None = None   # ... and the largest |a-b|

    def within(self, rtol: float, atol: float) -> bool:
        """Within |a-b| <= atol + rtol*|b| (a float array recorded by checksum only: not known to be)."""
        if self.kind == FLOAT:
            return _close(float(self.a), float(self.b), rtol, atol)
        if self.kind == FLOAT_ARRAY and self.abs is not None:
            return self.within_arrays(rtol, atol)
        return False

    def within_arrays(self, rtol: float, atol: float) -> bool:
        import numpy as np
        return bool(np.allclose(np.asarray(self.a), np.asarray(self.b), rtol=rtol, atol=atol, equal_nan=True))


def _close(fa: float, fb: float, rtol: float, atol: float) -> bool:
    if math.isnan(fa) and math.isnan(fb):
        return True
    return fa == fb or abs(fa - fb) <= atol + rtol * abs(fb)


def _rel(fa: float, fb: float) -> float:
    if math.isnan(fa) or math.isnan(fb) or math.isinf(fa) or math.isinf(fb):
        return math.inf
    d = abs(fa - fb)
    return d / max(abs(fa), abs(fb)) if d else 0.0


def leaf_differences(a: Any, b: Any, *, volatile: frozenset = VOLATILE_DIFF, path: str = "",
                     limit: int = 10_000) -> list[LeafDifference]:
    """Every place (depth first, keys in a's order; at most `limit`) where `a` and `b` are not bit-identical."""
    out: list[LeafDifference] = []
    _leaves(a, b, volatile, path, out, limit)
    return out


def _leaves(a, b, volatile, path, out, limit) -> None:
    if len(out) >= limit:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        if _is_array(a) or _is_array(b):
            d = _array_diff(a, b, path)
            if d is not None:
                same_form = _is_array(a) and _is_array(b) and a.get("__array__") == b.get("__array__") and \
                    a.get("shape") == b.get("shape")
                kind = FLOAT_ARRAY if same_form and _float_dtype(a.get("__array__")) else LOGIC
                out.append(LeafDifference(d.path, d.a, d.b, kind))
            return
        for k in a:
            if _skip(k, volatile):
                continue
            p = f"{path}.{k}" if path else str(k)
            if k not in b:
                out.append(LeafDifference(p, a[k], "<missing>", LOGIC))
            else:
                _leaves(a[k], b[k], volatile, p, out, limit)
        for k in b:
            if k not in a and not _skip(k, volatile):
                out.append(LeafDifference(f"{path}.{k}" if path else str(k), "<missing>", b[k], LOGIC))
        return
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b)):
            _leaves(x, y, volatile, f"{path}[{i}]", out, limit)
        if len(a) != len(b):
            out.append(LeafDifference(f"{path}.length" if path else "length", len(a), len(b), LOGIC))
        return
    if _num(a) and _num(b) and not isinstance(a, bool) and not isinstance(b, bool) and \
            (isinstance(a, float) or isinstance(b, float)):
        fa, fb = float(a), float(b)
        if fa == fb or (math.isnan(fa) and math.isnan(fb)):
            return
        out.append(LeafDifference(path, a, b, FLOAT, _rel(fa, fb), abs(fa - fb)))
        return
    if hasattr(a, "shape") or hasattr(b, "shape"):  # arrays kept in full (--trace-keep-arrays)
        _full_array_leaves(a, b, path, out)
        return
    if type(a) is not type(b) or a != b:
        out.append(LeafDifference(path, a, b, LOGIC))


def _float_dtype(dtype) -> bool:
    s = str(dtype or "")
    return "float" in s or s in ("f2", "f4", "f8", "<f2", "<f4", "<f8", "bf16", "half", "double")


def _full_array_leaves(a, b, path, out) -> None:
    import numpy as np
    try:
        x, y = np.asarray(a), np.asarray(b)
    except Exception:
        out.append(LeafDifference(path, a, b, LOGIC))
        return
    if x.shape != y.shape or x.dtype != y.dtype:
        out.append(LeafDifference(path + ".shape", f"{x.dtype}{list(x.shape)}", f"{y.dtype}{list(y.shape)}", LOGIC))
        return
    if x.dtype.kind in "fc":
        xf, yf = x.astype(np.float64), y.astype(np.float64)
        same = (xf == yf) | (np.isnan(xf) & np.isnan(yf))
        if same.all():
            return
        d = np.abs(xf - yf)
        scale = np.maximum(np.abs(xf), np.abs(yf))
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(same, 0.0, np.where(scale > 0, d / scale, np.inf))
        out.append(LeafDifference(path, x, y, FLOAT_ARRAY, float(np.nanmax(rel)), float(np.nanmax(np.where(same, 0, d)))))
        return
    bad = x != y
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        out.append(LeafDifference(f"{path}{list(i)}", x[i].item(), y[i].item(), LOGIC))
