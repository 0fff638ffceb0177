"""The torch training backend: a Hugging Face causal LM on CPU or GPU, DDP or FSDP2 across ranks.

    backend = TorchBackend(cfg, rank, world_size); backend.init()      # cfg: slime_actors.config.JobConfig
    metrics = rl_update(backend, cfg, batch, rollout_id)        # slime_actors.backends.rl_update
    for name, tensor in backend.named_weights(): ...             # HF names, full tensors
    backend.save(dir); backend.load(dir); backend.save_hf(dir)

* Model: ``AutoModelForCausalLM`` from --hf-checkpoint (a directory, or ``tiny:NAME``), fp32, on --device
  (``cuda`` means this rank's local GPU). Dropout is off: the models stay in eval mode, so a training forward
  computes exactly what the log-prob forward computes.
* --bf16: mixed precision, as Megatron's --bf16 and transformers' TrainingArguments(bf16=True): the weights that
  train (the actor, the critic, LoRA adapters) and AdamW's states stay fp32; every forward (training, log-probs,
  reference, values) runs under ``torch.autocast`` in bfloat16, so matmuls read bf16 copies and the backward
  writes fp32 gradients; log-probs, entropies and values are computed in fp32 from the bf16 logits / hidden
  states. Frozen weights (a LoRA base, its reference) are held in bf16. The engines get the weights in bf16
  (``named_weights``), and --save-hf writes bf16; checkpoints keep fp32.
* Parallel: when torch.distributed is initialised with more than one rank, --torch-parallel ddp wraps the actor
  (and critic) in DistributedDataParallel (gloo on CPU, NCCL on GPU) and fsdp applies FSDP2 ``fully_shard`` to
  each decoder layer and the whole model (works on CPU/gloo and GPU/NCCL). Gradients are averaged across ranks,
  so loss functions scale by the world size (rl_update does).
* Reference model (--use-kl-loss or --kl-coef > 0): --ref-load or the initial weights, frozen, a full replica on
  every rank (forward only, no collectives). With LoRA and no --ref-load it is the actor with its adapters switched
  off (peft's ``disable_adapter``): no second copy of the weights.
* LoRA (--lora-rank > 0): peft adapters on the frozen base (`backends.lora`); only they train and the optimizer
  holds only their state. ``named_weights`` are then the merged weights (base + scale x B @ A), ``adapter_weights``
  the adapters alone (PEFT's names), what the engines get (--lora-sync). Adapter dropout is active in the training
  forwards only.
* Critic (--advantage-estimator ppo): the base model (``AutoModel``) plus a linear value head, own AdamW with
  --critic-lr. The value of response token t is read at the position that predicts t (as slime).
* Log-probs: right-padded micro-batches (--micro-batch-size, or --use-dynamic-batch-size with
  --max-tokens-per-gpu), logits at --rollout-temperature by `slime_actors.algo.logprobs`.
* Checkpoints (``save``/``load``): full (unsharded) model state in HF names as safetensors, the optimizer's full
  state dict keyed by parameter names, per-rank RNG states (torch, CUDA, numpy, python) and the weight version,
  so a resumed run continues bit-identically and can change world size or ddp/fsdp. With LoRA: the adapters
  (PEFT's adapter_model.safetensors and adapter_config.json) and their optimizer state only; ``save_hf`` writes a
  PEFT adapter directory (and, with --lora-save-merged, the merged model next to it).
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..algo.logprobs import entropy_without_grad, head_log_probs, log_probs_and_entropy
from ..config import JobConfig
from ..gpus import training_device
from ..log import get_logger
from . import lora
from .batching import forward_micro_batches, pad_tokens, select, validate_batch
from ..safe_pickle import load_torch_file
from .training import LossFn, TrainingBackend
from ..json_files import JsonFileError, read_json_object

MODEL_FILE = "model.safetensors"
CRITIC_FILE = "critic.safetensors"
OPTIM_FILE = "optim.pt"
CRITIC_OPTIM_FILE = "critic_optim.pt"
META_FILE = "meta.json"

_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def strip_wrapper_prefixes(name: str) -> str:
    """HF name of a parameter of a wrapped model (drops DDP ``module.`` and similar wrapper prefixes)."""
    changed = True
    while changed:
        changed = False
        for p in _PREFIXES:
            if name.startswith(p):
                name, changed = name[len(p):], True
        for p in _PREFIXES[1:]:
            name2 = name.replace("." + p, ".")
            if name2 != name:
                name, changed = name2, True
    return name


class CriticModel(nn.Module):
    """Base transformer (``AutoModel``) + a linear value head: per-position scalar values ``[B, T]``."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.model = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        with torch.no_grad():
            nn.init.normal_(self.value_head.weight, std=1.0 / (hidden_size + 1) ** 0.5)
            nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=False)
        h = out.last_hidden_state
        with torch.autocast(h.device.type, enabled=False):   # (the value in fp32 under --bf16's autocast)
            return self.value_head(h.to(self.value_head.weight.dtype)).squeeze(-1).float()


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _rng_state() -> dict:
    np_state = np.random.get_state()
    py_state = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"name": np_state[0], "keys": torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "python": {"version": py_state[0], "state": list(py_state[1]), "gauss": py_state[2]},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class TorchBackend(TrainingBackend):
    """One rank of the torch training group (see the module docstring)."""

    def __init__(self, cfg: JobConfig, rank: int = 0, world_size: int = 1):
        if _distributed():
            if dist.get_rank() != rank or dist.get_world_size() != world_size:
                raise ValueError(f"TorchBackend(rank={rank}, world_size={world_size}) but torch.distributed has "
                                 f"rank {dist.get_rank()} of {dist.get_world_size()}")
        super().__init__(cfg, rank, world_size)
        self.log = get_logger(actor=f"trainer/{rank}", component="torch_backend")
        self.parallel = "none"
        self.model: nn.Module | None = None        # the actor, possibly wrapped (DDP) / sharded (FSDP2)
        self.ref_model: nn.Module | None = None
        self.critic: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.critic_optimizer: torch.optim.Optimizer | None = None
        self.pad_id = 0
        self.lora = cfg.lora.lora_rank > 0        # the actor is a peft model with one adapter ("default")
        # --bf16: mixed precision (the module docstring): weights that train stay fp32, a frozen LoRA base is bf16
        self.mixed = cfg.train.bf16
        self.dtype = torch.bfloat16 if self.mixed and self.lora else torch.float32
        self.lora_targets: list[str] = []
        self._lora_dropouts: list[nn.Module] = []
        self.checkpointed_layers = 0              # --gradient-checkpointing: the decoder layers recomputed
        self.head_chunk_bytes = cfg.train.head_chunk_mib << 20  # one chunk's logits in `_head_log_probs`; 0: off

    # -- set-up ------------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self._device

    def _checkpoint_dir(self) -> str:
        spec = self.cfg.model.hf_checkpoint
        if spec is None:
            raise ValueError("--hf-checkpoint is required")
        from ..models.resolve import model_cache, resolve_checkpoint
        return resolve_checkpoint(spec, model_cache(self.cfg.run.run_dir))

    def _load_causal_lm(self, path: str) -> nn.Module:
        from transformers import AutoModelForCausalLM
        p = Path(path)
        if not (p / "config.json").exists() and (p / MODEL_FILE).exists():
            # a directory written by `save`: the architecture comes from --hf-checkpoint
            model = AutoModelForCausalLM.from_pretrained(self.hf_path, dtype=self.dtype)
            from safetensors.torch import load_file
            sd = load_file(str(p / MODEL_FILE))
            missing, unexpected = model.load_state_dict(sd, strict=False)
            self._check_missing(model, missing, unexpected, str(p))
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype)
        return model.to(self.device).eval()

    def init(self) -> None:
        cfg, algorithm_cfg, train_cfg = self.cfg, self.cfg.algorithm, self.cfg.train
        self._device = training_device(self.cfg.run.device, self.rank)
        self.hf_path = self._checkpoint_dir()
        actor = self._load_causal_lm(self.hf_path)
        hf_config = actor.config
        pad = getattr(hf_config, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else 0
        if self.lora:
            actor = self._with_lora(actor)
        if train_cfg.gradient_checkpointing:
            self._checkpoint_layers(actor)
        self._raw_model = actor
        self.tied_names = self._tied_names(actor)

        if algorithm_cfg.needs_reference and not (self.lora and not cfg.model.ref_load):
            ref = self._load_causal_lm(cfg.model.ref_load or self.hf_path)
            ref.requires_grad_(False)
            self.ref_model = ref

        critic = None
        if algorithm_cfg.advantage_estimator == "ppo":
            from transformers import AutoModel
            backbone = AutoModel.from_pretrained(self.hf_path, dtype=torch.float32)   # (it trains: fp32)
            with torch.random.fork_rng(devices=[]):   # the same value head on every rank, global RNG untouched
                torch.manual_seed(cfg.run.seed)
                critic = CriticModel(backbone, hf_config.hidden_size)
            critic = critic.to(device=self.device, dtype=torch.float32).eval()
            self._raw_critic = critic

        want = train_cfg.torch_parallel
        if _distributed() and self.world_size > 1:
            self.parallel = want
        if self.parallel == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP
            ids = [self.device.index] if self.device.type == "cuda" else None
            actor = DDP(actor, device_ids=ids)
            if critic is not None:
                critic = DDP(critic, device_ids=ids)
        elif self.parallel == "fsdp":
            actor = self._fully_shard(actor)
            if critic is not None:
                critic = self._fully_shard(critic)
        self.model, self.critic = actor, critic

        betas = (train_cfg.adam_beta1, train_cfg.adam_beta2)
        self.optimizer = torch.optim.AdamW([p for p in actor.parameters() if p.requires_grad], lr=train_cfg.lr,
                                           betas=betas, weight_decay=train_cfg.weight_decay, eps=1e-8)
        if critic is not None:
            self.critic_optimizer = torch.optim.AdamW([p for p in critic.parameters() if p.requires_grad],
                                                      lr=train_cfg.critic_lr, betas=betas,
                                                      weight_decay=train_cfg.weight_decay, eps=1e-8)
        self.log.info("torch backend ready", model=self.hf_path, device=str(self.device), dtype=str(self.dtype),
                      precision="bf16 mixed (fp32 weights, bf16 autocast)" if self.mixed else "fp32",
                      parallel=self.parallel, world_size=self.world_size, ref=self.ref_model is not None,
                      critic=critic is not None, lora=self.lora_summary() if self.lora else None)

    def _with_lora(self, model: nn.Module) -> nn.Module:
        """The actor as a peft model: adapters of --lora-rank on the --lora-target-modules (resolved against this
        model), the base frozen, in eval mode (dropout only where train_micro_batches switches it on)."""
        from peft import get_peft_model
        lora_cfg = self.cfg.lora
        try:
            self.lora_targets = lora.resolve_targets(lora.linear_module_names(model),
                                                     list(lora_cfg.lora_target_modules or [lora.ALL_LINEAR]),
                                                     lora_cfg.lora_exclude_modules)
        except lora.LoraError as exc:
            raise ValueError(str(exc)) from None
        with torch.random.fork_rng(devices=[]):   # the same adapter init on every rank, global RNG untouched
            torch.manual_seed(self.cfg.run.seed)
            peft_model = get_peft_model(model, lora.lora_config(lora_cfg, self.lora_targets))
        peft_model.eval()
        self._lora_dropouts = [m for n, m in peft_model.named_modules()
                               if ".lora_dropout." in n and isinstance(m, nn.Dropout)]
        return peft_model

    def _checkpoint_layers(self, model: nn.Module) -> None:
        """--gradient-checkpointing: each decoder layer keeps only its input for the backward and runs its forward
        again there (Hugging Face's checkpointing, non-reentrant). Hugging Face checkpoints a layer only while that
        module is in training mode; the model stays in eval mode (no dropout), so the layers alone are flagged as
        training -- their submodules are not, and no-grad forwards (log-probs, engines) run them as they are."""
        from transformers.modeling_layers import GradientCheckpointingLayer
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        if not getattr(base, "supports_gradient_checkpointing", False):
            raise ValueError(f"--gradient-checkpointing: {type(base).__name__} does not support gradient "
                             "checkpointing")
        enable = getattr(base, "activation_checkpointing_enable", None)   # (transformers 5's name; the old one warns)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        layers = [m for m in base.modules() if isinstance(m, GradientCheckpointingLayer)]
        if not layers:
            raise ValueError(f"--gradient-checkpointing: {type(base).__name__} has no checkpointable layers")
        for m in layers:
            m.training = True   # (not m.train(): that would switch its dropout modules on too)
        self.checkpointed_layers = len(layers)

    def lora_summary(self) -> dict:
        """Trainable and total parameters, and what the adapters are (for logs and bench/lora.py)."""
        raw = self._raw_model
        trainable = sum(p.numel() for p in raw.parameters() if p.requires_grad)
        total = sum(p.numel() for p in raw.parameters())
        lora_cfg = self.cfg.lora
        return {"rank": lora_cfg.lora_rank, "alpha": lora_cfg.lora_alpha, "targets": self.lora_targets,
                "trainable_params": trainable, "total_params": total}

    def _fully_shard(self, module: nn.Module) -> nn.Module:
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError as exc:  # pragma: no cover - old torch
            raise RuntimeError("--torch-parallel fsdp needs torch.distributed.fsdp.fully_shard (torch >= 2.6)") from exc
        layers = None
        for sub in module.modules():
            if sub is not module and hasattr(sub, "layers") and isinstance(sub.layers, nn.ModuleList):
                layers = sub.layers
                break
        for layer in layers or []:
            fully_shard(layer)
        fully_shard(module)
        return module

    @staticmethod
    def _tied_names(model: nn.Module) -> set[str]:
        """state_dict keys that alias another parameter (e.g. a tied lm_head)."""
        keep = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
        return {k for k in model.state_dict() if k not in keep}

    def _check_missing(self, model, missing, unexpected, where: str) -> None:
        tied = self._tied_names(model)
        missing = [m for m in missing if m not in tied]
        if missing or unexpected:
            raise ValueError(f"{where}: weights do not match the model (missing {missing[:5]}, unexpected "
                             f"{list(unexpected)[:5]})")

    def _require_init(self):
        if self.model is None:
            raise RuntimeError("TorchBackend.init() has not been called")

    # -- helpers -----------------------------------------------------------------------------------------
    def _all_max(self, n: int) -> int:
        if not _distributed():
            return n
        t = torch.tensor([n], dtype=torch.long, device=self._collective_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def _collective_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")

    def _micro_batches(self, batch: dict, fsdp_module: bool) -> list[list[int]]:
        """The micro-batches of a no-grad pass (batching.forward_micro_batches)."""
        lengths = [len(t) for t in batch["tokens"]]
        fits = self._forward_tokens_that_fit()
        mbs = forward_micro_batches(self.cfg.train, lengths, fits_tokens=fits)
        if fsdp_module and self.parallel == "fsdp":
            # every rank must run the same number of forwards (each one all-gathers the shards)
            mbs = forward_micro_batches(self.cfg.train, lengths, min_count=self._all_max(len(mbs)),
                                        fits_tokens=fits)
        return mbs

    def _forward_tokens_that_fit(self) -> int | None:
        """On a GPU, the tokens a no-grad forward of half its free memory holds: per token the logits three times
        (the model's, the fp32 copy, log-softmax) plus the hidden states' temporaries. None on CPU (the training
        micro-batches: measured no faster packed larger, docs/performance.md)."""
        if self.device.type != "cuda":
            return None
        free, _ = torch.cuda.mem_get_info(self.device)
        hf = self._raw_model.config
        vocab = int(getattr(hf, "vocab_size", 0) or 0)
        hidden = int(getattr(hf, "hidden_size", 0) or 0)
        per_token = 3 * 4 * vocab + 16 * 4 * hidden
        return max(1, int(0.5 * free / max(per_token, 1)))

    def _inputs(self, tokens: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not tokens:
            tokens = [[self.pad_id]]
        return pad_tokens(tokens, pad_id=self.pad_id, device=self.device)

    @staticmethod
    def _response_slices(mb: dict) -> list[tuple[int, int]]:
        """(start, end) of each sample's response-predicting logits: positions P-1 .. P+R-2."""
        return [(int(p) - 1, int(p) + int(r) - 1) for p, r in zip(mb["prompt_lengths"], mb["response_lengths"])]

    def _targets(self, mb: dict, i: int) -> torch.Tensor:
        p, r = int(mb["prompt_lengths"][i]), int(mb["response_lengths"][i])
        return torch.as_tensor(list(mb["tokens"][i][p:p + r]), dtype=torch.long, device=self.device)

    def _temperature(self) -> float:
        return self.cfg.rollout.rollout_temperature or 1.0   # greedy (0) rollouts: log-probs at 1

    def _autocast(self):
        """--bf16: a forward's ops in bfloat16 where autocast runs them so (matmuls; softmax and norms stay fp32)."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16) if self.mixed else contextlib.nullcontext()

    def _logits(self, model: nn.Module, ids, mask, pos, keep: int = 0) -> torch.Tensor:
        """The model's logits; with ``keep`` > 0 only those of the last ``keep`` positions (the responses': the
        language-model head, a vocabulary-sized matmul per position, skips the prompts). In bf16 under --bf16
        (the log-probs are taken in fp32 from them: algo.logprobs)."""
        with self._autocast():
            if keep > 0 and self._keeps_logits(model):
                return model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                             logits_to_keep=keep).logits
            return model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits

    @staticmethod
    def _keeps_logits(model: nn.Module) -> bool:
        import inspect
        raw = getattr(model, "module", model)
        if hasattr(raw, "get_base_model"):   # a peft model passes the keyword on to the model it wraps
            raw = raw.get_base_model()
        try:
            return "logits_to_keep" in inspect.signature(raw.forward).parameters
        except (TypeError, ValueError):
            return False

    @staticmethod
    def _keep(mb: dict, width: int) -> int:
        """Positions from the first response-predicting one (the shortest prompt's last token) to the end."""
        if not mb["tokens"]:
            return 0
        first = min(int(p) for p in mb["prompt_lengths"]) - 1
        return max(1, width - first)

    # -- forward passes (no grad) ------------------------------------------------------------------------
    def compute_log_probs(self, batch: dict, model: str = "actor", with_entropy: bool = False
                          ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        self._require_init()
        validate_batch(batch)
        if model == "actor":
            # DDP: run the plain module (no gradient hooks); FSDP2: the sharded module (it gathers its shards)
            net = self._raw_model if self.parallel != "fsdp" else self.model
        elif model == "ref":
            algorithm_cfg = self.cfg.algorithm
            if self.ref_model is None and not (self.lora and algorithm_cfg.needs_reference):
                raise ValueError("no reference model (enable --use-kl-loss or --kl-coef > 0)")
            # LoRA without --ref-load: the reference is the actor with its adapters switched off
            net = self.ref_model if self.ref_model is not None else (
                self._raw_model if self.parallel != "fsdp" else self.model)
        else:
            raise ValueError(f"model must be 'actor' or 'ref', got {model!r}")
        adapters_off = model == "ref" and self.ref_model is None
        n = len(batch["tokens"])
        out_lp: list[torch.Tensor | None] = [None] * n
        out_ent: list[torch.Tensor | None] = [None] * n
        temp = self._temperature()
        mbs = self._micro_batches(batch, fsdp_module=(model == "actor" or adapters_off))
        # the training forward's own computation where it takes the head a chunk at a time: equal weights give
        # bit-equal log-probs here and there (a step's KL to an unchanged reference exactly 0, as with the logits)
        head = self._chunked_head(net)
        with torch.no_grad(), (self._raw_model.disable_adapter() if adapters_off else contextlib.nullcontext()):
            for idx in mbs:
                mb = select(batch, idx)
                ids, mask, pos = self._inputs(mb["tokens"])
                if head is not None and mb["tokens"]:
                    lps, ents = self._head_log_probs(mb, head, ids, mask, pos, temp, False, with_entropy)
                    for j, lp in enumerate(lps):
                        out_lp[idx[j]] = lp.cpu()
                        if ents is not None:
                            out_ent[idx[j]] = ents[j].cpu()
                    continue
                keep = self._keep(mb, ids.shape[1])
                logits = self._logits(net, ids, mask, pos, keep)
                off = ids.shape[1] - logits.shape[1]
                for j, (s, e) in enumerate(self._response_slices(mb)):
                    lp, ent = log_probs_and_entropy(logits[j, s - off:e - off], self._targets(mb, j), temp,
                                                    with_entropy)
                    out_lp[idx[j]] = lp.float().cpu()
                    if with_entropy:
                        out_ent[idx[j]] = ent.float().cpu()
        return out_lp, (out_ent if with_entropy else None)

    def compute_values(self, batch: dict) -> list[torch.Tensor]:
        self._require_init()
        if self.critic is None:
            return super().compute_values(batch)
        validate_batch(batch)
        net = self._raw_critic if self.parallel != "fsdp" else self.critic
        out: list[torch.Tensor | None] = [None] * len(batch["tokens"])
        with torch.no_grad():
            for idx in self._micro_batches(batch, fsdp_module=True):
                mb = select(batch, idx)
                ids, mask, pos = self._inputs(mb["tokens"])
                with self._autocast():
                    values = net(ids, mask, pos)
                for j, (s, e) in enumerate(self._response_slices(mb)):
                    out[idx[j]] = values[j, s:e].float().cpu()
        return out

    # -- training ----------------------------------------------------------------------------------------
    def _sync_context(self, module: nn.Module, sync: bool):
        if self.parallel == "ddp":
            return contextlib.nullcontext() if sync else module.no_sync()
        if self.parallel == "fsdp" and hasattr(module, "set_requires_gradient_sync"):
            module.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()

    def train_micro_batches(self, micro_batches: list[dict], loss_fn: LossFn, train_critic: bool = False
                            ) -> dict[str, float]:
        """Forward + backward per micro-batch, gradients accumulating (synchronised across ranks on the last).

        For the actor, ``loss_fn(mb, log_probs, entropies, None)`` gets per-sample response log-probs (with grad)
        and entropies (with grad only when --entropy-coef != 0). For the critic (``train_critic``) it gets
        ``loss_fn(mb, [], [], values)``. A micro-batch without samples runs a dummy forward with zero loss, so
        ranks with fewer micro-batches still join every collective."""
        self._require_init()
        if train_critic and self.critic is None:
            raise ValueError("train_critic=True but there is no critic (--advantage-estimator ppo)")
        module = self.critic if train_critic else self.model
        if not micro_batches:
            micro_batches = [{"tokens": [], "prompt_lengths": [], "response_lengths": [], "loss_masks": []}]
        for mb in micro_batches:
            validate_batch(mb)
        entropy_grad = self.cfg.algorithm.entropy_coef != 0.0
        temp = self._temperature()
        totals: dict[str, float] = {}
        last = len(micro_batches) - 1
        with self._lora_dropout_on(not train_critic):
            self._train_loop(micro_batches, loss_fn, train_critic, module, entropy_grad, temp, totals, last)
        return totals

    @contextlib.contextmanager
    def _lora_dropout_on(self, on: bool):
        """--lora-dropout acts in training forwards only: its modules train for the block (the models stay in eval
        mode otherwise, so log-prob forwards and engines compute without it)."""
        mods = self._lora_dropouts if on and self.cfg.lora.lora_dropout > 0 else []
        for m in mods:
            m.train()
        try:
            yield
        finally:
            for m in mods:
                m.eval()

    def _train_loop(self, micro_batches, loss_fn, train_critic, module, entropy_grad, temp, totals, last) -> None:
        for k, mb in enumerate(micro_batches):
            ctx = self._sync_context(module, k == last)
            with ctx:
                ids, mask, pos = self._inputs(mb["tokens"])
                if train_critic:
                    with self._autocast():
                        values_full = module(ids, mask, pos)
                    if not mb["tokens"]:
                        (values_full.sum() * 0.0).backward()
                        continue
                    values = [values_full[j, s:e] for j, (s, e) in enumerate(self._response_slices(mb))]
                    loss, metrics = loss_fn(mb, [], [], values)
                elif mb["tokens"] and (head := self._chunked_head(module)) is not None:
                    lps, ents = self._head_log_probs(mb, head, ids, mask, pos, temp, entropy_grad)
                    loss, metrics = loss_fn(mb, lps, ents, None)
                else:
                    logits = self._logits(module, ids, mask, pos, self._keep(mb, ids.shape[1]))
                    if not mb["tokens"]:
                        (logits.sum() * 0.0).backward()
                        continue
                    lps, ents = self._response_log_probs(mb, ids.shape[1], logits, temp, entropy_grad)
                    # the backward needs the log-softmax outputs, not the logits: their vocabulary-wide tensor (210
                    # MiB for 16 samples of SmolLM2) goes now, not when the next micro-batch's forward replaces it
                    del logits
                    loss, metrics = loss_fn(mb, lps, ents, None)
                if not torch.is_tensor(loss) or not loss.requires_grad:
                    raise ValueError("loss_fn must return a tensor that requires grad")
                loss.backward()
            for key, v in metrics.items():
                totals[key] = totals.get(key, 0.0) + float(v)

    # decoder-only models whose causal-LM forward is `lm_head(model(...).last_hidden_state)` and nothing more (no
    # logit scaling or soft-capping): what `_chunked_head` may split into the body and the head
    CHUNKED_HEAD_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen3"})

    def _chunked_head(self, module: nn.Module) -> tuple[nn.Module, torch.Tensor] | None:
        """(the model's body, its head's weight) where a forward can take the response tokens' log-probs a chunk
        of rows at a time (`algo.logprobs.head_log_probs`) instead of from the micro-batch's whole logits: the
        actor's training forward and its log-prob passes, and the reference model's, for a model of
        CHUNKED_HEAD_MODELS whose head is a plain linear layer without bias (LoRA on the body is fine), in this one
        process (DDP and FSDP2 wrap the forward: they keep the logits path). None where any of that is not so, or
        --head-chunk-mib is 0."""
        if self.head_chunk_bytes <= 0 or self.parallel != "none" or \
                (module is not self._raw_model and module is not self.ref_model):
            return None
        raw = module.get_base_model() if hasattr(module, "get_base_model") else module
        config = getattr(raw, "config", None)
        if getattr(config, "model_type", None) not in self.CHUNKED_HEAD_MODELS:
            return None
        if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
            return None
        head = raw.get_output_embeddings() if hasattr(raw, "get_output_embeddings") else None
        body = getattr(raw, "model", None)
        if type(head) is not nn.Linear or head.bias is not None or not isinstance(body, nn.Module):
            return None
        return body, head.weight

    def _head_log_probs(self, mb: dict, head: tuple[nn.Module, torch.Tensor], ids, mask, pos, temp: float,
                        entropy_grad: bool, with_entropy: bool = True
                        ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """`_response_log_probs`'s numbers without the micro-batch's logits: the body's last hidden states of the
        response-predicting positions, gathered, then the head a chunk of rows at a time (`head_log_probs`: one
        chunk's logits at once, recomputed in the backward). Under --bf16 the head's matmul is bf16, as autocast
        runs the model's own head. The entropies carry a gradient only with an entropy term (`entropy_grad`); a
        pass that needs none (`with_entropy` False: a no-grad log-prob pass) gets None and skips computing them."""
        body, weight = head
        hidden = self._hidden(body, ids, mask, pos)
        rows, cols, targets, lengths = self._response_rows(mb, 0, hidden.device)
        lp, ent = head_log_probs(hidden[rows, cols], weight, targets, temp,
                                 matmul_dtype=torch.bfloat16 if self.mixed else None,
                                 chunk_bytes=self.head_chunk_bytes, with_entropy=with_entropy)
        if ent is None:
            return list(lp.split(lengths)), None
        if not entropy_grad:
            ent = ent.detach()
        return list(lp.split(lengths)), list(ent.split(lengths))

    def _hidden(self, body: nn.Module, ids, mask, pos) -> torch.Tensor:
        """The body's last hidden states (after its final norm): a training forward without the head."""
        with self._autocast():
            return body(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).last_hidden_state

    def _response_rows(self, mb: dict, off: int, dev: torch.device
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
        """(sample index, position, target token) of every response-predicting row of the micro-batch, samples one
        after the other, positions `off` to the left (the logits of the last positions only: their first column is
        position `off`), and each sample's count of rows: the index operation that gathers them in one."""
        slices = self._response_slices(mb)
        lengths = [e - s for s, e in slices]
        rows = torch.cat([torch.full((n,), j, dtype=torch.long) for j, n in enumerate(lengths)]).to(dev)
        cols = torch.cat([torch.arange(s - off, e - off, dtype=torch.long) for s, e in slices]).to(dev)
        targets = torch.cat([self._targets(mb, j) for j in range(len(slices))])
        return rows, cols, targets, lengths

    def _response_log_probs(self, mb: dict, width: int, logits: torch.Tensor, temp: float, entropy_grad: bool
                            ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-sample log-probs (with grad) and entropies of a training micro-batch's response tokens. The response
        rows of every sample are gathered from the logits in one index operation, so the backward writes the
        logits' gradient into one zero tensor of their shape (a slice per sample made one per sample, 16 of 210 MiB
        for a micro-batch of SmolLM2); the log-softmax is row by row, the numbers those of a slice per sample."""
        rows, cols, targets, lengths = self._response_rows(mb, width - logits.shape[1], logits.device)
        flat = logits[rows, cols]
        lp, ent = log_probs_and_entropy(flat, targets, temp, with_entropy=entropy_grad)
        if not entropy_grad:   # a metric: in chunks of rows (its temporaries are the size of `flat`, three times)
            ent = entropy_without_grad(flat, temp)
        return list(lp.split(lengths)), list(ent.split(lengths))

    def optimizer_step(self, critic: bool = False) -> float:
        self._require_init()
        module, opt = (self.critic, self.critic_optimizer) if critic else (self.model, self.optimizer)
        if module is None or opt is None:
            raise ValueError("optimizer_step(critic=True) but there is no critic")
        params = [p for p in module.parameters() if p.requires_grad]
        clip = self.cfg.train.clip_grad
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        norm = float(norm)
        if np.isfinite(norm):
            opt.step()
        else:
            self.log.warning("non-finite gradient norm: skipping the optimizer step", grad_norm=norm,
                             critic=critic)
        opt.zero_grad(set_to_none=True)
        return norm

    # -- weights -----------------------------------------------------------------------------------------
    def _full_state_dict(self, module: nn.Module, raw: nn.Module) -> dict[str, torch.Tensor]:
        """Full tensors in HF names, tied aliases dropped. Collective under FSDP (every rank must call)."""
        if self.parallel == "fsdp":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
            sd = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
        else:
            sd = raw.state_dict()
        tied = self._tied_names(raw)
        return {strip_wrapper_prefixes(k): v.detach() for k, v in sd.items() if strip_wrapper_prefixes(k) not in tied}

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights in HF names; with LoRA the base with the adapters merged in (collective under FSDP). Under
        --bf16 in bfloat16: what the engines compute with (half the bytes of the fp32 master weights)."""
        self._require_init()
        sd = self._merged_state() if self.lora else self._full_state_dict(self.model, self._raw_model)
        for name, t in sd.items():
            yield name, self._engine_dtype(t)

    def _engine_dtype(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.bfloat16) if self.mixed and t.is_floating_point() else t

    # -- LoRA adapters -----------------------------------------------------------------------------------------
    def _merged_state(self) -> dict[str, torch.Tensor]:
        if self.parallel == "fsdp":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
            sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        else:
            sd = self._raw_model.state_dict()
        sd = {strip_wrapper_prefixes(k): v.detach() for k, v in sd.items()}
        tied = {lora._hf_name(t) for t in self.tied_names}
        return {k: v for k, v in lora.merged_weights(self._raw_model, sd) if k not in tied}

    def adapter_weights(self) -> dict[str, torch.Tensor]:
        """The adapters' tensors in PEFT's names (`base_model.model.<module>.lora_A.weight`), on the CPU: what
        --lora-sync adapter sends and checkpoints keep. A collective under FSDP (every rank calls it; the frozen
        base is not gathered)."""
        self._require_init()
        if not self.lora:
            raise ValueError("adapter_weights: this run trains no LoRA adapters (--lora-rank 0)")
        if self.parallel == "fsdp":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
            sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True,
                                                                           ignore_frozen_params=True))
        else:
            sd = self._raw_model.state_dict()
        sd = {strip_wrapper_prefixes(k): v for k, v in sd.items()}
        return {k: v.detach().cpu() for k, v in lora.to_peft_names(sd).items()}

    def adapter_config(self) -> dict:
        """The adapters' adapter_config.json (PEFT's LoraConfig), naming --hf-checkpoint as the base."""
        return lora.adapter_config(self._raw_model, self.hf_path)

    def _load_adapters(self, tensors: dict[str, torch.Tensor], where: str) -> None:
        """Set the adapters from PEFT-named tensors (every one of the model's, nothing else)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        try:
            sd = lora.from_peft_names(tensors)
        except lora.LoraError as exc:
            raise ValueError(f"{where}: {exc}") from None
        want = {strip_wrapper_prefixes(k) for k in self._raw_model.state_dict()
                if ".lora_A." in k or ".lora_B." in k}
        if set(sd) != want:
            raise ValueError(f"{where}: the adapters do not match this model's (missing {sorted(want - set(sd))[:4]}, "
                             f"unexpected {sorted(set(sd) - want)[:4]})")
        target = self.model if self.parallel == "fsdp" else self._raw_model
        set_model_state_dict(target, sd, options=StateDictOptions(full_state_dict=True, strict=False))

    # -- checkpoints -------------------------------------------------------------------------------------
    def _barrier(self):
        if _distributed():
            dist.barrier()

    def save(self, path: str, save_optim: bool = True) -> None:
        """Write ``path/model.safetensors`` (+ critic), ``optim.pt`` (full state keyed by parameter names),
        ``rng_rank{r}.pt`` per rank and ``meta.json``. All ranks must call it."""
        self._require_init()
        from safetensors.torch import save_file
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
        out = Path(path)
        if self.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
        self._barrier()
        opts = StateDictOptions(full_state_dict=True)
        parts = [(self.model, self._raw_model, self.optimizer, MODEL_FILE, OPTIM_FILE)]
        if self.critic is not None:
            parts.append((self.critic, self._raw_critic, self.critic_optimizer, CRITIC_FILE, CRITIC_OPTIM_FILE))
        for module, raw, opt, mfile, ofile in parts:
            adapters_only = self.lora and raw is self._raw_model   # the actor's adapters: the base is --hf-checkpoint
            sd = self.adapter_weights() if adapters_only else self._full_state_dict(module, raw)
            osd = get_optimizer_state_dict(module, opt, options=opts) if save_optim else None
            if self.rank == 0:
                if adapters_only:
                    lora.write_adapter_dir(out / lora.LORA_CKPT_DIR, sd, self.adapter_config())
                else:
                    save_file({k: v.cpu().contiguous() for k, v in sd.items()}, str(out / mfile),
                              metadata={"format": "pt"})
                if osd is not None:
                    torch.save(_to_cpu(osd), out / ofile)
        torch.save(_rng_state(), out / f"rng_rank{self.rank}.pt")
        if self.rank == 0:
            meta = {"weight_version": self.weight_version, "world_size": self.world_size, "parallel": self.parallel,
                    "critic": self.critic is not None, "optim": bool(save_optim), "hf_checkpoint": self.hf_path,
                    "lora": self.lora_summary() if self.lora else None}
            (out / META_FILE).write_text(json.dumps(meta, indent=1))
        self._barrier()
        self.log.info("saved checkpoint", path=str(out), optim=save_optim)

    def load(self, path: str, load_optim: bool = True) -> None:
        """Restore what ``save`` wrote (any world size / parallel mode). All ranks must call it."""
        self._require_init()
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)
        src = Path(path)
        adapters = src / lora.LORA_CKPT_DIR
        if self.lora and not adapters.is_dir():
            raise FileNotFoundError(f"{src}: no LoRA adapters ({lora.LORA_CKPT_DIR}/) -- written without --lora-rank; "
                                    "a full fine-tuning checkpoint cannot be resumed as LoRA")
        if not self.lora and not (src / MODEL_FILE).exists():
            raise FileNotFoundError(f"{src}: no {MODEL_FILE} (not a checkpoint written by TorchBackend.save"
                                    + ("; it holds LoRA adapters: resume with the same --lora-* flags)"
                                       if adapters.is_dir() else ")"))
        meta = read_json_object(src / META_FILE) if (src / META_FILE).exists() else {}
        if self.lora:
            self._check_adapter_config(adapters)
        parts = [(self.model, self._raw_model, self.optimizer, MODEL_FILE, OPTIM_FILE)]
        if self.critic is not None:
            if not (src / CRITIC_FILE).exists():
                raise FileNotFoundError(f"{src}: no {CRITIC_FILE} but this run has a critic (ppo)")
            parts.append((self.critic, self._raw_critic, self.critic_optimizer, CRITIC_FILE, CRITIC_OPTIM_FILE))
        for module, raw, opt, mfile, ofile in parts:
            if self.lora and raw is self._raw_model:
                self._load_adapters(load_file(str(adapters / lora.ADAPTER_FILE)), str(adapters))
            else:
                sd = load_file(str(src / mfile))
                target = module if self.parallel == "fsdp" else raw
                res = set_model_state_dict(target, sd, options=StateDictOptions(full_state_dict=True, strict=False))
                self._check_missing(raw, getattr(res, "missing_keys", []), getattr(res, "unexpected_keys", []),
                                    str(src / mfile))
            if load_optim:
                if not (src / ofile).exists():
                    raise FileNotFoundError(f"{src}: no {ofile} (saved without the optimizer?)")
                osd = load_torch_file(src / ofile)
                set_optimizer_state_dict(module, opt, osd, options=StateDictOptions(full_state_dict=True))
        rng = src / f"rng_rank{self.rank}.pt"
        if not rng.exists():
            rng = src / "rng_rank0.pt"
        if rng.exists():
            _set_rng_state(load_torch_file(rng))
        self.weight_version = int(meta.get("weight_version", self.weight_version))
        self._barrier()
        self.log.info("loaded checkpoint", path=str(src), optim=load_optim, weight_version=self.weight_version)

    def _check_adapter_config(self, adapters: Path) -> None:
        """A checkpoint's adapters were made with this run's --lora-* flags (rank, alpha, targets)."""
        try:
            saved = read_json_object(adapters / lora.ADAPTER_CONFIG)
        except JsonFileError as exc:
            raise ValueError(f"{adapters}: no readable {lora.ADAPTER_CONFIG}: {exc}") from None
        now = self.adapter_config()
        diff = [f"{k} {saved.get(k)!r} (this run: {now.get(k)!r})" for k in ("r", "lora_alpha", "target_modules")
                if (sorted(saved.get(k) or []) if k == "target_modules" else saved.get(k))
                != (sorted(now.get(k) or []) if k == "target_modules" else now.get(k))]
        if diff:
            raise ValueError(f"{adapters}: the checkpoint's adapters were made with other LoRA settings: "
                             f"{'; '.join(diff)}; resume with the flags it was written with")

    def save_hf(self, path: str, info: dict | None = None) -> None:
        """A Hugging Face directory (`hf_export.export_hf`): model safetensors in HF names, and config, generation
        config and tokenizer files copied from --hf-checkpoint. With LoRA: a PEFT adapter directory
        (`hf_export.export_adapter`), and the merged model in its `merged/` with --lora-save-merged. Every rank must
        call it (FSDP gathers); rank 0 writes."""
        self._require_init()
        from .hf_export import export_adapter, export_hf
        info = {"backend": "torch", "weight_version": self.weight_version, **(info or {})}
        if self.lora:
            tensors = self.adapter_weights()
            merged = self._merged_state() if self.cfg.lora.lora_save_merged else None
            if self.rank == 0:
                merged_out = None if merged is None else ((k, self._engine_dtype(v)) for k, v in merged.items())
                export_adapter(tensors, self.adapter_config(), path, self.hf_path, info, merged=merged_out)
            self._barrier()
            return
        sd = self._full_state_dict(self.model, self._raw_model)
        if self.rank == 0:   # (--bf16: in bfloat16, as the engines get them)
            export_hf(((k, self._engine_dtype(v)) for k, v in sd.items()), path, self.hf_path, info)
        self._barrier()


def _to_cpu(obj):
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj
