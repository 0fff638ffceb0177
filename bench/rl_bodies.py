"""What decoding the RL loop's message bodies costs the actor that receives them, and how much of it is the check
that no msgpack timestamp hides in a body (slime_actors/mailbox/codec.py `_reject_timestamps`).

    .venv/bin/python bench/rl_bodies.py [--rounds 7]

The bodies are the loop's large ones, made like a run's (token ids drawn from a 49k vocabulary, log-probs as
float64, 60 prompt and ~100 response tokens a sample): a reward worker's `score` ask (one group of 8 samples), a
rollout worker's `get_work` reply (16 groups of 8), a trainer's `get_batch` reply (128 samples); and a rollout worker's
`submit` and the batch with 190 response tokens a sample (as in the H100 comparisons), as lists and packed as the
trainer asks for it (types.pack_rows). Each is decoded
with `codec.decode_body` as the mailbox does, and its timestamp check run alone three ways, side by side in one run:
today's (a list of numbers summed in C, a map's item types collected in C, only nested containers walked), the one
before it (a regular expression over the body's bytes for a timestamp's byte patterns, then every container's item
types collected) and the first (a Python call per item); the two older ones are kept here as references. The best of
`--rounds` rounds is printed (milliseconds per body).

The check runs when the body's bytes hold an 0xff (a timestamp's ext type byte) and, for a body of 16 KB or more, may
hold a timestamp's header (`_may_hold_timestamp`: a fixext or ext header of a timestamp's length before an 0xff;
numpy looks at the bytes before each one). Float64 log-probs and token ids hold an 0xff almost always, such a header
far less often (the table says which bodies are checked, and what the screen costs).

A second table follows the trainer's batch (128 samples, 50 and 190 response tokens) each way from the buffer to the
update: built, encoded, decoded, then made into the update's per-sample tensors (rl_update's `_prepare`, after
`unpack_batch` for the packed one). A third, a group's `score` ask whole and without its token lists (what a rollout
worker sends a built-in reward that reads none of them).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import time

import msgpack

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from slime_actors.mailbox import codec  # noqa: E402
from slime_actors.types import Sample, batch_from_samples  # noqa: E402


def per_item_walk(obj, depth: int = 0) -> None:
    """The check before 2026-12-06: a Python call for every item of every list and map."""
    if type(obj) is msgpack.Timestamp:
        raise codec.ProtocolError("timestamp")
    if depth > 512:
        return
    if type(obj) is dict:
        for k, v in obj.items():
            per_item_walk(k, depth + 1)
            per_item_walk(v, depth + 1)
    elif type(obj) is list:
        for v in obj:
            per_item_walk(v, depth + 1)


TIMESTAMP_MARK = re.compile(rb"\xd6\xff|\xd7\xff|\xc7[\x04\x08\x0c]\xff|\xc8\x00[\x04\x08\x0c]\xff"
                            rb"|\xc9\x00\x00\x00[\x04\x08\x0c]\xff")


def types_walk(obj, depth: int = 0) -> None:
    """The check before this one: every container's item types collected in C, nested containers walked."""
    if type(obj) is msgpack.Timestamp:
        raise codec.ProtocolError("timestamp")
    if depth > 512:
        return
    if type(obj) is dict:
        kinds = set(map(type, obj))
        kinds.update(map(type, obj.values()))
    elif type(obj) is list:
        kinds = set(map(type, obj))
    else:
        return
    if msgpack.Timestamp in kinds:
        raise codec.ProtocolError("timestamp")
    if dict in kinds or list in kinds:
        for v in list(obj) + list(obj.values()) if type(obj) is dict else obj:
            if type(v) is dict or type(v) is list:
                types_walk(v, depth + 1)


def regex_then_types(data: bytes, obj) -> None:
    """The check before this one, as decode_body ran it: the body's bytes searched for a timestamp's byte patterns,
    the walk only when one is found."""
    if b"\xff" in data and TIMESTAMP_MARK.search(data):
        types_walk(obj)


def sample(rng: random.Random, i: int, generated: bool = True, tokens: int = 0) -> Sample:
    s = Sample(index=i, group_index=i // 8, label=str(rng.randint(20, 198)),
               prompt="<|im_start|>user\nWhat is 87 + 39? Put your final answer in \\boxed{}.<|im_end|>\n")
    s.prompt_tokens = [rng.randrange(49152) for _ in range(60)]
    if generated:
        n = tokens or rng.randint(8, 128)
        s.response = "87 + 39 = 126" if n < 20 else "To solve this problem, we need to add 87 and 39. " * (n // 12)
        s.response_tokens = [rng.randrange(49152) for _ in range(n)]
        s.loss_mask = [1] * n
        s.rollout_log_probs = [-rng.expovariate(2.0) for _ in range(n)]
        s.reward = float(rng.random() < 0.4)
    return s


def bodies(seed: int = 0) -> dict[str, bytes]:
    rng = random.Random(seed)
    scored = [sample(rng, i) for i in range(128)]
    fresh = [sample(rng, i, generated=False) for i in range(128)]
    work = {"groups": [{"work_id": f"train:{g}", "rollout_id": 3, "kind": "train", "attempt": 0,
                        "sampling_params": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 128},
                        "samples": [s.to_wire() for s in fresh[g * 8:(g + 1) * 8]]} for g in range(16)]}
    long = [sample(rng, i, tokens=190) for i in range(128)]   # the H100 comparison's length (docs/peer-comparison.md)
    return {"score ask (8 samples)": msgpack.packb({"samples": [s.to_wire() for s in scored[:8]], "group": False}),
            "get_work reply (16 groups)": msgpack.packb(work),
            "get_batch reply (128 samples)": msgpack.packb(batch_from_samples(scored)),
            "submit ask (8 samples of 190 tokens)": msgpack.packb({"worker": "rollout/0", "work_id": "train-3",
                                                                   "samples": [s.to_wire() for s in long[:8]]}),
            "get_batch reply (128 samples of 190 tokens)": msgpack.packb(batch_from_samples(long)),
            "get_batch reply, packed as the trainer asks (the same)": msgpack.packb(batch_from_samples(long,
                                                                                            packed=True))}


