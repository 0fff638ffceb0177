"""Every message type of the project, declared in one place: per role, each method with the fields its body
carries and its reply -- written as Python signatures, one type language for both.

    @role("buffer")
    class BufferMessages(Protocol):
        @message(reply="{groups: [group]}")                    # the reply as docs/wire-format.md shows it
        def get_work(self, worker: str, max_groups: int, wait: float | None = None) -> Work:
            \"\"\"A rollout worker pulls up to `max_groups` groups; waits up to `wait` s for some.\"\"\"

A parameter is a field of the body (a default, always None, makes it optional: a body may leave it out or send
nil); the return annotation is the reply's type on the asker's side (a reply type below; None: no reply). A field's
type on the wire follows its annotation: int, float, str, bool, bytes, list[...], dict[...], Array, or Any.

What uses the declarations:
* a handler of a built-in role must match its declaration (checked when the class is defined), and every request is
  checked against it before the handler runs: a missing field, an unknown field or a field of the wrong type gets an
  `error` reply that names it (actors/dispatch.py). Actors of roles not declared here (a user's own reward actor)
  get a declaration derived from their handlers' signatures;
* the typed handles callers hold (`BufferHandle`, `TrainerGroup`, ...) are generated from them into
  slime_actors/role_handles.py (`python -m slime_actors.handles`; tests/test_handles.py fails when it is stale): a
  type checker and an editor see each message's fields and reply there;
* `python -m slime_actors.messages` prints the catalog (docs/wire-format.md embeds it; tests/test_wire_doc.py).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from types import UnionType
from typing import Any, NotRequired, Protocol, TypedDict

import numpy as np

TYPES = ("int", "float", "str", "bool", "bytes", "list", "dict", "array", "any")


class BadRequest(ValueError):
    """A request body that does not match its declaration."""


class ReplyError(ValueError):
    """A reply that lacks what its declared type needs."""


@dataclass(frozen=True)
class Field:
    type: str = "any"      # its type on the wire (TYPES), from the annotation
    required: bool = True


@dataclass(frozen=True)
class MessageSpec:
    role: str
    method: str
    fields: dict[str, Field]
    doc: str = ""
    reply: str = ""
    open: bool = False  # accepts fields beyond the declared ones (a handler taking **kwargs)
    required: frozenset = field(default=frozenset(), compare=False)
    # the reply as the asker gets it: the wire's value checked (and turned into the declared type's value)
    read_reply: Callable[[Any], Any] | None = field(default=None, compare=False)
    # False: the handler does not read its arrays' bytes when replaying (a replay of a trace that kept only their
    # checksums feeds zeros of their size; traces/replay.py)
    replay_arrays: bool = field(default=True, compare=False)
    # the declaration's source text (slime_actors/role_handles.py is generated from it): (field, annotation) in
    # declared order, and the reply's annotation
    annotations: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    returns: str = field(default="None", compare=False)

    def check(self, body: Any) -> dict:
        """Return the body as keyword arguments, or raise BadRequest naming what is wrong."""
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise BadRequest(f"{self.role}.{self.method}: body must be a map of fields, got {type(body).__name__}")
        fields = self.fields
        if not self.required.issubset(body.keys()):
            missing = sorted(self.required - body.keys())
            raise BadRequest(f"{self.role}.{self.method}: missing field(s) {', '.join(missing)}")
        for key, val in body.items():
            f = fields.get(key)
            if f is None:
                if self.open:
                    continue
                raise BadRequest(f"{self.role}.{self.method}: unknown field {key!r} "
                                 f"(fields: {', '.join(fields) or 'none'})")
            if f.type != "any" and not _is(f.type, val) and not (val is None and not f.required):
                raise BadRequest(f"{self.role}.{self.method}: field {key!r} must be {f.type}, got "
                                 f"{type(val).__name__}")
        return body


def _is(typ: str, val: Any) -> bool:
    if typ == "int":
        return isinstance(val, int) and not isinstance(val, bool)
    if typ == "float":
        return isinstance(val, (int, float)) and not isinstance(val, bool)
    if typ == "str":
        return isinstance(val, str)
    if typ == "bool":
        return isinstance(val, bool)
    if typ == "bytes":
        return isinstance(val, (bytes, bytearray))
    if typ == "list":
        return isinstance(val, list) or _is_array(val)
    if typ == "dict":
        return isinstance(val, dict)
    if typ == "array":
        return _is_array(val) or isinstance(val, list)
    return True


def _is_array(val) -> bool:
    if isinstance(val, np.ndarray):
        return True
    torch = __import__("sys").modules.get("torch")
    return torch is not None and isinstance(val, torch.Tensor)


# an array field: a numpy array or a torch tensor (or a list); on the wire, ext type 1 (docs/wire-format.md)
Array = Any
_WIRE_TYPES = {"int": "int", "float": "float", "str": "str", "bool": "bool", "bytes": "bytes", "list": "list",
               "dict": "dict", "Array": "array"}


def wire_type(annotation: Any) -> str:
    """A field's type on the wire (TYPES) from its annotation -- the source text (`"int | None"`,
    `"list[SampleMap]"`) or the evaluated type; `X | None` is X (optional), anything else unknown is "any"."""
    if annotation is inspect.Parameter.empty:
        return "any"
    text = annotation if isinstance(annotation, str) else (
        annotation.__name__ if isinstance(annotation, type) else str(annotation))
    parts = [p for p in _top_level(text, "|") if p not in ("None", "NoneType")]
    if len(parts) != 1:
        return "any"
    base = parts[0].split("[", 1)[0].strip().rsplit(".", 1)[-1]
    return _WIRE_TYPES.get(base, "any")


def _top_level(text: str, sep: str) -> list[str]:
    """`text` split at `sep` outside brackets, each part stripped."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == sep and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return parts + [cur.strip()]


