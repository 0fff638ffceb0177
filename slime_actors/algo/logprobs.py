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
