"""Episodes that make several samples (episode_samples.py): an episode's first sample stands for the one the buffer
issued, the others are added to its group -- numbered by the buffer at submission, trained with the group, dropped
when the group is generated again, refused when they name a sample not of the group or a bad role; the trainer's
batch carries each sample's role and advantages are normalized per (prompt group, role); the worker's side turns a
generate function's list into those samples. (The multi-agent example in a real job: tests/test_multi_agent.py.)"""

import pytest
import torch

from slime_actors.actors.rollout_generate import episode_result
from slime_actors.algo.advantages import normalize_group_rewards
from slime_actors.buffer_state import decode_event
from slime_actors.episode_samples import (EPISODE_KEY, advantage_groups, episode_stats, metric_means, role_of,
                                          role_stats)
from slime_actors.types import Sample, batch_from_samples
from tests.test_buffer_state import W1, finish, make_state


def with_roles(group: dict, extra_per_sample: int = 2, reward=lambda s, k: float(k)) -> list[Sample]:
    """The group as a multi-agent episode hands it in: each issued sample is a solver's turn; each episode adds
    `extra_per_sample` critic turns naming it."""
    own = finish(group)
    out = list(own)
    for s in own:
        s.metadata = {**s.metadata, "role": "solver"}
        for k in range(extra_per_sample):
            x = Sample(index=-1, group_index=s.group_index, prompt="critique", prompt_tokens=[1, 2],
                       response="ok", response_tokens=[7, 8, 9], loss_mask=[1, 0, 1],
                       rollout_log_probs=[-0.1, 0.0, -0.2], reward=reward(s, k), status="completed",
                       weight_version=0, weight_versions=[0], metadata={"role": "critic", EPISODE_KEY: s.index})
            out.append(x)
    return out


def test_samples_an_episode_adds_are_numbered_trained_and_logged(tmp_path):
    log = []
    st = make_state(tmp_path, log)
    st.start_rollout(0)
    groups = st.take(W1, 10)
    issued = sum(len(g["samples"]) for g in groups)
    sub = with_roles(groups[0])
    assert st.submit(W1, groups[0]["work_id"], sub)["accepted"]
    g = st.groups[groups[0]["work_id"]]
    added = [s for s in g.samples if s.metadata.get(EPISODE_KEY) is not None]
    # numbered after every sample issued so far, in the order handed in; each still names its episode's sample
    assert [s.index for s in added] == list(range(st.next_sample - 4, st.next_sample))
    assert min(s.index for s in added) >= issued
    assert [s.metadata[EPISODE_KEY] for s in added] == [g.samples[0].index] * 2 + [g.samples[1].index] * 2
    assert st.stats["episode_samples"] == 4
    # the rest of the rollout, plain; then trained: the added samples are counted apart from the issued ones
    for gr in groups[1:2]:
        assert st.submit(W1, gr["work_id"], finish(gr))["accepted"]
    batch = st.batch(0, 0, 1)
    assert len(batch["tokens"]) == 8 and batch["roles"] == ["solver"] * 2 + ["critic"] * 4 + ["", ""]
    st.mark_trained(0)
    acc = st.accounting()
    assert acc["trained_once"] == acc["expected_trained"] == 4 and acc["lost"] == 0
    assert acc["stats"]["episode_samples_trained"] == 4
    # the event log restores the same record (the added samples and their numbers included)
    again = make_state(tmp_path / "again")
    for name, _t, data in log:
        again.apply(name, decode_event(data))
    assert again.next_sample == st.next_sample and again.accounting()["trained_once"] == 4


def test_a_group_generated_again_drops_what_its_episodes_added(tmp_path):
    st = make_state(tmp_path, staleness_limit=0)
    st.start_rollout(0)
    g = st.take(W1, 1)[0]
    st.weight_version = 3   # too old by the time it arrives: regenerated
    res = st.submit(W1, g["work_id"], with_roles(g))
    assert not res["accepted"]
    again = st.groups[g["work_id"]]
    assert [s.index for s in again.samples] == [s["index"] for s in g["samples"]]
    assert all(not s.response_tokens for s in again.samples)
    leased = st.take(W1, 5)
    assert len(next(x for x in leased if x["work_id"] == g["work_id"])["samples"]) == 2