CATALOG: dict[tuple[str, str], MessageSpec] = {}


def message(*, reply: str, replay_arrays: bool = True):
    """Mark a declaration whose message has a reply: `reply` says what it holds, as docs/wire-format.md shows it
    (a declaration without this decorator has none: its return annotation is None)."""
    def mark(fn):
        fn._reply, fn._replay_arrays = reply, replay_arrays
        return fn
    return mark


def role(name: str):
    """Class decorator: every method of the class declares a message that actors of role `name` take ("*": every
    actor)."""
    def register(cls):
        for method, fn in vars(cls).items():
            if inspect.isfunction(fn) and not method.startswith("__"):
                declare(name, method, fn)
        return cls
    return register


def declare(role: str, method: str, fn: Callable) -> MessageSpec:
    """Declare message `role.method` from a signature (see the module's docstring) and add it to CATALOG."""
    where = f"{role}.{method}"
    fs: dict[str, Field] = {}
    anns: list[tuple[str, str]] = []
    open_ = False
    for p in list(inspect.signature(fn).parameters.values())[1:]:  # (after self)
        if p.kind is p.VAR_KEYWORD:
            open_ = True
            continue
        if p.kind is not p.POSITIONAL_OR_KEYWORD:
            raise TypeError(f"{where}: field {p.name!r} must be a plain parameter (fields are sent by name)")
        if p.annotation is p.empty:
            raise TypeError(f"{where}: field {p.name!r} has no type annotation")
        if p.default is not p.empty and p.default is not None:
            raise TypeError(f"{where}: optional field {p.name!r} must default to None (left out: not sent)")
        ann = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", str(p.annotation))
        fs[p.name] = Field(wire_type(ann), p.default is p.empty)
        if fs[p.name].type not in TYPES:
            raise ValueError(f"{where}: field {p.name} has unknown type {fs[p.name].type!r}")
        anns.append((p.name, ann))
    returns = fn.__annotations__.get("return", "None")
    returns = returns if isinstance(returns, str) else getattr(returns, "__name__", str(returns))
    reply = getattr(fn, "_reply", None)
    if reply is None and returns != "None":
        raise TypeError(f"{where}: a message with a reply ({returns}) says what it holds: @message(reply=...)")
    hints = typing.get_type_hints(fn)
    doc = " ".join((inspect.getdoc(fn) or "").split())
    spec = MessageSpec(role, method, fs, doc, reply or "nothing", open_, frozenset(n for n, f in fs.items()
                                                                                   if f.required),
                       reply_reader(hints.get("return"), where), getattr(fn, "_replay_arrays", True), tuple(anns),
                       returns)
    CATALOG[(role, method)] = spec
    return spec


def spec_from_signature(role: str, method: str, fn) -> MessageSpec:
    """Derive a declaration from a handler's signature (for roles not in the catalog)."""
    fs: dict[str, Field] = {}
    open_ = False
    for p in list(inspect.signature(fn).parameters.values())[1:]:
        if p.kind is p.VAR_KEYWORD:
            open_ = True
            continue
        if p.kind in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY):
            raise TypeError(f"handler {role}.{method}: fields are passed by name; *args or positional-only "
                            f"parameter {p.name!r} cannot receive one")
        fs[p.name] = Field(wire_type(p.annotation), p.default is p.empty)
    doc = (inspect.getdoc(fn) or "").split("\n")[0]
    return MessageSpec(role, method, fs, doc, "", open_, frozenset(n for n, f in fs.items() if f.required))


