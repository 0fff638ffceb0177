"""The local engine against SGLang 0.5.15.post1's API contract (tests/data/sglang_api_0.5.15.post1.json), on CPU
with the tiny model; one engine subprocess serves the whole module (it is started with an API key)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slime_actors.backends.engine_client import (EngineClient, EngineError, EngineUnavailable, GenerateOutput,
                                                 parse_generate_output)
from slime_actors.backends.engine_process import (LOCAL_ENGINE_MODULE, EngineStartError, flags_to_argv,
                                                  launch_engine)
from slime_actors.backends.weight_sync import (DistributedWeightSender, find_free_port, load_weights_from_disk)
from slime_actors.models.tiny import make_tiny_model

pytestmark = pytest.mark.timeout(300)

CONTRACT = json.loads((Path(__file__).parent / "data" / "sglang_api_0.5.15.post1.json").read_text())
KEY = "test-key-123"
PROMPTS = [[1, 5, 6, 16], [1, 7, 8, 9, 10, 11, 12], [1, 4], [1, 9, 9, 9, 9, 9, 9, 9, 9, 9, 3], [1, 3, 13, 4, 16],
           [1, 20, 21]]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return make_tiny_model(d / "base", seed=0), make_tiny_model(d / "alt", seed=1)


@pytest.fixture(scope="module")
def engine(model_dirs, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("engine") / "engine.log"
    proc = launch_engine(LOCAL_ENGINE_MODULE, {"model-path": str(model_dirs[0]), "random-seed": 0, "api-key": KEY,
                                               "max-running-requests": 8, "mem-fraction-static": 0.8,
                                               "disable-radix-cache": True},
                         log_path=log_path, startup_timeout=120)
    yield proc
    code = proc.stop()
    assert code == 0, f"engine exited with {code}; log: {log_path.read_text()[-3000:]}"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def client_for(engine, **kw) -> EngineClient:
    return EngineClient(engine.base_url, api_key=KEY, timeout=60, **kw)


async def _raw(engine, method, path, body=None, key=KEY, data=None):
    import aiohttp
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as s:
        async with s.request(method, engine.base_url + path, json=body, data=data, headers=headers) as r:
            text = await r.text()
            try:
                return r.status, json.loads(text)
            except ValueError:
                return r.status, text


def hf_logprobs(model_dir, prompt, output_ids, temperature):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = torch.tensor([prompt + output_ids])
    with torch.no_grad():
        logits = m(ids).logits[0].float()
    lp = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)
    return [lp[len(prompt) - 1 + j, t].item() for j, t in enumerate(output_ids)]


def changed(a, b) -> bool:
    """Different weights: other tokens, or the same tokens with clearly different log-probs."""
    la = [t[0] for t in a["meta_info"]["output_token_logprobs"]]
    lb = [t[0] for t in b["meta_info"]["output_token_logprobs"]]
    return a["output_ids"] != b["output_ids"] or max(abs(x - y) for x, y in zip(la, lb)) > 1e-3


def greedy(n=8, **kw):
    return {"max_new_tokens": n, "temperature": 0, "ignore_eos": True, **kw}


# -- generation ---------------------------------------------------------------------------------------------

def test_generate_with_logprobs(engine):
    async def go():
        async with client_for(engine) as c:
            raw = await c.generate(PROMPTS[0], {"max_new_tokens": 6, "temperature": 1.0, "ignore_eos": True,
                                                "sampling_seed": 7}, return_logprob=True, rid="req-a")
            return raw
    raw = run(go())
    meta = raw["meta_info"]
    assert meta["id"] == "req-a"
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == len(PROMPTS[0]) and meta["completion_tokens"] == 6
    assert meta["weight_version"] == "default" and meta["e2e_latency"] >= 0
    assert len(meta["output_token_logprobs"]) == 6
    for lp, tid, text in meta["output_token_logprobs"]:
        assert isinstance(lp, float) and lp <= 0 and isinstance(tid, int) and text is None
    assert [t[1] for t in meta["output_token_logprobs"]] == raw["output_ids"]
    assert isinstance(raw["text"], str)
    out = parse_generate_output(raw)
    assert isinstance(out, GenerateOutput) and out.output_ids == raw["output_ids"] and out.finish_type == "length"
    assert out.truncated and not out.aborted and out.weight_version == "default" and out.prompt_tokens == 4


def test_same_seed_same_output_and_greedy_determinism(engine):
    async def go():
        async with client_for(engine) as c:
            sp = {"max_new_tokens": 12, "temperature": 1.0, "top_p": 0.95, "top_k": 20, "ignore_eos": True}
            a = await c.generate(PROMPTS[1], {**sp, "sampling_seed": 123})
            b = await c.generate(PROMPTS[1], {**sp, "sampling_seed": 123})
            others = [await c.generate(PROMPTS[1], {**sp, "sampling_seed": s}) for s in (1, 2, 3)]
            g1 = await c.generate(PROMPTS[2], greedy(10))
            g2 = await c.generate(PROMPTS[2], greedy(10))
            g3 = await c.generate(PROMPTS[2], {**greedy(10), "temperature": 0.7, "top_k": 1})
            return a, b, others, g1, g2, g3
    a, b, others, g1, g2, g3 = run(go())
    assert a["output_ids"] == b["output_ids"]
    assert a["meta_info"]["output_token_logprobs"] == b["meta_info"]["output_token_logprobs"]
    assert any(o["output_ids"] != a["output_ids"] for o in others), "different seeds should differ somewhere"
    assert g1["output_ids"] == g2["output_ids"]
    assert g1["meta_info"]["output_token_logprobs"] == g2["meta_info"]["output_token_logprobs"]
    assert g3["output_ids"] == g1["output_ids"]  # top_k=1 is greedy whatever the temperature


def test_stop_conditions_and_finish_reasons(engine):
    async def go():
        async with client_for(engine) as c:
            base = await c.generate(PROMPTS[3], greedy(16))
            ids = base["output_ids"]
            stop_id = ids[3]
            by_id = await c.generate(PROMPTS[3], greedy(16, stop_token_ids=[stop_id], ignore_eos=False))
            ignored = await c.generate(PROMPTS[3], greedy(16, stop_token_ids=[stop_id], ignore_eos=True))
            short = await c.generate(PROMPTS[3], greedy(3))
            word = base["text"].split()[4]
            by_str = await c.generate(PROMPTS[3], greedy(16, stop=[word]))
            no_trim = await c.generate(PROMPTS[3], greedy(16, stop=word, no_stop_trim=True))
            zero = await c.generate(PROMPTS[3], greedy(0))
            return base, stop_id, by_id, ignored, short, word, by_str, no_trim, zero
    base, stop_id, by_id, ignored, short, word, by_str, no_trim, zero = run(go())
    eos = 2  # the tiny model's </s>: with ignore_eos=False it stops generation too
    first = next(i for i, t in enumerate(base["output_ids"]) if t in (stop_id, eos))
    assert by_id["output_ids"] == base["output_ids"][:first + 1]  # the matched token is included in output_ids
    assert by_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": base["output_ids"][first]}
    assert by_id["meta_info"]["completion_tokens"] == first + 1
    assert ignored["output_ids"] == base["output_ids"]  # ignore_eos disables stop_token_ids too (SGLang)
    assert short["meta_info"]["finish_reason"] == {"type": "length", "length": 3} and len(short["output_ids"]) == 3
    fr = by_str["meta_info"]["finish_reason"]
    assert fr == {"type": "stop", "matched": word}
    assert by_str["text"].strip() == " ".join(base["text"].split()[:base["text"].split().index(word)])
    assert no_trim["text"].strip().endswith(word)
    assert len(by_str["output_ids"]) == len(by_str["meta_info"]["output_token_logprobs"]) <= 16
    assert zero["output_ids"] == [] and zero["meta_info"]["finish_reason"]["type"] == "length"


def test_concurrent_batches_match_one_at_a_time(engine):
    lens = [9, 4, 12, 7, 10, 5]

    async def go():
        async with client_for(engine) as c:
            seq = [await c.generate(p, greedy(n)) for p, n in zip(PROMPTS, lens)]
            sampled_seq = [await c.generate(p, {"max_new_tokens": n, "temperature": 0.9, "sampling_seed": 50 + i,
                                                "ignore_eos": True})
                           for i, (p, n) in enumerate(zip(PROMPTS, lens))]

            async def delayed(i, p, n, sp):
                await asyncio.sleep(0.004 * i)  # stagger: requests join a batch that is already decoding
                return await c.generate(p, sp)
            conc = await asyncio.gather(*[delayed(i, p, n, greedy(n)) for i, (p, n) in enumerate(zip(PROMPTS, lens))])
            sconc = await asyncio.gather(*[delayed(i, p, n, {"max_new_tokens": n, "temperature": 0.9,
                                                              "sampling_seed": 50 + i, "ignore_eos": True})
                                           for i, (p, n) in enumerate(zip(PROMPTS, lens))])
            batched = await c.generate(PROMPTS, [greedy(n) for n in lens])  # SGLang's batched form: a list back
            return seq, sampled_seq, conc, sconc, batched
    seq, sampled_seq, conc, sconc, batched = run(go())
    assert isinstance(batched, list) and len(batched) == len(PROMPTS)
    for ref_list, got_list in ((seq, conc), (seq, batched), (sampled_seq, sconc)):
        for ref, got in zip(ref_list, got_list):
            assert got["output_ids"] == ref["output_ids"]
            diff = max(abs(a[0] - b[0]) for a, b in zip(ref["meta_info"]["output_token_logprobs"],
                                                          got["meta_info"]["output_token_logprobs"]))
            assert diff <= 1e-5


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
def test_logprobs_match_full_forward(engine, model_dirs, temperature):
    async def go():
        async with client_for(engine) as c:
            return await asyncio.gather(*[c.generate(p, {"max_new_tokens": 10, "temperature": temperature,
                                                         "sampling_seed": 9, "ignore_eos": True}) for p in PROMPTS[:4]])
    outs = run(go())
    for p, o in zip(PROMPTS, outs):
        got = [t[0] for t in o["meta_info"]["output_token_logprobs"]]
        ref = hf_logprobs(model_dirs[0], p, o["output_ids"], temperature)
        assert max(abs(a - b) for a, b in zip(got, ref)) <= 1e-5


# -- API behaviour like SGLang ----------------------------------------------------------------------------------

def test_api_key_required(engine):
    async def go():
        no_key = await _raw(engine, "POST", "/generate", {"input_ids": [1, 2], "sampling_params": greedy(2)}, key=None)
        wrong = await _raw(engine, "GET", "/model_info", key="nope")
        health = await _raw(engine, "GET", "/health", key=None)
        health_gen = await _raw(engine, "GET", "/health_generate", key=None)
        ok = await _raw(engine, "GET", "/model_info")
        async with EngineClient(engine.base_url, api_key="nope") as c:
            with pytest.raises(EngineError) as ei:
                await c.get_model_info()
        return no_key, wrong, health, health_gen, ok, ei.value
    no_key, wrong, health, health_gen, ok, err = run(go())
    assert no_key == (401, {"error": "Unauthorized"}) and wrong == (401, {"error": "Unauthorized"})
    assert health[0] == 200 and health_gen[0] == 200 and ok[0] == 200
    assert err.status == 401 and err.endpoint == "/model_info" and "Unauthorized" in err.message


def test_unknown_and_malformed_fields_like_sglang(engine):
    async def go():
        r = {}
        r["unknown_top"] = await _raw(engine, "POST", "/generate", {"input_ids": [1, 2], "sampling_params": greedy(2),
                                                                   "not_a_field": {"x": 1}})
        r["unknown_sp"] = await _raw(engine, "POST", "/generate", {"input_ids": [1, 2],
                                                                  "sampling_params": {"max_new_tokens": 2, "tempo": 1}})
        r["bad_type"] = await _raw(engine, "POST", "/generate", {"input_ids": "1 2 3"})
        r["no_input"] = await _raw(engine, "POST", "/generate", {"sampling_params": greedy(2)})
        r["empty"] = await _raw(engine, "POST", "/generate", {"input_ids": []})
        r["neg_temp"] = await _raw(engine, "POST", "/generate", {"input_ids": [1, 2], "sampling_params":
                                                                {"temperature": -1}})
        r["top_p0"] = await _raw(engine, "POST", "/generate", {"input_ids": [1, 2], "sampling_params": {"top_p": 0}})
        r["oov"] = await _raw(engine, "POST", "/generate", {"input_ids": [1, 10 ** 6]})
        r["bad_json"] = await _raw(engine, "POST", "/generate", data=b"{not json")
        r["deep_json"] = await _raw(engine, "POST", "/generate", data=b"[" * 100_000 + b"]" * 100_000)
        r["missing_req"] = await _raw(engine, "POST", "/update_weights_from_distributed", {"names": ["x"]})
        r["abort_unknown"] = await _raw(engine, "POST", "/abort_request", {"rid": "nobody", "whatever": 3})
        r["pause_bad_mode"] = await _raw(engine, "POST", "/pause_generation", {"mode": "sideways"})
        r["after"] = await _raw(engine, "POST", "/generate", {"input_ids": [1, 2], "sampling_params": greedy(2)})
        return r
    r = run(go())
    assert r["unknown_top"][0] == 200 and len(r["unknown_top"][1]["output_ids"]) == 2
    assert r["unknown_sp"][0] == 500  # SGLang: TypeError from SamplingParams(**kwargs) escapes -> 500
    # FastAPI validation -> 400 ErrorResponse (deep_json: Python's RecursionError was a 500)
    for k in ("bad_type", "bad_json", "deep_json", "missing_req", "pause_bad_mode"):
        status, body = r[k]
        assert status == 400 and body["object"] == "error" and body["code"] == 400, (k, body)
    assert r["no_input"] == (400, {"error": {"message": "Either text, input_ids or input_embeds should be provided."}})
    assert r["empty"] == (400, {"error": {"message": "input_ids cannot be empty."}})
    for k in ("neg_temp", "top_p0", "oov"):  # ValueError -> 400 {"error": {"message"}}
        assert r[k][0] == 400 and "message" in r[k][1]["error"], (k, r[k])
    assert r["abort_unknown"][0] == 200
    assert r["after"][0] == 200  # and the server keeps serving


def test_weight_version_endpoints(engine):
    async def go():
        gv = await _raw(engine, "GET", "/get_weight_version")
        async with client_for(engine) as c:
            return gv, await c.get_weight_version(), await c.get_model_info()
    gv, version, info = run(go())
    assert gv[0] == 404  # SGLang 0.5.15.post1: deprecated, use /model_info
    assert version == "default" and info["weight_version"] == "default"
    assert set(info) <= set(CONTRACT["responses"]["ModelInfo"]["fields"])
    assert info["architectures"] == ["LlamaForCausalLM"] and info["is_generation"] is True


def test_pause_continue_abort(engine):
    async def go():
        async with client_for(engine) as c:
            ref = await c.generate(PROMPTS[1], greedy(200))
            # in_place: requests wait; continue lets them finish normally
            assert (await c.pause_generation("in_place"))["status"] == "ok"
            t1 = asyncio.create_task(c.generate(PROMPTS[0], greedy(5), rid="wait-1"))
            t2 = asyncio.create_task(c.generate(PROMPTS[0], greedy(5), rid="kill-me"))
            t3 = asyncio.create_task(c.generate(PROMPTS[0], greedy(5), rid="kill-me-too"))
            await asyncio.sleep(0.5)
            assert not t1.done() and not t2.done()
            assert await c.health_generate(5)  # paused is not unhealthy
            # as SGLang 0.5.15.post1: a rid the server does not hold (a bare prefix) aborts nothing ...
            await c.abort_request(rid="kill")
            await asyncio.sleep(0.3)
            assert not t2.done() and not t3.done()
            # ... a held rid aborts, in the scheduler, every request whose rid starts with it: both kill-me*
            await c.abort_request(rid="kill-me")
            aborted = await asyncio.gather(t2, t3)
            assert not t1.done()
            await c.continue_generation()
            done = await t1
            # pause(abort): everything in flight comes back with finish_reason abort
            await c.pause_generation("in_place")
            t4 = asyncio.create_task(c.generate(PROMPTS[0], greedy(5)))
            await asyncio.sleep(0.3)
            await c.pause_generation("abort")
            abort_out = await t4
            t5 = asyncio.create_task(c.generate(PROMPTS[0], greedy(5)))  # waits while paused
            await asyncio.sleep(0.3)
            assert not t5.done()
            await c.continue_generation()
            after = await t5
            # retract mid-generation: the request is recomputed and ends exactly as it would have
            t6 = asyncio.create_task(c.generate(PROMPTS[1], greedy(200)))
            await asyncio.sleep(0.15)
            await c.pause_generation("retract")
            await asyncio.sleep(0.2)
            await c.continue_generation()
            retracted = await t6
            # abort_all
            await c.pause_generation("in_place")
            t7 = asyncio.create_task(c.generate(PROMPTS[0], greedy(5)))
            await asyncio.sleep(0.3)
            await c.abort_request(abort_all=True)
            all_out = await t7
            await c.continue_generation()
            return ref, aborted, done, abort_out, after, retracted, all_out
    ref, aborted, done, abort_out, after, retracted, all_out = run(go())
    for o in aborted + [abort_out, all_out]:
        assert o["meta_info"]["finish_reason"]["type"] == "abort"
        assert parse_generate_output(o).aborted
    assert done["meta_info"]["finish_reason"]["type"] == "length" and len(done["output_ids"]) == 5
    assert after["meta_info"]["finish_reason"]["type"] == "length"
    assert retracted["output_ids"] == ref["output_ids"]
    diff = max(abs(a[0] - b[0]) for a, b in zip(ref["meta_info"]["output_token_logprobs"],
                                                  retracted["meta_info"]["output_token_logprobs"]))
    assert diff <= 1e-5


def test_health_flush_and_info(engine):
    async def go():
        async with client_for(engine) as c:
            return await c.health(), await c.health_generate(10), await c.flush_cache()
    assert run(go()) == (True, True, True)


# -- weights ----------------------------------------------------------------------------------------------------

def test_update_weights_from_disk(engine, model_dirs, tmp_path):
    base, alt = model_dirs

    async def go():
        async with client_for(engine) as c:
            before = await c.generate(PROMPTS[1], greedy(12))
            with pytest.raises(EngineError) as bad:
                await c.update_weights_from_disk(str(tmp_path / "missing"), weight_version="never")
            res = await c.update_weights_from_disk(str(alt), weight_version="v1")
            after = await c.generate(PROMPTS[1], greedy(12))
            version = await c.get_weight_version()
            restored = await c.update_weights_from_disk(str(base), weight_version="v0")
            again = await c.generate(PROMPTS[1], greedy(12))
            return before, bad.value, res, after, version, restored, again
    before, bad, res, after, version, restored, again = run(go())
    assert bad.status == 400 and bad.endpoint == "/update_weights_from_disk"
    assert res["success"] and "num_paused_requests" in res
    assert after["meta_info"]["weight_version"] == "v1"
    assert changed(before, after)
    assert version == "v1"
    got = [t[0] for t in after["meta_info"]["output_token_logprobs"]]
    assert max(abs(a - b) for a, b in zip(got, hf_logprobs(alt, PROMPTS[1], after["output_ids"], 0))) <= 1e-5
    assert restored["success"] and again["output_ids"] == before["output_ids"] and not changed(before, again)
    assert again["meta_info"]["weight_version"] == "v0"


def test_update_weights_from_distributed(engine, model_dirs):
    base, alt = model_dirs
    new = list(load_weights_from_disk(alt))
    half = len(new) // 2
    port = find_free_port()

    async def go():
        async with client_for(engine) as c:
            before = await c.generate(PROMPTS[2], greedy(10))
            sender = DistributedWeightSender("127.0.0.1", port, world_size=2, backend="gloo", group_name="wg")
            await asyncio.gather(asyncio.to_thread(sender.connect),
                                 c.init_weights_update_group("127.0.0.1", port, 1, 2, "wg", backend="gloo"))
            try:
                for bucket, flat, ver in ((new[:half], False, None), (new[half:], True, "v2")):
                    meta = {"names": [n for n, _ in bucket], "dtypes": [t.dtype for _, t in bucket],
                            "shapes": [list(t.shape) for _, t in bucket]}
                    await asyncio.gather(
                        asyncio.to_thread(sender.broadcast_bucket, bucket, flat),
                        c.update_weights_from_distributed(**meta, group_name="wg", weight_version=ver,
                                                          load_format="flattened_bucket" if flat else None))
                after = await c.generate(PROMPTS[2], greedy(10))
                version = await c.get_weight_version()
            finally:
                destroyed, _ = await asyncio.gather(c.destroy_weights_update_group("wg"),
                                                    asyncio.to_thread(sender.close))
            with pytest.raises(EngineError):
                await c.update_weights_from_distributed(["x"], ["float32"], [[1]], group_name="wg")
            await c.update_weights_from_disk(str(base), weight_version="v0")
            return before, after, version, destroyed
    before, after, version, destroyed = run(go())
    assert version == "v2" and after["meta_info"]["weight_version"] == "v2" and destroyed["success"]
    assert changed(before, after)
    got = [t[0] for t in after["meta_info"]["output_token_logprobs"]]
    assert max(abs(a - b) for a, b in zip(got, hf_logprobs(alt, PROMPTS[2], after["output_ids"], 0))) <= 1e-5


# -- client contract ---------------------------------------------------------------------------------------------

class Recording(dict):
    """A dict that records which keys are read (recursively), to learn what parse_generate_output reads."""

    def __init__(self, d, path, seen):
        super().__init__({k: Recording(v, f"{path}{k}.", seen) if isinstance(v, dict) else v for k, v in d.items()})
        self.path, self.seen = path, seen

    def __getitem__(self, k):
        self.seen.add(self.path + k)
        return super().__getitem__(k)

    def get(self, k, default=None):
        self.seen.add(self.path + k)
        return super().get(k, default)

    def __contains__(self, k):
        self.seen.add(self.path + k)
        return super().__contains__(k)


def test_client_payloads_follow_the_contract(engine, model_dirs):
    sent = []
    by_path = {e["path"]: e for e in CONTRACT["endpoints"].values()}
    requests = CONTRACT["requests"]

    async def go():
        async with client_for(engine) as c:
            c.request_hook = lambda m, p, b, q: sent.append((m, p, b, q))
            raw = await c.generate(PROMPTS[0], greedy(3, stop=["x"], stop_token_ids=[2], top_p=0.9, top_k=5,
                                                      sampling_seed=1, no_stop_trim=False, min_new_tokens=1),
                                   return_logprob=True, rid="contract-1", logprob_start_len=-1)
            await c.health()
            await c.health_generate(10)
            await c.flush_cache()
            await c.abort_request(rid="nobody")
            await c.abort_request(abort_all=True)
            await c.pause_generation("in_place")
            await c.continue_generation()
            await c.update_weights_from_disk(str(model_dirs[0]), weight_version="v0")
            await c.get_model_info()
            await c.get_weight_version()
            with pytest.raises(EngineError):  # nobody joins: the engine reports failure, it does not hang
                await c.init_weights_update_group("127.0.0.1", find_free_port(), 1, 2, "lonely", backend="nccl")
            with pytest.raises(EngineError):
                await c.update_weights_from_distributed(["a"], ["float32"], [[2]], group_name="lonely")
            with pytest.raises(EngineError):
                await c.destroy_weights_update_group("lonely")
            return raw
    raw = run(go())
    assert {p for _, p, _, _ in sent} >= {"/generate", "/health", "/health_generate", "/flush_cache", "/abort_request",
                                          "/pause_generation", "/continue_generation", "/update_weights_from_disk",
                                          "/model_info", "/init_weights_update_group",
                                          "/update_weights_from_distributed", "/destroy_weights_update_group"}
    for method, path, body, _ in sent:
        ep = by_path[path]
        assert method in ep["methods"], (method, path)
        if body is not None:
            fields = requests[ep["request"]]["fields"]
            assert set(body) <= set(fields), (path, set(body) - set(fields))
            if path == "/generate":
                assert set(body["sampling_params"]) <= set(requests["SamplingParams"]["fields"])
    # every response field the client reads exists in the contract, and the client reads no others
    seen: set[str] = set()
    parse_generate_output(Recording(raw, "", seen))
    declared = set(CONTRACT["fields_read_by_engine_client"]["generate"])
    assert seen <= declared | {"meta_info"}, seen - declared
    top = set(CONTRACT["responses"]["GenerateOutput"]["fields"])
    meta = set(CONTRACT["responses"]["MetaInfo"]["fields"])
    finish = set().union(*[set(v) for v in CONTRACT["responses"]["FinishReason"]["variants"].values()])
    for f in declared:
        parts = f.split(".")
        assert parts[0] in top
        if len(parts) > 1:
            assert parts[1] in meta, f
        if len(parts) > 2:
            assert parts[1] == "finish_reason" and parts[2] in finish, f
    for ep, fields in CONTRACT["fields_read_by_engine_client"].items():
        if ep == "generate":
            continue
        resp = CONTRACT["endpoints"][ep]["response"]
        assert set(fields) <= set(CONTRACT["responses"][resp]["fields"]), ep
    # and the engine's own answers carry what the contract says
    assert set(raw) <= top and set(raw["meta_info"]) <= meta


# -- processes ----------------------------------------------------------------------------------------------------

def test_client_errors_when_engine_is_down():
    async def go():
        async with EngineClient(f"http://127.0.0.1:{find_free_port()}", timeout=5) as c:
            assert not await c.health()
            with pytest.raises(EngineUnavailable):
                await c.generate([1, 2], greedy(2))
    run(go())


def test_tp_size_refused_and_start_failure_reported(tmp_path):
    r = subprocess.run([sys.executable, "-m", LOCAL_ENGINE_MODULE, "--model-path", "x", "--tp-size", "2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--tp-size 2" in r.stderr
    lines = []
    with pytest.raises(EngineStartError) as ei:
        launch_engine(LOCAL_ENGINE_MODULE, {"model-path": str(tmp_path / "no-model")}, on_line=lines.append,
                      log_path=tmp_path / "e.log", startup_timeout=120)
    assert ei.value.exit_code not in (None, 0) and ei.value.last_lines and lines
    assert (tmp_path / "e.log").read_text().strip()
    assert flags_to_argv({"a-b": 1, "c": True, "d": False, "e": None}) == ["--a-b", "1", "--c"]


# -- CUDA (run by the GPU check; skipped here) ------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs 2 GPUs: the engine on cuda:1, the NCCL sender on cuda:0")
def test_cuda_engine_and_nccl_weight_update(model_dirs, tmp_path):
    base, alt = model_dirs
    proc = launch_engine(LOCAL_ENGINE_MODULE, {"model-path": str(base), "device": "cuda:1", "random-seed": 0},
                         log_path=tmp_path / "engine.log", startup_timeout=300)
    new = list(load_weights_from_disk(alt))
    port = find_free_port()

    async def go():
        async with EngineClient(proc.base_url, timeout=120) as c:
            before = await asyncio.gather(*[c.generate(p, {"max_new_tokens": 16, "temperature": 0.8,
                                                           "sampling_seed": 3, "ignore_eos": True}) for p in PROMPTS])
            sender = DistributedWeightSender("127.0.0.1", port, world_size=2, backend="nccl", device="cuda:0")
            await asyncio.gather(asyncio.to_thread(sender.connect),
                                 c.init_weights_update_group("127.0.0.1", port, 1, 2, backend="nccl"))
            try:
                meta = {"names": [n for n, _ in new], "dtypes": [t.dtype for _, t in new],
                        "shapes": [list(t.shape) for _, t in new]}
                await asyncio.gather(asyncio.to_thread(sender.broadcast_bucket, new, True),
                                     c.update_weights_from_distributed(**meta, weight_version="g1",
                                                                       load_format="flattened_bucket"))
                half = len(new) // 2
                for bucket in (new[:half], new[half:]):  # and tensor by tensor
                    meta = {"names": [n for n, _ in bucket], "dtypes": [t.dtype for _, t in bucket],
                            "shapes": [list(t.shape) for _, t in bucket]}
                    await asyncio.gather(asyncio.to_thread(sender.broadcast_bucket, bucket, False),
                                         c.update_weights_from_distributed(**meta, weight_version="g2"))
                after = await c.generate(PROMPTS[1], greedy(16))
            finally:  # both sides at once: NCCL's destroy waits for the peer
                await asyncio.gather(c.destroy_weights_update_group(), asyncio.to_thread(sender.close))
            return before, after, await c.get_weight_version()
    try:
        before, after, version = run(go())
    finally:
        assert proc.stop() == 0
    for p, o in zip(PROMPTS, before):
        got = [t[0] for t in o["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(got, hf_logprobs(base, p, o["output_ids"], 0.8))) <= 1e-4
    assert version == "g2" and after["meta_info"]["weight_version"] == "g2"
    got = [t[0] for t in after["meta_info"]["output_token_logprobs"]]
    assert max(abs(a - b) for a, b in zip(got, hf_logprobs(alt, PROMPTS[1], after["output_ids"], 0))) <= 1e-4


def test_deterministic_inference_gives_a_request_the_same_bits_in_any_batch(model_dirs):
    """--enable-deterministic-inference (SGLang's flag): a request's log-probs and tokens are the same bits alone, in a
    batch with prompts of other lengths, and joining a batch that is already decoding (docs/reproducibility.md).
    Driven step by step on the scheduler's own methods, so the batches are exactly these."""
    from slime_actors.backends.local_engine.cli import parse_args
    from slime_actors.backends.local_engine.params import SamplingParams
    from slime_actors.backends.local_engine.scheduler import Engine, Req

    eng = Engine(parse_args(["--model-path", str(model_dirs[0]), "--random-seed", "0", "--device", "cpu",
                             "--enable-deterministic-inference"]))

    def req(rid, prompt, n, seed):
        r = Req(rid=rid, prompt_ids=list(prompt), return_logprob=True,
                params=SamplingParams(max_new_tokens=n, temperature=0.9, sampling_seed=seed, ignore_eos=True))
        r.generator = torch.Generator().manual_seed(seed)
        return r

    def run(*steps):
        with torch.inference_mode():
            for s in steps:
                eng._prefill(s) if s != "decode" else eng._decode()
            while eng.running:
                eng._decode()

    x = [req("x", PROMPTS[0], 6, 7) for _ in range(3)]
    run([x[0]])                                                                   # alone
    run([req("y", PROMPTS[3], 9, 3), x[1], req("z", PROMPTS[2], 3, 5)])           # among others, padded
    run([req("y", PROMPTS[3], 9, 3)], "decode", "decode", [x[2]])                 # joining a decoding batch
    assert x[0].output_ids == x[1].output_ids == x[2].output_ids and len(x[0].output_ids) == 6
    assert x[0].logprobs == x[1].logprobs == x[2].logprobs  # bit for bit


def test_enable_tf32_matmul_is_honoured_as_sglangs_flag(model_dirs, monkeypatch):
    """SGLang's --enable-tf32-matmul: on a GPU the engine's fp32 matmuls in TF32 (torch's process-wide precision); a
    flag the local engine acts on, not one it accepts and ignores. On CPU it changes nothing ("high" could)."""
    from slime_actors.backends.local_engine.cli import honoured_flags, parse_args
    from slime_actors.backends.local_engine.scheduler import Engine
    assert "--enable-tf32-matmul" in honoured_flags()
    asked: list[str] = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", asked.append)
    Engine(parse_args(["--model-path", str(model_dirs[0]), "--device", "cpu", "--enable-tf32-matmul"]))
    assert asked == []
    monkeypatch.setattr("slime_actors.backends.local_engine.scheduler.resolve_device",
                        lambda device, base: torch.device("cuda", 0))
    monkeypatch.setattr(torch.nn.Module, "to", lambda self, *a, **k: self)   # (no GPU here: the model stays)
    Engine(parse_args(["--model-path", str(model_dirs[0]), "--enable-tf32-matmul"]))
    assert asked == ["high"]
    Engine(parse_args(["--model-path", str(model_dirs[0])]))
    assert asked == ["high"]
