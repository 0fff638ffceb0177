"""Load a checkpoint directory's tokenizer, without importing torch where transformers allows it.

    from slime_actors.tokenizer import load_tokenizer
    tok = load_tokenizer("path/to/hf_dir")      # the class AutoTokenizer.from_pretrained(dir) would give

`AutoTokenizer.from_pretrained` reads the model's config.json through transformers' configuration classes, and those
import torch (transformers 5: configuration_utils -> modeling_rope_utils): 2.6 CPU-seconds and ~210 MiB of PSS
(docs/performance.md) in a process -- the buffer, a rollout worker -- that needs nothing of torch. The tokenizer
itself (tokenizer.json, the `tokenizers` library) does not. So this module takes AutoTokenizer's decision itself from the directory's files,
read as plain JSON, and loads that class directly:

* the class named by tokenizer_config.json's `tokenizer_class` (a `...Fast` name as the same class without
  `Fast`, as transformers 5 does), when transformers defines it as a `tokenizers`-backed class; the generic names
  (`TokenizersBackend`, `PreTrainedTokenizerFast`, `PreTrainedTokenizer`) or a name transformers does not know give
  `TokenizersBackend` (= `PreTrainedTokenizerFast`), as AutoTokenizer does;
* only where that is AutoTokenizer's answer for sure. It falls back to AutoTokenizer itself (logged at debug level,
  with why) for: transformers other than 5.x (another decision tree), no tokenizer.json (a slow-only or
  sentencepiece tokenizer), no tokenizer_config.json or no `tokenizer_class` in it, custom code (`auto_map` in
  either file: AutoTokenizer refuses it, as it must -- never trust_remote_code), a class AutoTokenizer replaces by
  the model type's own (the model types transformers lists as shipping a wrong class, Mistral's backend, a
  LlamaTokenizer name over a byte-level tokenizer.json, the checkpoint names transformers forces to the generic
  class) or a class that is not `tokenizers`-backed. The model types' table is read from transformers' own
  tokenization_auto.py (with `ast`, nothing of it run), so it follows the installed version; a file this module
  cannot read that way means the fallback.

The directory's files are hostile input: a tokenizer_config.json or config.json that is not a JSON object, or a
`tokenizer_class` that is not a string, is refused with an error naming the file (TokenizerFileError, a
StartupError: the job stops with it rather than restarting the actor), whichever path would have loaded it.
tests/test_tokenizer_load.py checks that the result encodes, decodes and applies the chat template as
AutoTokenizer's does, and that no torch is imported.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from .config import StartupError
from .json_files import parse_json
from .log import get_logger

__all__ = ["TokenizerFileError", "load_tokenizer", "fast_tokenizer_class", "decode_text"]

GENERIC = {"TokenizersBackend", "PreTrainedTokenizerFast", "PreTrainedTokenizer", "PythonBackend"}


class TokenizerFileError(StartupError, ValueError):
    """A checkpoint's tokenizer_config.json or config.json that cannot be what it claims to be: no restart of the
    actor that loads it changes that (a StartupError: the launcher stops the job with this message)."""


def load_tokenizer(path: str | os.PathLike) -> Any:
    """The tokenizer of the Hugging Face directory `path`: the class AutoTokenizer would choose, loaded without
    importing torch where the files allow it (the module's docstring says when); else AutoTokenizer's, without
    remote code."""
    path = str(path)
    cls, why = fast_tokenizer_class(path)
    if cls is not None:
        return cls.from_pretrained(path)
    get_logger(component="tokenizer").debug("tokenizer through AutoTokenizer (imports torch)", path=path, why=why)
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path, trust_remote_code=False)


def decode_text(tokenizer: Any, ids: list[int]) -> str:
    """`tokenizer.decode(ids, skip_special_tokens=True)` -- the same text -- without what transformers does first on
    every call: `decode` converts its argument with `to_py_obj`, which tests each id's type in Python (~15 us of the
    ~30 a 128-token response takes on a 2-vCPU VM), then calls the class's `_decode`. A rollout worker decodes each
    response as its group comes back, and at the end of a rollout on a GPU the last groups come back together: their
    decoding is on the step's path (docs/performance.md, *the end of a rollout*). So for a list, where the class's
    `decode` is transformers 5's own (`PreTrainedTokenizerBase.decode`: to_py_obj gives a list of the same ids, and
    it is not batched input), `_decode` is called directly; anything else -- another class's decode, another
    transformers, ids in another container, a call that raises -- goes through `tokenizer.decode`.
    tests/test_tokenizer_load.py checks both give the same text, ids of every kind included."""
    direct = _direct_decode(type(tokenizer)) if type(ids) is list else None
    if direct is not None:
        try:
            return direct(tokenizer, ids, skip_special_tokens=True)
        except Exception:  # noqa: BLE001 -- decode says what is wrong with these ids, in its own words
            pass
    return tokenizer.decode(ids, skip_special_tokens=True)


_DIRECT: dict[type, Callable[..., str] | None] = {}


def _direct_decode(cls: type) -> Callable[..., str] | None:
    """The `_decode` that `cls.decode` would call for a list of ids, when that is certain (see decode_text)."""
    if cls in _DIRECT:
        return _DIRECT[cls]
    base = sys.modules.get("transformers.tokenization_utils_base")   # (not loaded: not a transformers tokenizer)
    version = getattr(sys.modules.get("transformers"), "__version__", "")
    ptb = getattr(base, "PreTrainedTokenizerBase", None)
    own = getattr(cls, "_decode", None)
    ok = ptb is not None and str(version).startswith("5.") and issubclass(cls, ptb) \
        and getattr(cls, "decode", None) is ptb.decode and own is not None and own is not ptb._decode
    _DIRECT[cls] = direct = own if ok else None
    return direct


def fast_tokenizer_class(path: str | os.PathLike) -> tuple[type[Any] | None, str]:
    """(the tokenizer class to load `path` with, "") when it is AutoTokenizer's choice for sure and needs no torch;
    else (None, why not). Raises TokenizerFileError for a malformed tokenizer_config.json or config.json."""
    d = Path(path)
    tok_cfg = _json_object(d / "tokenizer_config.json")
    model_cfg = _json_object(d / "config.json") or {}   # (none: AutoTokenizer takes a config of no model type)
    if tok_cfg is None:
        return None, "no tokenizer_config.json"
    name = tok_cfg.get("tokenizer_class")
    if name is not None and not isinstance(name, str):
        raise TokenizerFileError(f"{d / 'tokenizer_config.json'}: tokenizer_class must be a string, "
                                 f"not {type(name).__name__}")
    if not (d / "tokenizer.json").is_file():
        return None, "no tokenizer.json (a slow-only tokenizer)"
    if "auto_map" in tok_cfg or "auto_map" in model_cfg:
        return None, "custom code (auto_map)"
    if not name:
        return None, "no tokenizer_class in tokenizer_config.json"
    import transformers
    if not transformers.__version__.startswith("5."):
        return None, f"transformers {transformers.__version__} (the decision is replicated for 5.x)"
    tables = _auto_tables()
    if tables is None:
        return None, "transformers' tokenization_auto.py tables unreadable"
    mapping, wrong_hub_class, forced_ids = tables
    model_type = model_cfg.get("model_type")
    model_type = model_type if isinstance(model_type, str) else ""
    names_or_paths = [str(path), model_cfg.get("_name_or_path")]
    if any(isinstance(n, str) and fnmatch.fnmatch(n.lower(), p) for n in names_or_paths for p in forced_ids):
        return None, "a checkpoint name transformers special-cases"
    stem = name.removesuffix("Fast")
    registered = (mapping.get(model_type) or "").removesuffix("Fast")
    if registered == "MistralCommonBackend":
        return None, "a Mistral model type (AutoTokenizer may pick mistral-common)"
    if stem == "LlamaTokenizer":
        return None, "LlamaTokenizer (AutoTokenizer checks tokenizer.json's pre-tokenizer)"
    if model_type in wrong_hub_class and registered and registered != stem and registered not in GENERIC:
        return None, f"model type {model_type}: AutoTokenizer uses {registered} whatever the file names"
    from transformers import TokenizersBackend
    if stem in GENERIC:
        return TokenizersBackend, ""
    if not stem.endswith("Tokenizer"):
        return None, f"{name} is not a tokenizer class name"
    cls = getattr(transformers, stem, None) or getattr(transformers, stem + "Fast", None)
    if cls is None:
        return TokenizersBackend, ""     # (AutoTokenizer: a class it does not find -> TokenizersBackend)
    if not (isinstance(cls, type) and issubclass(cls, TokenizersBackend)
            and cls.__module__.startswith("transformers.")):
        return None, f"{name} is not a tokenizers-backed class of transformers"
    return cls, ""


def _json_object(p: Path) -> dict | None:
    """The JSON object in file `p`, None when there is no such file; TokenizerFileError naming it otherwise."""
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerFileError(f"{p}: cannot be read ({e})") from None
    try:
        obj = parse_json(text)
    except json.JSONDecodeError as e:
        raise TokenizerFileError(f"{p} is not a valid JSON file ({e})") from None
    if not isinstance(obj, dict):
        raise TokenizerFileError(f"{p}: must hold a JSON object, not {type(obj).__name__}")
    return obj


@functools.lru_cache(maxsize=1)
def _auto_tables() -> tuple[dict[str, str | None], set[str], list[str]] | None:
    """From transformers' models/auto/tokenization_auto.py, read with ast (importing it imports torch):
    TOKENIZER_MAPPING_NAMES (model type -> class name, as the installed extras make it),
    MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS, MODEL_IDS_TO_TOKENIZERS_BACKEND. None if any is not found in the
    shape expected."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    src = Path(list(spec.submodule_search_locations)[0]) / "models" / "auto" / "tokenization_auto.py"
    try:
        tree = ast.parse(src.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    found: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    found[t.id] = node.value
    try:
        mapping = _mapping(found["TOKENIZER_MAPPING_NAMES"])
        wrong = ast.literal_eval(found["MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS"])
        forced = ast.literal_eval(found["MODEL_IDS_TO_TOKENIZERS_BACKEND"])
    except (KeyError, ValueError, TypeError, SyntaxError):
        return None
    if not (isinstance(wrong, set) and isinstance(forced, list) and mapping is not None):
        return None
    for model_type in wrong:                  # (what the module does after the set: such a type maps to the generic)
        mapping.setdefault(model_type, "TokenizersBackend")
    return mapping, wrong, forced


def _mapping(node: ast.expr) -> dict[str, str | None] | None:
    """OrderedDict[...]([("type", "Class" if is_x_available() else None), ...]) -> {type: Class or None}."""
    if not (isinstance(node, ast.Call) and len(node.args) == 1 and isinstance(node.args[0], ast.List)):
        return None
    out: dict[str, str | None] = {}
    for item in node.args[0].elts:
        if not (isinstance(item, ast.Tuple) and len(item.elts) == 2 and isinstance(item.elts[0], ast.Constant)
                and isinstance(item.elts[0].value, str)):
            return None
        known, value = _value(item.elts[1])
        if not known:
            return None
        out[item.elts[0].value] = value
    return out


def _value(node: ast.expr) -> tuple[bool, str | None]:
    """(True, a constant string or None), or `A if is_x_available() else B` evaluated with transformers.utils'
    is_x_available; (False, None) for anything else."""
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, str)):
        return True, node.value
    if (isinstance(node, ast.IfExp) and isinstance(node.test, ast.Call) and not node.test.args
            and isinstance(node.test.func, ast.Name) and node.test.func.id.startswith("is_")
            and node.test.func.id.endswith("_available")):
        from transformers import utils
        check = getattr(utils, node.test.func.id, None)
        if not callable(check):
            return False, None
        return _value(node.body if check() else node.orelse)
    return False, None
