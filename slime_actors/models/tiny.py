"""A tiny Llama with a word-level tokenizer, made locally (no downloads): the embedded default's model.

    make_tiny_model("/tmp/tiny")          # config.json, model.safetensors, tokenizer.json, ...
    AutoModelForCausalLM.from_pretrained("/tmp/tiny"); AutoTokenizer.from_pretrained("/tmp/tiny")

Vocabulary: <pad> <s> </s>, the digits 0-9, and a few words and symbols used by the example tasks. Tokens are
separated by spaces ("3 + 4 ="). Weights are random (seeded), so the model starts knowing nothing.

`tiny:search` (VOCABULARIES["search"]) adds, after those, the words of the search task (examples/search): the
Search-R1 tags as single tokens (`<search>`, `</search>`, `<information>`, ...), made-up entity names that are no
word of any language, and the attributes asked about. The other tiny models keep the vocabulary above unchanged.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..json_files import read_small_json

SPECIALS = ["<pad>", "<s>", "</s>"]
WORDS = [str(d) for d in range(10)] + ["+", "-", "*", "=", "?", ":", ",", ".", "max", "min", "first", "last",
                                        "sum", "of", "is", "the", "answer", "user", "assistant", "call", "tool",
                                        "result", "<unk>"]
# the search task's words (slime_actors/search/corpus.py builds its tiny world from them)
SEARCH_TAGS = ["<search>", "</search>", "<information>", "</information>", "<answer>", "</answer>"]
SEARCH_ENTITIES = ["zorvik", "quelby", "mirtax", "dovrel", "kaspyn", "yultor", "fenwix", "gorbex", "plimsa",
                   "tarvok", "wexlin", "joskar", "nubrel", "hadrix", "velmoq", "crintu", "zabuno", "lortez",
                   "miskov", "pyndra", "obrix", "skelvo", "thrunk", "vazzel", "kwimbo", "drulex", "fossik",
                   "gwendix", "huzzar", "ixolt", "jembra", "klovix"]
SEARCH_ATTRIBUTES = ["age", "home", "color", "size"]
VOCABULARIES = {"search": SEARCH_TAGS + SEARCH_ENTITIES + SEARCH_ATTRIBUTES + ["doc"]}
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}assistant :{% endif %}")


def tiny_config(vocab_size: int, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                intermediate: int = 128, max_pos: int = 256):
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       max_position_embeddings=max_pos, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="float32")


def words_of(name: str | None) -> list[str]:
    """The vocabulary (after the specials) of tiny:NAME: WORDS, plus VOCABULARIES[NAME] when there is one."""
    return WORDS + VOCABULARIES.get(name or "", [])


def make_tokenizer(words: list[str] | None = None):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    vocab = {tok: i for i, tok in enumerate(SPECIALS + (WORDS if words is None else words))}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    from tokenizers import decoders
    tk.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def make_tiny_model(path: str | os.PathLike, seed: int = 0, words: list[str] | None = None,
                    **config_overrides) -> Path:
    """Write a tiny random Llama and its tokenizer to `path` (idempotent for the same seed, words and config).
    `words`: the vocabulary after the specials (default WORDS; `words_of(name)` for tiny:NAME)."""
    words = WORDS if words is None else words
    path = Path(path)
    stamp = path / "slime_tiny.json"
    want = {"seed": seed, **config_overrides, "words": words}
    if read_small_json(stamp) == want:
        return path     # (before importing torch and transformers: seconds of every job's start-up)
    import torch
    from transformers import LlamaForCausalLM
    path.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(words)
    cfg = tiny_config(len(tok), **config_overrides)
    g = torch.random.fork_rng(devices=[])
    with g:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    model.generation_config.pad_token_id = 0
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    stamp.write_text(json.dumps(want))
    return path
