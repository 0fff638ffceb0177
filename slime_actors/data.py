"""Prompt data: jsonl or parquet files of prompts, read once, handed out as prompt groups over epochs.

    ds = PromptDataset("data/train.jsonl", tokenizer, input_key="input", label_key="label",
                       apply_chat_template=True, max_prompt_len=512, shuffle=True, seed=42)
    prompts = ds.next_prompts(8)                         # the next 8 prompts, crossing epochs as needed
    samples = prompts[0].to_samples(4, group_index=0, first_index=0)   # 4 fresh Samples of one prompt
    state = ds.state_dict()                              # {"epoch", "offset", ...}
    ds2 = PromptDataset(...same...); ds2.load_state_dict(state)   # continues exactly where ds stopped

Rows. A row is a JSON object (one per line in .jsonl; blank lines are ignored) or a parquet row. `input_key` holds
the prompt: a non-empty string, or a non-empty list of chat messages ({"role": ..., "content": ...}). `label_key`
(optional) the label, any type. `metadata_key` (optional) a dict, or a JSON string of one. `tool_key` (optional)
a list of tool specs (or a JSON string of one), passed to the chat template and kept in `metadata["tools"]`.

Prompts. With `apply_chat_template` a string prompt becomes [{"role": "user", "content": prompt}] and the
tokenizer's chat template renders the messages with add_generation_prompt=True; the prompt is the rendered text.
`prompt_tokens` are computed once, here, as `tokenizer(prompt, add_special_tokens=False)` (slime's convention:
the chat template carries any BOS itself). A message-list prompt without `apply_chat_template` is kept as the list
with empty `prompt_tokens` (for a custom generate function), and is not length-filtered. Prompts longer than
`max_prompt_len` tokens are dropped and counted (`stats["too_long"]`).

Malformed rows (invalid JSON, not an object, missing input/label key, wrong type, empty prompt, a chat template
that fails) raise `DataError` naming the file, the line (jsonl, 1-based) or row (parquet, 0-based) and the
problem. With `on_error="skip"` they are skipped instead, counted (`stats["skipped"]`) and logged: one warning per
row for the first 10, then a summary. A file that cannot be read at all, or has no usable prompt, always raises.

Order. Epoch e visits every prompt once, in file order, or (with `shuffle`) in the permutation
`random.Random(seed + e).shuffle(range(n))` — the same on every machine and every restart. The position is
(epoch, offset); `state_dict()` / `load_state_dict()` save and restore it. Samples are numbered by the buffer
(slime_actors/buffer_state.py), which makes them with `Prompt.to_samples`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from slime_actors.config import DataSection, JobConfig, default_of, json_object
from slime_actors.eval_config import eval_sets, parse_eval_prompt_data
from slime_actors.log import get_logger
from slime_actors.rows import (DEFAULT_MAX_ROW_BYTES, FIRST_SHOWN, DataError, RowKeys, RowProblem, _loc, _tname,
                               check_row, first_places, read_checked, read_rows, source_stamp)
from slime_actors.types import Sample

__all__ = ["DataError", "Prompt", "PromptDataset", "EvalDatasets", "parse_eval_prompt_data", "read_rows",
           "load_prompt_data", "load_tokenizer"]

MAX_LOGGED_ROW_WARNINGS = 10
_TOKENIZE_CHUNK = 1024


@dataclass
class Prompt:
    """One usable prompt. `index` is its position in the dataset (stable across epochs and restarts)."""

    index: int
    prompt: Any                      # str (rendered), or a list of chat messages
    prompt_tokens: list[int]
    label: Any = None
    metadata: dict = field(default_factory=dict)
    source: str = ""                 # "file:line" or "file row N"

    # read like a dict too (prompt["prompt_tokens"], prompt.get("label"))
    def __getitem__(self, key: str):
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def get(self, key: str, default=None):
        return getattr(self, key, default)

    def to_samples(self, n: int, group_index: int, first_index: int, rollout_id: int = -1) -> list[Sample]:
        """`n` fresh samples of this prompt (their own copies of tokens and metadata), numbered `first_index`,
        `first_index + 1`, ... The buffer numbers them (buffer_state.py: running counters over the run)."""
        return [Sample(index=first_index + j, group_index=group_index, prompt=fresh_copy(self.prompt),
                       prompt_tokens=list(self.prompt_tokens), label=fresh_copy(self.label),
                       metadata=fresh_copy(self.metadata), rollout_id=rollout_id) for j in range(n)]


_ATOMS = (str, int, float, bool, type(None))


def fresh_copy(v: Any) -> Any:
    """copy.deepcopy for what a prompt row holds -- strings, numbers, lists and string-keyed maps of them, as JSON
    gives them -- without deepcopy's memo and dispatch (a chat prompt's messages and a metadata map are copied for each
    of a rollout's 128 samples: 1.1 us a sample instead of 3.2); anything else goes to copy.deepcopy."""
    t = type(v)
    if t in _ATOMS:
        return v
    if t is dict:
        return {k: fresh_copy(x) for k, x in v.items()}
    if t is list:
        return [fresh_copy(x) for x in v]
    return copy.deepcopy(v)


