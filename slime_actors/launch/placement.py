"""Where a job's trainer ranks and engines go on this machine's GPUs, checked before any process starts.

    plan = plan_gpus(cfg, count_gpus(), LaunchFlags.parse(cfg.engine.sglang_args))   # GpuPlan, or ConfigError
    print("\\n".join(plan.lines()))

slime's placement, which `slime-actors train` uses (every role on this host): trainer rank r on GPU r; engine i on
GPUs from `--actor-num-gpus-per-node` + i x `--rollout-num-gpus-per-engine` on, or with `--colocate` from
i x `--rollout-num-gpus-per-engine` on (sharing the trainer's); the engine gets it as `--base-gpu-id`
(backends/sglang_launch.py). The plan must fit the GPUs counted (slime_actors.gpus): else ConfigError, e.g.
"1 GPU visible (...): the trainer needs 1 and 1 engine needs 1 more -- pass --colocate ...". A topology that gives
roles GPUs (`gpus`, `gpus_per_actor`, `colocate`) is checked index by index instead.

One GPU (`colocates_by_itself`): a job of one trainer rank and one one-GPU engine on a machine with one GPU, with no
GPU placement of its own (`--num-gpus-per-node`, `--sglang-base-gpu-id`, a topology's GPUs), runs colocated -- as
if `--colocate` were given, and says so -- rather than failing: that is the only way it fits, and what a user of
that machine wants. Anything larger is refused with the numbers.

Colocation (`--colocate`, or a topology role `colocate = "trainer"`) means what it means in slime: weights go by
CUDA IPC (`--update-weight-transport colocated`, the default then; NCCL between two processes of one GPU is refused
by the config), and the engine gets a memory fraction that leaves the trainer room: `--mem-fraction-static`
(unless `--sglang-mem-fraction-static` says otherwise) -- SGLang's static memory (weights and KV cache), which it
reserves at start, the local engine's cap on its CUDA allocations. It is sized for the model (`sized_mem_fraction`:
the engine's weights and a KV cache for every request in flight at its longest -- its prompt bounded by
--rollout-max-prompt-len or by the longest prompt in the job's files --, with room to spare, as a share of the GPU,
between MIN_MEM_FRACTION and COLOCATED_MEM_FRACTION) when the model's config.json and the GPU's memory are known
here, else COLOCATED_MEM_FRACTION.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..backends.sglang_launch import LaunchFlags
from ..config import ConfigError, JobConfig
from ..gpus import GpuCount
from .topology import Topology
from ..json_files import read_json_object

COLOCATED_MEM_FRACTION = "0.4"   # a colocated engine's share of its GPU's memory at most; the trainer keeps the rest
MIN_MEM_FRACTION = 0.05          # and at least (SGLang's workspace besides weights and KV cache)
PROMPT_TOKENS_GUESS = 1024       # a request's prompt when neither --rollout-max-prompt-len nor the data bound it
TEMPLATE_TOKENS = 256            # what a chat template and special tokens add to a prompt's text (a guess)


def model_memory(cfg: JobConfig) -> tuple[int, int] | None:
    """(bytes of the engine's weights, KV-cache bytes per token) from --hf-checkpoint's config.json (a directory, or
    a built-in model already in the model cache); None when it is not readable here."""
    from pathlib import Path

    from ..models.resolve import model_cache
    spec = cfg.model.hf_checkpoint or ""
    path = Path(spec)
    if spec.startswith("smollm2:"):
        path = model_cache(cfg.run.run_dir) / "smollm2-135m-instruct"
    elif spec.startswith("tiny:"):
        path = model_cache(cfg.run.run_dir) / f"tiny-{spec.split(':', 1)[1] or 'default'}"
    try:
        c = read_json_object(path / "config.json")
        c = c.get("text_config", c)
        hidden, layers = int(c["hidden_size"]), int(c["num_hidden_layers"])
        heads = int(c["num_attention_heads"])
        kv = int(c.get("num_key_value_heads") or heads)
        head_dim = int(c.get("head_dim") or hidden // heads)
        vocab, inter = int(c["vocab_size"]), int(c.get("intermediate_size") or 4 * hidden)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None
    dtype = LaunchFlags.parse(cfg.engine.sglang_args).value("--dtype") or ""
    nbytes = 4 if dtype in ("float32", "float") or (cfg.engine.rollout_engine == "local" and not cfg.train.bf16) \
        else 2
    params = vocab * hidden * (1 if c.get("tie_word_embeddings", False) else 2) + layers * (
        hidden * (heads * head_dim + 2 * kv * head_dim) + heads * head_dim * hidden + 3 * hidden * inter)
    return params * nbytes, 2 * layers * kv * head_dim * nbytes


def prompt_tokens_bound(cfg: JobConfig) -> int:
    """The prompt tokens a request may bring: --rollout-max-prompt-len; else the longest prompt the launcher read
    in the job's prompt files, in bytes of its text (a token is at least one byte for byte-level BPE tokenizers)
    plus TEMPLATE_TOKENS for the chat template; else PROMPT_TOKENS_GUESS."""
    if cfg.data.rollout_max_prompt_len:
        return int(cfg.data.rollout_max_prompt_len)
    if cfg.prompt_bytes_max:
        return cfg.prompt_bytes_max + TEMPLATE_TOKENS
    return PROMPT_TOKENS_GUESS


def sized_mem_fraction(cfg: JobConfig, gpu_bytes: int | None) -> str:
    """A colocated engine's --mem-fraction-static for this job: (weights + the KV cache of --rollout-concurrency
    requests of `prompt_tokens_bound` + the longer of the rollout's and the evaluation's response tokens) x 1.5 +
    1 GiB, over the GPU's memory, between MIN_MEM_FRACTION and COLOCATED_MEM_FRACTION (two decimals, rounded up);
    COLOCATED_MEM_FRACTION when either is unknown. A bound too small costs speed, not correctness: SGLang holds
    requests back while its KV cache is full."""
    mem = model_memory(cfg)
    if mem is None or not gpu_bytes:
        return COLOCATED_MEM_FRACTION
    weights, per_token = mem
    rollout_cfg = cfg.rollout
    response = max(rollout_cfg.rollout_max_response_len, cfg.eval.eval_max_response_len or 0)
    tokens = cfg.engine.rollout_concurrency * (prompt_tokens_bound(cfg) + response)
    need = (weights + per_token * tokens) * 1.5 + (1 << 30)
    frac = min(max(need / gpu_bytes, MIN_MEM_FRACTION), float(COLOCATED_MEM_FRACTION))
    return f"{-(-frac * 100 // 1) / 100:.2f}"


@dataclass
class GpuPlan:
    gpus: GpuCount
    per_node: int
    trainer: list[tuple[str, list[int]]] = field(default_factory=list)   # (actor, its GPUs)
    engines: list[tuple[str, list[int]]] = field(default_factory=list)   # (rollout worker, its engine's GPUs)
    others: list[tuple[str, list[int]]] = field(default_factory=list)    # a topology's other roles with GPUs
    colocate: bool = False
    by_itself: bool = False          # colocated because one GPU is all there is
    mem_fraction: str | None = None  # a colocated engine's --mem-fraction-static
    from_topology: bool = False

    def lines(self) -> list[str]:
        """What goes where, for the console."""
        def where(items):
            return "; ".join(f"{name} on GPU {_gpus(g)}" for name, g in items)
        placed = [where(x) for x in (self.trainer, self.engines, self.others) if x]
        out = [self.gpus.describe() + ": " + "; ".join(placed)]
        if self.by_itself:
            out.append("one GPU: the trainer and the engine share it, as with --colocate (weights by CUDA IPC, "
                       "--update-weight-transport colocated)")
        if self.colocate and self.mem_fraction is not None:
            pct = f"{float(self.mem_fraction) * 100:.0f}%"
            out.append(f"colocated memory: each engine keeps to {pct} of its GPU's memory (--sglang-mem-fraction-static "
                       f"{self.mem_fraction}), the trainer has the rest")
        return out


def _gpus(g: list[int]) -> str:
    return ",".join(map(str, g)) if len(g) < 3 else f"{g[0]}-{g[-1]}"


def _engines_here(cfg: JobConfig) -> tuple[int, int]:
    """(engines this job launches, GPUs each)."""
    if cfg.debug.debug_train_only or cfg.engine.rollout_external_engine_addrs:
        return 0, 0
    return cfg.engine.rollout_num_engines, cfg.engine.rollout_num_gpus_per_engine


def _trainer_gpus(cfg: JobConfig) -> int:
    return 0 if cfg.debug.debug_rollout_only else cfg.train.n_ranks


def topology_places_gpus(topology: Topology | None) -> bool:
    return topology is not None and any(r.gpus or r.gpus_per_actor or r.colocate for r in topology.roles.values())


def topology_colocates(topology: Topology | None) -> bool:
    """The topology puts the rollout workers on the trainer's GPUs (roles.rollout.colocate = "trainer")."""
    r = topology.roles.get("rollout") if topology is not None else None
    return r is not None and r.colocate == "trainer"


