"""The local engine's request checks on their own (slime_actors/backends/local_engine/params.py): no model, no server,
no process. What each check answers -- status and body shaped as SGLang's -- for the sampling parameters, /generate
bodies and the control endpoints' bodies. test_local_engine.py sends the same kinds of requests over HTTP."""

from __future__ import annotations

import sys

import pytest

from slime_actors.backends.local_engine.params import (TOP_K_ALL, RequestError, parse_generate,
                                                       parse_sampling_params, validate_struct)

VOCAB, CONTEXT = 32, 200  # the default max_new_tokens (128) fits


def refused(fn, *a, **kw) -> RequestError:
    with pytest.raises(RequestError) as e:
        fn(*a, **kw)
    return e.value


def message(err: RequestError) -> str:
    b = err.body
    return b["error"]["message"] if "error" in b else b["message"]


def generate(body, tokenize=None):
    return parse_generate(body, vocab_size=VOCAB, context_len=CONTEXT, tokenize=tokenize)


# -- sampling parameters ---------------------------------------------------------------------------------------

def test_sampling_defaults_greedy_and_top_k():
    p = parse_sampling_params(None, VOCAB)
    assert (p.max_new_tokens, p.temperature, p.top_p, p.top_k, p.n, p.greedy) == (128, 1.0, 1.0, TOP_K_ALL, 1, False)
    g = parse_sampling_params({"temperature": 0, "max_new_tokens": 4}, VOCAB)  # SGLang: greedy = T 1, top_k 1
    assert (g.temperature, g.top_k, g.greedy, g.max_new_tokens) == (1.0, 1, True, 4)
    assert parse_sampling_params({"top_k": -1}, VOCAB).top_k == TOP_K_ALL
    assert parse_sampling_params({"top_k": None, "n": None}, VOCAB).top_k == TOP_K_ALL  # None = the default
    s = parse_sampling_params({"stop": "\n", "stop_token_ids": [3, None], "stop_regex": "a+"}, VOCAB)
    assert (s.stop_strs, s.stop_token_ids, s.stop_regex) == (["\n"], {3}, ["a+"])
    # unsupported fields at their default value are accepted, as SGLang accepts them
    assert parse_sampling_params({"min_p": 0.0, "repetition_penalty": 1.0, "custom_params": {}}, VOCAB).n == 1


@pytest.mark.parametrize("raw, status, says", [
    ("greedy", 400, "valid dictionary"),
    ({"temprature": 0.5}, 500, "Unexpected keyword argument 'temprature'"),
    ({"min_p": 0.1}, 400, "sampling_params.min_p=0.1 is not supported"),
    ({"custom_params": {"a": 1}}, 400, "custom_params is not supported"),
    ({"temperature": "hot"}, 500, "invalid sampling_params"),
    ({"max_new_tokens": [4]}, 500, "invalid sampling_params"),
    ({"stop": [1, 2]}, 500, "stop / stop_regex must be strings"),
    ({"stop_regex": "("}, 500, "invalid sampling_params"),
    ({"temperature": -0.5}, 400, "temperature must be a non-negative finite number"),
    ({"temperature": float("inf")}, 400, "temperature must be a non-negative finite number"),
    ({"top_p": 0.0}, 400, "top_p must be in (0, 1]"),
    ({"top_k": 0}, 400, "top_k must be -1 (disable) or at least 1"),
    ({"min_new_tokens": -1}, 400, "min_new_tokens must be in [0, max_new_tokens]"),
    ({"max_new_tokens": -1}, 400, "max_new_tokens must be at least 0"),
    ({"max_new_tokens": 2, "min_new_tokens": 3}, 400, "min_new_tokens must be in [0, max_new_tokens(2)], got 3"),
    ({"n": 0}, 400, "n must be at least 1"),
    ({"stop_token_ids": [VOCAB]}, 400, f"stop_token_ids [{VOCAB}] outside the vocabulary [0, {VOCAB})"),
])
def test_bad_sampling_params_are_refused_as_sglang_does(raw, status, says):
    err = refused(parse_sampling_params, raw, VOCAB)
    assert err.status == status and says in message(err), (err.status, err.body)


# -- /generate bodies --------------------------------------------------------------------------------------------

