"""Typed role handles (slime_actors/handles.py, the classes generated into slime_actors/role_handles.py): a call is
checked against messages.py where it is written (by a type checker, and at run time), the body sent is what a
hand-written ask sent, replies come back typed, groups fan out, and the generated module is current. No processes: the
sender is a fake that records what it was asked to send."""

from __future__ import annotations

import asyncio

import pytest

import slime_actors.role_handles as role_handles
from slime_actors.handles import GroupFailed, generate
from slime_actors.mailbox.errors import PeerDown, RemoteError
from slime_actors.messages import (DirectUpdate, Joined, Released, ReplyError, Returned, RolloutStats, RouterUrl, Scores,
                                   Submitted, TrainBatch, Work, WorkGroup)
from slime_actors.role_handles import BufferHandle, RolloutGroup, RolloutHandle, TrainerGroup, TrainerHandle


def Handle(sender, name, **kw):
    """The generated handle class of `name`'s role."""
    return getattr(role_handles, name.split("/")[0].capitalize() + "Handle")(sender, name, **kw)


class Sender:
    """Stands in for an actor: records (kind, to, method, body, timeout); answers from `replies` (or raises)."""

    def __init__(self, replies=None):
        self.sent: list[tuple] = []
        self.idem: list[dict] = []
        self.replies = replies or {}

    async def ask(self, to, method, body=None, *, timeout=None, **idem):
        self.sent.append(("ask", to, method, body, timeout))
        self.idem.append(idem)  # {} when no key was given: the ask called exactly as a hand-written one
        reply = self.replies.get((to, method))
        if callable(reply):
            reply = reply()
        if isinstance(reply, BaseException):
            raise reply
        return reply

    async def tell(self, to, method, body=None):
        self.sent.append(("tell", to, method, body, None))
        return "id"


ACCOUNTING = {"issued": 16, "trained_once": 16, "trained_more": 0, "untrained": 0, "duplicated": [],
              "trained_rollouts": [0], "pending_groups": [], "stats": {}, "expected_trained": 16, "lost": 0,
              "lost_samples": [], "untrained_by_state": {}, "discarded": {"samples": 0, "trainings": 0},
              "rollbacks": [], "epoch": 0}
STATS = {"complete": True, "rollout_id": 3, "kind": "train", "groups": 4, "target": 4, "samples": 16, "filtered": 0,
         "failed": 0, "reward_mean": 0.5, "response_len_mean": 7.0, "examples": [{"reward": 1.0}],
         "weight_versions": [2], "seconds": 1.5}


def test_a_call_sends_the_declared_message_with_the_fields_in_declared_order():
    s = Sender({("buffer/0", "start_rollout"): {"groups": 4, "rollout_id": 7, "kind": "eval"}})
    buffer = BufferHandle(s, "buffer/0")
    assert asyncio.run(buffer.start_rollout(7, kind="eval", name="gsm8k", weight_version=2)) == \
        {"groups": 4, "rollout_id": 7, "kind": "eval"}
    kind, to, method, body, timeout = s.sent[0]
    assert (kind, to, method, timeout) == ("ask", "buffer/0", "start_rollout", 300.0)
    assert list(body.items()) == [("rollout_id", 7), ("kind", "eval"), ("weight_version", 2), ("name", "gsm8k")]
    # an optional field left out is not sent (one given as None is: nil); ask_timeout bounds the ask, not a field
    asyncio.run(buffer.mark_trained(rollout_id=7, ask_timeout=12))
    assert s.sent[1] == ("ask", "buffer/0", "mark_trained", {"rollout_id": 7}, 12)
    asyncio.run(RolloutHandle(s, "rollout/0").tell.pause(abort=None))
    assert s.sent[2] == ("tell", "rollout/0", "pause", {"abort": None}, None)


def test_an_unknown_method_is_an_error_at_the_call_site():
    buffer = BufferHandle(Sender(), "buffer/0")
    with pytest.raises(AttributeError, match="strat_rollout"):
        buffer.strat_rollout(1)  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="mark_trained"):
        TrainerGroup([TrainerHandle(Sender(), "trainer/0")]).mark_trained(1)  # type: ignore[attr-defined]


