"""The buffer broker: leases, submissions, refusals, filters, failures, persistence across a restart, accounting."""

import asyncio
import json
import time

import pytest
from structlog.testing import capture_logs

from slime_actors.actors.base import Actor, handler
from slime_actors.actors.buffer import Buffer
from slime_actors.actors.rollout import submit_key
from slime_actors.config import parse_config
from slime_actors.mailbox import RemoteError
from slime_actors.models.tiny import make_tiny_model
from slime_actors.runtime import RuntimeConfig
from slime_actors.types import Sample, packed_columns


class Worker(Actor):
    role = "rollout"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "m"))


def make_args(tmp_path, tiny, *extra):
    data = tmp_path / "p.jsonl"
    with open(data, "w") as f:
        for i in range(40):
            f.write(json.dumps({"input": f"{i % 10} {i // 10} first =", "label": str(i % 10)}) + "\n")
    return parse_config(["--prompt-data", str(data), "--hf-checkpoint", tiny, "--rm-type", "exact_match",
                         "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--input-key",
                         "input", "--label-key", "label", *extra]).to_dict()


def finish(group, reward=1.0, version=0, status="completed"):
    out = []
    for s in group["samples"]:
        s = dict(s)
        s.update(response_tokens=[5], loss_mask=[1], rollout_log_probs=[-0.5], response="3", reward=reward,
                 status=status, weight_version=version, weight_versions=[version])
        out.append(s)
    return out


def start(loop_thread, run_dir, args):
    rt = RuntimeConfig(run_dir=run_dir, curve=False)
    b = Buffer(0, args=args)
    ep = loop_thread.call(b.start(rt))
    w1, w2 = Worker(1), Worker(2)
    for w in (w1, w2):
        loop_thread.call(w.start(RuntimeConfig(run_dir=run_dir, curve=False, static_peers={"buffer/0": ep})))
    return b, w1, w2


def ask(loop_thread, w, method, body):
    return loop_thread.call(w.ask("buffer/0", method, body, timeout=10))


def long_poll(loop_thread, b, w):
    """rollout/1's get_work (a 60 s long poll), sent by `w` and waiting in buffer `b`: its future."""
    import asyncio
    pending = asyncio.run_coroutine_threadsafe(w.ask("buffer/0", "get_work", {"worker": "rollout/1",
                                                                            "max_groups": 10, "wait": 60.0},
                                                     timeout=120), loop_thread.loop)

    async def waiting():
        while not b._changed._waiters:
            await asyncio.sleep(0.01)
    loop_thread.call(waiting())
    return pending


def test_a_get_work_waiting_when_its_worker_is_released_takes_nothing(loop_thread, run_dir, tmp_path, tiny):
    """A killed rollout worker's last get_work may still wait in the buffer (it long-polls) when its restarted
    process asks release_worker, which the new process now does at once (it starts its engine meanwhile). That ask
    must not take the groups just re-issued: they would be leased to the worker's name, its reply lost with the
    dead process, and the rollout would wait for their lease to run out (tests/test_fault_tolerance.py's
    test_kill_rollout_worker hung at the next step)."""
    b, w1, w2 = start(loop_thread, run_dir, make_args(tmp_path, tiny))
    assert ask(loop_thread, w1, "start_rollout", {"rollout_id": 0})["new_groups"] == 4
    held = ask(loop_thread, w1, "get_work", {"worker": "rollout/1", "max_groups": 10})["groups"]
    assert len(held) == 4
    # the old process's next ask waits: nothing is left to lease
    pending = long_poll(loop_thread, b, w1)
    assert ask(loop_thread, w2, "release_worker", {"worker": "rollout/1", "reason": "restarted"})["requeued"] == 4
    assert pending.result(60) == {"groups": []}
    # the groups wait for the new process, not for their lease to run out
    again = ask(loop_thread, w2, "get_work", {"worker": "rollout/1", "max_groups": 10})["groups"]
    assert sorted(g["work_id"] for g in again) == sorted(g["work_id"] for g in held)


