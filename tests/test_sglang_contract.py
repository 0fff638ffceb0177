"""What we send to SGLang and the sglang-router, and what we read back, held to the field lists recorded from their
source (tests/data/sglang_api_0.5.15.post1.json, tests/data/sglang_server_args_0.5.15.post1.json): the endpoints this
issue added (/server_info, /update_weights_from_tensor, the router's worker API, generation through a router),
SGLang's serializer for colocated updates, and the local engine's answers for them. test_local_engine.py covers the
rest of the API."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from slime_actors.backends.engine_client import (EngineClient, EngineError, RouterClient, parse_generate_output,
                                                 serialize_named_tensors, supports_flattened_bucket)
from slime_actors.backends.engine_process import LOCAL_ENGINE_MODULE, launch_engine
from slime_actors.backends.weight_sync import find_free_port
from slime_actors.models.tiny import make_tiny_model

pytestmark = pytest.mark.timeout(300)

DATA = Path(__file__).parent / "data"
CONTRACT = json.loads((DATA / "sglang_api_0.5.15.post1.json").read_text())
SERVER_ARGS = json.loads((DATA / "sglang_server_args_0.5.15.post1.json").read_text())
FAKE_ROUTER = DATA / "sglang_fake_router"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    d = tmp_path_factory.mktemp("contract")
    proc = launch_engine(LOCAL_ENGINE_MODULE, {"model-path": str(make_tiny_model(d / "m")), "random-seed": 0},
                         log_path=d / "engine.log", startup_timeout=120)
    yield proc
    assert proc.stop() == 0


def fields_of(request: str) -> set:
    return set(CONTRACT["requests"][request]["fields"])


def test_server_info_and_tensor_update_payloads(engine):
    sent = []

    async def go():
        async with EngineClient(engine.base_url, timeout=30) as c:
            c.request_hook = lambda m, p, b, q: sent.append((m, p, b))
            info = await c.get_server_info()
            with pytest.raises(EngineError) as ei:  # the local engine cannot map CUDA IPC handles: 400, clearly
                await c.update_weights_from_tensor(["AAAA"], load_format="flattened_bucket", flush_cache=False,
                                                   weight_version="3")
            return info, ei.value
    info, err = asyncio.run(go())
    by_path = {e["path"]: e for e in CONTRACT["endpoints"].values()}
    for method, path, body in sent:
        assert method in by_path[path]["methods"], (method, path)
        if body is not None:
            assert set(body) <= fields_of(by_path[path]["request"]), set(body) - fields_of(by_path[path]["request"])
    assert [p for _, p, _ in sent] == ["/server_info", "/update_weights_from_tensor"]
    assert err.status == 400 and "update_weights_from_tensor is not supported by the local engine" in err.message
    # what the rollout worker reads from /server_info exists in SGLang's answer (ServerArgs fields + version)
    read = set(CONTRACT["fields_read_by_engine_client"]["server_info"])
    declared = set(CONTRACT["responses"]["ServerInfo"]["fields"])
    assert read <= declared and read <= set(info)
    dests = {r["dest"] for r in SERVER_ARGS["flags"].values()}
    assert declared - {"version", "internal_states", "kv_events"} <= dests
    assert supports_flattened_bucket(info)  # the local engine takes flattened buckets
    assert supports_flattened_bucket({"version": "0.5.15.post1"}) and supports_flattened_bucket({"version": "0.6.0"})
    assert not supports_flattened_bucket({"version": "0.5.9"}) and not supports_flattened_bucket({})


@pytest.fixture
def fake_router(monkeypatch):
    """The stand-in sglang_router importable for one test; its modules leave sys.modules afterwards, so later tests
    (which check router flags against whatever sglang_router is importable) never see it."""
    monkeypatch.syspath_prepend(str(FAKE_ROUTER))
    yield FAKE_ROUTER
    for name in [m for m in sys.modules if m.split(".")[0] == "sglang_router"]:
        del sys.modules[name]


def test_generation_through_a_router_and_its_worker_api(engine, fake_router):
    """RouterClient registers / lists / removes engines the way sglang-router 0.3.2 takes it, and an EngineClient with
    generate_base_url sends /generate to the router while control requests stay with its own engine."""
    from sglang_router.launch_router import make_app
    from aiohttp import web
    router = CONTRACT["router"]
    port = find_free_port()

    async def go():
        runner = web.AppRunner(make_app([]))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        url = f"http://127.0.0.1:{port}"
        sent = []
        rc = RouterClient(url)
        rc._c.request_hook = lambda m, p, b, q: sent.append((m, p, b))
        try:
            assert await rc.health()
            await rc.add_worker(engine.base_url, api_key="k")
            assert await rc.has_worker(engine.base_url)
            async with EngineClient(engine.base_url, timeout=30) as c:
                c.generate_base_url = url
                paths = []
                c.request_hook = lambda m, p, b, q: paths.append(p)
                out = parse_generate_output(await c.generate([1, 5, 6], {"max_new_tokens": 3, "temperature": 0}))
                await c.flush_cache()
            listing = await rc._c._request("GET", "/workers")
            assert await rc.remove_worker(engine.base_url) and not await rc.remove_worker(engine.base_url)
            assert await rc.list_workers() == []
            return out, listing[1], sent, paths
        finally:
            await rc.close()
            await runner.cleanup()
    out, listing, sent, paths = asyncio.run(go())
    assert len(out.output_ids) == 3 and listing["stats"]["generate"] == 1  # it went through the router
    assert paths == ["/generate", "/flush_cache"]
    adds = [b for m, p, b in sent if (m, p) == ("POST", "/workers")]
    assert adds == [{"url": engine.base_url, "worker_type": "regular", "api_key": "k"}]
    assert set(adds[0]) <= set(router["endpoints"]["add_worker"]["request_fields"])
    assert set(adds[0]) == set(router["fields_sent_by_router_client"]["add_worker"])
    ops = {(m, p if not p.startswith("/workers/") else "/workers/{worker_id}") for m, p, _ in sent}
    declared = {(m, e["path"]) for e in router["endpoints"].values() for m in e["methods"]}
    assert ops <= declared, ops - declared


FAKE_SGLANG_UTILS = '''
import base64, io, pickle
from multiprocessing.reduction import ForkingPickler

class MultiprocessingSerializer:
    """Same interface as sglang.srt.utils.MultiprocessingSerializer (utils/common.py:2622)."""
    @staticmethod
    def serialize(obj, output_str=False):
        buf = io.BytesIO()
        ForkingPickler(buf).dump(obj)
        out = buf.getvalue()
        return base64.b64encode(out).decode("utf-8") if output_str else out

    @staticmethod
    def deserialize(data):
        if isinstance(data, str):
            data = base64.b64decode(data, validate=True)
        return pickle.loads(data)
'''
FAKE_TENSOR_BUCKET = '''
from dataclasses import dataclass
import torch

@dataclass
class FlattenedTensorMetadata:
    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int

class FlattenedTensorBucket:
    """Same interface as sglang.srt.weight_sync.tensor_bucket.FlattenedTensorBucket."""
    supports_multi_dtypes = True

    def __init__(self, named_tensors=None, flattened_tensor=None, metadata=None):
        if named_tensors is not None:
            parts, self.metadata, i = [], [], 0
            for name, t in named_tensors:
                flat = t.flatten().view(torch.uint8)
                self.metadata.append(FlattenedTensorMetadata(name, t.shape, t.dtype, i, i + flat.numel(), flat.numel()))
                parts.append(flat)
                i += flat.numel()
            self.flattened_tensor = torch.cat(parts)
        else:
            self.flattened_tensor, self.metadata = flattened_tensor, metadata

    def get_flattened_tensor(self):
        return self.flattened_tensor

    def get_metadata(self):
        return self.metadata

    def reconstruct_tensors(self):
        return [(m.name, self.flattened_tensor[m.start_idx:m.end_idx].view(m.dtype).reshape(m.shape))
                for m in self.metadata]
'''


def test_colocated_payload_uses_sglangs_serializer(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m.split(".")[0] == "sglang"]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(RuntimeError, match="needs SGLang's serializer"):
        serialize_named_tensors([("w", torch.zeros(2))])
    root = tmp_path / "site"
    for rel, text in {"sglang/__init__.py": "", "sglang/srt/__init__.py": "", "sglang/srt/utils/__init__.py":
                      FAKE_SGLANG_UTILS, "sglang/srt/weight_sync/__init__.py": "",
                      "sglang/srt/weight_sync/tensor_bucket.py": FAKE_TENSOR_BUCKET}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(root))
    try:
        named = [("a", torch.arange(6, dtype=torch.float32).reshape(2, 3)), ("b", torch.ones(4, dtype=torch.bfloat16))]
        payloads, fmt = serialize_named_tensors(named, tp_size=2)
        assert fmt == "flattened_bucket" and len(payloads) == 2 and payloads[0] == payloads[1]
        assert isinstance(payloads[0], str) and base64.b64decode(payloads[0], validate=True)  # JSON-safe base64
        from sglang.srt.utils import MultiprocessingSerializer
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket
        obj = MultiprocessingSerializer.deserialize(payloads[0])
        assert set(obj) == {"flattened_tensor", "metadata"}  # what model_runner.py:2189 unpacks
        back = FlattenedTensorBucket(flattened_tensor=obj["flattened_tensor"], metadata=obj["metadata"])
        for (n1, t1), (n2, t2) in zip(named, back.reconstruct_tensors()):
            assert n1 == n2 and torch.equal(t1, t2) and t1.dtype == t2.dtype
        payloads, fmt = serialize_named_tensors(named, flattened=False)
        assert fmt is None and [n for n, _ in MultiprocessingSerializer.deserialize(payloads[0])] == ["a", "b"]
        # the body the client sends for it is SGLang's UpdateWeightsFromTensorReqInput
        sent = []

        async def go():
            async with EngineClient(f"http://127.0.0.1:{find_free_port()}", timeout=2) as c:
                c.request_hook = lambda m, p, b, q: sent.append(b)
                with pytest.raises(EngineError):
                    await c.update_weights_from_tensor(payloads, load_format=fmt, weight_version="1")
        asyncio.run(go())
        assert set(sent[0]) <= fields_of("UpdateWeightsFromTensorReqInput")
        assert CONTRACT["requests"]["UpdateWeightsFromTensorReqInput"]["fields"]["serialized_named_tensors"]["required"]
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "sglang"]:
            del sys.modules[name]


@pytest.mark.parametrize("finish, status", [({"type": "abort", "message": "Abort in waiting queue"}, "aborted"),
                                            ({"type": "length", "length": 2}, "truncated"),
                                            ({"type": "stop", "matched": 2}, "completed")])
def test_rollout_worker_reads_finish_reason_type(tmp_path, finish, status):
    """meta_info.finish_reason is a dict ({"type", ...}); the worker maps its type to the sample's status, so a
    request aborted by a pause or end_rollout goes back to the buffer instead of being scored as complete."""
    from slime_actors.actors.rollout import RolloutWorker
    from slime_actors.config import parse_config
    from slime_actors.models.tiny import make_tokenizer
    from slime_actors.types import ABORTED, COMPLETED, TRUNCATED, Sample
    assert {"aborted": ABORTED, "truncated": TRUNCATED, "completed": COMPLETED}[status] == status
    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "1 2 first =", "label": "1"}\n')
    w = RolloutWorker(0, args=parse_config(["--prompt-data", str(data), "--hf-checkpoint", "tiny:x",
                                           "--rm-type", "exact_match"]).to_dict())
    w.tokenizer = make_tokenizer()
    seen = []

    class Engine:  # answers like SGLang 0.5.15.post1's /generate
        async def generate(self, input_ids, sampling_params, return_logprob=True, **kw):
            seen.append(sampling_params)
            return {"output_ids": [5, 6], "meta_info": {
                "id": "r", "finish_reason": finish, "prompt_tokens": len(input_ids), "completion_tokens": 2,
                "weight_version": "3", "output_token_logprobs": [[-0.5, 5, None], [-0.25, 6, None]]}}

    async def go():
        w.client = Engine()
        w._engine_ok = asyncio.Event()
        w._engine_ok.set()
        return await w._generate(Sample(index=0, group_index=0, prompt_tokens=[1, 4]),
                                 {"max_new_tokens": 4, "temperature": 1.0}, 0)
    s = asyncio.run(go())
    assert (s.status, s.finish_reason) == (status, finish["type"])
    assert s.response_tokens == [5, 6] and s.rollout_log_probs == [-0.5, -0.25] and s.weight_version == 3
    assert set(seen[0]) <= set(CONTRACT["requests"]["SamplingParams"]["fields"])


def _worker_with_engine(tmp_path, engine):
    from slime_actors.actors.rollout import RolloutWorker
    from slime_actors.config import parse_config
    from slime_actors.models.tiny import make_tokenizer
    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "1 2 first =", "label": "1"}\n')
    w = RolloutWorker(0, args=parse_config(["--prompt-data", str(data), "--hf-checkpoint", "tiny:x",
                                           "--rm-type", "exact_match"]).to_dict())
    w.tokenizer = make_tokenizer()
    w.client = engine
    w._engine_ok = asyncio.Event()
    w._engine_ok.set()
    w.weight_version = 2
    return w


class BatchingEngine:
    """Answers /generate as SGLang 0.5.15.post1 does, a single prompt or a batch (a list of input_ids with a list
    of sampling_params: a list of answers, in order); each prompt's tokens depend on the prompt and its seed."""

    def __init__(self, answers: int | None = None):
        self.calls: list = []
        self.answers = answers   # a wrong number of answers to a batch, when set

    def one(self, ids, sp):
        n = min(2, sp["max_new_tokens"])
        toks = [(sum(ids) + sp["sampling_seed"] + k) % 50 + 3 for k in range(n)]
        return {"output_ids": toks, "meta_info": {
            "id": "r", "finish_reason": {"type": "length", "length": n} if n == sp["max_new_tokens"] else
            {"type": "stop", "matched": 2}, "weight_version": "3",
            "output_token_logprobs": [[-0.1 * (k + 1), t, None] for k, t in enumerate(toks)]}}

    async def generate(self, input_ids, sampling_params, return_logprob=True, **kw):
        self.calls.append((input_ids, sampling_params))
        if input_ids and isinstance(input_ids[0], list):
            out = [self.one(i, s) for i, s in zip(input_ids, sampling_params)]
            return out if self.answers is None else out[:self.answers]
        return self.one(input_ids, sampling_params)


