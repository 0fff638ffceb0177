"""Typed role handles (slime_actors/handles.py): a call is checked against messages.py where it is written, the body
sent is what a hand-written ask sent, replies come back typed, groups fan out. No processes: the sender is a fake
that records what it was asked to send."""

from __future__ import annotations

import asyncio

import pytest

from slime_actors.handles import Group, GroupFailed, Handle
from slime_actors.mailbox.errors import PeerDown, RemoteError
from slime_actors.messages import ReplyError, RolloutStats


class Sender:
    """Stands in for an actor: records (kind, to, method, body, timeout); answers from `replies` (or raises)."""

    def __init__(self, replies=None):
        self.sent: list[tuple] = []
        self.replies = replies or {}

    async def ask(self, to, method, body=None, *, timeout=None):
        self.sent.append(("ask", to, method, body, timeout))
        reply = self.replies.get((to, method))
        if callable(reply):
            reply = reply()
        if isinstance(reply, BaseException):
            raise reply
        return reply

    async def tell(self, to, method, body=None):
        self.sent.append(("tell", to, method, body, None))
        return "id"


STATS = {"complete": True, "rollout_id": 3, "kind": "train", "groups": 4, "target": 4, "samples": 16, "filtered": 0,
         "failed": 0, "reward_mean": 0.5, "response_len_mean": 7.0, "examples": [{"reward": 1.0}],
         "weight_versions": [2], "seconds": 1.5}


def test_a_call_sends_the_declared_message_with_the_fields_in_the_order_given():
    s = Sender({("buffer/0", "start_rollout"): {"groups": 4}})
    buffer = Handle(s, "buffer/0")
    assert asyncio.run(buffer.start_rollout(7, kind="eval", name="gsm8k", weight_version=2)) == {"groups": 4}
    kind, to, method, body, timeout = s.sent[0]
    assert (kind, to, method, timeout) == ("ask", "buffer/0", "start_rollout", 300.0)
    assert list(body.items()) == [("rollout_id", 7), ("kind", "eval"), ("name", "gsm8k"), ("weight_version", 2)]
    # an optional field left out is not sent; ask_timeout bounds the ask and is not a field
    asyncio.run(buffer.mark_trained(rollout_id=7, ask_timeout=12))
    assert s.sent[1] == ("ask", "buffer/0", "mark_trained", {"rollout_id": 7}, 12)


def test_an_unknown_method_is_an_error_at_the_call_site_naming_it():
    buffer = Handle(Sender(), "buffer/0")
    with pytest.raises(AttributeError) as exc:
        buffer.strat_rollout(1)
    msg = str(exc.value)
    assert "buffer.strat_rollout" in msg and "start_rollout" in msg and "messages.py" in msg
    with pytest.raises(AttributeError, match="trainer.mark_trained"):
        Group([Handle(Sender(), "trainer/0")]).mark_trained(1)


def test_a_wrong_argument_is_an_error_at_the_call_site_naming_it_and_nothing_is_sent():
    s = Sender()
    buffer = Handle(s, "buffer/0")
    with pytest.raises(TypeError, match=r"buffer\.start_rollout: .*'rolout_id'"):
        buffer.start_rollout(rolout_id=1)                       # unknown field
    with pytest.raises(TypeError, match=r"buffer\.wait_rollout: .*rollout_id"):
        buffer.wait_rollout(kind="eval")                        # a required field missing
    with pytest.raises(TypeError, match=r"buffer\.start_rollout: field 'rollout_id' must be int, got str"):
        buffer.start_rollout("1")                               # wrong type
    with pytest.raises(TypeError, match=r"buffer\.start_rollout: .*positional"):
        buffer.start_rollout(1, "eval")                         # an optional field given by position
    with pytest.raises(TypeError, match=r"trainer\.train: .*'rollout'"):
        Group([Handle(s, "trainer/0"), Handle(s, "trainer/1")]).train(rollout=1)
    assert s.sent == [], "a bad call sent something"