def test_a_wrong_argument_is_an_error_at_the_call_site_naming_it_and_nothing_is_sent():
    s = Sender()
    buffer = BufferHandle(s, "buffer/0")
    with pytest.raises(TypeError, match=r"start_rollout\(\) got an unexpected keyword argument 'rolout_id'"):
        buffer.start_rollout(rolout_id=1)                       # unknown field
    with pytest.raises(TypeError, match=r"wait_rollout\(\) missing 1 required positional argument: 'rollout_id'"):
        buffer.wait_rollout(kind="eval")                        # a required field missing
    with pytest.raises(TypeError, match=r"buffer\.start_rollout: field 'rollout_id' must be int, got str"):
        buffer.start_rollout("1")                               # wrong type (the type checker says so before)
    with pytest.raises(TypeError, match=r"buffer\.wait_rollout: field 'kind' must be str, got int"):
        buffer.wait_rollout(1, kind=3)                          # an optional field's too
    with pytest.raises(TypeError, match=r"start_rollout\(\) takes 2 positional arguments"):
        buffer.start_rollout(1, "eval")                         # an optional field given by position
    with pytest.raises(TypeError, match=r"train\(\) got an unexpected keyword argument 'rollout'"):
        TrainerGroup([TrainerHandle(s, "trainer/0"), TrainerHandle(s, "trainer/1")]).train(rollout=1)
    assert s.sent == [], "a bad call sent something"


def test_a_handle_is_for_its_role_and_a_role_index_name():
    with pytest.raises(ValueError, match="trainer/0 is not a buffer actor"):
        BufferHandle(Sender(), "trainer/0")
    with pytest.raises(ValueError, match="not role/index"):
        BufferHandle(Sender(), "buffer")
    with pytest.raises(ValueError, match="members must be trainer actors, got buffer/0"):
        TrainerGroup([Handle(Sender(), "buffer/0"), TrainerHandle(Sender(), "trainer/0")])


def test_a_declared_reply_type_comes_back_typed_and_a_bad_reply_is_named():
    s = Sender({("buffer/0", "wait_rollout"): STATS})
    stats = asyncio.run(Handle(s, "buffer/0").wait_rollout(3, timeout=60.0, ask_timeout=90))
    assert isinstance(stats, RolloutStats)
    assert (stats.complete, stats.samples, stats.reward_mean, stats.examples) == (True, 16, 0.5, [{"reward": 1.0}])
    assert stats.numbers() == {"rollout_id": 3, "groups": 4, "target": 4, "samples": 16, "filtered": 0, "failed": 0,
                               "reward_mean": 0.5, "response_len_mean": 7.0, "seconds": 1.5}
    assert s.sent[0][3:] == ({"rollout_id": 3, "timeout": 60.0}, 90)
    s.replies[("buffer/0", "wait_rollout")] = {"complete": True}
    with pytest.raises(ReplyError, match="buffer.wait_rollout replied"):
        asyncio.run(Handle(s, "buffer/0").wait_rollout(3))


def test_tell_sends_one_way_and_a_group_fans_out_in_member_order():
    s = Sender({("trainer/0", "train"): {"loss": 0.1}, ("trainer/1", "train"): {"loss": 0.2}})
    trainers = TrainerGroup(TrainerHandle(s, f"trainer/{r}") for r in range(2))
    assert asyncio.run(trainers.train(5)) == [{"loss": 0.1}, {"loss": 0.2}]
    asyncio.run(trainers.tell.abort_group(generation=1, reason="rank died"))
    assert [x[:4] for x in s.sent[2:]] == [("tell", f"trainer/{r}", "abort_group", {"generation": 1,
                                                                                    "reason": "rank died"})
                                           for r in range(2)]
    engines = RolloutGroup(RolloutHandle(s, f"rollout/{i}") for i in range(3))
    assert engines.only(["rollout/2", "rollout/0"]).names == ["rollout/0", "rollout/2"]
    assert type(engines.only(["rollout/1"])) is RolloutGroup
    asyncio.run(engines.members[1].tell.resume(4))
    assert s.sent[-1] == ("tell", "rollout/1", "resume", {"weight_version": 4}, None)
    with pytest.raises(ValueError, match="rollout/7: not members"):
        engines.only(["rollout/7"])