def test_a_get_work_waiting_on_a_held_rollout_takes_its_groups_when_it_is_opened(loop_thread, run_dir, tmp_path,
                                                                                  tiny):
    """Rollout 1 made ahead (held) while rollout 0 trains: a worker's long poll takes none of it -- its engine may
    not have the new weights yet -- and gets its groups as soon as the controller opens it, not after its wait."""
    b, w1, w2 = start(loop_thread, run_dir, make_args(tmp_path, tiny))
    ask(loop_thread, w1, "start_rollout", {"rollout_id": 0})
    for g in ask(loop_thread, w1, "get_work", {"worker": "rollout/1", "max_groups": 10})["groups"]:
        assert ask(loop_thread, w1, "submit", {"worker": "rollout/1", "work_id": g["work_id"],
                                               "samples": finish(g)})["accepted"]
    assert ask(loop_thread, w1, "start_rollout", {"rollout_id": 1, "weight_version": 1, "hold": True}) == \
        {"groups": 4, "new_groups": 4, "rollout_id": 1, "kind": "train", "held": True}
    assert ask(loop_thread, w1, "get_work", {"worker": "rollout/1", "max_groups": 10, "wait": 0.2}) == {"groups": []}
    pending = long_poll(loop_thread, b, w1)
    assert ask(loop_thread, w2, "start_rollout", {"rollout_id": 1, "weight_version": 1})["opened"]
    assert [g["rollout_id"] for g in pending.result(30)["groups"]] == [1, 1, 1, 1]   # (long before its 60 s)


def test_a_complete_rollouts_shards_are_made_once_it_is_reported_and_are_what_get_batch_makes(loop_thread, run_dir,
                                                                                              tmp_path, tiny):
    """Once wait_rollout has reported a complete training rollout, the buffer makes the trainer ranks' shards (as
    they last asked: world size, packed) while the controller's train and the ranks' get_batch travel; get_batch
    answers with them -- the same shard it would make then -- and nothing is kept once the rollout is trained."""
    b, w1, _ = start(loop_thread, run_dir, make_args(tmp_path, tiny))

    def complete(k):
        ask(loop_thread, w1, "start_rollout", {"rollout_id": k})
        for g in ask(loop_thread, w1, "get_work", {"worker": "rollout/1", "max_groups": 10})["groups"]:
            ask(loop_thread, w1, "submit", {"worker": "rollout/1", "work_id": g["work_id"], "samples": finish(g)})
        assert ask(loop_thread, w1, "wait_rollout", {"rollout_id": k, "hack": False})["complete"]
    complete(0)
    assert b._batches == {}   # (no rank asked yet: the shape is not known)
    for rank in (0, 1):
        ask(loop_thread, w1, "get_batch", {"rollout_id": 0, "rank": rank, "world_size": 2, "packed": True})
    ask(loop_thread, w1, "mark_trained", {"rollout_id": 0})
    complete(1)
    assert sorted(b._batches) == [(1, 0, 2, True), (1, 1, 2, True)]
    fresh = [b.state.batch(1, rank, 2, packed=True) for rank in (0, 1)]
    got = [ask(loop_thread, w1, "get_batch", {"rollout_id": 1, "rank": rank, "world_size": 2, "packed": True})
           for rank in (0, 1)]
    assert got == fresh and b._batches == {}
    complete(2)
    assert len(b._batches) == 2
    ask(loop_thread, w1, "mark_trained", {"rollout_id": 2})
    assert b._batches == {}


