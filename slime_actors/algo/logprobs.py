"""Log-probs and entropy from logits: THE convention shared by the trainer and the local engine.

The log-prob of token ``t`` sampled at step ``i`` at temperature ``T`` is

    log_softmax(logits_i.float() / T)[t]

computed in fp32 whatever the model's dtype. A temperature below 1e-6 (greedy decoding) or None means ``T = 1``: greedy
picks the argmax, and its log-prob is reported under the untempered distribution. Entropy is that of the same
tempered distribution: ``-sum_v p_v log p_v``.
"""

from __future__ import annotations

import torch


GREEDY_TEMPERATURE = 1e-6  # below this, sampling is greedy (as the local engine decides)


def effective_temperature(temperature: float | None) -> float:
    """The temperature the log-probs are computed at: ``temperature``, or 1.0 for greedy (< 1e-6 / None)."""
    if temperature is None or temperature < GREEDY_TEMPERATURE:
        return 1.0
    return float(temperature)


def scaled_logits(logits: torch.Tensor, temperature: float | None = 1.0) -> torch.Tensor:
    """``logits.float() / T`` (no division when T == 1)."""
    t = effective_temperature(temperature)
    logits = logits.float()
    return logits if t == 1.0 else logits / t


def log_probs_from_logits(logits: torch.Tensor, tokens: torch.Tensor, temperature: float | None = 1.0
                          ) -> torch.Tensor:
    """Log-probs of ``tokens`` under ``logits``.

    logits: ``[..., V]`` (row ``i`` is the distribution the token ``tokens[..., i]`` was drawn from);
    tokens: ``[...]`` integer ids. Returns fp32 ``[...]``. Differentiable.
    """
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match tokens {tuple(tokens.shape)}")
    logp = torch.log_softmax(scaled_logits(logits, temperature), dim=-1)
    return logp.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float | None = 1.0) -> torch.Tensor:
    """Entropy (nats, fp32) of each row of ``logits`` ``[..., V]`` at the temperature. Differentiable."""
    logp = torch.log_softmax(scaled_logits(logits, temperature), dim=-1)
    return -(logp.exp() * logp).sum(-1)


ENTROPY_CHUNK_BYTES = 256 << 20   # the fp32 temporaries of one chunk of rows in `entropy_without_grad`