# ----------------------------------------------------------------------------------------------- the dataset

class PromptDataset:
    """The prompts of one file, and a resumable position over epochs (see the module docstring)."""

    def __init__(self, path: str | os.PathLike, tokenizer=None, input_key: str = default_of("input_key"),
                 label_key: str | None = None, metadata_key: str | None = default_of("metadata_key"),
                 tool_key: str | None = None, apply_chat_template: bool = False, max_prompt_len: int | None = None,
                 shuffle: bool = False, seed: int = default_of("rollout_seed"), on_error: str = "raise",
                 apply_chat_template_kwargs: dict | None = None, name: str | None = None,
                 max_row_bytes: int | None = DEFAULT_MAX_ROW_BYTES, checked: str | None = None,
                 max_prompt_len_why: str = "max_prompt_len"):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if (apply_chat_template or max_prompt_len is not None) and tokenizer is None:
            raise ValueError("apply_chat_template and max_prompt_len need a tokenizer")
        self.path = os.fspath(path)
        self.name = name or os.path.splitext(os.path.basename(self.path))[0]
        self.tokenizer = tokenizer
        self.input_key, self.label_key, self.metadata_key, self.tool_key = input_key, label_key, metadata_key, \
            tool_key
        self.apply_chat_template = apply_chat_template
        self.apply_chat_template_kwargs = dict(apply_chat_template_kwargs or {})
        self.max_prompt_len, self.max_prompt_len_why = max_prompt_len, max_prompt_len_why
        self.max_row_bytes, self.checked, self.from_checked = max_row_bytes, checked, False
        self.shuffle, self.seed, self.on_error = shuffle, seed, on_error
        self.log = get_logger(component="data", dataset=self.name)
        self.stats = {"rows": 0, "skipped": 0, "too_long": 0, "oversize": 0, "prompts": 0}
        self.too_long_at: list[str] = []      # where the first prompts dropped for their length are
        self.oversize_at: list[str] = []      # where the first rows larger than max_row_bytes are
        self.prompts: list[Prompt] = self._load()
        self.stats["prompts"] = len(self.prompts)
        self._epoch, self._offset = 0, 0
        self._order_cache: tuple[int, list[int]] | None = None
        self._fingerprint: str | None = None

    @classmethod
    def from_config(cls, cfg: JobConfig, tokenizer, on_error: str = "raise") -> "PromptDataset":
        """The training prompts: --prompt-data, --input-key, --label-key, --metadata-key, --tool-key,
        --apply-chat-template (--apply-chat-template-kwargs), --rollout-max-prompt-len (default: what the model's
        context leaves after --rollout-max-response-len), --rollout-shuffle, --rollout-seed,
        --prompt-data-max-row-bytes; the launcher's checked copy in RUN_DIR/checked-prompts/ when there is one."""
        data = cfg.data
        limit, why = prompt_token_limit(cfg, cfg.rollout.rollout_max_response_len, data.rollout_max_prompt_len)
        return cls(data.prompt_data, tokenizer, input_key=data.input_key, label_key=data.label_key,
                   metadata_key=data.metadata_key, tool_key=data.tool_key,
                   apply_chat_template=data.apply_chat_template, max_prompt_len=limit, max_prompt_len_why=why,
                   shuffle=data.rollout_shuffle, seed=data.rollout_seed, on_error=on_error,
                   apply_chat_template_kwargs=chat_template_kwargs(data),
                   max_row_bytes=data.prompt_data_max_row_bytes, checked=checked_path(cfg.run.run_dir, TRAIN_SET))

    # -------------------------------------------------------------------------------------------- loading
    def _rows(self) -> Iterator[tuple[dict, Any, Any, dict] | tuple[dict, None, str, None]]:
        """(where, prompt, label, metadata) of each good row, or (where, None, problem, None) of a malformed one:
        from the launcher's checked copy when it stands for this file (the file was parsed once, before the job
        started), else from the file itself."""
        keys = RowKeys(self.input_key, self.label_key, self.metadata_key, self.tool_key)
        if self.checked is not None:
            rows = read_checked(self.checked, source_stamp(self.path, keys, self.max_row_bytes))
            if rows is not None:
                self.from_checked = True
                yield from rows
                return
        for row in read_rows(self.path, self.max_row_bytes):
            if row.oversize:
                self.stats["oversize"] += 1
                if len(self.oversize_at) < FIRST_SHOWN:
                    self.oversize_at.append(_loc(self.path, **row.where))
                continue
            if row.problem is not None:
                yield row.where, None, row.problem, None
                continue
            try:
                yield (row.where, *check_row(row.obj, keys))
            except RowProblem as exc:
                yield row.where, None, str(exc), None

    def _load(self) -> list[Prompt]:
        pending: list[tuple[str, Any, Any, dict]] = []   # (source, prompt, label, metadata)
        for where, prompt, label, metadata in self._rows():
            self.stats["rows"] += 1
            if prompt is not None:
                try:
                    pending.append((_loc(self.path, **where), self._render(prompt, metadata), label, metadata))
                    continue
                except RowProblem as exc:
                    label = str(exc)
            self._bad_row(where, label)
        if self.stats["skipped"] > MAX_LOGGED_ROW_WARNINGS:
            self.log.warning("skipped malformed rows", file=self.path, skipped=self.stats["skipped"],
                             logged=MAX_LOGGED_ROW_WARNINGS, rows=self.stats["rows"])
        elif self.stats["skipped"]:
            self.log.warning("skipped malformed rows", file=self.path, skipped=self.stats["skipped"],
                             rows=self.stats["rows"])
        if self.stats["oversize"]:
            self.log.warning("skipped rows larger than --prompt-data-max-row-bytes", file=self.path,
                             count=self.stats["oversize"], max_row_bytes=self.max_row_bytes,
                             rows=first_places(self.oversize_at, self.stats["oversize"]))

        tokens = self._tokenize([p for _, p, _, _ in pending])
        prompts: list[Prompt] = []
        unfiltered_lists = 0
        for (source, prompt, label, metadata), toks in zip(pending, tokens):
            if toks is None:
                unfiltered_lists += 1
                toks = []
            elif self.max_prompt_len is not None and len(toks) > self.max_prompt_len:
                self.stats["too_long"] += 1
                if len(self.too_long_at) < FIRST_SHOWN:
                    self.too_long_at.append(source)
                continue
            prompts.append(Prompt(len(prompts), prompt, toks, label, metadata, source))
        del pending, tokens
        if self.max_prompt_len is not None:
            if self.stats["too_long"]:
                self.log.warning(f"dropped {self.stats['too_long']} prompt(s) longer than {self.max_prompt_len} "
                                 f"tokens ({self.max_prompt_len_why})", file=self.path,
                                 first=first_places(self.too_long_at, self.stats["too_long"]), kept=len(prompts))
            if unfiltered_lists:
                self.log.warning("message-list prompts are not length-filtered without --apply-chat-template",
                                 file=self.path, count=unfiltered_lists)
        if not prompts:
            raise DataError(f"no usable prompts ({self.stats['rows']} rows, {self.stats['skipped']} malformed and "
                            f"skipped, {self.stats['too_long']} longer than max_prompt_len={self.max_prompt_len}, "
                            f"{self.stats['oversize']} larger than {self.max_row_bytes} bytes)", self.path)
        self.log.info("loaded prompts", file=self.path, prompts=len(prompts), rows=self.stats["rows"],
                      skipped=self.stats["skipped"], too_long=self.stats["too_long"],
                      oversize=self.stats["oversize"], checked_before_start=self.from_checked)
        return prompts

    def _bad_row(self, where: dict, problem: str) -> None:
        if self.on_error == "raise":
            raise DataError(problem, self.path, **where)
        self.stats["skipped"] += 1
        if self.stats["skipped"] <= MAX_LOGGED_ROW_WARNINGS:
            self.log.warning("skipping malformed row", where=_loc(self.path, **where), problem=problem)

    def _render(self, prompt: Any, metadata: dict) -> Any:
        """The prompt as the engine gets it: with --apply-chat-template the chat template's text (RowProblem when
        the template fails), else the row's prompt."""
        if not self.apply_chat_template:
            return prompt
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        try:
            kwargs = dict(self.apply_chat_template_kwargs)
            if self.tool_key is not None and metadata.get("tools") is not None:
                kwargs["tools"] = metadata["tools"]
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
        except Exception as exc:
            raise RowProblem(f"chat template failed: {type(exc).__name__}: {exc}") from None
        if not isinstance(text, str):   # some processors return a list for batched input
            if isinstance(text, list) and len(text) == 1 and isinstance(text[0], str):
                text = text[0]
            else:
                raise RowProblem(f"chat template returned {_tname(text)}, expected a string")
        return text

    def _tokenize(self, prompts: list) -> list[list[int] | None]:
        out: list[list[int] | None] = [None] * len(prompts)
        if self.tokenizer is None:
            return [[] if isinstance(p, str) else None for p in prompts]
        idx = [i for i, p in enumerate(prompts) if isinstance(p, str)]
        for start in range(0, len(idx), _TOKENIZE_CHUNK):
            chunk = idx[start:start + _TOKENIZE_CHUNK]
            ids = self.tokenizer([prompts[i] for i in chunk], add_special_tokens=False)["input_ids"]
            for i, t in zip(chunk, ids):
                out[i] = [int(x) for x in t]
        return out

    # -------------------------------------------------------------------------------------------- access
    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, i: int) -> Prompt:
        return self.prompts[i]

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def offset(self) -> int:
        return self._offset

    def order(self, epoch: int) -> list[int]:
        """Prompt indices in the order epoch `epoch` visits them."""
        if self._order_cache is not None and self._order_cache[0] == epoch:
            return self._order_cache[1]
        perm = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(perm)
        self._order_cache = (epoch, perm)
        return perm

    def next_prompts(self, k: int) -> list[Prompt]:
        """The next `k` prompts, moving on to the next epoch (reshuffled) when one ends."""
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        n = len(self.prompts)
        out: list[Prompt] = []
        while len(out) < k:
            take = min(k - len(out), n - self._offset)
            order = self.order(self._epoch)
            out.extend(self.prompts[i] for i in order[self._offset:self._offset + take])
            self._offset += take
            if self._offset >= n:
                self._epoch, self._offset = self._epoch + 1, 0
        return out

    def all_prompts(self) -> list[Prompt]:
        """Every prompt once, in file order (eval); does not move the position."""
        return list(self.prompts)

    def __iter__(self) -> Iterator[Prompt]:
        """Prompts forever (epoch after epoch), advancing the position."""
        while True:
            yield self.next_prompts(1)[0]

    # -------------------------------------------------------------------------------------------- state
    def fingerprint(self) -> str:
        """A hash of the prompts and labels (to notice that the data changed under a saved position)."""
        if self._fingerprint is None:
            h = hashlib.sha1()
            for p in self.prompts:
                h.update(json.dumps([p.prompt, p.label], sort_keys=True, default=str).encode())
                h.update(b"\0")
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    def state_dict(self) -> dict:
        return {"epoch": self._epoch, "offset": self._offset, "num_prompts": len(self.prompts),
                "shuffle": self.shuffle, "seed": self.seed, "fingerprint": self.fingerprint()}

    def load_state_dict(self, state: Mapping, strict: bool = True) -> None:
        """Continue from a saved position. With `strict`, data that differs from what the state was saved with
        (another number of prompts, or other contents) is a DataError; a different seed or shuffle is warned
        about and the current settings win."""
        n = len(self.prompts)
        missing = [k for k in ("epoch", "offset") if k not in state]
        if missing:
            raise DataError(f"dataset state lacks {missing}", self.path)
        if strict and state.get("num_prompts", n) != n:
            raise DataError(f"the saved position is for {state['num_prompts']} prompts, the data now has {n}: "
                            "the prompt data changed since the state was saved", self.path)
        if strict and state.get("fingerprint") not in (None, self.fingerprint()):
            raise DataError("the prompt data changed since the state was saved (same number of prompts, other "
                            "contents); pass strict=False to continue anyway", self.path)
        if (state.get("shuffle", self.shuffle), state.get("seed", self.seed)) != (self.shuffle, self.seed):
            self.log.warning("dataset order settings differ from the saved state; using the current ones",
                             saved_shuffle=state.get("shuffle"), saved_seed=state.get("seed"),
                             shuffle=self.shuffle, seed=self.seed)
        epoch, offset = int(state["epoch"]), int(state["offset"])
        if epoch < 0 or not 0 <= offset <= n:
            raise DataError(f"invalid saved position epoch={epoch} offset={offset} for {n} prompts", self.path)
        if offset == n:
            epoch, offset = epoch + 1, 0
        self._epoch, self._offset = epoch, offset   # (older states' next_group_index is not used)


