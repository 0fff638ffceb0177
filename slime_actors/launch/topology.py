"""Topology files: which actors run, how many, where (nodes, GPUs, CPUs), with what environment and restart policy.

    topo = load_topology("examples/launch/local.toml")  # TOML (YAML too, if PyYAML is installed)
    plan = topo.plan()                                  # one Placement per actor process
    topo = default_topology(args)                       # what `slime-actors train` uses: derived from the flags

A topology adds placement and supervision on top of the job's flags (docs/launch.md has the format). tomllib (or
PyYAML) parses the file; the dataclasses declare each table's keys, defaults and checks (field metadata), and one reader
applies them. Every error names the file, the line and the key, e.g. `launch/x.toml:12: roles.rollout.
gpus_per_actor: must be an integer >= 0, got str 'two'`. tomllib reports no positions for what it parsed fine, so
`TomlLines` asks it for the text's prefixes, line by line, and notes where each key first appears (only when a
message needs a line).
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..env import ACTOR_CLASS, CPUS, PLACED_GPUS
from ..config import JobConfig
from ..json_files import not_regular

HEAD_ROLES = ("directory", "controller")          # run in the head process (the launcher on the head node)
BUILTIN_ROLES = ("buffer", "reward", "rollout", "trainer", "retriever")
DEFAULT_ORDER = ("buffer", "reward", "rollout", "trainer")


class TopologyError(ValueError):
    """A bad topology file entry; the message names the file, line and key."""


# ---------------------------------------------------------------------------------------------------------------
# the schema: a dataclass declares a table's keys, each a field with its default and `reads(check)` metadata;
# `_Reader.read` refuses unknown keys and runs the checks

class _Bad(ValueError):
    """A value that does not fit its key (the reader adds the file, line and key); `sub`: a key inside the value."""

    def __init__(self, msg: str, sub: str | None = None):
        super().__init__(msg)
        self.sub = sub


def reads(check, name: str | None = None) -> dict:
    """A dataclass field's metadata for a key of a topology file: `check(value, given)` returns the value to keep
    or raises _Bad (`given`: the table's values read so far, in field order); `name`: the key in the file, if not
    the field's name."""
    return {"check": check, "name": name}


def _show(v: Any) -> str:
    return f"{type(v).__name__} {v!r}" if not isinstance(v, (dict, list)) else type(v).__name__


def _int(lo: int):
    def check(v, given=None) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise _Bad(f"must be an integer >= {lo}, got {_show(v)}")
        return v
    return check


def _number(lo: float):
    def check(v, given=None) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= lo:
            raise _Bad(f"must be a number > {lo:g}, got {_show(v)}")
        return float(v)
    return check


def _bool(v, given=None) -> bool:
    if not isinstance(v, bool):
        raise _Bad(f"must be true or false, got {_show(v)}")
    return v


def _str(v, given=None) -> str:
    if not isinstance(v, str) or not v:
        raise _Bad(f"must be a non-empty string, got {_show(v)}")
    return v


def _any(v, given=None):
    return v


def _table(v, given=None) -> dict:
    if v is None:          # YAML's `buffer:` with nothing under it
        return {}
    if not isinstance(v, dict):
        raise _Bad(f"must be a table, got {_show(v)}")
    return v


def _env(v, given=None) -> dict[str, str]:
    out = {}
    for k, val in _table(v).items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
            raise _Bad("is not a valid environment variable name", sub=k)
        if isinstance(val, bool):
            val = "1" if val else "0"
        if not isinstance(val, (str, int, float)):
            raise _Bad(f"must be a string or number, got {_show(val)}", sub=k)
        out[k] = str(val)
    return out


def _class_path(v, given=None) -> str:
    if ":" not in _str(v):
        raise _Bad(f"must be module:Class, got {v!r}")
    return v


def _one_of(*choices: str):
    def check(v, given=None):
        if v not in choices:
            raise _Bad(f"must be {', '.join(choices[:-1])} or {choices[-1]}, got {v!r}")
        return v
    return check


def _strings(v, given=None) -> list[str]:
    if not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
        raise _Bad("must be a list of strings")
    return v


def _indexes(what: str):
    """[[0,1],[2,3]] (one list per actor: `count` of them) or [0,1] (the same for every actor)."""
    def check(v, given) -> list[list[int]]:
        count = given["count"]
        if not isinstance(v, list) or not v:
            raise _Bad(f"must be a list of {what} indexes (one list per actor, or one for all)")
        if all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            lists = [list(v)] * count
        elif all(isinstance(x, list) for x in v):
            if len(v) != count:
                raise _Bad(f"has {len(v)} lists but the role has {count} actor(s)")
            lists = [list(x) for x in v]
        else:
            raise _Bad(f"must be a list of {what} indexes (one list per actor, or one for all)")
        for x in (x for lst in lists for x in lst):
            if isinstance(x, bool) or not isinstance(x, int) or x < 0:
                raise _Bad(f"{what} indexes must be integers >= 0, got {_show(x)}")
        return lists
    return check


@dataclass
class RestartPolicy:
    """The keys `restart`, `max_restarts`, `window` of [supervisor] (every role's default) and of a role's table,
    and `group` of a role's table."""
    # restart the actor when its process exits unexpectedly
    restart: bool = field(default=True, metadata=reads(_bool))
    # more than max_restarts restarts within window seconds stops the job (the OTP supervisor rule)
    max_restarts: int = field(default=5, metadata=reads(_int(0)))
    window: float = field(default=60.0, metadata=reads(_number(0)))
    # one member exits -> every member of the role on this host is restarted
    group: bool = field(default=False, metadata=reads(_bool))


@dataclass
class NodeGroup:
    """[nodes.NAME]: `count` nodes with `gpus` GPUs each (CUDA_VISIBLE_DEVICES indexes 0..gpus-1) and `cpus` CPUs
    (default: all of the machine's); `slurm`: extra #SBATCH options for this group (partition, constraint)."""
    name: str
    count: int = field(default=1, metadata=reads(_int(1)))
    gpus: int = field(default=0, metadata=reads(_int(0)))
    cpus: int | None = field(default=None, metadata=reads(_int(1)))
    slurm: dict = field(default_factory=dict, metadata=reads(_table))


@dataclass
class RoleSpec:
    """[roles.NAME]: these keys and the restart policy's. `class`: module:Class for a role that is not built in;
    `nodes`: the node group (default: the first); GPUs by `gpus` (indexes per actor), `gpus_per_actor` or
    `colocate` (share the GPUs of that role's actors on the same node); CPUs by `cpus` or `cpus_per_actor`."""
    name: str
    count: int = field(default=1, metadata=reads(_int(0)))
    cls: str | None = field(default=None, metadata=reads(_class_path, name="class"))
    nodes: str = field(default="", metadata=reads(_str))
    gpus_per_actor: int = field(default=0, metadata=reads(_int(0)))
    gpus: list[list[int]] | None = field(default=None, metadata=reads(_indexes("GPU")))
    colocate: str | None = field(default=None, metadata=reads(_str))
    cpus_per_actor: int = field(default=0, metadata=reads(_int(0)))
    cpus: list[list[int]] | None = field(default=None, metadata=reads(_indexes("CPU")))
    env: dict[str, str] = field(default_factory=dict, metadata=reads(_env))
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
            env[PLACED_GPUS.name] = env["CUDA_VISIBLE_DEVICES"]
        if self.cpus is not None:
            env[CPUS.name] = ",".join(map(str, self.cpus))
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
    lines: Any = field(default_factory=dict)    # dotted key -> line (.get), for messages

    # ------------------------------------------------------------------------------------------ derived
    def count(self, role: str) -> int:
        r = self.roles.get(role)
        return r.count if r else 0

    def where(self, key: str) -> str:
        return _where(self.path, self.lines, key)

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
                    env[ACTOR_CLASS.name] = r.cls  # the actor process builds its actor from this class
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
        if self.count("retriever"):
            if not cfg.retriever.retriever_corpus:
                raise self.error("roles.retriever", "the retriever role serves --retriever-corpus, and the job has "
                                 "none" + (" (it names one started elsewhere, --retriever-url)"
                                           if cfg.retriever.retriever_url else ""))
            setv(cfg.retriever, "retriever_num_replicas", self.roles["retriever"].count)
        elif cfg.retriever.retriever_corpus and not cfg.debug.debug_train_only:
            raise self.error("roles", f"the job serves --retriever-corpus {cfg.retriever.retriever_corpus} but the "
                             "topology has no [roles.retriever] (add one; count = replicas)")
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
# reading files: tomllib (or PyYAML) parses, the schema above checks, the lines are found for the messages

@dataclass
class _File:
    """The top level of a topology file: its keys; each value is checked in its turn (the tables by their readers)."""
    job: Any = field(default=None, metadata=reads(_any))
    env: Any = field(default=None, metadata=reads(_any))
    supervisor: Any = field(default=None, metadata=reads(_any))
    nodes: Any = field(default=None, metadata=reads(_any))
    roles: Any = field(default=None, metadata=reads(_any))
    slurm: Any = field(default=None, metadata=reads(_any))
    torchrun: Any = field(default=None, metadata=reads(_any))
    head: Any = field(default=None, metadata=reads(_any))   # the head process's node group (default: the first)


@dataclass
class _Job:
    config: str | None = field(default=None, metadata=reads(_str))   # the job's flags (TOML), relative to this file


@dataclass
class _Timers:
    """[supervisor]'s own keys, beside the restart policy's `restart`, `max_restarts`, `window`."""
    hang_kill_after: float | None = field(default=None, metadata=reads(_number(0)))
    status_interval: float | None = field(default=None, metadata=reads(_number(0)))


@dataclass
class _Slurm:
    """[slurm] (docs/launch.md); the keys checked as `_any` go into the batch script as they are."""
    job_name: Any = field(default=None, metadata=reads(_any))
    partition: Any = field(default=None, metadata=reads(_any))
    time: Any = field(default=None, metadata=reads(_any))
    account: Any = field(default=None, metadata=reads(_any))
    port: int | None = field(default=None, metadata=reads(_int(1)))
    output: Any = field(default=None, metadata=reads(_any))
    venv: Any = field(default=None, metadata=reads(_any))
    workdir: Any = field(default=None, metadata=reads(_any))
    layout: str | None = field(default=None, metadata=reads(_one_of("auto", "heterogeneous", "homogeneous")))
    sbatch: list[str] | None = field(default=None, metadata=reads(_strings))
    srun: list[str] | None = field(default=None, metadata=reads(_strings))
    setup: list[str] | None = field(default=None, metadata=reads(_strings))
    run_dir: Any = field(default=None, metadata=reads(_any))


@dataclass
class _Torchrun:
    order: list[str] | None = field(default=None, metadata=reads(_any))   # checked against the topology's roles


def _keys_of(cls: type) -> dict[str, Any]:
    """The file keys a schema dataclass reads -> their fields."""
    return {f.metadata["name"] or f.name: f for f in fields(cls) if "check" in f.metadata}


def _defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default_factory() if f.default_factory is not MISSING else f.default
            for f in fields(cls) if "check" in f.metadata}


