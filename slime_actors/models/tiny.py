"""A tiny Llama with a word-level tokenizer, made locally (no downloads): the embedded default's model.

    make_tiny_model("/tmp/tiny")          # config.json, model.safetensors, tokenizer.json, ...
    AutoModelForCausalLM.from_pretrained("/tmp/tiny"); AutoTokenizer.from_pretrained("/tmp/tiny")

Vocabulary: <pad> <s> </s>, the digits 0-9, and a few words and symbols used by the example tasks. Tokens are
separated by spaces ("3 + 4 ="). Weights are random (seeded), so the model starts knowing nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

SPECIALS = ["<pad>", "<s>", "</s>"]
WORDS = [str(d) for d in range(10)] + ["+", "-", "*", "=", "?", ":", ",", ".", "max", "min", "first", "last",
                                        "sum", "of", "is", "the", "answer", "user", "assistant", "call", "tool",
                                        "result", "<unk>"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}assistant :{% endif %}")


def tiny_config(vocab_size: int, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                intermediate: int = 128, max_pos: int = 256):
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       max_position_embeddings=max_pos, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="float32")


def make_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    from tokenizers import decoders
    tk.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def make_tiny_model(path: str | os.PathLike, seed: int = 0, **config_overrides) -> Path:
    """Write a tiny random Llama and its tokenizer to `path` (idempotent for the same seed and config)."""
    import torch
    from transformers import LlamaForCausalLM
    path = Path(path)
    stamp = path / "slime_tiny.json"
    want = {"seed": seed, **config_overrides, "words": WORDS}
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return path
    path.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer()
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
