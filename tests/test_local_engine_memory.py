"""The local engine's host memory (bench/engine_memory.py measures it): a flattened weight bucket received in place
-- its buffer becomes the parameters' storage, a later sync of the same layout goes straight into it, no receive
buffer is kept -- and malloc trimmed when a batch empties; the same tokens and log-probs as the engine that copies
(--keep-host-memory). In-process engines on CPU with the tiny model, a gloo group with a sender thread."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
import torch

from slime_actors.backends.local_engine.cli import parse_args
from slime_actors.backends.local_engine.params import SamplingParams
from slime_actors.backends.local_engine.scheduler import Engine, Req
from slime_actors.backends.weight_sync import find_free_port, init_weights_update_group, load_weights_from_disk
from slime_actors.models.tiny import make_tiny_model

pytestmark = pytest.mark.timeout(300)

PROMPTS = [[1, 5, 6, 16], [1, 7, 8, 9, 10, 11, 12], [1, 4], [1, 9, 9, 9, 9, 9, 9, 9, 9, 9, 3]]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return make_tiny_model(d / "base", seed=0), make_tiny_model(d / "alt", seed=1)


def engine(model_dir, *flags) -> Engine:
    e = Engine(parse_args(["--model-path", str(model_dir), "--random-seed", "0", "--device", "cpu", *flags]))
    e.start()
    return e


def on_scheduler(e: Engine, fn):
    done, box = threading.Event(), []
    e.command(fn, lambda res, err: (box.append((res, err)), done.set()), needs_idle=True)
    assert done.wait(60)
    if box[0][1] is not None:
        raise box[0][1]
    return box[0][0]


def generate(e: Engine) -> list[tuple[list[int], list[float]]]:
    outs: dict[str, dict] = {}
    left = threading.Semaphore(0)
    reqs = []
    for i, p in enumerate(PROMPTS * 2):
        r = Req(rid=f"q{i}", prompt_ids=list(p), return_logprob=True,
                params=SamplingParams(max_new_tokens=8, temperature=0.9, sampling_seed=i, ignore_eos=True))
        r.on_done = lambda out, rid=r.rid: (outs.__setitem__(rid, out), left.release())
        reqs.append(r)
    e.submit(reqs)
    for _ in reqs:
        assert left.acquire(timeout=60)
    on_scheduler(e, lambda: None)   # the step that finished the batch is over
    return [(o["output_ids"], [t[0] for t in o["meta_info"]["output_token_logprobs"]])
            for o in (outs[f"q{i}"] for i in range(len(reqs)))]


SENDER = """
import json, sys
from safetensors.torch import load_file
from slime_actors.backends.weight_sync import DistributedWeightSender
s = DistributedWeightSender("127.0.0.1", int(sys.argv[1]), world_size=2, backend="gloo", group_name=sys.argv[2])
s.connect()
for line in sys.stdin:
    job = json.loads(line)
    tensors = load_file(job["path"])
    s.broadcast_bucket([(n, tensors[n]) for n in job["names"]], job["flattened"])
    print("sent", flush=True)
