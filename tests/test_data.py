"""PromptDataset / EvalDatasets: jsonl + parquet, keys, chat template, epochs and shuffling, resume, bad rows."""

import json
import random

import msgpack
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from structlog.testing import capture_logs

from slime_actors.config import parse_config
from slime_actors.data import (DataError, EvalDatasets, PromptDataset, load_prompt_data, parse_eval_prompt_data)
from slime_actors.models.tiny import make_tiny_model


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer
    path = make_tiny_model(tmp_path_factory.mktemp("tiny") / "m")
    return AutoTokenizer.from_pretrained(str(path))


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


ROWS = [{"question": f"{a} + {b} =", "answer": str(a + b), "meta": {"id": i}} for i, (a, b) in
        enumerate([(1, 2), (3, 4), (5, 1), (2, 2), (7, 1), (0, 9), (4, 4)])]


def test_jsonl_keys_tokens_and_metadata(tmp_path, tok):
    rows = [dict(r) for r in ROWS]
    rows[1]["meta"] = json.dumps({"id": 1, "from": "string"})  # metadata given as a JSON string
    path = tmp_path / "d.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps(rows[0]) + "\n\n   \n")               # blank lines are not rows
        for r in rows[1:]:
            f.write(json.dumps(r) + "\n")
    ds = PromptDataset(path, tok, input_key="question", label_key="answer", metadata_key="meta")
    assert len(ds) == 7 and ds.stats == {"rows": 7, "skipped": 0, "too_long": 0, "oversize": 0, "prompts": 7}
    p = ds[0]
    assert p.prompt == "1 + 2 =" and p.label == "3" and p.metadata == {"id": 0}
    assert p.prompt_tokens == tok("1 + 2 =", add_special_tokens=False)["input_ids"] == [4, 13, 5, 16]
    assert p.source == f"{path}:1" and ds[1].source == f"{path}:4"
    assert ds[1].metadata == {"id": 1, "from": "string"}
    assert p["prompt_tokens"] == p.prompt_tokens and p.get("label") == "3"   # dict-style access
    # no label key -> labels None; missing metadata -> {}
    ds2 = PromptDataset(path, tok, input_key="question", metadata_key="nope")
    assert ds2[0].label is None and ds2[0].metadata == {}


def test_parquet_matches_jsonl(tmp_path, tok):
    jl = write_jsonl(tmp_path / "d.jsonl", ROWS)
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "d.parquet")
    a = PromptDataset(jl, tok, input_key="question", label_key="answer", metadata_key="meta")
    b = PromptDataset(tmp_path / "d.parquet", tok, input_key="question", label_key="answer", metadata_key="meta")
    assert [(p.prompt, p.prompt_tokens, p.label, p.metadata) for p in a.prompts] == \
           [(p.prompt, p.prompt_tokens, p.label, p.metadata) for p in b.prompts]
    assert b[2].source == f"{tmp_path / 'd.parquet'} row 2"


def test_chat_template_strings_and_messages(tmp_path, tok):
    rows = [{"input": "3 + 4 ="},
            {"input": [{"role": "system", "content": "sum"}, {"role": "user", "content": "1 + 1 ="}]}]
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    ds = PromptDataset(path, tok, apply_chat_template=True)
    assert ds[0].prompt == "user : 3 + 4 = assistant :"
    assert ds[1].prompt == "system : sum user : 1 + 1 = assistant :"
    # tokens: the same ids that apply_chat_template(tokenize=True) gives (a BatchEncoding in transformers 5)
    enc = tok.apply_chat_template([{"role": "user", "content": "3 + 4 ="}], tokenize=True,
                                  add_generation_prompt=True)
    ids = enc["input_ids"] if hasattr(enc, "keys") else enc
    assert ds[0].prompt_tokens == list(ids)
    # without the template a message list stays a list (for custom generate functions), with no tokens
    raw = PromptDataset(path, tok)
    assert raw[1].prompt == rows[1]["input"] and raw[1].prompt_tokens == []
    assert raw[0].prompt == "3 + 4 =" and raw[0].prompt_tokens == [6, 13, 7, 16]


