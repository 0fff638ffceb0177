"""The buffer's state machine (slime_actors/buffer_state.py) without a process: numbering, leases, submissions and
refusals, carry-over, staleness, partial returns, released workers, evaluations, accounting, rollback, the event
log replayed into the same state -- and the logs, snapshots and checkpoint an older buffer wrote
(tests/data/buffer_log_v1, see its generate.py) restored by today's code."""

import copy
import json
import shutil
from pathlib import Path

import msgpack
import pytest

from slime_actors.buffer_state import (Accounts, STALE_REASON, BufferLogError, BufferSettings, BufferState, decode_event,
                                       encode_event)
from slime_actors.data import PromptDataset
from slime_actors.types import Sample, batch_from_samples

FIXTURE = Path(__file__).parent / "data" / "buffer_log_v1"
W1, W2 = "rollout/1", "rollout/2"


def write_prompts(path: Path, n: int, first: int = 0) -> Path:
    path.write_text("".join(json.dumps({"input": f"{i} + {i} =", "label": str(2 * i)}) + "\n"
                            for i in range(first, first + n)))
    return path


class Clock:
    """A wall clock the test moves; the log records its reading, so a replay sees the same times."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


class Monitor:
    """A hacking monitor's state interface (state_dict / load_state_dict)."""

    def __init__(self):
        self.state = {"seen": []}

    def state_dict(self):
        return copy.deepcopy(self.state)

    def load_state_dict(self, st):
        if "seen" not in st:
            raise ValueError("not a monitor state")
        self.state = copy.deepcopy(st)


def settings(**kw) -> BufferSettings:
    base = dict(rollout_batch_size=2, over_sampling_batch_size=3, n_samples_per_prompt=2,
                n_samples_per_eval_prompt=1, sampling={"train": {"temperature": 1.0}, "eval": {"temperature": 0.0}})
    base.update(kw)
    return BufferSettings(**base)


