"""Environments: multi-turn tasks (tools, search, code, other agents) on one API; docs/adding-an-environment.md.

    base.py      Env, Step, ModelTurn -- what a user writes
    episode.py   Episode -- the per-sample token bookkeeping every generation path shares
    chat.py      ChatTurns -- chat turns as tokens, without re-rendering earlier turns
    runner.py    run_episode -- reset, model turn, step, observation, ... until the episode is over
    loading.py   load_env -- the class a job names (or a module of slime's interaction environments)
    harness.py   EnvHarness, ScriptedModel, LocalModel -- an environment driven without a cluster
"""

from .base import Env, EnvError, EpisodeContext, ModelTurn, Step, engine_generate
from .episode import Episode

__all__ = ["Env", "EnvError", "EpisodeContext", "Episode", "ModelTurn", "Step", "engine_generate"]