def test_each_groups_columns_are_packed_as_it_is_handed_in_and_a_shard_joins_them(loop_thread, run_dir, tmp_path,
                                                                                   tiny):
    """A done training group's per-token columns are packed once it is handed in (after the reply), while the buffer
    waits for the rest of the rollout; a shard joins them -- the same bytes as packing it whole. A group handed in
    again after it went back (other samples) gets columns of its new samples; all are forgotten once the rollout is
    trained. Filtered and failed groups get none."""
    b, w1, _ = start(loop_thread, run_dir, make_args(tmp_path, tiny))
    ask(loop_thread, w1, "start_rollout", {"rollout_id": 0})
    groups = ask(loop_thread, w1, "get_work", {"worker": "rollout/1", "max_groups": 10})["groups"]
    first, rest = groups[0], groups[1:]
    ask(loop_thread, w1, "submit", {"worker": "rollout/1", "work_id": first["work_id"], "samples": finish(first)})
    loop_thread.call(asyncio.sleep(0))   # (a turn of the buffer's loop: after the submit's reply)
    made = b._columns[first["work_id"]]
    assert made[0] is b.state.groups[first["work_id"]].samples
    assert made[1] == packed_columns(b.state.groups[first["work_id"]].samples)
    failed = finish(rest[0])
    failed[0].update(status="failed", reward=None, error="reward failed: boom")
    ask(loop_thread, w1, "submit", {"worker": "rollout/1", "work_id": rest[0]["work_id"], "samples": failed})
    for g in rest[1:]:
        ask(loop_thread, w1, "submit", {"worker": "rollout/1", "work_id": g["work_id"], "samples": finish(g)})
    (last,) = ask(loop_thread, w1, "get_work", {"worker": "rollout/1", "max_groups": 10})["groups"]
    ask(loop_thread, w1, "submit", {"worker": "rollout/1", "work_id": last["work_id"], "samples": finish(last)})
    assert ask(loop_thread, w1, "wait_rollout", {"rollout_id": 0, "hack": False})["complete"]
    done = b.state._in_group_order(b.state.rollouts["train:0"])
    # (not the group that completed the rollout: wait_rollout's reply would wait for them; the shard makes them)
    assert sorted(b._columns) == sorted(set(done) - {last["work_id"]}) and rest[0]["work_id"] not in b._columns
    # a group's samples replaced (as a requeue and a new submission do): its columns are made again
    g = b.state.groups[done[1]]
    g.samples = [Sample.from_wire(x) for x in finish(g.wire(), reward=0.5)]
    for x in g.samples:
        x.response_tokens = x.response_tokens + [9]
        x.loss_mask, x.rollout_log_probs = x.loss_mask + [1], x.rollout_log_probs + [-3.0]
    whole = [b.state.batch(0, rank, 2, packed=True) for rank in (0, 1)]
    got = [ask(loop_thread, w1, "get_batch", {"rollout_id": 0, "rank": rank, "world_size": 2, "packed": True})
           for rank in (0, 1)]
    assert got == whole and b._columns[done[1]][0] is g.samples and sorted(b._columns) == sorted(done)
    ask(loop_thread, w1, "mark_trained", {"rollout_id": 0})
    assert b._columns == {}


def test_a_rollouts_last_groups_in_one_burst_are_reported_before_their_columns_are_packed(loop_thread, run_dir,
                                                                                           tmp_path, tiny):
    """At a rollout's end its last groups come in together (one drain of the buffer's socket runs their submits back
    to back): wait_rollout's reply, which starts the trainers, does not wait behind the packing of their columns --
    the shard packs them -- and the shard is what packing it whole gives."""
    b, w1, _ = start(loop_thread, run_dir, make_args(tmp_path, tiny))
    ask(loop_thread, w1, "start_rollout", {"rollout_id": 0})
    groups = ask(loop_thread, w1, "get_work", {"worker": "rollout/1", "max_groups": 10})["groups"]
    first, burst = groups[0], groups[1:]
    assert len(burst) >= 2
    ask(loop_thread, w1, "submit", {"worker": "rollout/1", "work_id": first["work_id"], "samples": finish(first)})
    loop_thread.call(asyncio.sleep(0))   # (handed in during generation: packed on the next turn of the loop)
    handlers = type(b)._handlers

    async def burst_then_report():
        waiter = asyncio.ensure_future(handlers["wait_rollout"].fn(b, rollout_id=0, hack=False))
        await asyncio.sleep(0)
        submits = [asyncio.ensure_future(handlers["submit"].fn(b, worker="rollout/1", work_id=g["work_id"],
                                                                samples=finish(g))) for g in burst]
        stats = await waiter
        packed_when_reported = sorted(b._columns)
        await asyncio.gather(*submits)
        return stats, packed_when_reported
    stats, packed_when_reported = loop_thread.call(burst_then_report())
    assert stats["complete"] and packed_when_reported == [first["work_id"]]
    whole = [b.state.batch(0, rank, 2, packed=True) for rank in (0, 1)]
    got = [ask(loop_thread, w1, "get_batch", {"rollout_id": 0, "rank": rank, "world_size": 2, "packed": True})
           for rank in (0, 1)]
    assert got == whole