s.close()
"""


class Group:
    """A gloo weight-update group: a sender process as rank 0 (the trainer's DistributedWeightSender), the engine
    as rank 1."""
    made = 0

    def __init__(self, e: Engine, tmp_path):
        port = find_free_port()
        Group.made += 1
        self.name = f"g{Group.made}"     # a group name is taken for good in a process
        self.proc = subprocess.Popen([sys.executable, "-c", SENDER, str(port), self.name], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        e.groups[self.name] = (init_weights_update_group("127.0.0.1", port, 1, 2, self.name, "gloo", timeout_s=60),
                               "gloo")
        self.e, self.tmp, self.n = e, tmp_path, 0

    def sync(self, bucket: list[tuple[str, torch.Tensor]], flattened: bool = True) -> int:
        from safetensors.torch import save_file
        self.n += 1
        path = self.tmp / f"bucket{self.n}.safetensors"
        save_file({n: t.clone() for n, t in bucket}, str(path))
        self.proc.stdin.write(json.dumps({"path": str(path), "names": [n for n, _ in bucket],
                                          "flattened": flattened}) + "\n")
        self.proc.stdin.flush()
        names, dtypes, shapes = [n for n, _ in bucket], [x.dtype for _, x in bucket], [list(x.shape) for _, x in bucket]
        n = on_scheduler(self.e, lambda: self.e.receive_weights(self.name, names, dtypes, shapes, flattened))
        assert self.proc.stdout.readline().strip() == "sent"
        return n

    def close(self):
        self.proc.stdin.close()
        assert self.proc.wait(60) == 0


def test_a_flattened_sync_is_received_in_place_with_the_same_results(model_dirs, tmp_path):
    base, alt = model_dirs
    new = [(n, t.float()) for n, t in load_weights_from_disk(alt)]
    twice = [(n, t * 1.5) for n, t in new]
    results = {}
    for setting, flags in (("in place", []), ("copied", ["--keep-host-memory"])):
        e = engine(base, *flags)
        g = Group(e, tmp_path)
        try:
            params = dict(e.model.named_parameters())
            assert g.sync(new) == len(new)
            first = {n: params[n].data_ptr() for n, _ in new}
            out1 = generate(e)
            assert g.sync(twice) == len(new)
            for n, t in twice:
                assert torch.equal(params[n].detach(), t), n
            if setting == "in place":
                # no receive buffer beside the weights; the parameters are the received buffer's views
                assert not e.receivers and len(e.in_place) == 1
                flat, views = next(iter(e.in_place.values()))
                assert flat.numel() == sum(t.numel() * t.element_size() for _, t in new)
                lo, hi = flat.data_ptr(), flat.data_ptr() + flat.numel()
                assert all(lo <= params[n].data_ptr() < hi for n, _ in new)
                # the second sync went straight into the same storage (no new buffer)
                assert {n: params[n].data_ptr() for n, _ in new} == first
            else:
                assert sum(rx._buffer.numel() for rx in e.receivers.values()) > 0 and not e.in_place
            results[setting] = (out1, generate(e))
        finally:
            g.close()
            e.stop()
    assert results["in place"] == results["copied"]        # tokens and log-probs, bit for bit


def test_buckets_that_cannot_be_taken_in_place_are_copied(model_dirs, tmp_path):
    """A bucket naming one parameter twice (tied embeddings), of another dtype, or not flattened: copied into the
    model, as before; the result is the same weights."""
    base, alt = model_dirs
    new = [(n, t.float()) for n, t in load_weights_from_disk(alt)]
    e = engine(base)
    g = Group(e, tmp_path)
    try:
        params = dict(e.model.named_parameters(remove_duplicate=False))
        emb = next(n for n, _ in new if n.endswith("embed_tokens.weight"))
        assert params["lm_head.weight"] is params[emb]       # the tiny model ties them
        tied = new + [("lm_head.weight", dict(new)[emb])]
        before = {n: p.data_ptr() for n, p in params.items()}
        for bucket, flat in ((tied, True), ([(n, t.double()) for n, t in new], True), (new, False)):
            assert g.sync(bucket, flat) == len(bucket)
            assert {n: p.data_ptr() for n, p in params.items()} == before   # copied into the old storage
            assert not e.in_place
            for n, t in new:
                assert torch.equal(params[n].detach(), t), n
    finally:
        g.close()
        e.stop()


def test_malloc_is_trimmed_when_a_batch_empties_unless_kept(model_dirs, monkeypatch):
    from slime_actors.mailbox import allocator
    calls = []
    monkeypatch.setattr(allocator, "trim", lambda: calls.append(1) or True)
    for flags, want in (([], True), (["--keep-host-memory"], False)):
        calls.clear()
        e = engine(model_dirs[0], *flags)
        try:
            generate(e)
        finally:
            e.stop()
        assert bool(calls) is want, flags