def check_handler(spec: MessageSpec, fn) -> None:
    """Fail at class definition when a handler's parameters disagree with its declaration."""
    derived = spec_from_signature(spec.role, spec.method, fn)
    if derived.open and not spec.open:
        raise TypeError(f"handler {spec.role}.{spec.method} takes **kwargs but its declaration is closed")
    if set(derived.fields) != set(spec.fields) and not derived.open:
        raise TypeError(f"handler {spec.role}.{spec.method} parameters {sorted(derived.fields)} do not match "
                        f"the declared fields {sorted(spec.fields)} (slime_actors/messages.py)")
    for name, f in spec.fields.items():
        d = derived.fields.get(name)
        if d is not None and d.required and not f.required:
            raise TypeError(f"handler {spec.role}.{spec.method}: field {name!r} is optional in the declaration "
                            "but the parameter has no default")


def catalog_markdown() -> str:
    """The catalog as a Markdown table (docs/wire-format.md)."""
    rows = ["| role | method | fields (`?` optional) | reply | what |", "|---|---|---|---|---|"]
    for (role, method), s in sorted(CATALOG.items()):
        fields = ", ".join(f"`{n}{'' if f.required else '?'}: {f.type}`" for n, f in s.fields.items()) or "—"
        cells = [role, f"`{method}`", fields, s.reply, s.doc]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")  # a | in a cell is escaped
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------------------------------
# Reading a reply as its declared type

def _needs(where: str, reply: Any, need: tuple[str, ...] | frozenset, what: str = "its type needs") -> dict:
    """`reply` if it is a map holding every key of `need`, else a ReplyError naming what came and what is missing."""
    if not isinstance(reply, dict) or not all(k in reply for k in need):
        have = sorted(reply) if isinstance(reply, dict) else type(reply).__name__
        raise ReplyError(f"{where} replied {have}; {what} {', '.join(sorted(need))}")
    return reply


def typed_dict_keys(td: type) -> frozenset[str]:
    """The keys a TypedDict requires (read from the annotations' text: `NotRequired[...]` is not required, nor is a
    key of a class declared total=False)."""
    need: set[str] = set()
    for klass in reversed(td.__mro__):
        anns = klass.__dict__.get("__annotations__", {})
        total = klass.__dict__.get("__total__", True)
        for k, ann in anns.items():
            text = ann if isinstance(ann, str) else getattr(ann, "__forward_arg__", None) or repr(ann)
            if total and not text.replace("typing.", "").startswith("NotRequired["):
                need.add(k)
            else:
                need.discard(k)
    return frozenset(need)


def reply_reader(t: Any, where: str) -> Callable[[Any], Any] | None:
    """How a handle reads a reply of declared type `t`: a class with `from_wire` makes its value from the map; a
    TypedDict's keys, a list's or a map's containers and a str's or a number's type are checked (the value itself is
    handed on); None: nothing to read (no reply, Any)."""
    if t is None or t is type(None) or t is Any:
        return None
    if hasattr(t, "from_wire"):
        return t.from_wire
    if typing.is_typeddict(t):
        keys = typed_dict_keys(t)
        return lambda r: _needs(where, r, keys)
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is list or origin is dict:
        inner = reply_reader(args[-1], where) if args and typing.is_typeddict(args[-1]) else None

        def read(r: Any) -> Any:
            if not isinstance(r, origin):
                raise ReplyError(f"{where} replied {type(r).__name__}; its type needs a {origin.__name__}")
            if inner is not None:
                for x in (r.values() if isinstance(r, dict) else r):
                    inner(x)
            return r
        return read
    if t in (str, int, float, bool):
        def scalar(r: Any) -> Any:
            if not isinstance(r, t if t is not float else (int, float)) or (t is not bool and isinstance(r, bool)):
                raise ReplyError(f"{where} replied {type(r).__name__}; its type needs a {t.__name__}")
            return r
        return scalar
    if origin in (typing.Union, UnionType):
        return None
    raise TypeError(f"{where}: a reply of type {t!r} cannot be read (a class with from_wire, a TypedDict, a list, a "
                    "dict, str, int, float, bool)")


# ------------------------------------------------------------------------------------------------------------------
# Reply types (the wire carries the map; a typed handle hands back the type)

SampleMap = dict[str, Any]            # one sample on the wire: Sample.to_wire() (slime_actors/types.py)
GroupMap = dict[str, Any]             # one group on the wire (see "The RL loop" below)
EngineAnswer = dict[str, Any]         # the engine's own JSON answer (SGLang's native API)


