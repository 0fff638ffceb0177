"""The command line a bench prints in its header, as it was typed: the interpreter relative to the working directory
when it lives under it (`.venv/bin/python`), else its name (`python3`), `nice` when the process runs niced."""

from __future__ import annotations

import os
import sys


def command_line() -> str:
    exe = sys.executable
    cwd = os.getcwd()
    exe = os.path.relpath(exe) if exe.startswith(cwd + os.sep) else os.path.basename(exe)
    return ("nice " if os.nice(0) > 0 else "") + " ".join([exe] + sys.argv)
