"""The controller: the step schedule, evaluation, weight-sync cadence and checkpoints.

Synchronous mode, one step k:
    buffer.start_rollout(k) -> rollout workers resume -> buffer.wait_rollout(k) -> workers end_rollout (abort the
    rest, return it) -> every trainer rank train(k) -> buffer.mark_trained(k) -> trainer/0 sync_weights(v+1)
One-step-off asynchronous mode (--async-train): rollout k+1 is started as soon as rollout k is complete and is
generated while the trainers train on k; samples are at most --max-staleness weight versions old (the buffer
regenerates older ones). Engines are paused for the weight update only.

It also re-syncs an engine that (re)starts at an old weight version before that engine serves again, evaluates
every --eval-interval steps, saves checkpoints every --save-interval steps, and writes metrics (JSONL, TensorBoard,
a PNG of the reward and eval curves).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from pathlib import Path

from ..mailbox.errors import MailboxError
from .base import Actor, handler
from .trainer import latest_checkpoint, read_meta


class Controller(Actor):
    role = "controller"

    def __init__(self, index: int = 0, **config):
        super().__init__(index, **config)
        self.args = argparse.Namespace(**config["args"])
        a = self.args
        self.rollouts = [f"rollout/{i}" for i in range(a.rollout_num_engines)]
        n_ranks = a.actor_num_nodes * a.actor_num_gpus_per_node
        self.trainers = [f"trainer/{i}" for i in range(n_ranks)]
        self.version = 0
        self.rollout_id = 0
        self.phase = "starting"
        self.engine_versions: dict[str, int] = {}
        self.history: list[dict] = []
        self.evals: list[dict] = []
        self.done: asyncio.Future | None = None
        self._sync_lock: asyncio.Lock | None = None
        self._resync_tasks: dict[str, asyncio.Task] = {}
        self.metrics_file = None
        self.tb = None
        self.result: dict = {}

    async def on_start(self) -> None:
        self.done = asyncio.get_running_loop().create_future()
        self._sync_lock = asyncio.Lock()
        self.metrics_path = Path(self.runtime.run_dir) / "metrics.jsonl"
        self.spawn(self._run(), name="loop")

    # ------------------------------------------------------------------------------------------ messages
    @handler
    async def engine_ready(self, worker: str, weight_version: int) -> None:
        """An engine (re)started: bring it to the current weights, then let it work if a rollout is running."""
        self.engine_versions[worker] = weight_version
        if self.phase == "starting":
            return  # the start-up sync covers it
        prev = self._resync_tasks.get(worker)
        if prev is not None and not prev.done():
            prev.cancel()
        self._resync_tasks[worker] = self.spawn(self._resync(worker), name=f"resync:{worker}")

    async def _resync(self, worker: str) -> None:
        async with self._sync_lock:
            if self.engine_versions.get(worker) != self.version:
                self.log.info("re-syncing a restarted engine", worker=worker, to_version=self.version)
                await self.ask("trainer/0", "sync_weights", {"weight_version": self.version, "workers": [worker]},
                               timeout=1800)
                self.engine_versions[worker] = self.version
        if self.phase in ("rollout", "eval"):
            await self.tell(worker, "resume", {"weight_version": self.version})

    @handler
    def status(self) -> dict:
        return {"phase": self.phase, "rollout_id": self.rollout_id, "weight_version": self.version,
                "engines": self.engine_versions, "last": self.history[-1] if self.history else None}

    # ------------------------------------------------------------------------------------------ the loop
    async def _run(self) -> None:
        try:
            await self._loop()
            self.done.set_result(self.result)
        except Exception as exc:
            self.log.error("training loop failed", error=repr(exc))
            if not self.done.done():
                self.done.set_exception(exc)

    async def _wait_for(self, names: list[str], timeout: float = 900.0) -> None:
        t0 = time.monotonic()
        while True:
            listing = await self.ask("directory/0", "list", timeout=30)
            missing = [n for n in names if not listing.get(n, {}).get("alive")]
            if not missing:
                return
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"actors did not come up within {timeout:.0f}s: {', '.join(missing)}")
            await asyncio.sleep(0.2)

    async def _loop(self) -> None:
        a = self.args
        need = ["buffer/0"] + self.trainers
        if not a.debug_train_only:
            need += self.rollouts + [f"reward/{i}" for i in range(a.num_reward_workers)]
        self.log.info("waiting for actors", actors=len(need))
        await self._wait_for(need)
        start = a.start_rollout_id or 0
        ckpt = latest_checkpoint(a.load) if a.load else None
        if ckpt is not None:
            meta = read_meta(ckpt)
            start, self.version = meta["next_rollout_id"], meta["weight_version"]
            random.setstate(_tuple_state(meta["controller_rng"]))
            self.evals = meta.get("evals", [])
            self.log.info("resuming", checkpoint=str(ckpt), next_rollout=start, weight_version=self.version)
        if not a.debug_train_only:
            await self._startup_sync()
        self._open_metrics(resume=ckpt is not None)
        if a.eval_prompt_data and not a.skip_eval_before_train and not a.debug_train_only and ckpt is None:
            await self._evaluate(start)
        progress = _progress(a, start)
        pending_rollout: asyncio.Task | None = None
        for k in range(start, a.num_rollout):
            self.rollout_id = k
            t_step = time.monotonic()
            step: dict = {"rollout_id": k, "weight_version": self.version}
            # ---- rollout
            if a.load_debug_rollout_data:
                stats = await self._load_debug_rollout(k)
                t_roll = 0.0
            elif a.async_train and pending_rollout is not None:
                stats, t_roll = await pending_rollout
            else:
                stats, t_roll = await self._rollout(k)
            step.update({f"rollout/{key}": v for key, v in stats.items() if isinstance(v, (int, float))
                         and not isinstance(v, bool)})
            step["time/rollout"] = t_roll
            if a.save_debug_rollout_data:
                await self._save_debug_rollout(k)
            if a.debug_rollout_only:
                await self.ask("buffer/0", "mark_trained", {"rollout_id": k})
            else:
                if a.async_train and k + 1 < a.num_rollout and not a.load_debug_rollout_data:
                    pending_rollout = asyncio.ensure_future(self._rollout(k + 1, resume_only=True))
                elif not a.load_debug_rollout_data:
                    await self._end_rollout(k)
                # ---- train
                self.phase = "train"
                t0 = time.monotonic()
                results = await asyncio.gather(*(self.ask(t, "train", {"rollout_id": k}, timeout=3600)
                                                 for t in self.trainers))
                step["time/train"] = time.monotonic() - t0
                step.update({f"train/{key}": v for key, v in results[0].items()})
                await self.ask("buffer/0", "mark_trained", {"rollout_id": k})
                # ---- weights
                self.version += 1
                if not a.debug_train_only:
                    t0 = time.monotonic()
                    info = await self._sync_all()
                    step["time/weight_sync"] = time.monotonic() - t0
                    step["weight_sync/bytes"] = info.get("bytes", 0)
            step["weight_version_after"] = self.version
            # ---- eval and checkpoint
            if a.eval_interval and (k + 1) % a.eval_interval == 0 and a.eval_prompt_data \
                    and not a.debug_train_only:
                if pending_rollout is not None:
                    await self._pause_all()
                t0 = time.monotonic()
                ev = await self._evaluate(k + 1)
                step["time/eval"] = time.monotonic() - t0
                step.update({f"eval/{name}": r for name, r in ev.items()})
                if pending_rollout is not None:
                    await self._resume_all()
            if a.save and a.save_interval and ((k + 1) % a.save_interval == 0 or k + 1 == a.num_rollout):
                step["time/save"] = await self._save(k)
            step["time/step"] = time.monotonic() - t_step
            self._record(step)
            progress(step)
        if pending_rollout is not None:
            pending_rollout.cancel()
        if a.eval_prompt_data and not a.debug_train_only and not (
                a.eval_interval and a.num_rollout % a.eval_interval == 0) and a.num_rollout > start:
            await self._evaluate(a.num_rollout)
        self.phase = "done"
        self._finish()

    # ------------------------------------------------------------------------------------------ phases
    async def _startup_sync(self) -> None:
        """Wait for every engine, and bring them to the current weights (a resumed run starts at version > 0)."""
        t0 = time.monotonic()
        while len(self.engine_versions) < len(self.rollouts):
            if time.monotonic() - t0 > 900:
                raise TimeoutError("engines did not report ready within 900 s: "
                                   f"{sorted(set(self.rollouts) - set(self.engine_versions))}")
            await asyncio.sleep(0.05)
        self.phase = "sync"
        behind = [w for w in self.rollouts if self.engine_versions.get(w) != self.version]
        if behind:
            async with self._sync_lock:
                await self.ask("trainer/0", "sync_weights", {"weight_version": self.version, "workers": behind},
                               timeout=1800)
                for w in behind:
                    self.engine_versions[w] = self.version
        self.phase = "idle"

    async def _rollout(self, k: int, resume_only: bool = False) -> tuple[dict, float]:
        t0 = time.monotonic()
        self.phase = "rollout" if not resume_only else self.phase
        await self.ask("buffer/0", "start_rollout", {"rollout_id": k, "weight_version": self.version}, timeout=300)
        await self._resume_all()
        stats = await self.ask("buffer/0", "wait_rollout", {"rollout_id": k, "timeout": 86400.0}, timeout=86500)
        if not stats["complete"]:
            raise RuntimeError(f"rollout {k} did not complete: {stats}")
        return stats, time.monotonic() - t0

    async def _resume_all(self) -> None:
        for w in self.rollouts:
            if self.engine_versions.get(w) == self.version:
                await self.tell(w, "resume", {"weight_version": self.version})

    async def _pause_all(self) -> None:
        await asyncio.gather(*(self._quiet(self.ask(w, "pause", {}, timeout=60)) for w in self.rollouts))

    async def _end_rollout(self, k: int) -> None:
        await asyncio.gather(*(self._quiet(self.ask(w, "end_rollout", {"rollout_id": k}, timeout=120))
                               for w in self.rollouts))

    async def _sync_all(self) -> dict:
        async with self._sync_lock:
            ready = [w for w in self.rollouts if w in self.engine_versions]
            if self.args.async_train:
                await self._pause_all()
            info = await self.ask("trainer/0", "sync_weights", {"weight_version": self.version, "workers": ready},
                                  timeout=1800)
            for w in ready:
                self.engine_versions[w] = self.version
            if self.args.async_train:
                await self._resume_all()
            return info

    async def _evaluate(self, step: int) -> dict[str, float]:
        from ..data import parse_eval_prompt_data
        prev = self.phase
        self.phase = "eval"
        out = {}
        for name, _ in parse_eval_prompt_data(self.args.eval_prompt_data):
            eid = step * 1000 + len(self.evals)
            await self.ask("buffer/0", "start_rollout", {"rollout_id": eid, "kind": "eval", "name": name,
                                                         "weight_version": self.version}, timeout=300)
            await self._resume_all()
            st = await self.ask("buffer/0", "wait_rollout", {"rollout_id": eid, "kind": "eval",
                                                             "timeout": 86400.0}, timeout=86500)
            out[name] = st["reward_mean"] if st["reward_mean"] is not None else 0.0
            self.evals.append({"step": step, "name": name, "reward": out[name], "samples": st["samples"]})
            self.log.info("eval", step=step, set=name, reward=round(out[name], 4), samples=st["samples"])
        if prev != "rollout":
            await self._pause_all()
        self.phase = prev
        return out

    async def _save(self, k: int) -> float:
        t0 = time.monotonic()
        root = Path(self.args.save)
        path = root / f"iter_{k + 1:07d}"
        path.mkdir(parents=True, exist_ok=True)
        await asyncio.gather(*(self.ask(t, "save", {"path": str(path), "save_optim": not self.args.no_save_optim},
                                        timeout=3600) for t in self.trainers),
                             self.ask("buffer/0", "save", {"path": str(path)}, timeout=600))
        meta = {"next_rollout_id": k + 1, "weight_version": self.version, "controller_rng": random.getstate(),
                "evals": self.evals, "time": time.time()}
        (path / "meta.json").write_text(json.dumps(meta))
        (root / "latest_checkpointed_iteration.txt").write_text(str(k + 1))
        self.log.info("checkpoint saved", path=str(path))
        return time.monotonic() - t0

    async def _save_debug_rollout(self, k: int) -> None:
        import msgpack
        samples = await self.ask("buffer/0", "dump_rollout", {"rollout_id": k}, timeout=300)
        path = debug_rollout_path(self.args.save_debug_rollout_data, k)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(msgpack.packb({"rollout_id": k, "samples": samples}, use_bin_type=True))
        tmp.replace(path)  # a file that is there is complete
        self.log.info("saved rollout data", rollout_id=k, path=str(path), samples=len(samples))

    async def _load_debug_rollout(self, k: int) -> dict:
        """Rollout k from --load-debug-rollout-data (what --save-debug-rollout-data wrote): no engine involved."""
        import msgpack
        path = debug_rollout_path(self.args.load_debug_rollout_data, k)
        if not path.exists():
            raise FileNotFoundError(f"--load-debug-rollout-data: no saved rollout {k} at {path} (it is written by "
                                    "--save-debug-rollout-data, one file per rollout id)")
        try:
            data = msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)
            samples = data["samples"]
            if not isinstance(samples, list) or not samples:
                raise ValueError("no samples in it")
        except Exception as exc:
            raise ValueError(f"--load-debug-rollout-data: {path} is not a saved rollout ({type(exc).__name__}: "
                             f"{exc}); expected what --save-debug-rollout-data writes") from None
        await self.ask("buffer/0", "load_rollout", {"rollout_id": k, "samples": samples}, timeout=300)
        return await self.ask("buffer/0", "wait_rollout", {"rollout_id": k, "timeout": 60.0}, timeout=90)

    @staticmethod
    async def _quiet(coro):
        try:
            return await coro
        except MailboxError:
            return None

    # ------------------------------------------------------------------------------------------ metrics
    def _open_metrics(self, resume: bool) -> None:
        self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        self.metrics_file = open(self.metrics_path, "a" if resume else "w")
        if self.args.use_tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self.tb = SummaryWriter(os.path.join(self.runtime.run_dir, "tensorboard"))
            except Exception as exc:  # tensorboard missing: JSONL and the PNG still have everything
                self.log.warning("tensorboard unavailable", error=repr(exc))

    def _record(self, step: dict) -> None:
        step["time"] = time.time()
        self.history.append(step)
        self.metrics_file.write(json.dumps(step) + "\n")
        self.metrics_file.flush()
        if self.tb is not None:
            for key, v in step.items():
                if isinstance(v, (int, float)) and key != "rollout_id":
                    self.tb.add_scalar(key, v, step["rollout_id"])
            self.tb.flush()
        self.log.info("step", rollout_id=step["rollout_id"], reward=_r(step.get("rollout/reward_mean")),
                      loss=_r(step.get("train/loss")), logprob_diff=_r(step.get("train/train_rollout_logprob_abs_diff_max")),
                      seconds=_r(step.get("time/step")), version=step.get("weight_version_after"))

    def _finish(self) -> None:
        from ..plots import plot_run
        if self.metrics_file is not None:
            self.metrics_file.close()
        if self.tb is not None:
            self.tb.close()
        png = plot_run(self.runtime.run_dir, self.history, self.evals)
        first = {e["name"]: e["reward"] for e in self.evals if e["step"] == min(x["step"] for x in self.evals)} \
            if self.evals else {}
        last = {e["name"]: e["reward"] for e in self.evals if e["step"] == max(x["step"] for x in self.evals)} \
            if self.evals else {}
        self.result = {"steps": len(self.history), "eval_before": first, "eval_after": last, "plot": png,
                       "weight_version": self.version, "metrics": str(self.metrics_path)}


def debug_rollout_path(spec: str, k: int) -> Path:
    """Where rollout k is saved (--save-debug-rollout-data) or loaded from (--load-debug-rollout-data):
    "dir/data_{rollout_id}.msgpack" as slime writes it, else DIR/rollout_00000K.msgpack for a directory (a path
    without a suffix), else FILE_00000K.SUFFIX."""
    if "{rollout_id}" in spec:
        return Path(spec.format(rollout_id=k))
    p = Path(spec)
    if p.is_dir() or not p.suffix:
        return p / f"rollout_{k:06d}.msgpack"
    return p.with_name(f"{p.stem}_{k:06d}{p.suffix}")


def _r(v):
    return None if v is None else round(float(v), 4)


def _tuple_state(s):
    return (s[0], tuple(s[1]), s[2])


def _progress(args, start: int):
    if not args.progress:
        return lambda step: None
    try:
        from tqdm import tqdm
    except ImportError:
        return lambda step: None
    bar = tqdm(total=args.num_rollout, initial=start, desc="rl steps", unit="step", dynamic_ncols=True)

    def update(step: dict) -> None:
        post = {"reward": _r(step.get("rollout/reward_mean"))}
        for k, v in step.items():
            if k.startswith("eval/"):
                post[k] = _r(v)
        bar.set_postfix(post)
        bar.update(1)
        if step["rollout_id"] + 1 >= args.num_rollout:
            bar.close()
    return update
