"""One forward fewer on-policy (issue 33 item 1): with one optimizer step per rollout the old-policy log-probs are
the training forward's own, detached -- the same loss, gradients and metrics as with a forward of their own."""

from __future__ import annotations

import pytest
import torch

from slime_actors.backends.rl_update import old_log_probs_from_training, rl_update
from tests.test_torch_backend import D, EOS, backend_for, make_args, make_batch, tiny_dir  # noqa: F401

torch.set_num_threads(1)


def counting(b):
    """Count the backend's model forwards (train and no-grad: with the head, or the body alone when the head's
    log-probs are taken a chunk at a time) and its log-prob passes by model."""
    counts = {"forwards": 0, "log_prob_passes": {"actor": 0, "ref": 0}, "grads": None}
    logits, hidden, clp, step = b._logits, b._hidden, b.compute_log_probs, b.optimizer_step

    def _logits(*a, **k):
        counts["forwards"] += 1
        return logits(*a, **k)

    def _hidden(*a, **k):
        counts["forwards"] += 1
        return hidden(*a, **k)

    def compute_log_probs(batch, model="actor", with_entropy=False):
        counts["log_prob_passes"][model] += 1
        return clp(batch, model, with_entropy)

    def optimizer_step(critic=False):
        counts["grads"] = {n: p.grad.detach().clone() for n, p in b.model.named_parameters() if p.grad is not None}
        return step(critic)
    b._logits, b._hidden, b.compute_log_probs, b.optimizer_step = _logits, _hidden, compute_log_probs, optimizer_step
    return counts


def batch_with_rollout_log_probs(b):
    bt = make_batch([[D(2), EOS], [D(3), EOS], [D(2), D(2), EOS], [D(5)], [D(4), EOS], [D(7), D(1), EOS],
                     [D(4)], [D(9), EOS]], [1, 0, 1, 0, 1, 0, 0, 1], groups=[0, 0, 0, 0, 1, 1, 1, 1],
                    masks=[[1, 1], [1, 1], [1, 0, 1], [1], [1, 1], [1, 1, 1], [1], [0, 1]])
    lp, _ = b.compute_log_probs(bt)
    # the engine's log-probs: near the trainer's, not equal (TIS weights and the health metric are not trivial)
    g = torch.Generator().manual_seed(3)
    bt["rollout_log_probs"] = [(x + 0.05 * torch.randn(x.shape, generator=g)).tolist() for x in lp]
    return bt


@pytest.mark.parametrize("estimator,extra", [
    ("grpo", {"use_kl_loss": True, "kl_loss_coef": 0.1, "kl_loss_type": "low_var_kl", "use_tis": True,
              "entropy_coef": 0.01}),
    ("gspo", {"calculate_per_token_loss": True}),
    ("cispo", {"use_kl_loss": True, "kl_loss_coef": 0.05}),
])
def test_on_policy_old_log_probs_come_from_the_training_forward(tmp_path, tiny_dir, estimator, extra):
    args = make_args(tmp_path, tiny_dir, rollout_batch_size=4, global_batch_size=8, micro_batch_size=4,
                     advantage_estimator=estimator, **extra)
    assert args.train.num_steps_per_rollout == 1
    runs = {}
    for mode in (False, None):          # False: the old forward of its own; None: the rule (on-policy: reuse)
        b = backend_for(args)
        bt = batch_with_rollout_log_probs(b)
        counts = counting(b)
        metrics = rl_update(b, args, bt, 0, old_from_training=mode)
        runs[mode] = (counts, metrics, bt)
    (c_old, m_old, b_old), (c_new, m_new, b_new) = runs[False], runs[None]
    assert old_log_probs_from_training(args)
    # forwards per step: two micro-batches of training, two of the reference (with a KL loss), and the old-policy
    # pass of two micro-batches only in the old mode
    ref = 2 if extra.get("use_kl_loss") else 0
    assert c_old["log_prob_passes"] == {"actor": 1, "ref": 1 if ref else 0}
    assert c_new["log_prob_passes"] == {"actor": 0, "ref": 1 if ref else 0}
    assert c_old["forwards"] == 2 + 2 + ref and c_new["forwards"] == 2 + ref
    # the same loss, gradients and metrics, to floating-point tolerance
    assert set(c_old["grads"]) == set(c_new["grads"])
    for name, g in c_old["grads"].items():
        torch.testing.assert_close(c_new["grads"][name], g, atol=1e-6, rtol=1e-5, msg=name)
    assert set(m_old) == set(m_new)
    for k, v in m_old.items():
        if k == "train_time":
            continue
        assert abs(m_new[k] - v) <= 1e-5 * max(1.0, abs(v)), (k, v, m_new[k])
    assert m_new["train_rollout_logprob_abs_diff"] > 0.01       # the health metric still measures the gap
    for a, b in zip(b_old["old_log_probs"], b_new["old_log_probs"]):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)


def test_off_policy_steps_keep_the_old_forward(tmp_path, tiny_dir):
    """Two optimizer steps per rollout (the second step's weights are not the rollout's), or a KL penalty in the
    reward (the advantages need the old log-probs before training): the old forward stays."""
    two_steps = make_args(tmp_path, tiny_dir, rollout_batch_size=4, global_batch_size=4, micro_batch_size=4)
    kl_reward = make_args(tmp_path, tiny_dir, rollout_batch_size=4, global_batch_size=8, micro_batch_size=4,
                          advantage_estimator="reinforce_plus_plus", kl_coef=0.05)
    for args in (two_steps, kl_reward):
        assert not old_log_probs_from_training(args)
        b = backend_for(args)
        bt = batch_with_rollout_log_probs(b)
        counts = counting(b)
        rl_update(b, args, bt, 0)
        assert counts["log_prob_passes"]["actor"] == 1
        with pytest.raises(ValueError, match="one optimizer step per rollout"):
            rl_update(b, args, bt, 1, old_from_training=True)


def test_a_batch_trained_twice_does_not_reuse_its_old_log_probs(tmp_path, tiny_dir):
    """The batch dict gains old_log_probs; passed again, the on-policy update must not take them as the old policy
    (they belong to the weights before the first update)."""
    args = make_args(tmp_path, tiny_dir, rollout_batch_size=4, global_batch_size=8, micro_batch_size=8, lr=3e-2)
    b = backend_for(args)
    bt = batch_with_rollout_log_probs(b)
    rl_update(b, args, bt, 0)
    first = [x.clone() for x in bt["old_log_probs"]]
    m = rl_update(b, args, bt, 1)
    moved = max(float((a - c).abs().max()) for a, c in zip(first, bt["old_log_probs"]))
    assert moved > 1e-3                  # the second update's old policy is the new weights'
    assert abs(m["ppo_kl"]) < 1e-7       # and its ratio is 1: on-policy
