"""Run a job from a topology: the head (directory, controller, this node's actors) or a node agent (another node's
actors), each supervising its own processes. `slime-actors launch` and `slime-actors train` both come here.

    slime-actors launch TOPOLOGY [--config job.toml] [flags]                 everything on this host
    slime-actors launch TOPOLOGY --node train:0 --head-port 29600 [flags]     the head of a multi-node job
    slime-actors launch TOPOLOGY --node gen:1 --join tcp://HEAD:29600 [flags] another node of it

The head hosts `directory/0` and `controller/0` in its own process: the controller is the job's schedule, so the
head is the job -- if it dies the job stops (and resumes from its last checkpoint with --load). Keeping them
together means the controller never loses its directory, and there is one process to signal, one status line,
one exit code. Every node (the head included) runs a node agent, `agent/N`, that starts its node's actors,
restarts them per policy (launch/local.py) and stops them when told or when the head is gone.

Status: RUN_DIR/head.json (directory endpoint, pid) once the head is up; RUN_DIR/status.json every second (actors,
pids, liveness, restarts, the controller's phase); a status line on the console. Ctrl-C / SIGTERM stop the job:
every actor gets SIGTERM, then SIGKILL after a grace period, engines included; nothing is left running.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..env import JOB, JOIN_TIMEOUT
from ..actors.base import Actor, handler
from ..config import JobConfig
from ..log import get_logger
from ..mailbox.errors import MailboxError
from ..retry import RetryPolicy, retry
from ..role_handles import AgentHandle
from ..runtime import RuntimeConfig, job_keys
from ..search.keys import key_env
from .head import Head, StatusBoard, engine_keys, report, retriever_key
from .local import LocalLauncher, become_subreaper
from .prepare import prepare_agent, prepare_head, write_agent_job
from .topology import Placement, Topology

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


@dataclass
class JobContext:
    cfg: JobConfig                       # the job's config (parsed, validated)
    topology: Topology
    node: tuple[str, int] | None = None  # (node group, index) this process runs; None: every node on this host
    join: str | None = None              # directory endpoint of the head (agents)
    head_port: int | None = None         # tcp port of the directory (multi-node heads)
    status: str = "auto"                 # auto | line | table | changes | off
    prog: str = "slime-actors launch"
    fresh: bool = True                   # clear the run dir's live state (False: a restarted head, torchrun)
    extra_env: dict = field(default_factory=dict)
    roles: list[str] | None = None       # only these roles' actors (Slurm: one srun step per role); None: all

    @property
    def is_head(self) -> bool:
        return self.join is None

    @property
    def multi_host(self) -> bool:
        """Part of a job over several hosts (an agent, or a head other nodes join): tcp between actors."""
        return bool(self.join or self.head_port)

    def node_number(self, group: str, index: int) -> int:
        n = 0
        for name, ng in self.topology.nodes.items():
            if name == group:
                return n + index
            n += ng.count
        raise KeyError(group)

    def placements(self) -> list[Placement]:
        plan = self.topology.plan()
        if self.roles is not None:
            plan = [p for p in plan if p.role in self.roles]
        if self.node is None:
            return plan
        group, index = self.node
        return [p for p in plan if p.node_group == group and p.node_index == index]

    def agent_index(self) -> int:
        """agent/N: N is the node's number (node groups in order); with --roles, several agents share a node:
        N = 100 x node number + 1 + the first role's position in the topology."""
        node = self.node_number(*self.node) if self.node else 0
        if not self.roles:
            return node
        return 100 * node + 1 + list(self.topology.roles).index(self.roles[0])


class NodeAgent(Actor):
    """One per node: its actor processes, their supervision, and orders from the head."""
    role = "agent"

    def __init__(self, index: int = 0, **config):
        super().__init__(index, **config)
        self.launcher: LocalLauncher | None = None
        self.stop_requested: asyncio.Event | None = None
        self.stop_reason = ""
        self.node_failures: list[str] = []

    async def on_start(self) -> None:
        self.stop_requested = asyncio.Event()

    @handler
    def processes(self) -> dict:
        return self.launcher.snapshot() if self.launcher else {}

    @handler
    def node_failed(self, node: str, reason: str) -> None:
        """Another node's agent gave up (restart intensity exceeded): the head stops the job."""
        self.node_failures.append(f"{node}: {reason}")

    @handler
    def stop_node(self, reason: str = "the job ended") -> dict:
        self.stop_reason = reason
        self.stop_requested.set()
        return {"stopping": True, "processes": len(self.launcher.procs) if self.launcher else 0}


def _status_mode(ctx: JobContext) -> str:
    if ctx.status != "auto":
        return ctx.status
    return "line" if sys.stderr.isatty() else "changes"