def best(fn, rounds: int, n: int) -> float:
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t) / n)
    return min(out) * 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    print(f"# decoding the RL loop's bodies ({time.strftime('%Y-%m-%d %H:%M %Z')}, {os.cpu_count()} CPUs, "
          f"msgpack {msgpack.version}); ms per body, best of {args.rounds} rounds")
    print("| body | bytes | checked (a timestamp's header may be in its bytes) | decode_body | the screen "
          "(_may_hold_timestamp) | timestamp check: per item (first) | bytes searched, then item types (before) | "
          "numbers summed (now) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for name, data in bodies().items():
        obj = msgpack.unpackb(data)
        n = max(5, int(2e5 // len(data)))
        checked = b"\xff" in data and (len(data) < codec.SCREEN_FROM or codec._may_hold_timestamp(data))
        dec = best(lambda: codec.decode_body(data, []), args.rounds, n)
        screen = best(lambda: codec._may_hold_timestamp(data), args.rounds, n)
        first = best(lambda: per_item_walk(obj), args.rounds, n)
        before = best(lambda: regex_then_types(data, obj), args.rounds, n)
        new = best(lambda: codec._reject_timestamps(obj), args.rounds, n)
        print(f"| {name} | {len(data):,} | {'yes' if checked else 'no'} | {dec:.3f} | {screen:.3f} | {first:.3f} | "
              f"{before:.3f} | {new:.3f} |")
    batch_ways(args.rounds)
    score_ways(args.rounds)


def header(title: str, rounds: int, columns: list[str]) -> None:
    """A table's title and header: response tokens, way, bytes, then `columns` (ms)."""
    print()
    print(f"# {title} ({time.strftime('%Y-%m-%d %H:%M %Z')}); ms, best of {rounds} rounds")
    print("| response tokens | way | bytes | " + " | ".join(columns) + " |")
    print("|---:|---|---:|" + "---:|" * len(columns))


def score_ways(rounds: int) -> None:
    """A group's `score` ask (8 samples) whole and without its token lists -- what a rollout worker sends a built-in
    reward that reads none of them (actors/rollout.py `_score_wire`): made and encoded by the rollout worker,
    decoded and made into Samples by the reward worker."""
    from slime_actors.actors.rollout import TOKEN_FIELDS
    header("a group's score ask, 8 samples: whole and without the token lists", rounds,
           ["made and encoded (rollout worker)", "decoded, Samples (reward worker)", "in all"])
    for tokens in (50, 190):
        rng = random.Random(tokens)
        samples = [sample(rng, i, tokens=tokens) for i in range(8)]
        for lean in (False, True):
            def made() -> dict:
                wires = [s.to_wire() for s in samples]
                if lean:
                    for w in wires:
                        for key in TOKEN_FIELDS:
                            del w[key]
                return {"samples": wires, "group": False}
            data = codec.encode_body(made())[0]
            send = best(lambda: codec.encode_body(made()), rounds, 50)
            take = best(lambda: [Sample.from_wire(x) for x in codec.decode_body(data, [])["samples"]], rounds, 50)
            print(f"| {tokens} | {'without token lists' if lean else 'whole'} | {len(data):,} | {send:.3f} | "
                  f"{take:.3f} | {send + take:.3f} |")


def batch_ways(rounds: int) -> None:
    """The trainer's batch as lists (msgpack numbers) and packed (types.pack_rows), each way through its steps: built
    by the buffer, encoded, decoded by the trainer, then made into the update's tensors (rl_update's _prepare, after
    backends/batching.py `unpack_batch` for the packed one)."""
    from slime_actors.backends.batching import unpack_batch
    from slime_actors.backends.rl_update import _prepare
    header("the trainer's batch, 128 samples of 60 prompt tokens: as lists and packed", rounds,
           ["build (buffer)", "encode", "decode (trainer)", "its fetch (the three)", "tensors for the update", "in all"])
    for tokens in (50, 190):
        rng = random.Random(tokens)
        samples = [sample(rng, i, tokens=tokens) for i in range(128)]
        for packed in (False, True):
            batch = batch_from_samples(samples, packed=packed)
            data = codec.encode_body(batch)[0]
            build = best(lambda: batch_from_samples(samples, packed=packed), rounds, 20)
            enc = best(lambda: codec.encode_body(batch), rounds, 20)
            dec = best(lambda: codec.decode_body(data, []), rounds, 20)
            tensors = max(0.0, best(lambda: _prepare(unpack_batch(codec.decode_body(data, []))), rounds, 20) - dec)
            fetch = build + enc + dec
            print(f"| {tokens} | {'packed' if packed else 'lists'} | {len(data):,} | {build:.3f} | {enc:.3f} | "
                  f"{dec:.3f} | {fetch:.3f} | {tensors:.3f} | {fetch + tensors:.3f} |")


if __name__ == "__main__":
    main()