@dataclass(frozen=True)
class RolloutStats:
    """buffer.wait_rollout's reply: whether the rollout (or evaluation) is complete, its size and mean reward, the
    best and the worst sample of one group (`examples`), and every statistic the buffer sent (`wire`)."""
    complete: bool
    rollout_id: int
    kind: str
    groups: int
    samples: int
    reward_mean: float | None
    examples: list | None
    wire: dict

    @classmethod
    def from_wire(cls, reply: Any) -> RolloutStats:
        _needs("buffer.wait_rollout", reply, ("complete", "rollout_id", "kind", "groups", "samples", "reward_mean"),
               "a rollout's statistics need")
        return cls(bool(reply["complete"]), reply["rollout_id"], reply["kind"], reply["groups"], reply["samples"],
                   reply["reward_mean"], reply.get("examples"), reply)

    def numbers(self) -> dict[str, int | float]:
        """The numeric statistics (the metrics row's rollout/* columns), in the order the buffer sent them."""
        return {k: v for k, v in self.wire.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}

    @property
    def passrate(self) -> dict[str, float]:
        """pass@k per k (--log-passrate; an evaluation's always), or {}."""
        return self.wire.get("passrate") or {}

    @property
    def hack(self) -> dict | None:
        """The reward-hacking monitor's report on a training rollout (None with --hack-alarms off)."""
        return self.wire.get("hack")


@dataclass(frozen=True)
class WorkGroup:
    """One prompt group leased to a rollout worker (the buffer's group record; `samples`: Sample.to_wire() maps,
    `attempt`: how often the group was leased before)."""
    work_id: str
    rollout_id: int
    kind: str
    group_index: int
    sampling_params: dict
    samples: list
    attempt: int = 0

    @classmethod
    def from_wire(cls, g: Any) -> WorkGroup:
        _needs("buffer.get_work", g, ("work_id", "rollout_id", "kind", "group_index", "sampling_params", "samples"),
               "a group needs")
        return cls(g["work_id"], g["rollout_id"], g["kind"], g["group_index"], g["sampling_params"], g["samples"],
                   g.get("attempt", 0))


@dataclass(frozen=True)
class Work:
    """buffer.get_work's reply: the groups leased to the worker (none when nothing came within `wait`); asked
    `ahead`, the weight version their rollout is generated at (None: no rollout is held)."""
    groups: list[WorkGroup]
    weight_version: int | None = None

    @classmethod
    def from_wire(cls, reply: Any) -> Work:
        _needs("buffer.get_work", reply, ("groups",))
        return cls([WorkGroup.from_wire(g) for g in reply["groups"]], reply.get("weight_version"))


@dataclass(frozen=True)
class Submitted:
    """buffer.submit's reply: `accepted`, else the `reason` for refusing; `outcome` of an accepted group."""
    accepted: bool
    reason: str | None = None
    outcome: str | None = None

    @classmethod
    def from_wire(cls, reply: Any) -> Submitted:
        _needs("buffer.submit", reply, ("accepted",))
        return cls(bool(reply["accepted"]), reply.get("reason"), reply.get("outcome"))


@dataclass(frozen=True)
class Returned:
    """buffer.return_work's reply: whether the group was queued again (`partial`: with its partial responses), else
    the `reason` it was not (it was not leased to that worker; `failed`: it failed too often, and is recorded as a
    failed group)."""
    requeued: bool
    partial: bool = False
    reason: str | None = None
    failed: bool = False

    @classmethod
    def from_wire(cls, reply: Any) -> Returned:
        _needs("buffer.return_work", reply, ("requeued",))
        return cls(bool(reply["requeued"]), bool(reply.get("partial")), reply.get("reason"), bool(reply.get("failed")))


@dataclass(frozen=True)
class Released:
    """buffer.release_worker's reply: how many groups leased to the worker were queued again."""
    requeued: int

    @classmethod
    def from_wire(cls, reply: Any) -> Released:
        _needs("buffer.release_worker", reply, ("requeued",))
        return cls(int(reply["requeued"]))


@dataclass(frozen=True)
class TrainBatch:
    """buffer.get_batch's reply: a trainer rank's shard as parallel lists, one entry per sample
    (types.batch_from_samples); `wire` is that map, which the RL update takes (and extends)."""
    KEYS = ("sample_index", "group_index", "tokens", "prompt_lengths", "response_lengths", "loss_masks",
            "rollout_log_probs", "rewards", "weight_versions")
    wire: dict

    @classmethod
    def from_wire(cls, reply: Any) -> TrainBatch:
        return cls(_needs("buffer.get_batch", reply, cls.KEYS, "a training batch needs"))

    def __len__(self) -> int:
        """Samples in the shard."""
        return len(self.wire["tokens"])


@dataclass(frozen=True)
class Joined:
    """controller.trainer_join's reply: the training group's store (rank 0's address and port), its generation, and
    the checkpoint every rank loads (None: start fresh)."""
    master_addr: str
    master_port: int
    generation: int
    checkpoint: str | None

    @classmethod
    def from_wire(cls, reply: Any) -> Joined:
        _needs("controller.trainer_join", reply, ("master_addr", "master_port", "generation", "checkpoint"))
        return cls(reply["master_addr"], reply["master_port"], reply["generation"], reply["checkpoint"])


