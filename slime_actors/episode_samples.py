"""The samples of one episode: roles, extra samples, advantage groups, and the metrics logged per role and per
environment (docs/multi-agent.md).

An episode -- a generate function's call, an environment's episode, an agent's session -- trains on one sample per
prompt sample by default. It may return more: several agents' turns (a solver, a critic, a selector), or the
branches of one conversation. Each sample says which agent produced it in `metadata["role"]` (a short name;
none: the job's one policy). The samples an episode adds beyond the one the buffer issued carry
`metadata["episode_of"]`, the index of the sample the episode started from; the buffer numbers them when the group
is submitted (buffer_state.py), trains them with their group, and drops them when the group is generated again.

Advantages are normalized per (prompt group, role): the solvers' samples of a prompt against each other, the
critic's against each other (`advantage_groups`).

Metrics. An environment (or generate function) may leave numbers in `metadata["metrics"]` (searches, recall...):
their mean over a rollout is logged as rollout/env/NAME (eval/SET-NAME for an evaluation). A rollout whose samples
have roles logs, per role, rollout/role/ROLE/{samples, reward_mean, response_len_mean}.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

ROLE_KEY = "role"
EPISODE_KEY = "episode_of"
METRICS_KEY = "metrics"
MAX_ROLE_CHARS = 64


def role_of(s: Any) -> str:
    """The sample's role ("" for the job's one policy)."""
    meta = s.metadata if isinstance(s.metadata, dict) else {}
    r = meta.get(ROLE_KEY)
    return r if isinstance(r, str) else ""


def episode_of(s: Any) -> int | None:
    """The index of the sample whose episode added `s` (None: `s` is a sample the buffer issued)."""
    meta = s.metadata if isinstance(s.metadata, dict) else {}
    v = meta.get(EPISODE_KEY)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def check_role(s: Any) -> str | None:
    """What is wrong with the sample's role, or None."""
    meta = s.metadata if isinstance(s.metadata, dict) else {}
    r = meta.get(ROLE_KEY)
    if r is None:
        return None
    if not isinstance(r, str) or not r or len(r) > MAX_ROLE_CHARS or not r.replace("_", "").replace("-", "").isalnum():
        return (f"sample {s.index}: metadata['role'] must be a short name (letters, digits, - and _; at most "
                f"{MAX_ROLE_CHARS} characters), got {r!r}")
    return None


def advantage_groups(group_index: list[int], roles: list[str] | None) -> list[int]:
    """One integer per sample naming its advantage group: (prompt group, role) pairs numbered in order of first
    appearance; without roles, the prompt groups themselves."""
    if not roles or not any(roles):
        return list(group_index)
    ids: dict[tuple[int, str], int] = {}
    return [ids.setdefault((g, r), len(ids)) for g, r in zip(group_index, roles, strict=True)]


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def metric_means(samples: Iterable[Any]) -> dict[str, float]:
    """The mean of each number the samples carry in metadata["metrics"] (over the samples that carry it)."""
    vals: dict[str, list[float]] = {}
    for s in samples:
        m = s.metadata.get(METRICS_KEY) if isinstance(s.metadata, dict) else None
        if not isinstance(m, dict):
            continue
        for k, v in m.items():
            if isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) \
                    and math.isfinite(float(v)):
                vals.setdefault(k, []).append(float(v))
    return {k: _mean(v) for k, v in sorted(vals.items())}


def role_stats(samples: list[Any]) -> dict[str, float]:
    """Per role (when any sample has one): its sample count, mean reward and mean response length, as flat
    "role/ROLE/NAME" keys (the metrics row's rollout/role/ROLE/NAME columns)."""
    by: dict[str, list[Any]] = {}
    for s in samples:
        by.setdefault(role_of(s) or "policy", []).append(s)
    if set(by) == {"policy"}:
        return {}
    out: dict[str, float] = {}
    for r, ss in sorted(by.items()):
        rewards = [float(s.reward) for s in ss if s.reward is not None]
        out[f"role/{r}/samples"] = len(ss)
        if rewards:
            out[f"role/{r}/reward_mean"] = _mean(rewards)
        out[f"role/{r}/response_len_mean"] = _mean([len(s.response_tokens) for s in ss])
    return out


def episode_stats(samples: list[Any]) -> dict[str, float]:
    """What a rollout's stats add for environments and roles: env/NAME means and role/ROLE/... figures."""
    out = {f"env/{k}": v for k, v in metric_means(samples).items()}
    out.update(role_stats(samples))
    return out