def datasets(tmp_path: Path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    train = PromptDataset(write_prompts(tmp_path / "train.jsonl", 10), input_key="input", label_key="label")
    ev = PromptDataset(write_prompts(tmp_path / "ev.jsonl", 3, first=100), input_key="input", label_key="label",
                       name="ev")
    return train, {"ev": ev}


def make_state(tmp_path, log: list | None = None, clock=None, **kw) -> BufferState:
    keep_group = kw.pop("keep_group", None)
    monitor = kw.pop("monitor", None)
    train, evals = datasets(tmp_path)
    clock = clock or Clock()

    def sink(ev, data):   # what the actor's log holds: (name, time, encoded fields), through msgpack
        log.append(msgpack.unpackb(msgpack.packb([ev, clock(), data], use_bin_type=True), raw=False,
                                   strict_map_key=False))
    return BufferState(settings(**kw), train, evals, clock=clock, keep_group=keep_group, monitor_factory=monitor,
                       on_event=sink if log is not None else None)


def finish(group: dict, rewards=(1.0, 0.0), version: int = 0, status: str = "completed") -> list[Sample]:
    """The group's samples as a worker hands them in: one response token each, scored."""
    out = []
    for s, r in zip(group["samples"], list(rewards) * len(group["samples"])):
        s = Sample.from_wire(dict(s))
        s.response, s.response_tokens, s.loss_mask, s.rollout_log_probs = "3", [5], [1], [-0.5]
        s.reward, s.status, s.weight_version, s.weight_versions = r, status, version, [version]
        out.append(s)
    return out


def submit(st, worker, group, **kw):
    return st.submit(worker, group["work_id"], finish(group, **kw))


def complete_rollout(st, rid, worker=W1, **kw):
    """Start rollout `rid`, hand in groups until it is complete, and return the groups left leased."""
    st.start_rollout(rid, **kw)
    groups = st.take(worker, 10)
    need = st.rollouts[f"train:{rid}"].target - len(st.rollouts[f"train:{rid}"].completed)
    for g in groups[:need]:
        assert submit(st, worker, g, version=kw.get("weight_version", 0))["accepted"]
    assert st.rollouts[f"train:{rid}"].done
    return groups[need:]


# ------------------------------------------------------------------------------------------------ numbering
def test_samples_are_numbered_by_running_counters_over_train_and_eval(tmp_path):
    st = make_state(tmp_path)
    assert st.start_rollout(0) == {"groups": 3, "new_groups": 3, "rollout_id": 0, "kind": "train"}
    assert st.start_rollout(0, kind="eval", name="ev")["new_groups"] == 3
    got = st.take(W1, 10)
    assert [g["work_id"] for g in got] == ["eval-3", "eval-4", "eval-5", "train-0", "train-1", "train-2"]
    assert [[s["index"] for s in g["samples"]] for g in got] == [[6], [7], [8], [0, 1], [2, 3], [4, 5]]
    assert [g["group_index"] for g in got] == [3, 4, 5, 0, 1, 2]
    assert [g["samples"][0]["prompt"] for g in got] == ["100 + 100 =", "101 + 101 =", "102 + 102 =", "0 + 0 =",
                                                        "1 + 1 =", "2 + 2 ="]
    assert all(s["rollout_id"] == 0 for g in got for s in g["samples"])
    assert got[3]["sampling_params"] == {"temperature": 1.0} and got[0]["sampling_params"] == {"temperature": 0.0}
    # each sample has its own copies: a worker's change to one never reaches another or the prompt
    g = st.groups["train-0"]
    g.samples[0].metadata["x"] = 1
    g.samples[0].prompt_tokens.append(9)
    assert "x" not in g.samples[1].metadata and st.dataset[0].metadata == {} and 9 not in g.samples[1].prompt_tokens
    assert (st.next_sample, st.next_group) == (9, 6)


def test_prompt_to_samples_numbers_as_told(tmp_path):
    train, _ = datasets(tmp_path)
    p = train.next_prompts(3)[2]
    ss = p.to_samples(3, group_index=7, first_index=40, rollout_id=5)
    assert [(s.index, s.group_index, s.rollout_id, s.prompt, s.label) for s in ss] == \
        [(40 + j, 7, 5, "2 + 2 =", "4") for j in range(3)]


# ------------------------------------------------------------------------------------------------ submissions
def test_duplicate_late_and_foreign_submissions_are_refused_and_change_nothing(tmp_path):
    st = make_state(tmp_path)
    st.start_rollout(0)
    g0, g1 = st.take(W1, 2)
    assert submit(st, W1, g0) == {"accepted": True, "outcome": "done"}
    before = copy.deepcopy(st.snapshot())
    assert submit(st, W1, g0) == {"accepted": False, "reason": "train-0 is done; rollout/1's submission is refused"}
    assert submit(st, W2, g1) == {"accepted": False, "reason": "train-1 is leased (leased to rollout/1); "
                                  "rollout/2's submission is refused"}
    st.release(W1)
    before["queue"]["train"].insert(0, "train-1")
    late = submit(st, W1, g1)   # released (its worker was declared dead), then handed in after all
    assert late == {"accepted": False, "reason": "train-1 is queued; rollout/1's submission is refused"}
    after = st.snapshot()
    assert after["stats"].pop("duplicates") == 3 and after["stats"].pop("requeued") == 1
    for k in ("duplicates", "requeued"):
        before["stats"].pop(k)
    before["groups"][1].update(state="queued", worker=None)
    assert after == before
    assert [n for n, _ in st.notes] == ["submission refused"] * 3


def test_bad_samples_are_errors_that_name_the_problem_and_change_nothing(tmp_path):
    st = make_state(tmp_path)
    st.start_rollout(0)
    (g,) = st.take(W1, 1)
    before = copy.deepcopy(st.snapshot())
    with pytest.raises(KeyError, match="unknown work id 'train-9'"):
        st.submit(W1, "train-9", finish(g))
    with pytest.raises(ValueError, match="train-0: expected 2 samples, got 1"):
        st.submit(W1, "train-0", finish(g)[:1])
    wrong = finish(g)
    wrong[1].index = 7
    with pytest.raises(ValueError, match=r"train-0: sample index 7 does not belong to this group \(expected 1\)"):
        st.submit(W1, "train-0", wrong)
    short = finish(g)
    short[0].loss_mask = []
    with pytest.raises(ValueError, match="sample 0 has 1 response tokens but 0 loss-mask entries and 1 log-probs"):
        st.submit(W1, "train-0", short)
    assert st.snapshot() == before
    assert submit(st, W1, g)["accepted"]   # the group was not lost


def test_failed_and_filtered_groups_are_recorded_and_replaced(tmp_path):
    st = make_state(tmp_path, keep_group=lambda ss: len({s.reward for s in ss}) > 1, over_sampling_batch_size=2)
    st.start_rollout(0)
    g0, g1 = st.take(W1, 5)
    failed = finish(g0)
    failed[1].status, failed[1].error = "failed", "reward failed: boom"
    assert st.submit(W1, g0["work_id"], failed) == {"accepted": True, "outcome": "failed"}
    assert st.groups["train-0"].error == "sample 1: reward failed: boom"
    assert submit(st, W1, g1, rewards=(1.0, 1.0)) == {"accepted": True, "outcome": "filtered"}
    r = st.rollouts["train:0"]
    assert (r.failed, r.filtered, r.completed, r.done) == (1, 1, [], False)
    assert [g["work_id"] for g in st.take(W1, 5)] == ["train-2", "train-3"]   # two new prompts replace them
    no_reward = st.take(W1, 1)
    assert no_reward == []


def test_a_filter_that_keeps_few_groups_is_warned_of_at_2_4_8_times_the_groups_needed(tmp_path):
    """A dynamic sampling filter that drops every group (all rewards the same: the prompts too hard or too easy) would
    keep the rollout going for ever: the buffer says so once the filter has dropped 2x, 4x, 8x ... the groups the
    rollout needs -- and not otherwise."""
    st = make_state(tmp_path, keep_group=_varied, over_sampling_batch_size=2)   # rollout_batch_size 2
    st.start_rollout(0)
    warned = []
    for n in range(1, 18):   # every group filtered but the third
        (g,) = st.take(W1, 1)
        assert submit(st, W1, g, rewards=(1.0, 0.0) if n == 3 else (1.0, 1.0))["outcome"] == \
            ("done" if n == 3 else "filtered")
        warned += [(n, f["filtered"], f["kept"], f["needs"]) for msg, f in st.notes
                   if msg == "the dynamic sampling filter keeps few groups"]
        st.notes.clear()
    assert warned == [(5, 4, 1, 2), (9, 8, 1, 2), (17, 16, 1, 2)]
    (g,) = st.take(W1, 1)
    submit(st, W1, g, rewards=(1.0, 0.0))
    assert st.rollouts["train:0"].done and not st.notes


def test_filtered_and_failed_groups_are_dropped_once_their_rollout_is_trained_and_still_accounted(tmp_path):
    """The filtered and failed groups of a trained rollout (and of those before it: one filtered after its rollout
    was trained) are dropped from memory -- and from every snapshot --, their samples' indices kept by state, so the
    accounts still say where each went; the log replayed gives the same state. (Kept, they grew the buffer without
    bound in a job with a dynamic sampling filter.)"""
    log: list = []
    st = make_state(tmp_path / "a", log=log, keep_group=_varied, over_sampling_batch_size=5)
    start = copy.deepcopy(st.snapshot())
    st.start_rollout(0)
    g0, g1, g2, g3, late = st.take(W1, 5)   # (`late`: handed in after the training)
    assert submit(st, W1, g0, rewards=(1.0, 1.0))["outcome"] == "filtered"
    assert submit(st, W1, g1, rewards=(None, 1.0))["outcome"] == "failed"
    submit(st, W1, g2)
    submit(st, W1, g3)
    assert st.rollouts["train:0"].done
    kept_before = {w: [s.index for s in st.groups[w].samples] for w in (g0["work_id"], g1["work_id"])}
    st.mark_trained(0)
    assert g0["work_id"] not in st.groups and g1["work_id"] not in st.groups
    assert st.rollouts["train:0"].dropped == {"failed": [[min(kept_before[g1["work_id"]]),
                                                          max(kept_before[g1["work_id"]]) + 1]],
                                              "filtered": [[min(kept_before[g0["work_id"]]),
                                                            max(kept_before[g0["work_id"]]) + 1]]}
    acc = st.accounting()
    assert acc["lost"] == 0 and acc["untrained_by_state"].get("filtered") == 2 and \
        acc["untrained_by_state"].get("failed") == 2
    assert submit(st, W1, late, rewards=(0.0, 0.0))["outcome"] == "filtered"   # rollout 0's, after its training
    st.start_rollout(1, weight_version=1)
    for g in st.take(W1, 4):
        submit(st, W1, g, version=1)
    st.mark_trained(1)
    assert late["work_id"] not in st.groups and st.accounting()["untrained_by_state"].get("filtered") == 4
    assert not [g for g in st.groups.values() if g.state in ("filtered", "failed")]
    again = make_state(tmp_path / "b", keep_group=_varied, over_sampling_batch_size=5)
    again.load(start)
    again.replay(log)
    assert again.snapshot()["groups"] == st.snapshot()["groups"]
    assert again.snapshot()["rollouts"] == st.snapshot()["rollouts"]


def test_a_train_sample_without_reward_fails_its_group_but_an_eval_one_does_not(tmp_path):
    st = make_state(tmp_path)
    st.start_rollout(0)
    (g,) = st.take(W1, 1)
    assert submit(st, W1, g, rewards=(None, 1.0))["outcome"] == "failed"
    assert st.groups["train-0"].error == "sample 0: no reward"
    st.start_rollout(0, kind="eval", name="ev")
    (e,) = st.take(W1, 1)
    assert submit(st, W1, e, rewards=(None,))["outcome"] == "done"


def test_a_group_given_back_failed_three_times_is_recorded_failed_with_the_last_error(tmp_path):
    """A worker's generation that raises (a user's generate function, an engine call) or samples the buffer refuses:
    the group goes back to be made again, twice; the third time it is a failed group, with that error, and a new
    prompt takes its place. A return without an error (an abort, a rollout ended) does not count."""
    log: list = []
    st = make_state(tmp_path / "a", log=log, over_sampling_batch_size=2)
    start = copy.deepcopy(st.snapshot())
    st.start_rollout(0)
    wid = "train-0"
    for n in (1, 2):
        (g,) = [x for x in st.take(W1, 5) if x["work_id"] == wid] or [None]
        assert g is not None, "the failed group was not handed out again"
        assert st.return_work(W1, wid, error=f"error: KeyError('answer') #{n}") == {"requeued": True,
                                                                                   "partial": False}
        assert (st.groups[wid].state, st.groups[wid].errors) == ("queued", n)
        st.return_work(W1, "train-1")   # (an abort: not counted)
        assert st.groups["train-1"].errors == 0
    assert sorted(x["work_id"] for x in st.take(W1, 5)) == [wid, "train-1"]
    reply = st.return_work(W1, wid, error="error: KeyError('answer') #3")
    assert reply == {"requeued": False, "failed": True,
                     "reason": "failed 3 times; the last: error: KeyError('answer') #3"}
    g0, r = st.groups[wid], st.rollouts["train:0"]
    assert (g0.state, g0.error, r.failed) == ("failed", reply["reason"], 1)
    assert r.last_error == f"{wid}: {reply['reason']}"
    assert st.notes[-1] == ("group failed", {"work_id": wid, "error": reply["reason"]})
    assert [x["work_id"] for x in st.take(W1, 5)] == ["train-2"]   # a new prompt in its place
    assert st.accounting()["lost"] == 0   # its samples are where its outcome says
    # the log replayed: the same errors, the same failed group (a restarted buffer does not reset the count)
    again = make_state(tmp_path / "b", over_sampling_batch_size=2)
    again.load(start)
    again.replay(log)
    assert again.groups[wid].record() == g0.record() and again.groups[wid].errors == 3
    assert again.rollouts["train:0"].last_error == r.last_error
    snap = BufferState(settings(over_sampling_batch_size=2), *datasets(tmp_path / "c"))
    snap.load(copy.deepcopy(again.snapshot()))
    assert snap.groups[wid].errors == 3 and snap.rollouts["train:0"].last_error == r.last_error


def test_a_training_rollout_whose_groups_keep_failing_fails_with_the_last_error(tmp_path):
    """As many failed groups as --max-failed-groups allows (0: twice --rollout-batch-size): the rollout fails -- no
    more groups are made for it, and `rollout_failure` says why, with the last error; before that it goes on.
    A rollout that completes is not failed by failures it had on the way; an evaluation never fails this way."""
    st = make_state(tmp_path, over_sampling_batch_size=2)   # rollout_batch_size 2: the limit is 4
    assert st.settings.failed_groups_limit == 4
    st.start_rollout(0)
    r = st.rollouts["train:0"]
    made = []
    while st.rollout_failure(r) is None:
        gs = st.take(W1, 5)
        assert gs, "no group to fail, and the rollout did not fail"
        made += [x["work_id"] for x in gs]
        for x in gs:
            st.submit(W1, x["work_id"], finish(x, rewards=(None, 1.0)))
    assert r.failed == 4 and made == [f"train-{i}" for i in range(4)]
    why = st.rollout_failure(r)
    assert why == ("rollout 0 failed: 4 of its groups failed (the limit is 4: twice --rollout-batch-size, as "
                   "--max-failed-groups 0 says), 0 of the 2 it needs completed. The last: train-3: sample 6: no "
                   "reward (the rollout workers' log has every error)")
    assert st.take(W1, 5) == [] and st._missing("train") == 0   # nothing more is made for it

    # an explicit limit, reached after a group completed; a rollout that completes is not failed
    st = make_state(tmp_path / "b", over_sampling_batch_size=2, max_failed_groups=3)
    st.start_rollout(0)
    r = st.rollouts["train:0"]
    g0, g1 = st.take(W1, 5)
    submit(st, W1, g0)
    failed = finish(g1)
    failed[0].status, failed[0].error = "failed", "reward failed: boom"
    failed[1].status, failed[1].error = "failed", "reward failed: boom too"
    st.submit(W1, g1["work_id"], failed)
    assert st.groups[g1["work_id"]].error == "sample 2: reward failed: boom (and 1 more of its samples)"
    g2, = st.take(W1, 5)
    st.submit(W1, g2["work_id"], finish(g2, rewards=(None, 1.0)))
    assert st.rollout_failure(r) is None and r.failed == 2
    g3, = st.take(W1, 5)
    st.submit(W1, g3["work_id"], finish(g3, rewards=(None, None)))
    assert st.rollout_failure(r).startswith("rollout 0 failed: 3 of its groups failed (the limit is 3: "
                                            "--max-failed-groups), 1 of the 2 it needs completed. The last: train-3: "
                                            "sample 6: no reward (and 1 more of its samples)")
    st = make_state(tmp_path / "c", over_sampling_batch_size=2, max_failed_groups=1)
    complete_rollout(st, 0)
    st.rollouts["train:0"].failed = 5
    assert st.rollout_failure(st.rollouts["train:0"]) is None   # complete: trained on, whatever failed before
    st.start_rollout(0, kind="eval", name="ev")
    for x in st.take(W1, 5):
        st.submit(W1, x["work_id"], [dict_failed(s) for s in finish(x, rewards=(None,))])
    ev = st.rollouts["eval:0"]
    assert ev.failed == 3 and ev.done and st.rollout_failure(ev) is None


def dict_failed(s: Sample) -> Sample:
    s.status, s.error = "failed", "engine error"
    return s


# ------------------------------------------------------------------------------------------------ carry-over
def test_a_late_group_is_carried_into_the_next_rollout(tmp_path):
    st = make_state(tmp_path, staleness_limit=1)   # async: one version behind is fresh enough
    (late,) = complete_rollout(st, 0)
    assert submit(st, W1, late) == {"accepted": True, "outcome": "done"}
    assert list(st.carried) == ["train-2"] and st.rollouts["train:0"].completed == ["train-0", "train-1"]
    assert st.mark_trained(0) and not st.mark_trained(0)
    assert st.start_rollout(1, weight_version=1)["new_groups"] == 2   # 3 to over-sample, 1 carried
    r1 = st.rollouts["train:1"]
    assert r1.completed == ["train-2"] and not st.carried
    assert st.groups["train-2"].rollout_id == 1 and {s.rollout_id for s in st.groups["train-2"].samples} == {1}
    assert [g["work_id"] for g in st.take(W1, 5)] == ["train-3", "train-4"]


def test_a_group_handed_out_again_works_for_the_rollout_active_then(tmp_path):
    st = make_state(tmp_path, keep_group=_varied)
    (left,) = complete_rollout(st, 0)          # train-2 is still out when rollout 0 is full
    st.mark_trained(0)
    st.start_rollout(1, weight_version=1)
    assert st.return_work(W1, left["work_id"])["requeued"]
    again = [g for g in st.take(W2, 5) if g["work_id"] == "train-2"][0]
    assert again["rollout_id"] == 1 and {s["rollout_id"] for s in again["samples"]} == {1}
    assert submit(st, W2, again, rewards=(1.0, 1.0), version=1)["outcome"] == "filtered"
    assert (st.rollouts["train:1"].filtered, st.rollouts["train:0"].filtered) == (1, 0)


# ------------------------------------------------------------------------------------------------ staleness
def test_a_group_generated_by_weights_too_old_is_generated_again(tmp_path):
    st = make_state(tmp_path)
    st.start_rollout(0, weight_version=2)
    g0, g1 = st.take(W1, 2)
    assert submit(st, W1, g0, version=1) == {"accepted": False, "reason": STALE_REASON}
    g = st.groups["train-0"]
    assert (g.state, g.worker, g.samples[0].response_tokens, g.samples[0].weight_version) == ("queued", None, [], -1)
    assert st.stats["stale_requeued"] == 1 and st.queue["train"][0] == "train-0"
    assert st.notes[-1] == ("stale group regenerated", {"work_id": "train-0", "worker": W1, "versions": [1],
                                                        "current": 2})
    assert submit(st, W1, g1, version=2)["accepted"]


@pytest.mark.parametrize("kw", [{"staleness_limit": 1}, {"partial_rollout": True}])
def test_max_staleness_and_partial_rollouts_accept_older_weights(tmp_path, kw):
    st = make_state(tmp_path, **kw)
    st.start_rollout(0, weight_version=2)
    (g,) = st.take(W1, 1)
    assert submit(st, W1, g, version=1) == {"accepted": True, "outcome": "done"}


def test_a_carried_group_too_old_for_the_next_rollout_is_generated_again(tmp_path):
    st = make_state(tmp_path)
    (late,) = complete_rollout(st, 0)
    assert submit(st, W1, late, version=0)["accepted"]
    st.mark_trained(0)
    st.start_rollout(1, weight_version=1)
    assert st.rollouts["train:1"].completed == [] and st.stats["stale_requeued"] == 1
    assert st.groups["train-2"].state == "queued" and st.groups["train-2"].samples[0].response == ""
    assert st.queue["train"][0] == "train-2"


# ------------------------------------------------------------------------------------------------ returns
def test_a_partial_return_keeps_the_responses_with_partial_rollout(tmp_path):
    st = make_state(tmp_path, partial_rollout=True)
    st.start_rollout(0)
    (g,) = st.take(W1, 1)
    part = finish(g, rewards=(None, None), status="aborted")
    part[1].status = "nonsense"
    with pytest.raises(ValueError, match="expected 2 samples, got 1"):
        st.return_work(W1, "train-0", part[:1])
    assert st.return_work(W2, "train-0", part) == {"requeued": False, "reason": "train-0 is not leased to rollout/2"}
    assert st.return_work(W1, "train-0", part) == {"requeued": True, "partial": True}
    (again,) = st.take(W2, 1)
    assert again["work_id"] == "train-0" and again["attempt"] == 2
    assert [(s["response_tokens"], s["status"]) for s in again["samples"]] == [([5], "aborted"), ([5], "aborted")]


def test_a_return_without_partial_rollout_drops_the_responses(tmp_path):
    st = make_state(tmp_path)
    st.start_rollout(0)
    (g,) = st.take(W1, 1)
    assert st.return_work(W1, "train-0", finish(g, status="aborted")) == {"requeued": True, "partial": False}
    (again,) = st.take(W1, 1)
    assert [(s["response_tokens"], s["status"], s["reward"]) for s in again["samples"]] == [([], "pending", None)] * 2


def test_releasing_a_worker_requeues_only_its_groups_in_front(tmp_path):
    st = make_state(tmp_path, over_sampling_batch_size=4)
    st.start_rollout(0)
    a = st.take(W1, 2)
    b = st.take(W2, 1)
    assert st.release(W1) == 2 and st.release(W1) == 0
    assert list(st.queue["train"])[:2] == ["train-1", "train-0"] and st.groups[b[0]["work_id"]].worker == W2
    assert {g["work_id"] for g in st.take(W2, 5)} == {g["work_id"] for g in a} | {"train-3"}


def test_after_a_restart_the_groups_a_worker_does_not_hold_are_requeued(tmp_path):
    st = make_state(tmp_path)
    st.start_rollout(0)
    st.take(W1, 2)
    st.take("loaded", 1)   # not a rollout worker: never asked
    held = st.held_leases()
    assert held == {W1: {"train-0", "train-1"}}
    assert st.requeue_unheld(W1, held[W1], {"train-1"}) == 1
    assert st.groups["train-0"].state == "queued" and st.groups["train-1"].state == "leased"


# ------------------------------------------------------------------------------------------------ evaluation
def test_an_evaluation_is_over_when_every_prompt_has_an_outcome(tmp_path):
    st = make_state(tmp_path)
    clock = st.clock
    st.start_rollout(0, kind="eval", name="ev")
    e = st.take(W1, 5)
    assert [g["kind"] for g in e] == ["eval"] * 3
    submit(st, W1, e[0], rewards=(1.0,))
    submit(st, W1, e[1], rewards=(0.0,), status="failed")
    r = st.rollouts["eval:0"]
    assert not r.done
    clock.t = 1005.0
    submit(st, W1, e[2], rewards=(1.0,))
    assert r.done and r.finished == 1005.0 and (len(r.completed), r.failed) == (2, 1)
    assert [(x["index"], x["reward"], x["label"]) for x in st.eval_results(0)] == [(0, 1.0, "200"), (2, 1.0, "204")]
    stats = st.rollout_stats("eval:0")
    assert stats["complete"] and stats["seconds"] == 5.0 and stats["reward_mean"] == 1.0
    with pytest.raises(KeyError, match="no eval 1"):
        st.eval_results(1)
    with pytest.raises(KeyError, match="no eval set named 'other' \\(have: ev\\)"):
        st.start_rollout(1, kind="eval", name="other")
    # a new evaluation drops the queue of an unfinished one
    st.start_rollout(1, kind="eval", name="ev")
    st.start_rollout(2, kind="eval", name="ev")
    assert list(st.queue["eval"]) == ["eval-6", "eval-7", "eval-8"]



def test_a_new_evaluation_releases_the_samples_of_finished_ones(tmp_path):
    """An evaluation's groups leave memory (and every later snapshot) when the next evaluation starts: kept, they
    were the buffer's growth over a long run (bench/soak.py). The accounts still know where those samples went; the
    log replays to the same state; an unfinished evaluation keeps its groups (a late submission still finds them)."""
    log = []
    st = make_state(tmp_path / "a", log=log)
    start = copy.deepcopy(st.snapshot())
    for eid in range(4):
        st.start_rollout(eid, kind="eval", name="ev")
        for g in st.take(W1, 5):
            assert submit(st, W1, g, rewards=(1.0,))["accepted"]
        assert st.rollouts[f"eval:{eid}"].done and len(st.eval_results(eid)) == 3
        complete_rollout(st, eid)
        assert st.mark_trained(eid)
    # only the last evaluation's groups are held; the three before it are runs of sample indices
    assert sorted(g.work_id for g in st.groups.values() if g.kind == "eval") == ["eval-18", "eval-19", "eval-20"]
    assert [st.rollouts[f"eval:{e}"].released for e in range(4)] == [[[0, 3]], [[9, 12]], [[18, 21]], None]
    with pytest.raises(KeyError, match="eval 0's samples were released when a later evaluation started"):
        st.eval_results(0)
    assert st.rollout_stats("eval:0")["samples"] == 0 and st.rollout_stats("eval:3")["samples"] == 3
    acc = st.accounting()
    assert acc["lost"] == 0 and acc["untrained_by_state"] == {"released": 9, "done": 3, "leased": 8}, acc
    # a snapshot holds what memory holds, and restores to it; the log replays to the same state
    snap = copy.deepcopy(st.snapshot())
    assert [g["work_id"] for g in snap["groups"] if g["kind"] == "eval"] == ["eval-18", "eval-19", "eval-20"]
    again = make_state(tmp_path / "b")
    again.load(copy.deepcopy(snap))
    assert again.snapshot() == snap and again.accounting()["lost"] == 0
    replayed = make_state(tmp_path / "c")
    replayed.load(start)
    replayed.replay(log)
    got = replayed.snapshot()
    for k in ("handed_out", "submitted", "duplicates", "stale_requeued"):   # counted by the operations, not logged
        got["stats"].pop(k)
        snap["stats"].pop(k)
    assert got == snap
    # an evaluation still running when the next starts keeps its groups: one of them handed in late is accepted
    st.start_rollout(4, kind="eval", name="ev")
    late = st.take(W2, 1)[0]
    st.start_rollout(5, kind="eval", name="ev")
    assert st.rollouts["eval:4"].released is None and st.rollouts["eval:3"].released == [[27, 30]]
    assert submit(st, W2, late, rewards=(1.0,))["accepted"]

def test_start_rollout_refuses_bad_kinds_and_answers_a_repeat(tmp_path):
    st = make_state(tmp_path)
    with pytest.raises(ValueError, match="kind must be train or eval, got 'test'"):
        st.start_rollout(0, kind="test")
    st.start_rollout(0)
    assert st.start_rollout(0) == {"groups": 3, "rollout_id": 0, "kind": "train", "existing": True}
    nodata = BufferState(settings())
    with pytest.raises(RuntimeError, match="no --prompt-data"):
        nodata.start_rollout(0)
    assert nodata.fresh


# ------------------------------------------------------------------------------------------------ made ahead
def _ended(st: BufferState) -> None:
    """Rollout 0 complete and ended: its over-sampled group, still leased, given back (what end_rollout does)."""
    (left,) = complete_rollout(st, 0)
    assert st.return_work(W1, left["work_id"])["requeued"]


def test_a_rollout_made_ahead_holds_the_groups_a_start_then_would_make_until_it_is_opened(tmp_path):
    """The controller makes rollout k+1 while the trainers train on k (`hold`) and opens it after the weight sync:
    the groups, prompts, indices and the stats' clock are what a start after the sync gives; until it is opened
    nothing of it is handed out (an evaluation meanwhile is)."""
    ahead, after = make_state(tmp_path / "a"), make_state(tmp_path / "b")
    _ended(ahead)
    _ended(after)
    assert ahead.start_rollout(1, weight_version=1, hold=True) == \
        {"groups": 3, "new_groups": 2, "rollout_id": 1, "kind": "train", "held": True}
    assert ahead.start_rollout(1, weight_version=1, hold=True)["existing"]   # (a repeat changes nothing)
    assert ahead.take(W1, 10) == []
    ahead.mark_trained(0)
    after.mark_trained(0)
    ahead.start_rollout(0, kind="eval", name="ev")
    assert [g["kind"] for g in ahead.take(W2, 10)] == ["eval"] * 3           # held: none of the training groups
    ahead.clock.t += 7
    assert ahead.start_rollout(1, weight_version=1) == \
        {"groups": 3, "new_groups": 0, "rollout_id": 1, "kind": "train", "opened": True}
    assert after.start_rollout(1, weight_version=1)["new_groups"] == 2
    assert ahead.start_rollout(1, weight_version=1)["existing"]
    got, want = ahead.take(W1, 10), after.take(W1, 10)
    # (the evaluation took group and sample numbers in between: the training groups are otherwise the same)
    assert [[(s["prompt"], s["label"]) for s in g["samples"]] for g in got] == \
        [[(s["prompt"], s["label"]) for s in g["samples"]] for g in want]
    assert [g["work_id"] for g in got][:1] == ["train-2"] and [g["rollout_id"] for g in got] == [1, 1, 1]
    assert ahead.rollouts["train:1"].started == ahead.clock.t and not ahead.rollouts["train:1"].held
    assert ahead.dataset.state_dict() == after.dataset.state_dict()


def test_a_rollout_is_made_ahead_only_after_the_one_before_is_complete_and_only_for_training(tmp_path):
    st = make_state(tmp_path)
    st.start_rollout(0)
    before = copy.deepcopy(st.snapshot())
    with pytest.raises(ValueError, match="cannot be made ahead while rollout 0 is not complete"):
        st.start_rollout(1, hold=True)
    with pytest.raises(ValueError, match="only a training rollout can be held"):
        st.start_rollout(0, kind="eval", name="ev", hold=True)
    assert st.snapshot() == before


def test_a_held_rollout_is_held_after_a_restart_and_opens_as_before(tmp_path):
    log: list = []
    st = make_state(tmp_path / "a", log=log)
    start = copy.deepcopy(st.snapshot())
    _ended(st)
    st.start_rollout(1, weight_version=1, hold=True)
    snap = copy.deepcopy(st.snapshot())
    assert snap["rollouts"]["train:1"]["held"] is True and "held" not in snap["rollouts"]["train:0"]
    replayed, loaded = make_state(tmp_path / "b"), make_state(tmp_path / "c")
    replayed.load(start)
    replayed.replay(log)
    loaded.load(snap)
    for again in (replayed, loaded):
        got = again.snapshot()
        if again is replayed:   # (counted by the operations, not logged)
            got["stats"] = snap["stats"]
        assert got == snap
        assert again.take(W2, 10) == []
        assert again.start_rollout(1, weight_version=1)["opened"]
        assert [g["work_id"] for g in again.take(W2, 10)] == ["train-2", "train-3", "train-4"]
    st.start_rollout(1, weight_version=1)
    assert [ev for ev, _t, _d in log][-1] == "open"
    replayed.load(start)
    replayed.replay(log)
    assert not replayed.rollouts["train:1"].held


# ------------------------------------------------------------------------------------------------ training
def test_batches_are_whole_groups_in_group_order(tmp_path):
    st = make_state(tmp_path, rollout_batch_size=3)
    st.start_rollout(0)
    g = st.take(W1, 3)
    with pytest.raises(RuntimeError, match="rollout 0 is not complete"):
        st.batch(0, 0, 1)
    for grp in reversed(g):   # completion order differs from group order
        submit(st, W1, grp)
    assert st.batch(0, 0, 2)["sample_index"] == [0, 1, 4, 5] and st.batch(0, 1, 2)["group_index"] == [1, 1]
    with pytest.raises(ValueError, match="rank 2 outside world size 2"):
        st.batch(0, 2, 2)
    with pytest.raises(RuntimeError, match="rollout 1 is not complete; it cannot have been trained"):
        st.mark_trained(1)


def test_a_packed_batch_holds_the_rows_of_the_lists_and_unpacks_to_what_the_update_takes(tmp_path):
    """get_batch(packed=True): tokens, loss masks and rollout log-probs as one byte string each (types.pack_rows);
    unpack_batch gives back the token lists as they were and the masks and log-probs as the float32 the RL update
    makes of them (rl_update._prepare) -- with token ids that need 64 bits, masks that are not 0/1 integers, and a
    sample without log-probs."""
    import numpy as np
    import torch

    from slime_actors.backends.batching import unpack_batch
    st = make_state(tmp_path, rollout_batch_size=2)
    st.start_rollout(0)
    groups = st.take(W1, 2)
    done = [finish(g) for g in groups]
    done[0][0].response_tokens, done[0][0].loss_mask = [5, 2**40, 7], [1, 0, 1]
    done[0][0].rollout_log_probs = [-0.1234567890123, -2.5, -1e-9]
    done[1][1].response_tokens, done[1][1].loss_mask, done[1][1].rollout_log_probs = [9, 9], [0.5, 1], [-1.0, -2.0]
    for g, samples in zip(groups, done):
        assert st.submit(W1, g["work_id"], samples)["accepted"]
    plain, packed = st.batch(0, 0, 1), st.batch(0, 0, 1, packed=True)
    assert [packed[k]["dtype"] for k in ("tokens", "loss_masks", "rollout_log_probs")] == ["int64", "float32",
                                                                                           "float32"]
    assert {k: v for k, v in packed.items() if not isinstance(v, dict)} == \
        {k: v for k, v in plain.items() if k not in ("tokens", "loss_masks", "rollout_log_probs")}
    got = unpack_batch(msgpack.unpackb(msgpack.packb(packed, use_bin_type=True), raw=False))
    assert got["tokens"] == plain["tokens"] and type(got["tokens"][0][0]) is int
    for key in ("loss_masks", "rollout_log_probs"):
        want = [torch.as_tensor(x, dtype=torch.float32) for x in plain[key]]
        assert len(got[key]) == len(want) and all(torch.equal(a, b) for a, b in zip(got[key], want)), key
    # the usual case: token ids fit in 32 bits, masks are 0/1; a sample without log-probs (a loaded rollout's)
    done[1][0].rollout_log_probs = []
    small = batch_from_samples(done[1][:1], packed=True)
    assert (small["tokens"]["dtype"], small["loss_masks"]["dtype"]) == ("int32", "uint8")
    assert np.frombuffer(small["loss_masks"]["data"], np.uint8).tolist() == done[1][0].loss_mask
    assert unpack_batch(small) is small and small["rollout_log_probs"][0].numel() == 0   # (in place)
    assert unpack_batch(plain) is plain, "a batch of lists is taken as it is"


@pytest.mark.parametrize("column,error", [
    ({"dtype": "float64", "lengths": [1], "data": b"\0" * 8}, r"dtype 'float64' is not one of"),
    ({"dtype": "int32", "lengths": [2], "data": b"\0" * 4}, r"data holds 4 bytes; 2 int32 values need 8"),
    ({"dtype": "int32", "lengths": [-1, 2], "data": b"\0" * 4}, r"lengths must be a list of non-negative"),
    ({"dtype": "int32", "lengths": [1], "data": "abcd"}, r"data must be bytes, got str"),
    ({"dtype": "int32", "lengths": [1]}, r"a packed column is a map of dtype, lengths and data"),
])
def test_a_malformed_packed_column_is_an_error_naming_the_column(column, error):
    from slime_actors.backends.batching import unpack_batch
    batch = {"sample_index": [0], "tokens": {"dtype": "int32", "lengths": [1], "data": b"\1\0\0\0"},
             "loss_masks": column}
    with pytest.raises(ValueError, match=r"batch\['loss_masks'\]: " + error):
        unpack_batch(batch)
    with pytest.raises(ValueError, match=r"batch\['tokens'\] has 1 rows for 2 samples"):
        unpack_batch({"sample_index": [0, 1], "tokens": {"dtype": "int32", "lengths": [1], "data": b"\1\0\0\0"}})


def test_tokens_that_are_not_integers_fail_the_packed_batch_naming_the_row():
    samples = [Sample(index=i, group_index=0, prompt_tokens=[1], response_tokens=[2, 3], loss_mask=[1, 1],
                      rollout_log_probs=[-1.0, -1.0]) for i in range(3)]
    samples[2].response_tokens = [2, "three"]
    with pytest.raises(ValueError, match=r"tokens: row 2 is not a list of integers"):
        batch_from_samples(samples, packed=True)
    samples[2].response_tokens, samples[1].rollout_log_probs = [2, 3], [-1.0, None]
    with pytest.raises(ValueError, match=r"rollout_log_probs: row 1 is not a list of numbers"):
        batch_from_samples(samples, packed=True)


def test_a_shard_joined_from_its_groups_columns_is_the_shard_packed_whole(tmp_path):
    """The buffer packs each group's per-token columns as the group is handed in (types.packed_columns) and joins
    them for a shard (`columns_of`): the same batch, byte for byte, as packing the shard whole -- and where the
    groups' dtypes differ (token ids past 32 bits in one, a mask that is not 0/1 in another), or a group's columns
    cannot be made, the shard is packed whole."""
    from slime_actors.types import join_columns, packed_columns
    st = make_state(tmp_path, rollout_batch_size=3, over_sampling_batch_size=3)
    st.start_rollout(0)
    groups = st.take(W1, 3)
    for i, g in enumerate(groups):
        samples = finish(g)
        for j, smp in enumerate(samples):
            smp.response_tokens = [5 + i, 6 + j, 7][: 1 + (i + j) % 3]
            smp.loss_mask = [1, 0, 1][: len(smp.response_tokens)]
            smp.rollout_log_probs = [-0.25 * (i + 1), -1.5, -2.0][: len(smp.response_tokens)]
        assert st.submit(W1, g["work_id"], samples)["accepted"]
    asked = []

    def columns_of(g):
        asked.append(g.work_id)
        return packed_columns(g.samples)
    for rank, world in ((0, 1), (0, 2), (1, 2)):
        whole = st.batch(0, rank, world, packed=True)
        asked.clear()
        assert st.batch(0, rank, world, packed=True, columns_of=columns_of) == whole
        assert asked == st._in_group_order(st.rollouts["train:0"])[rank::world]
        assert st.batch(0, rank, world, packed=True, columns_of=lambda g: None) == whole
    assert st.batch(0, 0, 1, columns_of=columns_of) == st.batch(0, 0, 1)   # (unpacked: not asked)
    # dtypes that differ between groups: None, and the shard is packed whole (int64 token ids, float32 masks)
    g0, g1, g2 = (st.groups[w] for w in st._in_group_order(st.rollouts["train:0"]))
    g1.samples[0].response_tokens = [2**40] + g1.samples[0].response_tokens[1:]
    g2.samples[1].loss_mask = [0.5] + g2.samples[1].loss_mask[1:]
    parts = [packed_columns(g.samples) for g in (g0, g1, g2)]
    assert [p["tokens"]["dtype"] for p in parts] == ["int32", "int64", "int32"]
    assert join_columns(parts) is None and join_columns([]) is None
    whole = st.batch(0, 0, 1, packed=True)
    assert (whole["tokens"]["dtype"], whole["loss_masks"]["dtype"]) == ("int64", "float32")
    assert st.batch(0, 0, 1, packed=True, columns_of=columns_of) == whole
    assert join_columns(parts[:1] + parts[2:]) is None   # (the mask: uint8 in g0, float32 in g2)


def test_accounting_counts_every_sample_and_finds_lost_ones(tmp_path):
    st = make_state(tmp_path)
    (late,) = complete_rollout(st, 0)
    st.mark_trained(0)
    acc = st.accounting()
    assert {k: acc[k] for k in ("issued", "trained_once", "trained_more", "untrained", "expected_trained", "lost")} \
        == {"issued": 6, "trained_once": 4, "trained_more": 0, "untrained": 2, "expected_trained": 4, "lost": 0}
    assert acc["untrained_by_state"] == {"leased": 2} and acc["pending_groups"] == ["train-2"]
    assert acc["trained_rollouts"] == [0] and acc["stats"]["handed_out"] == 3 and acc["stats"]["submitted"] == 2
    assert st.accounts[4] == [1, 0, 0] and st.accounts[0] == [1, 1, 1]
    assert "train-0" not in st.groups   # trained samples are freed
    del st.groups["train-2"]            # a group that vanished: its samples are reported lost
    acc = st.accounting()
    assert acc["lost"] == 2 and acc["lost_samples"] == [4, 5]


def test_a_loaded_rollout_is_complete(tmp_path):
    st = make_state(tmp_path)
    complete_rollout(st, 0)
    dumped = [Sample.from_wire(s) for s in st.dump_rollout(0)]
    other = make_state(tmp_path / "other", log=[])
    assert other.load_rollout(4, dumped) == {"groups": 2}
    assert other.load_rollout(4, dumped) == {"groups": 2}   # again: nothing new
    r = other.rollouts["train:4"]
    assert r.done and r.name == "loaded" and other.batch(4, 0, 1)["sample_index"] == [0, 1, 2, 3]
    assert sorted(other.accounts) == [0, 1, 2, 3] and other.accounts[0] == [1, 1, 0]


def test_a_rollout_is_dumped_and_batched_in_group_order_whatever_order_its_groups_finished_in(tmp_path):
    # --save-debug-rollout-data writes dump_rollout: two runs with the same seeds must write the same file, and
    # which group finishes first is the run's timing (it failed a reproducibility check on a loaded machine)
    orders = []
    for name, reverse in (("a", False), ("b", True)):
        st = make_state(tmp_path / name)
        st.start_rollout(0)
        groups = st.take(W1, 10)[:2]
        for g in (reversed(groups) if reverse else groups):
            assert submit(st, W1, g)["accepted"]
        assert [st.groups[w].group_index for w in st.rollouts["train:0"].completed] == ([1, 0] if reverse else [0, 1])
        dumped = [s["index"] for s in st.dump_rollout(0)]
        assert dumped == st.batch(0, 0, 1)["sample_index"] == [0, 1, 2, 3]
        orders.append(st.dump_rollout(0))
    assert orders[0] == orders[1]


# ------------------------------------------------------------------------------------------------ rollback
def test_rollback_to_a_checkpoint_trains_what_the_lost_weights_trained_again_once(tmp_path):
    st = make_state(tmp_path)
    complete_rollout(st, 0)
    st.mark_trained(0)
    ckpt = msgpack.unpackb(msgpack.packb(st.snapshot()), strict_map_key=False)   # as `save` writes it
    leased = complete_rollout(st, 1, weight_version=1)
    first_time = {s["index"]: s["prompt"] for s in st.dump_rollout(1)}
    assert sorted(first_time) == [6, 7, 8, 9]
    st.mark_trained(1)
    assert st.rollback_answer(2, True) == {"rolled_back": False, "reason": "no rollout from 2 on"}
    assert st.rollback_answer(1, True, token="t") is None
    res = st.rollback(ckpt, "ckpt/buffer.msgpack", 1, reason="trainer restarted", token="t")
    assert res == {"rolled_back": True, "to": "ckpt/buffer.msgpack", "if_ahead_of": 1,
                   "trained_rollouts_discarded": [1], "samples_discarded": 4, "epoch": 1,
                   "reason": "trainer restarted"}
    assert st.rollback_answer(1, True, token="t") == res   # the same rollback asked again: answered, not redone
    assert sorted(st.rollouts) == ["train:0"] and st.epoch == 1
    # every group has a new work id: a late submission of work handed out before the rollback cannot match
    assert sorted(st.groups) == ["train-2.e1"]
    with pytest.raises(KeyError, match="unknown work id"):
        submit(st, W1, leased[0])
    # the group leased at the checkpoint is queued again, then the same prompts as before come again (the
    # dataset's position is the checkpoint's), numbered as before; each is trained once
    complete_rollout(st, 1, weight_version=1)
    again = {s["index"]: s["prompt"] for s in st.dump_rollout(1)}
    assert sorted(again) == [4, 5, 6, 7] and {i: again[i] for i in (6, 7)} == {i: first_time[i] for i in (6, 7)}
    st.mark_trained(1)
    acc = st.accounting()
    assert acc["trained_more"] == 0 and acc["trained_once"] == 8
    assert acc["discarded"] == {"samples": 4, "trainings": 4} and acc["rollbacks"] == [res] and acc["epoch"] == 1


def test_rollback_requeues_what_was_leased_at_the_checkpoint(tmp_path):
    st = make_state(tmp_path)
    st.start_rollout(0)
    st.take(W1, 2)
    ckpt = copy.deepcopy(st.snapshot())
    for wid in ("train-0", "train-1"):
        assert submit(st, W1, st.groups[wid].wire())["accepted"]
    st.mark_trained(0)
    res = st.rollback(ckpt, "c", 0)
    assert res["trained_rollouts_discarded"] == [0] and res["samples_discarded"] == 4
    assert {w: g.state for w, g in st.groups.items()} == {"train-0.e1": "queued", "train-1.e1": "queued",
                                                         "train-2.e1": "queued"}
    assert list(st.queue["train"]) == ["train-1.e1", "train-0.e1", "train-2.e1"]
    assert st.rollouts["train:0"].completed == [] and not st.rollouts["train:0"].done


def test_a_fresh_buffer_rolls_back_only_when_given_a_checkpoint(tmp_path):
    st = make_state(tmp_path)
    assert st.fresh and st.rollback_answer(0, False) == {"rolled_back": False, "reason": "no rollout from 0 on"}
    assert st.rollback_answer(0, True) is None


# ------------------------------------------------------------------------------------------------ the event log
def run_everything(st: BufferState) -> None:
    """Every kind of event: starts, new groups, leases, done/failed/filtered submissions, a stale regeneration,
    partial returns, a released worker, a carried group, a trained rollout, an evaluation, a hack report."""
    st.clock.t += 1
    st.start_rollout(0)
    g = st.take(W1, 2) + st.take(W2, 2)
    st.clock.t += 1
    submit(st, W1, g[0])
    submit(st, W1, g[1], rewards=(1.0, 1.0))                 # filtered
    st.return_work(W2, g[2]["work_id"], finish(g[2], status="aborted"))
    st.release(W2)
    more = st.take(W1, 10)
    st.clock.t += 1
    for x in more:
        submit(st, W1, x, rewards=(None, 1.0) if x["work_id"] == "train-4" else (1.0, 0.0))
    more = st.take(W1, 10)
    for x in more:
        st.clock.t += 1
        submit(st, W1, x)
    st.record_hack(0, {"rollout_id": 0, "alarms": []}, {"seen": [0]})
    st.mark_trained(0)
    st.start_rollout(1, weight_version=1)
    st.start_rollout(0, kind="eval", name="ev")
    for x in st.take(W2, 5):
        submit(st, W2, x, version=0 if x["kind"] == "train" else 1)   # the train one is stale
    st.take(W1, 1)


@pytest.mark.parametrize("partial", [False, True])
def test_the_log_replayed_gives_the_same_state(tmp_path, partial):
    log = []
    st = make_state(tmp_path / "a", log=log, monitor=Monitor, partial_rollout=partial, keep_group=_varied)
    start = copy.deepcopy(st.snapshot())
    run_everything(st)
    assert {ev for ev, _t, _d in log} == {"start", "new_group", "lease", "submit", "requeue", "trained", "hack"}
    again = make_state(tmp_path / "b", monitor=Monitor, partial_rollout=partial, keep_group=_varied)
    again.load(start)
    assert again.replay(log) == len(log)
    want, got = st.snapshot(), again.snapshot()
    for k in ("handed_out", "submitted", "duplicates", "stale_requeued"):   # counted by the operations, not logged
        want["stats"].pop(k)
        got["stats"].pop(k)
    assert got == want
    assert again.hack_monitor.state == {"seen": [0]} and again.dataset.state_dict() == st.dataset.state_dict()


def _varied(samples):
    return len({s.reward for s in samples}) > 1


def test_events_encode_and_decode(tmp_path):
    st = make_state(tmp_path)
    st.start_rollout(0)
    (g,) = st.take(W1, 1)
    ss = finish(g)
    data = encode_event({"work_id": "train-0", "samples": ss, "outcome": "done", "error": None})
    assert data["samples"] == [s.to_wire() for s in ss]
    assert decode_event(data)["samples"] == ss
    rec = encode_event({"group": st.groups["train-1"], "dataset_state": None})
    assert decode_event(rec)["group"] == st.groups["train-1"]


def test_the_logs_copy_free_encoding_packs_every_event_to_the_same_bytes(tmp_path):
    """The actor's log packs each event before it is applied from views of its samples and groups (event_view, no
    copies): the bytes are those of the copying encode_event, event for event, through a rollout with a returned
    partial group, a requeue, a submission, a failed one, a trained mark and a rollout of the next step -- and a
    sample's later change does not reach a packed event."""
    from slime_actors.buffer_state import event_view
    packed = []

    def both(data):
        view, plain = msgpack.packb(event_view(data), use_bin_type=True), msgpack.packb(encode_event(data),
                                                                                           use_bin_type=True)
        packed.append((view, plain))
        return view
    st = make_state(tmp_path, partial_rollout=True)
    st.on_event, st.encode = (lambda ev, data: None), both
    st.start_rollout(0)
    groups = st.take(W1, 2)
    first = finish(groups[0])
    half = finish(groups[1], rewards=(None, None), status="aborted")
    st.return_work(W1, groups[1]["work_id"], half)
    st.submit(W1, groups[0]["work_id"], first)
    (g,) = st.take(W1, 1)
    failed = finish(g, rewards=(None, 1.0))
    failed[0].status, failed[0].error = "failed", "the reward raised"
    st.submit(W1, g["work_id"], failed)
    while not st.rollouts["train:0"].done:
        (g,) = st.take(W1, 1)
        st.submit(W1, g["work_id"], finish(g))
    st.mark_trained(0)
    st.start_rollout(1)
    assert len(packed) > 8 and all(view == plain for view, plain in packed)
    before = msgpack.packb(event_view({"samples": first}), use_bin_type=True)
    first[0].response_tokens.append(7)
    assert msgpack.unpackb(before)["samples"][0]["response_tokens"] == first[0].response_tokens[:-1]


def test_a_log_that_cannot_be_applied_is_an_error_that_names_the_event(tmp_path):
    st = make_state(tmp_path)
    with pytest.raises(BufferLogError, match="unknown buffer event 'shuffle'"):
        st.replay([("shuffle", 0.0, {})])
    with pytest.raises(BufferLogError, match=r"logged event 1 \('lease'\) cannot be applied: KeyError: 'train-9'"):
        st.replay([("start", 0.0, {"rollout_id": 0, "kind": "train", "target": 2, "name": "",
                                   "weight_version": 0}), ("lease", 0.0, {"work_id": "train-9", "worker": W1})])
    with pytest.raises(BufferLogError, match=r"logged event 0 \('trained'\) cannot be applied: TypeError"):
        st.replay([("trained", 0.0, {"rollout": 0})])
    # a held rollout opened that was never started, or an open with a field missing
    with pytest.raises(BufferLogError, match=r"logged event 0 \('open'\) cannot be applied: KeyError: 'train:7'"):
        st.replay([("open", 0.0, {"rollout_id": 7, "kind": "train"})])
    with pytest.raises(BufferLogError, match=r"logged event 0 \('open'\) cannot be applied: TypeError"):
        st.replay([("open", 0.0, {"rollout_id": 7})])


def test_an_unreadable_monitor_state_starts_the_monitor_afresh_with_a_note(tmp_path):
    st = make_state(tmp_path, monitor=Monitor)
    snap = st.snapshot()
    snap["hack_monitor"] = {"other": 1}
    snap["hack_reports"] = {"3": {"rollout_id": 3}}
    st.load(snap)
    assert st.hack_monitor.state == {"seen": []} and st.hack_reports == {3: {"rollout_id": 3}}
    assert st.notes == [("hack monitor state unreadable; starting it afresh", {"error": "not a monitor state"})]


# ------------------------------------------------------------------------------------------------ older buffers' files
def fixture_state() -> BufferState:
    """A state as the fixture's job had it configured (settings.json, its prompts), hacking alarms off."""
    s = json.loads((FIXTURE / "settings.json").read_text())
    train = PromptDataset(FIXTURE / "prompts.jsonl", input_key="input", label_key="label")
    ev = PromptDataset(FIXTURE / "eval.jsonl", input_key="input", label_key="label", name="ev")
    return BufferState(settings(**s), train, {"ev": ev})


def read(path: Path):
    return msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)