@dataclass(frozen=True)
class Scores:
    """reward.score's reply: per sample its reward, or None and the error; `timed_out` per sample (a reward actor
    of your own may leave it out: then [])."""
    rewards: list
    errors: list
    timed_out: list

    @classmethod
    def from_wire(cls, reply: Any) -> Scores:
        _needs("reward.score", reply, ("rewards", "errors"))
        return cls(reply["rewards"], reply["errors"], reply.get("timed_out") or [])


@dataclass(frozen=True)
class DirectUpdate:
    """rollout.weight_update's reply: where the trainer posts the weights itself (colocated), and how."""
    engine_url: str
    paused: str | None
    flush_cache: bool
    tp_size: int

    @classmethod
    def from_wire(cls, reply: Any) -> DirectUpdate:
        _needs("rollout.weight_update", reply, ("engine_url", "paused", "flush_cache", "tp_size"))
        return cls(reply["engine_url"], reply["paused"], bool(reply["flush_cache"]), int(reply["tp_size"]))


@dataclass(frozen=True)
class RouterUrl:
    """rollout.router_url's reply: the sglang-router rollout/0 started."""
    url: str

    @classmethod
    def from_wire(cls, reply: Any) -> RouterUrl:
        return cls(_needs("rollout.router_url", reply, ("url",))["url"])


@dataclass(frozen=True)
class RetrieverAddress:
    """retriever.address's reply: the replica's HTTP address and what it serves."""
    url: str
    docs: int
    corpus_sha256: str

    @classmethod
    def from_wire(cls, reply: Any) -> RetrieverAddress:
        r = _needs("retriever.address", reply, ("url", "docs", "corpus_sha256"))
        return cls(r["url"], int(r["docs"]), r["corpus_sha256"])


# Replies that stay maps where they are used (logged, written to a file, put in the job's result): TypedDicts, their
# keys checked when the reply arrives

class Ping(TypedDict):
    """_ping's reply."""
    name: str
    role: str
    index: int
    pid: int
    host: str
    uptime: float


class Stopping(TypedDict):
    """_stop's reply."""
    stopping: bool


class Registered(TypedDict):
    """directory.register's reply: the heartbeat settings the actor follows."""
    ok: bool
    heartbeat_interval: float
    liveness: int


class PeerEntry(TypedDict):
    """One actor in directory.list's reply (`last_seen`: seconds ago; `incarnation`: its restarts)."""
    endpoint: str
    pid: int
    host: str
    alive: bool
    last_seen: float
    incarnation: NotRequired[int]


class ProcessEntry(TypedDict):
    """One process in agent.processes's reply."""
    pid: int | None
    alive: bool
    restarts: int
    exit_codes: list[int | None]


class NodeStopping(TypedDict):
    """agent.stop_node's reply."""
    stopping: bool
    processes: int


class Status(TypedDict):
    """controller.status's reply: where the loop is."""
    phase: str
    rollout_id: int
    weight_version: int
    engines: dict[str, int]
    last: dict[str, Any] | None
    steps: int
    num_rollout: int
    trainer_generation: int | None
    recoveries: list[dict[str, Any]]
    stopped: Any


class RolloutStarted(TypedDict):
    """buffer.start_rollout's reply: the rollout's groups (`new_groups` made now; `existing`: it was started
    before; `held`: made and held; `opened`: a held one opened)."""
    groups: int
    rollout_id: int
    kind: str
    new_groups: NotRequired[int]
    existing: NotRequired[bool]
    held: NotRequired[bool]
    opened: NotRequired[bool]


class Accounting(TypedDict):
    """buffer.accounting's reply: per sample index, trained once, more than once, or not (and where it is); what
    rollbacks discarded. The job's result carries it."""
    issued: int
    trained_once: int
    trained_more: int
    untrained: int
    duplicated: list[int]
    trained_rollouts: list[int]
    pending_groups: list[str]
    stats: dict[str, Any]
    expected_trained: int
    lost: int
    lost_samples: list[int]
    untrained_by_state: dict[str, int]
    discarded: dict[str, int]
    rollbacks: list[dict[str, Any]]
    epoch: int


class RolledBack(TypedDict):
    """buffer.rollback's reply: whether the buffer went back to the snapshot (else the `reason` it did not); the
    trainings that went into the weights thrown away."""
    rolled_back: bool
    reason: NotRequired[str]
    to: NotRequired[str]
    if_ahead_of: NotRequired[int]
    trained_rollouts_discarded: NotRequired[list[int]]
    samples_discarded: NotRequired[int]
    epoch: NotRequired[int]


class EvalResponse(TypedDict):
    """One sample in buffer.eval_results's reply."""
    index: int
    prompt: Any
    response: str
    reward: float | None
    label: Any


class RolloutLoaded(TypedDict):
    """buffer.load_rollout's reply."""
    groups: int


class Paused(TypedDict):
    """rollout.pause's reply: generations still in flight, and how the engine paused."""
    in_flight: int
    mode: str | None