def test_a_group_call_that_fails_names_the_member_and_whether_it_is_gone():
    gone = PeerDown("trainer/1", "train")
    s = Sender({("trainer/0", "train"): {"loss": 0.1}, ("trainer/1", "train"): gone})
    trainers = TrainerGroup(TrainerHandle(s, f"trainer/{r}") for r in range(2))
    with pytest.raises(GroupFailed) as exc:
        asyncio.run(trainers.train(1))
    assert exc.value.member == "trainer/1" and exc.value.confirmed and str(exc.value).startswith("train: ")
    s.replies[("trainer/1", "train")] = RemoteError("trainer/1", "train", "ValueError", "bad batch")
    with pytest.raises(GroupFailed) as exc:
        asyncio.run(trainers.train(1))
    assert not exc.value.confirmed, "an error the rank raised is not a rank that is gone"
    # quietly: a member that fails answers None
    assert asyncio.run(trainers.quietly.train(1)) == [{"loss": 0.1}, None]
    # a tell to a group: GroupFailed when a member cannot be told, unless quietly
    s.tell = _failing_tell(s, "trainer/1")
    with pytest.raises(GroupFailed, match="abort_group"):
        asyncio.run(trainers.tell.abort_group(1))
    assert asyncio.run(trainers.tell.quietly.abort_group(1)) is None
    assert [x[1] for x in s.sent[-2:]] == ["trainer/0", "trainer/0"]



def test_a_group_call_started_and_not_yet_awaited_reaches_every_member_at_the_loops_next_turn():
    """The controller starts the trainers' `train` and goes on with the step's bookkeeping (loop.py `alongside`):
    each member's ask goes out at the next turn of the loop, not once the caller next waits (it went out ~0.5 ms
    later on a 2-vCPU VM, after the rollout's metrics; a turn later than a single actor's ask)."""
    s = Sender({(f"trainer/{r}", "train"): {"loss": r} for r in range(2)})
    trainers = TrainerGroup(TrainerHandle(s, f"trainer/{r}") for r in range(2))

    async def main(call):
        task = asyncio.ensure_future(call())
        await asyncio.sleep(0)
        sent_then = [x[1:3] for x in s.sent]
        s.sent.clear()
        return sent_then, await task

    every = [("trainer/0", "train"), ("trainer/1", "train")]
    assert asyncio.run(main(lambda: trainers.train(5))) == (every, [{"loss": 0}, {"loss": 1}])
    assert asyncio.run(main(lambda: trainers.quietly.train(5))) == (every, [{"loss": 0}, {"loss": 1}])
    tells = asyncio.run(main(lambda: trainers.tell.abort_group(1)))
    assert tells == ([("trainer/0", "abort_group"), ("trainer/1", "abort_group")], None)


def test_when_every_member_fails_the_first_is_raised_and_no_other_error_is_left_unretrieved():
    """Every rank of a broken group fails the same step: GroupFailed names the first, and asyncio does not log "Task
    exception was never retrieved" for the others' errors (it did, after the job's own cause, on stopped jobs)."""
    from tests.unretrieved import settled, watch
    s = Sender({(f"trainer/{r}", "train"): PeerDown(f"trainer/{r}", "train") for r in range(3)})
    trainers = TrainerGroup(TrainerHandle(s, f"trainer/{r}") for r in range(3))

    async def main():
        unretrieved = watch()
        member = None
        try:
            await trainers.train(1)
        except GroupFailed as exc:   # (dropped at the end of the block: its traceback holds the tasks)
            member = exc.member
        await settled()
        return member, unretrieved

    member, unretrieved = asyncio.run(main())
    assert member == "trainer/0"
    assert unretrieved == [], unretrieved


def _failing_tell(s, gone):
    tell = s.tell

    async def failing(to, method, body=None):
        if to == gone:
            raise PeerDown(to, method)
        return await tell(to, method, body)
    return failing


def test_retry_for_asks_again_while_the_peer_restarts_but_not_after_its_own_error():
    answers = iter([PeerDown("buffer/0", "accounting"), RemoteError("buffer/0", "accounting", "MailboxError", "x"),
                    ACCOUNTING])
    s = Sender({("buffer/0", "accounting"): lambda: next(answers)})
    buffer = BufferHandle(s, "buffer/0", retry_for=60)
    assert asyncio.run(buffer.accounting()) == ACCOUNTING
    assert len(s.sent) == 3
    s.replies[("buffer/0", "accounting")] = RemoteError("buffer/0", "accounting", "KeyError", "no such thing")
    with pytest.raises(RemoteError, match="KeyError"):
        asyncio.run(buffer.accounting())
    assert len(s.sent) == 4, "an error the buffer's handler raised was asked again"