def _where(path: str, lines, key: str) -> str:
    """`path:line` of `key`, else of the nearest enclosing key that has one, else `path`."""
    line = lines.get(key)
    while line is None and "." in key:
        key = key.rsplit(".", 1)[0]
        line = lines.get(key)
    return f"{path}:{line}" if line else path


class _Reader:
    """Reads a topology's tables with the schema; every error names the file, the line and the key."""

    def __init__(self, path: str, lines):
        self.path, self.lines = path, lines

    def err(self, key: str, msg: str) -> TopologyError:
        return TopologyError(f"{_where(self.path, self.lines, key)}: {key}: {msg}")

    def read(self, table: Any, at: str, schema: type, also: tuple[type, ...] = (), skip: tuple[str, ...] = (),
             start: dict | None = None) -> dict:
        """The table at dotted key `at`, read with the dataclass `schema`: {field name: checked value}, over
        `start`. A key that neither `schema` nor `also` (read separately from the same table) has, or that is in
        `skip`, is refused, naming the closest one."""
        table = self.value(_table, table, at)
        fields_ = _keys_of(schema)
        allowed = {k for cls in (schema, *also) for k in _keys_of(cls)} - set(skip)
        for k in table:
            if k not in allowed:
                close = difflib.get_close_matches(k, sorted(allowed), n=1, cutoff=0.7)
                raise self.err(f"{at}.{k}" if at else k,
                               f"unknown key{f' (did you mean {close[0]!r}?)' if close else ''}; "
                               f"allowed: {', '.join(sorted(allowed))}")
        given = dict(start or {})
        for k, f in fields_.items():
            if k in table and k not in skip:
                given[f.name] = self.value(f.metadata["check"], table[k], f"{at}.{k}" if at else k, given)
        return given

    def value(self, check, v: Any, at: str, given: dict | None = None):
        try:
            return check(v, given)
        except _Bad as bad:
            raise self.err(f"{at}.{bad.sub}" if bad.sub else at, str(bad)) from None


