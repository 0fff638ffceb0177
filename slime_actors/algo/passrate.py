"""pass@k of grouped rewards (--log-passrate), as slime logs it: a sample passes when its reward is 1.

    pass_at_k([[1, 0, 0, 1], [0, 0, 0, 0]])   # {"pass@1": 0.25, "pass@2": 0.4167, "pass@4": 0.5}

k runs over the powers of two up to the group size; each group's pass@k is the unbiased estimator
1 - C(n - c, k) / C(n, k) (n samples, c passing), averaged over the groups. Groups of one sample give nothing
(slime's rule: pass@1 of a single sample is the mean reward, already logged).
"""

from __future__ import annotations

from collections.abc import Sequence


def _pass_k(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    p = 1.0
    for i in range(n - c + 1, n + 1):   # prod(1 - k / i): C(n - c, k) / C(n, k)
        p *= 1.0 - k / i
    return 1.0 - p


def pass_at_k(groups: Sequence[Sequence[float | None]]) -> dict[str, float]:
    """{"pass@k": mean over the groups} for k = 1, 2, 4, ... <= the smallest group; {} for groups of one."""
    groups = [list(g) for g in groups if len(g) > 0]
    if not groups:
        return {}
    n_min = min(len(g) for g in groups)
    if n_min < 2:
        return {}
    out: dict[str, float] = {}
    k = 1
    while k <= n_min:
        vals = [_pass_k(len(g), sum(1 for r in g if r is not None and float(r) == 1.0), k) for g in groups]
        out[f"pass@{k}"] = sum(vals) / len(vals)
        k *= 2
    return out