def _complete(loop_thread, w, k):
    """Training rollout k started, every group leased to rollout/1 and handed in; wait_rollout's reply."""
    ask(loop_thread, w, "start_rollout", {"rollout_id": k})
    for g in ask(loop_thread, w, "get_work", {"worker": "rollout/1", "max_groups": 10})["groups"]:
        ask(loop_thread, w, "submit", {"worker": "rollout/1", "work_id": g["work_id"], "samples": finish(g)})
    stats = ask(loop_thread, w, "wait_rollout", {"rollout_id": k, "hack": False})
    assert stats["complete"]
    return stats


def _ask_later(loop_thread, w, method, body, timeout=60):
    import asyncio
    return asyncio.run_coroutine_threadsafe(w.ask("buffer/0", method, body, timeout=timeout), loop_thread.loop)


def test_a_shard_asked_for_ahead_comes_once_its_rollout_is_complete_with_the_id_wait_rollout_names(
        loop_thread, run_dir, tmp_path, tiny):
    """A trainer rank asks for rollout 1's shard right after training on rollout 0, before rollout 1 is even
    started: the ask waits, and is answered once the rollout is complete with the shard get_batch would give and the
    batch id wait_rollout reports (the controller's `train` names it). The shard is taken: no second one is made."""
    b, w1, w2 = start(loop_thread, run_dir, make_args(tmp_path, tiny))
    s0 = _complete(loop_thread, w1, 0)
    for rank in (0, 1):
        ask(loop_thread, w1, "get_batch", {"rollout_id": 0, "rank": rank, "world_size": 2, "packed": True})
    ask(loop_thread, w1, "mark_trained", {"rollout_id": 0})
    ahead = [_ask_later(loop_thread, w2, "wait_batch", {"rollout_id": 1, "rank": rank, "world_size": 2,
                                                        "packed": True}) for rank in (0, 1)]
    ask(loop_thread, w1, "start_rollout", {"rollout_id": 1})
    assert not any(f.done() for f in ahead)            # (started, not complete)
    s1 = _complete(loop_thread, w1, 1)
    got = [f.result(30) for f in ahead]
    assert [g["batch_id"] for g in got] == [s1["batch_id"]] * 2 and s1["batch_id"] != s0["batch_id"]
    assert [g["batch"] for g in got] == [b.state.batch(1, rank, 2, packed=True) for rank in (0, 1)]
    assert b._batches == {} and b._served[1] == {0, 1}   # (taken: the shards made for get_batch are not made)
    # asked once the rollout is complete: at once; once it is trained: nothing
    assert ask(loop_thread, w2, "wait_batch", {"rollout_id": 1, "rank": 0, "world_size": 2,
                                               "packed": True})["batch_id"] == s1["batch_id"]
    ask(loop_thread, w1, "mark_trained", {"rollout_id": 1})
    assert ask(loop_thread, w2, "wait_batch", {"rollout_id": 1, "rank": 0, "world_size": 2}) is None


