"""Held-out sets and who grades them: `--eval-prompt-data NAME PATH [NAME PATH ...]`, or slime's `--eval-config
FILE`, whose sets may each name a reward of their own -- so a run whose training reward is hacked is still measured
honestly, and the summary says which reward graded each number.

    # eval.yaml -- slime's format (YAML or JSON; a .toml file the same in TOML)
    eval:
      defaults:                      # every set's, unless the set says otherwise
        label_key: label
      datasets:                      # a list, or a table keyed by name
        - name: heldout
          path: heldout.jsonl        # relative to this file (else to the working directory)
          rm_type: math              # graded by the built-in math reward, whatever the training reward is
        - name: judged
          path: judged.jsonl
          custom_rm_path: graders.py:strict

    sets = eval_sets(cfg)            # [EvalSet(name="heldout", path=..., rm_type="math", ...), ...]
    grader_name(cfg, sets[0])        # "math (the set's own)" / "the training reward (--rm-type exact_match)"

Each set's keys (slime's names): `name`, `path`, `rm_type` or `custom_rm_path` (the set's own reward; at most one),
`input_key`, `label_key`. A set's own reward replaces the job's for that set's samples -- also over
--custom-rm-path and --reward-actor-class, which is the point (slime lets a job's --custom-rm-path win over a set's
`rm_type`). Its samples carry the set's name in `metadata["eval_set"]` (the buffer sets it, and takes it off every
training sample), and the reward role grades them with it (slime_actors/actors/reward.py).

Sampling is one for every set here: `n_samples_per_eval_prompt`, `temperature`, `top_p`, `top_k` and
`max_response_len`, in `defaults` (or in a set: then for every set), take the place of --n-samples-per-eval-prompt,
--eval-temperature, --eval-top-p, --eval-top-k and --eval-max-response-len (as in slime, where the file wins over
the flags); two different values of one key are refused. slime's other keys (stop words, metadata overrides, a
generate function per set, ...) are not supported here and are refused by name, as are unknown keys: nothing is
ignored silently.

`check_eval_config(cfg)` (the head, before any process starts) reads the file, checks all of it and reports every
problem at once, then writes the sets into --eval-prompt-data (NAME PATH pairs, as slime does) and the sampling
defaults into their flags; the actors read the sets again with `eval_sets(cfg)`.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from slime_actors.config import ConfigError, JobConfig
from slime_actors.rows import DataError

__all__ = ["EvalSet", "EVAL_SET_KEY", "parse_eval_prompt_data", "read_eval_config", "eval_sets", "own_graders",
           "grader_name", "grader_config", "check_eval_config"]

EVAL_SET_KEY = "eval_set"       # metadata key: the eval set an eval sample belongs to
MAX_BYTES = 1 << 20             # an eval config is a few lines; a file larger than this is refused unread
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}")   # a set's name is part of file names (RUN_DIR/evals/...)

# slime's per-set sampling keys -> this job's flags (section eval)
SAMPLING = {"n_samples_per_eval_prompt": "n_samples_per_eval_prompt", "temperature": "eval_temperature",
            "top_p": "eval_top_p", "top_k": "eval_top_k", "max_response_len": "eval_max_response_len"}
# slime's other EvalDatasetConfig keys: known, not supported here
UNSUPPORTED = ("tool_key", "metadata_key", "multimodal_keys", "apply_chat_template", "apply_chat_template_kwargs",
               "stop", "stop_token_ids", "min_new_tokens", "repetition_penalty", "skip_special_tokens",
               "no_stop_trim", "custom_generate_function_path", "app_service", "eval_task_timeout",
               "min_eval_samples", "eval_early_stop_remaining", "eval_early_stop_idle_timeout", "message_processor",
               "reward_model", "remote_environment", "metadata_overrides", "prompt_key")


@dataclass(frozen=True)
class EvalSet:
    """One held-out set: its name, its prompt file, its own reward (`rm_type` or `custom_rm_path`; neither: the
    job's), and its own prompt and label keys (None: --eval-input-key / --eval-label-key, else the training ones)."""

    name: str
    path: str
    rm_type: str | None = None
    custom_rm_path: str | None = None
    input_key: str | None = None
    label_key: str | None = None

    @property
    def own_grader(self) -> bool:
        return bool(self.rm_type or self.custom_rm_path)


_SET_KEYS = tuple(f.name for f in fields(EvalSet))


def parse_eval_prompt_data(values: list[str] | str | None) -> list[tuple[str, str]]:
    """`--eval-prompt-data NAME PATH [NAME PATH ...]` or `--eval-prompt-data PATH` as (name, path) pairs; a single
    PATH (or a list of values that are all existing .jsonl/.parquet files) is named by the file's stem."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    values = [str(v) for v in values]
    if not values:
        return []

    def is_data_file(v):
        return v.lower().endswith((".jsonl", ".parquet")) and os.path.isfile(v)

    if len(values) == 1 or all(is_data_file(v) for v in values):
        pairs = [(os.path.splitext(os.path.basename(v))[0], v) for v in values]
    elif len(values) % 2:
        raise DataError(f"--eval-prompt-data takes NAME PATH pairs or a single PATH, got {len(values)} values: "
                        f"{values}")
    else:
        pairs = [(values[i], values[i + 1]) for i in range(0, len(values), 2)]
    seen = set()
    for name, _ in pairs:
        if name in seen:
            raise DataError(f"--eval-prompt-data names {name!r} twice")
        seen.add(name)
    return pairs


# ---------------------------------------------------------------------------------------------- the file
def _load(path: str) -> Any:
    """The file's data (TOML for .toml, else YAML -- which reads JSON too); ConfigError naming the file (and the
    line of a syntax error)."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise ConfigError(f"--eval-config {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"--eval-config {path}: cannot read it: {exc}") from None
    if not p.is_file():
        raise ConfigError(f"--eval-config {path} is not a file")
    if size > MAX_BYTES:
        raise ConfigError(f"--eval-config {path} is {size} bytes; an eval config is a few lines (at most "
                          f"{MAX_BYTES} bytes)")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--eval-config {path}: cannot read it: {exc}") from None
    if p.suffix.lower() == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"--eval-config {path}: {exc}") from None
        except RecursionError:
            raise ConfigError(f"--eval-config {path}: nested too deep to be read") from None
    import yaml
    try:
        return yaml.safe_load(text)
    except RecursionError:   # (PyYAML composes nested collections by recursion)
        raise ConfigError(f"--eval-config {path}: nested too deep to be read") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"--eval-config {path}{where}: not valid YAML: {what}") from None