def _make_launcher(ctx: JobContext, env: dict, run_dir: Path) -> LocalLauncher:
    sup = ctx.topology.supervisor
    hang = sup.get("hang_kill_after")
    if hang is None:
        hang = max(10.0, 2 * ctx.cfg.runtime.heartbeat_interval * ctx.cfg.runtime.heartbeat_liveness)
    launcher = LocalLauncher(str(run_dir), env, hang_kill_after=hang)
    launcher.reap_all = become_subreaper()
    for p in ctx.placements():
        launcher.add(p.role, p.index, p.process_env(), p.policy, cpus=p.cpus)
    return launcher


def _install_signals(loop, stop: asyncio.Event, holder: dict) -> None:
    def on_signal(sig):
        if holder.get("signal") is None:
            holder["signal"] = sig
        stop.set()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)


# ---------------------------------------------------------------------------------------------------------------
# the head

async def run_head(ctx: JobContext, job_path: Path) -> tuple[int, dict | None]:
    """The head (launch/head.py) with this node's agent and its supervised actor processes."""
    cfg = ctx.cfg
    log = get_logger(actor="launcher")
    head = Head(cfg, RuntimeConfig.for_job(cfg, ctx.multi_host), fresh=ctx.fresh, prog=ctx.prog)
    # other nodes find the directory at a port they were told (SLIME_ACTORS_HOST: the address)
    endpoint = f"tcp://{head.rt.host}:{ctx.head_port}" if ctx.head_port else None
    try:
        dep = await head.open(endpoint, started=time.time())
    except ValueError as exc:  # the engine keys (checked before anything started)
        print(f"{ctx.prog}: error: {exc}", file=sys.stderr)
        return 2, None
    launcher = _make_launcher(ctx, head.env({JOB.name: str(job_path), **ctx.extra_env}), head.run_dir)
    agent = NodeAgent(ctx.agent_index())
    agent.launcher = launcher
    await agent.start(head.rt)
    await head.start_controller()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    holder: dict = {}
    _install_signals(loop, stop, holder)
    expected = [p.name for p in ctx.topology.plan()]
    board = StatusBoard(head.run_dir, expected, _status_mode(ctx), ctx.topology.supervisor.get("status_interval", 1.0))
    from .. import startup_timeline as timeline
    with timeline.phase("actors launched"):
        launcher.start_all()
    n_nodes = sum(ng.count for ng in ctx.topology.nodes.values())
    log.info("job started", directory=dep, actors=len(expected), nodes=n_nodes, here=len(launcher.procs))

    def check(listing: dict) -> str | None:
        launcher.check(listing)
        if launcher.failure:
            return f"job stopped: {launcher.failure}"
        if agent.node_failures:
            return f"job stopped: {agent.node_failures[0]}"
        return None
    result = None
    failure: str | None = None   # (set before the try: a supervisor's own error must reach the user, not a NameError)
    try:
        failure = await head.watch(stop, board, check=check, processes=launcher.snapshot,
                                   restarts=lambda: launcher.restarted_total)
        done = head.controller.done
        if done.done() and not stop.is_set():
            if done.exception() is not None:
                failure = f"training loop failed: {done.exception()}"
            else:
                result = done.result()
        elif stop.is_set() and failure is None:
            failure = f"stopped by {signal.Signals(holder.get('signal', signal.SIGTERM)).name}"
    finally:
        sig = holder.get("signal")
        board.update(head.listing(), head.status(), launcher.snapshot(), launcher.restarted_total, force=True,
                     state="stopped" if sig else "failed" if failure else "finished" if result is not None
                     else "failed", failure=failure, cause=launcher.failure_cause)
        board.finish()
        await head.stop_controller()
        others = [n for n in head.listing() if n.startswith("agent/") and n != agent.name]
        for other in others:
            try:
                await AgentHandle(agent, other).stop_node(reason=failure or "the job ended", ask_timeout=5)
            except MailboxError:
                pass
        await loop.run_in_executor(None, launcher.stop_all)
        await head.wait_gone(others, 30)
        await agent.stop()
        await head.close()
    if failure:
        log.error("job failed", reason=failure.splitlines()[0])
        from ..checkpoints import continue_hint
        if hint := continue_hint(cfg):   # (before the failure: its cause stays the last line)
            print(f"{ctx.prog}: {hint}", file=sys.stderr)
        print(f"{ctx.prog}: {failure}", file=sys.stderr)
        sig = holder.get("signal")
        return (EXIT_INTERRUPTED if sig == signal.SIGINT else EXIT_TERMINATED if sig else 1), None
    return 0, result


# ---------------------------------------------------------------------------------------------------------------
# node agents