def _group():
    from slime_actors.types import Sample
    return [Sample(index=0, group_index=0, prompt_tokens=[1, 4]),
            Sample(index=1, group_index=0, prompt_tokens=[1, 4, 7]),
            # a partial response already at the budget: nothing to ask for, truncated as it is
            Sample(index=2, group_index=0, prompt_tokens=[1, 4], response_tokens=[9, 9, 9, 9], loss_mask=[1] * 4,
                   rollout_log_probs=[-1.0] * 4, weight_versions=[1]),
            # a partial response with budget left: continued from its tokens
            Sample(index=3, group_index=0, prompt_tokens=[1, 4], response_tokens=[9], loss_mask=[1],
                   rollout_log_probs=[-1.0], weight_versions=[1])]


def test_a_groups_samples_go_to_the_engine_in_one_batched_generate(tmp_path):
    """The built-in path sends a group's samples as one /generate in SGLang's batched form (one HTTP request for
    the worker to send and the engine to parse, instead of one per sample): each prompt with exactly the sampling
    params it would have been sent alone, each answer to its own sample, the samples the same as one at a time."""
    sp = {"max_new_tokens": 4, "temperature": 1.0}
    batching = BatchingEngine()
    w = _worker_with_engine(tmp_path, batching)
    batched = asyncio.run(w.generation.group(_group(), sp, 1, "train", "train-0"))
    assert len(batching.calls) == 1                      # one request for the group
    ids, sps = batching.calls[0]
    assert ids == [[1, 4], [1, 4, 7], [1, 4, 9]]         # the sample at its budget is not asked for
    assert all(set(p) <= set(CONTRACT["requests"]["SamplingParams"]["fields"]) for p in sps)

    alone = BatchingEngine()
    w = _worker_with_engine(tmp_path, alone)
    one_by_one = [asyncio.run(w._generate(s, sp, 1)) for s in _group()]
    assert [c[1] for c in alone.calls] == sps             # the same params, seeds and budgets as sent alone
    fields = ("response_tokens", "rollout_log_probs", "loss_mask", "status", "finish_reason", "weight_versions",
              "weight_version")
    assert [[getattr(s, f) for f in fields] for s in batched] == [[getattr(s, f) for f in fields] for s in one_by_one]
    assert [s.status for s in batched] == ["completed", "completed", "truncated", "completed"]
    assert batched[3].response_tokens[0] == 9 and batched[3].weight_versions == [1, 3]