def test_tools_reach_template_and_metadata(tmp_path, tok):
    import copy
    t = copy.deepcopy(tok)
    t.chat_template = ("{% if tools %}tool : {{ tools | length }} {% endif %}"
                       "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}assistant :")
    tools = [{"type": "function", "function": {"name": "add"}}]
    path = write_jsonl(tmp_path / "t.jsonl", [{"input": "1 + 1 =", "tools": tools},
                                              {"input": "2 + 2 =", "tools": json.dumps(tools * 2)},
                                              {"input": "3 + 3 ="}])
    ds = PromptDataset(path, t, tool_key="tools", apply_chat_template=True)
    assert ds[0].prompt == "tool : 1 user : 1 + 1 = assistant :" and ds[0].metadata["tools"] == tools
    assert ds[1].prompt.startswith("tool : 2 ") and len(ds[1].metadata["tools"]) == 2
    assert ds[2].prompt == "user : 3 + 3 = assistant :" and "tools" not in ds[2].metadata


def test_max_prompt_len_filters_and_counts(tmp_path, tok):
    rows = [{"input": "1"}, {"input": "1 + 2"}, {"input": "1 + 2 + 3"}, {"input": "1 + 2 + 3 + 4"}]
    path = write_jsonl(tmp_path / "l.jsonl", rows)
    ds = PromptDataset(path, tok, max_prompt_len=3)
    assert [p.prompt for p in ds.prompts] == ["1", "1 + 2"]
    assert ds.stats["too_long"] == 2 and [p.index for p in ds.prompts] == [0, 1]
    ds = PromptDataset(path, tok, max_prompt_len=8, apply_chat_template=True)   # counts template tokens
    assert [p.prompt_tokens.__len__() for p in ds.prompts] == [5, 7] and ds.stats["too_long"] == 2
    with pytest.raises(DataError, match="no usable prompts.*2 longer|no usable prompts"):
        PromptDataset(path, tok, max_prompt_len=0)


def _ds(path, tok, **kw):
    return PromptDataset(path, tok, input_key="question", label_key="answer", **kw)


def test_shuffle_is_deterministic_per_seed_and_epoch(tmp_path, tok):
    path = write_jsonl(tmp_path / "s.jsonl", ROWS)
    n = len(ROWS)
    plain = _ds(path, tok)
    assert [p.index for p in plain.next_prompts(2 * n)] == list(range(n)) * 2
    a, b, c = _ds(path, tok, shuffle=True, seed=5), _ds(path, tok, shuffle=True, seed=5), \
        _ds(path, tok, shuffle=True, seed=6)
    ea = [[p.index for p in a.next_prompts(n)] for _ in range(3)]
    eb = [[p.index for p in b.next_prompts(n)] for _ in range(3)]
    ec = [[p.index for p in c.next_prompts(n)] for _ in range(3)]
    assert ea == eb                                  # same seed: same orders
    assert ea != ec                                  # another seed: other orders
    assert all(sorted(e) == list(range(n)) for e in ea)   # each epoch visits every prompt once
    assert len({tuple(e) for e in ea}) > 1           # reshuffled per epoch
    for e in range(3):                               # the documented permutation
        perm = list(range(n))
        random.Random(5 + e).shuffle(perm)
        assert ea[e] == perm == a.order(e)
    assert a.epoch == 3 and a.offset == 0


def test_prompts_cross_epochs_and_make_samples_of_their_own(tmp_path, tok):
    path = write_jsonl(tmp_path / "g.jsonl", ROWS[:5])
    ds = _ds(path, tok)
    got = []
    for _ in range(3):
        got += ds.next_prompts(3)
    assert [p.prompt for p in got] == [ROWS[i % 5]["question"] for i in range(9)]
    assert [p.index for p in got] == [i % 5 for i in range(9)]
    assert (ds.epoch, ds.offset) == (1, 4)
    s0, s1 = got[0].to_samples(2, group_index=3, first_index=8)
    assert (s0.index, s1.index, s0.group_index, s0.label, s0.rollout_id) == (8, 9, 3, ROWS[0]["answer"], -1)
    s0.metadata["x"] = 1
    s0.prompt_tokens.append(99)
    assert "x" not in s1.metadata and 99 not in s1.prompt_tokens and 99 not in ds[0].prompt_tokens


