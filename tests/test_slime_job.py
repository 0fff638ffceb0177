"""A job run the way a slime user runs one: slime's 3-argument custom generate function, --log-passrate, W&B in
offline mode; its console read as a person reads it. Plus slime's Qwen3-4B launch script through the parser."""

import asyncio
import glob
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "digits" / "config.toml"
BIN = Path(sys.executable).parent / "slime-actors"

try:
    import wandb  # noqa: F401
    HAVE_WANDB = True
except ImportError:
    HAVE_WANDB = False

# slime's own generate function, as a user ports it: slime's signature, slime's way of reaching the engine (the
# router address in args, SGLang's /generate body, no key), slime's Sample writes; only the imports changed
SLIME_STYLE_GENERATE = '''
import json, os
import aiohttp
from slime_actors.types import Sample


async def generate(args, sample: Sample, sampling_params) -> Sample:
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    payload = {"input_ids": sample.prompt_tokens, "sampling_params": sampling_params, "return_logprob": True}
    async with aiohttp.ClientSession() as s:
        async with s.post(url, json=payload) as r:
            assert r.status == 200, await r.text()
            output = await r.json()
    pairs = output["meta_info"]["output_token_logprobs"]
    response_ids = [p[1] for p in pairs]
    sample.tokens = sample.prompt_tokens + response_ids
    sample.response_length = len(response_ids)
    sample.rollout_log_probs = [p[0] for p in pairs]
    match output["meta_info"]["finish_reason"]["type"]:
        case "length":
            sample.status = Sample.Status.TRUNCATED
        case "abort":
            sample.status = Sample.Status.ABORTED
        case _:
            sample.status = Sample.Status.COMPLETED
    with open(os.environ["GEN_CALLS"], "a") as f:
        f.write(json.dumps({"url": url, "n": len(response_ids)}) + "\\n")
    return sample
'''


def wandb_history(run_dir: Path) -> list[dict]:
    """The history rows of an offline W&B run: its .wandb file is a LevelDB-style log of protobuf records (32 KiB
    blocks, 7-byte record headers: crc32, length, type full/first/middle/last) after a 7-byte ":W&B" file header."""
    from wandb.proto import wandb_internal_pb2 as pb
    (path,) = glob.glob(str(run_dir / "wandb" / "wandb" / "offline-run-*" / "run-*.wandb"))
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, buf, rows = 7, b"", []
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        chunk, pos = data[pos:pos + length], pos + length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf + chunk if kind == 4 else chunk)
            if rec.WhichOneof("record_type") == "history":
                rows.append({it.key or "/".join(it.nested_key): json.loads(it.value_json) for it in rec.history.item})
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
    return rows