def comparable(snap: dict, times: bool = False) -> dict:
    """A snapshot without what an older buffer did not have (the hacking monitor's fields, the dataset's unused
    next_group_index, a training rollout's last failed group's error) or kept (the filtered and failed groups of
    trained rollouts: today's drops them, `dropped` saying where their samples went) and, unless `times`, without
    wall-clock times."""
    snap = copy.deepcopy(snap)
    for r in snap["rollouts"].values():
        r.pop("last_error", None)
        r.pop("dropped", None)
    trained = [r["rollout_id"] for r in snap["rollouts"].values() if r["kind"] == "train" and r["trained"]]
    if trained:
        snap["groups"] = [g for g in snap["groups"] if not (g["kind"] == "train" and g["rollout_id"] <= max(trained)
                                                            and g["state"] in ("filtered", "failed"))]
    # the accounts as one form: an older buffer wrote a map {index: [leased, submitted, trained]}, today's arrays
    snap["accounts"] = dict(Accounts.from_snapshot(snap["accounts"]).items())
    for k in ("hack_monitor", "hack_reports"):
        assert snap.pop(k, None) in (None, {})
    snap["dataset"].pop("next_group_index", None)
    if not times:
        for r in snap["rollouts"].values():
            assert r.pop("started") > 0
            assert (r.pop("finished") is None) == (not r["done"] or r["kind"] == "train" and r["name"] == "loaded")
    return snap