def test_a_prompts_samples_share_nothing_mutable_with_it_or_each_other():
    """A chat prompt's messages, its label and metadata are copied for each sample (nested lists and maps too, and
    what is not JSON-like -- a tuple holding a list, a set -- by copy.deepcopy): a reward or an environment that
    changes one sample's changes no other's, nor the prompt's."""
    from slime_actors.data import Prompt
    messages = [{"role": "user", "content": "What is 1 + 2?", "parts": [{"text": "x"}]}]
    p = Prompt(0, messages, [1, 2], label={"answer": ["3"]}, metadata={"task": "add", "seen": {1}, "pair": (1, [2])})
    s0, s1 = p.to_samples(2, group_index=0, first_index=0)
    assert s0.prompt == s1.prompt == messages and s0.label == p.label and s0.metadata == p.metadata
    s0.prompt[0]["parts"][0]["text"] = "changed"
    s0.prompt.append({"role": "assistant", "content": "3"})
    s0.label["answer"].append("4")
    s0.metadata["seen"].add(2)
    s0.metadata["pair"][1].append(3)
    assert p.prompt == s1.prompt == [{"role": "user", "content": "What is 1 + 2?", "parts": [{"text": "x"}]}]
    assert p.label == s1.label == {"answer": ["3"]}
    assert p.metadata == s1.metadata == {"task": "add", "seen": {1}, "pair": (1, [2])}


@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_continues_exactly(tmp_path, tok, shuffle):
    path = write_jsonl(tmp_path / "r.jsonl", ROWS)
    ref = _ds(path, tok, shuffle=shuffle, seed=3)
    ref.next_prompts(5)
    ref.next_prompts(4)                                   # into epoch 1
    state = msgpack.unpackb(msgpack.packb(ref.state_dict()))  # survives the wire / a snapshot file
    assert state["epoch"] == 1 and state["offset"] == 2 and "next_group_index" not in state
    expect = ref.next_prompts(20)
    again = _ds(path, tok, shuffle=shuffle, seed=3)
    again.load_state_dict({**state, "next_group_index": 9})   # what older versions saved too: still read
    got = again.next_prompts(20)
    assert [(p.index, p.prompt) for p in got] == [(p.index, p.prompt) for p in expect]
    # a fresh dataset without the state starts over: the test can tell the difference
    fresh = _ds(path, tok, shuffle=shuffle, seed=3).next_prompts(20)
    assert [p.index for p in fresh] != [p.index for p in got]


def test_resume_at_epoch_end_and_changed_data(tmp_path, tok):
    path = write_jsonl(tmp_path / "r.jsonl", ROWS)
    ds = _ds(path, tok, shuffle=True)
    ds.next_prompts(len(ROWS))
    st = ds.state_dict()
    assert (st["epoch"], st["offset"]) == (1, 0)
    other = write_jsonl(tmp_path / "other.jsonl", ROWS[:-1])
    with pytest.raises(DataError, match="6"):
        _ds(other, tok, shuffle=True).load_state_dict(st)
    changed = [dict(r) for r in ROWS]
    changed[0]["answer"] = "99"
    changed_path = write_jsonl(tmp_path / "changed.jsonl", changed)
    with pytest.raises(DataError, match="changed"):
        _ds(changed_path, tok, shuffle=True).load_state_dict(st)
    lenient = _ds(changed_path, tok, shuffle=True)
    lenient.load_state_dict(st, strict=False)
    assert (lenient.epoch, lenient.offset) == (1, 0)