# ----------------------------------------------------------------------------------------------- eval sets

class EvalDatasets(Mapping):
    """The eval sets by name (insertion order): never shuffled; from the job's config, only prompts longer than the
    model's context can take (after --eval-max-response-len) are dropped."""

    def __init__(self, specs: list[tuple[str, str]] | list[str] | None, tokenizer=None, **dataset_kwargs):
        if specs and all(isinstance(s, str) for s in specs):
            specs = parse_eval_prompt_data(list(specs))
        dataset_kwargs.setdefault("shuffle", False)
        self.datasets: dict[str, PromptDataset] = {
            name: PromptDataset(path, tokenizer, name=name, **dataset_kwargs) for name, path in (specs or [])}

    @classmethod
    def from_config(cls, cfg: JobConfig, tokenizer, on_error: str = "raise") -> "EvalDatasets":
        """--eval-config's sets (each with its own keys), else --eval-prompt-data's, with --eval-input-key /
        --eval-label-key (default: --input-key / --label-key)."""
        data, eval_cfg = cfg.data, cfg.eval
        limit, why = prompt_token_limit(cfg, eval_cfg.eval_max_response_len or cfg.rollout.rollout_max_response_len)
        out = cls(None)
        for es in eval_sets(cfg):
            keys = eval_row_keys(cfg, es)
            out.datasets[es.name] = PromptDataset(
                es.path, tokenizer, name=es.name, input_key=keys.input_key, label_key=keys.label_key,
                metadata_key=keys.metadata_key, tool_key=keys.tool_key, apply_chat_template=data.apply_chat_template,
                on_error=on_error, apply_chat_template_kwargs=chat_template_kwargs(data), shuffle=False,
                max_prompt_len=limit, max_prompt_len_why=why, max_row_bytes=data.prompt_data_max_row_bytes,
                checked=checked_path(cfg.run.run_dir, EVAL_SET + es.name))
        return out

    def __getitem__(self, name: str) -> PromptDataset:
        try:
            return self.datasets[name]
        except KeyError:
            raise KeyError(f"no eval dataset {name!r} (have {list(self.datasets)})") from None

    def __iter__(self):
        return iter(self.datasets)

    def __len__(self) -> int:
        return len(self.datasets)