def test_a_shard_asked_for_ahead_is_nothing_after_its_timeout_or_a_rollback(loop_thread, run_dir, tmp_path, tiny):
    """A rollout that does not complete within the ask's timeout: the answer is nil (the rank fetches its shard
    when told to train). A rollback while the ask waits (the rollout is made again, under other work ids): nil at
    once -- and the rollout made again has another batch id."""
    b, w1, w2 = start(loop_thread, run_dir, make_args(tmp_path, tiny))
    ask(loop_thread, w1, "start_rollout", {"rollout_id": 0})
    assert ask(loop_thread, w2, "wait_batch", {"rollout_id": 0, "rank": 0, "world_size": 1, "timeout": 0.2}) is None
    first = _complete(loop_thread, w1, 0)
    waiting = _ask_later(loop_thread, w2, "wait_batch", {"rollout_id": 1, "rank": 0, "world_size": 1})
    ask(loop_thread, w1, "rollback", {"path": None, "if_ahead_of": 0, "reason": "test", "token": "t1"})
    assert waiting.result(30) is None
    again = _complete(loop_thread, w1, 0)
    assert again["batch_id"] != first["batch_id"]


def test_a_shard_asked_for_ahead_of_a_rollout_that_never_comes_is_nothing_when_the_buffer_stops(loop_thread,
                                                                                               run_dir, tmp_path,
                                                                                               tiny):
    """The job ends (or stops early) with a rank's ask for the next rollout's shard waiting: answered with nil, and
    no handler error in the buffer's log."""
    b, w1, w2 = start(loop_thread, run_dir, make_args(tmp_path, tiny))
    waiting = _ask_later(loop_thread, w2, "wait_batch", {"rollout_id": 7, "rank": 0, "world_size": 1})
    deadline = time.monotonic() + 10
    while "train:7" not in b._rollout_events and time.monotonic() < deadline:
        time.sleep(0.01)
    with capture_logs() as logs:
        loop_thread.call(b.stop())
    assert waiting.result(30) is None
    assert not [e for e in logs if e["event"] == "handler failed"], logs


def test_lease_submit_refuse_release_and_complete(loop_thread, run_dir, tmp_path, tiny):
    args = make_args(tmp_path, tiny, "--over-sampling-batch-size", "5")
    b, w1, w2 = start(loop_thread, run_dir, args)
    r = ask(loop_thread, w1, "start_rollout", {"rollout_id": 0})
    assert r["new_groups"] == 5
    got = ask(loop_thread, w1, "get_work", {"worker": "rollout/1", "max_groups": 3})["groups"]
    assert len(got) == 3 and all(len(g["samples"]) == 2 for g in got)
    assert got[0]["sampling_params"]["max_new_tokens"] == 32
    # a worker cannot submit another worker's group
    other = ask(loop_thread, w2, "submit", {"worker": "rollout/2", "work_id": got[0]["work_id"],
                                           "samples": finish(got[0])})
    assert not other["accepted"] and "leased to rollout/1" in other["reason"]
    assert ask(loop_thread, w1, "submit", {"worker": "rollout/1", "work_id": got[0]["work_id"],
                                          "samples": finish(got[0])})["accepted"]
    # a duplicate is refused, and nothing is counted twice
    dup = ask(loop_thread, w1, "submit", {"worker": "rollout/1", "work_id": got[0]["work_id"],
                                         "samples": finish(got[0])})
    assert not dup["accepted"] and "is done" in dup["reason"]
    # rollout/1 dies: its other two groups go back to the queue and rollout/2 gets them
    assert ask(loop_thread, w2, "release_worker", {"worker": "rollout/1"})["requeued"] == 2
    got2 = ask(loop_thread, w2, "get_work", {"worker": "rollout/2", "max_groups": 10})["groups"]
    assert {g["work_id"] for g in got[1:]} <= {g["work_id"] for g in got2}
    assert len(got2) == 4
    # malformed submissions are errors that name the problem
    bad = finish(got2[0])
    bad[0]["loss_mask"] = []
    with pytest.raises(RemoteError, match="1 response tokens but 0 loss-mask entries"):
        ask(loop_thread, w2, "submit", {"worker": "rollout/2", "work_id": got2[0]["work_id"], "samples": bad})
    with pytest.raises(RemoteError, match="expected 2 samples, got 1"):
        ask(loop_thread, w2, "submit", {"worker": "rollout/2", "work_id": got2[0]["work_id"],
                                       "samples": finish(got2[0])[:1]})
    for g in got2[:3]:
        ask(loop_thread, w2, "submit", {"worker": "rollout/2", "work_id": g["work_id"], "samples": finish(g)})
    st = ask(loop_thread, w2, "wait_rollout", {"rollout_id": 0, "timeout": 5.0})
    assert st["complete"] and st["groups"] == 4 and st["samples"] == 8 and st["reward_mean"] == 1.0
    batch0 = ask(loop_thread, w2, "get_batch", {"rollout_id": 0, "rank": 0, "world_size": 2})
    batch1 = ask(loop_thread, w2, "get_batch", {"rollout_id": 0, "rank": 1, "world_size": 2})
    assert len(batch0["tokens"]) == 4 and len(batch1["tokens"]) == 4
    assert not set(batch0["sample_index"]) & set(batch1["sample_index"])
    # whole groups per rank
    assert len(set(batch0["group_index"])) == 2
    ask(loop_thread, w2, "mark_trained", {"rollout_id": 0})
    acc = ask(loop_thread, w2, "accounting", {})
    assert acc["trained_once"] == 8 and acc["trained_more"] == 0 and acc["duplicated"] == []


