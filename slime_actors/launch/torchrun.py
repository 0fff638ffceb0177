"""Run a job under torchrun: every torchrun rank plays one role.

    torchrun --nproc-per-node 6 -m slime_actors.launch.torchrun [TOPOLOGY] --config job.toml [flags]
    torchrun --nnodes 2 --nproc-per-node 3 --rdzv-backend c10d --rdzv-endpoint HOST:29400 --max-restarts 2 \\
        -m slime_actors.launch.torchrun --config job.toml --save ckpt --save-interval 5

Ranks map to roles by RANK: rank 0 is the head (`directory/0` and `controller/0` in one process), then the buffer,
the reward workers, the rollout workers and the trainer ranks, in that order (a topology's `[torchrun] order`
changes it). WORLD_SIZE must be 1 + the number of actors; a mismatch is an error that prints the mapping.

Rendezvous: the head publishes its directory endpoint (and, with CURVE on, the job's keys -- taken from
SLIME_ACTORS_CURVE_* when the environment has them, else made for the run -- and the engines' HTTP keys) in
torchrun's TCPStore at MASTER_ADDR:MASTER_PORT; the other ranks read it there. The store has no authentication:
whoever reaches that port during the job can read them (docs/security.md). The trainer
ranks form their own process group (not every rank is a trainer): through the controller, with a separate store
that trainer rank 0 opens on a port of its own (actors/trainer.py) -- torchrun's default group is never used.

Restarts: torchrun (--max-restarts) restarts every rank of every node when one fails, so recovery here is a job
restart from the last checkpoint: the head keeps the run directory (a restart of the same --rdzv-id), the controller
resumes from the newest checkpoint under --save, and the buffer, restored from its log, rolls back to that checkpoint
(exactly-once accounting holds; see docs/fault-tolerance.md). `slime-actors launch` restarts single actors instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

from .. import gc_watch
from ..env import ADVERTISE, HOST, JOIN_TIMEOUT, RETRIEVER_KEY, RUN_DIR, TRANSPORT
from ..backends.listen import address_towards, tcp_store
from ..config import JobConfig
from ..log import get_logger
from ..retry import RetryPolicy
from ..json_files import read_small_json

EXIT_TERMINATED = 143


def role_map(topology, world_size: int) -> list[tuple[str, int]]:
    """[(role, index)] for ranks 1..; rank 0 is the head. Raises ValueError naming what does not fit."""
    order = topology.torchrun.get("order") or [r for r in ("buffer", "reward", "rollout", "trainer")
                                               if r in topology.roles]
    order = order + [r for r in topology.roles if r not in order]
    out = [("head", 0)]
    for role in order:
        out += [(role, i) for i in range(topology.roles[role].count)]
    if len(out) != world_size:
        desc = ", ".join(f"{r}x{topology.roles[r].count}" for r in order if topology.roles[r].count)
        raise ValueError(f"this job needs {len(out)} torchrun ranks (1 head + {desc}) but WORLD_SIZE is "
                         f"{world_size}: use --nnodes x --nproc-per-node = {len(out)}")
    return out


def _env_int(name: str) -> int:
    v = os.environ.get(name)
    if v is None:
        raise SystemExit(f"slime_actors.launch.torchrun: {name} is not set; run it under torchrun "
                         "(torchrun --nproc-per-node N -m slime_actors.launch.torchrun ...)")
    return int(v)


def _round(run_dir: str) -> int:
    """0 for a new job; n for its n-th restart. TORCHELASTIC_RESTART_COUNT alone does not tell: with c10d a node
    whose ranks did not fail restarts with the count unchanged, and the head may be on it. So the head also looks
    for its own head.json from an earlier round of this run id (the run directory must be shared across nodes
    for restarts anyway: the buffer's state and the checkpoints live there)."""
    count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    prev = read_small_json(Path(run_dir) / "head.json")
    if prev is not None and run_id not in (None, "", "none") and prev.get("run_id") == run_id:
        return max(count, int(prev.get("restart", 0)) + 1)
    return count


def _store(master: str, port: int, rank: int):
    import datetime

    from torch.distributed import TCPStore
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "False") == "True"
    kw = dict(wait_for_workers=False, timeout=datetime.timedelta(seconds=JOIN_TIMEOUT.get()))
    if rank == 0 and not agent:  # ours (not torchrun's agent store): its server on MASTER_ADDR alone
        return tcp_store(master, port, None, True, **kw)
    return TCPStore(master, port, is_master=False, **kw)


