"""Which class plays which role. Custom roles can be added with `register_role("name", "pkg.mod:Class")`."""

from __future__ import annotations

import importlib

from ..env import ACTOR_CLASS
from ..config import JobConfig

ROLES: dict[str, str] = {
    "directory": "slime_actors.actors.directory:Directory",
    "controller": "slime_actors.actors.controller:Controller",
    "buffer": "slime_actors.actors.buffer:Buffer",
    "rollout": "slime_actors.actors.rollout:RolloutWorker",
    "reward": "slime_actors.actors.reward:RewardWorker",
    "trainer": "slime_actors.actors.trainer:TrainerRank",
    "retriever": "slime_actors.actors.retriever:Retriever",
}


def register_role(role: str, target: str) -> None:
    ROLES[role] = target


def actor_class(role: str):
    """The class for a role name, or for "pkg.mod:Class" / "pkg.mod.Class" / "path/to/file.py:Class"."""
    target = ROLES.get(role)
    if target is None:
        if ":" not in role and "." not in role:
            raise KeyError(f"unknown role {role!r} (roles: {', '.join(sorted(ROLES))}; or give pkg.mod:Class)")
        from ..plugins import load_function
        cls = load_function(role, flag="actor class")
    else:
        mod, _, name = target.partition(":")
        cls = getattr(importlib.import_module(mod), name)
    from ..actors.base import Actor
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise TypeError(f"{role!r} is not an Actor subclass")
    return cls


def class_for(role: str, override: str | None = None):
    """The class that plays `role` in this process: `override` (a job flag's or the topology's pkg.mod:Class), else
    the built-in one. An override must play that role (its `role` attribute), or its actors would register under
    another name."""
    cls = actor_class(override or role)
    if override and cls.role != role:
        raise TypeError(f"{override} plays role {cls.role!r} (its `role` attribute), not {role!r}: set "
                        f"`role = {role!r}` on the class or use it for role {cls.role!r}")
    return cls


def job_class_for(role: str, cfg: JobConfig | None):
    """The class that plays `role` in a job: the job's own for it (--reward-actor-class), else the topology's
    (`class`, which the placement hands over as SLIME_ACTORS_ACTOR_CLASS), else the built-in one."""
    own = cfg.reward.reward_actor_class if cfg is not None and role == "reward" else None
    return class_for(role, own or ACTOR_CLASS.get())
