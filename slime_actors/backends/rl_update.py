"""The RL update of one rollout, written once on the TrainingBackend primitives (torch and megatron share it).

    metrics = rl_update(backend, cfg, batch, rollout_id)         # cfg: slime_actors.config.JobConfig

On each rank, for its shard of the rollout (whole prompt groups):

1. reference log-probs (--use-kl-loss or --kl-coef != 0) and the actor's old log-probs, before any update;
   their gap to the engine's rollout log-probs is reported (``train_rollout_logprob_abs_diff`` mean over
   loss-masked tokens, ``..._max``). On-policy -- one optimizer step per rollout and nothing before the update
   needs them (`old_log_probs_from_training`) -- the old log-probs are not a forward of their own: they are the
   training forward's, detached (the weights do not change until the step's end, so they are the same numbers to
   floating-point tolerance; TRL's GRPOTrainer does the same when ``num_iterations == 1``), and the gap to the
   rollout log-probs is measured on them;
2. the critic's values (ppo);
3. rewards post-processed per prompt group, then per-token advantages and returns
   (`slime_actors.algo.advantages`), whitening with statistics over all ranks' tokens;
4. --num-steps-per-rollout optimizer steps over contiguous mini-batches of the shard, each as micro-batches
   (--micro-batch-size or --use-dynamic-batch-size / --max-tokens-per-gpu; every rank runs the same number,
   padding with empty ones). The loss per micro-batch is the policy loss (PPO clip, dual clip, GSPO ratio, CISPO's
   truncated ratio under stop-gradient; --loss-type sft_loss: the responses' negative log-likelihood;
   custom_loss: the user's function, CustomLoss), times
   TIS weights (--use-tis), minus --entropy-coef x entropy, plus --kl-loss-coef x KL to the reference
   (--use-kl-loss, --kl-loss-type), each reduced per sample then over the step's samples (or per token with
   --calculate-per-token-loss) using the step's GLOBAL sample / token count, and multiplied by the world size
   because backends average gradients across ranks: micro-batches and ranks then add up to exactly the loss of
   the whole step's batch. With ppo the critic takes a step on the clipped value loss too.

Metrics are global (summed contributions across ranks, or all-reduced sums and counts), averaged over the steps.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch

from ..algo.advantages import compute_advantages_and_returns, normalize_group_rewards
from ..algo.kl import compute_approx_kl
from ..algo.losses import (compute_cispo_loss, compute_policy_loss, compute_value_loss, gspo_ppo_kl, reduce_loss,
                           sft_loss)
from ..algo.tis import tis_weights
from ..config import AlgorithmSection, JobConfig
from ..episode_samples import advantage_groups
from ..log import get_logger
from .batching import micro_batches_from_config, mini_batch_indices, select, unpack_batch, validate_batch
from .training import LossFn, TrainingBackend

# reduce(tensor, op) -> the tensor reduced across the training ranks ("sum" or "max"); identity on one rank
Reduce = Callable[..., torch.Tensor]

log = get_logger(component="rl_update")


def _cat(xs, device=None) -> torch.Tensor:
    xs = [x.to(device) if device is not None else x for x in xs]
    return torch.cat(xs) if xs else torch.zeros(0, device=device)


def policy_metric_names(alg: AlgorithmSection) -> list[str]:
    if alg.loss_type == "custom_loss":
        return ["loss"]   # and the custom function's own metrics (CustomLoss.names)
    names = ["loss", "pg_loss", "pg_clipfrac", "ppo_kl", "entropy"]
    if alg.use_kl_loss:
        names.append("kl_loss")
    if alg.use_tis:
        names += ["tis", "tis_clipfrac", "tis_abs"]
    return names


class CustomLoss:
    """--loss-type custom_loss: the user's ``fn(args, batch, log_probs, sum_of_sample_mean) -> (loss, metrics)``
    (slime's signature, with the current policy's per-sample log-probs where slime passes Megatron's logits).

    ``batch``: the micro-batch, per-sample lists -- ``tokens``, ``response_lengths``, ``total_lengths``,
    ``loss_masks``, ``advantages``, ``returns``, ``log_probs`` (the old policy's, also ``old_log_probs``),
    ``ref_log_probs`` (with --use-kl-loss / --kl-coef), ``rollout_log_probs``, ``rewards`` and ``entropy`` (the
    current policy's, with grad when --entropy-coef != 0); ``log_probs``: the current policy's log-prob of each
    response token, one 1-D tensor per sample, with grad; ``sum_of_sample_mean(x)``: the step's reduction of
    per-token values (a tensor over the micro-batch's response tokens, or a list of per-sample tensors) to a
    scalar -- per sample then over the step's samples, or per token with --calculate-per-token-loss -- so that
    micro-batches and ranks add up as the built-in loss does. ``metrics``: scalars, reported as train/<name>."""

    def __init__(self, cfg: JobConfig):
        from ..plugins import PluginError, load_function
        try:
            self.fn = load_function(cfg.algorithm.custom_loss_function_path, flag="--custom-loss-function-path")
        except PluginError as exc:
            raise ValueError(str(exc)) from None
        self.args = cfg.flat()
        self.names: list[str] | None = None   # the function's metric names, from its first answer

    def __call__(self, mb: dict, log_probs, entropies, masks, red) -> tuple[torch.Tensor, dict]:
        batch = dict(mb)
        batch["loss_masks"] = masks
        batch["log_probs"] = mb["old_log_probs"]
        batch["entropy"] = entropies
        batch["total_lengths"] = [len(t) for t in mb["tokens"]]
        out = self.fn(self.args, batch, log_probs, red)
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.Tensor)
                and out[0].dim() == 0 and isinstance(out[1], dict)):
            raise TypeError(f"--custom-loss-function-path {self.args.custom_loss_function_path}: expected "
                            f"(scalar loss tensor, dict of metrics), got {type(out).__name__}")
        loss, metrics = out
        metrics = {str(k): v for k, v in metrics.items() if k != "loss"}
        if self.names is None:
            self.names = sorted(metrics)
        return loss, metrics


def make_policy_loss_fn(alg: AlgorithmSection, denominator: float, world_size: int,
                        custom: CustomLoss | None = None, captured: dict | None = None) -> LossFn:
    """The actor's loss for one micro-batch (see the module docstring). ``denominator``: the step's global sample
    count, or its global loss-masked token count with --calculate-per-token-loss. The micro-batch must carry
    loss_masks, advantages (tensors), and ref_log_probs / rollout_log_probs when used; old_log_probs, or none
    (on-policy: the forward's own log-probs, detached, which then go into ``captured[mb[ROW][j]]``).
    --loss-type sft_loss: the negative log-likelihood instead of the policy loss (entropy and KL terms as
    configured); custom_loss: `custom`'s function."""
    per_token = alg.calculate_per_token_loss
    eps_clip, eps_clip_high, eps_clip_c = alg.eps_clip, alg.eps_clip_high, alg.eps_clip_c
    gspo = alg.advantage_estimator == "gspo"
    cispo = alg.advantage_estimator == "cispo"
    sft = alg.loss_type == "sft_loss"
    entropy_coef = alg.entropy_coef
    use_kl, kl_coef, kl_type = alg.use_kl_loss, alg.kl_loss_coef, alg.kl_loss_type
    use_tis, tis_clip, tis_clip_low = alg.use_tis, alg.tis_clip, alg.tis_clip_low

    def loss_fn(mb: dict, log_probs: list[torch.Tensor], entropies: list[torch.Tensor], values=None):
        dev = log_probs[0].device if log_probs else torch.device("cpu")
        masks = [m.to(dev) for m in mb["loss_masks"]]
        if mb.get("old_log_probs") is None:
            # on-policy (`old_log_probs_from_training`): the old policy is this forward's, detached
            old = [lp.detach() for lp in log_probs]
            if captured is not None:
                for j, lp in zip(mb[ROW], old):
                    captured[j] = lp.float().cpu()
            mb = {**mb, "old_log_probs": old}
        else:
            old = [o.to(dev) for o in mb["old_log_probs"]]

        def red(x):
            return reduce_loss(x, masks, per_token, denominator)

        if custom is not None:
            loss, extra = custom(mb, log_probs, entropies, masks, red)
            metrics = {"loss": float(loss.detach())}
            metrics.update({k: float(v.detach()) if isinstance(v, torch.Tensor) else float(v)
                            for k, v in extra.items()})
            return loss * world_size, metrics
        if gspo:
            ppo_kl = _cat(gspo_ppo_kl(log_probs, old, masks))
        else:
            ppo_kl = _cat(old) - _cat(log_probs)
        adv = _cat(mb["advantages"], dev)
        if sft:
            pg = sft_loss(_cat(log_probs))
            clipfrac = torch.zeros_like(pg)
        elif cispo:
            pg, clipfrac = compute_cispo_loss(ppo_kl, _cat(log_probs), adv, eps_clip, eps_clip_high)
        else:
            pg, clipfrac = compute_policy_loss(ppo_kl, adv, eps_clip, eps_clip_high, eps_clip_c)
        metrics: dict[str, torch.Tensor] = {}
        if use_tis:
            w, tm = tis_weights(_cat(old), _cat(mb["rollout_log_probs"], dev), tis_clip, tis_clip_low)
            pg = pg * w
            metrics.update({k: red(v) for k, v in tm.items()})
        pg_loss = red(pg)
        ent = red(_cat(entropies))
        loss = pg_loss - entropy_coef * ent
        if use_kl:
            kl = compute_approx_kl(_cat(log_probs), _cat(mb["ref_log_probs"], dev), kl_type)
            kl_loss = red(kl)
            loss = loss + kl_coef * kl_loss
            metrics["kl_loss"] = kl_loss
        metrics.update(loss=loss, pg_loss=pg_loss, pg_clipfrac=red(clipfrac), ppo_kl=red(ppo_kl), entropy=ent)
        return loss * world_size, {k: float(v.detach()) for k, v in metrics.items()}

    return loss_fn


def make_value_loss_fn(alg: AlgorithmSection, denominator: float, world_size: int) -> LossFn:
    """The critic's clipped value loss (--value-clip) for one micro-batch; needs values (old) and returns."""
    per_token = alg.calculate_per_token_loss
    value_clip = alg.value_clip

    def loss_fn(mb: dict, log_probs, entropies, values: list[torch.Tensor]):
        dev = values[0].device if values else torch.device("cpu")
        masks = [m.to(dev) for m in mb["loss_masks"]]
        v = _cat(values).float()
        losses, clipfrac = compute_value_loss(v, _cat(mb["values"], dev), _cat(mb["returns"], dev), value_clip)
        loss = reduce_loss(losses, masks, per_token, denominator)
        cf = reduce_loss(clipfrac, masks, per_token, denominator)
        return loss * world_size, {"value_loss": float(loss.detach()), "value_clipfrac": float(cf)}

    return loss_fn


def _agree_custom_names(custom: CustomLoss, names: list[str], reduce: Reduce) -> list[str]:
    """The custom loss's metric names join the reported ones; every rank must report the same names (their sums
    are all-reduced by position), which is checked here rather than left to a collective of mismatched sizes."""
    extra = [n for n in (custom.names or []) if n not in names]
    import zlib
    sig = float(zlib.crc32(",".join(extra).encode()))
    got = reduce(torch.tensor([sig, -sig], dtype=torch.float64), "max").tolist()
    if got[0] != sig or -got[1] != sig:
        raise RuntimeError("--custom-loss-function-path: the trainer ranks' custom loss returned different metric "
                           f"names (this rank: {extra}); return the same keys on every call")
    return names + extra


ROW = "_row"   # a per-sample field of the shard's work copy: the sample's position in the shard


def old_log_probs_from_training(cfg: JobConfig, backend: TrainingBackend | None = None) -> bool:
    """Whether the old-policy log-probs come from the training forward itself (detached) instead of a forward of
    their own: the rollout gets exactly one optimizer step (so every micro-batch runs on the weights the rollout is
    scored against), the advantages do not need them beforehand (no --kl-coef reward penalty), and the backend's
    loss runs on every rank that reports metrics (no pipeline stages). slime recomputes them unless told to use the
    rollout's (--use-rollout-logprobs); TRL's GRPOTrainer skips the forward exactly when a generation feeds one
    optimizer step (``gradient_accumulation_steps % (steps_per_generation * num_iterations) == 0``) -- the rule
    here."""
    if cfg.train.num_steps_per_rollout != 1 or cfg.algorithm.kl_coef != 0:
        return False
    return int(getattr(backend, "pp_size", 1) or 1) == 1


def _prepare(batch: dict) -> dict:
    """A shallow copy with per-sample float tensors for masks and rollout log-probs."""
    work = dict(batch)
    work["loss_masks"] = [torch.as_tensor(m, dtype=torch.float32).flatten() for m in batch["loss_masks"]]
    if "rollout_log_probs" in batch:
        work["rollout_log_probs"] = [torch.as_tensor(x, dtype=torch.float32).flatten()
                                     for x in batch["rollout_log_probs"]]
    return work


def _old_log_prob_metrics(old: list[torch.Tensor], rlp: list[torch.Tensor] | None, ref: list[torch.Tensor] | None,
                          masks: list[torch.Tensor], reduce: Reduce) -> dict[str, float]:
    """The old log-probs' gap to the engine's rollout log-probs (``train_rollout_logprob_abs_diff``, mean over
    loss-masked tokens, and ``..._max``) and the KL to the reference (``ref_kl``, k1), global across ranks."""
    def rsum(*xs) -> list[float]:
        return reduce(torch.tensor([float(x) for x in xs], dtype=torch.float64), "sum").tolist()

    metrics: dict[str, float] = {}
    diff_sum = diff_cnt = diff_max = 0.0
    if rlp is not None:
        for o, r, m in zip(old, rlp, masks):
            if r.numel() and r.numel() == o.numel():
                d = (o - r).abs() * m
                diff_sum += float(d.sum())
                diff_cnt += float(m.sum())
                if d.numel():
                    diff_max = max(diff_max, float(d.max()))
    s, c = rsum(diff_sum, diff_cnt)
    if c > 0:
        metrics["train_rollout_logprob_abs_diff"] = s / c
        metrics["train_rollout_logprob_abs_diff_max"] = float(reduce(torch.tensor([diff_max], dtype=torch.float64),
                                                                     "max")[0])
    if ref is not None:
        ks = sum(float((compute_approx_kl(o, r, "k1") * m).sum()) for o, r, m in zip(old, ref, masks))
        s, c = rsum(ks, sum(float(m.sum()) for m in masks))
        metrics["ref_kl"] = s / max(c, 1.0)
    return metrics


def rl_update(backend: TrainingBackend, cfg: JobConfig, batch: dict, rollout_id: int,
              reduce: Reduce | None = None, phase: Callable[[str], Any] | None = None,
              old_from_training: bool | None = None) -> dict[str, float]:
    """Train on this rank's shard of one rollout; returns scalar metrics, global across ranks (all-reduced; only
    ``train_time`` is this rank's).

    ``batch`` gains per-sample tensors: old_log_probs, ref_log_probs (if used), values (ppo), advantages,
    returns. ``reduce(tensor, op="sum"|"max")`` reduces across the training ranks (default: the backend's
    ``reduce`` -- an all-reduce over the default process group; megatron's, over the data-parallel group only).
    ``phase(name)``: a context manager around the log-prob pass ("train_log_probs") and the optimizer steps
    ("train_actor") -- the profiler's (slime_actors/profiler.py). ``old_from_training``: None decides by
    `old_log_probs_from_training`; False computes the old log-probs with a forward of their own even when on-policy
    (what the update did before; the tests compare the two); True where the rule does not allow it is a
    ValueError."""
    reduce = reduce or backend.reduce
    phase = phase or (lambda name: contextlib.nullcontext())
    t0 = time.monotonic()
    algorithm_cfg = cfg.algorithm
    unpack_batch(batch)   # (the trainer's batch comes packed: its tensors are made here, as _prepare makes them)
    validate_batch(batch, require_rollout_log_probs=algorithm_cfg.use_tis)
    estimator = algorithm_cfg.advantage_estimator
    work = _prepare(batch)
    n = len(work["tokens"])
    masks = work["loss_masks"]

    def rsum(*xs) -> list[float]:
        return reduce(torch.tensor([float(x) for x in xs], dtype=torch.float64), "sum").tolist()

    # 1. reference and old log-probs (on-policy: the old ones come from the training forward, step 4)
    kl_coef = algorithm_cfg.kl_coef
    ref = None
    from_training = old_log_probs_from_training(cfg, backend)
    if old_from_training is not None:
        if old_from_training and not from_training:
            raise ValueError("old_from_training=True needs one optimizer step per rollout, --kl-coef 0 and no "
                             "pipeline stages")
        from_training = old_from_training
    old = None
    with phase("train_log_probs"):
        if algorithm_cfg.needs_reference:
            ref, _ = backend.compute_log_probs(work, model="ref")
            work["ref_log_probs"] = ref
        if from_training:
            work.pop("old_log_probs", None)   # (a batch trained on before carries its old ones: not these)
        else:
            old, _ = backend.compute_log_probs(work, model="actor")
            work["old_log_probs"] = old

    metrics: dict[str, float] = {}
    if old is not None:
        metrics.update(_old_log_prob_metrics(old, work.get("rollout_log_probs"), ref, masks, reduce))

    # 2. values (ppo)
    values = None
    if estimator == "ppo":
        values = backend.compute_values(work)
        work["values"] = values

    # 3. rewards -> advantages / returns
    raw = torch.as_tensor([float(r) for r in work["rewards"]], dtype=torch.float32)
    groups = work.get("group_index")   # per (prompt group, role) when the samples have roles (multi-agent)
    has_roles = any(work.get("roles") or ())
    if groups is not None and has_roles:
        groups = advantage_groups(list(groups), list(work["roles"]))
    rewards = normalize_group_rewards(raw, groups, estimator,
                                      std_normalization=not algorithm_cfg.disable_grpo_std_normalization)
    advantages, returns = compute_advantages_and_returns(
        estimator, rewards, masks, log_probs=old, ref_log_probs=ref, values=values, kl_coef=kl_coef,
        kl_type=algorithm_cfg.kl_loss_type, gamma=algorithm_cfg.gamma, lambd=algorithm_cfg.lambd,
        normalize_advantages=algorithm_cfg.normalize_advantages,
        reduce=lambda t: reduce(t, "sum"))
    work["advantages"], work["returns"] = advantages, returns

    adv_flat, m_flat = _cat(advantages), _cat(masks)
    tok = float(m_flat.sum())
    s, s2, c, rs, ns, rl = rsum((adv_flat * m_flat).sum(), (adv_flat.pow(2) * m_flat).sum(), tok, raw.sum(), n,
                                sum(int(x) for x in work["response_lengths"]))
    if c > 0:
        metrics["adv_mean"] = s / c
        metrics["adv_std"] = max(s2 / c - (s / c) ** 2, 0.0) ** 0.5
    if ns > 0:
        metrics["reward_mean"] = rs / ns
        metrics["response_len_mean"] = rl / ns
    metrics["num_samples"] = ns
    metrics["num_tokens"] = c
    if groups is not None and has_roles:   # several agents (whole prompt groups per rank: the counts add up)
        metrics["advantage_groups"] = rsum(float(len(set(groups))))[0]

    # 4. optimizer steps
    num_steps = cfg.train.num_steps_per_rollout
    names = policy_metric_names(algorithm_cfg) + (["value_loss", "value_clipfrac"] if estimator == "ppo" else [])
    custom = CustomLoss(cfg) if algorithm_cfg.loss_type == "custom_loss" else None
    step_sums = {k: 0.0 for k in names}
    grad_norms, critic_norms = [], []
    captured: dict[int, torch.Tensor] | None = None
    if from_training:
        captured = {}
        work[ROW] = list(range(n))
    with phase("train_actor"):
        names = _optimizer_steps(backend, cfg, work, n, reduce, names, custom, step_sums, grad_norms, critic_norms,
                                 captured)
    for k in names:
        metrics[k] = step_sums[k] / num_steps
    metrics["grad_norm"] = sum(grad_norms) / len(grad_norms)
    if critic_norms:
        metrics["critic_grad_norm"] = sum(critic_norms) / len(critic_norms)
    metrics["num_steps"] = float(num_steps)
    if captured is not None:
        missing = [i for i in range(n) if i not in captured]
        if missing:
            raise RuntimeError(f"on-policy update: the training forward gave no log-probs for samples {missing[:5]}")
        work["old_log_probs"] = [captured[i] for i in range(n)]
        metrics.update(_old_log_prob_metrics(work["old_log_probs"], work.get("rollout_log_probs"), ref, masks,
                                             reduce))
    metrics["train_time"] = time.monotonic() - t0

    for key in ("old_log_probs", "ref_log_probs", "values", "advantages", "returns"):
        if key in work:
            batch[key] = work[key]
    log.info("rl_update", rollout_id=rollout_id, rank=backend.rank,
             **{k: round(v, 6) for k, v in metrics.items() if k in ("loss", "pg_loss", "grad_norm", "reward_mean",
                                                                  "train_rollout_logprob_abs_diff_max")})
    return metrics


def _optimizer_steps(backend: TrainingBackend, cfg: JobConfig, work, n, reduce, names, custom, step_sums, grad_norms,
                     critic_norms, captured=None) -> None:
    """--num-steps-per-rollout optimizer steps over the shard's mini-batches (the module docstring, 4.); fills
    step_sums, grad_norms and critic_norms; returns the metric names (a custom loss adds its own)."""
    algorithm_cfg = cfg.algorithm
    estimator = algorithm_cfg.advantage_estimator
    num_steps = cfg.train.num_steps_per_rollout
    per_token = algorithm_cfg.calculate_per_token_loss
    world = max(backend.data_parallel_size, 1)

    def rsum(*xs) -> list[float]:
        return reduce(torch.tensor([float(x) for x in xs], dtype=torch.float64), "sum").tolist()

    for step_idx in mini_batch_indices(n, num_steps):
        step = select(work, step_idx)
        step_tokens = sum(float(m.sum()) for m in step["loss_masks"])
        g_samples, g_tokens = rsum(len(step_idx), step_tokens)
        denom = max(g_tokens if per_token else g_samples, 1.0)
        lengths = [len(t) for t in step["tokens"]]
        mbs = micro_batches_from_config(cfg.train, lengths)
        count = int(reduce(torch.tensor([len(mbs)], dtype=torch.float64), "max")[0])
        mbs = micro_batches_from_config(cfg.train, lengths, min_count=count)
        micro = [select(step, idx) for idx in mbs]
        local = backend.train_micro_batches(micro, make_policy_loss_fn(algorithm_cfg, denom, world, custom, captured))
        if custom is not None and \
                len(names) == len(policy_metric_names(algorithm_cfg)) + (2 if estimator == "ppo" else 0):
            names = _agree_custom_names(custom, names, reduce)
            step_sums.update({k: 0.0 for k in names if k not in step_sums})
        if estimator == "ppo":
            local.update(backend.train_micro_batches(micro, make_value_loss_fn(algorithm_cfg, denom, world),
                                                     train_critic=True))
            critic_norms.append(backend.optimizer_step(critic=True))
        grad_norms.append(backend.optimizer_step())
        glob = rsum(*[local.get(k, 0.0) for k in names])
        for k, v in zip(names, glob):
            step_sums[k] += v
    return names