@pytest.mark.slow
def test_a_slime_users_job(tmp_path):
    gen = tmp_path / "slime_gen.py"
    gen.write_text(SLIME_STYLE_GENERATE)
    calls = tmp_path / "calls.jsonl"
    run = tmp_path / "run"
    flags = ["--num-rollout", "3", "--eval-interval", "2", "--n-samples-per-eval-prompt", "2",
             "--custom-generate-function-path", f"{gen}:generate", "--log-passrate", "--use-tensorboard"]
    if HAVE_WANDB:
        flags += ["--use-wandb", "--wandb-mode", "offline", "--wandb-project", "slime-actors-test", "--wandb-group",
                  "digits"]
    env = {**os.environ, "GEN_CALLS": str(calls), "WANDB_SILENT": "true"}
    env.pop("WANDB_API_KEY", None)
    p = subprocess.run([str(BIN), "train", "--config", str(CONFIG), "--run-dir", str(run), *flags],
                       capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-6000:]}"

    # slime's generate function made every sample, through the worker's proxy (it sent no key; the engine has one)
    made = [json.loads(x) for x in calls.read_text().splitlines()]
    assert len(made) == 3 * 16 * 8 + 3 * 100 * 2          # 3 rollouts of 16 x 8, 3 evals of 100 prompts x 2
    assert {m["url"].startswith("http://127.0.0.1:") for m in made} == {True}
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [0, 1, 2]
    assert all(r["train/train_rollout_logprob_abs_diff_max"] <= 1e-5 for r in rows)   # its log-probs were used

    # --log-passrate: pass@k of the rollouts (8 samples: k = 1..8) and of the evals (2 samples)
    for r in rows:
        assert {"passrate/pass@1", "passrate/pass@2", "passrate/pass@4", "passrate/pass@8"} <= set(r)
        assert r["passrate/pass@1"] == pytest.approx(r["rollout/reward_mean"])          # exact_match: 0 or 1
        assert r["passrate/pass@1"] <= r["passrate/pass@2"] <= r["passrate/pass@8"]
    assert "eval/heldout-pass@2" in rows[1] and "eval/heldout" in rows[1]

    # a console a person reads: lines only (stderr is a pipe: no progress bar, no carriage returns), no warnings
    # at this clean end, no book-keeping lines
    err = p.stderr
    assert "\r" not in err and "it/s]" not in err and "step/s" not in err
    assert "peer down" not in err and "[warning" not in err, err[-3000:]
    assert "actor started" not in err and "registered" not in err
    assert "rollout 0 samples (group" in err and "[info     ] step" in err

    # the run replays, every actor: the generate function's results are recorded inputs (it reached the engine over
    # HTTP, which a replay cannot), so the rollout worker sends what it sent without calling it again (issue 22)
    from slime_actors.traces.reader import TraceRun
    from slime_actors.traces.replay import replay
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        for actor in TraceRun(run).actors():
            rep = replay(str(run), actor)
            assert rep.identical, rep.render()
    finally:
        os.chdir(cwd)
    assert len(calls.read_text().splitlines()) == len(made)  # (not called by the replay)

    if not HAVE_WANDB:
        pytest.skip("wandb is not installed: its offline run was not checked (pip install wandb)")
    hist = wandb_history(run)
    by_step: dict[int, dict] = {}
    for h in hist:
        by_step.setdefault(h["rollout_id"], {}).update(h)
    for r in rows:   # every number of metrics.jsonl, at its rollout id, with its value
        w = by_step[r["rollout_id"]]
        for k, v in r.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                assert k in w, k
                assert w[k] == pytest.approx(v, rel=1e-6, abs=1e-9), (k, w[k], v)
    tables = {k.rsplit("/_type", 1)[0] for h in hist for k, v in h.items() if k.endswith("/_type") and
              v == "table-file"}
    assert {"rollout/samples", "eval/heldout/responses"} <= tables
    assert any(h.get("curves/_type") == "image-file" for h in hist)
    assert (run / "wandb" / "run_id").read_text().strip()


# ---------------------------------------------------------------------------------------------------------------
# slime's scripts/run-qwen3-4B.sh (THUDM/slime 624b824a8), its flags as train.py gets them: scripts/models/
# qwen3-4B.sh's MODEL_ARGS, then CKPT, ROLLOUT, OPTIMIZER, GRPO, PERF, EVAL, SGLANG and MISC args, after
# `--actor-num-nodes 1 --actor-num-gpus-per-node ${NUM_GPUS} --colocate`; /root/... paths are given here as
# files of the test, $NUM_GPUS as 8
QWEN3_4B_SCRIPT = """
--actor-num-nodes 1 --actor-num-gpus-per-node 8 --colocate
--swiglu --num-layers 36 --hidden-size 2560 --ffn-hidden-size 9728 --num-attention-heads 32
--group-query-attention --num-query-groups 8 --use-rotary-position-embeddings --disable-bias-linear
--normalization RMSNorm --norm-epsilon 1e-6 --rotary-base 1000000 --vocab-size 151936 --kv-channels 128
--qk-layernorm
--hf-checkpoint {D}/Qwen3-4B --ref-load {D}/Qwen3-4B_torch_dist --load {D}/Qwen3-4B_slime/ --save {D}/Qwen3-4B_slime/
--save-interval 20
--prompt-data {D}/dapo-math-17k.jsonl --input-key prompt --label-key label --apply-chat-template --rollout-shuffle
--rm-type deepscaler --num-rollout 3000 --rollout-batch-size 32 --n-samples-per-prompt 8
--rollout-max-response-len 8192 --rollout-temperature 1 --global-batch-size 256 --balance-data
--optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98
--advantage-estimator grpo --use-kl-loss --kl-loss-coef 0.00 --kl-loss-type low_var_kl --entropy-coef 0.00
--eps-clip 0.2 --eps-clip-high 0.28
--tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 1 --context-parallel-size 1
--expert-model-parallel-size 1 --expert-tensor-parallel-size 1 --recompute-granularity full
--recompute-method uniform --recompute-num-layers 1 --use-dynamic-batch-size --max-tokens-per-gpu 9216
--eval-interval 20 --eval-prompt-data aime {D}/aime-2024.jsonl --n-samples-per-eval-prompt 16
--eval-max-response-len 16384 --eval-top-p 1
--rollout-num-gpus-per-engine 2 --sglang-mem-fraction-static 0.7
--attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32 --attention-softmax-in-fp32
--attention-backend flash
"""
# the script's commented-out flags a user turns on
QWEN3_4B_WANDB = "--use-wandb --wandb-project slime-dev --wandb-group qwen3-4B-test"