def _near(base: Path, value: str) -> str:
    """A path relative to the eval config's directory when there is such a file there (as the TOML config's)."""
    if value and not os.path.isabs(value) and (base / value).exists():
        return str(base / value)
    return value


def _near_function(base: Path, spec: str) -> str:
    """`file.py:fn` with the file relative to the eval config's directory when it is there; a dotted path as is."""
    file, sep, fn = spec.rpartition(":")
    if sep and file.endswith(".py"):
        return f"{_near(base, file)}:{fn}"
    return spec


def read_eval_config(path: str) -> tuple[list[EvalSet], dict[str, Any], list[str]]:
    """(the sets, the sampling defaults {slime key: value}, the problems found) of an eval config file. ConfigError
    only when the file cannot be read or parsed at all; every other problem is one line of the list, naming the set
    and key."""
    data = _load(path)
    base = Path(path).resolve().parent
    problems: list[str] = []
    where = f"--eval-config {path}"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a table (`eval:` with `datasets:`), got {type(data).__name__}")
    root = data.get("eval", data)
    if not isinstance(root, dict):
        raise ConfigError(f"{where}: `eval` must be a table with `datasets` (and `defaults`), got "
                          f"{type(root).__name__}")
    extra = sorted(set(root) - {"defaults", "datasets"})
    if extra:
        problems.append(f"{where}: unknown key(s) {', '.join(map(repr, extra))} in `eval` (it holds `defaults` and "
                        "`datasets`)")
    defaults = root.get("defaults") or {}
    if not isinstance(defaults, dict):
        problems.append(f"{where}: `defaults` must be a table, got {type(defaults).__name__}")
        defaults = {}
    raw = root.get("datasets")
    if isinstance(raw, dict):
        entries = []
        for name, entry in raw.items():
            entry = dict(entry) if isinstance(entry, dict) else entry
            if isinstance(entry, dict):
                entry.setdefault("name", name)
            elif entry is None:
                entry = {"name": name}
            entries.append(entry)
    elif isinstance(raw, list):
        entries = list(raw)
    else:
        raise ConfigError(f"{where}: no datasets: `eval.datasets` must be a list of sets (each with `name` and "
                          f"`path`) or a table of them by name, got {type(raw).__name__}")
    if not entries:
        raise ConfigError(f"{where}: `eval.datasets` is empty")

    def check_keys(table: dict, what: str, allowed: tuple) -> None:
        for key in table:
            if key in UNSUPPORTED:
                problems.append(f"{where}: {what}: slime's key {key!r} is not supported here (a set has "
                                f"{', '.join(_SET_KEYS)}; sampling goes in `defaults`: {', '.join(SAMPLING)})")
            elif key not in allowed:
                problems.append(f"{where}: {what}: unknown key {key!r} (known: {', '.join(allowed)})")

    check_keys(defaults, "defaults", tuple(k for k in _SET_KEYS if k not in ("name", "path")) + tuple(SAMPLING))
    sampling = {k: v for k, v in defaults.items() if k in SAMPLING}
    sets: list[EvalSet] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            problems.append(f"{where}: datasets[{i}] must be a table with `name` and `path`, got "
                            f"{type(entry).__name__}")
            continue
        name = entry.get("name")
        what = f"set {name!r}" if isinstance(name, str) else f"datasets[{i}]"
        check_keys(entry, what, _SET_KEYS + tuple(SAMPLING))
        values = {k: entry.get(k, defaults.get(k)) for k in _SET_KEYS}
        for key in _SET_KEYS:
            v = values[key]
            if v is not None and (not isinstance(v, str) or not v.strip()):
                problems.append(f"{where}: {what}: {key} must be a non-empty string, got {v!r}")
                values[key] = None
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            problems.append(f"{where}: {what}: `name` must be letters, digits, '_', '.', '+' or '-' (it names "
                            f"files and metrics), got {name!r}")
            continue
        if name in seen:
            problems.append(f"{where}: two sets are named {name!r}")
        seen.add(name)
        if values["path"] is None:
            problems.append(f"{where}: {what}: no `path` (its prompt file)")
            continue
        if values["rm_type"] and values["custom_rm_path"]:
            problems.append(f"{where}: {what}: give `rm_type` or `custom_rm_path`, not both")
        for key in (k for k in SAMPLING if k in entry):
            if key in sampling and entry[key] != sampling[key]:
                problems.append(f"{where}: {what}: {key} {entry[key]!r} differs from the {sampling[key]!r} of "
                                "`defaults` or an earlier set; sampling is one for every set here")
            sampling.setdefault(key, entry[key])
        values["path"] = _near(base, values["path"])
        if values["custom_rm_path"]:
            values["custom_rm_path"] = _near_function(base, values["custom_rm_path"])
        sets.append(EvalSet(**values))
    return sets, sampling, problems