def test_generate_functions_can_send_several_prompts_in_one_request(tmp_path):
    """EngineHandle.generate_many, for a generate function's agents that speak at once: one batched request, the
    answers in order as `generate` gives them; prompts and sampling params that do not pair up are refused."""
    batching = BatchingEngine()
    w = _worker_with_engine(tmp_path, batching)
    eng = w.generation.handle
    sps = [{"max_new_tokens": 2, "sampling_seed": 1}, {"max_new_tokens": 1, "sampling_seed": 2}]
    got = asyncio.run(eng.generate_many([[1, 4], [5]], sps))
    assert len(batching.calls) == 1 and batching.calls[0] == ([[1, 4], [5]], sps)
    alone = [asyncio.run(eng.generate(ids, sp)) for ids, sp in zip([[1, 4], [5]], sps)]
    assert [{k: v for k, v in a.items() if k != "started"} for a in got] == \
        [{k: v for k, v in a.items() if k != "started"} for a in alone]
    with pytest.raises(ValueError, match="2 prompts but 1 sampling params"):
        asyncio.run(eng.generate_many([[1, 4], [5]], sps[:1]))


def test_a_batched_answer_of_the_wrong_length_fails_the_group(tmp_path):
    """An engine that answers a batch of three with two answers: the group fails with the counts named (its samples
    are not paired with answers to other prompts); the worker gives such a group back to the buffer."""
    w = _worker_with_engine(tmp_path, BatchingEngine(answers=2))
    with pytest.raises(RuntimeError, match="batched /generate answer is a list of 2, expected a list of 3 answers"):
        asyncio.run(w.generation.group(_group(), {"max_new_tokens": 4}, 0, "train", "train-0"))