def test_each_method_shows_its_declaration_and_a_clashing_declaration_is_refused():
    import inspect

    from slime_actors.messages import CATALOG, declare

    buffer = BufferHandle(Sender(), "buffer/0")
    assert str(inspect.signature(buffer.wait_rollout)) == \
        "(rollout_id: 'int', *, kind: 'str | None' = UNSET, timeout: 'float | None' = UNSET, " \
        "hack: 'bool | None' = UNSET, ask_timeout: 'float | None' = None, idem: 'str | None' = None) " \
        "-> 'Awaitable[RolloutStats]'"
    assert buffer.wait_rollout.__doc__.startswith(CATALOG[("buffer", "wait_rollout")].doc[:40])
    rollout = {m for (r, m) in CATALOG if r in ("rollout", "*")}
    assert rollout <= set(dir(RolloutHandle)) and rollout <= set(dir(role_handles.RolloutTell))
    assert rollout - {m for (r, m) in CATALOG if r == "*"} <= set(dir(RolloutGroup)) & set(dir(role_handles.RolloutQuiet))

    def tell(self, x: int) -> None:
        """would hide the handle's tell"""

    def put(self, idem: str) -> None:
        """a field named as the handle's idempotency key"""
    for method, fn, hidden in (("tell", tell, "tell"), ("put", put, "idem")):
        try:
            declare("clashrole", method, fn)
            with pytest.raises(ValueError, match=f"clashrole.{method}: .*named '{hidden}' would hide the handle's own"):
                generate()
        finally:
            CATALOG.pop(("clashrole", method))


def test_the_generated_handles_are_those_of_the_declarations():
    """slime_actors/role_handles.py is what `python -m slime_actors.handles` writes from messages.py today (a message
    added, changed or removed there: run it again)."""
    from pathlib import Path
    path = Path(role_handles.__file__)
    assert path.read_text() == generate(), \
        "slime_actors/role_handles.py is stale: run `python -m slime_actors.handles` (messages.py changed)"


def test_a_declaration_is_refused_when_its_signature_cannot_be_a_message():
    from slime_actors.messages import CATALOG, declare

    def untyped(self, n) -> None:
        """no type"""

    def bad_default(self, n: int = 3) -> None:
        """an optional field's default is None"""

    def no_reply_text(self, n: int) -> int:
        """a reply without @message(reply=...)"""

    def keyword_only(self, *, n: int) -> None:
        """fields are plain parameters"""
    for fn, why in ((untyped, "has no type annotation"), (bad_default, "must default to None"),
                    (no_reply_text, "says what it holds"), (keyword_only, "must be a plain parameter")):
        with pytest.raises(TypeError, match=why):
            declare("badrole", fn.__name__, fn)
    assert not [k for k in CATALOG if k[0] == "badrole"]


GROUP = {"work_id": "w7", "rollout_id": 3, "kind": "train", "group_index": 2, "sampling_params": {"temperature": 1.0},
         "samples": [{"index": 8}, {"index": 9}], "attempt": 1}
BATCH = {k: [1, 2] for k in TrainBatch.KEYS}
EVAL_ROW = {"index": 3, "prompt": "2+2", "response": "4", "reward": 1.0, "label": "4"}
STATUS = {"phase": "train", "rollout_id": 3, "weight_version": 3, "engines": {"rollout/0": 3}, "last": None,
          "steps": 3, "num_rollout": 10, "trainer_generation": 0, "recoveries": [], "stopped": None}
PEER = {"endpoint": "ipc:///run/b", "pid": 7, "host": "h", "alive": True, "last_seen": 0.5, "incarnation": 0}