# ----------------------------------------------------------------------------------------------- from the flags

def chat_template_kwargs(data: DataSection) -> dict:
    """--apply-chat-template-kwargs as a dict (the config checked it is a JSON object)."""
    return json_object(data.apply_chat_template_kwargs or "{}", "--apply-chat-template-kwargs")


def load_tokenizer(cfg: JobConfig):
    """The tokenizer of --hf-checkpoint (a directory, or a tiny:/smollm2: spec made in the model cache), without
    importing torch where its files allow (slime_actors/tokenizer.py)."""
    from slime_actors.tokenizer import load_tokenizer as load_dir_tokenizer
    spec = cfg.model.hf_checkpoint
    if not os.path.isdir(spec):
        from slime_actors.models.resolve import model_cache, resolve_checkpoint
        spec = resolve_checkpoint(spec, model_cache(cfg.run.run_dir))
    return load_dir_tokenizer(spec)


def load_prompt_data(cfg: JobConfig, tokenizer=None, on_error: str = "raise"
                     ) -> tuple[PromptDataset | None, EvalDatasets]:
    """(training prompts or None without --prompt-data, eval sets) from the job's config; the tokenizer is loaded
    from --hf-checkpoint unless given."""
    if tokenizer is None:
        tokenizer = load_tokenizer(cfg)
    train = PromptDataset.from_config(cfg, tokenizer, on_error=on_error) if cfg.data.prompt_data else None
    return train, EvalDatasets.from_config(cfg, tokenizer, on_error=on_error)