class RolloutEnded(TypedDict):
    """rollout.end_rollout's reply: generations aborted, and how many of those went back to the buffer."""
    aborted: int
    returned: int


class AdapterLoaded(TypedDict):
    """rollout.load_lora_adapter's reply."""
    lora_name: str
    loaded: bool


class Killed(TypedDict):
    """rollout.kill_engine's reply."""
    pid: int


class GroupLeft(TypedDict):
    """trainer.abort_group's reply: whether the rank left (False: the group was not its own)."""
    left: bool


class WeightsSynced(TypedDict, total=False):
    """trainer.sync_weights's reply: rank 0's account of the push (seconds, bytes, buckets, transport, and what the
    transport adds); another rank's says only that it took part."""
    seconds: float
    bytes: int
    buckets: int
    transport: str
    rank: int
    participated: bool


TrainMetrics = dict[str, float]      # trainer.train's reply: the RL update's metrics (loss, kl, time/..., ...)


# ------------------------------------------------------------------------------------------------------------------
# Every actor

@role("*")
class ActorMessages(Protocol):
    @message(reply="{name, role, index, pid, host, uptime}")
    def _ping(self) -> Ping:
        """Liveness and identity check."""

    @message(reply="map of counters")
    def _stats(self) -> dict[str, int]:
        """Mailbox and handler counters."""

    @message(reply="{stopping: true}")
    def _stop(self, reason: str | None = None) -> Stopping:   # reason: why, for the log
        """Ask the actor to stop after answering."""

    def _peer_down(self, name: str, reason: str | None = None) -> None:
        """Directory notice: a peer missed its heartbeats or deregistered."""

    def _peer_up(self, name: str, endpoint: str) -> None:
        """Directory notice: a peer (re)registered, possibly at a new endpoint."""


# Directory: name -> endpoint, heartbeats, liveness notices
@role("directory")
class DirectoryMessages(Protocol):
    @message(reply="{ok: true, heartbeat_interval, liveness}")
    def register(self, name: str, endpoint: str, pid: int | None = None, host: str | None = None,
                 meta: dict[str, Any] | None = None) -> Registered:
        """Register an actor's endpoint; notifies watchers with _peer_up."""

    def deregister(self, name: str) -> None:
        """Remove an actor that stops cleanly (no _peer_down for it)."""

    @message(reply="endpoint string")
    def lookup(self, name: str, wait: float | None = None) -> str:
        """Endpoint of a name; waits up to `wait` seconds for it to register."""

    @message(reply="{name: {endpoint, pid, host, alive, last_seen}}")
    def list(self) -> dict[str, PeerEntry]:
        """Every registered actor with its endpoint, pid, host, liveness."""

    def watch(self, name: str) -> None:
        """Subscribe `name` to _peer_down/_peer_up notices."""


# Node agents (slime_actors/launch/job.py: one per node of a multi-node job; the head's stops the others)
@role("agent")
class AgentMessages(Protocol):
    @message(reply="{name: {pid, alive, restarts, exit_codes}}")
    def processes(self) -> dict[str, ProcessEntry]:
        """The processes this node's launcher started and supervises."""

    def node_failed(self, node: str, reason: str) -> None:
        """Another node's agent gave up (restart intensity exceeded): the head stops the job."""

    @message(reply="{stopping: true, processes}")
    def stop_node(self, reason: str | None = None) -> NodeStopping:
        """Stop this node's processes and its agent (the job ended, or failed elsewhere)."""


# ------------------------------------------------------------------------------------------------------------------
# The RL loop (docs/architecture.md). A "group" on the wire: {work_id, rollout_id, kind ("train"|"eval"),
# group_index, sampling_params, samples: [Sample.to_wire()...]}.

@role("controller")
class ControllerMessages(Protocol):
    def engine_ready(self, worker: str, weight_version: int) -> None:
        """A rollout worker's engine is (re)started and serving at `weight_version`."""

    def rollout_failed(self, worker: str, error: str) -> None:
        """A rollout worker cannot go on (an environment failed under --env-error stop): the job ends with
        `error`."""

    @message(reply="{phase, rollout_id, weight_version, engines, last, steps, num_rollout, ...}")
    def status(self) -> Status:
        """Where the loop is: rollout id, weight version, phase, metrics of the last step."""

    @message(reply="{master_addr, master_port, generation, checkpoint}")
    def trainer_join(self, rank: int, world_size: int, addr: str, port: int, pid: int) -> Joined:
        """A trainer rank joins the training group (rank 0 offers the store's address and port); answered once
        every rank of this generation joined."""

    def trainer_ready(self, rank: int, generation: int, weight_version: int | None = None) -> None:
        """A trainer rank of `generation` has its process group and its checkpoint."""