def entropy_without_grad(logits: torch.Tensor, temperature: float | None = 1.0,
                         chunk_bytes: int = ENTROPY_CHUNK_BYTES) -> torch.Tensor:
    """`entropy_from_logits` for a metric (no graph), a chunk of rows at a time: its vocabulary-wide fp32
    temporaries (the log-softmax, its exp, their product) exist for `chunk_bytes` of rows at once instead of for
    every response token of a micro-batch -- three times 2.5 GB for 128 samples of ~100 tokens of SmolLM2-135M
    (49,152-token vocabulary), alive beside the log-probs the backward needs. Each row's entropy is computed as
    `entropy_from_logits` computes it."""
    vocab = logits.shape[-1]
    flat = logits.detach().reshape(-1, vocab)
    rows = max(1, chunk_bytes // (4 * max(1, vocab)))
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
    with torch.no_grad():
        for i in range(0, flat.shape[0], rows):
            out[i:i + rows] = entropy_from_logits(flat[i:i + rows], temperature)
    return out.reshape(logits.shape[:-1])


def log_probs_and_entropy(logits: torch.Tensor, tokens: torch.Tensor, temperature: float | None = 1.0,
                          with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Both at once, sharing one log_softmax. The entropy is None unless ``with_entropy``."""
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match tokens {tuple(tokens.shape)}")
    logp = torch.log_softmax(scaled_logits(logits, temperature), dim=-1)
    lp = logp.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1) if with_entropy else None
    return lp, ent


HEAD_CHUNK_BYTES = 256 << 20   # the fp32 logits of one chunk of rows in `head_log_probs`


class _HeadLogProbs(torch.autograd.Function):
    """Log-probs of ``targets`` under ``F.linear(hidden, weight)`` (the language-model head), a chunk of rows at a
    time: the ``[rows, vocabulary]`` logits exist for one chunk at once, in the forward and again (recomputed) in
    the backward, never for the whole micro-batch. The entropy of each row comes with them, differentiable too (an
    entropy term in the loss: ``d H / d z = -p (log p + H)``)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, matmul_dtype, rows: int, with_entropy: bool):
        n = hidden.shape[0]
        dev = hidden.device
        lp = torch.empty(n, dtype=torch.float32, device=dev)
        ent = torch.empty(n, dtype=torch.float32, device=dev)
        lse = torch.empty(n, dtype=torch.float32, device=dev)
        w = weight.to(matmul_dtype)
        with torch.autocast(dev.type, enabled=False):
            for i in range(0, n, rows):
                z = _head_chunk(hidden[i:i + rows], w, matmul_dtype, temperature)
                norm = torch.logsumexp(z, dim=-1)
                lse[i:i + rows] = norm
                logp = z.sub_(norm.unsqueeze(-1))            # (z is this chunk's own: made in place)
                lp[i:i + rows] = logp.gather(-1, targets[i:i + rows].unsqueeze(-1)).squeeze(-1)
                if with_entropy:
                    ent[i:i + rows] = -(logp.exp() * logp).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, lse, ent)
        ctx.temperature, ctx.matmul_dtype, ctx.rows = temperature, matmul_dtype, rows
        ctx.set_materialize_grads(False)   # (an output the loss does not use: None, not a tensor of zeros)
        return lp, ent

    @staticmethod
    def backward(ctx, grad_lp, grad_ent):
        hidden, weight, targets, lse, ent = ctx.saved_tensors
        t, dt, rows = ctx.temperature, ctx.matmul_dtype, ctx.rows
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        if grad_lp is None and grad_ent is None:
            return grad_h, grad_w, None, None, None, None, None
        w = weight.to(dt)
        with torch.autocast(hidden.device.type, enabled=False):
            for i in range(0, hidden.shape[0], rows):
                h = hidden[i:i + rows]
                # z the tempered logits, p = softmax(z): d lp / d z = onehot(target) - p,
                # d H / d z = -p (log p + H); d z / d logits = 1 / T
                logp = _head_chunk(h, w, dt, t).sub_(lse[i:i + rows].unsqueeze(-1))
                g_lp = grad_lp[i:i + rows].float().unsqueeze(-1) if grad_lp is not None else None
                if grad_ent is not None:
                    g = (logp + ent[i:i + rows].unsqueeze(-1)).mul_(grad_ent[i:i + rows].float().unsqueeze(-1))
                    if g_lp is not None:
                        g.add_(g_lp)
                else:
                    assert g_lp is not None   # (one of the two is given: both None returned above)
                    g = g_lp.expand_as(logp).clone()
                g.mul_(logp.exp_()).neg_()                      # -p (g_lp + g_ent (log p + H))
                if g_lp is not None:
                    g.scatter_add_(-1, targets[i:i + rows].unsqueeze(-1), g_lp)
                if t != 1.0:
                    g.div_(t)
                g = g.to(dt)
                if grad_h is not None:
                    grad_h[i:i + rows] = (g @ w).to(hidden.dtype)
                if grad_w is not None:
                    grad_w.add_((g.t() @ h.to(dt)).float())
        return grad_h, (grad_w.to(weight.dtype) if grad_w is not None else None), None, None, None, None, None


def _head_chunk(hidden: torch.Tensor, weight: torch.Tensor, matmul_dtype, temperature: float) -> torch.Tensor:
    """One chunk's tempered fp32 logits: the head's matmul in ``matmul_dtype`` (bf16 under --bf16, as autocast
    runs it), then fp32 and the temperature, as `scaled_logits` takes them."""
    z = torch.nn.functional.linear(hidden.to(matmul_dtype), weight).float()
    return z if temperature == 1.0 else z.div_(temperature)


def head_log_probs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                   temperature: float | None = 1.0, matmul_dtype: torch.dtype | None = None,
                   chunk_bytes: int = HEAD_CHUNK_BYTES, with_entropy: bool = True
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`log_probs_and_entropy` of ``F.linear(hidden, weight)`` without the logits of every row at once.

    hidden: ``[N, H]`` (the rows whose next token is scored; differentiable), weight: the head's ``[V, H]``
    (differentiable), targets: ``[N]``. Returns fp32 ``(log_probs [N], entropy [N])``, both differentiable. The
    numbers are those of the model's logits through `log_probs_and_entropy` to floating-point tolerance (a
    log-sum-exp per row where that takes a log-softmax); the memory is one chunk's logits (``chunk_bytes`` of fp32
    rows) instead of the micro-batch's ``[N, V]`` logits, their log-softmax and their gradients (the backward
    recomputes each chunk's logits: one more head matmul). With ``with_entropy`` False the entropy is not
    computed and None is returned for it (a log-prob pass that needs none)."""
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1] or weight.dim() != 2 \
            or weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)} and targets "
                         f"{tuple(targets.shape)} do not fit: [N, H], [V, H], [N]")
    rows = max(1, chunk_bytes // (4 * max(1, weight.shape[0])))
    dt = matmul_dtype or weight.dtype
    lp, ent = _HeadLogProbs.apply(hidden, weight, targets.long(), effective_temperature(temperature), dt, rows,
                                  with_entropy)
    return lp, (ent if with_entropy else None)