def _qwen_files(d: Path) -> None:
    from test_flags import QWEN3_4B_CONFIG
    (d / "Qwen3-4B").mkdir()
    (d / "Qwen3-4B" / "config.json").write_text(json.dumps(QWEN3_4B_CONFIG))
    (d / "Qwen3-4B_torch_dist").mkdir()
    rows = "".join(json.dumps({"prompt": [{"role": "user", "content": f"{i} + {i} = ?"}], "label": str(2 * i)}) + "\n"
                   for i in range(40))
    (d / "dapo-math-17k.jsonl").write_text(rows)
    (d / "aime-2024.jsonl").write_text(rows)


def _tokens(script: str, d: Path) -> list[str]:
    # slime's engines are SGLang's; here the default is the local engine, which runs no engine over 2 GPUs
    # (--rollout-num-gpus-per-engine 2): the script asks for what the job summary tells it to
    return script.format(D=d).split() + ["--rollout-engine", "sglang"]


def test_slimes_qwen3_4b_script_through_the_parser(tmp_path):
    """Every flag of slime's Qwen3-4B launch script is honoured (its value lands in the config), or accepted with a
    note saying it changes nothing here, or checked against the model's config.json -- none is silently dropped."""
    from slime_actors.config import COMPAT_DEST, FIELDS, build_parser
    from slime_actors.launch.job_config import build_job_config
    from slime_actors.slime_compat import COMPAT
    _qwen_files(tmp_path)
    argv = _tokens(QWEN3_4B_SCRIPT, tmp_path)
    cfg, _ = build_job_config(argv)
    notes = "\n".join(cfg.notes)
    flags = [t for t in argv if t.startswith("--")]
    fields = {s.option: s for s in FIELDS.values() if s.cli}
    honoured, noted = [], []
    for f in flags:
        if f.startswith("--sglang-"):          # passed on to SGLang, checked against its parser
            assert cfg.engine.sglang_args == ["--mem-fraction-static", "0.7"]
            honoured.append(f)
        elif f in fields:
            honoured.append(f)
        else:
            assert f in COMPAT, f"{f}: neither a flag of ours nor one accepted from slime's scripts"
            assert f in notes, f"{f} was accepted without a note"
            noted.append(f)
    assert len(honoured) + len(noted) == len(flags)
    # the values of the honoured flags are the script's
    assert (cfg.train.actor_num_gpus_per_node, cfg.engine.colocate, cfg.train.tensor_model_parallel_size) == (8, True, 2)
    assert cfg.engine.rollout_num_engines == 4                      # --colocate: 8 GPUs / 2 per engine, as in slime
    assert (cfg.rollout.rollout_batch_size, cfg.rollout.n_samples_per_prompt, cfg.train.global_batch_size) == \
        (32, 8, 256)
    assert cfg.train.num_steps_per_rollout == 1 and cfg.run.num_rollout == 3000
    assert (cfg.algorithm.eps_clip, cfg.algorithm.eps_clip_high, cfg.algorithm.kl_loss_type) == (0.2, 0.28,
                                                                                                  "low_var_kl")
    assert (cfg.eval.eval_top_p, cfg.eval.n_samples_per_eval_prompt, cfg.eval.eval_max_response_len) == (1.0, 16,
                                                                                                         16384)
    assert cfg.eval.eval_prompt_data == ["aime", str(tmp_path / "aime-2024.jsonl")]
    assert (cfg.train.weight_decay, cfg.train.adam_beta2, cfg.train.max_tokens_per_gpu) == (0.1, 0.98, 9216)
    assert cfg.data.apply_chat_template and cfg.data.input_key == "prompt" and cfg.reward.rm_type == "deepscaler"
    # what the notes say about the rest
    assert "no effect here" in notes and "--sequence-parallel" in notes and "--recompute-method uniform" in notes
    assert "what this project does anyway: --context-parallel-size 1" in notes and "--optimizer adam" in notes
    assert "these agree with it: --num-layers 36, --hidden-size 2560" in notes and "--kv-channels 128" in notes
    assert len(build_parser()._actions) > len(fields) and COMPAT_DEST
    # with the script's W&B lines turned on
    cfg, _ = build_job_config(argv + QWEN3_4B_WANDB.split())
    assert cfg.logging.use_wandb and cfg.logging.wandb_group == "qwen3-4B-test" or not HAVE_WANDB