@role("buffer")
class BufferMessages(Protocol):
    @message(reply="{groups, rollout_id, kind}")
    def start_rollout(self, rollout_id: int, kind: str | None = None, weight_version: int | None = None,
                      name: str | None = None, hold: bool | None = None) -> RolloutStarted:
        """Prepare the prompt groups of a rollout (train) or an evaluation (eval). `hold` (train): made now, handed
        out once started again without it (which opens it)."""

    @message(reply="{groups: [group]}")
    def get_work(self, worker: str, max_groups: int, wait: float | None = None, ahead: bool | None = None) -> Work:
        """A rollout worker pulls up to `max_groups` groups; waits up to `wait` s for some. `ahead`: groups of the
        rollout made ahead (held), at once, with the weight version the worker starts them at."""

    @message(reply="{accepted, reason?, outcome?}")
    def submit(self, worker: str, work_id: str, samples: list[SampleMap]) -> Submitted:
        """A rollout worker hands back a finished, scored group (completed or failed)."""

    @message(reply="{requeued, partial?, failed?, reason?}")
    def return_work(self, worker: str, work_id: str, samples: list[SampleMap] | None = None,
                    reason: str | None = None, failed: bool | None = None) -> Returned:
        """A rollout worker gives back work it could not finish (abort, engine restart). `failed`: its generation
        raised or its samples were refused (`reason` says how); the third time, the group is recorded as failed."""

    @message(reply="{requeued}")
    def release_worker(self, worker: str, reason: str | None = None) -> Released:
        """Re-issue every group leased to a worker (it died or its engine restarted)."""

    @message(reply="{complete, groups, samples, filtered, failed, reward_mean, ..., batch_id?, hack?}")
    def wait_rollout(self, rollout_id: int, kind: str | None = None, timeout: float | None = None,
                     hack: bool | None = None) -> RolloutStats:
        """Wait until the rollout (or eval) has its groups; returns its statistics (a complete training rollout's
        with batch_id, what names its batch; with hack: the reward-hacking monitor's report, unless --hack-alarms
        off). `hack` false: the reply does not wait for the report -- the monitor starts on the complete rollout
        and `hack_report` answers it."""

    @message(reply="{rollout_id, metrics, alarms, skipped} | {rollout_id, error} | nil")
    def hack_report(self, rollout_id: int) -> dict[str, Any] | None:
        """The reward-hacking monitor's report on a complete training rollout (what wait_rollout's `hack` holds),
        waiting for it while the monitor runs; nil with --hack-alarms off or once the rollout is trained."""

    @message(reply="batch map (slime_actors.types.batch_from_samples)")
    def get_batch(self, rollout_id: int, rank: int, world_size: int, packed: bool | None = None) -> TrainBatch:
        """A trainer rank pulls its shard (whole groups) of a completed rollout (`packed`: tokens, loss masks and
        rollout log-probs as packed columns, types.pack_rows)."""

    @message(reply="{batch_id, batch} | nil")
    def wait_batch(self, rollout_id: int, rank: int, world_size: int, packed: bool | None = None,
                   timeout: float | None = None) -> dict[str, Any] | None:
        """A trainer rank asks for its shard of a training rollout before the rollout is complete (after training on
        the one before): answered once it is, with the batch's id (wait_rollout's `batch_id`); nil after `timeout`
        s, or when the rollout was rolled back or trained meanwhile."""

    def mark_trained(self, rollout_id: int) -> None:
        """Record that a rollout's samples were trained on (accounting, then freed)."""

    @message(reply="{issued, trained_once, trained_more, untrained, lost, duplicated, ...}")
    def accounting(self) -> Accounting:
        """Per sample index: times handed out, submitted, trained; lost/duplicated checks."""

    def save(self, path: str) -> None:
        """Write the buffer state (dataset position, queued and partial groups) to `path`."""

    @message(reply="{rolled_back, trained_rollouts_discarded, samples_discarded, epoch, ...}")
    def rollback(self, path: str | None = None, if_ahead_of: int | None = None, reason: str | None = None,
                 token: str | None = None) -> RolledBack:
        """Back to a checkpoint's snapshot (the training group restarted from it) when the buffer holds rollouts
        from `if_ahead_of` on; discarded trainings are accounted. Idempotent per `token`."""

    @message(reply="list")
    def eval_results(self, rollout_id: int) -> list[EvalResponse]:
        """Per-sample results of a finished eval (prompt, response, reward, label)."""

    @message(reply="list")
    def dump_rollout(self, rollout_id: int) -> list[SampleMap]:
        """All samples of a completed rollout (for --save-debug-rollout-data)."""

    @message(reply="{groups}")
    def load_rollout(self, rollout_id: int, samples: list[SampleMap]) -> RolloutLoaded:
        """Insert samples as a completed rollout (for --load-debug-rollout-data)."""


