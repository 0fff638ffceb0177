"""Every message type of the project, declared in one place: role, method, the fields its body carries, its reply.

A handler of a built-in role must match its declaration (checked when the class is defined), and every request is
checked against it before the handler runs: a missing field, an unknown field or a field of the wrong type gets an
`error` reply that names it. Actors of roles not declared here (a user's own reward actor, say) get a declaration
derived from their handlers' signatures.

`python -m slime_actors.messages` prints the catalog (docs/wire-format.md embeds it).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TYPES = ("int", "float", "str", "bool", "bytes", "list", "dict", "array", "any")


class BadRequest(ValueError):
    """A request body that does not match its declaration."""


@dataclass(frozen=True)
class Field:
    type: str = "any"
    required: bool = True
    doc: str = ""


@dataclass(frozen=True)
class MessageSpec:
    role: str
    method: str
    fields: dict[str, Field]
    doc: str = ""
    reply: str = ""
    open: bool = False  # accepts fields beyond the declared ones (a handler taking **kwargs)
    required: frozenset = field(default=frozenset(), compare=False)
    returns: type | None = field(default=None, compare=False)  # the reply's type on the asker's side (handles.py)
    # False: the handler does not read its arrays' bytes when replaying (a replay of a trace that kept only their
    # checksums feeds zeros of their size; traces/replay.py)
    replay_arrays: bool = field(default=True, compare=False)

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


CATALOG: dict[tuple[str, str], MessageSpec] = {}


def declare(role: str, method: str, doc: str, reply: str = "nothing", open: bool = False,
            returns: type | None = None, replay_arrays: bool = True, **fields: Field | str) -> MessageSpec:
    """Declare a message. A field given as a string is a required field of that type; `"int?"` is optional.
    `returns`: a class with `from_wire(map)` that a typed handle (slime_actors/handles.py) turns the reply into; the
    wire still carries the map."""
    fs: dict[str, Field] = {}
    for name, f in fields.items():
        if isinstance(f, str):
            f = Field(f.rstrip("?"), not f.endswith("?"))
        if f.type not in TYPES:
            raise ValueError(f"{role}.{method}: field {name} has unknown type {f.type!r}")
        fs[name] = f
    spec = MessageSpec(role, method, fs, doc, reply, open, frozenset(n for n, f in fs.items() if f.required), returns,
                       replay_arrays)
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
        ann = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "any")
        typ = {"int": "int", "float": "float", "str": "str", "bool": "bool", "bytes": "bytes", "list": "list",
               "dict": "dict"}.get(str(ann).split("[")[0].split("|")[0].strip(), "any")
        fs[p.name] = Field(typ, p.default is p.empty)
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


# ------------------------------------------------------------------------------------------------------------------
# Every actor
declare("*", "_ping", "Liveness and identity check.", reply="{name, role, index, pid, host, uptime}")
declare("*", "_stats", "Mailbox and handler counters.", reply="map of counters")
declare("*", "_stop", "Ask the actor to stop after answering.", reply="{stopping: true}",
        reason=Field("str", False, "why, for the log"))
declare("*", "_peer_down", "Directory notice: a peer missed its heartbeats or deregistered.",
        name=Field("str", True), reason=Field("str", False))
declare("*", "_peer_up", "Directory notice: a peer (re)registered, possibly at a new endpoint.",
        name=Field("str", True), endpoint=Field("str", True))

# Directory: name -> endpoint, heartbeats, liveness notices
declare("directory", "register", "Register an actor's endpoint; notifies watchers with _peer_up.",
        reply="{ok: true, heartbeat_interval, liveness}",
        name="str", endpoint="str", pid="int?", host="str?", meta="dict?")
declare("directory", "deregister", "Remove an actor that stops cleanly (no _peer_down for it).", name="str")
declare("directory", "lookup", "Endpoint of a name; waits up to `wait` seconds for it to register.",
        reply="endpoint string", name="str", wait="float?")
declare("directory", "list", "Every registered actor with its endpoint, pid, host, liveness.",
        reply="{name: {endpoint, pid, host, alive, last_seen}}")
declare("directory", "watch", "Subscribe `name` to _peer_down/_peer_up notices.", name="str")

# Node agents (slime_actors/launch/job.py: one per node of a multi-node job; the head's stops the others)
declare("agent", "processes", "The processes this node's launcher started and supervises.",
        reply="{name: {pid, alive, restarts, exit_codes}}")
declare("agent", "node_failed", "Another node's agent gave up (restart intensity exceeded): the head stops the job.",
        node="str", reason="str")
declare("agent", "stop_node", "Stop this node's processes and its agent (the job ended, or failed elsewhere).",
        reply="{stopping: true, processes}", reason="str?")


def catalog_markdown() -> str:
    """The catalog as a Markdown table (docs/wire-format.md)."""
    rows = ["| role | method | fields (`?` optional) | reply | what |", "|---|---|---|---|---|"]
    for (role, method), s in sorted(CATALOG.items()):
        fields = ", ".join(f"`{n}{'' if f.required else '?'}: {f.type}`" for n, f in s.fields.items()) or "—"
        cells = [role, f"`{method}`", fields, s.reply, s.doc]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")  # a | in a cell is escaped
    return "\n".join(rows)



# ------------------------------------------------------------------------------------------------------------------
# Replies with a type on the asker's side (the wire carries the map; a typed handle hands back the type)

class ReplyError(ValueError):
    """A reply that lacks what its declared type needs."""


def _needs(where: str, reply: Any, need: tuple[str, ...], what: str = "its type needs") -> dict:
    """`reply` if it is a map holding every key of `need`, else a ReplyError naming what came and what is missing."""
    if not isinstance(reply, dict) or not all(k in reply for k in need):
        have = sorted(reply) if isinstance(reply, dict) else type(reply).__name__
        raise ReplyError(f"{where} replied {have}; {what} {', '.join(need)}")
    return reply


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
    """buffer.get_work's reply: the groups leased to the worker (none when nothing came within `wait`)."""
    groups: list[WorkGroup]

    @classmethod
    def from_wire(cls, reply: Any) -> Work:
        _needs("buffer.get_work", reply, ("groups",))
        return cls([WorkGroup.from_wire(g) for g in reply["groups"]])


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
    the `reason` it was not (it was not leased to that worker)."""
    requeued: bool
    partial: bool = False
    reason: str | None = None

    @classmethod
    def from_wire(cls, reply: Any) -> Returned:
        _needs("buffer.return_work", reply, ("requeued",))
        return cls(bool(reply["requeued"]), bool(reply.get("partial")), reply.get("reason"))


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


# ------------------------------------------------------------------------------------------------------------------
# The RL loop (docs/architecture.md). A "group" on the wire: {work_id, rollout_id, kind ("train"|"eval"),
# group_index, sampling_params, samples: [Sample.to_wire()...]}.

# controller
declare("controller", "engine_ready", "A rollout worker's engine is (re)started and serving at `weight_version`.",
        worker="str", weight_version="int")
declare("controller", "rollout_failed", "A rollout worker cannot go on (an environment failed under --env-error stop): "
        "the job ends with `error`.", worker="str", error="str")
declare("controller", "status", "Where the loop is: rollout id, weight version, phase, metrics of the last step.",
        reply="map")
declare("controller", "trainer_join", "A trainer rank joins the training group (rank 0 offers the store's address and "
        "port); answered once every rank of this generation joined.",
        reply="{master_addr, master_port, generation, checkpoint}", returns=Joined,
        rank="int", world_size="int", addr="str", port="int", pid="int")
declare("controller", "trainer_ready", "A trainer rank of `generation` has its process group and its checkpoint.",
        rank="int", generation="int", weight_version="int?")

# buffer
declare("buffer", "start_rollout", "Prepare the prompt groups of a rollout (train) or an evaluation (eval).",
        reply="{groups, rollout_id, kind}", rollout_id="int", kind="str?", weight_version="int?", name="str?")
declare("buffer", "get_work", "A rollout worker pulls up to `max_groups` groups; waits up to `wait` s for some.",
        reply="{groups: [group]}", returns=Work, worker="str", max_groups="int", wait="float?")
declare("buffer", "submit", "A rollout worker hands back a finished, scored group (completed or failed).",
        reply="{accepted, reason?, outcome?}", returns=Submitted, worker="str", work_id="str", samples="list")
declare("buffer", "return_work", "A rollout worker gives back work it could not finish (abort, engine restart).",
        reply="{requeued, partial?, reason?}", returns=Returned, worker="str", work_id="str", samples="list?",
        reason="str?")
declare("buffer", "release_worker", "Re-issue every group leased to a worker (it died or its engine restarted).",
        reply="{requeued}", returns=Released, worker="str", reason="str?")
declare("buffer", "wait_rollout",
        "Wait until the rollout (or eval) has its groups; returns its statistics (a training rollout's with hack: "
        "the reward-hacking monitor's report, unless --hack-alarms off).",
        reply="{complete, groups, samples, filtered, failed, reward_mean, ..., hack?}", returns=RolloutStats,
        rollout_id="int", kind="str?", timeout="float?")
declare("buffer", "get_batch", "A trainer rank pulls its shard (whole groups) of a completed rollout.",
        reply="batch map (slime_actors.types.batch_from_samples)", returns=TrainBatch, rollout_id="int", rank="int",
        world_size="int")
declare("buffer", "mark_trained", "Record that a rollout's samples were trained on (accounting, then freed).",
        rollout_id="int")
declare("buffer", "accounting", "Per sample index: times handed out, submitted, trained; lost/duplicated checks.",
        reply="map")
declare("buffer", "save", "Write the buffer state (dataset position, queued and partial groups) to `path`.",
        path="str")
declare("buffer", "rollback", "Back to a checkpoint's snapshot (the training group restarted from it) when the buffer "
        "holds rollouts from `if_ahead_of` on; discarded trainings are accounted. Idempotent per `token`.",
        reply="{rolled_back, trained_rollouts_discarded, samples_discarded, epoch, ...}", path="str?",
        if_ahead_of="int?", reason="str?", token="str?")
declare("buffer", "eval_results", "Per-sample results of a finished eval (prompt, response, reward, label).",
        reply="list", rollout_id="int")
declare("buffer", "dump_rollout", "All samples of a completed rollout (for --save-debug-rollout-data).",
        reply="list", rollout_id="int")
declare("buffer", "load_rollout", "Insert samples as a completed rollout (for --load-debug-rollout-data).",
        reply="{groups}", rollout_id="int", samples="list")

# rollout
declare("rollout", "resume", "Start (or continue) pulling work at `weight_version`.", weight_version="int")
declare("rollout", "pause", "Stop pulling new work and pause the engine (/pause_generation, --pause-generation-mode; "
        "abort=true: mode abort).", reply="{in_flight, mode}", abort="bool?")
declare("rollout", "end_rollout", "The rollout is complete: abort what is in flight and return it to the buffer.",
        reply="{aborted, returned}", rollout_id="int")
declare("rollout", "init_weights_group", "Have the engine join the trainer's weight-broadcast group.",
        reply="engine answer", master_address="str", master_port="int", rank_offset="int", world_size="int",
        group_name="str", backend="str")
declare("rollout", "update_weights_from_distributed", "Have the engine receive one bucket by broadcast.",
        reply="engine answer", names="list", dtypes="list", shapes="list", group_name="str",
        weight_version="int", flush_cache="bool?", load_format="str?")
declare("rollout", "destroy_weights_group", "Leave the weight-broadcast group.", group_name="str")
declare("rollout", "update_weights_from_disk", "Have the engine load weights from an HF directory.",
        reply="engine answer", model_path="str", weight_version="int")
declare("rollout", "load_lora_adapter", "--lora-sync adapter: the trainer's LoRA adapters (PEFT's tensor names, CPU "
        "tensors) for `weight_version`; the worker writes them as an adapter directory and loads it into its engine.",
        reply="{lora_name, loaded}", replay_arrays=False, weight_version="int", tensors="dict", config="dict")
declare("rollout", "held_groups", "Work ids the worker holds (the buffer reconciles its leases after a restart).",
        reply="list")
declare("rollout", "engine_info", "The engine's URL, weight version, health and counters.", reply="map")
declare("rollout", "weight_update", "The trainer updates the engine directly (colocated tensors): hold health probes "
        "while active; then the version it holds.", reply="{engine_url, paused, flush_cache, tp_size}",
        returns=DirectUpdate, active="bool", weight_version="int?")
declare("rollout", "router_url", "rollout/0: the URL of the sglang-router it started (waits until it is up).",
        reply="{url}", returns=RouterUrl)
declare("rollout", "kill_engine", "Kill the engine process (fault-injection and tests); the worker restarts it.",
        reply="{pid}", hang="bool?")

# reward
declare("reward", "score", "Score samples; per-sample rewards and errors (a failing function loses nothing).",
        reply="{rewards: [float|None], errors: [str|None], timed_out?: [bool]}", returns=Scores, samples="list",
        group="bool?")

# retriever
declare("retriever", "address", "Where this replica serves Search-R1's POST /retrieve (a restarted one: a new port), "
        "with its corpus and counters.", reply="{url, docs, corpus_sha256, requests, queries}", returns=RetrieverAddress)

# trainer
declare("trainer", "train", "Pull this rank's shard of the rollout and run the RL update on it.",
        reply="metrics map", rollout_id="int")
declare("trainer", "sync_weights", "Rank 0: push the current weights to the rollout workers.",
        reply="{seconds, bytes, buckets, transport}", weight_version="int", workers="list",
        transport="str?", rebuild="bool?")
declare("trainer", "save", "Save this rank's model/optimizer/RNG state under `path`.", path="str",
        save_optim="bool?")
declare("trainer", "abort_group", "Leave the training group of `generation` (broken: a rank died); the rank exits with "
        "code 75 and its supervisor restarts it.", reply="{left}", generation="int", reason="str?")
declare("trainer", "save_hf", "Every rank: export the policy as a Hugging Face directory at `path` (rank 0 writes; "
        "--save-hf after `rollout_id`).", path="str", rollout_id="int?")
declare("trainer", "log_probs", "Log-probs of given samples under the current actor (checks and tests).",
        reply="list of lists", samples="list")


if __name__ == "__main__":  # after every declaration above: the whole catalog (docs/wire-format.md)
    print(catalog_markdown())
