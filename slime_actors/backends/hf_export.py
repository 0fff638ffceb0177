"""Writing a Hugging Face model directory from a training backend's weights (`--save-hf`, `slime-actors convert`).

    export_hf(named_weights, "out/hf/iter_0000009", source_dir=hf_checkpoint, info={"rollout_id": 9})
    export_adapter(tensors, adapter_config, "out/hf/iter_0000009", hf_checkpoint, info, merged=None)   # LoRA

With LoRA the export is a PEFT adapter directory (adapter_model.safetensors, adapter_config.json, the tokenizer
files): `PeftModel.from_pretrained(base, dir)` loads it; with `merged` weights also `dir/merged/`, a plain HF model.

The directory gets the weights as safetensors (HF names, sharded above 4 GiB with an index), every other file of
`source_dir` (config.json, generation_config.json, tokenizer files, chat template) and a marker,
`.slime-actors-export` (JSON: what was exported, when). It is written next to its destination and renamed into
place, so a directory that is there is complete. The destination must be new, empty, or an earlier export of ours
(then it is replaced); anything else -- a user's directory, the source model itself -- is refused before a byte
is written.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

import torch

from ..checkpoints import EXPORT_MARKER, CheckpointError, is_export_of_ours


def check_export_target(out: str | os.PathLike, source_dir: str | os.PathLike | None = None) -> Path:
    out = Path(out)
    if source_dir is not None and Path(source_dir).exists() and out.resolve() == Path(source_dir).resolve():
        raise CheckpointError(f"{out}: is the source model directory; an export would replace its weights")
    if out.exists():
        if not out.is_dir():
            raise CheckpointError(f"{out}: is a file; an HF export is a directory")
        if any(out.iterdir()) and not is_export_of_ours(out):
            names = sorted(x.name for x in out.iterdir())
            raise CheckpointError(f"{out}: exists and is not an export of slime-actors (no {EXPORT_MARKER}; holds "
                                  f"{', '.join(names[:6])}{', ...' if len(names) > 6 else ''}); give a new directory")
    return out


def export_hf(named_weights: Iterable[tuple[str, torch.Tensor]], out: str | os.PathLike,
              source_dir: str | os.PathLike, info: dict | None = None) -> Path:
    """Write the HF directory `out` (see the module docstring). `named_weights` is consumed to its end even when
    the export fails (it may be a collective that other ranks iterate at the same time)."""
    it = iter(named_weights)
    try:
        out = check_export_target(out, source_dir)
        src = Path(source_dir)
        if not (src / "config.json").is_file():
            raise CheckpointError(f"{src}: no config.json to copy into the export (is it a Hugging Face model "
                                  "directory?)")
        from .weight_sync import save_weights_to_disk
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)  # ours: a name only this process writes
        save_weights_to_disk(it, tmp, src)
        (tmp / "slime_tiny.json").unlink(missing_ok=True)  # the tiny model's cache stamp: not part of a model
        (tmp / EXPORT_MARKER).write_text(json.dumps({"by": "slime-actors", "time": time.time(),
                                                     "source": str(src), **(info or {})}, default=str) + "\n")
    except BaseException:
        for _ in it:
            pass
        raise
    return _put_in_place(tmp, out)


def _put_in_place(tmp: Path, out: Path) -> Path:
    """Rename the finished `tmp` to `out`, replacing an earlier export of ours (checked before) or an empty
    directory."""
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old)
    else:
        os.replace(tmp, out)
    return out


def export_adapter(tensors: dict[str, torch.Tensor], config: dict, out: str | os.PathLike,
                   source_dir: str | os.PathLike, info: dict | None = None,
                   merged: Iterable[tuple[str, torch.Tensor]] | None = None) -> Path:
    """Write the PEFT adapter directory `out` (see the module docstring), under the same rules as export_hf: checked
    first, written next to it, renamed into place, marked as ours."""
    from .lora import write_adapter_dir
    from .weight_sync import WEIGHT_FILE_SUFFIXES, WEIGHT_INDEX_FILES, save_weights_to_disk
    it = iter(merged) if merged is not None else None
    try:
        out = check_export_target(out, source_dir)
        src = Path(source_dir)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        write_adapter_dir(tmp, tensors, config)
        for p in src.iterdir():   # the tokenizer's files; not config.json (then it would look like a whole model)
            if p.is_file() and p.name not in ("config.json", "generation_config.json", "slime_tiny.json",
                                              "slime_smollm2.json") \
                    and not p.name.endswith(WEIGHT_FILE_SUFFIXES) and p.name not in WEIGHT_INDEX_FILES:
                shutil.copy2(p, tmp / p.name)
        if it is not None:
            save_weights_to_disk(it, tmp / "merged", src)
            (tmp / "merged" / "slime_tiny.json").unlink(missing_ok=True)
        (tmp / EXPORT_MARKER).write_text(json.dumps({"by": "slime-actors", "time": time.time(), "source": str(src),
                                                     "lora": True, "merged": it is not None, **(info or {})},
                                                    default=str) + "\n")
    except BaseException:
        for _ in it or ():
            pass
        raise
    return _put_in_place(tmp, out)
