"""The controller's start-up breakdown: where the time to the first step went (slime_actors/startup_timeline.py), printed once
the first step of this run has ended and written to RUN_DIR/startup.json.

    with ctl.startup.phase("first weight sync"): ...     # the controller's own steps, until the first step ends
    ctl.startup.first_step_done()                         # after step one's weight update: print and write

The head's phases (config, run directory, model) are this process's; each actor's come from its start-up report.
A resumed or restarted run reports from its own launch as well.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .actor import Controller


class StartupReport:
    def __init__(self, ctl: Controller):
        self.ctl = ctl
        self.steps: list[list] = []
        self.done = False

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.time()
        try:
            yield
        finally:
            if not self.done:
                self.steps.append([name, t0, time.time()])

    def first_step_done(self) -> dict | None:
        """Print the breakdown and write RUN_DIR/startup.json (once; never raises: it is a report)."""
        if self.done:
            return None
        self.done = True
        if self.ctl.replaying:   # (a replay writes nothing into the recorded run)
            return None
        from ... import startup_timeline as timeline
        from ...log import console_write
        try:
            out = timeline.breakdown(self.ctl.runtime.run_dir, timeline.snapshot(), self.steps, time.time())
            Path(self.ctl.runtime.run_dir, "startup.json").write_text(json.dumps(out, indent=1))
            console_write("\n".join(timeline.format_breakdown(out)))
            self.ctl.log.info("start-up", seconds=out["total_s"])
            return out
        except Exception as exc:  # (a report: the run goes on without it)
            self.ctl.log.warning("start-up breakdown not written", error=repr(exc))
            return None
