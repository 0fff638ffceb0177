"""Typed handles per role, generated from slime_actors/messages.py by `python -m slime_actors.handles`: do
not edit (tests/test_handles.py fails when this file is stale). What the methods run: handles.py."""

from __future__ import annotations

import builtins
from collections.abc import Awaitable
from typing import Any

from .handles import UNSET, Group, Handle, Tell
from .messages import (Accounting, AdapterLoaded, Array, DirectUpdate, EngineAnswer, EvalResponse, GroupLeft, Joined,
                       Killed, NodeStopping, Paused, PeerEntry, Ping, ProcessEntry, Registered, Released,
                       RetrieverAddress, Returned, RolledBack, RolloutEnded, RolloutLoaded, RolloutStarted,
                       RolloutStats, RouterUrl, SampleMap, Scores, Status, Stopping, Submitted, TrainBatch,
                       TrainMetrics, WeightsSynced, Work)


class ActorHandle(Handle):
    """Asks to any actor: the built-in messages every actor takes (each role's handle derives from this class)."""

    role = "*"

    def _ping(self, *, ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[Ping]:
        """Liveness and identity check.

        Reply: {name, role, index, pid, host, uptime}."""
        return self._call("_ping", locals())

    def _stats(self, *, ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[dict[str, int]]:
        """Mailbox and handler counters.

        Reply: map of counters."""
        return self._call("_stats", locals())

    def _stop(self, *, reason: str | None = UNSET, ask_timeout: float | None = None,
              idem: str | None = None) -> Awaitable[Stopping]:
        """Ask the actor to stop after answering.

        Reply: {stopping: true}."""
        return self._call("_stop", locals())

    def _peer_down(self, name: str, *, reason: str | None = UNSET, ask_timeout: float | None = None,
                   idem: str | None = None) -> Awaitable[None]:
        """Directory notice: a peer missed its heartbeats or deregistered."""
        return self._call("_peer_down", locals())

    def _peer_up(self, name: str, endpoint: str, *, ask_timeout: float | None = None,
                 idem: str | None = None) -> Awaitable[None]:
        """Directory notice: a peer (re)registered, possibly at a new endpoint."""
        return self._call("_peer_up", locals())


class ActorTell(Tell):
    """One-way messages to any actor: the built-in ones (each role's Tell derives from this class)."""

    role = "*"

    def _ping(self) -> Awaitable[None]:
        """Liveness and identity check."""
        return self._call("_ping", locals())

    def _stats(self) -> Awaitable[None]:
        """Mailbox and handler counters."""
        return self._call("_stats", locals())

    def _stop(self, *, reason: str | None = UNSET) -> Awaitable[None]:
        """Ask the actor to stop after answering."""
        return self._call("_stop", locals())

    def _peer_down(self, name: str, *, reason: str | None = UNSET) -> Awaitable[None]:
        """Directory notice: a peer missed its heartbeats or deregistered."""
        return self._call("_peer_down", locals())

    def _peer_up(self, name: str, endpoint: str) -> Awaitable[None]:
        """Directory notice: a peer (re)registered, possibly at a new endpoint."""
        return self._call("_peer_up", locals())


class DirectoryHandle(ActorHandle):
    """Asks to one directory actor (`directory/N`): each method sends its message and waits for the reply."""

    role = "directory"

    @property
    def tell(self) -> DirectoryTell:
        return DirectoryTell(self)

    def register(self, name: str, endpoint: str, *, pid: int | None = UNSET, host: str | None = UNSET,
                 meta: dict[str, Any] | None = UNSET, ask_timeout: float | None = None,
                 idem: str | None = None) -> Awaitable[Registered]:
        """Register an actor's endpoint; notifies watchers with _peer_up.

        Reply: {ok: true, heartbeat_interval, liveness}."""
        return self._call("register", locals())

    def deregister(self, name: str, *, ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[None]:
        """Remove an actor that stops cleanly (no _peer_down for it)."""
        return self._call("deregister", locals())

    def lookup(self, name: str, *, wait: float | None = UNSET, ask_timeout: float | None = None,
               idem: str | None = None) -> Awaitable[str]:
        """Endpoint of a name; waits up to `wait` seconds for it to register.

        Reply: endpoint string."""
        return self._call("lookup", locals())

    def list(self, *, ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[dict[str, PeerEntry]]:
        """Every registered actor with its endpoint, pid, host, liveness.

        Reply: {name: {endpoint, pid, host, alive, last_seen}}."""
        return self._call("list", locals())

    def watch(self, name: str, *, ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[None]:
        """Subscribe `name` to _peer_down/_peer_up notices."""
        return self._call("watch", locals())


class DirectoryTell(ActorTell):
    """One-way messages to one directory actor or to every member of a group (no reply)."""

    role = "directory"

    @property
    def quietly(self) -> DirectoryTell:
        """The same members; one that cannot be told is left out."""
        return DirectoryTell(self.to, quiet=True)

    def register(self, name: str, endpoint: str, *, pid: int | None = UNSET, host: str | None = UNSET,
                 meta: dict[str, Any] | None = UNSET) -> Awaitable[None]:
        """Register an actor's endpoint; notifies watchers with _peer_up."""
        return self._call("register", locals())

    def deregister(self, name: str) -> Awaitable[None]:
        """Remove an actor that stops cleanly (no _peer_down for it)."""
        return self._call("deregister", locals())

    def lookup(self, name: str, *, wait: float | None = UNSET) -> Awaitable[None]:
        """Endpoint of a name; waits up to `wait` seconds for it to register."""
        return self._call("lookup", locals())

    def list(self) -> Awaitable[None]:
        """Every registered actor with its endpoint, pid, host, liveness."""
        return self._call("list", locals())

    def watch(self, name: str) -> Awaitable[None]:
        """Subscribe `name` to _peer_down/_peer_up notices."""
        return self._call("watch", locals())


class DirectoryGroup(Group[DirectoryHandle]):
    """Asks to several directory actors at once: their replies in member order (GroupFailed when one fails)."""

    role = "directory"

    @property
    def tell(self) -> DirectoryTell:
        return DirectoryTell(self)

    @property
    def quietly(self) -> DirectoryQuiet:
        return DirectoryQuiet(self.members)

    def register(self, name: str, endpoint: str, *, pid: int | None = UNSET, host: str | None = UNSET,
                 meta: dict[str, Any] | None = UNSET, ask_timeout: float | None = None,
                 idem: str | None = None) -> Awaitable[builtins.list[Registered]]:
        """Register an actor's endpoint; notifies watchers with _peer_up.

        Reply: {ok: true, heartbeat_interval, liveness}."""
        return self._call("register", locals())

    def deregister(self, name: str, *, ask_timeout: float | None = None,
                   idem: str | None = None) -> Awaitable[builtins.list[None]]:
        """Remove an actor that stops cleanly (no _peer_down for it)."""
        return self._call("deregister", locals())

    def lookup(self, name: str, *, wait: float | None = UNSET, ask_timeout: float | None = None,
               idem: str | None = None) -> Awaitable[builtins.list[str]]:
        """Endpoint of a name; waits up to `wait` seconds for it to register.

        Reply: endpoint string."""
        return self._call("lookup", locals())

    def list(self, *, ask_timeout: float | None = None,
             idem: str | None = None) -> Awaitable[builtins.list[dict[str, PeerEntry]]]:
        """Every registered actor with its endpoint, pid, host, liveness.

        Reply: {name: {endpoint, pid, host, alive, last_seen}}."""
        return self._call("list", locals())

    def watch(self, name: str, *, ask_timeout: float | None = None,
              idem: str | None = None) -> Awaitable[builtins.list[None]]:
        """Subscribe `name` to _peer_down/_peer_up notices."""
        return self._call("watch", locals())


class DirectoryQuiet(Group[DirectoryHandle]):
    """Asks to several directory actors at once; a member that fails answers None."""

    role = "directory"
    quiet = True

    def register(self, name: str, endpoint: str, *, pid: int | None = UNSET, host: str | None = UNSET,
                 meta: dict[str, Any] | None = UNSET, ask_timeout: float | None = None,
                 idem: str | None = None) -> Awaitable[builtins.list[Registered | None]]:
        """Register an actor's endpoint; notifies watchers with _peer_up.

        Reply: {ok: true, heartbeat_interval, liveness}."""
        return self._call("register", locals())

    def deregister(self, name: str, *, ask_timeout: float | None = None,
                   idem: str | None = None) -> Awaitable[builtins.list[None | None]]:
        """Remove an actor that stops cleanly (no _peer_down for it)."""
        return self._call("deregister", locals())

    def lookup(self, name: str, *, wait: float | None = UNSET, ask_timeout: float | None = None,
               idem: str | None = None) -> Awaitable[builtins.list[str | None]]:
        """Endpoint of a name; waits up to `wait` seconds for it to register.

        Reply: endpoint string."""
        return self._call("lookup", locals())

    def list(self, *, ask_timeout: float | None = None,
             idem: str | None = None) -> Awaitable[builtins.list[dict[str, PeerEntry] | None]]:
        """Every registered actor with its endpoint, pid, host, liveness.

        Reply: {name: {endpoint, pid, host, alive, last_seen}}."""
        return self._call("list", locals())

    def watch(self, name: str, *, ask_timeout: float | None = None,
              idem: str | None = None) -> Awaitable[builtins.list[None | None]]:
        """Subscribe `name` to _peer_down/_peer_up notices."""
        return self._call("watch", locals())


class AgentHandle(ActorHandle):
    """Asks to one agent actor (`agent/N`): each method sends its message and waits for the reply."""

    role = "agent"

    @property
    def tell(self) -> AgentTell:
        return AgentTell(self)

    def processes(self, *, ask_timeout: float | None = None,
                  idem: str | None = None) -> Awaitable[dict[str, ProcessEntry]]:
        """The processes this node's launcher started and supervises.

        Reply: {name: {pid, alive, restarts, exit_codes}}."""
        return self._call("processes", locals())

    def node_failed(self, node: str, reason: str, *, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[None]:
        """Another node's agent gave up (restart intensity exceeded): the head stops the job."""
        return self._call("node_failed", locals())

    def stop_node(self, *, reason: str | None = UNSET, ask_timeout: float | None = None,
                  idem: str | None = None) -> Awaitable[NodeStopping]:
        """Stop this node's processes and its agent (the job ended, or failed elsewhere).

        Reply: {stopping: true, processes}."""
        return self._call("stop_node", locals())


class AgentTell(ActorTell):
    """One-way messages to one agent actor or to every member of a group (no reply)."""

    role = "agent"

    @property
    def quietly(self) -> AgentTell:
        """The same members; one that cannot be told is left out."""
        return AgentTell(self.to, quiet=True)

    def processes(self) -> Awaitable[None]:
        """The processes this node's launcher started and supervises."""
        return self._call("processes", locals())

    def node_failed(self, node: str, reason: str) -> Awaitable[None]:
        """Another node's agent gave up (restart intensity exceeded): the head stops the job."""
        return self._call("node_failed", locals())

    def stop_node(self, *, reason: str | None = UNSET) -> Awaitable[None]:
        """Stop this node's processes and its agent (the job ended, or failed elsewhere)."""
        return self._call("stop_node", locals())


class AgentGroup(Group[AgentHandle]):
    """Asks to several agent actors at once: their replies in member order (GroupFailed when one fails)."""

    role = "agent"

    @property
    def tell(self) -> AgentTell:
        return AgentTell(self)

    @property
    def quietly(self) -> AgentQuiet:
        return AgentQuiet(self.members)

    def processes(self, *, ask_timeout: float | None = None,
                  idem: str | None = None) -> Awaitable[list[dict[str, ProcessEntry]]]:
        """The processes this node's launcher started and supervises.

        Reply: {name: {pid, alive, restarts, exit_codes}}."""
        return self._call("processes", locals())

    def node_failed(self, node: str, reason: str, *, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[list[None]]:
        """Another node's agent gave up (restart intensity exceeded): the head stops the job."""
        return self._call("node_failed", locals())

    def stop_node(self, *, reason: str | None = UNSET, ask_timeout: float | None = None,
                  idem: str | None = None) -> Awaitable[list[NodeStopping]]:
        """Stop this node's processes and its agent (the job ended, or failed elsewhere).

        Reply: {stopping: true, processes}."""
        return self._call("stop_node", locals())


class AgentQuiet(Group[AgentHandle]):
    """Asks to several agent actors at once; a member that fails answers None."""

    role = "agent"
    quiet = True

    def processes(self, *, ask_timeout: float | None = None,
                  idem: str | None = None) -> Awaitable[list[dict[str, ProcessEntry] | None]]:
        """The processes this node's launcher started and supervises.

        Reply: {name: {pid, alive, restarts, exit_codes}}."""
        return self._call("processes", locals())

    def node_failed(self, node: str, reason: str, *, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[list[None | None]]:
        """Another node's agent gave up (restart intensity exceeded): the head stops the job."""
        return self._call("node_failed", locals())

    def stop_node(self, *, reason: str | None = UNSET, ask_timeout: float | None = None,
                  idem: str | None = None) -> Awaitable[list[NodeStopping | None]]:
        """Stop this node's processes and its agent (the job ended, or failed elsewhere).

        Reply: {stopping: true, processes}."""
        return self._call("stop_node", locals())


class ControllerHandle(ActorHandle):
    """Asks to one controller actor (`controller/N`): each method sends its message and waits for the reply."""

    role = "controller"

    @property
    def tell(self) -> ControllerTell:
        return ControllerTell(self)

    def engine_ready(self, worker: str, weight_version: int, *, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[None]:
        """A rollout worker's engine is (re)started and serving at `weight_version`."""
        return self._call("engine_ready", locals())

    def rollout_failed(self, worker: str, error: str, *, ask_timeout: float | None = None,
                       idem: str | None = None) -> Awaitable[None]:
        """A rollout worker cannot go on (an environment failed under --env-error stop): the job ends with `error`."""
        return self._call("rollout_failed", locals())

    def status(self, *, ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[Status]:
        """Where the loop is: rollout id, weight version, phase, metrics of the last step.

        Reply: {phase, rollout_id, weight_version, engines, last, steps, num_rollout, ...}."""
        return self._call("status", locals())

    def trainer_join(self, rank: int, world_size: int, addr: str, port: int, pid: int, *,
                     ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[Joined]:
        """A trainer rank joins the training group (rank 0 offers the store's address and port); answered once every
        rank of this generation joined.

        Reply: {master_addr, master_port, generation, checkpoint}."""
        return self._call("trainer_join", locals())

    def trainer_ready(self, rank: int, generation: int, *, weight_version: int | None = UNSET,
                      ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[None]:
        """A trainer rank of `generation` has its process group and its checkpoint."""
        return self._call("trainer_ready", locals())


class ControllerTell(ActorTell):
    """One-way messages to one controller actor or to every member of a group (no reply)."""

    role = "controller"

    @property
    def quietly(self) -> ControllerTell:
        """The same members; one that cannot be told is left out."""
        return ControllerTell(self.to, quiet=True)

    def engine_ready(self, worker: str, weight_version: int) -> Awaitable[None]:
        """A rollout worker's engine is (re)started and serving at `weight_version`."""
        return self._call("engine_ready", locals())

    def rollout_failed(self, worker: str, error: str) -> Awaitable[None]:
        """A rollout worker cannot go on (an environment failed under --env-error stop): the job ends with `error`."""
        return self._call("rollout_failed", locals())

    def status(self) -> Awaitable[None]:
        """Where the loop is: rollout id, weight version, phase, metrics of the last step."""
        return self._call("status", locals())

    def trainer_join(self, rank: int, world_size: int, addr: str, port: int, pid: int) -> Awaitable[None]:
        """A trainer rank joins the training group (rank 0 offers the store's address and port); answered once every
        rank of this generation joined."""
        return self._call("trainer_join", locals())

    def trainer_ready(self, rank: int, generation: int, *, weight_version: int | None = UNSET) -> Awaitable[None]:
        """A trainer rank of `generation` has its process group and its checkpoint."""
        return self._call("trainer_ready", locals())


class ControllerGroup(Group[ControllerHandle]):
    """Asks to several controller actors at once: their replies in member order (GroupFailed when one fails)."""

    role = "controller"

    @property
    def tell(self) -> ControllerTell:
        return ControllerTell(self)

    @property
    def quietly(self) -> ControllerQuiet:
        return ControllerQuiet(self.members)

    def engine_ready(self, worker: str, weight_version: int, *, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[list[None]]:
        """A rollout worker's engine is (re)started and serving at `weight_version`."""
        return self._call("engine_ready", locals())

    def rollout_failed(self, worker: str, error: str, *, ask_timeout: float | None = None,
                       idem: str | None = None) -> Awaitable[list[None]]:
        """A rollout worker cannot go on (an environment failed under --env-error stop): the job ends with `error`."""
        return self._call("rollout_failed", locals())

    def status(self, *, ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[list[Status]]:
        """Where the loop is: rollout id, weight version, phase, metrics of the last step.

        Reply: {phase, rollout_id, weight_version, engines, last, steps, num_rollout, ...}."""
        return self._call("status", locals())

    def trainer_join(self, rank: int, world_size: int, addr: str, port: int, pid: int, *,
                     ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[list[Joined]]:
        """A trainer rank joins the training group (rank 0 offers the store's address and port); answered once every
        rank of this generation joined.

        Reply: {master_addr, master_port, generation, checkpoint}."""
        return self._call("trainer_join", locals())

    def trainer_ready(self, rank: int, generation: int, *, weight_version: int | None = UNSET,
                      ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[list[None]]:
        """A trainer rank of `generation` has its process group and its checkpoint."""
        return self._call("trainer_ready", locals())


class ControllerQuiet(Group[ControllerHandle]):
    """Asks to several controller actors at once; a member that fails answers None."""

    role = "controller"
    quiet = True

    def engine_ready(self, worker: str, weight_version: int, *, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[list[None | None]]:
        """A rollout worker's engine is (re)started and serving at `weight_version`."""
        return self._call("engine_ready", locals())

    def rollout_failed(self, worker: str, error: str, *, ask_timeout: float | None = None,
                       idem: str | None = None) -> Awaitable[list[None | None]]:
        """A rollout worker cannot go on (an environment failed under --env-error stop): the job ends with `error`."""
        return self._call("rollout_failed", locals())

    def status(self, *, ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[list[Status | None]]:
        """Where the loop is: rollout id, weight version, phase, metrics of the last step.

        Reply: {phase, rollout_id, weight_version, engines, last, steps, num_rollout, ...}."""
        return self._call("status", locals())

    def trainer_join(self, rank: int, world_size: int, addr: str, port: int, pid: int, *,
                     ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[list[Joined | None]]:
        """A trainer rank joins the training group (rank 0 offers the store's address and port); answered once every
        rank of this generation joined.

        Reply: {master_addr, master_port, generation, checkpoint}."""
        return self._call("trainer_join", locals())

    def trainer_ready(self, rank: int, generation: int, *, weight_version: int | None = UNSET,
                      ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[list[None | None]]:
        """A trainer rank of `generation` has its process group and its checkpoint."""
        return self._call("trainer_ready", locals())


class BufferHandle(ActorHandle):
    """Asks to one buffer actor (`buffer/N`): each method sends its message and waits for the reply."""

    role = "buffer"

    @property
    def tell(self) -> BufferTell:
        return BufferTell(self)

    def start_rollout(self, rollout_id: int, *, kind: str | None = UNSET, weight_version: int | None = UNSET,
                      name: str | None = UNSET, hold: bool | None = UNSET, ask_timeout: float | None = None,
                      idem: str | None = None) -> Awaitable[RolloutStarted]:
        """Prepare the prompt groups of a rollout (train) or an evaluation (eval). `hold` (train): made now, handed out
        once started again without it (which opens it).

        Reply: {groups, rollout_id, kind}."""
        return self._call("start_rollout", locals())

    def get_work(self, worker: str, max_groups: int, *, wait: float | None = UNSET, ahead: bool | None = UNSET,
                 ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[Work]:
        """A rollout worker pulls up to `max_groups` groups; waits up to `wait` s for some. `ahead`: groups of the
        rollout made ahead (held), at once, with the weight version the worker starts them at.

        Reply: {groups: [group]}."""
        return self._call("get_work", locals())

    def submit(self, worker: str, work_id: str, samples: list[SampleMap], *, ask_timeout: float | None = None,
               idem: str | None = None) -> Awaitable[Submitted]:
        """A rollout worker hands back a finished, scored group (completed or failed).

        Reply: {accepted, reason?, outcome?}."""
        return self._call("submit", locals())

    def return_work(self, worker: str, work_id: str, *, samples: list[SampleMap] | None = UNSET,
                    reason: str | None = UNSET, failed: bool | None = UNSET, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[Returned]:
        """A rollout worker gives back work it could not finish (abort, engine restart). `failed`: its generation
        raised or its samples were refused (`reason` says how); the third time, the group is recorded as failed.

        Reply: {requeued, partial?, failed?, reason?}."""
        return self._call("return_work", locals())

    def release_worker(self, worker: str, *, reason: str | None = UNSET, ask_timeout: float | None = None,
                       idem: str | None = None) -> Awaitable[Released]:
        """Re-issue every group leased to a worker (it died or its engine restarted).

        Reply: {requeued}."""
        return self._call("release_worker", locals())

    def wait_rollout(self, rollout_id: int, *, kind: str | None = UNSET, timeout: float | None = UNSET,
                     hack: bool | None = UNSET, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[RolloutStats]:
        """Wait until the rollout (or eval) has its groups; returns its statistics (a complete training rollout's with
        batch_id, what names its batch; with hack: the reward-hacking monitor's report, unless --hack-alarms off).
        `hack` false: the reply does not wait for the report -- the monitor starts on the complete rollout and
        `hack_report` answers it.

        Reply: {complete, groups, samples, filtered, failed, reward_mean, ..., batch_id?, hack?}."""
        return self._call("wait_rollout", locals())

    def hack_report(self, rollout_id: int, *, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[dict[str, Any] | None]:
        """The reward-hacking monitor's report on a complete training rollout (what wait_rollout's `hack` holds),
        waiting for it while the monitor runs; nil with --hack-alarms off or once the rollout is trained.

        Reply: {rollout_id, metrics, alarms, skipped} | {rollout_id, error} | nil."""
        return self._call("hack_report", locals())

    def get_batch(self, rollout_id: int, rank: int, world_size: int, *, packed: bool | None = UNSET,
                  ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[TrainBatch]:
        """A trainer rank pulls its shard (whole groups) of a completed rollout (`packed`: tokens, loss masks and
        rollout log-probs as packed columns, types.pack_rows).

        Reply: batch map (slime_actors.types.batch_from_samples)."""
        return self._call("get_batch", locals())

    def wait_batch(self, rollout_id: int, rank: int, world_size: int, *, packed: bool | None = UNSET,
                   timeout: float | None = UNSET, ask_timeout: float | None = None,
                   idem: str | None = None) -> Awaitable[dict[str, Any] | None]:
        """A trainer rank asks for its shard of a training rollout before the rollout is complete (after training on
        the one before): answered once it is, with the batch's id (wait_rollout's `batch_id`); nil after `timeout`
        s, or when the rollout was rolled back or trained meanwhile.

        Reply: {batch_id, batch} | nil."""
        return self._call("wait_batch", locals())

    def mark_trained(self, rollout_id: int, *, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[None]:
        """Record that a rollout's samples were trained on (accounting, then freed)."""
        return self._call("mark_trained", locals())

    def accounting(self, *, ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[Accounting]:
        """Per sample index: times handed out, submitted, trained; lost/duplicated checks.

        Reply: {issued, trained_once, trained_more, untrained, lost, duplicated, ...}."""
        return self._call("accounting", locals())

    def save(self, path: str, *, ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[None]:
        """Write the buffer state (dataset position, queued and partial groups) to `path`."""
        return self._call("save", locals())

    def rollback(self, *, path: str | None = UNSET, if_ahead_of: int | None = UNSET, reason: str | None = UNSET,
                 token: str | None = UNSET, ask_timeout: float | None = None,
                 idem: str | None = None) -> Awaitable[RolledBack]:
        """Back to a checkpoint's snapshot (the training group restarted from it) when the buffer holds rollouts from
        `if_ahead_of` on; discarded trainings are accounted. Idempotent per `token`.

        Reply: {rolled_back, trained_rollouts_discarded, samples_discarded, epoch, ...}."""
        return self._call("rollback", locals())

    def eval_results(self, rollout_id: int, *, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[list[EvalResponse]]:
        """Per-sample results of a finished eval (prompt, response, reward, label).

        Reply: list."""
        return self._call("eval_results", locals())

    def dump_rollout(self, rollout_id: int, *, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[list[SampleMap]]:
        """All samples of a completed rollout (for --save-debug-rollout-data).

        Reply: list."""
        return self._call("dump_rollout", locals())

    def load_rollout(self, rollout_id: int, samples: list[SampleMap], *, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[RolloutLoaded]:
        """Insert samples as a completed rollout (for --load-debug-rollout-data).

        Reply: {groups}."""
        return self._call("load_rollout", locals())


class BufferTell(ActorTell):
    """One-way messages to one buffer actor or to every member of a group (no reply)."""

    role = "buffer"

    @property
    def quietly(self) -> BufferTell:
        """The same members; one that cannot be told is left out."""
        return BufferTell(self.to, quiet=True)

    def start_rollout(self, rollout_id: int, *, kind: str | None = UNSET, weight_version: int | None = UNSET,
                      name: str | None = UNSET, hold: bool | None = UNSET) -> Awaitable[None]:
        """Prepare the prompt groups of a rollout (train) or an evaluation (eval). `hold` (train): made now, handed out
        once started again without it (which opens it)."""
        return self._call("start_rollout", locals())

    def get_work(self, worker: str, max_groups: int, *, wait: float | None = UNSET,
                 ahead: bool | None = UNSET) -> Awaitable[None]:
        """A rollout worker pulls up to `max_groups` groups; waits up to `wait` s for some. `ahead`: groups of the
        rollout made ahead (held), at once, with the weight version the worker starts them at."""
        return self._call("get_work", locals())

    def submit(self, worker: str, work_id: str, samples: list[SampleMap]) -> Awaitable[None]:
        """A rollout worker hands back a finished, scored group (completed or failed)."""
        return self._call("submit", locals())

    def return_work(self, worker: str, work_id: str, *, samples: list[SampleMap] | None = UNSET,
                    reason: str | None = UNSET, failed: bool | None = UNSET) -> Awaitable[None]:
        """A rollout worker gives back work it could not finish (abort, engine restart). `failed`: its generation
        raised or its samples were refused (`reason` says how); the third time, the group is recorded as failed."""
        return self._call("return_work", locals())

    def release_worker(self, worker: str, *, reason: str | None = UNSET) -> Awaitable[None]:
        """Re-issue every group leased to a worker (it died or its engine restarted)."""
        return self._call("release_worker", locals())

    def wait_rollout(self, rollout_id: int, *, kind: str | None = UNSET, timeout: float | None = UNSET,
                     hack: bool | None = UNSET) -> Awaitable[None]:
        """Wait until the rollout (or eval) has its groups; returns its statistics (a complete training rollout's with
        batch_id, what names its batch; with hack: the reward-hacking monitor's report, unless --hack-alarms off).
        `hack` false: the reply does not wait for the report -- the monitor starts on the complete rollout and
        `hack_report` answers it."""
        return self._call("wait_rollout", locals())

    def hack_report(self, rollout_id: int) -> Awaitable[None]:
        """The reward-hacking monitor's report on a complete training rollout (what wait_rollout's `hack` holds),
        waiting for it while the monitor runs; nil with --hack-alarms off or once the rollout is trained."""
        return self._call("hack_report", locals())

    def get_batch(self, rollout_id: int, rank: int, world_size: int, *, packed: bool | None = UNSET) -> Awaitable[None]:
        """A trainer rank pulls its shard (whole groups) of a completed rollout (`packed`: tokens, loss masks and
        rollout log-probs as packed columns, types.pack_rows)."""
        return self._call("get_batch", locals())

    def wait_batch(self, rollout_id: int, rank: int, world_size: int, *, packed: bool | None = UNSET,
                   timeout: float | None = UNSET) -> Awaitable[None]:
        """A trainer rank asks for its shard of a training rollout before the rollout is complete (after training on
        the one before): answered once it is, with the batch's id (wait_rollout's `batch_id`); nil after `timeout`
        s, or when the rollout was rolled back or trained meanwhile."""
        return self._call("wait_batch", locals())

    def mark_trained(self, rollout_id: int) -> Awaitable[None]:
        """Record that a rollout's samples were trained on (accounting, then freed)."""
        return self._call("mark_trained", locals())

    def accounting(self) -> Awaitable[None]:
        """Per sample index: times handed out, submitted, trained; lost/duplicated checks."""
        return self._call("accounting", locals())

    def save(self, path: str) -> Awaitable[None]:
        """Write the buffer state (dataset position, queued and partial groups) to `path`."""
        return self._call("save", locals())

    def rollback(self, *, path: str | None = UNSET, if_ahead_of: int | None = UNSET, reason: str | None = UNSET,
                 token: str | None = UNSET) -> Awaitable[None]:
        """Back to a checkpoint's snapshot (the training group restarted from it) when the buffer holds rollouts from
        `if_ahead_of` on; discarded trainings are accounted. Idempotent per `token`."""
        return self._call("rollback", locals())

    def eval_results(self, rollout_id: int) -> Awaitable[None]:
        """Per-sample results of a finished eval (prompt, response, reward, label)."""
        return self._call("eval_results", locals())

    def dump_rollout(self, rollout_id: int) -> Awaitable[None]:
        """All samples of a completed rollout (for --save-debug-rollout-data)."""
        return self._call("dump_rollout", locals())

    def load_rollout(self, rollout_id: int, samples: list[SampleMap]) -> Awaitable[None]:
        """Insert samples as a completed rollout (for --load-debug-rollout-data)."""
        return self._call("load_rollout", locals())


class BufferGroup(Group[BufferHandle]):
    """Asks to several buffer actors at once: their replies in member order (GroupFailed when one fails)."""

    role = "buffer"

    @property
    def tell(self) -> BufferTell:
        return BufferTell(self)

    @property
    def quietly(self) -> BufferQuiet:
        return BufferQuiet(self.members)

    def start_rollout(self, rollout_id: int, *, kind: str | None = UNSET, weight_version: int | None = UNSET,
                      name: str | None = UNSET, hold: bool | None = UNSET, ask_timeout: float | None = None,
                      idem: str | None = None) -> Awaitable[list[RolloutStarted]]:
        """Prepare the prompt groups of a rollout (train) or an evaluation (eval). `hold` (train): made now, handed out
        once started again without it (which opens it).

        Reply: {groups, rollout_id, kind}."""
        return self._call("start_rollout", locals())

    def get_work(self, worker: str, max_groups: int, *, wait: float | None = UNSET, ahead: bool | None = UNSET,
                 ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[list[Work]]:
        """A rollout worker pulls up to `max_groups` groups; waits up to `wait` s for some. `ahead`: groups of the
        rollout made ahead (held), at once, with the weight version the worker starts them at.

        Reply: {groups: [group]}."""
        return self._call("get_work", locals())

    def submit(self, worker: str, work_id: str, samples: list[SampleMap], *, ask_timeout: float | None = None,
               idem: str | None = None) -> Awaitable[list[Submitted]]:
        """A rollout worker hands back a finished, scored group (completed or failed).

        Reply: {accepted, reason?, outcome?}."""
        return self._call("submit", locals())

    def return_work(self, worker: str, work_id: str, *, samples: list[SampleMap] | None = UNSET,
                    reason: str | None = UNSET, failed: bool | None = UNSET, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[list[Returned]]:
        """A rollout worker gives back work it could not finish (abort, engine restart). `failed`: its generation
        raised or its samples were refused (`reason` says how); the third time, the group is recorded as failed.

        Reply: {requeued, partial?, failed?, reason?}."""
        return self._call("return_work", locals())

    def release_worker(self, worker: str, *, reason: str | None = UNSET, ask_timeout: float | None = None,
                       idem: str | None = None) -> Awaitable[list[Released]]:
        """Re-issue every group leased to a worker (it died or its engine restarted).

        Reply: {requeued}."""
        return self._call("release_worker", locals())

    def wait_rollout(self, rollout_id: int, *, kind: str | None = UNSET, timeout: float | None = UNSET,
                     hack: bool | None = UNSET, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[list[RolloutStats]]:
        """Wait until the rollout (or eval) has its groups; returns its statistics (a complete training rollout's with
        batch_id, what names its batch; with hack: the reward-hacking monitor's report, unless --hack-alarms off).
        `hack` false: the reply does not wait for the report -- the monitor starts on the complete rollout and
        `hack_report` answers it.

        Reply: {complete, groups, samples, filtered, failed, reward_mean, ..., batch_id?, hack?}."""
        return self._call("wait_rollout", locals())

    def hack_report(self, rollout_id: int, *, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[list[dict[str, Any] | None]]:
        """The reward-hacking monitor's report on a complete training rollout (what wait_rollout's `hack` holds),
        waiting for it while the monitor runs; nil with --hack-alarms off or once the rollout is trained.

        Reply: {rollout_id, metrics, alarms, skipped} | {rollout_id, error} | nil."""
        return self._call("hack_report", locals())

    def get_batch(self, rollout_id: int, rank: int, world_size: int, *, packed: bool | None = UNSET,
                  ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[list[TrainBatch]]:
        """A trainer rank pulls its shard (whole groups) of a completed rollout (`packed`: tokens, loss masks and
        rollout log-probs as packed columns, types.pack_rows).

        Reply: batch map (slime_actors.types.batch_from_samples)."""
        return self._call("get_batch", locals())

    def wait_batch(self, rollout_id: int, rank: int, world_size: int, *, packed: bool | None = UNSET,
                   timeout: float | None = UNSET, ask_timeout: float | None = None,
                   idem: str | None = None) -> Awaitable[list[dict[str, Any] | None]]:
        """A trainer rank asks for its shard of a training rollout before the rollout is complete (after training on
        the one before): answered once it is, with the batch's id (wait_rollout's `batch_id`); nil after `timeout`
        s, or when the rollout was rolled back or trained meanwhile.

        Reply: {batch_id, batch} | nil."""
        return self._call("wait_batch", locals())

    def mark_trained(self, rollout_id: int, *, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[list[None]]:
        """Record that a rollout's samples were trained on (accounting, then freed)."""
        return self._call("mark_trained", locals())

    def accounting(self, *, ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[list[Accounting]]:
        """Per sample index: times handed out, submitted, trained; lost/duplicated checks.

        Reply: {issued, trained_once, trained_more, untrained, lost, duplicated, ...}."""
        return self._call("accounting", locals())

    def save(self, path: str, *, ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[list[None]]:
        """Write the buffer state (dataset position, queued and partial groups) to `path`."""
        return self._call("save", locals())

    def rollback(self, *, path: str | None = UNSET, if_ahead_of: int | None = UNSET, reason: str | None = UNSET,
                 token: str | None = UNSET, ask_timeout: float | None = None,
                 idem: str | None = None) -> Awaitable[list[RolledBack]]:
        """Back to a checkpoint's snapshot (the training group restarted from it) when the buffer holds rollouts from
        `if_ahead_of` on; discarded trainings are accounted. Idempotent per `token`.

        Reply: {rolled_back, trained_rollouts_discarded, samples_discarded, epoch, ...}."""
        return self._call("rollback", locals())

    def eval_results(self, rollout_id: int, *, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[list[list[EvalResponse]]]:
        """Per-sample results of a finished eval (prompt, response, reward, label).

        Reply: list."""
        return self._call("eval_results", locals())

    def dump_rollout(self, rollout_id: int, *, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[list[list[SampleMap]]]:
        """All samples of a completed rollout (for --save-debug-rollout-data).

        Reply: list."""
        return self._call("dump_rollout", locals())

    def load_rollout(self, rollout_id: int, samples: list[SampleMap], *, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[list[RolloutLoaded]]:
        """Insert samples as a completed rollout (for --load-debug-rollout-data).

        Reply: {groups}."""
        return self._call("load_rollout", locals())


class BufferQuiet(Group[BufferHandle]):
    """Asks to several buffer actors at once; a member that fails answers None."""

    role = "buffer"
    quiet = True

    def start_rollout(self, rollout_id: int, *, kind: str | None = UNSET, weight_version: int | None = UNSET,
                      name: str | None = UNSET, hold: bool | None = UNSET, ask_timeout: float | None = None,
                      idem: str | None = None) -> Awaitable[list[RolloutStarted | None]]:
        """Prepare the prompt groups of a rollout (train) or an evaluation (eval). `hold` (train): made now, handed out
        once started again without it (which opens it).

        Reply: {groups, rollout_id, kind}."""
        return self._call("start_rollout", locals())

    def get_work(self, worker: str, max_groups: int, *, wait: float | None = UNSET, ahead: bool | None = UNSET,
                 ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[list[Work | None]]:
        """A rollout worker pulls up to `max_groups` groups; waits up to `wait` s for some. `ahead`: groups of the
        rollout made ahead (held), at once, with the weight version the worker starts them at.

        Reply: {groups: [group]}."""
        return self._call("get_work", locals())

    def submit(self, worker: str, work_id: str, samples: list[SampleMap], *, ask_timeout: float | None = None,
               idem: str | None = None) -> Awaitable[list[Submitted | None]]:
        """A rollout worker hands back a finished, scored group (completed or failed).

        Reply: {accepted, reason?, outcome?}."""
        return self._call("submit", locals())

    def return_work(self, worker: str, work_id: str, *, samples: list[SampleMap] | None = UNSET,
                    reason: str | None = UNSET, failed: bool | None = UNSET, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[list[Returned | None]]:
        """A rollout worker gives back work it could not finish (abort, engine restart). `failed`: its generation
        raised or its samples were refused (`reason` says how); the third time, the group is recorded as failed.

        Reply: {requeued, partial?, failed?, reason?}."""
        return self._call("return_work", locals())

    def release_worker(self, worker: str, *, reason: str | None = UNSET, ask_timeout: float | None = None,
                       idem: str | None = None) -> Awaitable[list[Released | None]]:
        """Re-issue every group leased to a worker (it died or its engine restarted).

        Reply: {requeued}."""
        return self._call("release_worker", locals())

    def wait_rollout(self, rollout_id: int, *, kind: str | None = UNSET, timeout: float | None = UNSET,
                     hack: bool | None = UNSET, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[list[RolloutStats | None]]:
        """Wait until the rollout (or eval) has its groups; returns its statistics (a complete training rollout's with
        batch_id, what names its batch; with hack: the reward-hacking monitor's report, unless --hack-alarms off).
        `hack` false: the reply does not wait for the report -- the monitor starts on the complete rollout and
        `hack_report` answers it.

        Reply: {complete, groups, samples, filtered, failed, reward_mean, ..., batch_id?, hack?}."""
        return self._call("wait_rollout", locals())

    def hack_report(self, rollout_id: int, *, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[list[dict[str, Any] | None | None]]:
        """The reward-hacking monitor's report on a complete training rollout (what wait_rollout's `hack` holds),
        waiting for it while the monitor runs; nil with --hack-alarms off or once the rollout is trained.

        Reply: {rollout_id, metrics, alarms, skipped} | {rollout_id, error} | nil."""
        return self._call("hack_report", locals())

    def get_batch(self, rollout_id: int, rank: int, world_size: int, *, packed: bool | None = UNSET,
                  ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[list[TrainBatch | None]]:
        """A trainer rank pulls its shard (whole groups) of a completed rollout (`packed`: tokens, loss masks and
        rollout log-probs as packed columns, types.pack_rows).

        Reply: batch map (slime_actors.types.batch_from_samples)."""
        return self._call("get_batch", locals())

    def wait_batch(self, rollout_id: int, rank: int, world_size: int, *, packed: bool | None = UNSET,
                   timeout: float | None = UNSET, ask_timeout: float | None = None,
                   idem: str | None = None) -> Awaitable[list[dict[str, Any] | None | None]]:
        """A trainer rank asks for its shard of a training rollout before the rollout is complete (after training on
        the one before): answered once it is, with the batch's id (wait_rollout's `batch_id`); nil after `timeout`
        s, or when the rollout was rolled back or trained meanwhile.

        Reply: {batch_id, batch} | nil."""
        return self._call("wait_batch", locals())

    def mark_trained(self, rollout_id: int, *, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[list[None | None]]:
        """Record that a rollout's samples were trained on (accounting, then freed)."""
        return self._call("mark_trained", locals())

    def accounting(self, *, ask_timeout: float | None = None,
                   idem: str | None = None) -> Awaitable[list[Accounting | None]]:
        """Per sample index: times handed out, submitted, trained; lost/duplicated checks.

        Reply: {issued, trained_once, trained_more, untrained, lost, duplicated, ...}."""
        return self._call("accounting", locals())

    def save(self, path: str, *, ask_timeout: float | None = None,
             idem: str | None = None) -> Awaitable[list[None | None]]:
        """Write the buffer state (dataset position, queued and partial groups) to `path`."""
        return self._call("save", locals())

    def rollback(self, *, path: str | None = UNSET, if_ahead_of: int | None = UNSET, reason: str | None = UNSET,
                 token: str | None = UNSET, ask_timeout: float | None = None,
                 idem: str | None = None) -> Awaitable[list[RolledBack | None]]:
        """Back to a checkpoint's snapshot (the training group restarted from it) when the buffer holds rollouts from
        `if_ahead_of` on; discarded trainings are accounted. Idempotent per `token`.

        Reply: {rolled_back, trained_rollouts_discarded, samples_discarded, epoch, ...}."""
        return self._call("rollback", locals())

    def eval_results(self, rollout_id: int, *, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[list[list[EvalResponse] | None]]:
        """Per-sample results of a finished eval (prompt, response, reward, label).

        Reply: list."""
        return self._call("eval_results", locals())

    def dump_rollout(self, rollout_id: int, *, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[list[list[SampleMap] | None]]:
        """All samples of a completed rollout (for --save-debug-rollout-data).

        Reply: list."""
        return self._call("dump_rollout", locals())

    def load_rollout(self, rollout_id: int, samples: list[SampleMap], *, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[list[RolloutLoaded | None]]:
        """Insert samples as a completed rollout (for --load-debug-rollout-data).

        Reply: {groups}."""
        return self._call("load_rollout", locals())


class RolloutHandle(ActorHandle):
    """Asks to one rollout actor (`rollout/N`): each method sends its message and waits for the reply."""

    role = "rollout"

    @property
    def tell(self) -> RolloutTell:
        return RolloutTell(self)

    def resume(self, weight_version: int, *, ask_timeout: float | None = None,
               idem: str | None = None) -> Awaitable[None]:
        """Start (or continue) pulling work at `weight_version`."""
        return self._call("resume", locals())

    def take_ahead(self, rollout_id: int, *, ask_timeout: float | None = None,
                   idem: str | None = None) -> Awaitable[None]:
        """Rollout `rollout_id` was made ahead (held) while the trainers train: lease some of its groups now and start
        them at the first resume whose weights are theirs."""
        return self._call("take_ahead", locals())

    def pause(self, *, abort: bool | None = UNSET, ask_timeout: float | None = None,
              idem: str | None = None) -> Awaitable[Paused]:
        """Stop pulling new work and pause the engine (/pause_generation, --pause-generation-mode; abort=true: mode
        abort).

        Reply: {in_flight, mode}."""
        return self._call("pause", locals())

    def end_rollout(self, rollout_id: int, *, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[RolloutEnded]:
        """The rollout is complete: abort what is in flight and return it to the buffer.

        Reply: {aborted, returned}."""
        return self._call("end_rollout", locals())

    def init_weights_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                           group_name: str, backend: str, *, ask_timeout: float | None = None,
                           idem: str | None = None) -> Awaitable[EngineAnswer]:
        """Have the engine join the trainer's weight-broadcast group.

        Reply: engine answer."""
        return self._call("init_weights_group", locals())

    def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                        group_name: str, weight_version: int, *, flush_cache: bool | None = UNSET,
                                        load_format: str | None = UNSET, ask_timeout: float | None = None,
                                        idem: str | None = None) -> Awaitable[EngineAnswer]:
        """Have the engine receive one bucket by broadcast.

        Reply: engine answer."""
        return self._call("update_weights_from_distributed", locals())

    def destroy_weights_group(self, group_name: str, *, ask_timeout: float | None = None,
                              idem: str | None = None) -> Awaitable[None]:
        """Leave the weight-broadcast group."""
        return self._call("destroy_weights_group", locals())

    def update_weights_from_disk(self, model_path: str, weight_version: int, *, ask_timeout: float | None = None,
                                 idem: str | None = None) -> Awaitable[EngineAnswer]:
        """Have the engine load weights from an HF directory.

        Reply: engine answer."""
        return self._call("update_weights_from_disk", locals())

    def load_lora_adapter(self, weight_version: int, tensors: dict[str, Array], config: dict[str, Any], *,
                          ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[AdapterLoaded]:
        """--lora-sync adapter: the trainer's LoRA adapters (PEFT's tensor names, CPU tensors) for `weight_version`;
        the worker writes them as an adapter directory and loads it into its engine.

        Reply: {lora_name, loaded}."""
        return self._call("load_lora_adapter", locals())

    def held_groups(self, *, ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[list[str]]:
        """Work ids the worker holds (the buffer reconciles its leases after a restart).

        Reply: list."""
        return self._call("held_groups", locals())

    def engine_info(self, *, ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[dict[str, Any]]:
        """The engine's URL, weight version, health and counters.

        Reply: map."""
        return self._call("engine_info", locals())

    def weight_update(self, active: bool, *, weight_version: int | None = UNSET, ask_timeout: float | None = None,
                      idem: str | None = None) -> Awaitable[DirectUpdate]:
        """The trainer updates the engine directly (colocated tensors): hold health probes while active; then the
        version it holds.

        Reply: {engine_url, paused, flush_cache, tp_size}."""
        return self._call("weight_update", locals())

    def router_url(self, *, ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[RouterUrl]:
        """rollout/0: the URL of the sglang-router it started (waits until it is up).

        Reply: {url}."""
        return self._call("router_url", locals())

    def kill_engine(self, *, hang: bool | None = UNSET, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[Killed]:
        """Kill the engine process (fault-injection and tests); the worker restarts it.

        Reply: {pid}."""
        return self._call("kill_engine", locals())


class RolloutTell(ActorTell):
    """One-way messages to one rollout actor or to every member of a group (no reply)."""

    role = "rollout"

    @property
    def quietly(self) -> RolloutTell:
        """The same members; one that cannot be told is left out."""
        return RolloutTell(self.to, quiet=True)

    def resume(self, weight_version: int) -> Awaitable[None]:
        """Start (or continue) pulling work at `weight_version`."""
        return self._call("resume", locals())

    def take_ahead(self, rollout_id: int) -> Awaitable[None]:
        """Rollout `rollout_id` was made ahead (held) while the trainers train: lease some of its groups now and start
        them at the first resume whose weights are theirs."""
        return self._call("take_ahead", locals())

    def pause(self, *, abort: bool | None = UNSET) -> Awaitable[None]:
        """Stop pulling new work and pause the engine (/pause_generation, --pause-generation-mode; abort=true: mode
        abort)."""
        return self._call("pause", locals())

    def end_rollout(self, rollout_id: int) -> Awaitable[None]:
        """The rollout is complete: abort what is in flight and return it to the buffer."""
        return self._call("end_rollout", locals())

    def init_weights_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                           group_name: str, backend: str) -> Awaitable[None]:
        """Have the engine join the trainer's weight-broadcast group."""
        return self._call("init_weights_group", locals())

    def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                        group_name: str, weight_version: int, *, flush_cache: bool | None = UNSET,
                                        load_format: str | None = UNSET) -> Awaitable[None]:
        """Have the engine receive one bucket by broadcast."""
        return self._call("update_weights_from_distributed", locals())

    def destroy_weights_group(self, group_name: str) -> Awaitable[None]:
        """Leave the weight-broadcast group."""
        return self._call("destroy_weights_group", locals())

    def update_weights_from_disk(self, model_path: str, weight_version: int) -> Awaitable[None]:
        """Have the engine load weights from an HF directory."""
        return self._call("update_weights_from_disk", locals())

    def load_lora_adapter(self, weight_version: int, tensors: dict[str, Array],
                          config: dict[str, Any]) -> Awaitable[None]:
        """--lora-sync adapter: the trainer's LoRA adapters (PEFT's tensor names, CPU tensors) for `weight_version`;
        the worker writes them as an adapter directory and loads it into its engine."""
        return self._call("load_lora_adapter", locals())

    def held_groups(self) -> Awaitable[None]:
        """Work ids the worker holds (the buffer reconciles its leases after a restart)."""
        return self._call("held_groups", locals())

    def engine_info(self) -> Awaitable[None]:
        """The engine's URL, weight version, health and counters."""
        return self._call("engine_info", locals())

    def weight_update(self, active: bool, *, weight_version: int | None = UNSET) -> Awaitable[None]:
        """The trainer updates the engine directly (colocated tensors): hold health probes while active; then the
        version it holds."""
        return self._call("weight_update", locals())

    def router_url(self) -> Awaitable[None]:
        """rollout/0: the URL of the sglang-router it started (waits until it is up)."""
        return self._call("router_url", locals())

    def kill_engine(self, *, hang: bool | None = UNSET) -> Awaitable[None]:
        """Kill the engine process (fault-injection and tests); the worker restarts it."""
        return self._call("kill_engine", locals())


class RolloutGroup(Group[RolloutHandle]):
    """Asks to several rollout actors at once: their replies in member order (GroupFailed when one fails)."""

    role = "rollout"

    @property
    def tell(self) -> RolloutTell:
        return RolloutTell(self)

    @property
    def quietly(self) -> RolloutQuiet:
        return RolloutQuiet(self.members)

    def resume(self, weight_version: int, *, ask_timeout: float | None = None,
               idem: str | None = None) -> Awaitable[list[None]]:
        """Start (or continue) pulling work at `weight_version`."""
        return self._call("resume", locals())

    def take_ahead(self, rollout_id: int, *, ask_timeout: float | None = None,
                   idem: str | None = None) -> Awaitable[list[None]]:
        """Rollout `rollout_id` was made ahead (held) while the trainers train: lease some of its groups now and start
        them at the first resume whose weights are theirs."""
        return self._call("take_ahead", locals())

    def pause(self, *, abort: bool | None = UNSET, ask_timeout: float | None = None,
              idem: str | None = None) -> Awaitable[list[Paused]]:
        """Stop pulling new work and pause the engine (/pause_generation, --pause-generation-mode; abort=true: mode
        abort).

        Reply: {in_flight, mode}."""
        return self._call("pause", locals())

    def end_rollout(self, rollout_id: int, *, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[list[RolloutEnded]]:
        """The rollout is complete: abort what is in flight and return it to the buffer.

        Reply: {aborted, returned}."""
        return self._call("end_rollout", locals())

    def init_weights_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                           group_name: str, backend: str, *, ask_timeout: float | None = None,
                           idem: str | None = None) -> Awaitable[list[EngineAnswer]]:
        """Have the engine join the trainer's weight-broadcast group.

        Reply: engine answer."""
        return self._call("init_weights_group", locals())

    def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                        group_name: str, weight_version: int, *, flush_cache: bool | None = UNSET,
                                        load_format: str | None = UNSET, ask_timeout: float | None = None,
                                        idem: str | None = None) -> Awaitable[list[EngineAnswer]]:
        """Have the engine receive one bucket by broadcast.

        Reply: engine answer."""
        return self._call("update_weights_from_distributed", locals())

    def destroy_weights_group(self, group_name: str, *, ask_timeout: float | None = None,
                              idem: str | None = None) -> Awaitable[list[None]]:
        """Leave the weight-broadcast group."""
        return self._call("destroy_weights_group", locals())

    def update_weights_from_disk(self, model_path: str, weight_version: int, *, ask_timeout: float | None = None,
                                 idem: str | None = None) -> Awaitable[list[EngineAnswer]]:
        """Have the engine load weights from an HF directory.

        Reply: engine answer."""
        return self._call("update_weights_from_disk", locals())

    def load_lora_adapter(self, weight_version: int, tensors: dict[str, Array], config: dict[str, Any], *,
                          ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[list[AdapterLoaded]]:
        """--lora-sync adapter: the trainer's LoRA adapters (PEFT's tensor names, CPU tensors) for `weight_version`;
        the worker writes them as an adapter directory and loads it into its engine.

        Reply: {lora_name, loaded}."""
        return self._call("load_lora_adapter", locals())

    def held_groups(self, *, ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[list[list[str]]]:
        """Work ids the worker holds (the buffer reconciles its leases after a restart).

        Reply: list."""
        return self._call("held_groups", locals())

    def engine_info(self, *, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[list[dict[str, Any]]]:
        """The engine's URL, weight version, health and counters.

        Reply: map."""
        return self._call("engine_info", locals())

    def weight_update(self, active: bool, *, weight_version: int | None = UNSET, ask_timeout: float | None = None,
                      idem: str | None = None) -> Awaitable[list[DirectUpdate]]:
        """The trainer updates the engine directly (colocated tensors): hold health probes while active; then the
        version it holds.

        Reply: {engine_url, paused, flush_cache, tp_size}."""
        return self._call("weight_update", locals())

    def router_url(self, *, ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[list[RouterUrl]]:
        """rollout/0: the URL of the sglang-router it started (waits until it is up).

        Reply: {url}."""
        return self._call("router_url", locals())

    def kill_engine(self, *, hang: bool | None = UNSET, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[list[Killed]]:
        """Kill the engine process (fault-injection and tests); the worker restarts it.

        Reply: {pid}."""
        return self._call("kill_engine", locals())


class RolloutQuiet(Group[RolloutHandle]):
    """Asks to several rollout actors at once; a member that fails answers None."""

    role = "rollout"
    quiet = True

    def resume(self, weight_version: int, *, ask_timeout: float | None = None,
               idem: str | None = None) -> Awaitable[list[None | None]]:
        """Start (or continue) pulling work at `weight_version`."""
        return self._call("resume", locals())

    def take_ahead(self, rollout_id: int, *, ask_timeout: float | None = None,
                   idem: str | None = None) -> Awaitable[list[None | None]]:
        """Rollout `rollout_id` was made ahead (held) while the trainers train: lease some of its groups now and start
        them at the first resume whose weights are theirs."""
        return self._call("take_ahead", locals())

    def pause(self, *, abort: bool | None = UNSET, ask_timeout: float | None = None,
              idem: str | None = None) -> Awaitable[list[Paused | None]]:
        """Stop pulling new work and pause the engine (/pause_generation, --pause-generation-mode; abort=true: mode
        abort).

        Reply: {in_flight, mode}."""
        return self._call("pause", locals())

    def end_rollout(self, rollout_id: int, *, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[list[RolloutEnded | None]]:
        """The rollout is complete: abort what is in flight and return it to the buffer.

        Reply: {aborted, returned}."""
        return self._call("end_rollout", locals())

    def init_weights_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                           group_name: str, backend: str, *, ask_timeout: float | None = None,
                           idem: str | None = None) -> Awaitable[list[EngineAnswer | None]]:
        """Have the engine join the trainer's weight-broadcast group.

        Reply: engine answer."""
        return self._call("init_weights_group", locals())

    def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                        group_name: str, weight_version: int, *, flush_cache: bool | None = UNSET,
                                        load_format: str | None = UNSET, ask_timeout: float | None = None,
                                        idem: str | None = None) -> Awaitable[list[EngineAnswer | None]]:
        """Have the engine receive one bucket by broadcast.

        Reply: engine answer."""
        return self._call("update_weights_from_distributed", locals())

    def destroy_weights_group(self, group_name: str, *, ask_timeout: float | None = None,
                              idem: str | None = None) -> Awaitable[list[None | None]]:
        """Leave the weight-broadcast group."""
        return self._call("destroy_weights_group", locals())

    def update_weights_from_disk(self, model_path: str, weight_version: int, *, ask_timeout: float | None = None,
                                 idem: str | None = None) -> Awaitable[list[EngineAnswer | None]]:
        """Have the engine load weights from an HF directory.

        Reply: engine answer."""
        return self._call("update_weights_from_disk", locals())

    def load_lora_adapter(self, weight_version: int, tensors: dict[str, Array], config: dict[str, Any], *,
                          ask_timeout: float | None = None,
                          idem: str | None = None) -> Awaitable[list[AdapterLoaded | None]]:
        """--lora-sync adapter: the trainer's LoRA adapters (PEFT's tensor names, CPU tensors) for `weight_version`;
        the worker writes them as an adapter directory and loads it into its engine.

        Reply: {lora_name, loaded}."""
        return self._call("load_lora_adapter", locals())

    def held_groups(self, *, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[list[list[str] | None]]:
        """Work ids the worker holds (the buffer reconciles its leases after a restart).

        Reply: list."""
        return self._call("held_groups", locals())

    def engine_info(self, *, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[list[dict[str, Any] | None]]:
        """The engine's URL, weight version, health and counters.

        Reply: map."""
        return self._call("engine_info", locals())

    def weight_update(self, active: bool, *, weight_version: int | None = UNSET, ask_timeout: float | None = None,
                      idem: str | None = None) -> Awaitable[list[DirectUpdate | None]]:
        """The trainer updates the engine directly (colocated tensors): hold health probes while active; then the
        version it holds.

        Reply: {engine_url, paused, flush_cache, tp_size}."""
        return self._call("weight_update", locals())

    def router_url(self, *, ask_timeout: float | None = None,
                   idem: str | None = None) -> Awaitable[list[RouterUrl | None]]:
        """rollout/0: the URL of the sglang-router it started (waits until it is up).

        Reply: {url}."""
        return self._call("router_url", locals())

    def kill_engine(self, *, hang: bool | None = UNSET, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[list[Killed | None]]:
        """Kill the engine process (fault-injection and tests); the worker restarts it.

        Reply: {pid}."""
        return self._call("kill_engine", locals())


class RewardHandle(ActorHandle):
    """Asks to one reward actor (`reward/N`): each method sends its message and waits for the reply."""

    role = "reward"

    @property
    def tell(self) -> RewardTell:
        return RewardTell(self)

    def score(self, samples: list[SampleMap], *, group: bool | None = UNSET, ask_timeout: float | None = None,
              idem: str | None = None) -> Awaitable[Scores]:
        """Score samples; per-sample rewards and errors (a failing function loses nothing).

        Reply: {rewards: [float|None], errors: [str|None], timed_out?: [bool]}."""
        return self._call("score", locals())


class RewardTell(ActorTell):
    """One-way messages to one reward actor or to every member of a group (no reply)."""

    role = "reward"

    @property
    def quietly(self) -> RewardTell:
        """The same members; one that cannot be told is left out."""
        return RewardTell(self.to, quiet=True)

    def score(self, samples: list[SampleMap], *, group: bool | None = UNSET) -> Awaitable[None]:
        """Score samples; per-sample rewards and errors (a failing function loses nothing)."""
        return self._call("score", locals())


class RewardGroup(Group[RewardHandle]):
    """Asks to several reward actors at once: their replies in member order (GroupFailed when one fails)."""

    role = "reward"

    @property
    def tell(self) -> RewardTell:
        return RewardTell(self)

    @property
    def quietly(self) -> RewardQuiet:
        return RewardQuiet(self.members)

    def score(self, samples: list[SampleMap], *, group: bool | None = UNSET, ask_timeout: float | None = None,
              idem: str | None = None) -> Awaitable[list[Scores]]:
        """Score samples; per-sample rewards and errors (a failing function loses nothing).

        Reply: {rewards: [float|None], errors: [str|None], timed_out?: [bool]}."""
        return self._call("score", locals())


class RewardQuiet(Group[RewardHandle]):
    """Asks to several reward actors at once; a member that fails answers None."""

    role = "reward"
    quiet = True

    def score(self, samples: list[SampleMap], *, group: bool | None = UNSET, ask_timeout: float | None = None,
              idem: str | None = None) -> Awaitable[list[Scores | None]]:
        """Score samples; per-sample rewards and errors (a failing function loses nothing).

        Reply: {rewards: [float|None], errors: [str|None], timed_out?: [bool]}."""
        return self._call("score", locals())


class RetrieverHandle(ActorHandle):
    """Asks to one retriever actor (`retriever/N`): each method sends its message and waits for the reply."""

    role = "retriever"

    @property
    def tell(self) -> RetrieverTell:
        return RetrieverTell(self)

    def address(self, *, ask_timeout: float | None = None, idem: str | None = None) -> Awaitable[RetrieverAddress]:
        """Where this replica serves Search-R1's POST /retrieve (a restarted one: a new port), with its corpus and
        counters.

        Reply: {url, docs, corpus_sha256, requests, queries}."""
        return self._call("address", locals())


class RetrieverTell(ActorTell):
    """One-way messages to one retriever actor or to every member of a group (no reply)."""

    role = "retriever"

    @property
    def quietly(self) -> RetrieverTell:
        """The same members; one that cannot be told is left out."""
        return RetrieverTell(self.to, quiet=True)

    def address(self) -> Awaitable[None]:
        """Where this replica serves Search-R1's POST /retrieve (a restarted one: a new port), with its corpus and
        counters."""
        return self._call("address", locals())


class RetrieverGroup(Group[RetrieverHandle]):
    """Asks to several retriever actors at once: their replies in member order (GroupFailed when one fails)."""

    role = "retriever"

    @property
    def tell(self) -> RetrieverTell:
        return RetrieverTell(self)

    @property
    def quietly(self) -> RetrieverQuiet:
        return RetrieverQuiet(self.members)

    def address(self, *, ask_timeout: float | None = None,
                idem: str | None = None) -> Awaitable[list[RetrieverAddress]]:
        """Where this replica serves Search-R1's POST /retrieve (a restarted one: a new port), with its corpus and
        counters.

        Reply: {url, docs, corpus_sha256, requests, queries}."""
        return self._call("address", locals())


class RetrieverQuiet(Group[RetrieverHandle]):
    """Asks to several retriever actors at once; a member that fails answers None."""

    role = "retriever"
    quiet = True

    def address(self, *, ask_timeout: float | None = None,
                idem: str | None = None) -> Awaitable[list[RetrieverAddress | None]]:
        """Where this replica serves Search-R1's POST /retrieve (a restarted one: a new port), with its corpus and
        counters.

        Reply: {url, docs, corpus_sha256, requests, queries}."""
        return self._call("address", locals())


class TrainerHandle(ActorHandle):
    """Asks to one trainer actor (`trainer/N`): each method sends its message and waits for the reply."""

    role = "trainer"

    @property
    def tell(self) -> TrainerTell:
        return TrainerTell(self)

    def train(self, rollout_id: int, *, batch_id: str | None = UNSET, ask_timeout: float | None = None,
              idem: str | None = None) -> Awaitable[TrainMetrics]:
        """Run the RL update on this rank's shard of the rollout: the one it fetched ahead (wait_batch) when that is
        batch `batch_id` (wait_rollout's), else pulled now (get_batch).

        Reply: metrics map."""
        return self._call("train", locals())

    def sync_weights(self, weight_version: int, workers: list[str], *, transport: str | None = UNSET,
                     rebuild: bool | None = UNSET, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[WeightsSynced]:
        """Rank 0: push the current weights to the rollout workers.

        Reply: {seconds, bytes, buckets, transport}."""
        return self._call("sync_weights", locals())

    def save(self, path: str, *, save_optim: bool | None = UNSET, ask_timeout: float | None = None,
             idem: str | None = None) -> Awaitable[None]:
        """Save this rank's model/optimizer/RNG state under `path`."""
        return self._call("save", locals())

    def abort_group(self, generation: int, *, reason: str | None = UNSET, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[GroupLeft]:
        """Leave the training group of `generation` (broken: a rank died); the rank exits with code 75 and its
        supervisor restarts it.

        Reply: {left}."""
        return self._call("abort_group", locals())

    def save_hf(self, path: str, *, rollout_id: int | None = UNSET, ask_timeout: float | None = None,
                idem: str | None = None) -> Awaitable[None]:
        """Every rank: export the policy as a Hugging Face directory at `path` (rank 0 writes; --save-hf after
        `rollout_id`)."""
        return self._call("save_hf", locals())

    def log_probs(self, samples: list[SampleMap], *, ask_timeout: float | None = None,
                  idem: str | None = None) -> Awaitable[list[list[float]]]:
        """Log-probs of given samples under the current actor (checks and tests).

        Reply: list of lists."""
        return self._call("log_probs", locals())


class TrainerTell(ActorTell):
    """One-way messages to one trainer actor or to every member of a group (no reply)."""

    role = "trainer"

    @property
    def quietly(self) -> TrainerTell:
        """The same members; one that cannot be told is left out."""
        return TrainerTell(self.to, quiet=True)

    def train(self, rollout_id: int, *, batch_id: str | None = UNSET) -> Awaitable[None]:
        """Run the RL update on this rank's shard of the rollout: the one it fetched ahead (wait_batch) when that is
        batch `batch_id` (wait_rollout's), else pulled now (get_batch)."""
        return self._call("train", locals())

    def sync_weights(self, weight_version: int, workers: list[str], *, transport: str | None = UNSET,
                     rebuild: bool | None = UNSET) -> Awaitable[None]:
        """Rank 0: push the current weights to the rollout workers."""
        return self._call("sync_weights", locals())

    def save(self, path: str, *, save_optim: bool | None = UNSET) -> Awaitable[None]:
        """Save this rank's model/optimizer/RNG state under `path`."""
        return self._call("save", locals())

    def abort_group(self, generation: int, *, reason: str | None = UNSET) -> Awaitable[None]:
        """Leave the training group of `generation` (broken: a rank died); the rank exits with code 75 and its
        supervisor restarts it."""
        return self._call("abort_group", locals())

    def save_hf(self, path: str, *, rollout_id: int | None = UNSET) -> Awaitable[None]:
        """Every rank: export the policy as a Hugging Face directory at `path` (rank 0 writes; --save-hf after
        `rollout_id`)."""
        return self._call("save_hf", locals())

    def log_probs(self, samples: list[SampleMap]) -> Awaitable[None]:
        """Log-probs of given samples under the current actor (checks and tests)."""
        return self._call("log_probs", locals())


class TrainerGroup(Group[TrainerHandle]):
    """Asks to several trainer actors at once: their replies in member order (GroupFailed when one fails)."""

    role = "trainer"

    @property
    def tell(self) -> TrainerTell:
        return TrainerTell(self)

    @property
    def quietly(self) -> TrainerQuiet:
        return TrainerQuiet(self.members)

    def train(self, rollout_id: int, *, batch_id: str | None = UNSET, ask_timeout: float | None = None,
              idem: str | None = None) -> Awaitable[list[TrainMetrics]]:
        """Run the RL update on this rank's shard of the rollout: the one it fetched ahead (wait_batch) when that is
        batch `batch_id` (wait_rollout's), else pulled now (get_batch).

        Reply: metrics map."""
        return self._call("train", locals())

    def sync_weights(self, weight_version: int, workers: list[str], *, transport: str | None = UNSET,
                     rebuild: bool | None = UNSET, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[list[WeightsSynced]]:
        """Rank 0: push the current weights to the rollout workers.

        Reply: {seconds, bytes, buckets, transport}."""
        return self._call("sync_weights", locals())

    def save(self, path: str, *, save_optim: bool | None = UNSET, ask_timeout: float | None = None,
             idem: str | None = None) -> Awaitable[list[None]]:
        """Save this rank's model/optimizer/RNG state under `path`."""
        return self._call("save", locals())

    def abort_group(self, generation: int, *, reason: str | None = UNSET, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[list[GroupLeft]]:
        """Leave the training group of `generation` (broken: a rank died); the rank exits with code 75 and its
        supervisor restarts it.

        Reply: {left}."""
        return self._call("abort_group", locals())

    def save_hf(self, path: str, *, rollout_id: int | None = UNSET, ask_timeout: float | None = None,
                idem: str | None = None) -> Awaitable[list[None]]:
        """Every rank: export the policy as a Hugging Face directory at `path` (rank 0 writes; --save-hf after
        `rollout_id`)."""
        return self._call("save_hf", locals())

    def log_probs(self, samples: list[SampleMap], *, ask_timeout: float | None = None,
                  idem: str | None = None) -> Awaitable[list[list[list[float]]]]:
        """Log-probs of given samples under the current actor (checks and tests).

        Reply: list of lists."""
        return self._call("log_probs", locals())


class TrainerQuiet(Group[TrainerHandle]):
    """Asks to several trainer actors at once; a member that fails answers None."""

    role = "trainer"
    quiet = True

    def train(self, rollout_id: int, *, batch_id: str | None = UNSET, ask_timeout: float | None = None,
              idem: str | None = None) -> Awaitable[list[TrainMetrics | None]]:
        """Run the RL update on this rank's shard of the rollout: the one it fetched ahead (wait_batch) when that is
        batch `batch_id` (wait_rollout's), else pulled now (get_batch).

        Reply: metrics map."""
        return self._call("train", locals())

    def sync_weights(self, weight_version: int, workers: list[str], *, transport: str | None = UNSET,
                     rebuild: bool | None = UNSET, ask_timeout: float | None = None,
                     idem: str | None = None) -> Awaitable[list[WeightsSynced | None]]:
        """Rank 0: push the current weights to the rollout workers.

        Reply: {seconds, bytes, buckets, transport}."""
        return self._call("sync_weights", locals())

    def save(self, path: str, *, save_optim: bool | None = UNSET, ask_timeout: float | None = None,
             idem: str | None = None) -> Awaitable[list[None | None]]:
        """Save this rank's model/optimizer/RNG state under `path`."""
        return self._call("save", locals())

    def abort_group(self, generation: int, *, reason: str | None = UNSET, ask_timeout: float | None = None,
                    idem: str | None = None) -> Awaitable[list[GroupLeft | None]]:
        """Leave the training group of `generation` (broken: a rank died); the rank exits with code 75 and its
        supervisor restarts it.

        Reply: {left}."""
        return self._call("abort_group", locals())

    def save_hf(self, path: str, *, rollout_id: int | None = UNSET, ask_timeout: float | None = None,
                idem: str | None = None) -> Awaitable[list[None | None]]:
        """Every rank: export the policy as a Hugging Face directory at `path` (rank 0 writes; --save-hf after
        `rollout_id`)."""
        return self._call("save_hf", locals())

    def log_probs(self, samples: list[SampleMap], *, ask_timeout: float | None = None,
                  idem: str | None = None) -> Awaitable[list[list[list[float]] | None]]:
        """Log-probs of given samples under the current actor (checks and tests).

        Reply: list of lists."""
        return self._call("log_probs", locals())
