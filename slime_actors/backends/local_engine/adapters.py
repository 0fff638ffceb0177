"""The local engine's LoRA adapters (--enable-lora), as SGLang serves them: loaded by name from PEFT adapter
directories (`/load_lora_adapter`), removed by name (`/unload_lora_adapter`), chosen per request by /generate's
`lora_path` (the adapter's name; none: the base model). One batch may mix adapters and the base: peft's
mixed-adapter forward (`adapter_names`) adds each row's own adapter; a batch with one adapter throughout runs the
plain forward with that adapter active.

    adapters = Adapters(model, max_rank=8, target_modules=["q_proj", "v_proj"])   # None: any
    adapters.load("v3", "/path/to/adapter")      # scheduler thread; LoraError / ValueError naming the problem
    logits = adapters.model()(..., **adapters.forward_kwargs(["v3", None, "v3"]))
    adapters.unload("v3")

A directory is checked before peft reads it (`backends.lora.check_adapter_dir`: safetensors only, rank and targets
within the engine's limits, adapter tensors only). Everything here runs on the scheduler thread, between steps.
"""

from __future__ import annotations

from torch import nn

from ..lora import LoraError, check_adapter_dir

BASE = "__base__"   # peft's name for "no adapter" in a mixed batch


class Adapters:
    def __init__(self, model: nn.Module, max_rank: int | None = None, target_modules: list[str] | None = None):
        self.base = model
        self.peft = None                      # peft's PeftModel around `base` once an adapter is loaded
        self.max_rank = max_rank
        allowed = set(target_modules or [])
        self.allowed = None if not allowed or allowed & {"all", "all-linear"} else allowed
        # name -> SGLang's LoRARef as its answers carry it (array_like): [lora_id, lora_name, lora_path, pinned]
        self.loaded: dict[str, list] = {}

    def model(self) -> nn.Module:
        return self.peft if self.peft is not None else self.base

    def forward_kwargs(self, names: list[str | None]) -> dict:
        """What the forward of a batch whose rows use these adapters (None: the base) takes. A batch that uses one
        adapter throughout (an RL job's engine: every request names the current adapter) runs peft's plain forward
        with that adapter active -- two matmuls and a scaling per adapted layer; a mixed batch runs peft's
        mixed-adapter forward, which also gathers and scatters each adapter's rows in every adapted layer."""
        if self.peft is None:
            if any(names):
                raise ValueError(f"no LoRA adapter is loaded (asked for {sorted({n for n in names if n})})")
            return {}
        first = names[0] if names else None
        if first is not None and first in self.loaded and all(n == first for n in names):
            if self.peft.active_adapter != first:
                self.peft.set_adapter(first, inference_mode=True)
            return {}
        return {"adapter_names": [n or BASE for n in names]}

    def load(self, name: str, path: str, pinned: bool = False) -> dict:
        """Load the adapter directory `path` as `name` (SGLang's messages for a name in use); the adapters now."""
        if not name or name == BASE:
            raise LoraError(f"{name!r} cannot name an adapter")
        if name in self.loaded:
            raise LoraError(f"Failed to load LoRA adapter {name} because it is already loaded")
        check_adapter_dir(path, self.max_rank, self.allowed)
        if self.peft is None:
            from peft import PeftModel
            self.peft = PeftModel.from_pretrained(self.base, path, adapter_name=name, is_trainable=False)
        else:
            self.peft.load_adapter(path, adapter_name=name, is_trainable=False)
        self.peft.eval()
        import uuid
        self.loaded[name] = [uuid.uuid4().hex, name, path, bool(pinned)]
        return dict(self.loaded)

    def unload(self, name: str) -> dict:
        """Remove adapter `name` (the server lets the requests that use it finish first); the adapters now."""
        if name not in self.loaded:
            raise LoraError(f"LoRA with name {name} does not exist. Loaded LoRAs: {sorted(self.loaded)}")
        del self.loaded[name]
        if not self.loaded:   # peft cannot run without an adapter: back to the plain model (LoRA layers removed)
            self.base = self.peft.unload()
            self.peft = None
        else:
            self.peft.delete_adapter(name)
        return dict(self.loaded)