def load_topology(path: str | os.PathLike) -> Topology:
    path = str(path)
    what = not_regular(path)
    if what is not None and what != "no such file":   # (a FIFO would block the read)
        raise TopologyError(f"topology file {path} is {what}, not a TOML or YAML file")
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
        except RecursionError:   # (tomllib parses nested arrays and tables by recursion)
            raise TopologyError(f"{path}: not valid TOML: nested too deep to be read") from None
        lines = TomlLines(text)
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
    except RecursionError:   # (PyYAML composes nested collections by recursion)
        raise TopologyError(f"{path}: not valid YAML: nested too deep to be read") from None
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


class TomlLines:
    """Dotted key -> the line where a TOML text defines it (`.get`), for error messages: tomllib gives no positions
    for what it parsed fine, so it is asked for the text's prefixes line by line; a key belongs to the statement
    after which it first appears (its first line: a multi-line array's `key = [`). Found on first use."""

    def __init__(self, text: str):
        self.text, self._lines = text, None

    def get(self, key: str, default=None):
        if self._lines is None:
            self._lines = toml_key_lines(self.text)
        return self._lines.get(key, default)


def toml_key_lines(text: str) -> dict[str, int]:
    """Dotted key -> 1-based line (tables, keys, inline tables; the entries of an array of tables as `key.N`)."""
    rows = text.splitlines(keepends=True)
    lines: dict[str, int] = {}
    start = 0                                   # the row after the last prefix that parsed
    for end in range(1, len(rows) + 1):
        try:
            data = tomllib.loads("".join(rows[:end]))
        except tomllib.TOMLDecodeError:
            continue                            # inside a multi-line value
        while start < end - 1 and rows[start].strip()[:1] in ("", "#"):
            start += 1                          # blank lines and comments before the statement
        for key in _dotted(data):
            lines.setdefault(key, start + 1)
        start = end
    return lines