# ---------------------------------------------------------------------------------------------- the job's sets
def eval_sets(cfg: JobConfig) -> list[EvalSet]:
    """The job's held-out sets: --eval-config's, else --eval-prompt-data's (graded by the job's reward)."""
    if cfg.eval.eval_config:
        sets, _, problems = read_eval_config(cfg.eval.eval_config)
        if problems:
            raise ConfigError("\n".join(problems))
        return sets
    return [EvalSet(name, path) for name, path in parse_eval_prompt_data(cfg.eval.eval_prompt_data)]


def own_graders(cfg: JobConfig) -> dict[str, EvalSet]:
    """The sets that have a reward of their own, by name."""
    return {s.name: s for s in eval_sets(cfg) if s.own_grader} if cfg.eval.eval_config else {}


def grader_config(cfg: JobConfig, s: EvalSet) -> JobConfig:
    """The job's config with the set's own reward in place of the job's (for the reward functions' `args`)."""
    import copy
    out = copy.deepcopy(cfg)
    out.reward.rm_type, out.reward.custom_rm_path, out.reward.group_rm = s.rm_type, s.custom_rm_path, False
    return out


def grader_name(cfg: JobConfig, s: EvalSet) -> str:
    """Which reward graded the set, in words: its own, or the job's."""
    if s.rm_type:
        return f"{s.rm_type} (the set's own)"
    if s.custom_rm_path:
        return f"{s.custom_rm_path} (the set's own)"
    reward_cfg = cfg.reward
    if reward_cfg.reward_actor_class and not (reward_cfg.rm_type or reward_cfg.custom_rm_path):
        return f"the training reward (--reward-actor-class {reward_cfg.reward_actor_class})"
    if reward_cfg.custom_rm_path:
        return f"the training reward (--custom-rm-path {reward_cfg.custom_rm_path})"
    return f"the training reward (--rm-type {reward_cfg.rm_type})"