def test_a_handle_needs_a_declared_role_and_a_role_index_name():
    with pytest.raises(ValueError, match="no messages are declared for role 'bufer'"):
        Handle(Sender(), "bufer/0")
    with pytest.raises(ValueError, match="not role/index"):
        Handle(Sender(), "buffer")
    with pytest.raises(ValueError, match="one role"):
        Group([Handle(Sender(), "buffer/0"), Handle(Sender(), "trainer/0")])


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
    trainers = Group(Handle(s, f"trainer/{r}") for r in range(2))
    assert asyncio.run(trainers.train(5)) == [{"loss": 0.1}, {"loss": 0.2}]
    asyncio.run(trainers.tell.abort_group(generation=1, reason="rank died"))
    assert [x[:4] for x in s.sent[2:]] == [("tell", f"trainer/{r}", "abort_group", {"generation": 1,
                                                                                    "reason": "rank died"})
                                           for r in range(2)]
    engines = Group(Handle(s, f"rollout/{i}") for i in range(3))
    assert engines.only(["rollout/2", "rollout/0"]).names == ["rollout/0", "rollout/2"]
    with pytest.raises(ValueError, match="rollout/7: not members"):
        engines.only(["rollout/7"])


def test_a_group_call_that_fails_names_the_member_and_whether_it_is_gone():
    gone = PeerDown("trainer/1", "train")
    s = Sender({("trainer/0", "train"): {"loss": 0.1}, ("trainer/1", "train"): gone})
    trainers = Group(Handle(s, f"trainer/{r}") for r in range(2))
    with pytest.raises(GroupFailed) as exc:
        asyncio.run(trainers.train(1))
    assert exc.value.member == "trainer/1" and exc.value.confirmed and str(exc.value).startswith("train: ")
    s.replies[("trainer/1", "train")] = RemoteError("trainer/1", "train", "ValueError", "bad batch")
    with pytest.raises(GroupFailed) as exc:
        asyncio.run(trainers.train(1))
    assert not exc.value.confirmed, "an error the rank raised is not a rank that is gone"
    # quietly: a member that fails answers None
    assert asyncio.run(trainers.quietly.train(1)) == [{"loss": 0.1}, None]


def test_retry_for_asks_again_while_the_peer_restarts_but_not_after_its_own_error():
    answers = iter([PeerDown("buffer/0", "accounting"), RemoteError("buffer/0", "accounting", "MailboxError", "x"),
                    {"issued": 3}])
    s = Sender({("buffer/0", "accounting"): lambda: next(answers)})
    buffer = Handle(s, "buffer/0", retry_for=60)
    assert asyncio.run(buffer.accounting()) == {"issued": 3}
    assert len(s.sent) == 3
    s.replies[("buffer/0", "accounting")] = RemoteError("buffer/0", "accounting", "KeyError", "no such thing")
    with pytest.raises(RemoteError, match="KeyError"):
        asyncio.run(buffer.accounting())
    assert len(s.sent) == 4, "an error the buffer's handler raised was asked again"


def test_each_method_shows_its_declaration_and_a_clashing_declaration_is_refused():
    import inspect

    from slime_actors.handles import specs_of
    from slime_actors.messages import CATALOG, declare

    buffer = Handle(Sender(), "buffer/0")
    assert str(inspect.signature(buffer.wait_rollout)) == \
        "(rollout_id, *, kind=None, timeout=None, ask_timeout=None)"
    assert buffer.wait_rollout.__doc__.startswith(CATALOG[("buffer", "wait_rollout")].doc)
    assert set(specs_of("rollout")) <= set(dir(Handle(Sender(), "rollout/0")))
    try:
        declare("clashrole", "tell", "would hide Handle.tell")
        with pytest.raises(ValueError, match="clashrole.tell: .*would hide"):
            Handle(Sender(), "clashrole/0")
    finally:
        CATALOG.pop(("clashrole", "tell"))