def colocates_by_itself(cfg: JobConfig, gpus: GpuCount, flags: LaunchFlags, topology: Topology | None = None
                        ) -> bool:
    """One GPU, one trainer rank, one one-GPU engine, no placement of the user's: colocate (module docstring).
    `flags`: the job's --sglang-* flags, parsed."""
    n_engines, per_engine = _engines_here(cfg)
    return (cfg.run.device.startswith("cuda") and gpus.count == 1 and not cfg.engine.colocate
            and cfg.engine.num_gpus_per_node is None and not topology_places_gpus(topology)
            and flags.value("--base-gpu-id") is None
            and _trainer_gpus(cfg) == 1 and n_engines * per_engine == 1)


def plan_gpus(cfg: JobConfig, gpus: GpuCount, flags: LaunchFlags, topology: Topology | None = None,
              by_itself: bool = False) -> GpuPlan:
    """The job's GPUs on this machine (`cfg.run.device` is cuda; `flags`: its --sglang-* flags, parsed).
    ConfigError when the plan cannot fit."""
    if gpus.count < 1:
        raise ConfigError(f"--device {cfg.run.device} but no GPU is visible here ({gpus.source}"
                          f"{': ' + gpus.detail if gpus.detail else ''}): use --device cpu, or run where a GPU is "
                          "visible")
    per_node = cfg.engine.num_gpus_per_node
    if per_node is None:
        per_node = gpus.count
    elif per_node > gpus.count:
        raise ConfigError(f"--num-gpus-per-node {per_node} but {gpus.describe()}: leave the flag out (it defaults to "
                          "the GPUs counted) or make the GPUs visible (CUDA_VISIBLE_DEVICES)")
    plan = GpuPlan(gpus, per_node, colocate=cfg.engine.colocate, by_itself=by_itself)
    if cfg.engine.colocate and _engines_here(cfg)[0]:
        plan.mem_fraction = flags.value("--mem-fraction-static") or sized_mem_fraction(cfg, gpus.memory_bytes)
    if topology_places_gpus(topology):
        return _check_topology(plan, topology)
    n_train = _trainer_gpus(cfg)
    n_engines, per_engine = _engines_here(cfg)
    need_engines = n_engines * per_engine
    base = flags.value("--base-gpu-id")
    plan.trainer = [(f"trainer/{r}", [r]) for r in range(n_train)]
    if base is not None:  # the user places the engines: each from that GPU on
        b = int(base)
        if b + per_engine > per_node:
            raise ConfigError(f"--sglang-base-gpu-id {b} with --rollout-num-gpus-per-engine {per_engine} needs GPUs "
                              f"{b}..{b + per_engine - 1} but {gpus.describe()}")
        plan.engines = [(f"rollout/{i}", list(range(b, b + per_engine))) for i in range(n_engines)]
    else:
        start = 0 if cfg.engine.colocate else n_train
        plan.engines = [(f"rollout/{i}", list(range(start + i * per_engine, start + (i + 1) * per_engine)))
                        for i in range(n_engines)]
    s = "" if n_engines == 1 else "s"
    engines_say = f"{n_engines} engine{s} of {per_engine} GPU{'' if per_engine == 1 else 's'}"
    if cfg.engine.colocate:
        need = max(n_train, need_engines if base is None else 0)
        if need > per_node:
            raise ConfigError(f"{_n_gpus(per_node, gpus)}: with --colocate the trainer needs {n_train} and "
                              f"{engines_say} need {need_engines} -- use fewer trainer ranks "
                              "(--actor-num-gpus-per-node) or engines (--rollout-num-engines, "
                              "--rollout-num-gpus-per-engine), or a machine with more GPUs")
        return plan
    need = n_train + (need_engines if base is None else 0)
    if need > per_node:
        fix = ("pass --colocate (the engines share the trainer's GPUs)" if max(n_train, need_engines) <= per_node
               else "use fewer trainer ranks (--actor-num-gpus-per-node) or engines (--rollout-num-engines, "
                    "--rollout-num-gpus-per-engine), or a machine with more GPUs")
        raise ConfigError(f"{_n_gpus(per_node, gpus)}: the trainer needs {n_train} and {engines_say} need "
                          f"{need_engines} more -- {fix}")
    return plan


def _n_gpus(per_node: int, gpus: GpuCount) -> str:
    if per_node < gpus.count:
        return f"--num-gpus-per-node {per_node} ({gpus.describe()})"
    return gpus.describe()


def _check_topology(plan: GpuPlan, topology: Topology) -> GpuPlan:
    """A topology's own GPU indexes, against the GPUs counted (the job runs on this host)."""
    plan.from_topology = True
    for p in topology.plan():
        if not p.gpus:
            continue
        missing = [g for g in p.gpus if g >= plan.per_node]
        if missing:
            raise ConfigError(f"{topology.path}: {p.name} is placed on GPU {_gpus(p.gpus)} but {plan.gpus.describe()}"
                              f" -- GPU {missing[0]} does not exist here; give node group {p.node_group!r} at most "
                              f"{plan.per_node} GPUs (nodes.{p.node_group}.gpus)")
        {"trainer": plan.trainer, "rollout": plan.engines}.get(p.role, plan.others).append((p.name, p.gpus))
    return plan