def test_a_group_leased_again_to_the_same_worker_is_a_new_submission(loop_thread, run_dir, tmp_path, tiny):
    """Seen in the two-host test: rollout/1 finishes a group and submits it while its link is cut; the directory
    declares it down and the buffer re-issues the group; the late submission is refused (the group is queued); the
    link returns and the group is leased back to rollout/1, which generates it again and submits it. That
    submission must be judged anew, not answered from the idempotency cache with the first one's refusal."""
    args = make_args(tmp_path, tiny)
    b, w1, _ = start(loop_thread, run_dir, args)
    ask(loop_thread, w1, "start_rollout", {"rollout_id": 0})
    g1 = ask(loop_thread, w1, "get_work", {"worker": "rollout/1", "max_groups": 1})["groups"][0]
    assert ask(loop_thread, w1, "release_worker", {"worker": "rollout/1"})["requeued"] == 1  # declared down

    def submit(group):
        samples = finish(group)
        key = submit_key(group["work_id"], group["attempt"], Sample.from_wire(samples[0]))
        return loop_thread.call(w1.ask("buffer/0", "submit", {"worker": "rollout/1", "work_id": group["work_id"],
                                                              "samples": samples}, timeout=10, idem=key))

    late = submit(g1)
    assert not late["accepted"] and "is queued" in late["reason"]
    g2 = ask(loop_thread, w1, "get_work", {"worker": "rollout/1", "max_groups": 1})["groups"][0]
    assert g2["work_id"] == g1["work_id"] and g2["attempt"] == g1["attempt"] + 1
    assert submit(g2)["accepted"]
    assert submit(g2) == {"accepted": True, "outcome": "done"}  # a retry of that one: answered from the cache


def test_failed_and_filtered_groups_are_replaced(loop_thread, run_dir, tmp_path, tiny):
    args = make_args(tmp_path, tiny, "--dynamic-sampling-filter-path",
                     "slime_actors.filters.check_reward_nonzero_std")
    b, w1, _ = start(loop_thread, run_dir, args)
    ask(loop_thread, w1, "start_rollout", {"rollout_id": 0})
    groups = ask(loop_thread, w1, "get_work", {"worker": "rollout/1", "max_groups": 4})["groups"]
    # all-equal rewards: filtered; a failed reward: failed; both are replaced by fresh prompts
    ask(loop_thread, w1, "submit", {"worker": "rollout/1", "work_id": groups[0]["work_id"],
                                   "samples": finish(groups[0], reward=1.0)})
    failed = finish(groups[1])
    failed[1].update(status="failed", reward=None, error="reward failed: boom")
    assert ask(loop_thread, w1, "submit", {"worker": "rollout/1", "work_id": groups[1]["work_id"],
                                          "samples": failed})["outcome"] == "failed"
    for g in groups[2:]:
        s = finish(g)
        s[0]["reward"] = 0.0
        ask(loop_thread, w1, "submit", {"worker": "rollout/1", "work_id": g["work_id"], "samples": s})
    more = ask(loop_thread, w1, "get_work", {"worker": "rollout/1", "max_groups": 10})["groups"]
    assert len(more) == 2, "filtered and failed groups must be replaced"
    for g in more:
        s = finish(g)
        s[0]["reward"] = 0.0
        ask(loop_thread, w1, "submit", {"worker": "rollout/1", "work_id": g["work_id"], "samples": s})
    st = ask(loop_thread, w1, "wait_rollout", {"rollout_id": 0, "timeout": 5.0})
    assert st["complete"] and st["filtered"] == 1 and st["failed"] == 1 and st["groups"] == 4