@pytest.mark.parametrize("bad, message", [
    (lambda sub: sub[2].metadata.update({EPISODE_KEY: 999}), "names sample 999, which is not one of this group's"),
    (lambda sub: sub[2].metadata.update(role="crit ic!"), "metadata['role'] must be a short name"),
    (lambda sub: sub[2].metadata.update(role=""), "metadata['role'] must be a short name"),
    (lambda sub: setattr(sub[3], "loss_mask", [1]), "has 3 response tokens but 1 loss-mask entries"),
    (lambda sub: sub.pop(0), "expected 2 samples, got 1"),
])
def test_bad_added_samples_are_refused_naming_the_problem(tmp_path, bad, message):
    st = make_state(tmp_path)
    st.start_rollout(0)
    g = st.take(W1, 1)[0]
    sub = with_roles(g)
    bad(sub)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        st.submit(W1, g["work_id"], sub)
    assert st.groups[g["work_id"]].state == "leased" and st.next_sample == 6   # nothing changed


def test_a_returned_group_may_not_carry_added_samples(tmp_path):
    st = make_state(tmp_path, partial_rollout=True)
    st.start_rollout(0)
    g = st.take(W1, 1)[0]
    with pytest.raises(ValueError, match="a returned group holds only its own samples"):
        st.return_work(W1, g["work_id"], with_roles(g))


def test_advantages_are_normalized_per_prompt_group_and_role():
    groups = [0, 0, 0, 0, 1, 1]
    roles = ["solver", "critic", "solver", "critic", "solver", "solver"]
    keys = advantage_groups(groups, roles)
    assert keys == [0, 1, 0, 1, 2, 2]
    assert advantage_groups(groups, None) == groups and advantage_groups(groups, [""] * 6) == groups
    rewards = [1.0, 10.0, 0.0, 20.0, 1.0, 1.0]
    adv = normalize_group_rewards(rewards, keys, "grpo")
    # solvers of prompt 0 against each other, the critics against each other: not one group of four
    assert adv[0] > 0 > adv[2] and adv[3] > 0 > adv[1]
    assert torch.allclose(adv[0], -adv[2]) and torch.allclose(adv[1], -adv[3])
    assert adv[4] == adv[5] == 0.0
    mixed = normalize_group_rewards(rewards, groups, "grpo")
    assert mixed[0] < 0   # (what grouping by prompt alone would have done to the right solver)


def test_the_batch_names_roles_only_when_there_are_some():
    plain = [Sample(index=i, group_index=0, response_tokens=[1], loss_mask=[1], rollout_log_probs=[-1.0],
                    reward=1.0) for i in range(2)]
    assert "roles" not in batch_from_samples(plain)
    plain[1].metadata["role"] = "critic"
    assert batch_from_samples(plain)["roles"] == ["", "critic"]


def test_stats_per_role_and_environment_metrics():
    ss = []
    for i, (role, reward, n, searched) in enumerate([("solver", 1.0, 3, 1), ("solver", 0.0, 5, 0),
                                                     ("critic", 0.5, 2, 1)]):
        ss.append(Sample(index=i, group_index=0, response_tokens=[1] * n, reward=reward,
                         metadata={"role": role, "metrics": {"searched": searched, "bad": "x", "flag": True}}))
    assert role_stats(ss) == {"role/critic/samples": 1, "role/critic/reward_mean": 0.5,
                              "role/critic/response_len_mean": 2.0, "role/solver/samples": 2,
                              "role/solver/reward_mean": 0.5, "role/solver/response_len_mean": 4.0}
    assert metric_means(ss) == {"searched": 2 / 3}       # numbers only (not strings, not booleans)
    st = episode_stats(ss)
    assert st["env/searched"] == 2 / 3 and "role/solver/samples" in st
    for s in ss:
        s.metadata.pop("role")
    assert role_stats(ss) == {} and role_of(ss[0]) == ""


def test_a_generate_functions_list_becomes_the_episodes_samples():
    origin = Sample(index=12, group_index=3, rollout_id=5, prompt="q")
    a = Sample(index=12, group_index=3, metadata={"role": "solver", EPISODE_KEY: 4})
    b = Sample(index=12, group_index=3, metadata={"role": "critic"})
    c = Sample(index=77, group_index=9, metadata={"role": "selector"})
    out = episode_result(origin, [a, b, c], "gen")
    assert out == [a, b, c]
    assert (a.index, a.group_index, a.rollout_id, a.metadata) == (12, 3, 5, {"role": "solver"})
    assert [(x.index, x.group_index, x.rollout_id, x.metadata[EPISODE_KEY]) for x in (b, c)] == [(-1, 3, 5, 12)] * 2
    assert episode_result(origin, origin, "gen") == [origin]
    for bad in ([], [a, a], "text", [a, "x"]):
        with pytest.raises(TypeError, match="gen: returned .*expected a Sample, or a non-empty list"):
            episode_result(origin, bad, "gen")