TRAIN_SET, EVAL_SET = "train", "eval-"   # names of the checked copies: train.msgpack, eval-NAME.msgpack


def train_row_keys(cfg: JobConfig) -> RowKeys:
    """Where the training rows keep their parts (--input-key, --label-key, --metadata-key, --tool-key)."""
    data = cfg.data
    return RowKeys(data.input_key, data.label_key, data.metadata_key, data.tool_key)


def eval_row_keys(cfg: JobConfig, es) -> RowKeys:
    """Where a held-out set's rows keep their parts: the set's own keys (--eval-config), else --eval-input-key /
    --eval-label-key, else the training ones."""
    data, eval_cfg = cfg.data, cfg.eval
    return RowKeys(es.input_key or eval_cfg.eval_input_key or data.input_key,
                   es.label_key or eval_cfg.eval_label_key or data.label_key, data.metadata_key, data.tool_key)


def checked_path(run_dir: str | os.PathLike, name: str) -> str:
    """Where the launcher leaves the checked rows of a prompt file for the buffer
    (RUN_DIR/checked-prompts/NAME.msgpack)."""
    return os.path.join(os.fspath(run_dir), "checked-prompts", f"{name}.msgpack")


def prompt_token_limit(cfg: JobConfig, response_len: int, given: int | None = None) -> tuple[int | None, str]:
    """(the most tokens a prompt may have, why): `given` (--rollout-max-prompt-len), else what the model's context
    (--sglang-context-length, else config.json's max_position_embeddings) leaves after `response_len` tokens of
    response -- a longer prompt cannot be generated from; (None, "") when the context is not known."""
    if given is not None:
        return given, "--rollout-max-prompt-len"
    context, where = model_context(cfg)
    if context is None:
        return None, ""
    return context - response_len, f"the model's context of {context} tokens ({where}) less {response_len} for " \
                                   "the response; --rollout-max-prompt-len sets another bound"


def model_context(cfg: JobConfig) -> tuple[int | None, str]:
    """(the engines' context length in tokens, where it comes from), or (None, "") when it is not known here."""
    from slime_actors.backends.sglang_launch import LaunchFlags
    from slime_actors.slime_compat import hf_config
    given = LaunchFlags.parse(cfg.engine.sglang_args).value("--context-length")
    if given:
        try:
            return int(given), "--sglang-context-length"
        except ValueError:
            return None, ""
    conf, path = hf_config(cfg.model.hf_checkpoint)
    value = (conf or {}).get("max_position_embeddings") or ((conf or {}).get("text_config") or {}).get(
        "max_position_embeddings")
    return (int(value), f"max_position_embeddings in {path}") if isinstance(value, int) and value > 0 else (None, "")