@pytest.mark.parametrize("find,replace,message", [
    ("--hidden-dropout 0.0", "--hidden-dropout 0.1", "--hidden-dropout 0.1: not supported: dropout is off"),
    ("--lr-decay-style constant", "--lr-decay-style cosine", "--lr-decay-style cosine: not supported"),
    ("--num-layers 36", "--num-layers 28", "--num-layers 28: "),
    ("--context-parallel-size 1", "--context-parallel-size 2", "--context-parallel-size 2: not supported"),
    ("--colocate", "--colocate --rollout-num-gpus 5",
     "--rollout-num-gpus (5) must be a multiple of --rollout-num-gpus-per-engine (2)"),
])
def test_the_script_with_a_value_that_would_change_the_result_is_refused(tmp_path, find, replace, message):
    """Edit one of the script's flags to a value this project would not honour: the job refuses to start, naming
    the flag and why."""
    from slime_actors.config import ConfigError
    from slime_actors.launch.job_config import build_job_config
    _qwen_files(tmp_path)
    assert find in QWEN3_4B_SCRIPT
    with pytest.raises(ConfigError) as exc:
        build_job_config(_tokens(QWEN3_4B_SCRIPT.replace(find, replace), tmp_path))
    assert message in str(exc.value)


def test_the_script_with_a_slime_feature_this_project_lacks_is_refused(tmp_path):
    from slime_actors.config import ConfigError
    from slime_actors.launch.job_config import build_job_config
    _qwen_files(tmp_path)
    with pytest.raises(ConfigError, match=r"--use-opsm is slime's flag, not supported by slime-actors: off-policy "
                                          r"sequence masking"):
        build_job_config(_tokens(QWEN3_4B_SCRIPT, tmp_path) + ["--use-opsm"])


def test_generate_style_detection(tmp_path):
    from slime_actors.actors.rollout import generate_style
    from slime_actors.plugins import PluginError

    async def slime3(args, sample, sampling_params):
        pass

    async def slime_eval(args, sample, sampling_params, evaluation=False):
        pass

    async def ours(args, sample, sampling_params, engine):
        pass

    async def two(args, sample):
        pass
    assert generate_style(slime3, "m.f") == "slime" and generate_style(slime_eval, "m.f") == "slime"
    assert generate_style(ours, "m.f") == "engine"
    with pytest.raises(PluginError, match=r"--custom-generate-function-path m.f: expected async generate\(args, "
                                          r"sample, sampling_params\) \(slime's\) or"):
        generate_style(two, "m.f")


def test_generate_proxy_forwards_generate_only(tmp_path):
    import aiohttp

    from slime_actors.backends.generate_proxy import GenerateProxy
    seen = []

    async def forward(body):
        seen.append(body)
        return 200, {"text": "x", "meta_info": {"output_token_logprobs": [[-0.5, 7, None]]}}

    async def main():
        proxy = GenerateProxy(forward)
        host, port = await proxy.start()
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://{host}:{port}/generate", json={"input_ids": [1, 2]}) as r:
                ok = (r.status, await r.json())
            async with s.post(f"http://{host}:{port}/generate", data=b"not json") as r:
                bad = r.status
            async with s.post(f"http://{host}:{port}/update_weights_from_disk", json={}) as r:
                admin = r.status
        await proxy.stop()
        return ok, bad, admin
    ok, bad, admin = asyncio.run(main())
    assert ok == (200, {"text": "x", "meta_info": {"output_token_logprobs": [[-0.5, 7, None]]}})
    assert seen == [{"input_ids": [1, 2]}]
    assert bad == 400 and admin in (404, 405)   # control endpoints are not served
