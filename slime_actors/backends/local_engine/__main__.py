"""`python -m slime_actors.backends.local_engine ...`: the local engine's command line (cli.py)."""

from .cli import main

if __name__ == "__main__":
    main()