def test_a_batched_call_is_recorded_and_replayed_one_answer_per_key():
    """Actor.recorded_many_async: each answer of a batched call is a recorded input under its own key (what a call
    per request recorded); a call that fails is recorded as raised under every key, as is a wrong number of answers;
    under replay the recorded answers come back -- the first through the suspending stand-in, as the one call
    suspended once -- and the call is not made."""
    from slime_actors.actors.base import Actor

    class Tracer:
        replaying = False

        def __init__(self):
            self.inputs: list = []

        def record_input(self, name, value, key=None):
            self.inputs.append((name, value, key))

    a = Actor.__new__(Actor)
    a.tracer = Tracer()

    async def answers(n):
        return [{"i": i} for i in range(n)]

    async def fails():
        raise ConnectionError("engine gone")
    assert asyncio.run(a.recorded_many_async("engine.generate", answers, 2, keys=["k0", "k1"])) == [{"i": 0},
                                                                                                  {"i": 1}]
    assert a.tracer.inputs == [("engine.generate", {"i": 0}, "k0"), ("engine.generate", {"i": 1}, "k1")]
    a.tracer.inputs.clear()
    with pytest.raises(ConnectionError, match="engine gone"):
        asyncio.run(a.recorded_many_async("engine.generate", fails, keys=["k0", "k1"]))
    assert [(k, v["__raised__"].rsplit(":", 1)[-1]) for _, v, k in a.tracer.inputs] == \
        [("k0", "ConnectionError"), ("k1", "ConnectionError")]
    a.tracer.inputs.clear()
    with pytest.raises(RuntimeError, match="engine.generate: 1 answers for 2 requests"):
        asyncio.run(a.recorded_many_async("engine.generate", answers, 1, keys=["k0", "k1"]))
    assert [k for _, _, k in a.tracer.inputs] == ["k0", "k1"]

    class Replaying:
        replaying = True

        def __init__(self):
            self.taken: list = []

        async def replay_input_async(self, name, key):
            self.taken.append(("async", key))
            return {"key": key}

        def replay_input(self, name, key):
            self.taken.append(("sync", key))
            return {"key": key}

    a.tracer = Replaying()

    async def never(*_):
        raise AssertionError("a replay makes no call")
    assert asyncio.run(a.recorded_many_async("engine.generate", never, keys=["k0", "k1", "k2"])) == \
        [{"key": "k0"}, {"key": "k1"}, {"key": "k2"}]
    assert a.tracer.taken == [("async", "k0"), ("sync", "k1"), ("sync", "k2")]