# (handle's target, the call, the body a hand-written ask sent, the peer's reply as its handler returns it, checks of
# the typed value)
TYPED = [
    ("buffer/0", lambda h: h.get_work("rollout/1", 3, wait=1.0, ask_timeout=10, idem="get_work:1:1"),
     {"worker": "rollout/1", "max_groups": 3, "wait": 1.0}, {"groups": [GROUP]},
     lambda r: isinstance(r, Work) and r.groups == [WorkGroup("w7", 3, "train", 2, {"temperature": 1.0},
                                                              [{"index": 8}, {"index": 9}], 1)]),
    ("buffer/0", lambda h: h.submit("rollout/1", "w7", [{"index": 8}], ask_timeout=60, idem="w7:1:8:2:5"),
     {"worker": "rollout/1", "work_id": "w7", "samples": [{"index": 8}]},
     {"accepted": False, "reason": "stale weight version; regenerated"},
     lambda r: r == Submitted(False, "stale weight version; regenerated")),
    ("buffer/0", lambda h: h.return_work("rollout/1", "w7", reason="aborted", samples=[{"index": 8}], ask_timeout=30),
     {"worker": "rollout/1", "work_id": "w7", "samples": [{"index": 8}], "reason": "aborted"},
     {"requeued": True, "partial": True}, lambda r: r == Returned(True, True, None)),
    ("buffer/0", lambda h: h.return_work("rollout/1", "w7", reason="engine restarted", ask_timeout=30),
     {"worker": "rollout/1", "work_id": "w7", "reason": "engine restarted"},
     {"requeued": False, "reason": "w7 is not leased to rollout/1"},
     lambda r: r == Returned(False, False, "w7 is not leased to rollout/1")),
    ("buffer/0", lambda h: h.release_worker("rollout/1", reason="restarted", ask_timeout=30),
     {"worker": "rollout/1", "reason": "restarted"}, {"requeued": 2}, lambda r: r == Released(2)),
    ("buffer/0", lambda h: h.get_batch(4, 0, 2, ask_timeout=600), {"rollout_id": 4, "rank": 0, "world_size": 2},
     BATCH, lambda r: isinstance(r, TrainBatch) and r.wire is BATCH and len(r) == 2),
    ("controller/0", lambda h: h.trainer_join(0, 2, "10.0.0.1", 29500, 4242, ask_timeout=3600),
     {"rank": 0, "world_size": 2, "addr": "10.0.0.1", "port": 29500, "pid": 4242},
     {"master_addr": "10.0.0.1", "master_port": 29500, "generation": 1, "checkpoint": None},
     lambda r: r == Joined("10.0.0.1", 29500, 1, None)),
    ("reward/0", lambda h: h.score([{"index": 8}], group=False, ask_timeout=300), {"samples": [{"index": 8}],
                                                                                    "group": False},
     {"rewards": [None], "errors": ["boom"]}, lambda r: r == Scores([None], ["boom"], [])),
    ("rollout/0", lambda h: h.weight_update(False, weight_version=None, ask_timeout=60),
     {"active": False, "weight_version": None},
     {"engine_url": "http://h:1", "paused": None, "flush_cache": True, "tp_size": 2},
     lambda r: r == DirectUpdate("http://h:1", None, True, 2)),
    ("rollout/0", lambda h: h.router_url(ask_timeout=600), {}, {"url": "http://h:2"},
     lambda r: r == RouterUrl("http://h:2")),
    # maps where they are used (TypedDicts): the reply itself, its keys checked
    ("buffer/0", lambda h: h.accounting(), {}, ACCOUNTING, lambda r: r is not None and r["lost"] == 0),
    ("buffer/0", lambda h: h.rollback(path="/ckpt/iter_0000004", if_ahead_of=4, token="t", ask_timeout=600),
     {"path": "/ckpt/iter_0000004", "if_ahead_of": 4, "token": "t"},
     {"rolled_back": False, "reason": "no rollout from 4 on"}, lambda r: r["rolled_back"] is False),
    ("buffer/0", lambda h: h.eval_results(7001), {"rollout_id": 7001}, [EVAL_ROW], lambda r: r == [EVAL_ROW]),
    ("buffer/0", lambda h: h.start_rollout(3, weight_version=2), {"rollout_id": 3, "weight_version": 2},
     {"groups": 4, "new_groups": 4, "rollout_id": 3, "kind": "train"}, lambda r: r["groups"] == 4),
    ("controller/0", lambda h: h.status(), {}, STATUS, lambda r: r["phase"] == "train"),
    ("directory/0", lambda h: h.lookup("buffer/0", wait=5.0), {"name": "buffer/0", "wait": 5.0}, "ipc:///run/b",
     lambda r: r == "ipc:///run/b"),
    ("directory/0", lambda h: h.list(), {}, {"buffer/0": PEER}, lambda r: r["buffer/0"]["alive"]),
    ("rollout/0", lambda h: h.end_rollout(3, ask_timeout=120), {"rollout_id": 3}, {"aborted": 2, "returned": 2},
     lambda r: r["returned"] == 2),
]

TYPED_IDS = ["get_work", "submit", "return_work-samples", "return_work", "release_worker", "get_batch", "trainer_join",
             "score", "weight_update", "router_url", "accounting", "rollback", "eval_results", "start_rollout",
             "status", "lookup", "list", "end_rollout"]


