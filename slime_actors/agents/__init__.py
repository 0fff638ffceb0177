"""Agents written elsewhere, against a chat API (docs/agents.md).

    wire.py        OpenAI's Chat Completions and Anthropic's Messages as data: requests checked, answers, streams,
                   errors in each API's shape
    trajectory.py  an episode's calls, token in / token out, as training samples (branches, forks)

The endpoint itself is a rollout worker's (actors/rollout_agents.py), its episodes rollout_generate.py's.
"""