# -- the API keys: SGLang's rule, recorded from its source (tests/data/sglang_auth_0.5.15.post1.json) --------------

AUTH = json.loads((DATA / "sglang_auth_0.5.15.post1.json").read_text())


def _local_engine_paths() -> set:
    import argparse as _argparse
    from slime_actors.backends.local_engine import Server
    app = Server(None, _argparse.Namespace()).make_app()
    return {r.resource.canonical for r in app.router.routes()}


def test_admin_endpoints_are_sglangs():
    """ADMIN_PATHS (what the local engine guards with the admin key and the client sends it to) is exactly the set
    of SGLang's @auth_level(ADMIN_OPTIONAL) routes among the local engine's; SGLang marks no route ADMIN_FORCE."""
    from slime_actors.backends.engine_auth import ADMIN_PATHS
    levels = {e["path"]: e["auth_level"] for e in AUTH["endpoints"].values()}
    ours = _local_engine_paths()
    assert ours <= set(levels), ours - set(levels)  # every path the local engine serves, SGLang serves
    assert ADMIN_PATHS == {p for p in ours if levels[p] == "admin_optional"}
    assert {levels[p] for p in ours} == {"normal", "admin_optional"}
    assert "admin_force" not in {e["auth_level"] for e in AUTH["endpoints"].values()}
    assert levels["/generate"] == levels["/server_info"] == levels["/model_info"] == "normal"


