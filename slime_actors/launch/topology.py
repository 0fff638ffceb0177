"""Topology files: which actors run, how many, where (nodes, GPUs, CPUs), with what environment and restart policy.

    topo = load_topology("launch/local.toml")          # TOML (YAML too, if PyYAML is installed)
    plan = topo.plan()                                  # one Placement per actor process
    topo = default_topology(args)                       # what `slime-actors train` uses: derived from the flags

A topology adds placement and supervision on top of the job's flags (docs/launch.md has the format). Every error
names the file, the line and the key, e.g. `launch/x.toml:12: roles.rollout.gpus_per_actor: must be an integer
>= 0, got "two"` -- tomllib reports no line numbers for values it parsed fine, so the lines are found here.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import env as E
from ..config import JobConfig

HEAD_ROLES = ("directory", "controller")          # run in the head process (the launcher on the head node)
BUILTIN_ROLES = ("buffer", "reward", "rollout", "trainer")
DEFAULT_ORDER = ("buffer", "reward", "rollout", "trainer")


class TopologyError(ValueError):
    """A bad topology file entry; the message names the file, line and key."""


@dataclass
class RestartPolicy:
    restart: bool = True          # restart the actor when its process exits unexpectedly
    max_restarts: int = 5         # more than this many restarts ...
    window: float = 60.0          # ... within this many seconds stops the job (the OTP supervisor rule)
    group: bool = False           # one member exits -> every member of the role on this host is restarted


@dataclass
class NodeGroup:
    name: str
    count: int = 1                # nodes
    gpus: int = 0                 # GPUs per node (CUDA_VISIBLE_DEVICES indexes 0..gpus-1)
    cpus: int | None = None       # CPUs per node (default: all of the machine's)
    slurm: dict = field(default_factory=dict)   # extra #SBATCH options for this node group (partition, constraint)


@dataclass
class RoleSpec:
    name: str
    count: int
    cls: str | None = None        # module:Class for roles that are not built in
    nodes: str = ""               # node group
    gpus_per_actor: int = 0
    gpus: list[list[int]] | None = None    # explicit GPU indexes per actor (overrides gpus_per_actor)
    colocate: str | None = None   # share the GPUs of this role's actors on the same node (e.g. rollout -> trainer)
    cpus_per_actor: int = 0
    cpus: list[list[int]] | None = None    # explicit CPU affinity per actor
    env: dict[str, str] = field(default_factory=dict)
    policy: RestartPolicy = field(default_factory=RestartPolicy)


@dataclass
class Placement:
    """One actor process: where it runs and what it gets."""
    role: str
    index: int
    node_group: str
    node_index: int               # within the node group
    local_index: int              # among this role's actors on that node
    gpus: list[int] | None
    cpus: list[int] | None
    env: dict[str, str]
    policy: RestartPolicy

    @property
    def name(self) -> str:
        return f"{self.role}/{self.index}"

    def process_env(self) -> dict[str, str]:
        env = dict(self.env)
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.gpus))
            # the process sees only these, renumbered from 0: an engine it starts begins at GPU 0 of them
            env[E.PLACED_GPUS.name] = env["CUDA_VISIBLE_DEVICES"]
        if self.cpus is not None:
            env[E.CPUS.name] = ",".join(map(str, self.cpus))
        env["LOCAL_RANK"] = str(self.local_index) if self.role == "trainer" else env.get("LOCAL_RANK", "0")
        return env


@dataclass
class Topology:
    path: str
    roles: dict[str, RoleSpec]
    nodes: dict[str, NodeGroup]
    head: str                                   # node group whose first node hosts directory + controller
    job_config: str | None = None               # default --config for the job's flags
    env: dict[str, str] = field(default_factory=dict)
    supervisor: dict = field(default_factory=dict)   # hang_kill_after, status_interval
    slurm: dict = field(default_factory=dict)
    torchrun: dict = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)

    # ------------------------------------------------------------------------------------------ derived
    def count(self, role: str) -> int:
        r = self.roles.get(role)
        return r.count if r else 0

    def where(self, key: str) -> str:
        line = self.lines.get(key)
        while line is None and "." in key:
            key = key.rsplit(".", 1)[0]
            line = self.lines.get(key)
        return f"{self.path}:{line}" if line else self.path

    def error(self, key: str, msg: str) -> TopologyError:
        return TopologyError(f"{self.where(key)}: {key}: {msg}")

    def plan(self) -> list[Placement]:
        """Every actor process, with its node, GPUs and CPUs. Raises TopologyError when resources run out."""
        out: list[Placement] = []
        gpu_free: dict[tuple[str, int], list[int]] = {}
        cpu_free: dict[tuple[str, int], list[int]] = {}
        given: dict[tuple[str, str, int], list[list[int]]] = {}   # (role, group, node) -> gpu lists handed out
        gpu_taken: dict[tuple[str, int], set[int]] = {}
        cpu_taken: dict[tuple[str, int], set[int]] = {}
        # explicit indexes first (the pools skip them), colocated roles last
        order = sorted(self.roles.values(), key=lambda r: (r.colocate is not None,
                                                           r.gpus is None and r.cpus is None))
        for r in order:
            ng = self.nodes[r.nodes]
            per_node = -(-r.count // ng.count) if r.count else 0
            for i in range(r.count):
                node = i // per_node if per_node else 0
                local = i - node * per_node
                key = (r.nodes, node)
                gpus = cpus = None
                if r.gpus is not None:
                    gpus = list(r.gpus[i])
                    gpu_taken.setdefault(key, set()).update(gpus)
                elif r.colocate:
                    pool = given.get((r.colocate, r.nodes, node))
                    if not pool:
                        raise self.error(f"roles.{r.name}.colocate",
                                         f"role {r.colocate!r} has no GPUs on node {node} of node group "
                                         f"{r.nodes!r} to share")
                    gpus = list(pool[local % len(pool)])
                elif r.gpus_per_actor:
                    free = gpu_free.setdefault(key, [g for g in range(ng.gpus) if g not in gpu_taken.get(key, ())])
                    if len(free) < r.gpus_per_actor:
                        raise self.error(f"roles.{r.name}.gpus_per_actor",
                                         f"{r.name}/{i} needs {r.gpus_per_actor} GPU(s) but node {node} of node "
                                         f"group {r.nodes!r} has {len(free)} left of {ng.gpus} "
                                         f"(nodes.{r.nodes}.gpus)")
                    gpus, free[:] = free[:r.gpus_per_actor], free[r.gpus_per_actor:]
                if gpus is not None:
                    given.setdefault((r.name, r.nodes, node), []).append(gpus)
                if r.cpus is not None:
                    cpus = list(r.cpus[i])
                    cpu_taken.setdefault(key, set()).update(cpus)
                elif r.cpus_per_actor:
                    total = ng.cpus or os.cpu_count() or 1
                    free = cpu_free.setdefault(key, [c for c in range(total) if c not in cpu_taken.get(key, ())])
                    if len(free) < r.cpus_per_actor:
                        raise self.error(f"roles.{r.name}.cpus_per_actor",
                                         f"{r.name}/{i} needs {r.cpus_per_actor} CPU(s) but node {node} of node "
                                         f"group {r.nodes!r} has {len(free)} left of {total}")
                    cpus, free[:] = free[:r.cpus_per_actor], free[r.cpus_per_actor:]
                env = {**self.env, **r.env}
                if r.cls:
                    env[E.ACTOR_CLASS.name] = r.cls  # the actor process builds its actor from this class
                out.append(Placement(r.name, i, r.nodes, node, local, gpus, cpus, env, r.policy))
        rank = {name: i for i, name in enumerate(self.roles)}
        out.sort(key=lambda p: (rank[p.role], p.index))
        return out

    def describe(self) -> str:
        """A short table of the plan (for --dry-run and the launcher's first lines)."""
        rows = [f"{'actor':<14} {'node':<12} {'gpus':<10} {'cpus':<10} restart"]
        rows.append(f"{'directory/0':<14} {self.head + '[0]':<12} {'-':<10} {'-':<10} (head process)")
        rows.append(f"{'controller/0':<14} {self.head + '[0]':<12} {'-':<10} {'-':<10} (head process)")
        for p in self.plan():
            pol = p.policy
            rs = (f"{'group ' if pol.group else ''}max {pol.max_restarts}/{pol.window:g}s" if pol.restart else "no")
            rows.append(f"{p.name:<14} {p.node_group + f'[{p.node_index}]':<12} "
                        f"{','.join(map(str, p.gpus)) if p.gpus else '-':<10} "
                        f"{','.join(map(str, p.cpus)) if p.cpus else '-':<10} {rs}")
        return "\n".join(rows)

    def apply_to_config(self, cfg: JobConfig) -> list[str]:
        """Make the job's config agree with the topology's counts (the topology wins). Returns what changed."""
        changed = []

        def setv(section, name, value):
            old = getattr(section, name)
            if old != value:
                changed.append(f"--{name.replace('_', '-')} {old} -> {value}")
                setattr(section, name, value)

        if "rollout" in self.roles:
            setv(cfg.engine, "rollout_num_engines", self.roles["rollout"].count)
        if "reward" in self.roles:
            setv(cfg.reward, "num_reward_workers", self.roles["reward"].count)
        if "trainer" in self.roles:
            t = self.roles["trainer"]
            nodes = min(self.nodes[t.nodes].count, t.count) or 1
            if t.count % nodes:
                raise self.error("roles.trainer.count", f"{t.count} trainer ranks do not divide evenly over "
                                 f"{nodes} nodes of node group {t.nodes!r}")
            setv(cfg.train, "actor_num_nodes", nodes)
            setv(cfg.train, "actor_num_gpus_per_node", t.count // nodes)
            batch = cfg.rollout.rollout_batch_size
            if batch % t.count:
                raise self.error("roles.trainer.count", f"--rollout-batch-size ({batch}) must be "
                                 f"a multiple of the trainer ranks ({t.count}): each rank trains whole groups")
        for need in ("buffer", "trainer") + (() if cfg.debug.debug_train_only else ("rollout", "reward")):
            if self.count(need) < 1:
                raise self.error(f"roles.{need}.count", f"the RL loop needs at least one {need} actor")
        if self.count("buffer") != 1:
            raise self.error("roles.buffer.count", f"there is exactly one buffer, got {self.count('buffer')}")
        return changed


# ---------------------------------------------------------------------------------------------------------------
# reading files

_TOP_KEYS = {"job", "env", "supervisor", "nodes", "roles", "slurm", "torchrun", "head"}
_ROLE_KEYS = {"count", "class", "nodes", "gpus_per_actor", "gpus", "colocate", "cpus_per_actor", "cpus", "env",
              "restart", "max_restarts", "window", "group"}
_NODE_KEYS = {"count", "gpus", "cpus", "slurm"}
_SUP_KEYS = {"restart", "max_restarts", "window", "hang_kill_after", "status_interval"}
_JOB_KEYS = {"config"}
_SLURM_KEYS = {"job_name", "partition", "time", "account", "port", "output", "venv", "workdir", "layout",
               "sbatch", "srun", "setup", "run_dir"}
_TORCHRUN_KEYS = {"order"}


def load_topology(path: str | os.PathLike) -> Topology:
    path = str(path)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise TopologyError(f"topology file {path} does not exist") from None
    except OSError as exc:
        raise TopologyError(f"topology file {path}: {exc}") from None
    if path.endswith((".yaml", ".yml")):
        data, lines = _load_yaml(path, text)
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise TopologyError(f"{path}: not valid TOML: {exc}") from None
        lines = toml_key_lines(text)
    return from_dict(data, path, lines)


def _load_yaml(path: str, text: str) -> tuple[dict, dict[str, int]]:
    try:
        import yaml
    except ImportError:
        raise TopologyError(f"{path}: YAML topologies need PyYAML (pip install pyyaml); or write it as TOML") \
            from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TopologyError(f"{path}: not valid YAML: {exc}") from None
    lines: dict[str, int] = {}

    def walk(n, prefix):
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                key = f"{prefix}{k.value}"
                lines.setdefault(key, k.start_mark.line + 1)
                walk(v, key + ".")
    if node is not None:
        walk(node, "")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise TopologyError(f"{path}: the top level must be a mapping")
    return data, lines


_BARE = r"[A-Za-z0-9_-]+"
_QUOTED = r'"(?:[^"\\]|\\.)*"|\'[^\']*\''
_KEY = rf"(?:{_BARE}|{_QUOTED})(?:\s*\.\s*(?:{_BARE}|{_QUOTED}))*"


def _split_key(k: str) -> list[str]:
    parts = re.findall(rf"{_BARE}|{_QUOTED}", k)
    return [p[1:-1] if p[:1] in "\"'" else p for p in parts]


def toml_key_lines(text: str) -> dict[str, int]:
    """Dotted key -> 1-based line where it is defined (tables, array-of-tables entries as key.N, inline tables)."""
    lines: dict[str, int] = {}
    table: list[str] = []
    arrays: dict[str, int] = {}
    depth = 0          # open brackets of a multi-line value
    for no, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw).strip()
        if depth > 0:
            depth += _bracket_balance(line)
            continue
        if not line:
            continue
        m = re.match(rf"^\[\[\s*({_KEY})\s*\]\]$", line)
        if m:
            parts = _split_key(m.group(1))
            base = ".".join(parts)
            n = arrays.get(base, -1) + 1
            arrays[base] = n
            lines.setdefault(base, no)
            table = parts + [str(n)]
            lines[".".join(table)] = no
            continue
        m = re.match(rf"^\[\s*({_KEY})\s*\]$", line)
        if m:
            table = _split_key(m.group(1))
            for i in range(1, len(table) + 1):
                lines.setdefault(".".join(table[:i]), no)
            lines[".".join(table)] = no
            continue
        m = re.match(rf"^({_KEY})\s*=\s*(.*)$", line)
        if m:
            key = table + _split_key(m.group(1))
            for i in range(len(table) + 1, len(key) + 1):
                lines.setdefault(".".join(key[:i]), no)
            value = m.group(2)
            if value.startswith("{"):
                _inline_lines(value, key, no, lines)
            depth = max(0, _bracket_balance(value))
    return lines


def _inline_lines(value: str, prefix: list[str], no: int, lines: dict[str, int]) -> None:
    body = _strip_strings(value)
    for m in re.finditer(rf"(?:^|[{{,])\s*({_KEY})\s*=", body):
        lines.setdefault(".".join(prefix + _split_key(m.group(1))), no)


def _strip_strings(s: str) -> str:
    return re.sub(_QUOTED, '""', s)


def _strip_comment(s: str) -> str:
    out, q = [], None
    i = 0
    while i < len(s):
        c = s[i]
        if q:
            out.append(c)
            if c == "\\" and q == '"' and i + 1 < len(s):
                out.append(s[i + 1])
                i += 1
            elif c == q:
                q = None
        elif c in "\"'":
            q = c
            out.append(c)
        elif c == "#":
            break
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _bracket_balance(s: str) -> int:
    s = _strip_strings(s)
    return s.count("[") + s.count("{") - s.count("]") - s.count("}")


# ---------------------------------------------------------------------------------------------------------------
# validation

class _V:
    """Typed getters that raise TopologyError naming the key and its line."""

    def __init__(self, path: str, lines: dict[str, int]):
        self.path, self.lines = path, lines

    def err(self, key: str, msg: str) -> TopologyError:
        line = self.lines.get(key)
        k = key
        while line is None and "." in k:
            k = k.rsplit(".", 1)[0]
            line = self.lines.get(k)
        where = f"{self.path}:{line}" if line else self.path
        return TopologyError(f"{where}: {key}: {msg}")

    def table(self, d: Any, key: str) -> dict:
        if d is None:
            return {}
        if not isinstance(d, dict):
            raise self.err(key, f"must be a table, got {_show(d)}")
        return d

    def keys(self, d: dict, allowed: set, key: str) -> None:
        for k in d:
            if k not in allowed:
                hint = _close(k, allowed)
                raise self.err(f"{key}.{k}" if key else k,
                               f"unknown key{f' (did you mean {hint!r}?)' if hint else ''}; "
                               f"allowed: {', '.join(sorted(allowed))}")

    def int(self, v: Any, key: str, lo: int = 0) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise self.err(key, f"must be an integer >= {lo}, got {_show(v)}")
        return v

    def num(self, v: Any, key: str, lo: float = 0.0) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= lo:
            raise self.err(key, f"must be a number > {lo:g}, got {_show(v)}")
        return float(v)

    def bool(self, v: Any, key: str) -> bool:
        if not isinstance(v, bool):
            raise self.err(key, f"must be true or false, got {_show(v)}")
        return v

    def str(self, v: Any, key: str) -> str:
        if not isinstance(v, str) or not v:
            raise self.err(key, f"must be a non-empty string, got {_show(v)}")
        return v

    def env(self, v: Any, key: str) -> dict[str, str]:
        d = self.table(v, key)
        out = {}
        for k, val in d.items():
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
                raise self.err(f"{key}.{k}", "is not a valid environment variable name")
            if isinstance(val, bool):
                val = "1" if val else "0"
            if not isinstance(val, (str, int, float)):
                raise self.err(f"{key}.{k}", f"must be a string or number, got {_show(val)}")
            out[k] = str(val)
        return out

    def index_lists(self, v: Any, key: str, count: int, what: str) -> list[list[int]]:
        """[[0,1],[2,3]] (one list per actor) or [0,1] (the same for every actor)."""
        if not isinstance(v, list) or not v:
            raise self.err(key, f"must be a list of {what} indexes (one list per actor, or one for all)")
        if all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            lists = [list(v)] * count
        elif all(isinstance(x, list) for x in v):
            if len(v) != count:
                raise self.err(key, f"has {len(v)} lists but the role has {count} actor(s)")
            lists = [list(x) for x in v]
        else:
            raise self.err(key, f"must be a list of {what} indexes (one list per actor, or one for all)")
        for lst in lists:
            for x in lst:
                if isinstance(x, bool) or not isinstance(x, int) or x < 0:
                    raise self.err(key, f"{what} indexes must be integers >= 0, got {_show(x)}")
        return lists


def _show(v: Any) -> str:
    return f"{type(v).__name__} {v!r}" if not isinstance(v, (dict, list)) else type(v).__name__


def _close(k: str, allowed) -> str | None:
    import difflib
    m = difflib.get_close_matches(k, list(allowed), n=1, cutoff=0.7)
    return m[0] if m else None


def _policy(v: _V, d: dict, key: str, base: RestartPolicy) -> RestartPolicy:
    p = RestartPolicy(base.restart, base.max_restarts, base.window, base.group)
    if "restart" in d:
        p.restart = v.bool(d["restart"], f"{key}.restart")
    if "max_restarts" in d:
        p.max_restarts = v.int(d["max_restarts"], f"{key}.max_restarts")
    if "window" in d:
        p.window = v.num(d["window"], f"{key}.window")
    if "group" in d:
        p.group = v.bool(d["group"], f"{key}.group")
    return p


def from_dict(data: dict, path: str = "<topology>", lines: dict[str, int] | None = None) -> Topology:
    v = _V(path, lines or {})
    v.keys(data, _TOP_KEYS, "")
    job = v.table(data.get("job"), "job")
    v.keys(job, _JOB_KEYS, "job")
    job_config = None
    if "config" in job:
        job_config = v.str(job["config"], "job.config")
        cand = Path(path).resolve().parent / job_config
        if not Path(job_config).is_absolute() and cand.exists():
            job_config = str(cand)
    env = v.env(data.get("env"), "env")
    sup = v.table(data.get("supervisor"), "supervisor")
    v.keys(sup, _SUP_KEYS, "supervisor")
    base = _policy(v, sup, "supervisor", RestartPolicy())
    supervisor = {}
    for k in ("hang_kill_after", "status_interval"):
        if k in sup:
            supervisor[k] = v.num(sup[k], f"supervisor.{k}")

    nodes_d = v.table(data.get("nodes"), "nodes")
    nodes: dict[str, NodeGroup] = {}
    for name, nd in nodes_d.items():
        key = f"nodes.{name}"
        nd = v.table(nd, key)
        v.keys(nd, _NODE_KEYS, key)
        ng = NodeGroup(name)
        if "count" in nd:
            ng.count = v.int(nd["count"], f"{key}.count", 1)
        if "gpus" in nd:
            ng.gpus = v.int(nd["gpus"], f"{key}.gpus")
        if "cpus" in nd:
            ng.cpus = v.int(nd["cpus"], f"{key}.cpus", 1)
        if "slurm" in nd:
            ng.slurm = v.table(nd["slurm"], f"{key}.slurm")
        nodes[name] = ng
    if not nodes:
        nodes["local"] = NodeGroup("local")
    first_group = next(iter(nodes))

    roles_d = v.table(data.get("roles"), "roles")
    if not roles_d:
        raise v.err("roles", "the topology names no roles (add [roles.buffer], [roles.rollout], ...)")
    roles: dict[str, RoleSpec] = {}
    for name, rd in roles_d.items():
        key = f"roles.{name}"
        if name in HEAD_ROLES:
            raise v.err(key, f"{name} runs in the head process; choose its node with `head = \"GROUP\"`")
        if not re.match(r"^[a-z][a-z0-9_]*$", name):
            raise v.err(key, "role names are lower-case letters, digits and _")
        rd = v.table(rd, key)
        v.keys(rd, _ROLE_KEYS, key)
        cls = v.str(rd["class"], f"{key}.class") if "class" in rd else None
        if cls is None and name not in BUILTIN_ROLES:
            raise v.err(key, f"unknown role (built in: {', '.join(BUILTIN_ROLES)}); give `class = \"pkg.mod:Class\"` "
                             "for your own")
        if cls is not None and ":" not in cls:
            raise v.err(f"{key}.class", f"must be module:Class, got {cls!r}")
        count = v.int(rd.get("count", 1), f"{key}.count")
        group = v.str(rd["nodes"], f"{key}.nodes") if "nodes" in rd else first_group
        if group not in nodes:
            raise v.err(f"{key}.nodes", f"no node group {group!r} (node groups: {', '.join(nodes)})")
        # a trainer rank's death breaks its process group: restart the whole group by default
        pol_base = RestartPolicy(base.restart, base.max_restarts, base.window, name == "trainer")
        r = RoleSpec(name, count, cls, group, env=v.env(rd.get("env"), f"{key}.env"),
                     policy=_policy(v, rd, key, pol_base))
        if "gpus_per_actor" in rd:
            r.gpus_per_actor = v.int(rd["gpus_per_actor"], f"{key}.gpus_per_actor")
        if "gpus" in rd:
            r.gpus = v.index_lists(rd["gpus"], f"{key}.gpus", count, "GPU")
        if "colocate" in rd:
            r.colocate = v.str(rd["colocate"], f"{key}.colocate")
        if "cpus_per_actor" in rd:
            r.cpus_per_actor = v.int(rd["cpus_per_actor"], f"{key}.cpus_per_actor")
        if "cpus" in rd:
            r.cpus = v.index_lists(rd["cpus"], f"{key}.cpus", count, "CPU")
        if sum(x is not None and x != 0 for x in (r.gpus, r.colocate, r.gpus_per_actor)) > 1:
            raise v.err(key, "give one of gpus, gpus_per_actor or colocate")
        if r.cpus is not None and r.cpus_per_actor:
            raise v.err(key, "give one of cpus or cpus_per_actor")
        ng = nodes[group]
        if r.gpus is not None:
            for lst in r.gpus:
                for g in lst:
                    if g >= ng.gpus:
                        raise v.err(f"{key}.gpus", f"GPU {g} does not exist: node group {group!r} has "
                                                   f"{ng.gpus} GPU(s) per node (nodes.{group}.gpus)")
        if r.cpus is not None:
            total = ng.cpus or os.cpu_count() or 1
            for lst in r.cpus:
                for c in lst:
                    if c >= total:
                        raise v.err(f"{key}.cpus", f"CPU {c} does not exist: node group {group!r} has {total} "
                                                   "CPU(s) per node")
        roles[name] = r
    for r in roles.values():
        if r.colocate is not None:
            other = roles.get(r.colocate)
            if other is None or other is r:
                raise v.err(f"roles.{r.name}.colocate", f"no other role named {r.colocate!r} to share GPUs with")
            if other.nodes != r.nodes:
                raise v.err(f"roles.{r.name}.colocate", f"{r.name} runs on node group {r.nodes!r} but "
                                                        f"{other.name} on {other.nodes!r}: colocated roles share "
                                                        "nodes")
            if not (other.gpus or other.gpus_per_actor):
                raise v.err(f"roles.{r.name}.colocate", f"role {other.name!r} has no GPUs to share")

    head = data.get("head", first_group)
    head = v.str(head, "head")
    if head not in nodes:
        raise v.err("head", f"no node group {head!r} (node groups: {', '.join(nodes)})")
    for name, ng in nodes.items():
        if not any(r.nodes == name for r in roles.values()) and name != head:
            raise v.err(f"nodes.{name}", "no role runs on this node group")
    slurm = v.table(data.get("slurm"), "slurm")
    v.keys(slurm, _SLURM_KEYS, "slurm")
    if "port" in slurm:
        v.int(slurm["port"], "slurm.port", 1)
    if "layout" in slurm and slurm["layout"] not in ("auto", "heterogeneous", "homogeneous"):
        raise v.err("slurm.layout", f"must be auto, heterogeneous or homogeneous, got {slurm['layout']!r}")
    for k in ("sbatch", "srun", "setup"):
        if k in slurm and not (isinstance(slurm[k], list) and all(isinstance(x, str) for x in slurm[k])):
            raise v.err(f"slurm.{k}", "must be a list of strings")
    torchrun = v.table(data.get("torchrun"), "torchrun")
    v.keys(torchrun, _TORCHRUN_KEYS, "torchrun")
    if "order" in torchrun:
        order = torchrun["order"]
        if not isinstance(order, list) or any(o not in roles for o in order):
            raise v.err("torchrun.order", f"must list roles of this topology ({', '.join(roles)})")
    topo = Topology(path, roles, nodes, head, job_config, env, supervisor, slurm, torchrun, lines or {})
    topo.plan()  # resource errors now, with their lines
    return topo


def default_topology(cfg: JobConfig) -> Topology:
    """The topology `slime-actors train` runs: every role on this host, counts from the flags, trainer ranks
    restarted as a group, everything else restarted alone (at most 5 times a minute)."""
    roles: dict[str, RoleSpec] = {"buffer": RoleSpec("buffer", 1, nodes="local")}
    if not cfg.debug.debug_train_only:
        roles["reward"] = RoleSpec("reward", cfg.reward.num_reward_workers, nodes="local")
        roles["rollout"] = RoleSpec("rollout", cfg.engine.rollout_num_engines, nodes="local")
    roles["trainer"] = RoleSpec("trainer", cfg.train.n_ranks, nodes="local", policy=RestartPolicy(group=True))
    return Topology("<flags>", roles, {"local": NodeGroup("local")}, "local")
