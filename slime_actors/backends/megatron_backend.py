"""The megatron training backend: a megatron-core GPTModel built from a Hugging Face config, tensor / pipeline /
data parallel, Megatron DDP and (optionally) the distributed optimizer.

    backend = MegatronBackend(cfg, rank, world_size); backend.init()   # cfg: slime_actors.config.JobConfig
    metrics = rl_update(backend, cfg, batch, rollout_id)       # the same RL update as the torch backend
    for name, tensor in backend.named_weights(): ...            # HF names and layouts, gathered on rank 0
    backend.save(dir); backend.load(dir); backend.save_hf(dir)

* Model: ``GPTModel`` with ``get_gpt_layer_local_spec`` (megatron-core's own modules; Transformer Engine is never
  needed) for dense Llama, Qwen2 (qkv bias) and Qwen3 (q/k norm): RMSNorm, SwiGLU, RoPE, GQA, tied or untied
  embeddings, from --hf-checkpoint (`megatron_convert.ArchSpec`). Weights come from the HF safetensors
  (`megatron_convert`), each rank reading what its tensor / pipeline shard needs. fp32, or bf16 with --bf16
  (``Float16Module``; the optimizer keeps fp32 master weights). Dropout is off.
* Parallel: torch.distributed's world is split by ``parallel_state.initialize_model_parallel`` with
  --tensor-model-parallel-size and --pipeline-model-parallel-size; the rest is data parallel. Ranks of one
  tensor/pipeline group work on the same data: `data_parallel_rank` / `data_parallel_size` are what the trainer
  asks the buffer for, `reduce` all-reduces rl_update's statistics over the data-parallel group only, and the
  loss is scaled by the data-parallel size (Megatron DDP averages gradients over it).
* Forward/backward: always through ``get_forward_backward_func()`` (no pipelining, or 1F1B across pipeline
  stages with variable sequence lengths), with a ``loss_func`` that computes log-probs of the sampled tokens
  from vocab-parallel logits (`vocab_parallel_log_probs`: max / sum-exp / target logit all-reduced over the
  tensor-parallel group, with an analytic backward) and calls the rl_update LossFn. The schedule divides each
  micro-batch loss by the number of micro-batches; the loss_func multiplies it back, because the LossFn's loss is
  already scaled for accumulation.
* Weights out (`named_weights`): the owning pipeline stage all-gathers tensor-parallel shards, converts to HF
  names/layouts and (if it is not stage 0) sends them to global rank 0, which yields them. It is a collective of
  data-parallel replica 0: every rank calls `named_weights` at the same time (the controller asks every trainer
  rank to sync_weights; ranks other than 0 just iterate it); other replicas return at once.
* Checkpoints: ``megatron.core.dist_checkpointing`` (torch_dist) of the model's and optimizer's sharded state
  dicts under ``path/dist``, plus per-rank RNG states and ``meta.json``; ``save_hf`` writes an HF directory.
* CPU: megatron-core has no CPU path, and ``--device cpu`` is refused -- except in a process where the test shim
  (tests/megatron_cpu_shim.py) has made its modules run on CPU over gloo, slowly, for tests without a GPU.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..algo.logprobs import entropy_without_grad, log_probs_and_entropy, scaled_logits
from ..config import JobConfig
from ..gpus import training_device
from ..log import get_logger
from . import megatron_convert as mc
from .batching import forward_micro_batches, pad_tokens, select, validate_batch
from .listen import limit_collectives, tcp_store
from ..safe_pickle import check_torch_dist, load_torch_file
from .torch_backend import _rng_state, _set_rng_state
from .training import LossFn, TrainingBackend
from ..json_files import read_json_object

META_FILE = "meta.json"
DIST_DIR = "dist"

log = get_logger(component="megatron_backend")


# -- vocab-parallel log-probs ------------------------------------------------------------------------------------

class _VocabParallelLogProbs(torch.autograd.Function):
    """Log-prob of each row's target and the row's entropy, from this rank's vocabulary slice of the logits.

    Forward all-reduces (over ``group``) the row max, the sum of exp, the target's logit and E_p[z]; backward
    is local: d logp/dz = onehot(target) - p, d H/dz = -p (z - E_p[z]) (the loss is replicated across the
    tensor-parallel ranks, so each rank's gradient is its slice of the full one)."""

    @staticmethod
    def forward(ctx, logits, target, vocab_start, valid_vocab, group):
        n, vl = logits.shape
        col = torch.arange(vl, device=logits.device) + vocab_start
        invalid = (col >= valid_vocab).unsqueeze(0)
        z = logits.masked_fill(invalid, float("-inf"))
        m = z.max(dim=-1).values if vl else logits.new_full((n,), float("-inf"))
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        e = torch.exp(z - m.unsqueeze(-1))
        s = e.sum(-1)
        dist.all_reduce(s, group=group)
        p = e / s.unsqueeze(-1)
        lse = m + torch.log(s)
        local_t = target - vocab_start
        in_range = (local_t >= 0) & (local_t < vl)
        idx = local_t.clamp(0, max(vl - 1, 0)).unsqueeze(-1)
        zt = torch.where(in_range, logits.gather(-1, idx).squeeze(-1), torch.zeros_like(m))
        dist.all_reduce(zt, group=group)
        zc = logits.masked_fill(invalid, 0.0)
        ez = (p * zc).sum(-1)
        dist.all_reduce(ez, group=group)
        ctx.save_for_backward(p, zc, ez, idx, in_range)
        return zt - lse, lse - ez

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        p, zc, ez, idx, in_range = ctx.saved_tensors
        grad = torch.zeros_like(p)
        if g_lp is not None:
            grad -= p * g_lp.unsqueeze(-1)
            grad.scatter_add_(-1, idx, (g_lp * in_range).unsqueeze(-1))
        if g_ent is not None:
            grad -= g_ent.unsqueeze(-1) * p * (zc - ez.unsqueeze(-1))
        return grad, None, None, None, None


def vocab_parallel_log_probs(logits: torch.Tensor, target: torch.Tensor, vocab_start: int, valid_vocab: int,
                             group=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs [N], entropies [N]), fp32, of rows of vocab-parallel logits ``[N, V_local]`` (this rank holds
    global columns ``vocab_start ..``; columns >= ``valid_vocab`` are padding and get probability 0).
    ``logits`` should already be divided by the temperature. Differentiable in ``logits``."""
    return _VocabParallelLogProbs.apply(logits.float(), target.long(), int(vocab_start), int(valid_vocab), group)


# -- small collectives -------------------------------------------------------------------------------------------

def _broadcast_json(obj: Any, src: int, group, device: torch.device) -> Any:
    """Broadcast a JSON-able object from global rank ``src`` over ``group`` (length, then UTF-8 bytes)."""
    data = json.dumps(obj).encode() if dist.get_rank() == src else b""
    n = torch.tensor([len(data)], dtype=torch.long, device=device)
    dist.broadcast(n, src=src, group=group)
    buf = torch.empty(int(n.item()), dtype=torch.uint8, device=device)
    if dist.get_rank() == src:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(buf, src=src, group=group)
    return json.loads(bytes(buf.cpu().tolist()).decode()) if dist.get_rank() != src else obj


def _megatron_runs_on_cpu() -> bool:
    """Whether megatron-core can allocate here without CUDA: only where tests/megatron_cpu_shim.py has pointed
    torch.cuda.current_device() at the CPU (megatron-core has no CPU path of its own)."""
    try:
        return torch.device(torch.cuda.current_device()).type == "cpu"
    except Exception:  # noqa: BLE001 -- no CUDA: "Torch not compiled with CUDA enabled" and the like
        return False


# -- the backend -------------------------------------------------------------------------------------------------

def _param_tensor(p: torch.Tensor) -> torch.Tensor:
    return p.detach()


@dataclass
class _Item:
    """One micro-batch, ready for the model."""
    mb: dict
    ids: torch.Tensor
    pos: torch.Tensor
    mask: torch.Tensor
    slices: list = field(default_factory=list)   # (row, start, end) of each sample's response-predicting logits
    targets: torch.Tensor | None = None
    lengths: list = field(default_factory=list)
    empty: bool = False


class MegatronBackend(TrainingBackend):
    """One rank of the megatron training group (see the module docstring)."""

    def __init__(self, cfg: JobConfig, rank: int = 0, world_size: int = 1):
        if dist.is_available() and dist.is_initialized():
            if dist.get_rank() != rank or dist.get_world_size() != world_size:
                raise ValueError(f"MegatronBackend(rank={rank}, world_size={world_size}) but torch.distributed "
                                 f"has rank {dist.get_rank()} of {dist.get_world_size()}")
        super().__init__(cfg, rank, world_size)
        self.log = get_logger(actor=f"trainer/{rank}", component="megatron_backend")
        self.model = None          # DDP(Float16Module?(GPTModel))
        self.gpt = None            # the GPTModel inside (names, sharded state dicts)
        self.ref_model = None
        self.optimizer = None
        self.pad_id = 0
        self.optimizer_steps = 0
        self.tp_size = self.pp_size = self.data_parallel_size = 1
        self.tp_rank = self.pp_rank = self.data_parallel_rank = 0
        self._masks: dict[int, torch.Tensor] = {}
        # _local_views' HF tensors that are views of the parameters, and the parameters' storage they were made for
        self._view_params: list[torch.Tensor] | None = None
        self._views: list = []
        self._views_key: tuple | None = None

    # -- set-up ------------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self._device

    def _on_device(self) -> None:
        """torch.cuda's current device is per thread; the trainer calls us from worker threads."""
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)

    def _checkpoint_dir(self) -> str:
        spec = self.cfg.model.hf_checkpoint
        if spec is None:
            raise ValueError("--hf-checkpoint is required")
        from ..models.resolve import model_cache, resolve_checkpoint
        return resolve_checkpoint(spec, model_cache(self.cfg.run.run_dir))

    def _init_distributed(self) -> None:
        if dist.is_initialized():
            return
        backend = "nccl" if self._device.type == "cuda" else "gloo"
        limit_collectives("127.0.0.1")  # (one process: its store and collectives on the loopback)
        dist.init_process_group(backend, store=tcp_store("127.0.0.1", 0, 1, True), rank=0, world_size=1)

    def init(self) -> None:
        cfg, algorithm_cfg, train_cfg = self.cfg, self.cfg.algorithm, self.cfg.train
        self._device = training_device(self.cfg.run.device, self.rank)
        if self._device.type == "cpu" and not _megatron_runs_on_cpu():
            raise RuntimeError("--train-backend megatron needs a GPU (--device cuda): megatron-core has no CPU path. "
                               "On CPU use --train-backend torch; tests run megatron on CPU through "
                               "tests/megatron_cpu_shim.py")
        self.dtype = torch.bfloat16 if train_cfg.bf16 else torch.float32
        self.hf_path = self._checkpoint_dir()
        self.spec = mc.ArchSpec.from_hf(self.hf_path)
        if algorithm_cfg.advantage_estimator == "ppo":
            raise NotImplementedError("--advantage-estimator ppo needs a critic; the megatron backend has none "
                                      "(use --train-backend torch)")
        tp, pp = train_cfg.tensor_model_parallel_size, train_cfg.pipeline_model_parallel_size
        self.spec.check_parallel(tp, pp)
        self._init_distributed()
        if dist.get_world_size() % (tp * pp):
            raise ValueError(f"world size {dist.get_world_size()} is not a multiple of tensor x pipeline parallel "
                             f"size {tp} x {pp}")
        from megatron.core import parallel_state as ps
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
        seed = cfg.run.seed
        if self._device.type == "cuda":
            from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
            model_parallel_cuda_manual_seed(seed)
        self.tp_size, self.pp_size = tp, pp
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.pp_rank = ps.get_pipeline_model_parallel_rank()
        self.data_parallel_size = ps.get_data_parallel_world_size()
        self.data_parallel_rank = ps.get_data_parallel_rank()
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.pp_group = ps.get_pipeline_model_parallel_group()
        self.dp_group = ps.get_data_parallel_group()
        self.first_stage, self.last_stage = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
        self.last_stage_rank = ps.get_pipeline_model_parallel_last_rank()
        self.stage_ranks = dist.get_process_group_ranks(self.pp_group)
        self.padded_vocab = mc.padded_vocab_size(self.spec.vocab_size, tp)
        self.vocab_start = self.tp_rank * (self.padded_vocab // tp)

        hf_config = read_json_object(Path(self.hf_path) / "config.json")
        pad = hf_config.get("pad_token_id")
        self.pad_id = int(pad) if isinstance(pad, int) else 0

        self.config = self._transformer_config()
        self.gpt, self.model = self._build(self.hf_path, trainable=True)
        if algorithm_cfg.needs_reference:
            _, self.ref_model = self._build(cfg.model.ref_load or self.hf_path, trainable=False)
        self._build_optimizer()
        self._export_plan = self._make_export_plan()
        self.log.info("megatron backend ready", model=self.hf_path, arch=self.spec.model_type,
                      device=str(self._device), dtype=str(self.dtype), tp=tp, pp=pp, dp=self.data_parallel_size,
                      distributed_optimizer=train_cfg.use_distributed_optimizer, ref=self.ref_model is not None)

    def _transformer_config(self, **over):
        import torch.nn.functional as F
        from megatron.core.transformer.transformer_config import TransformerConfig
        s = self.spec
        bf16 = self.dtype == torch.bfloat16
        kw = dict(num_layers=s.num_layers, hidden_size=s.hidden_size, num_attention_heads=s.num_attention_heads,
                  num_query_groups=s.num_query_groups, ffn_hidden_size=s.ffn_hidden_size, kv_channels=s.head_dim,
                  normalization="RMSNorm", layernorm_epsilon=s.norm_eps, gated_linear_unit=True,
                  activation_func=F.silu, add_bias_linear=False, add_qkv_bias=s.qkv_bias, qk_layernorm=s.qk_norm,
                  hidden_dropout=0.0, attention_dropout=0.0, tensor_model_parallel_size=self.tp_size,
                  pipeline_model_parallel_size=self.pp_size, sequence_parallel=False,
                  params_dtype=self.dtype, pipeline_dtype=self.dtype, bf16=bf16, fp16=False,
                  variable_seq_lengths=True, use_cpu_initialization=self._device.type == "cpu",
                  perform_initialization=False, bias_activation_fusion=False, masked_softmax_fusion=False,
                  persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False,
                  gradient_accumulation_fusion=False, apply_query_key_layer_scaling=False,
                  attention_softmax_in_fp32=True, rotary_interleaved=False,
                  moe_token_dispatcher_type="alltoall")  # dense; allgather (the default) refuses variable lengths
        kw.update(over)
        return TransformerConfig(**kw)

    def _build(self, weights_dir: str, trainable: bool):
        """A GPTModel for this stage, weights loaded from ``weights_dir``; wrapped for training when trainable."""
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.models.gpt.gpt_model import GPTModel
        s = self.spec
        config = self.config if trainable else self._transformer_config()
        layer_spec = get_gpt_layer_local_spec(qk_layernorm=s.qk_norm, normalization="RMSNorm")
        gpt = GPTModel(config, layer_spec, vocab_size=self.padded_vocab, max_sequence_length=s.max_position_embeddings,
                       pre_process=self.first_stage, post_process=self.last_stage, parallel_output=True,
                       share_embeddings_and_output_weights=s.tie_word_embeddings, position_embedding_type="rope",
                       rotary_percent=1.0, rotary_base=s.rope_theta)
        gpt.to(self._device)
        self._load_hf_weights(gpt, weights_dir)
        model = gpt
        if self.dtype == torch.bfloat16:
            from megatron.core.transformer.module import Float16Module
            model = Float16Module(config, gpt)
        if not trainable:
            model.requires_grad_(False)
            model.eval()
            return gpt, model
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False, overlap_param_gather=False,
            use_distributed_optimizer=self.cfg.train.use_distributed_optimizer, check_for_nan_in_grad=False)
        model = DistributedDataParallel(config, ddp_config, model)
        model.eval()  # no dropout anywhere; a training forward computes what the log-prob forward computes
        return gpt, model

    def _layer_offset(self, gpt) -> int:
        layers = getattr(gpt.decoder, "layers", None)
        if layers is None or len(layers) == 0:
            return 0
        return int(layers[0].layer_number) - 1

    def _load_hf_weights(self, gpt, weights_dir: str) -> None:
        """Copy this rank's shard of every parameter from the HF safetensors in ``weights_dir``."""
        reader = mc.HFReader(weights_dir)
        offset = self._layer_offset(gpt)
        n_local = len(gpt.decoder.layers)
        if n_local != self.spec.num_layers // self.pp_size:
            raise RuntimeError(f"pipeline stage {self.pp_rank} holds {n_local} layers, expected "
                               f"{self.spec.num_layers // self.pp_size}")
        loaded = 0
        with torch.no_grad():
            for local_name, p in gpt.named_parameters():
                name = mc.to_global_name(local_name, offset)
                full = mc.hf_to_mcore_tensor(self.spec, name, reader.get)
                shard = mc.tp_shard(self.spec, name, full, self.tp_rank, self.tp_size)
                if tuple(shard.shape) != tuple(p.shape):
                    raise mc.ConversionError(f"{name}: converted shard {tuple(shard.shape)} does not fit the "
                                             f"model's {tuple(p.shape)} (tp rank {self.tp_rank})")
                p.copy_(shard.to(device=p.device, dtype=p.dtype))
                loaded += 1
        self.log.info("weights loaded", path=str(weights_dir), tensors=loaded,
                      layers=f"{offset}..{offset + n_local - 1}")

    def _build_optimizer(self) -> None:
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        train_cfg = self.cfg.train
        clip = train_cfg.clip_grad
        oc = OptimizerConfig(optimizer="adam", lr=train_cfg.lr, min_lr=train_cfg.lr,
                             weight_decay=train_cfg.weight_decay,
                             adam_beta1=train_cfg.adam_beta1, adam_beta2=train_cfg.adam_beta2, adam_eps=1e-8,
                             clip_grad=clip if clip > 0 else 1e30,  # Megatron computes the norm only when clipping
                             bf16=self.dtype == torch.bfloat16, params_dtype=self.dtype,
                             use_distributed_optimizer=train_cfg.use_distributed_optimizer)
        self.optimizer = get_megatron_optimizer(oc, [self.model])
        self.config.no_sync_func = self.model.no_sync
        self.config.finalize_model_grads_func = finalize_model_grads

    def _require_init(self):
        if self.model is None:
            raise RuntimeError("MegatronBackend.init() has not been called")

    # -- data ----------------------------------------------------------------------------------------------
    def reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """All-reduce over the data-parallel group (rl_update's statistics); identity with one replica."""
        if self.data_parallel_size == 1:
            return t
        dev = self._device if self._device.type == "cuda" else torch.device("cpu")
        x = t.detach().to(dev).clone()
        dist.all_reduce(x, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op], group=self.dp_group)
        return x.to(t.device)

    def _causal_mask(self, s: int) -> torch.Tensor:
        m = self._masks.get(s)
        if m is None:
            m = torch.triu(torch.ones(s, s, dtype=torch.bool, device=self._device), diagonal=1)[None, None]
            self._masks = {s: m}
        return m

    def _item(self, mb: dict) -> _Item:
        tokens = mb["tokens"]
        if not tokens:  # an empty micro-batch: a one-token dummy forward (every stage and rank runs it)
            ids, _, pos = pad_tokens([[self.pad_id]], pad_id=self.pad_id, device=self._device)
            return _Item(mb, ids, pos, self._causal_mask(1), empty=True)
        ids, _, pos = pad_tokens(tokens, pad_id=self.pad_id, device=self._device)
        slices, targets, lengths = [], [], []
        for j, (p, r) in enumerate(zip(mb["prompt_lengths"], mb["response_lengths"])):
            p, r = int(p), int(r)
            slices.append((j, p - 1, p + r - 1))
            targets.extend(int(x) for x in tokens[j][p:p + r])
            lengths.append(r)
        tgt = torch.as_tensor(targets, dtype=torch.long, device=self._device)
        return _Item(mb, ids, pos, self._causal_mask(ids.shape[1]), slices, tgt, lengths)

    def _temperature(self) -> float:
        return self.cfg.rollout.rollout_temperature or 1.0   # greedy (0) rollouts: log-probs at 1

    def _log_probs(self, logits: torch.Tensor, item: _Item, entropy_grad: bool
                   ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-sample log-probs (with grad) and entropies (with grad only if entropy_grad) of the responses."""
        rows = torch.cat([logits[j, s:e] for j, s, e in item.slices]) if item.slices else logits[0, :0]
        temp = self._temperature()
        if self.tp_size == 1:
            lp, ent = log_probs_and_entropy(rows, item.targets, temp, with_entropy=entropy_grad)
            if not entropy_grad:   # a metric: in chunks of rows (algo/logprobs.py)
                ent = entropy_without_grad(rows, temp)
        else:
            lp, ent = vocab_parallel_log_probs(scaled_logits(rows, temp), item.targets, self.vocab_start,
                                               self.spec.vocab_size, self.tp_group)
            if not entropy_grad:
                ent = ent.detach()
        return list(lp.split(item.lengths)), list(ent.split(item.lengths))

    # -- the schedule --------------------------------------------------------------------------------------
    def _run(self, net, micro_batches: list[dict], forward_only: bool, loss_fn: LossFn | None = None,
             with_entropy: bool = False) -> list:
        """Every micro-batch through ``get_forward_backward_func()``; returns what loss_func reported per
        micro-batch on the last pipeline stage ([] elsewhere)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func
        items = [self._item(mb) for mb in micro_batches]
        n = len(items)
        entropy_grad = self.cfg.algorithm.entropy_coef != 0.0

        def loss_func(item: _Item, logits: torch.Tensor):
            if item.empty:
                return logits.float().sum() * 0.0, {"empty": True}
            if forward_only:
                with torch.no_grad():
                    lps, ents = self._log_probs(logits, item, entropy_grad=False)
                out = {"lp": torch.cat(lps).float()}
                if with_entropy:
                    out["ent"] = torch.cat(ents).float()
                return logits.new_zeros(()), out
            lps, ents = self._log_probs(logits, item, entropy_grad)
            loss, metrics = loss_fn(item.mb, lps, ents, None)
            if not torch.is_tensor(loss) or not loss.requires_grad:
                raise ValueError("loss_fn must return a tensor that requires grad")
            return loss * n, {"metrics": {k: float(v) for k, v in metrics.items()}}

        def forward_step(data_iterator, model):
            item = next(data_iterator)
            out = model(item.ids, item.pos, item.mask)
            return out, partial(loss_func, item)

        fwd_bwd = get_forward_backward_func()
        ctx = torch.no_grad() if forward_only else contextlib.nullcontext()
        with ctx:
            store = fwd_bwd(forward_step_func=forward_step, data_iterator=iter(items), model=[net],
                            num_microbatches=n, seq_length=max(int(i.ids.shape[1]) for i in items),
                            micro_batch_size=max(int(i.ids.shape[0]) for i in items), forward_only=forward_only)
        return list(store or [])

    # -- forward passes (no grad) --------------------------------------------------------------------------
    def compute_log_probs(self, batch: dict, model: str = "actor", with_entropy: bool = False
                          ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        self._require_init()
        self._on_device()
        validate_batch(batch)
        if model == "actor":
            net = self.model
        elif model == "ref":
            if self.ref_model is None:
                raise ValueError("no reference model (enable --use-kl-loss or --kl-coef > 0)")
            net = self.ref_model
        else:
            raise ValueError(f"model must be 'actor' or 'ref', got {model!r}")
        n = len(batch["tokens"])
        if n == 0:
            return [], ([] if with_entropy else None)
        lengths = [len(t) for t in batch["tokens"]]
        mbs = forward_micro_batches(self.cfg.train, lengths)
        store = self._run(net, [select(batch, idx) for idx in mbs], forward_only=True, with_entropy=with_entropy)
        resp = [int(r) for r in batch["response_lengths"]]
        total = sum(resp)
        order = [i for idx in mbs for i in idx]
        flat_lp = torch.empty(total, dtype=torch.float32, device=self._device)
        flat_ent = torch.empty(total, dtype=torch.float32, device=self._device) if with_entropy else None
        if self.last_stage:
            lp = torch.cat([d["lp"] for d in store if not d.get("empty")]) if store else flat_lp[:0]
            flat_lp.copy_(lp)
            if with_entropy:
                flat_ent.copy_(torch.cat([d["ent"] for d in store if not d.get("empty")]))
        if self.pp_size > 1:
            dist.broadcast(flat_lp, src=self.last_stage_rank, group=self.pp_group)
            if with_entropy:
                dist.broadcast(flat_ent, src=self.last_stage_rank, group=self.pp_group)
        out_lp: list = [None] * n
        out_ent: list = [None] * n
        off = 0
        lp_cpu = flat_lp.cpu()
        ent_cpu = flat_ent.cpu() if with_entropy else None
        for i in order:
            out_lp[i] = lp_cpu[off:off + resp[i]].clone()
            if with_entropy:
                out_ent[i] = ent_cpu[off:off + resp[i]].clone()
            off += resp[i]
        return out_lp, (out_ent if with_entropy else None)

    # -- training ------------------------------------------------------------------------------------------
    def train_micro_batches(self, micro_batches: list[dict], loss_fn: LossFn, train_critic: bool = False
                            ) -> dict[str, float]:
        """One optimizer step's forward + backward through the pipeline schedule (gradients reduced over the
        data-parallel group at its end). Empty micro-batches run a zero-loss dummy forward."""
        self._require_init()
        self._on_device()
        if train_critic:
            raise ValueError("the megatron backend has no critic")
        if not micro_batches:
            micro_batches = [{"tokens": [], "prompt_lengths": [], "response_lengths": [], "loss_masks": []}]
        for mb in micro_batches:
            validate_batch(mb)
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        store = self._run(self.model, micro_batches, forward_only=False, loss_fn=loss_fn)
        totals: dict[str, float] = {}
        if self.last_stage:
            for d in store:
                for k, v in d.get("metrics", {}).items():
                    totals[k] = totals.get(k, 0.0) + float(v)
        if self.pp_size > 1:
            totals = _broadcast_json(totals, self.last_stage_rank, self.pp_group, self._collective_device())
        return totals

    def _collective_device(self) -> torch.device:
        return self._device if self._device.type == "cuda" else torch.device("cpu")

    def optimizer_step(self, critic: bool = False) -> float:
        self._require_init()
        self._on_device()
        if critic:
            raise ValueError("the megatron backend has no critic")
        ok, grad_norm, _ = self.optimizer.step()
        norm = float(grad_norm) if grad_norm is not None else float("nan")
        if ok:
            self.optimizer_steps += 1
        else:
            self.log.warning("optimizer step skipped", grad_norm=norm)
        return norm

    # -- weights -------------------------------------------------------------------------------------------
    def _make_export_plan(self) -> list[tuple[str, int, list]]:
        """(global Megatron name, owning pipeline stage, [(hf name, shape), ...]) in HF export order."""
        per_stage = self.spec.num_layers // self.pp_size
        plan = []
        for name in mc.mcore_names(self.spec):
            layer = mc.layer_of(name)
            if layer is not None:
                stage = layer // per_stage
            elif name == "embedding.word_embeddings.weight":
                stage = 0
            else:  # final norm, untied output layer
                stage = self.pp_size - 1
            plan.append((name, stage, mc.hf_shapes(self.spec, name)))
        return plan

    def _tp_gather(self, name: str, t: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1 or mc.tp_layout(name) == mc.REPLICATED:
            return mc.tp_gather(self.spec, name, [t])
        parts = [torch.empty_like(t) for _ in range(self.tp_size)]
        dist.all_gather(parts, t.contiguous(), group=self.tp_group)
        return mc.tp_gather(self.spec, name, parts)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights in HF names and layouts, yielded on global rank 0 (on the training device). Collective
        over data-parallel replica 0: every rank must iterate it at the same time (the others get nothing)."""
        self._require_init()
        self._on_device()
        yield from self._export(_param_tensor)

    def _local_views(self) -> Iterator[tuple[str, torch.Tensor]]:
        """One rank holds the whole model (tp = pp = 1): HF tensors that are views of a parameter (most: whole
        tensors, gate/up halves) are made once and reused while the parameters keep their storage; the rest
        (q/k/v, which de-interleave the fused QKV weight: copies) are converted at each call."""
        if self._view_params is None:
            self._view_params = list(self.gpt.parameters())  # (walking the module tree each time costs ms)
        ptrs = tuple(p.data_ptr() for p in self._view_params)
        if self._views_key != ptrs:
            offset = self._layer_offset(self.gpt)
            named = {mc.to_global_name(n, offset): p for n, p in self.gpt.named_parameters()}
            plan = []
            with torch.no_grad():
                for name, _, _ in self._export_plan:
                    param = named[name].detach()
                    pairs = mc.mcore_to_hf(self.spec, name, param)
                    base = param.untyped_storage().data_ptr()
                    if all(t.untyped_storage().data_ptr() == base for _, t in pairs):
                        plan.append((None, pairs))          # true views: valid as long as the storage is
                    else:
                        plan.append((name, named[name]))   # copies: convert again each time
            self._views, self._views_key = plan, ptrs
        with torch.no_grad():
            for name, item in self._views:
                if name is None:
                    yield from item
                else:
                    yield from mc.mcore_to_hf(self.spec, name, item.detach())

    def _export(self, tensor_of) -> Iterator[tuple[str, torch.Tensor]]:
        """``tensor_of(param)`` of every parameter (the parameter, or its main_grad in tests), gathered across
        tensor-parallel ranks and pipeline stages and converted to HF names and layouts, on global rank 0."""
        if self.data_parallel_rank != 0:
            return
        if self.tp_size == 1 and self.pp_size == 1 and getattr(tensor_of, "__name__", "") == "_param_tensor":
            yield from self._local_views()
            return
        offset = self._layer_offset(self.gpt)
        params = {mc.to_global_name(n, offset): p for n, p in self.gpt.named_parameters()}
        dtype = tensor_of(next(iter(params.values()))).dtype
        with torch.no_grad():
            for name, stage, hf in self._export_plan:
                if stage == self.pp_rank:
                    t = self._tp_gather(name, tensor_of(params[name]))
                    pairs = mc.mcore_to_hf(self.spec, name, t)
                    if stage == 0:
                        if self.rank == 0:
                            yield from pairs
                    elif self.tp_rank == 0:
                        for _, x in pairs:
                            dist.send(x.contiguous(), dst=0)
                elif self.rank == 0:
                    src = self.stage_ranks[stage]
                    for hf_name, shape in hf:
                        buf = torch.empty(shape, dtype=dtype, device=self._device)
                        dist.recv(buf, src=src)
                        yield hf_name, buf

    def drain_named_weights(self) -> int:
        """Take part in named_weights without keeping anything (ranks other than 0); returns tensors seen."""
        return sum(1 for _ in self.named_weights())

    # -- checkpoints ---------------------------------------------------------------------------------------
    def _barrier(self):
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()

    def _sharded_state(self, with_optim: bool, is_loading: bool) -> dict:
        model_sd = self.gpt.sharded_state_dict()
        state = {"model": model_sd}
        if with_optim:
            meta = {"distrib_optim_sharding_type": "dp_reshardable"}
            state["optimizer"] = self.optimizer.sharded_state_dict(model_sd, is_loading=is_loading, metadata=meta)
        return state

    def save(self, path: str, save_optim: bool = True) -> None:
        """Write ``path/dist`` (megatron dist_checkpointing: model + optimizer), ``rng_rank{r}.pt`` and
        ``meta.json``. Every rank must call it."""
        self._require_init()
        self._on_device()
        from megatron.core import dist_checkpointing
        out = Path(path)
        if self.rank == 0:
            (out / DIST_DIR).mkdir(parents=True, exist_ok=True)
        self._barrier()
        dist_checkpointing.save(self._sharded_state(save_optim, is_loading=False), str(out / DIST_DIR))
        torch.save(_rng_state(), out / f"rng_rank{self.rank}.pt")
        if self.rank == 0:
            meta = {"weight_version": self.weight_version, "world_size": self.world_size, "tp": self.tp_size,
                    "pp": self.pp_size, "optim": bool(save_optim), "hf_checkpoint": self.hf_path,
                    "optimizer_steps": self.optimizer_steps,
                    "backend": "megatron",
                    "distributed_optimizer": self.cfg.train.use_distributed_optimizer}
            (out / META_FILE).write_text(json.dumps(meta, indent=1))
        self._barrier()
        self.log.info("saved checkpoint", path=str(out), optim=save_optim)

    def load(self, path: str, load_optim: bool = True) -> None:
        """Restore what ``save`` wrote. Every rank must call it."""
        self._require_init()
        self._on_device()
        from megatron.core import dist_checkpointing
        src = Path(path)
        if not (src / DIST_DIR).is_dir():
            raise FileNotFoundError(f"{src}: no {DIST_DIR}/ (not a checkpoint written by MegatronBackend.save)")
        meta = read_json_object(src / META_FILE) if (src / META_FILE).exists() else {}
        if load_optim and not meta.get("optim", True):
            raise FileNotFoundError(f"{src}: saved without the optimizer")
        check_torch_dist(src / DIST_DIR)  # (megatron-core unpickles .metadata and its objects unrestricted)
        state = dist_checkpointing.load(self._sharded_state(load_optim, is_loading=True), str(src / DIST_DIR))
        with torch.no_grad():
            missing, unexpected = self.gpt.load_state_dict(state["model"], strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        unexpected = [k for k in unexpected if not k.endswith("_extra_state")]
        if missing or unexpected:
            raise ValueError(f"{src}: checkpoint does not match the model (missing {missing[:5]}, unexpected "
                             f"{unexpected[:5]})")
        with torch.no_grad():  # (fp32 + distributed optimizer: the main params are views of the model's)
            if load_optim:
                self.optimizer.load_state_dict(state["optimizer"])
                self._set_adam_steps(int(meta.get("optimizer_steps", 0)))
            else:
                self.optimizer.reload_model_params()
        rng = src / f"rng_rank{self.rank}.pt"
        if rng.exists():
            _set_rng_state(load_torch_file(rng))
        self.weight_version = int(meta.get("weight_version", self.weight_version))
        self._barrier()
        self.log.info("loaded checkpoint", path=str(src), optim=load_optim, weight_version=self.weight_version)

    def _set_adam_steps(self, n: int) -> None:
        """Set torch Adam's per-parameter step counter (bias correction) to ``n``. megatron-core's distributed
        optimizer restores it from the live state rather than the checkpoint when it falls back to torch's Adam
        (no Transformer Engine / Apex), so the count saved in meta.json is put back here."""
        self.optimizer_steps = n
        for opt in getattr(self.optimizer, "chained_optimizers", None) or [self.optimizer]:
            inner = getattr(opt, "optimizer", None)
            if not isinstance(inner, torch.optim.Optimizer):
                continue
            for st in inner.state.values():
                if torch.is_tensor(st.get("step")):
                    st["step"] = torch.tensor(float(n), dtype=st["step"].dtype, device=st["step"].device)

    def save_hf(self, path: str, info: dict | None = None) -> None:
        """A Hugging Face directory (`hf_export.export_hf`: safetensors in HF names and layouts, config, tokenizer
        and other files copied from --hf-checkpoint). Every rank must call it (named_weights is a collective);
        rank 0 writes."""
        self._require_init()
        from .hf_export import export_hf
        if self.rank == 0:
            export_hf(self.named_weights(), path, self.hf_path, {"backend": "megatron", "tp": self.tp_size,
                                                                 "pp": self.pp_size,
                                                                 "weight_version": self.weight_version,
                                                                 **(info or {})})
        else:
            self.drain_named_weights()
        self._barrier()
