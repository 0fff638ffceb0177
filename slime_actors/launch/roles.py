"""Which class plays which role. Custom roles can be added with `register_role("name", "pkg.mod:Class")`."""

from __future__ import annotations

import importlib

ROLES: dict[str, str] = {
    "directory": "slime_actors.actors.directory:Directory",
    "controller": "slime_actors.actors.controller:Controller",
    "buffer": "slime_actors.actors.buffer:Buffer",
    "rollout": "slime_actors.actors.rollout:RolloutWorker",
    "reward": "slime_actors.actors.reward:RewardWorker",
    "trainer": "slime_actors.actors.trainer:TrainerRank",
}


def register_role(role: str, target: str) -> None:
    ROLES[role] = target


def actor_class(role: str):
    target = ROLES.get(role)
    if target is None:
        if ":" in role:
            target = role
        else:
            raise KeyError(f"unknown role {role!r} (roles: {', '.join(sorted(ROLES))}; or give module:Class)")
    mod, _, name = target.partition(":")
    try:
        return getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as exc:
        raise ImportError(f"role {role!r}: cannot load {target}: {exc}") from None