def test_refusal_rule_matches_sglangs_decide_request_auth():
    """engine_auth.refusal_status (the local engine's check) answers like SGLang's decide_request_auth in every
    recorded case: each combination of server keys, endpoint level, method, path and Authorization header."""
    from slime_actors.backends.engine_auth import refusal_status
    api, admin = AUTH["keys_used_in_decisions"]["api_key"], AUTH["keys_used_in_decisions"]["admin_api_key"]
    server_keys = {"none": (None, None), "api_key_only": (api, None), "admin_key_only": (None, admin),
                   "both": (api, admin)}
    paths = {**AUTH["paths"]}
    cols = AUTH["decision_columns"]
    checked = 0
    for row in map(lambda r: dict(zip(cols, r)), AUTH["decisions"]):
        if row["level"] == "admin_force":  # no route uses it (test above)
            continue
        path = paths[row["path"]]
        if row["path"] == "endpoint":  # a path of that level
            path = "/update_weights_from_disk" if row["level"] == "admin_optional" else "/generate"
        got = refusal_status(row["method"], path, AUTH["headers"][row["header"]], *server_keys[row["keys"]])
        assert got == row["refused_with"], row
        checked += 1
    assert checked == 4 * 2 * 2 * 4 * len(AUTH["headers"])


def test_local_engine_enforces_the_rule_for_every_key_setting(tmp_path):
    """The local engine, started with each of SGLang's four key settings, lets through or refuses (401, SGLang's
    body) each of its endpoints exactly as the recorded rule says, for each recorded Authorization header."""
    import aiohttp
    from slime_actors.backends.engine_auth import EngineKeys
    api, admin = AUTH["keys_used_in_decisions"]["api_key"], AUTH["keys_used_in_decisions"]["admin_api_key"]
    model = make_tiny_model(tmp_path / "m")
    cols = AUTH["decision_columns"]
    rule = {(r["keys"], r["level"], r["header"]): r["refused_with"]
            for r in map(lambda r: dict(zip(cols, r)), AUTH["decisions"]) if r["method"] == "POST"
            and r["path"] == "endpoint"}
    levels = {e["path"]: (e["auth_level"], e["methods"]) for e in AUTH["endpoints"].values()}
    paths = sorted(_local_engine_paths())
    mismatches = []
    for setting, keys in (("none", EngineKeys()), ("api_key_only", EngineKeys(api)),
                          ("admin_key_only", EngineKeys(None, admin)), ("both", EngineKeys(api, admin))):
        flags = ["--model-path", str(model), "--random-seed", "0"]
        if keys.any:
            flags += ["--config", str(keys.write_engine_config(tmp_path / f"{setting}.yaml"))]
        proc = launch_engine(LOCAL_ENGINE_MODULE, flags, log_path=tmp_path / f"{setting}.log", startup_timeout=120)

        async def go():
            seen = {}
            async with aiohttp.ClientSession() as s:
                for path in paths:
                    level, methods = levels[path]
                    method = "POST" if "POST" in methods else methods[0]
                    for header, value in AUTH["headers"].items():
                        if value and value != value.strip():
                            continue  # HTTP drops a field value's outer whitespace (RFC 9110 5.5) before any server
                        # a body no handler accepts: an allowed request is answered 400 / 404 / 200, never changes
                        # the engine (/flush_cache of an idle engine aside)
                        async with s.request(method, proc.base_url + path, data=b"{not json",
                                             headers={"Authorization": value} if value else {}) as r:
                            seen[(path, header)] = (r.status, await r.text())
            return seen
        try:
            seen = asyncio.run(asyncio.wait_for(go(), 120))
        finally:
            assert proc.stop() == 0
        assert len(seen) == len(paths) * (len(AUTH["headers"]) - 1)
        for (path, header), (status, text) in seen.items():
            level = levels[path][0]
            want = None if path.startswith(tuple(AUTH["facts"]["open_prefixes"]["value"])) else \
                rule[(setting, level, header)]
            got = 401 if status == 401 else None
            if got != want or (got == 401 and json.loads(text) != AUTH["facts"]["refusal"]["value"]["401"]):
                mismatches.append((setting, path, header, status, text[:80]))
    assert not mismatches, mismatches[:10]