BAD = [
    ('{"input": "1 + 1", ', "invalid JSON"),
    ('[1, 2]', "expected a JSON object, got a list"),
    ('{"prompt": "1 + 1"}', "missing input key 'input'"),
    ('{"input": 12}', "'input' must be a string or a list of chat messages, got a number"),
    ('{"input": null}', "got null"),
    ('{"input": ""}', "empty prompt"),
    ('{"input": "   "}', "empty prompt"),
    ('{"input": []}', "empty prompt"),
    ('{"input": [{"content": "hi"}]}', "message 0 has no 'role'"),
    ('{"input": ["hi"]}', "message 0 must be an object"),
    ('{"input": "1", "metadata": [1]}', "metadata 'metadata' must be an object, got a list"),
    ('{"input": "1", "metadata": "{bad"}', "not JSON"),
]


@pytest.mark.parametrize("line,problem", BAD)
def test_malformed_rows_name_file_line_and_problem(tmp_path, tok, line, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"input": "1 + 1"}\n\n' + line + "\n")
    with pytest.raises(DataError) as e:
        PromptDataset(path, tok)
    assert str(e.value).startswith(f"{path}:3: ")
    assert problem in str(e.value)
    assert e.value.line == 3 and e.value.path == str(path)


def test_missing_label_key_and_bad_utf8(tmp_path, tok):
    path = write_jsonl(tmp_path / "l.jsonl", [{"input": "1", "label": "1"}, {"input": "2"}])
    with pytest.raises(DataError, match=r"l\.jsonl:2: missing label key 'label'"):
        PromptDataset(path, tok, label_key="label")
    raw = tmp_path / "u.jsonl"
    raw.write_bytes(b'{"input": "1"}\n{"input": "\xff"}\n')
    with pytest.raises(DataError, match=r"u\.jsonl:2: not valid UTF-8"):
        PromptDataset(raw, tok)


def test_malformed_parquet_row(tmp_path, tok):
    pq.write_table(pa.Table.from_pylist([{"input": "1 + 1"}, {"input": None}, {"input": "2"}]), tmp_path / "b.parquet")
    with pytest.raises(DataError, match=r"b\.parquet row 1: .*null"):
        PromptDataset(tmp_path / "b.parquet", tok)
    ds = PromptDataset(tmp_path / "b.parquet", tok, on_error="skip")
    assert len(ds) == 2 and ds.stats["skipped"] == 1


def test_skip_mode_counts_and_logs_at_most_ten(tmp_path, tok):
    lines = ['{"input": "1 + 1"}'] + [l for l, _ in BAD] + ['{"input": "2 + 2"}']   # 12 bad rows
    path = write_jsonl(tmp_path / "m.jsonl", lines)
    with capture_logs() as logs:
        ds = PromptDataset(path, tok, on_error="skip")
    assert [p.prompt for p in ds.prompts] == ["1 + 1", "2 + 2"]
    assert ds.stats == {"rows": 14, "skipped": 12, "too_long": 0, "oversize": 0, "prompts": 2}
    per_row = [e for e in logs if e["event"] == "skipping malformed row"]
    summary = [e for e in logs if e["event"] == "skipped malformed rows"]
    assert len(per_row) == 10 and all(e["log_level"] == "warning" for e in per_row)
    assert per_row[0]["where"] == f"{path}:2" and "invalid JSON" in per_row[0]["problem"]
    assert len(summary) == 1 and summary[0]["skipped"] == 12
    with pytest.raises(DataError, match="no usable prompts"):
        PromptDataset(write_jsonl(tmp_path / "allbad.jsonl", [l for l, _ in BAD]), tok, on_error="skip")


def test_file_level_errors(tmp_path, tok):
    with pytest.raises(DataError, match="does not exist"):
        PromptDataset(tmp_path / "nope.jsonl", tok)
    (tmp_path / "x.csv").write_text("input\n1\n")
    with pytest.raises(DataError, match="unsupported file type"):
        PromptDataset(tmp_path / "x.csv", tok)
    (tmp_path / "x.parquet").write_text("not parquet")
    with pytest.raises(DataError, match="cannot read parquet"):
        PromptDataset(tmp_path / "x.parquet", tok, on_error="skip")
    with pytest.raises(ValueError, match="on_error"):
        PromptDataset(tmp_path / "x.parquet", tok, on_error="ignore")