def test_a_rollout_whose_groups_keep_failing_fails_its_waiters_with_the_last_error(loop_thread, run_dir, tmp_path,
                                                                                  tiny):
    """A reward that raises for every sample, a generate function that always raises: the groups fail (a group given
    back as failed is made again twice, then failed), and once --max-failed-groups of them did, the controller's
    wait_rollout -- asked before -- fails naming the count and the last error, a trainer's wait_batch is nil, and no
    more groups are made for the rollout. Before this, such a job made groups for ever."""
    b, w1, w2 = start(loop_thread, run_dir, make_args(tmp_path, tiny, "--max-failed-groups", "3"))
    ask(loop_thread, w1, "start_rollout", {"rollout_id": 0})
    waiting = _ask_later(loop_thread, w2, "wait_rollout", {"rollout_id": 0, "hack": False})
    batch = _ask_later(loop_thread, w2, "wait_batch", {"rollout_id": 0, "rank": 0, "world_size": 1})
    first = ask(loop_thread, w1, "get_work", {"worker": "rollout/1", "max_groups": 4})["groups"]
    g0, g1 = first[:2]
    failed = finish(g0)
    failed[0].update(status="failed", reward=None, error="reward failed: ValueError: no answer field")
    assert ask(loop_thread, w1, "submit", {"worker": "rollout/1", "work_id": g0["work_id"],
                                          "samples": failed})["outcome"] == "failed"
    for n in (1, 2, 3):   # a generate function that raises: given back as failed, made again, the third time failed
        reply = ask(loop_thread, w1, "return_work", {"worker": "rollout/1", "work_id": g1["work_id"],
                                                    "reason": "error: KeyError('answer')", "failed": True})
        assert reply == ({"requeued": True, "partial": False} if n < 3 else
                         {"requeued": False, "failed": True,
                          "reason": "failed 3 times; the last: error: KeyError('answer')"})
        if n < 3:
            again = ask(loop_thread, w1, "get_work", {"worker": "rollout/1", "max_groups": 10})["groups"]
            assert g1["work_id"] in [g["work_id"] for g in again]
    other = first[2]["work_id"]   # (leased since the first get_work)
    assert ask(loop_thread, w1, "return_work", {"worker": "rollout/1", "work_id": other,
                                               "reason": "rollout ended"})["requeued"]   # (not counted)
    assert b.state.groups[other].errors == 0
    assert not waiting.done()   # 2 failed groups: below the limit
    g2, *_ = ask(loop_thread, w1, "get_work", {"worker": "rollout/1", "max_groups": 10})["groups"]
    failed = finish(g2)
    failed[1].update(status="failed", reward=None, error="reward failed: ValueError: no answer field")
    ask(loop_thread, w1, "submit", {"worker": "rollout/1", "work_id": g2["work_id"], "samples": failed})
    with pytest.raises(RemoteError, match=(
            r"wait_rollout failed: RuntimeError: rollout 0 failed: 3 of its groups failed \(the limit is 3: "
            r"--max-failed-groups\), 0 of the 4 it needs completed. The last: train-\d+: sample \d+: reward failed: "
            r"ValueError: no answer field \(the rollout workers' log has every error\)")):
        waiting.result(30)
    assert batch.result(30) is None
    with pytest.raises(RemoteError, match="rollout 0 failed: 3 of its groups failed"):   # asked again: the same
        ask(loop_thread, w1, "wait_rollout", {"rollout_id": 0, "hack": False})
    assert b.state._missing("train") == 0   # no group is made in place of those that failed


