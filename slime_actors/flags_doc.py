"""docs/flags.md, generated from the parser's own declarations (slime_actors.config, slime_actors.slime_compat).

    python -m slime_actors.flags_doc > docs/flags.md

tests/test_flags.py compares the file with this output, so the document cannot drift from the flags.
"""

from __future__ import annotations

import sys

from .config import FIELDS, SECTIONS
from .slime_compat import _UNSUPPORTED_GROUPS, MEGATRON_FLAGS, SLIME_ACCEPTED

HEAD = """# Flags

Every flag of `slime-actors train` (and `launch`, `sbatch`: the job's flags are the same), generated from the
parser by `python -m slime_actors.flags_doc` (a test keeps this page and the parser the same). The flags have
slime's names and meanings: a slime launch script's flags carry over. `slime-actors train --help` shows the same
text; a TOML file (`--config`) may set any flag by its name, the command line wins.

Where a flag comes from: **slime** (slime's flag, same name and meaning), **Megatron** (a Megatron-LM flag that slime
passes on, same meaning) or **own** (this project's). Unknown flags are errors that name the closest flags; an
abbreviation is never taken for a flag (`--rollout-num-gpus` is slime's flag, not a prefix of
`--rollout-num-gpus-per-engine`). slime's flags this project does not have are refused with the reason
([below](#slimes-flags-that-are-refused)); the Megatron and slime flags it accepts without a field of its own are
[listed](#megatron-flags-from-slimes-scripts) with what they do here. At start the job prints a note naming every
such flag it accepted and why it has no effect.
"""


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _default(spec) -> str:
    d = spec.default
    if d is None:
        return "—"
    if isinstance(d, bool):
        return "on" if d else "off"
    if isinstance(d, list):
        return " ".join(map(str, d)) or "—"
    return f"`{d}`"


def _kind(spec) -> str:
    if spec.switch:
        return "switch"
    base = {int: "int", float: "float", str: "str", bool: "true/false"}[spec.base]
    if spec.choices:
        base = " \\| ".join(map(str, spec.choices))
    return f"{base} ..." if spec.is_list else base


def flags_markdown() -> str:
    out = [HEAD]
    out.append("## Defaults that differ from slime's\n")
    out.append("| flag | here | slime | why |")
    out.append("|---|---|---|---|")
    for spec in FIELDS.values():
        if spec.slime is not None:
            theirs, why = spec.slime[:2]
            here = f"{spec.slime[2]}" if len(spec.slime) > 2 else _default(spec)
            theirs = spec.slime[3] if len(spec.slime) > 3 else "—" if theirs is None else f"`{theirs}`"
            out.append(f"| `{spec.option}` | {_cell(here)} | {_cell(theirs)} | {_cell(why)} |")
    out.append("")
    out.append("Values derived from others (`--global-batch-size`, `--eps-clip-high`, `--over-sampling-batch-size`, "
               "`--eval-top-p`, ...) are derived as slime derives them unless the table says otherwise.\n")
    for section, cls in SECTIONS.items():
        specs = [s for s in FIELDS.values() if s.section == section and s.cli]
        if not specs:
            continue
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        out.append(f"## {cls.TITLE}\n")
        if doc:
            out.append(f"{doc}\n")
        out.append("| flag | takes | default | from | what it does |")
        out.append("|---|---|---|---|---|")
        for s in specs:
            origin = {"slime": "slime", "megatron": "Megatron", "own": "own"}[s.origin]
            out.append(f"| `{s.option}` | {_kind(s)} | {_default(s)} | {origin} | {_cell(s.help or '')} |")
        out.append("")
    out.append("Passthrough: every `--sglang-<flag> [value]` goes to the SGLang servers as `--<flag>` and every "
               "`--router-<flag> [value]` to the sglang-router, checked against SGLang's own parser "
               "(docs/sglang.md).\n")
    out.append(_SIGNATURES)
    out.append("## slime's flags accepted without effect\n")
    out.append("slime flags for what this project does its own way. A value that would change the result is "
               "refused with the reason.\n")
    out.append(_compat_table(SLIME_ACCEPTED))
    out.append("## Megatron flags from slime's scripts\n")
    out.append("Accepted so that a slime launch script runs unchanged. *no effect*: a memory or speed setting, the "
               "result is the same without it. *only X*: a setting this project has fixed; another value is "
               "refused (it would change the result). *checked against config.json*: the model's architecture, which "
               "comes from `--hf-checkpoint`'s config.json here; a value that differs from the file is refused "
               "(*not checked*: config.json has no field to compare with). Parallel "
               "sizes this project implements (`--tensor-model-parallel-size`, `--pipeline-model-parallel-size`) "
               "and the optimizer's numbers (`--lr`, `--adam-beta1`, ...) are flags of their own above.\n")
    out.append(_compat_table(MEGATRON_FLAGS))
    out.append("## slime's flags that are refused\n")
    out.append("Flags of slime for features this project does not have. Given one, the job stops before it "
               "starts, naming the flag and the reason.\n")
    out.append("| flags | why |")
    out.append("|---|---|")
    for why, names in _UNSUPPORTED_GROUPS:
        out.append(f"| {', '.join(f'`{n}`' for n in names)} | {_cell(why)} |")
    out.append("")
    return "\n".join(out)