def check_eval_config(cfg: JobConfig) -> list[EvalSet] | None:
    """The head's check of --eval-config, before any process starts: every problem at once (ConfigError); then the
    sets go into --eval-prompt-data and the sampling defaults into their flags (a note says what changed). Returns
    the sets (None without --eval-config), so the launcher reads the file once."""
    eval_cfg = cfg.eval
    if not eval_cfg.eval_config:
        return None
    sets, sampling, problems = read_eval_config(eval_cfg.eval_config)
    from slime_actors.rewards.dispatch import BUILTIN_RMS
    for s in sets:
        if not os.path.exists(s.path):
            problems.append(f"--eval-config {eval_cfg.eval_config}: set {s.name!r}: its prompt file {s.path} does not "
                            "exist" + ("" if os.path.isabs(s.path) else
                                       " (neither next to the eval config nor in the working directory)"))
        if s.rm_type:
            rm = s.rm_type.strip()
            if rm not in BUILTIN_RMS and not (rm.startswith("boxed_") and rm[len("boxed_"):] in BUILTIN_RMS):
                problems.append(f"--eval-config {eval_cfg.eval_config}: set {s.name!r}: unknown rm_type {rm!r} "
                                f"(built-ins: {', '.join(sorted(BUILTIN_RMS))}, or boxed_<one of them>; or "
                                "custom_rm_path)")
            elif rm == "remote_rm" and not cfg.reward.rm_url:
                problems.append(f"--eval-config {eval_cfg.eval_config}: set {s.name!r}: rm_type remote_rm needs "
                                "--rm-url")
        if s.custom_rm_path:
            file, sep, _ = s.custom_rm_path.rpartition(":")
            if sep and file.endswith(".py") and not os.path.isfile(file):
                problems.append(f"--eval-config {eval_cfg.eval_config}: set {s.name!r}: custom_rm_path names {file}, "
                                "which does not exist")
    wants = {"n_samples_per_eval_prompt": ("a whole number >= 1", lambda v: isinstance(v, int) and v >= 1),
             "max_response_len": ("a whole number >= 1", lambda v: isinstance(v, int) and v >= 1),
             "top_k": ("a whole number (-1: all)", lambda v: isinstance(v, int) and v >= -1 and v != 0),
             "temperature": ("a number >= 0", lambda v: isinstance(v, (int, float)) and v >= 0),
             "top_p": ("a number in (0, 1]", lambda v: isinstance(v, (int, float)) and 0 < v <= 1)}
    for key, value in sampling.items():
        want, ok = wants[key]
        if isinstance(value, bool) or not ok(value):
            problems.append(f"--eval-config {eval_cfg.eval_config}: {key} must be {want}, got {value!r}")
    if problems:
        raise ConfigError("\n".join(problems))
    if eval_cfg.eval_prompt_data:
        cfg.notes.append(f"--eval-prompt-data is ignored: --eval-config {eval_cfg.eval_config} names the held-out sets "
                         "(as in slime)")
    eval_cfg.eval_config = os.path.abspath(eval_cfg.eval_config)     # every actor reads the same file, wherever it runs
    eval_cfg.eval_prompt_data = [x for s in sets for x in (s.name, os.path.abspath(s.path))]
    for key, value in sampling.items():
        flag = SAMPLING[key]
        if getattr(eval_cfg, flag) != value:
            cfg.notes.append(f"--{flag.replace('_', '-')} {value} (from --eval-config {eval_cfg.eval_config} defaults)")
        setattr(eval_cfg, flag, float(value) if key in ("temperature", "top_p") else value)
    return sets