def test_a_single_request_and_a_batch():
    (item,), single = generate({"input_ids": [1, 2, 3], "rid": "a", "return_logprob": True,
                                "logprob_start_len": 0, "sampling_params": {"max_new_tokens": 2}})
    assert single and item.rid == "a" and item.prompt_ids == [1, 2, 3] and item.return_logprob
    assert (item.logprob_start_len, item.params.max_new_tokens) == (0, 2)
    (anon,), _ = generate({"input_ids": [1]})
    assert len(anon.rid) == 32  # a fresh id when the body names none
    items, single = generate({"input_ids": [[1, 2], [3]], "rid": ["x", "y"],
                              "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 3}]})
    assert not single and [(i.rid, i.prompt_ids, i.params.max_new_tokens) for i in items] == [
        ("x", [1, 2], 1), ("y", [3], 3)]


def test_parallel_samples_expand_as_sglang_does():
    """n > 1: [all prompts] * n, rids `<rid>_<k>`, and the answer is a list even for one prompt."""
    items, single = generate({"input_ids": [[1], [2]], "rid": "r", "sampling_params": {"n": 2}})
    assert not single
    assert [(i.rid, i.prompt_ids) for i in items] == [("r_0", [1]), ("r_1", [2]), ("r_2", [1]), ("r_3", [2])]
    items, single = generate({"input_ids": [5], "rid": "one", "sampling_params": {"n": 3}})
    assert not single and [i.rid for i in items] == ["one_0", "one_1", "one_2"]


def test_text_goes_through_the_tokenizer_it_is_given():
    items, single = generate({"text": ["ab", "c"]}, tokenize=lambda t: [ord(ch) - 90 for ch in t])
    assert not single and [i.prompt_ids for i in items] == [[7, 8], [9]]
    err = refused(generate, {"text": "ab"})  # an engine started with --skip-tokenizer-init
    assert err.status == 400 and "needs the tokenizer" in message(err)


@pytest.mark.parametrize("body, status, says", [
    ([1, 2], 400, "valid dictionary"),
    ({}, 400, "Either text, input_ids or input_embeds should be provided."),
    ({"input_ids": []}, 400, "input_ids cannot be empty."),
    ({"input_ids": [1, "2"]}, 400, "body.input_ids: elements must be int"),
    ({"input_ids": "1 2"}, 400, "body.input_ids: must be list or null; got str"),
    ({"text": 5}, 400, "body.text: Input should be a valid string or list of strings"),
    ({"input_ids": [1], "rid": 7}, 400, "body.rid"),
    ({"input_ids": [1], "return_logprob": "yes"}, 400, "body.return_logprob"),
    ({"input_ids": [1], "stream": True}, 400, "stream=True is not supported by the local engine"),
    ({"input_ids": [1], "image_data": "x.png"}, 400, "image_data='x.png' is not supported"),
    ({"input_ids": [1, VOCAB]}, 400, f"contains values greater than the vocab size ({VOCAB})"),
    ({"input_ids": [-1]}, 400, "contains values greater than the vocab size"),
    ({"input_ids": [1] * CONTEXT}, 400, f"longer than the model's context length ({CONTEXT} tokens)"),
    ({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": CONTEXT}}, 400,
     f"You requested a total of {CONTEXT + 2} tokens"),
    ({"input_ids": [1, 2], "logprob_start_len": 3}, 400, "logprob_start_len=3 is higher than the number of input"),
    ({"input_ids": [[1], [2]], "sampling_params": [{}]}, 400, "expected 2 values, got 1"),
    ({"input_ids": [[1], [2]], "rid": ["a"]}, 400, "rids length mismatch"),
    ({"input_ids": [[1], [2]], "rid": ["a", "a"]}, 400, "Duplicate request IDs"),
    ({"input_ids": [[1], [2]], "sampling_params": [{"n": 1}, {"n": 2}]}, 400, "parallel_sample_num should be the same"),
    ({"input_ids": [1], "sampling_params": {"top_p": 2}}, 400, "top_p must be in (0, 1]"),
])
def test_bad_generate_bodies_are_refused_as_sglang_does(body, status, says):
    err = refused(generate, body)
    assert err.status == status and says in message(err), (err.status, err.body)


# -- control endpoints' bodies ------------------------------------------------------------------------------------

def test_struct_bodies_get_defaults_and_ignore_unknown_keys():
    b = validate_struct("PauseGenerationReqInput", {"something": 1})
    assert b == {"rid": None, "http_worker_ipc": None, "mode": "abort"}
    b = validate_struct("UpdateWeightFromDiskReqInput", {"model_path": "/m", "weight_version": "7"})
    assert (b["model_path"], b["weight_version"], b["flush_cache"], b["abort_all_requests"]) == ("/m", "7", True, False)


@pytest.mark.parametrize("schema, body, says", [
    ("AbortReq", None, "body: Input should be a valid dictionary"),
    ("UpdateWeightFromDiskReqInput", {}, "UpdateWeightFromDiskReqInput: body.model_path: Field required"),
    ("PauseGenerationReqInput", {"mode": "stop"}, "body.mode: Input has the wrong type or value ('stop')"),
    ("InitWeightsUpdateGroupReqInput", {"master_address": "h", "master_port": "1", "rank_offset": 1, "world_size": 2},
     "body.master_port: Input has the wrong type"),
    ("UpdateWeightsFromDistributedReqInput", {"names": ["a"], "dtypes": ["float32"], "shapes": [[2, True]]},
     "body.shapes: Input has the wrong type"),
    ("UpdateWeightsFromIPCReqInput", {"names": [], "dtypes": [], "shapes": [], "handle": {"kind": "shm"}},
     "body.handle: Input has the wrong type"),
])
def test_bad_struct_bodies_name_the_field(schema, body, says):
    err = refused(validate_struct, schema, body)
    assert err.status == 400 and says in message(err), err.body


def test_the_checks_need_neither_torch_nor_a_server():
    """params.py stands alone: importing it pulls in no model library and no HTTP server."""
    import subprocess
    code = ("import sys; import slime_actors.backends.local_engine.params; "
            "print(sorted(m for m in ('torch', 'transformers', 'aiohttp') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