def test_client_sends_each_endpoint_the_key_sglang_wants(tmp_path):
    """Every EngineClient call carries the admin key to SGLang's admin endpoints and the API key elsewhere; the
    router's worker registry gets the admin key; /server_info comes back without the secrets SGLang puts in it."""
    from aiohttp import web
    from slime_actors.backends.engine_auth import EngineKeys, SECRET_SERVER_INFO_FIELDS
    keys = EngineKeys("the-api-key", "the-admin-key")
    got: list[tuple[str, str | None]] = []

    async def any_request(request):
        got.append((request.path, request.headers.get("Authorization")))
        if request.path == "/server_info":
            return web.json_response({"api_key": keys.api_key, "admin_api_key": keys.admin_key,
                                      "ssl_keyfile_password": None, "version": "0.5.15.post1", "tp_size": 1})
        if request.path == "/workers" and request.method == "GET":
            return web.json_response({"workers": [{"id": "w1", "url": "http://e:1"}]})
        return web.json_response({"success": True, "message": "", "weight_version": "3", "status": "ok",
                                  "meta_info": {}})
    port = find_free_port()

    async def go():
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", any_request)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        url = f"http://127.0.0.1:{port}"
        try:
            async with EngineClient(url, keys=keys, timeout=10) as c:
                await c.generate([1, 2], {"max_new_tokens": 1})
                info = await c.get_server_info()
                await c.get_model_info()
                await c.health()
                await c.flush_cache()
                await c.abort_request(abort_all=True)
                await c.pause_generation("abort")
                await c.continue_generation()
                await c.update_weights_from_disk("/m", weight_version="1")
                await c.init_weights_update_group("127.0.0.1", 1, 1, 2, "g", "gloo")
                await c.update_weights_from_distributed(["w"], ["float32"], [[1]], "g", weight_version="1")
                await c.destroy_weights_update_group("g")
                await c.update_weights_from_tensor(["AAAA"], weight_version="1")
                await c.update_weights_from_ipc(["w"], ["float32"], [[1]], {"kind": "shm"}, weight_version="1")
                await c.update_weight_version("2")
            rc = RouterClient(url, keys=keys)
            try:
                await rc.add_worker("http://e:1", api_key=keys.api_key)
                await rc.remove_worker("http://e:1")
            finally:
                await rc.close()
            return info
        finally:
            await runner.cleanup()
    info = asyncio.run(go())
    levels = {e["path"]: e["auth_level"] for e in AUTH["endpoints"].values()}
    for path, header in got:
        if path.startswith("/workers"):
            want = keys.admin_key  # the router's control-plane key
        else:
            want = keys.admin_key if levels[path] == "admin_optional" else keys.api_key
        assert header == f"Bearer {want}", (path, header)
    assert {p for p, _ in got} >= {"/generate", "/server_info", "/update_weights_from_disk", "/abort_request",
                                   "/workers", "/workers/w1"}
    assert set(SECRET_SERVER_INFO_FIELDS) == set(AUTH["facts"]["server_info_returns_server_args"]["fields"])
    assert info["api_key"] is True and info["admin_api_key"] is True and info["ssl_keyfile_password"] is False
    assert keys.api_key not in json.dumps(info) and keys.admin_key not in json.dumps(info)


def test_engine_config_file_is_what_sglang_reads(tmp_path):
    """The keys file the rollout worker hands the engine: a .yaml mapping of SGLang flag names (as written) to the
    keys, 0600 -- read by the local engine as SGLang's prepare_server_args reads --config."""
    import yaml
    from slime_actors.backends import sglang_flags
    from slime_actors.backends.engine_auth import EngineKeys
    assert AUTH["facts"]["config_file"]["source"] and "command line wins" in AUTH["facts"]["config_file"]["value"]
    keys = EngineKeys('k"ey\\1', "admin:key")  # quotes, backslashes and colons survive YAML
    path = keys.write_engine_config(tmp_path / "keys" / "engine-0.yaml")
    data = yaml.safe_load(path.read_text())
    assert data == {"api-key": keys.api_key, "admin-api-key": keys.admin_key}
    assert {f"--{k}" for k in data} <= set(sglang_flags.SERVER_FLAGS) and path.suffix == ".yaml"
    assert path.stat().st_mode & 0o777 == 0o600