async def run_agent(ctx: JobContext, job_path: Path) -> int:
    from ..log import setup_logging
    cfg = ctx.cfg
    run_dir = Path(cfg.run.run_dir).resolve()
    rt = RuntimeConfig.for_job(cfg, ctx.multi_host)
    rt.directory = ctx.join
    log = get_logger(actor="agent")
    node_no = ctx.agent_index()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    holder: dict = {}
    _install_signals(loop, stop, holder)

    async def join() -> NodeAgent:
        if cfg.runtime.curve:
            job_keys(True, run_dir, create=False)  # RuntimeError until the head's keys are there
        agent = NodeAgent(node_no)
        await agent.start(rt)
        return agent
    # the head may not be up yet: keep knocking, a fresh agent each time, 1 s apart, for SLIME_ACTORS_JOIN_TIMEOUT
    join_timeout = JOIN_TIMEOUT.get()
    errors = (MailboxError, RuntimeError, FileNotFoundError)
    policy = RetryPolicy(attempts=None, deadline=join_timeout, base=1.0, factor=1.0, max_delay=1.0, retry_on=errors,
                         retry_if=lambda exc: not stop.is_set())
    try:
        agent = await retry(join, policy, what="joining the head", started=time.monotonic())
    except errors as exc:
        print(f"{ctx.prog}: cannot join the head at {ctx.join} within {join_timeout:.0f}s: {exc}", file=sys.stderr)
        return 3
    setup_logging(str(run_dir), agent.name)
    await loop.run_in_executor(None, write_agent_job, cfg, job_path)
    keys = job_keys(cfg.runtime.curve, run_dir, create=False)
    env = {**rt.env(), JOB.name: str(job_path), **ctx.extra_env}
    if keys is not None:
        env.update(keys.env())
    try:  # the head made them before it took anyone in: from the environment or the shared RUN_DIR/keys
        engines = engine_keys(cfg, run_dir, create=False)
        env.update(key_env(retriever_key(cfg, run_dir, create=False)))
    except ValueError as exc:
        print(f"{ctx.prog}: error: {exc}", file=sys.stderr)
        await agent.stop()
        return 2
    if engines is not None:
        env.update(engines.env())
    launcher = _make_launcher(ctx, env, run_dir)
    agent.launcher = launcher
    launcher.start_all()
    log.info("node agent started", node=f"{ctx.node[0]}[{ctx.node[1]}]", actors=len(launcher.procs),
             head=ctx.join)
    head_agent = f"agent/{JobContext(cfg, ctx.topology, node=(ctx.topology.head, 0)).agent_index()}"
    lost_after = max(30.0, 6 * rt.down_after)
    last_contact = time.monotonic()
    code = 0
    try:
        while not stop.is_set() and not agent.stop_requested.is_set():
            await asyncio.sleep(0.5)
            listing = None
            try:
                listing = await agent.ask("directory/0", "list", timeout=max(2.0, rt.down_after))
                last_contact = time.monotonic()
            except MailboxError:
                if time.monotonic() - last_contact > lost_after:
                    log.error("head unreachable; stopping this node", silent_for=round(lost_after))
                    print(f"{ctx.prog}: lost the head at {ctx.join} for {lost_after:.0f}s; stopping",
                          file=sys.stderr)
                    code = 4
                    break
            launcher.check(listing)
            if launcher.failure:
                try:
                    await AgentHandle(agent, head_agent).node_failed(agent.name, launcher.failure, ask_timeout=10)
                except MailboxError:
                    pass
                print(f"{ctx.prog}: {agent.name}: {launcher.failure}", file=sys.stderr)
                code = 1
                break
    finally:
        await loop.run_in_executor(None, launcher.stop_all)
        await agent.stop()
    if holder.get("signal"):
        return EXIT_INTERRUPTED if holder["signal"] == signal.SIGINT else EXIT_TERMINATED
    return code


# ---------------------------------------------------------------------------------------------------------------
# entry points

def run(ctx: JobContext) -> int:
    """Run this process's part of the job. Returns the exit code; the head prints the summary."""
    import uvloop

    from ..log import quiet_library_progress_bars, setup_logging
    cfg = ctx.cfg
    t0 = time.monotonic()
    quiet_library_progress_bars()
    from .. import startup_timeline as timeline
    try:
        with timeline.phase("run dir + model"):
            job_path = prepare_head(cfg, ctx.fresh) if ctx.is_head else prepare_agent(cfg, ctx.agent_index())
    except (FileNotFoundError, ValueError) as exc:
        from .checks import discard_checked
        discard_checked(cfg)
        print(f"{ctx.prog}: error: {exc}", file=sys.stderr)
        return 2
    if not ctx.is_head:
        return uvloop.run(run_agent(ctx, job_path))
    run_dir = Path(cfg.run.run_dir)
    setup_logging(run_dir, "controller/0")
    get_logger(actor="launcher").info("run", run_dir=str(run_dir), model=cfg.model.hf_checkpoint,
                                      steps=cfg.run.num_rollout, estimator=cfg.algorithm.advantage_estimator,
                                      topology=ctx.topology.path)
    code, result = uvloop.run(run_head(ctx, job_path))
    if code != 0 or result is None:
        return code or 1
    result["seconds"] = round(time.monotonic() - t0, 1)
    report(result, run_dir)
    return 0