@pytest.mark.parametrize("target,call,body,reply,check", TYPED, ids=TYPED_IDS)
def test_replies_of_a_fixed_shape_come_back_typed_and_the_body_is_the_hand_written_one(target, call, body, reply,
                                                                                        check):
    class Answer(Sender):
        async def ask(self, to, method, body=None, **kw):
            await super().ask(to, method, body, **kw)
            return reply
    a = Answer()
    typed = asyncio.run(call(Handle(a, target)))
    assert check(typed), typed
    (kind, to, method, sent, timeout), = a.sent
    assert (kind, to) == ("ask", target)
    assert list(sent.items()) == list(body.items()), "the body differs from the hand-written ask's (order included)"


@pytest.mark.parametrize("target,call,body,reply,check", TYPED, ids=TYPED_IDS)
def test_a_reply_lacking_what_its_type_needs_is_an_error_naming_the_method(target, call, body, reply, check):
    class Answer(Sender):
        async def ask(self, to, method, body=None, **kw):
            await super().ask(to, method, body, **kw)
            return [{"unexpected": 1}] if isinstance(reply, list) else {"unexpected": 1}
    with pytest.raises(ReplyError, match=r"\w+\.\w+ replied .+; .*needs "):
        asyncio.run(call(Handle(Answer(), target)))


def test_a_group_in_get_work_lacking_a_field_is_named():
    bad = {k: v for k, v in GROUP.items() if k != "sampling_params"}
    with pytest.raises(ReplyError, match=r"buffer.get_work replied .*a group needs .*sampling_params"):
        Work.from_wire({"groups": [GROUP, bad]})
    assert WorkGroup.from_wire({k: v for k, v in GROUP.items() if k != "attempt"}).attempt == 0


def test_idem_is_the_asks_idempotency_key_and_only_a_key_given_is_passed():
    s = Sender({("buffer/0", "get_work"): {"groups": []}})
    buffer = Handle(s, "buffer/0")
    assert asyncio.run(buffer.get_work("rollout/1", 2, wait=1.0, ask_timeout=10, idem="get_work:7:1")) == Work([])
    asyncio.run(buffer.mark_trained(3))
    assert s.idem == [{"idem": "get_work:7:1"}, {}]
    assert s.sent[0][3] == {"worker": "rollout/1", "max_groups": 2, "wait": 1.0}, "idem went into the body"
    with pytest.raises(TypeError, match=r"buffer\.submit: idem must be a str"):
        buffer.submit("rollout/1", "w", [], idem=3)
    with pytest.raises(TypeError, match=r"resume\(\) got an unexpected keyword argument 'idem'"):
        Handle(s, "rollout/0").tell.resume(1, idem="k")         # a tell has no reply to repeat
    assert len(s.sent) == 2, "a bad call sent something"


def test_node_agents_take_their_declared_messages_through_handles(loop_thread, run_dir):
    """launch/job.py's agents talk through handles on the `agent` role: the head's agent stops another node's with
    stop_node, an agent that gives up tells the head's with node_failed; each arrives as the handler expects."""
    from slime_actors.launch.job import NodeAgent
    from slime_actors.runtime import RuntimeConfig
    head, other = NodeAgent(0), NodeAgent(1)
    peers_of_other: dict = {}
    ep_other = loop_thread.call(other.start(RuntimeConfig(run_dir=run_dir, curve=False, static_peers=peers_of_other)))
    ep_head = loop_thread.call(head.start(RuntimeConfig(run_dir=run_dir, curve=False,
                                                        static_peers={"agent/1": ep_other})))
    peers_of_other["agent/0"] = ep_head
    failed = loop_thread.call(Handle(other, "agent/0").node_failed("agent/1", "restart intensity exceeded",
                                                                   ask_timeout=10))
    assert failed is None and head.node_failures == ["agent/1: restart intensity exceeded"]
    with pytest.raises(TypeError, match="node_failed"):
        Handle(other, "agent/0").node_failed("agent/1")          # the reason is required: refused before sending
    reply = loop_thread.call(Handle(head, "agent/1").stop_node(reason="the job ended", ask_timeout=10))
    assert reply == {"stopping": True, "processes": 0}
    assert other.stop_requested.is_set() and other.stop_reason == "the job ended"
    for a in (other, head):
        loop_thread.call(a.stop())
