"""What the trainer does about its host memory (docs/performance.md, "Trainer memory on CPU"): the allocator trimmed
after an update (--trainer-release-memory), the weight sync's flat buffer dropped after a sync, the logits freed
before the backward, and --gradient-checkpointing computing the same gradients from fewer saved tensors. No
threshold on a machine's memory: each test checks the mechanism itself."""

from __future__ import annotations

import asyncio
import contextlib
import weakref

import pytest
import torch

from slime_actors.actors.trainer import TrainerRank
from slime_actors.backends.batching import select
from slime_actors.backends.rl_update import _prepare, make_policy_loss_fn
from slime_actors.backends.torch_backend import TorchBackend
from slime_actors.backends.weight_sync import DistributedWeightSender, WeightPusher
from slime_actors.mailbox import allocator
from slime_actors.models.tiny import make_tiny_model

from test_torch_backend import backend_for, make_args, toy_batch

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


def _trims(monkeypatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr(allocator, "trim", lambda: calls.append(1) or True)
    return calls


# -- the allocator --------------------------------------------------------------------------------------------------
class _FakeLibc:
    def __init__(self):
        self.calls: list[tuple] = []

    def malloc_trim(self, pad):
        self.calls.append(("malloc_trim", pad))
        return 1

    def mallopt(self, param, value):
        self.calls.append(("mallopt", param, value))
        return 1


def test_trim_is_glibc_malloc_trim_zero(monkeypatch):
    libc = _FakeLibc()
    monkeypatch.setattr(allocator, "_libc", lambda: libc)
    assert allocator.trim() is True
    assert libc.calls == [("malloc_trim", 0)]
    monkeypatch.setattr(allocator, "_libc", lambda: None)   # not glibc: nothing to call
    assert allocator.trim() is False


@pytest.mark.skipif(not allocator._glibc(), reason="malloc_trim exists only in glibc")
def test_trim_runs_in_this_process():
    blocks = [bytearray(1 << 20) for _ in range(64)]   # 64 MiB in heap-sized blocks, then freed
    del blocks
    assert allocator.trim() in (True, False)   # (whether pages were free to give back depends on the heap)


def test_a_threshold_given_in_the_environment_stays(monkeypatch):
    libc = _FakeLibc()
    monkeypatch.setattr(allocator, "_libc", lambda: libc)
    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")
    assert allocator.keep_freed(256) is True
    assert [c[1] for c in libc.calls] == [allocator._M_TRIM_THRESHOLD]   # the trim threshold only
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    monkeypatch.setattr(allocator, "_applied", None)
    libc.calls.clear()
    assert allocator.keep_freed(256) is True
    assert [c[1] for c in libc.calls] == [allocator._M_MMAP_THRESHOLD, allocator._M_TRIM_THRESHOLD]


# -- the backend and the trainer ------------------------------------------------------------------------------------
@pytest.mark.parametrize("on", [True, False])
def test_release_host_memory_trims_only_when_asked(tmp_path, tiny_dir, monkeypatch, on):
    calls = _trims(monkeypatch)
    b = TorchBackend(make_args(tmp_path, tiny_dir, trainer_release_memory="true" if on else "false"), 0, 1)
    assert b.release_host_memory() is on
    assert len(calls) == (1 if on else 0)


class _Profiler:
    def __init__(self, log):
        self.log = log

    def phase(self, *a):
        return contextlib.nullcontext()

    def after_step(self, rollout_id):
        self.log.append("after_step")


class _Backend:
    def __init__(self, log):
        self.log = log

    def release_host_memory(self):
        self.log.append("release")
        return True


def test_the_trainer_releases_memory_after_the_update():
    log: list[str] = []
    rank = TrainerRank.__new__(TrainerRank)
    rank.profiler, rank.backend = _Profiler(log), _Backend(log)
    rank.cfg = None

    def rl_update(backend, cfg, batch, rollout_id, phase):
        log.append("rl_update")
        return {"loss": 1.0}
    assert rank._update(rl_update, {}, 3, None) == {"loss": 1.0}
    assert log == ["rl_update", "after_step", "release"]


def _pusher(tmp_path, tiny_dir, on: bool, log: list):
    cfg = make_args(tmp_path, tiny_dir, trainer_release_memory="true" if on else "false")

    async def run_blocking(fn, *args):
        return fn(*args)
    pusher = WeightPusher(cfg, _Backend(log), actor=None, run_blocking=run_blocking, address=lambda: "127.0.0.1",
                          run_dir=str(tmp_path))
    pusher.sender = DistributedWeightSender("127.0.0.1", 1, world_size=2)   # never connected: its buffer only
    pusher.sender._flatten([torch.ones(1000), torch.ones(24)])
    assert pusher.sender._buffer is not None
    return pusher


@pytest.mark.parametrize("on", [True, False])
def test_a_sync_drops_the_flat_buffer(tmp_path, tiny_dir, on):
    log: list[str] = []
    pusher = _pusher(tmp_path, tiny_dir, on, log)

    async def transport(version, workers):
        log.append("sent")
        return {"bytes": 0, "buckets": 0}
    pusher._distributed = transport
    info = asyncio.run(pusher.push(1, [], "distributed"))
    assert info["weight_version"] == 1
    assert log == ["sent"]   # no trim on the event loop: the buffer is a mapping of its own, freed at once
    if on:
        assert pusher.sender._buffer is None and not pusher.sender._slots
    else:
        assert pusher.sender._buffer is not None   # kept for the next sync's copy


def test_the_next_flattened_bucket_after_a_release_is_the_same(tmp_path, tiny_dir):
    pusher = _pusher(tmp_path, tiny_dir, True, [])
    a, b = torch.arange(1000, dtype=torch.float32), torch.arange(24, dtype=torch.float32)
    first = pusher.sender._flatten([a, b]).clone()
    pusher.release()
    assert torch.equal(pusher.sender._flatten([a, b]), first)


# -- the training forward -------------------------------------------------------------------------------------------
def _train(b: TorchBackend, args, batch, hook=None, loss_wrap=None) -> dict[str, torch.Tensor]:
    work = _prepare(batch)
    work["old_log_probs"] = b.compute_log_probs(work)[0]
    adv = [1.0, -0.5, 0.25, -1.0, 2.0, 0.5, -0.75, -1.5]
    work["advantages"] = [torch.full((r,), a) for r, a in zip(work["response_lengths"], adv)]
    loss_fn = make_policy_loss_fn(args.algorithm, len(work["tokens"]), 1)
    if loss_wrap is not None:
        loss_fn = loss_wrap(loss_fn)
    ctx = hook() if hook is not None else contextlib.nullcontext()
    with ctx:
        b.train_micro_batches([select(work, [0, 1, 2, 3]), select(work, [4, 5, 6, 7])], loss_fn)
    g = {n: p.grad.detach().clone() for n, p in b._raw_model.named_parameters() if p.grad is not None}
    b.optimizer.zero_grad(set_to_none=True)
    return g


def test_the_logits_are_freed_before_the_backward(tmp_path, tiny_dir):
    """Where the training forward computes the micro-batch's logits (DDP, FSDP2, a model outside
    CHUNKED_HEAD_MODELS, or --head-chunk-mib 0: `_chunked_head` says None), they go before the loss and the
    backward run."""
    args = make_args(tmp_path, tiny_dir, head_chunk_mib=0)
    b = backend_for(args)
    assert b._chunked_head(b.model) is None
    refs: list[weakref.ref] = []
    inner = b._logits

    def logits(*x, **k):
        out = inner(*x, **k)
        if torch.is_grad_enabled():
            refs.append(weakref.ref(out))
        return out
    b._logits = logits
    alive: list[bool] = []

    def wrap(fn):
        def loss_fn(mb, lps, ents, values):
            alive.append(refs[-1]() is not None)   # the loss (and then the backward) runs without the logits
            return fn(mb, lps, ents, values)
        return loss_fn
    _train(b, args, toy_batch(), loss_wrap=wrap)
    assert alive == [False, False]


def _saved_bytes():
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    ctx = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    return seen, ctx


@pytest.mark.parametrize("bf16", [False, True])
def test_gradient_checkpointing_same_gradients_fewer_saved_tensors(tmp_path, tiny_dir, bf16):
    """(--bf16: the recomputed forward runs under the same autocast, so the same bf16 matmuls.)"""
    batch = toy_batch()
    plain_args = make_args(tmp_path / "plain", tiny_dir, bf16=bf16)
    ckpt_args = make_args(tmp_path / "ckpt", tiny_dir, gradient_checkpointing=True, bf16=bf16)
    plain, ckpt = backend_for(plain_args), backend_for(ckpt_args)
    assert plain.checkpointed_layers == 0 and ckpt.checkpointed_layers == 2   # the tiny model's two layers
    # the no-grad passes are untouched
    for a, c in zip(plain.compute_log_probs(batch)[0], ckpt.compute_log_probs(batch)[0]):
        assert torch.equal(a, c)
    saved_plain, ctx_plain = _saved_bytes()
    saved_ckpt, ctx_ckpt = _saved_bytes()
    g_plain = _train(plain, plain_args, batch, hook=lambda: ctx_plain)
    g_ckpt = _train(ckpt, ckpt_args, batch, hook=lambda: ctx_ckpt)
    assert max(g.abs().max().item() for g in g_plain.values()) > 1e-3   # a real gradient
    for name in g_plain:
        torch.testing.assert_close(g_ckpt[name], g_plain[name], atol=1e-7, rtol=1e-6, msg=name)
    weights = {p.untyped_storage().data_ptr() for p in ckpt._raw_model.parameters()}
    act_plain = sum(v for k, v in saved_plain.items() if k not in weights)
    act_ckpt = sum(v for k, v in saved_ckpt.items() if k not in weights)
    assert act_ckpt < act_plain / 2, (act_ckpt, act_plain)
    # the models stay in eval mode but for the layers' own flag (no dropout switched on)
    assert not any(m.training for n, m in ckpt._raw_model.named_modules() if "dropout" in n.lower())


def test_gradient_checkpointing_refuses_a_model_without_it(tmp_path, tiny_dir):
    b = TorchBackend(make_args(tmp_path, tiny_dir, gradient_checkpointing=True), 0, 1)
    with pytest.raises(ValueError, match="--gradient-checkpointing"):
        b._checkpoint_layers(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_gathered_response_log_probs_equal_a_slice_per_sample(tmp_path, tiny_dir, entropy_grad):
    """The training forward's log-probs and entropies, and the logits' gradient, are those of a log-softmax over
    each sample's slice of the logits (what the loop did before gathering the rows in one index operation)."""
    from slime_actors.algo.logprobs import entropy_from_logits, log_probs_and_entropy
    b = backend_for(make_args(tmp_path, tiny_dir, rollout_temperature=0.7))
    mb = toy_batch()
    ids, mask, pos = b._inputs(mb["tokens"])
    with torch.no_grad():
        base = b._logits(b._raw_model, ids, mask, pos, b._keep(mb, ids.shape[1]))
    off = ids.shape[1] - base.shape[1]
    weights = torch.randn(sum(mb["response_lengths"]), generator=torch.Generator().manual_seed(0))

    def run(gathered: bool):
        logits = base.clone().requires_grad_(True)
        if gathered:
            lps, ents = b._response_log_probs(mb, ids.shape[1], logits, 0.7, entropy_grad)
        else:
            lps, ents = [], []
            for j, (s, e) in enumerate(b._response_slices(mb)):
                lg = logits[j, s - off:e - off]
                lp, ent = log_probs_and_entropy(lg, b._targets(mb, j), 0.7, with_entropy=entropy_grad)
                if not entropy_grad:
                    ent = entropy_from_logits(lg.detach(), 0.7)
                lps.append(lp)
                ents.append(ent)
        out = (torch.cat(lps) * weights).sum() + (torch.cat(ents).sum() if entropy_grad else 0.0)
        out.backward()
        return lps, ents, logits.grad
    lps_g, ents_g, grad_g = run(True)
    lps_s, ents_s, grad_s = run(False)
    assert [x.shape for x in lps_g] == [x.shape for x in lps_s]
    for a, c in zip(lps_g + ents_g, lps_s + ents_s):
        torch.testing.assert_close(a, c, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grad_g, grad_s, atol=1e-7, rtol=1e-6)
    assert grad_g.abs().sum() > 0


# -- the head a chunk of rows at a time ----------------------------------------------------------------------------
def _train_capturing(b, args, batch):
    seen: list[tuple[list, list]] = []

    def wrap(fn):
        def loss_fn(mb, lps, ents, values):
            seen.append(([x.detach().clone() for x in lps], [x.detach().clone() for x in ents]))
            return fn(mb, lps, ents, values)
        return loss_fn
    shapes: list[tuple[int, ...]] = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t
    hook = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    grads = _train(b, args, batch, hook=lambda: hook, loss_wrap=wrap)
    return grads, seen, shapes


@pytest.mark.parametrize("bf16,temperature,entropy_coef", [(False, 1.0, 0.0), (False, 0.7, 0.0), (True, 0.7, 0.0),
                                                             (False, 0.7, 0.05)])
def test_the_head_a_chunk_at_a_time_gives_the_logits_numbers_without_the_logits(tmp_path, tiny_dir, bf16,
                                                                                temperature, entropy_coef):
    """The training forward of a Llama-like model takes its response log-probs from the body's hidden states and
    the head a chunk of rows at a time (algo.logprobs.head_log_probs, chunks of 3 rows here): the same log-probs,
    entropies and gradients as from the model's logits (to floating-point tolerance), and no tensor of the
    vocabulary's width is kept for the backward. With an entropy term in the loss (--entropy-coef) its gradient
    goes through the chunks too."""
    args = make_args(tmp_path, tiny_dir, bf16=bf16, rollout_temperature=temperature,
                     entropy_coef=entropy_coef or None)
    assert args.algorithm.entropy_coef == entropy_coef
    chunked, whole = backend_for(args), backend_for(args)
    assert chunked._chunked_head(chunked.model) is not None
    vocab = chunked._raw_model.config.vocab_size
    whole.head_chunk_bytes = 0                                       # what --head-chunk-mib 0 sets
    assert whole._chunked_head(whole.model) is None
    chunked.head_chunk_bytes = 3 * 4 * vocab
    g_chunked, seen_chunked, shapes_chunked = _train_capturing(chunked, args, toy_batch())
    g_whole, seen_whole, shapes_whole = _train_capturing(whole, args, toy_batch())
    tol = dict(atol=2e-2, rtol=2e-2) if bf16 else dict(atol=1e-5, rtol=1e-5)
    for (lp_c, ent_c), (lp_w, ent_w) in zip(seen_chunked, seen_whole, strict=True):
        for a, c in zip(lp_c + ent_c, lp_w + ent_w, strict=True):
            torch.testing.assert_close(a, c, **tol)
    assert max(g.abs().max().item() for g in g_whole.values()) > 1e-3   # a real gradient
    for name in g_whole:
        torch.testing.assert_close(g_chunked[name], g_whole[name], **tol, msg=name)
    assert chunked._raw_model.config.hidden_size != vocab
    assert any(s and s[-1] == vocab for s in shapes_whole)           # the logits path keeps [..., V] tensors
    assert not any(s and s[-1] == vocab for s in shapes_chunked)     # this one none (the head's weight is [V, H])


@pytest.mark.parametrize("chunk_rows,lora", [(None, False), (3, False), (0, False), (3, True)])
def test_equal_weights_give_equal_policy_and_reference_log_probs(tmp_path, tiny_dir, chunk_rows, lora):
    """The log-prob passes without a gradient (the reference model's, the actor's old-policy pass) take the head as
    the training forward does -- a chunk of rows at a time where it does (`chunk_rows`: None the default chunk, 3
    rows, 0 the whole logits). So before the first update, the policy equal to the reference, the log-probs are
    bit-equal in all three and the step's KL to the reference is exactly 0 (not rounding's 1e-9: a deterministic
    run takes the same trajectory with the chunked head on and off). With LoRA the reference is the actor with its
    adapters switched off."""
    from slime_actors.backends.rl_update import rl_update
    extra = dict(lora_rank=4, lora_alpha=8) if lora else {}
    args = make_args(tmp_path, tiny_dir, use_kl_loss=True, kl_loss_coef=0.1, rollout_batch_size=4,
                     global_batch_size=8, micro_batch_size=4, **extra)
    b = backend_for(args)
    vocab = b._raw_model.config.vocab_size
    if chunk_rows is not None:
        b.head_chunk_bytes = chunk_rows * 4 * vocab
    assert (b._chunked_head(b._raw_model) is None) is (chunk_rows == 0)
    if not lora:
        assert b.ref_model is not None and (b._chunked_head(b.ref_model) is None) is (chunk_rows == 0)
    batch = toy_batch()
    ref, _ = b.compute_log_probs(batch, model="ref")
    old, ents = b.compute_log_probs(batch, model="actor", with_entropy=True)
    batch["ref_log_probs"] = ref
    _, trained, _ = _train_capturing(b, args, batch)
    trained_lps = [x for lps, _ in trained for x in lps]
    assert len(ref) == len(old) == len(trained_lps) == len(batch["tokens"])
    for r, o, t in zip(ref, old, trained_lps, strict=True):
        assert torch.equal(r, o) and torch.equal(o.to(t.device), t)
    trained_ents = [x for _, es in trained for x in es]
    for e, te in zip(ents, trained_ents, strict=True):
        torch.testing.assert_close(e, te.to(e.device), atol=1e-6, rtol=1e-6)   # the entropies too
    b2 = backend_for(args)
    if chunk_rows is not None:
        b2.head_chunk_bytes = chunk_rows * 4 * vocab
    metrics = rl_update(b2, args, toy_batch(), 0)
    assert metrics["ref_kl"] == 0.0 and metrics["kl_loss"] == 0.0


def test_the_chunked_head_is_not_used_where_it_does_not_apply(tmp_path, tiny_dir):
    b = backend_for(make_args(tmp_path, tiny_dir))
    assert b.head_chunk_bytes == 256 << 20                  # --head-chunk-mib's default
    assert b._chunked_head(b.model) is not None
    off = backend_for(make_args(tmp_path / "off", tiny_dir, head_chunk_mib=0))
    assert off._chunked_head(off.model) is None             # turned off: the whole logits
    b.parallel = "ddp"
    assert b._chunked_head(b.model) is None                 # a wrapped forward (DDP, FSDP2)
    b.parallel = "none"
    b._raw_model.config.model_type = "gemma2"               # logits soft-capped: not the head alone
    assert b._chunked_head(b.model) is None