def parse_node(spec: str, topo: Topology) -> tuple[str, int]:
    group, _, idx = spec.partition(":")
    if group not in topo.nodes:
        raise ValueError(f"--node {spec}: no node group {group!r} in {topo.path} "
                         f"(node groups: {', '.join(topo.nodes)})")
    try:
        i = int(idx or 0)
    except ValueError:
        raise ValueError(f"--node {spec}: the index after ':' must be an integer") from None
    if not 0 <= i < topo.nodes[group].count:
        raise ValueError(f"--node {spec}: node group {group!r} has {topo.nodes[group].count} node(s)")
    return group, i


def launch_main(argv: list[str]) -> int:
    """`slime-actors launch TOPOLOGY [launcher options] [job flags]`."""
    from ..config import ConfigError
    from .job_config import plan_job, print_errors, print_notes
    from .topology import TopologyError, load_topology
    prog = "slime-actors launch"
    p = argparse.ArgumentParser(
        prog=prog, add_help=True, allow_abbrev=False,   # job flags must not become --node etc.
        description="Start a job's actors from a topology file and supervise them (docs/launch.md). Every option "
                    "not listed here is a job flag (see `slime-actors train --help`).")
    p.add_argument("topology", help="topology file (TOML, or YAML with PyYAML)")
    p.add_argument("--node", default=None, help="GROUP:INDEX: run only this node's actors (multi-node)")
    p.add_argument("--join", default=None, help="tcp://HEAD:PORT: this node is not the head; the head's directory")
    p.add_argument("--head-port", type=int, default=None, help="the head's directory port (multi-node)")
    p.add_argument("--roles", default=None,
                   help="ROLE[,ROLE...]: start only these roles' actors here ('none': only the head's directory and "
                        "controller); Slurm runs one srun step per role")
    p.add_argument("--status", choices=["auto", "line", "table", "changes", "off"], default="auto",
                   help="console status: a live line, a table every 10 s, a line per change, or nothing")
    p.add_argument("--dry-run", action="store_true",
                   help="check everything (flags, config and prompt files, paths, the GPU plan), print the "
                        "placement plan and exit; nothing is started or written")
    ns, rest = p.parse_known_args(argv)
    try:
        topo = load_topology(ns.topology)
    except TopologyError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    try:
        node = parse_node(ns.node, topo) if ns.node else None
    except ValueError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    if ns.join and not node:
        print("slime-actors launch: error: --join needs --node GROUP:INDEX (which node this is)", file=sys.stderr)
        return 2
    if node and not ns.join and node != (topo.head, 0):
        print(f"slime-actors launch: error: --node {ns.node} is not the head node ({topo.head}:0): give --join "
              "tcp://HEAD:PORT", file=sys.stderr)
        return 2
    if node and not ns.join and not ns.head_port:
        print("slime-actors launch: error: a multi-node head needs --head-port (its directory's tcp port)",
              file=sys.stderr)
        return 2
    roles = None
    if ns.roles is not None:
        roles = [] if ns.roles.strip() in ("", "none") else [r.strip() for r in ns.roles.split(",") if r.strip()]
        unknown = [r for r in roles if r not in topo.roles]
        if unknown:
            print(f"slime-actors launch: error: --roles {ns.roles}: no role {unknown[0]!r} in {topo.path} "
                  f"(roles: {', '.join(topo.roles)})", file=sys.stderr)
            return 2
    here = node is None and not ns.join   # every actor on this host: place them on its GPUs
    head = not ns.join
    try:
        plan = plan_job(rest, topo, place=here, data=head, paths=head, keep_rows=head and not ns.dry_run)
    except ConfigError as exc:
        print_errors(exc, prog)
        return 2
    cfg, changed = plan.cfg, plan.changed
    for c in changed:
        print(f"{prog}: topology sets {c}", file=sys.stderr)
    print_notes(cfg, prog)
    for line in plan.summary + (plan.gpus.lines() if plan.gpus is not None else []):
        print(f"{prog}: {line}", file=sys.stderr)
    if ns.dry_run:
        print(topo.describe())
        print(f"{prog}: dry run: every check passed; nothing was started")
        return 0
    ctx = JobContext(cfg, topo, node=node, join=ns.join, head_port=ns.head_port, status=ns.status, roles=roles)
    return run(ctx)