def log_records(path: Path) -> list:
    up = msgpack.Unpacker(raw=False, strict_map_key=False)
    up.feed(path.read_bytes())
    recs = list(up)
    assert recs[0][0] == "gen"
    return recs[1:]


def test_an_older_buffers_snapshot_and_log_restore_to_the_state_it_restored():
    st = fixture_state()
    st.load(read(FIXTURE / "buffer" / "snapshot.msgpack"))
    assert st.log_gen == 1
    assert st.replay(log_records(FIXTURE / "buffer" / "log.msgpack")) == 41
    got = comparable(st.snapshot())
    assert got == comparable(read(FIXTURE / "restored.msgpack"))
    # and to the state that buffer held, but for the counts its handlers kept without logging them
    live = comparable(read(FIXTURE / "live.msgpack"))
    for k in ("handed_out", "submitted", "duplicates"):
        assert got["stats"].pop(k) == 0 and live["stats"].pop(k) > 0
    assert got == live


def test_an_older_buffers_restored_state_carries_on():
    st = fixture_state()
    st.load(read(FIXTURE / "buffer" / "snapshot.msgpack"))
    st.replay(log_records(FIXTURE / "buffer" / "log.msgpack"))
    # what was leased when it stopped can still be handed in; rollout 1 (one carried group, one trained) fills up
    for wid, worker in (("train-7", W1), ("eval-12", W2), ("eval-13", W1)):
        assert submit(st, worker, st.groups[wid].wire())["accepted"]
    assert st.rollouts["eval:0"].done
    assert [g["work_id"] for g in st.take(W1, 2)] == ["train-8", "train-9"]
    r1 = st.rollouts["train:1"]
    assert r1.completed == ["train-5", "train-6", "train-7"] and not r1.done
    st.submit(W1, "train-8", finish(st.groups["train-8"].wire()))
    assert r1.done and st.batch(1, 0, 1)["group_index"] == [5, 5, 6, 6, 7, 7, 8, 8]
    assert st.mark_trained(1) and st.accounting()["trained_once"] == 16