def test_parse_eval_prompt_data(tmp_path):
    a = write_jsonl(tmp_path / "aime.jsonl", [{"input": "1"}])
    b = write_jsonl(tmp_path / "gsm.jsonl", [{"input": "2"}])
    assert parse_eval_prompt_data([a]) == [("aime", a)]
    assert parse_eval_prompt_data(a) == [("aime", a)]
    assert parse_eval_prompt_data(["x", a, "y", b]) == [("x", a), ("y", b)]
    assert parse_eval_prompt_data([a, b]) == [("aime", a), ("gsm", b)]
    assert parse_eval_prompt_data(None) == []
    with pytest.raises(DataError, match="pairs"):
        parse_eval_prompt_data(["x", a, "y"])
    with pytest.raises(DataError, match="twice"):
        parse_eval_prompt_data(["x", a, "x", b])


def test_from_config_and_eval_sets(tmp_path, tok):
    train = write_jsonl(tmp_path / "train.jsonl", ROWS)
    ev = write_jsonl(tmp_path / "ev.jsonl", [{"q": "1 + 1 =", "a": "2"}, {"q": "2 + 2 =", "a": "4"}])
    cfg = parse_config(["--prompt-data", train, "--hf-checkpoint", "tiny:x", "--rm-type", "math",
                       "--input-key", "question", "--label-key", "answer", "--apply-chat-template",
                       "--rollout-shuffle", "--rollout-seed", "7", "--rollout-max-prompt-len", "9",
                       "--eval-prompt-data", "small", ev, "--eval-input-key", "q", "--eval-label-key", "a"])
    ds, evals = load_prompt_data(cfg, tok)
    assert ds.shuffle and ds.seed == 7 and ds.max_prompt_len == 9 and len(ds) == 7
    assert ds[0].prompt == "user : 1 + 2 = assistant :" and ds[0].label == "3"
    assert isinstance(evals, EvalDatasets) and list(evals) == ["small"] and len(evals["small"]) == 2
    assert evals["small"][1].label == "4" and not evals["small"].shuffle
    assert [p.index for p in evals["small"].all_prompts()] == [0, 1]
    with pytest.raises(KeyError, match="small"):
        evals["big"]


# ---------------------------------------------------------------------------------------------------------------
# bounded inputs (issue 27 item 3)

MEASURE = r'''
import json, resource, sys
from slime_actors.rows import RowKeys, scan_rows
from slime_actors.data import PromptDataset
from transformers import AutoTokenizer
path, model = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(model)
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = peak()
scan = scan_rows(path, RowKeys("input", "label"))            # the launcher's pass
ds = PromptDataset(path, tok, label_key="label")             # the buffer's, when it reads the file itself
print(json.dumps({"growth": peak() - start, "good": scan.good, "oversize": scan.oversize, "n": len(ds),
                  "ds_oversize": ds.oversize_at}))
'''


def test_a_50mb_row_costs_bounded_memory_and_is_counted_with_its_line(tmp_path):
    """A single 50 MB row used to make the job's processes peak at 11 GiB: the row is now skipped unread (counted,
    its line named), so reading the file costs a few MiB whatever the row holds. Measured in a fresh process, by
    the growth of its peak resident memory across the two readers (the unbounded reader grows by 200+ MiB on this
    file for the launcher's pass alone; the bound here is generous)."""
    import subprocess
    import sys
    path = tmp_path / "big.jsonl"
    with open(path, "w") as f:
        for i in range(5):
            f.write(json.dumps({"input": f"{i} + 1 =", "label": str(i + 1)}) + "\n")
        f.write(json.dumps({"input": "1 " * (25 << 20), "label": "1"}) + "\n")     # 50 MB
        for i in range(5):
            f.write(json.dumps({"input": f"{i} + 2 =", "label": str(i + 2)}) + "\n")
    assert path.stat().st_size > 50 << 20
    model = make_tiny_model(tmp_path / "tiny")
    p = subprocess.run([sys.executable, "-c", MEASURE, str(path), str(model)], capture_output=True, text=True,
                       timeout=300, check=True)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["good"] == 10 and out["n"] == 10
    assert out["oversize"] == [f"{path}:6"] and out["ds_oversize"] == [f"{path}:6"]
    assert out["growth"] < 40 << 20, f"reading the file grew the process by {out['growth'] >> 20} MiB"