def _compat_table(flags) -> str:
    rows = ["| flag | takes | here |", "|---|---|---|"]
    for f in flags:
        kind = {"noop": "no effect", "fixed": f"only `{f.expect}`", "alias": f"means `--{str(f.alias).replace('_', '-')}`",
                "arch": "checked against config.json" if f.hf else "accepted, not checked",
                "env": "environment"}[f.kind]
        takes = "switch" if f.switch else {int: "int", float: "float", str: "str"}[f.type]
        rows.append(f"| `{f.name}` | {takes} | {kind}: {_cell(f.note)} |")
    return "\n".join(rows) + "\n"


_SIGNATURES = """## The functions flags name

`args` is slime's: the job's flags as attributes with slime's names (`args.rollout_max_response_len`), read-only.

| flag | signature |
|---|---|
| `--custom-rm-path` | `async def fn(args, sample) -> float` (with `--group-rm`: `fn(args, samples) -> list[float]`) |
| `--custom-generate-function-path` | slime's `async def generate(args, sample, sampling_params[, evaluation]) -> Sample`: it POSTs SGLang's `/generate` body to `http://{args.sglang_router_ip}:{args.sglang_router_port}/generate`, which is a proxy of the rollout worker to its engine (the job's key added, answers recorded in the trace); `sample.tokens = ...`, `sample.response_length = n` and `Sample.Status.COMPLETED` work as in slime (import `Sample` from `slime_actors.types`); a loss mask left empty is all ones. Or this project's `@engine_generate async def generate(args, sample, sampling_params, engine) -> Sample` (`engine_generate` from `slime_actors.environments`; a 4th parameter other than slime's `evaluation` also marks it), with `ep = engine.episode(sample, sampling_params)`, `await ep.generate(engine, sampling_params)`, `ep.add_observation(ids)`, `return ep.finish()` doing the bookkeeping. |
| `--rollout-interaction-env-path` | a subclass of `slime_actors.environments.Env`: `async def step(self, sample, turn) -> Step(observation, done=..., reward=..., metadata=...)`, optionally `reset(sample)`, `close(sample)`, `setup()`, `teardown()`; constructed as `Class(args, **env_kwargs)` (docs/adding-an-environment.md, examples/tool_use/). Or a module of slime's with `build_env(sample=, args=)`. |
| `--rollout-function-path` | `async def fn(args, samples, sampling_params, engine) -> list[Sample]`, per prompt group |
| `--dynamic-sampling-filter-path` | `def fn(args, samples) -> bool` (keep the group) |
| `--custom-loss-function-path` | with `--loss-type custom_loss`: `def fn(args, batch, log_probs, sum_of_sample_mean) -> (loss, metrics)`. slime's signature, except that `log_probs` are the current policy's per-token log-probs (one tensor per sample, with grad) where slime passes Megatron's logits. `batch` holds per-sample lists: `loss_masks`, `advantages`, `returns`, `log_probs` (the old policy's), `ref_log_probs`, `rollout_log_probs`, `rewards`, `entropy`, `tokens`, `response_lengths`, `total_lengths`. `sum_of_sample_mean(x)` reduces per-token values as the built-in loss does (per sample, or per token with `--calculate-per-token-loss`, over the whole step across micro-batches and ranks). `metrics` are reported as `train/<name>`. |

## Estimators and losses

`--advantage-estimator`: **grpo** (group-normalized reward), **gspo** (grpo's advantages, a sequence-level ratio),
**cispo** (grpo's advantages; CISPO's loss: the importance ratio truncated to [1 - eps-clip, 1 + eps-clip-high]
under stop-gradient, times the advantage and the log-prob, so truncated tokens still get gradient; canonical
CISPO is one-sided: `--eps-clip 1.0 --eps-clip-high 4.0`), **reinforce_plus_plus**, **reinforce_plus_plus_baseline**
(both whitened), **ppo** (a critic, GAE). `--loss-type sft_loss` trains on the negative log-likelihood of the
responses instead.

## Logging

Every step's numbers go to RUN_DIR/metrics.jsonl, RUN_DIR/curves.png and TensorBoard (RUN_DIR/tensorboard, on by
default; a step's events are on disk within 2 s of its end). `--use-wandb` logs the same numbers to Weights & Biases against `rollout_id`, with a table of each
rollout's best and worst sample, one of each evaluation's responses, and the curves picture; `--wandb-mode offline`
writes the run under RUN_DIR/wandb for `wandb sync` later. `--log-passrate` adds pass@k (`passrate/pass@k`,
`eval/NAME-pass@k`).

The console: `--log-level` (or `SLIME_ACTORS_LOG_LEVEL`) sets what it shows -- `warning` for only what needs a
look; the JSON logs under RUN_DIR/logs keep every event of level info and up either way. On a terminal the job's
status and the progress bar share the last line; in a file or a pipe there is no progress bar.
"""


def main() -> int:
    sys.stdout.write(flags_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
