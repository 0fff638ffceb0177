"""The reference model only where something needs it (issue 33 item 2): a KL term (--use-kl-loss, --kl-coef) or the
KL loss's metric (--use-kl-loss --kl-loss-coef 0, as slime logs it). Otherwise no reference model is loaded and no
reference forward runs; when it runs it is one pass, packed by --log-probs-max-tokens-per-gpu (or, on a GPU, what
its free memory holds), and the packing changes no number the update computes."""

from __future__ import annotations

import pytest
import torch

from slime_actors.backends.rl_update import rl_update
from tests.test_on_policy_forward import batch_with_rollout_log_probs, counting
from tests.test_torch_backend import backend_for, make_args, tiny_dir  # noqa: F401

torch.set_num_threads(1)

# mode -> (flags, reference loaded and run): 8 samples, one optimizer step, micro-batches of 4
MODES = {
    "no KL": ({}, False),
    "KL loss": ({"use_kl_loss": True, "kl_loss_coef": 0.1}, True),
    "KL loss weight 0 (its metric)": ({"use_kl_loss": True, "kl_loss_coef": "0"}, True),
    "KL penalty in the reward": ({"advantage_estimator": "reinforce_plus_plus", "kl_coef": 0.05}, True),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_the_reference_runs_only_when_needed(tmp_path, tiny_dir, mode):
    extra, needed = MODES[mode]
    args = make_args(tmp_path, tiny_dir, rollout_batch_size=4, global_batch_size=8, micro_batch_size=4, **extra)
    assert args.algorithm.needs_reference is needed
    b = backend_for(args)
    assert (b.ref_model is not None) is needed
    bt = batch_with_rollout_log_probs(b)
    counts = counting(b)
    ref_forwards = [0]
    ref_net = b.ref_model.model if needed else None   # its body: the head's log-probs may come a chunk at a time
    if needed:
        fwd = ref_net.forward

        def counted(*a, **k):
            ref_forwards[0] += 1
            return fwd(*a, **k)
        ref_net.forward = counted
    metrics = rl_update(b, args, bt, 0)
    assert counts["log_prob_passes"]["ref"] == (1 if needed else 0)
    assert ref_forwards[0] == (2 if needed else 0)        # the training micro-batches (on CPU)
    assert ("ref_log_probs" in bt) is needed
    assert ("kl_loss" in metrics) is bool(extra.get("use_kl_loss"))
    if not needed:
        with pytest.raises(ValueError, match="no reference model"):
            b.compute_log_probs(bt, model="ref")


def test_the_reference_pass_packed_into_one_forward_changes_nothing(tmp_path, tiny_dir):
    """--log-probs-max-tokens-per-gpu as large as the batch: one reference forward instead of two, and the same
    loss, gradients and metrics (to floating-point tolerance: the padding differs)."""
    runs = {}
    for budget in (None, 10_000):
        args = make_args(tmp_path, tiny_dir, rollout_batch_size=4, global_batch_size=8, micro_batch_size=4,
                         use_kl_loss=True, kl_loss_coef=0.1, log_probs_max_tokens_per_gpu=budget)
        b = backend_for(args)
        bt = batch_with_rollout_log_probs(b)
        counts = counting(b)
        metrics = rl_update(b, args, bt, 0)
        runs[budget] = (counts, metrics, bt)
    (c_mb, m_mb, b_mb), (c_one, m_one, b_one) = runs[None], runs[10_000]
    assert c_mb["forwards"] == 2 + 2 and c_one["forwards"] == 2 + 1     # training 2, reference 2 -> 1
    for x, y in zip(b_mb["ref_log_probs"], b_one["ref_log_probs"]):
        torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-5)
    for name, g in c_mb["grads"].items():
        torch.testing.assert_close(c_one["grads"][name], g, atol=1e-6, rtol=1e-5, msg=name)
    for k, v in m_mb.items():
        if k != "train_time":
            assert abs(m_one[k] - v) <= 1e-5 * max(1.0, abs(v)), (k, v, m_one[k])