@role("rollout")
class RolloutMessages(Protocol):
    def resume(self, weight_version: int) -> None:
        """Start (or continue) pulling work at `weight_version`."""

    def take_ahead(self, rollout_id: int) -> None:
        """Rollout `rollout_id` was made ahead (held) while the trainers train: lease some of its groups now and start
        them at the first resume whose weights are theirs."""

    @message(reply="{in_flight, mode}")
    def pause(self, abort: bool | None = None) -> Paused:
        """Stop pulling new work and pause the engine (/pause_generation, --pause-generation-mode; abort=true: mode
        abort)."""

    @message(reply="{aborted, returned}")
    def end_rollout(self, rollout_id: int) -> RolloutEnded:
        """The rollout is complete: abort what is in flight and return it to the buffer."""

    @message(reply="engine answer")
    def init_weights_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                           group_name: str, backend: str) -> EngineAnswer:
        """Have the engine join the trainer's weight-broadcast group."""

    @message(reply="engine answer")
    def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                        group_name: str, weight_version: int, flush_cache: bool | None = None,
                                        load_format: str | None = None) -> EngineAnswer:
        """Have the engine receive one bucket by broadcast."""

    def destroy_weights_group(self, group_name: str) -> None:
        """Leave the weight-broadcast group."""

    @message(reply="engine answer")
    def update_weights_from_disk(self, model_path: str, weight_version: int) -> EngineAnswer:
        """Have the engine load weights from an HF directory."""

    @message(reply="{lora_name, loaded}", replay_arrays=False)
    def load_lora_adapter(self, weight_version: int, tensors: dict[str, Array], config: dict[str, Any]
                          ) -> AdapterLoaded:
        """--lora-sync adapter: the trainer's LoRA adapters (PEFT's tensor names, CPU tensors) for `weight_version`;
        the worker writes them as an adapter directory and loads it into its engine."""

    @message(reply="list")
    def held_groups(self) -> list[str]:
        """Work ids the worker holds (the buffer reconciles its leases after a restart)."""

    @message(reply="map")
    def engine_info(self) -> dict[str, Any]:
        """The engine's URL, weight version, health and counters."""

    @message(reply="{engine_url, paused, flush_cache, tp_size}")
    def weight_update(self, active: bool, weight_version: int | None = None) -> DirectUpdate:
        """The trainer updates the engine directly (colocated tensors): hold health probes while active; then the
        version it holds."""

    @message(reply="{url}")
    def router_url(self) -> RouterUrl:
        """rollout/0: the URL of the sglang-router it started (waits until it is up)."""

    @message(reply="{pid}")
    def kill_engine(self, hang: bool | None = None) -> Killed:
        """Kill the engine process (fault-injection and tests); the worker restarts it."""


@role("reward")
class RewardMessages(Protocol):
    @message(reply="{rewards: [float|None], errors: [str|None], timed_out?: [bool]}")
    def score(self, samples: list[SampleMap], group: bool | None = None) -> Scores:
        """Score samples; per-sample rewards and errors (a failing function loses nothing)."""


@role("retriever")
class RetrieverMessages(Protocol):
    @message(reply="{url, docs, corpus_sha256, requests, queries}")
    def address(self) -> RetrieverAddress:
        """Where this replica serves Search-R1's POST /retrieve (a restarted one: a new port), with its corpus
        and counters."""


@role("trainer")
class TrainerMessages(Protocol):
    @message(reply="metrics map")
    def train(self, rollout_id: int, batch_id: str | None = None) -> TrainMetrics:
        """Run the RL update on this rank's shard of the rollout: the one it fetched ahead (wait_batch) when that is
        batch `batch_id` (wait_rollout's), else pulled now (get_batch)."""

    @message(reply="{seconds, bytes, buckets, transport}")
    def sync_weights(self, weight_version: int, workers: list[str], transport: str | None = None,
                     rebuild: bool | None = None) -> WeightsSynced:
        """Rank 0: push the current weights to the rollout workers."""

    def save(self, path: str, save_optim: bool | None = None) -> None:
        """Save this rank's model/optimizer/RNG state under `path`."""

    @message(reply="{left}")
    def abort_group(self, generation: int, reason: str | None = None) -> GroupLeft:
        """Leave the training group of `generation` (broken: a rank died); the rank exits with code 75 and its
        supervisor restarts it."""

    def save_hf(self, path: str, rollout_id: int | None = None) -> None:
        """Every rank: export the policy as a Hugging Face directory at `path` (rank 0 writes; --save-hf after
        `rollout_id`)."""

    @message(reply="list of lists")
    def log_probs(self, samples: list[SampleMap]) -> list[list[float]]:
        """Log-probs of given samples under the current actor (checks and tests)."""


if __name__ == "__main__":  # after every declaration above: the whole catalog (docs/wire-format.md)
    print(catalog_markdown())