def test_an_older_buffers_checkpoint_restores_as_it_was_saved():
    saved = read(FIXTURE / "ckpt" / "buffer.msgpack")
    st = fixture_state()
    st.load(saved)
    assert comparable(st.snapshot(), times=True) == comparable(saved, times=True)
    assert st.dataset.state_dict()["offset"] == saved["dataset"]["offset"] and st.next_sample == 25


def test_the_buffer_actor_restores_an_older_run_directory(tmp_path):
    """The actor's restore path (files, the log's generation) on the fixture's run directory."""
    from slime_actors.actors.buffer import Buffer
    from slime_actors.config import parse_config
    shutil.copytree(FIXTURE / "buffer", tmp_path / "buffer")
    cfg = parse_config(["--prompt-data", str(FIXTURE / "prompts.jsonl"), "--hf-checkpoint", "tiny:x",
                        "--rm-type", "exact_match", "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
                        "--input-key", "input", "--label-key", "label", "--over-sampling-batch-size", "6", "--partial-rollout",
                        "--hack-alarms", "off"])
    b = Buffer(0, args=cfg.to_dict())
    ref = fixture_state()
    b.state.dataset, b.state.eval_sets = ref.dataset, ref.eval_sets
    b.state_dir = tmp_path / "buffer"
    assert b._restore() == "snapshot + 41 logged events"
    assert comparable(b.state.snapshot()) == comparable(read(FIXTURE / "restored.msgpack"))
    assert b._rollout_events["train:0"].is_set() and "train:1" not in b._rollout_events
    # a log older than its snapshot (a crash between the two writes) is ignored
    snap = read(FIXTURE / "buffer" / "snapshot.msgpack")
    snap["log_gen"] = 2
    (tmp_path / "buffer" / "snapshot.msgpack").write_bytes(msgpack.packb(snap))
    b2 = Buffer(0, args=cfg.to_dict())
    b2.state.dataset, b2.state.eval_sets = fixture_state().dataset, ref.eval_sets
    b2.state_dir = tmp_path / "buffer"
    assert b2._restore() == "snapshot (stale log ignored) + 0 logged events"


def test_the_accounts_take_a_few_bytes_a_sample_and_read_older_snapshots(tmp_path):
    """Every sample issued keeps its leased/submitted/trained counts (exactly-once accounting across restarts): 6
    bytes a sample in arrays, not a dict entry (~140 bytes: the soak's buffer grew 19 MiB per 1,000 steps by it,
    bench/soak.py); a snapshot holds the arrays, and an older snapshot's map still loads."""
    acc = Accounts()
    for i in range(1000):
        acc.issue(i)
        acc.add(i, 0)
    acc.add(7, 2)
    assert acc[7] == [1, 0, 1] and acc.get(5000) == [0, 0, 0] and 5000 not in acc and len(acc) == 1000
    snap = acc.snapshot()
    assert sum(len(v) for k, v in snap.items() if k != "v") == 7 * 1000
    back = Accounts.from_snapshot(msgpack.unpackb(msgpack.packb(snap), raw=False))
    assert dict(back.items()) == dict(acc.items())
    old = Accounts.from_snapshot({"3": [1, 1, 1], 9: [2, 1, 0]})
    assert list(old) == [3, 9] and old[9] == [2, 1, 0]