def main(argv: list[str] | None = None) -> int:
    from ..config import ConfigError
    from .job_config import plan_job, print_errors, print_notes
    from .topology import TopologyError, default_topology, load_topology
    argv = sys.argv[1:] if argv is None else argv
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    master, mport = os.environ.get("MASTER_ADDR", "127.0.0.1"), _env_int("MASTER_PORT")
    nnodes = world // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    topo_path = argv[0] if argv and not argv[0].startswith("-") else None
    rest = argv[1:] if topo_path else argv
    prog = "slime_actors.launch.torchrun"
    try:
        topo = load_topology(topo_path) if topo_path else None
        # every rank: its role and placement (actors get the head's config); the head (rank 0) also checks the
        # prompt files and keeps their rows for the buffer
        cfg = plan_job(rest, topo, data=rank == 0, keep_rows=rank == 0).cfg
        if topo is None:
            topo = default_topology(cfg)
        roles = role_map(topo, world)
    except ConfigError as exc:
        print_errors(exc, prog)
        return 2
    except (TopologyError, ValueError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    if rank == 0:
        print_notes(cfg, prog)
    role, index = roles[rank]
    # where this rank is reached: tcp across nodes, ipc on one node
    if nnodes > 1 or TRANSPORT.get() == "tcp" or cfg.runtime.transport == "tcp":
        cfg.runtime.transport = "tcp"
        # (bound to this node's address towards MASTER_ADDR, not every interface: peers are told that one)
        here = address_towards(master, mport)
        os.environ.setdefault(HOST.name, here)
        os.environ.setdefault(ADVERTISE.name, here)
    plan = {(p.role, p.index): p for p in topo.plan()}
    if role != "head":
        for k, v in plan[(role, index)].process_env().items():
            if k != "LOCAL_RANK":  # torchrun's LOCAL_RANK picks this rank's GPU
                os.environ[k] = v
    store = _store(master, mport, rank)
    prefix = f"slime-actors/{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}"
    os.environ[RUN_DIR.name] = str(Path(cfg.run.run_dir).resolve())  # what this rank starts inherits it
    import uvloop
    if role == "head":
        return uvloop.run(_head(cfg, topo, store, prefix, _round(cfg.run.run_dir), prog))
    code = uvloop.run(_actor(cfg, role, index, store, prefix, prog))
    # stopped: do not wait for a worker thread stuck in a collective whose peer is gone
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


async def _head(cfg: JobConfig, topo, store, prefix: str, restart: int, prog: str) -> int:
    """Rank 0: the head (launch/head.py), published in torchrun's store for the other ranks."""
    from ..log import setup_logging
    from ..runtime import RuntimeConfig
    from .head import Head, StatusBoard, report
    from .prepare import prepare_head
    fresh = restart == 0
    try:
        prepare_head(cfg, fresh)
    except (FileNotFoundError, ValueError) as exc:  # checked before anything was written
        from .checks import discard_checked
        discard_checked(cfg)
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    run_dir = Path(cfg.run.run_dir).resolve()
    setup_logging(run_dir, "controller/0")
    log = get_logger(actor="torchrun-head")
    head = Head(cfg, RuntimeConfig.for_job(cfg), fresh=True, prog=prog)
    dep = await head.open(restart=restart, run_id=os.environ.get("TORCHELASTIC_RUN_ID"))
    # what every other rank builds its actor from: the head's config (model resolved), the directory, the keys
    record = {"directory": dep, "config": cfg.to_dict(), "pid": os.getpid(), "time": time.time(),
              "restart": restart, **({"keys": head.keys.env()} if head.keys is not None else {}),
              **({"engine_keys": head.engines.env()} if head.engines is not None else {}),
              **({"retriever_key": head.retriever_key} if head.retriever_key else {})}
    store.set(f"{prefix}/head", json.dumps(record))
    # a restarted job resumes from the newest checkpoint under --save
    await head.start_controller(resume_from_save=not fresh)
    log.info("head up", directory=dep, restart=restart, world=os.environ.get("WORLD_SIZE"))
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    board = StatusBoard(run_dir, [p.name for p in topo.plan()], "changes")
    code = 0
    try:
        await head.watch(stop, board, restarts=lambda: restart)
        done = head.controller.done
        if stop.is_set():
            code = EXIT_TERMINATED   # torchrun stops the job (another rank failed): it restarts or gives up
        elif done.exception() is not None:
            print(f"{prog}: training loop failed: {done.exception()}", file=sys.stderr)
            code = 1
        else:
            result = done.result()
            result["torchrun_restarts"] = restart
            report({**result, "seconds": round(time.monotonic() - board.t0, 1)}, run_dir)
    finally:
        await head.stop_controller()
        if code == 0:  # the job is done: every rank stops and exits 0, so torchrun sees success
            names = [n for n in head.listing() if n not in ("directory/0", "controller/0")]
            for n in names:
                try:
                    await head.directory.tell(n, "_stop", {"reason": "the job ended"})
                except Exception:
                    pass
            await head.wait_gone(names, 60)
        try:
            store.delete_key(f"{prefix}/head")
        except Exception:
            pass
        await head.close()
    return code


async def _actor(cfg: JobConfig, role: str, index: int, store, prefix: str, prog: str) -> int:
    """A rank other than 0: its actor, built from the head's record in torchrun's store and run by the actor
    process bootstrap (launch/actor.py); while the head is not up (or its record is the last round's) it knocks
    again, 1 s apart, for SLIME_ACTORS_JOIN_TIMEOUT."""
    from ..mailbox.errors import MailboxError
    from ..mailbox.security import ENV_PUBLIC, ENV_SECRET
    from ..runtime import RuntimeConfig
    from .actor import serve, set_up_process
    from .roles import job_class_for
    name = f"{role}/{index}"
    loop = asyncio.get_running_loop()

    async def make():
        # the head's record (a restarted job may still show the last round's: then registering fails; read again)
        rec = json.loads(await loop.run_in_executor(None, store.get, f"{prefix}/head"))
        job = JobConfig.from_dict(rec["config"], source="the head's job config")
        if "keys" in rec:
            os.environ[ENV_PUBLIC], os.environ[ENV_SECRET] = rec["keys"][ENV_PUBLIC], rec["keys"][ENV_SECRET]
        os.environ.update(rec.get("engine_keys", {}))  # the engines' HTTP keys (what this rank starts inherits them)
        if rec.get("retriever_key"):
            os.environ[RETRIEVER_KEY.name] = rec["retriever_key"]
        rt = RuntimeConfig.for_job(cfg)   # (this rank's transport: tcp across nodes)
        rt.directory = rec["directory"]
        set_up_process(name, rt.run_dir)
        return job_class_for(role, job).for_job(index, job), rt
    join = RetryPolicy(attempts=None, deadline=JOIN_TIMEOUT.get(), base=1.0, factor=1.0, max_delay=1.0,
                       retry_on=(MailboxError,))
    try:
        sig = await serve(make, join=join, ready=lambda actor: gc_watch.settle(actor.log))
    except MailboxError as exc:
        print(f"{prog}: {name}: cannot join the head: {exc}", file=sys.stderr)
        return 3
    return EXIT_TERMINATED if sig else 0


if __name__ == "__main__":
    sys.exit(main())
