"""The roles: controller, buffer, rollout, reward, trainer, directory; and the Actor base class."""

from .base import DIRECTORY, Actor, handler

__all__ = ["Actor", "handler", "DIRECTORY"]