def _dotted(d: dict, prefix: str = ""):
    for k, v in d.items():
        key = f"{prefix}{k}"
        yield key
        if isinstance(v, dict):
            yield from _dotted(v, key + ".")
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for i, x in enumerate(v):
                yield f"{key}.{i}"
                yield from _dotted(x, f"{key}.{i}.")


def from_dict(data: dict, path: str = "<topology>", lines=None) -> Topology:
    """The topology of a parsed file. `lines`: dotted key -> line (anything with `.get`), for the messages."""
    lines = lines if lines is not None else {}
    rd = _Reader(path, lines)
    top = _File(**rd.read(data, "", _File))
    job = _Job(**rd.read(top.job, "job", _Job))
    job_config = job.config
    if job_config is not None:
        cand = Path(path).resolve().parent / job_config
        if not Path(job_config).is_absolute() and cand.exists():
            job_config = str(cand)
    env = rd.value(_env, top.env, "env")
    base = RestartPolicy(**rd.read(top.supervisor, "supervisor", RestartPolicy, also=(_Timers,), skip=("group",),
                                   start=_defaults(RestartPolicy)))
    supervisor = rd.read(top.supervisor, "supervisor", _Timers, also=(RestartPolicy,), skip=("group",))

    nodes = {name: NodeGroup(name, **rd.read(nd, f"nodes.{name}", NodeGroup, start=_defaults(NodeGroup)))
             for name, nd in rd.value(_table, top.nodes, "nodes").items()}
    if not nodes:
        nodes["local"] = NodeGroup("local")
    first_group = next(iter(nodes))

    roles_d = rd.value(_table, top.roles, "roles")
    if not roles_d:
        raise rd.err("roles", "the topology names no roles (add [roles.buffer], [roles.rollout], ...)")
    roles: dict[str, RoleSpec] = {}
    for name, table in roles_d.items():
        key = f"roles.{name}"
        if name in HEAD_ROLES:
            raise rd.err(key, f"{name} runs in the head process; choose its node with `head = \"GROUP\"`")
        if not re.match(r"^[a-z][a-z0-9_]*$", name):
            raise rd.err(key, "role names are lower-case letters, digits and _")
        r = RoleSpec(name, **rd.read(table, key, RoleSpec, also=(RestartPolicy,), start=_defaults(RoleSpec)))
        # a trainer rank's death breaks its process group: restart the whole group by default
        r.policy = RestartPolicy(**rd.read(table, key, RestartPolicy, also=(RoleSpec,),
                                           start={**asdict(base), "group": name == "trainer"}))
        if r.cls is None and name not in BUILTIN_ROLES:
            raise rd.err(key, f"unknown role (built in: {', '.join(BUILTIN_ROLES)}); give `class = \"pkg.mod:Class\"` "
                              "for your own")
        r.nodes = r.nodes or first_group
        if r.nodes not in nodes:
            raise rd.err(f"{key}.nodes", f"no node group {r.nodes!r} (node groups: {', '.join(nodes)})")
        if sum(x is not None and x != 0 for x in (r.gpus, r.colocate, r.gpus_per_actor)) > 1:
            raise rd.err(key, "give one of gpus, gpus_per_actor or colocate")
        if r.cpus is not None and r.cpus_per_actor:
            raise rd.err(key, "give one of cpus or cpus_per_actor")
        ng = nodes[r.nodes]
        for g in (g for lst in r.gpus or () for g in lst):
            if g >= ng.gpus:
                raise rd.err(f"{key}.gpus", f"GPU {g} does not exist: node group {r.nodes!r} has {ng.gpus} GPU(s) "
                                            f"per node (nodes.{r.nodes}.gpus)")
        total = ng.cpus or os.cpu_count() or 1
        for c in (c for lst in r.cpus or () for c in lst):
            if c >= total:
                raise rd.err(f"{key}.cpus", f"CPU {c} does not exist: node group {r.nodes!r} has {total} CPU(s) "
                                            "per node")
        roles[name] = r
    for r in roles.values():
        if r.colocate is not None:
            other = roles.get(r.colocate)
            if other is None or other is r:
                raise rd.err(f"roles.{r.name}.colocate", f"no other role named {r.colocate!r} to share GPUs with")
            if other.nodes != r.nodes:
                raise rd.err(f"roles.{r.name}.colocate", f"{r.name} runs on node group {r.nodes!r} but "
                                                         f"{other.name} on {other.nodes!r}: colocated roles share "
                                                         "nodes")
            if not (other.gpus or other.gpus_per_actor):
                raise rd.err(f"roles.{r.name}.colocate", f"role {other.name!r} has no GPUs to share")

    head = rd.value(_str, data.get("head", first_group), "head")
    if head not in nodes:
        raise rd.err("head", f"no node group {head!r} (node groups: {', '.join(nodes)})")
    for name in nodes:
        if not any(r.nodes == name for r in roles.values()) and name != head:
            raise rd.err(f"nodes.{name}", "no role runs on this node group")
    slurm = rd.value(_table, top.slurm, "slurm")
    rd.read(slurm, "slurm", _Slurm)
    torchrun = rd.value(_table, top.torchrun, "torchrun")
    order = rd.read(torchrun, "torchrun", _Torchrun).get("order", [])
    if not isinstance(order, list) or any(o not in roles for o in order):
        raise rd.err("torchrun.order", f"must list roles of this topology ({', '.join(roles)})")
    topo = Topology(path, roles, nodes, head, job_config, env, supervisor, slurm, torchrun, lines)
    topo.plan()  # resource errors now, with their lines
    return topo


def default_topology(cfg: JobConfig) -> Topology:
    """The topology `slime-actors train` runs: every role on this host, counts from the flags (retriever replicas
    with --retriever-corpus), trainer ranks restarted as a group, everything else restarted alone (at most 5 times
    a minute)."""
    roles: dict[str, RoleSpec] = {"buffer": RoleSpec("buffer", 1, nodes="local")}
    if not cfg.debug.debug_train_only:
        roles["reward"] = RoleSpec("reward", cfg.reward.num_reward_workers, nodes="local")
        roles["rollout"] = RoleSpec("rollout", cfg.engine.rollout_num_engines, nodes="local")
    roles["trainer"] = RoleSpec("trainer", cfg.train.n_ranks, nodes="local", policy=RestartPolicy(group=True))
    if cfg.retriever.retriever_corpus and not cfg.debug.debug_train_only:
        roles["retriever"] = RoleSpec("retriever", cfg.retriever.retriever_num_replicas, nodes="local")
    return Topology("<flags>", roles, {"local": NodeGroup("local")}, "local")