def test_restart_restores_leases_and_queue(loop_thread, run_dir, tmp_path, tiny):
    args = make_args(tmp_path, tiny)
    b, w1, _ = start(loop_thread, run_dir, args)
    ask(loop_thread, w1, "start_rollout", {"rollout_id": 0})
    groups = ask(loop_thread, w1, "get_work", {"worker": "rollout/1", "max_groups": 3})["groups"]
    ask(loop_thread, w1, "submit", {"worker": "rollout/1", "work_id": groups[0]["work_id"],
                                   "samples": finish(groups[0])})
    loop_thread.call(b.stop())
    # a new buffer process on the same run directory: state comes back from the log
    b2 = Buffer(0, args=args)
    ep = loop_thread.call(b2.start(RuntimeConfig(run_dir=run_dir, curve=False)))
    w3 = Worker(3)
    loop_thread.call(w3.start(RuntimeConfig(run_dir=run_dir, curve=False, static_peers={"buffer/0": ep})))
    # the lease holder can still hand in what it was working on
    res = loop_thread.call(w3.ask("buffer/0", "submit", {"worker": "rollout/1", "work_id": groups[1]["work_id"],
                                                         "samples": finish(groups[1])}))
    assert res["accepted"]
    rest = loop_thread.call(w3.ask("buffer/0", "get_work", {"worker": "rollout/3", "max_groups": 5}))["groups"]
    assert len(rest) == 1  # 4 groups: 2 submitted, 1 still leased to rollout/1, 1 queued
    acc = loop_thread.call(w3.ask("buffer/0", "accounting", {}))
    assert acc["issued"] == 8


class Holder(Actor):
    """A rollout worker that says which of its leases it still holds (a restarted buffer asks)."""
    role = "rollout"

    def __init__(self, index, holds):
        super().__init__(index)
        self.holds = holds

    @handler
    def held_groups(self) -> list:
        return list(self.holds)


def test_restarted_buffer_reissues_leases_the_worker_no_longer_holds(loop_thread, run_dir, tmp_path, tiny):
    """After a restart the buffer asks each lease holder (rollout/N.held_groups) what it still has; a group it
    lost (the lease logged just before the crash never reached it) goes back to the queue, the one it holds stays."""
    import time as _time
    args = make_args(tmp_path, tiny)
    b, w1, _ = start(loop_thread, run_dir, args)
    ask(loop_thread, w1, "start_rollout", {"rollout_id": 0})
    groups = ask(loop_thread, w1, "get_work", {"worker": "rollout/1", "max_groups": 3})["groups"]
    loop_thread.call(b.stop())
    loop_thread.call(w1.stop())
    holder = Holder(1, [groups[0]["work_id"]])            # rollout/1 again: it holds groups[0] only
    h_ep = loop_thread.call(holder.start(RuntimeConfig(run_dir=run_dir, curve=False)))
    b2 = Buffer(0, args=args)
    ep = loop_thread.call(b2.start(RuntimeConfig(run_dir=run_dir, curve=False, static_peers={"rollout/1": h_ep})))
    w3 = Worker(3)
    loop_thread.call(w3.start(RuntimeConfig(run_dir=run_dir, curve=False, static_peers={"buffer/0": ep})))
    deadline, got = _time.monotonic() + 20, []
    while _time.monotonic() < deadline and len(got) < 3:   # the reconciliation runs beside the handlers
        got += loop_thread.call(w3.ask("buffer/0", "get_work", {"worker": "rollout/3", "max_groups": 5}))["groups"]
        _time.sleep(0.1)
    ids = [g["work_id"] for g in got]
    assert len(ids) == 3 and groups[0]["work_id"] not in ids             # 4 groups: the held one stays leased
    assert {groups[1]["work_id"], groups[2]["work_id"]} <= set(ids)      # the two it lost are handed out again
    for a in (w3, b2, holder):
        loop_thread.call(a.stop())