def test_router_in_front_takes_keys(engine, fake_router):
    """The fake sglang-router with the job's keys (as sglang-router 0.3.2 takes them): generation without the API
    key and the worker registry without the admin key are refused; with them, requests reach the engine."""
    from aiohttp import web
    from slime_actors.backends.engine_auth import EngineKeys
    from slime_actors.backends.sglang_launch import ROUTER_KEY_ID
    from sglang_router.launch_router import make_app
    keys = EngineKeys("router-api", "router-admin")
    port = find_free_port()

    async def go():
        runner = web.AppRunner(make_app([], "router-api", [f"{ROUTER_KEY_ID}:admin:router-admin"]))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        url = f"http://127.0.0.1:{port}"
        try:
            bare = RouterClient(url)
            with pytest.raises(EngineError, match="HTTP 401"):
                await bare.add_worker(engine.base_url)
            await bare.close()
            rc = RouterClient(url, keys=keys)
            await rc.add_worker(engine.base_url)  # the test engine has no key of its own
            async with EngineClient(engine.base_url, timeout=30) as c:
                c.generate_base_url = url
                with pytest.raises(EngineError, match="HTTP 401"):
                    await c.generate([1, 5, 6], {"max_new_tokens": 2, "temperature": 0})
            async with EngineClient(engine.base_url, keys=keys, timeout=30) as c:
                c.generate_base_url = url
                out = parse_generate_output(await c.generate([1, 5, 6], {"max_new_tokens": 2, "temperature": 0}))
            stats = (await rc._c._request("GET", "/workers", admin=True))[1]["stats"]
            await rc.close()
            return out, stats
        finally:
            await runner.cleanup()
    out, stats = asyncio.run(go())
    assert len(out.output_ids) == 2 and stats == {"generate": 1, "refused": 2}


def test_engine_json_goes_through_orjson_and_falls_back_to_json_where_orjson_refuses():
    """Answers and request bodies go through orjson (a batched /generate answer parses ~2.4x faster); what orjson
    refuses and json takes -- NaN / Infinity in an answer (Python's json writes them), an integer over 64 bits or a
    non-string key in a body -- goes through json, as before. What neither parses is a ValueError (the caller's
    "expected JSON" error)."""
    import json

    from slime_actors.backends.engine_client import _dumps, _loads
    assert _loads(b'{"meta_info": {"output_token_logprobs": [[-0.5, 7, null]]}}') == \
        {"meta_info": {"output_token_logprobs": [[-0.5, 7, None]]}}
    nan = _loads(b'[NaN, -Infinity, 1.5]')
    assert nan[0] != nan[0] and nan[1] == float("-inf") and nan[2] == 1.5
    with pytest.raises(ValueError):
        _loads(b"<html>502 Bad Gateway</html>")
    body = {"input_ids": [[1, 2]], "sampling_params": [{"temperature": 0.7}], "return_logprob": True}
    assert json.loads(_dumps(body)) == body
    assert json.loads(_dumps({"x": 2**70, 3: "k"})) == {"x": 2**70, "3": "k"}



def test_a_generate_answer_is_parsed_from_its_log_prob_triples_or_its_output_ids():
    """Token ids and log-probs come from meta_info.output_token_logprobs ([logprob, id, text]); a logprob of null is
    NaN; output_ids alone give the ids; the two disagreeing, or neither there, is an EngineError."""
    meta = {"finish_reason": {"type": "length"}, "output_token_logprobs": [[-0.5, 7, None], [None, 9, None]]}
    out = parse_generate_output({"output_ids": [7, 9], "meta_info": meta})
    assert out.output_ids == [7, 9] and out.logprobs[0] == -0.5 and out.logprobs[1] != out.logprobs[1]
    assert out.completion_tokens == 2 and out.truncated
    assert parse_generate_output({"output_ids": [3, 4], "meta_info": {}}).output_ids == [3, 4]
    with pytest.raises(EngineError, match="disagree"):
        parse_generate_output({"output_ids": [7, 8], "meta_info": meta})
    with pytest.raises(EngineError, match="neither output_ids nor"):
        parse_generate_output({"meta_info": {}})