def test_the_launcher_names_the_skipped_row_and_a_malformed_one_stops_the_job(tmp_path, capsys):
    from slime_actors.train import main
    path = tmp_path / "p.jsonl"
    path.write_text('{"input": "1 2 3 first =", "label": "1"}\n' + '{"input": "' + "1 " * 3_000_000 + '"}\n'
                    '{"input": "4 5 6 first =", "label": "4"}\n')
    flags = ["--prompt-data", str(path), "--hf-checkpoint", "tiny:digits", "--rm-type", "exact_match",
             "--label-key", "label", "--run-dir", str(tmp_path / "run"), "--rollout-batch-size", "2",
             "--prompt-data-max-row-bytes", "1000000", "--dry-run"]
    assert main(flags) == 0
    err = capsys.readouterr().err
    assert (f"note: {path}: 1 row(s) of more than 1000000 bytes skipped unread (--prompt-data-max-row-bytes): "
            f"{path}:2") in err
    with open(path, "a") as f:
        f.write('{"input": "7 8 9 first ="}\n')
    assert main(flags) == 2
    assert f"error: --prompt-data: {path}:4: missing label key 'label'" in capsys.readouterr().err


def test_prompts_too_long_for_the_model_are_dropped_with_their_lines(tmp_path, tok):
    """Without --rollout-max-prompt-len the bound is what the model's context leaves after the response (the tiny
    model's 256 tokens here), as the engine would refuse a longer prompt; the count and the first lines are
    logged."""
    rows = [{"input": "1 + 1 ="}, {"input": " ".join(["1"] * 300)}, {"input": "2 + 2 ="},
            {"input": " ".join(["2"] * 250)}]
    path = write_jsonl(tmp_path / "long.jsonl", rows)
    cfg = parse_config(["--prompt-data", path, "--hf-checkpoint", str(make_tiny_model(tmp_path / "m")),
                        "--rm-type", "math", "--rollout-max-response-len", "16"])
    with capture_logs() as logs:
        ds, _ = load_prompt_data(cfg, tok)
    assert [p.prompt for p in ds.prompts] == ["1 + 1 =", "2 + 2 ="]
    assert ds.stats["too_long"] == 2 and ds.too_long_at == [f"{path}:2", f"{path}:4"]
    (dropped,) = [e for e in logs if e["event"].startswith("dropped 2 prompt(s) longer than 240 tokens")]
    assert dropped["log_level"] == "warning" and dropped["first"] == f"{path}:2, {path}:4"
    assert "the model's context of 256 tokens (max_position_embeddings" in dropped["event"]


def test_an_oversize_parquet_row_is_counted_before_it_becomes_python(tmp_path, tok):
    rows = [{"input": "1 + 1 =", "meta": {"k": "v"}}, {"input": "1 " * 5000, "meta": {"k": "v"}},
            {"input": "2 + 2 =", "meta": {"k": "x" * 5000}}, {"input": "3 + 3 =", "meta": {"k": "v"}}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "o.parquet")
    ds = PromptDataset(tmp_path / "o.parquet", tok, metadata_key="meta", max_row_bytes=4000)
    assert [p.prompt for p in ds.prompts] == ["1 + 1 =", "3 + 3 ="]
    assert ds.stats["oversize"] == 2 and ds.oversize_at == [f"{tmp_path / 'o.parquet'} row 1",
                                                             f"{tmp_path / 'o.parquet'} row 2"]
