"""slime-actors: RL post-training on lightweight ZeroMQ actors (docs/ and README.md)."""

__version__ = "0.1.0"
