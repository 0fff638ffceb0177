"""The debug-data modes: --save-debug-rollout-data writes every rollout's samples to a file (msgpack, one per rollout
id), --load-debug-rollout-data trains on such files instead of generating (with --debug-train-only no engine runs at
all), as slime's flags of those names do. The file names: config.debug_rollout_path.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import msgpack

from ...config import debug_rollout_path
from ...json_files import not_regular
from ...messages import RolloutStats

if TYPE_CHECKING:
    from .actor import Controller


class DebugData:
    def __init__(self, ctl: Controller):
        self.ctl = ctl
        self.cfg = ctl.cfg.debug

    async def save(self, k: int) -> None:
        """Rollout k's samples, as the buffer holds them, to --save-debug-rollout-data (packed and written in a
        thread: the loop runs the step meanwhile)."""
        spec = self.cfg.save_debug_rollout_data
        if not spec:
            raise RuntimeError("--save-debug-rollout-data is not given")
        samples = await self.ctl.buffer.dump_rollout(k)
        path = debug_rollout_path(spec, k)
        await self.ctl.run_blocking(_write, path, {"rollout_id": k, "samples": samples})
        self.ctl.log.info("saved rollout data", rollout_id=k, path=str(path), samples=len(samples))

    async def load(self, k: int) -> tuple[RolloutStats, float]:
        """Rollout k from --load-debug-rollout-data (what --save-debug-rollout-data wrote), handed to the buffer as
        a complete rollout: its statistics, and 0 seconds of generation (no engine involved)."""
        spec = self.cfg.load_debug_rollout_data
        if not spec:
            raise RuntimeError("--load-debug-rollout-data is not given")
        path = debug_rollout_path(spec, k)
        what = not_regular(path)
        if what == "no such file":
            raise FileNotFoundError(f"--load-debug-rollout-data: no saved rollout {k} at {path} (it is written by "
                                    "--save-debug-rollout-data, one file per rollout id)")
        if what is not None:   # (a FIFO would block the controller)
            raise ValueError(f"--load-debug-rollout-data: {path} is {what}, not a saved rollout")
        try:
            data = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
            samples = data["samples"]
            if not isinstance(samples, list) or not samples:
                raise ValueError("no samples in it")
        except Exception as exc:
            raise ValueError(f"--load-debug-rollout-data: {path} is not a saved rollout ({type(exc).__name__}: "
                             f"{exc}); expected what --save-debug-rollout-data writes") from None
        await self.ctl.buffer.load_rollout(k, samples)
        return await self.ctl.buffer.wait_rollout(k, timeout=60.0, hack=False, ask_timeout=90), 0.0


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(msgpack.packb(data, use_bin_type=True))
    tmp.replace(path)  # a file that is there is complete
