"""Watching a run's rollouts for signs that something other than learning moves the reward (hacking.py)."""
