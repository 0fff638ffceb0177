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
            async with s.post(f"http://{host}:{port}/generate", data=b"[" * 100_000 + b"]" * 100_000) as r:
                deep = (r.status, (await r.json())["error"]["message"])   # (was a 500: Python's RecursionError)
            async with s.post(f"http://{host}:{port}/update_weights_from_disk", json={}) as r:
                admin = r.status
        await proxy.stop()
        return ok, bad, admin, deep
    ok, bad, admin, deep = asyncio.run(main())
    assert deep[0] == 400 and deep[1].startswith("the body is not JSON: nested too deep to be read"), deep
    assert ok == (200, {"text": "x", "meta_info": {"output_token_logprobs": [[-0.5, 7, None]]}})
    assert seen == [{"input_ids": [1, 2]}]
    assert bad == 400 and admin in (404, 405)   # control endpoints are not served


# ---------------------------------------------------------------------------------------------------------------
# a slime user's first run (issue 27 item 5): what the job will be, said at start; every mistake at once

def _train(argv, capsys) -> tuple[int, list[str]]:
    from slime_actors.train import main
    code = main(argv)
    return code, [ln.removeprefix("slime-actors train: ") for ln in capsys.readouterr().err.splitlines()]


def test_the_script_says_what_the_job_will_be(tmp_path, capsys, nothing_starts):
    _qwen_files(tmp_path)
    filter_path = "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"
    code, lines = _train(_tokens(QWEN3_4B_SCRIPT, tmp_path) + [
        "--dynamic-sampling-filter-path", filter_path, "--over-sampling-batch-size", "64",
        "--run-dir", str(tmp_path / "run"), "--dry-run"], capsys)
    assert code == 0, lines
    summary = [ln for ln in lines if not ln.startswith("note: ")]
    assert summary == [
        "job: cpu; 4 SGLang engines of 2 GPUs (colocated); torch backend: 8 ranks (ddp, CPU processes); 3000 steps "
        "of 32 prompts x 8 samples",
        "slime runs CUDA, Megatron by default; here: --device cuda --train-backend megatron (docs/flags.md lists "
        "every default that differs)",
        "--tensor-model-parallel-size 2 / --pipeline-model-parallel-size 1 are the megatron backend's; the torch "
        "backend ignores them (ddp: each rank holds the whole model) -- --train-backend megatron for tensor/pipeline "
        "parallelism, or --torch-parallel fsdp to shard",
        "dry run: every check passed; nothing was started"]
    notes = "\n".join(lines)
    assert f"note: --dynamic-sampling-filter-path {filter_path}: slime's function, here " \
           "slime_actors.filters.check_reward_nonzero_std" in notes
    # slime's scripts pass their torch_dist reference with --kl-loss-coef 0: not needed, not loaded, said so
    assert f"note: --ref-load {tmp_path}/Qwen3-4B_torch_dist (is an empty directory) is not loaded: with " \
           "--kl-loss-coef 0 the KL term adds nothing" in notes
    assert not (tmp_path / "run").exists()


def test_the_script_with_several_mistakes_hears_of_them_all_at_once(tmp_path, capsys, nothing_starts):
    """slime's defaults (SGLang engines) left out, slime's SFT rollout, a reward of slime's rm_hub, a layer count
    that is not the model's and a KL weight that needs the torch_dist reference: one run names all five."""
    _qwen_files(tmp_path)
    argv = QWEN3_4B_SCRIPT.format(D=tmp_path).replace("--num-layers 36", "--num-layers 35").replace(
        "--kl-loss-coef 0.00", "--kl-loss-coef 0.01").split()
    code, lines = _train(argv + ["--rollout-function-path", "slime.rollout.sft_rollout.generate_rollout",
                                 "--custom-rm-path", "slime.rollout.rm_hub.math_utils.grade_answer_verl",
                                 "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 2
    assert lines[0] == "5 problems, nothing was started:"
    errors = [ln.removeprefix("error: ") for ln in lines[1:]]
    assert len(errors) == 5
    assert errors[0].startswith("--rollout-function-path slime.rollout.sft_rollout.generate_rollout: slime's SFT "
                                "rollout")
    assert errors[1].startswith("--custom-rm-path slime.rollout.rm_hub.math_utils.grade_answer_verl: a module of "
                                "slime, which slime-actors does not include")
    assert errors[2].startswith("--rollout-num-gpus-per-engine 2: the local engine (--rollout-engine local, the "
                                "default) runs one model on one device; an engine over several GPUs is SGLang's: add "
                                "--rollout-engine sglang")
    assert errors[3].startswith(f"--num-layers 35: {tmp_path}/Qwen3-4B/config.json says 36")
    assert errors[4].startswith(f"--ref-load {tmp_path}/Qwen3-4B_torch_dist: is an empty directory; expected a "
                                "Hugging Face model directory")
    assert not (tmp_path / "run").exists()


def test_the_default_jobs_summary_is_short_and_names_what_the_local_engine_ignores(tmp_path, capsys, nothing_starts):
    config = str(ROOT / "examples" / "digits" / "config.toml")
    code, lines = _train(["--config", config, "--run-dir", str(tmp_path / "r"), "--dry-run"], capsys)
    assert code == 0 and lines == [
        "job: cpu; 1 local engine; torch backend: 1 rank (ddp, CPU processes); 60 steps of 16 prompts x 8 samples",
        "slime runs CUDA, SGLang engines, Megatron by default; here: --device cuda --rollout-engine sglang "
        "--train-backend megatron (docs/flags.md lists every default that differs)",
        "dry run: every check passed; nothing was started"]
    code, lines = _train(["--config", config, "--run-dir", str(tmp_path / "r"), "--device", "cpu",
                          "--sglang-cuda-graph-max-bs", "8", "--sglang-mem-fraction-static", "0.5",
                          "--sglang-enable-torch-compile", "--dry-run"], capsys)
    assert code == 0 and lines[1] == ("slime runs SGLang engines, Megatron by default; here: --rollout-engine sglang "
                                      "--train-backend megatron (docs/flags.md lists every default that differs)")
    assert lines[2] == ("the local engine ignores --sglang-cuda-graph-max-bs, --sglang-enable-torch-compile (SGLang's "
                        "own settings; --rollout-engine sglang uses them)")


# config.json of the families (the keys their Hugging Face configs have)
GLM4_9B_CONFIG = {"architectures": ["Glm4ForCausalLM"], "model_type": "glm4", "hidden_act": "silu",
                  "hidden_size": 4096, "intermediate_size": 13696, "num_hidden_layers": 40, "num_attention_heads": 32,
                  "num_key_value_heads": 2, "head_dim": 128, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05,
                  "rope_theta": 10000.0, "vocab_size": 151552, "tie_word_embeddings": False, "attention_bias": True,
                  "max_position_embeddings": 32768}
QWEN3_30B_A3B_CONFIG = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_act": "silu",
                        "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
                        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                        "num_experts": 128, "num_experts_per_tok": 8, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
                        "vocab_size": 151936, "tie_word_embeddings": False, "max_position_embeddings": 40960}
DEEPSEEK_V3_CONFIG = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_act": "silu",
                      "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
                      "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
                      "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5,
                      "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
                      "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
                      "first_k_dense_replace": 3, "rms_norm_eps": 1e-06, "rope_theta": 10000, "vocab_size": 129280,
                      "tie_word_embeddings": False, "max_position_embeddings": 163840,
                      "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                       "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                       "type": "yarn"}}
# MODEL_ARGS of slime's scripts/models/glm4-9B.sh, qwen3-30B-A3B.sh, deepseek-v3.sh (624b824a8), the layer
# frequency written out as the scripts compute it
GLM4_9B_ARGS = """--spec slime_plugins.models.glm4 get_glm_spec --swiglu --num-layers 40 --hidden-size 4096
--ffn-hidden-size 13696 --num-attention-heads 32 --group-query-attention --num-query-groups 2
--use-rotary-position-embeddings --disable-bias-linear --add-qkv-bias --normalization RMSNorm --norm-epsilon 1e-5
--rotary-base 10000 --vocab-size 151552 --post-self-attn-layernorm --post-mlp-layernorm --rotary-interleaved
--rotary-percent 0.5 --no-rope-fusion --untie-embeddings-and-output-weights"""
QWEN3_30B_A3B_ARGS = """--disable-bias-linear --qk-layernorm --group-query-attention --num-attention-heads 32
--num-query-groups 4 --kv-channels 128 --num-layers 48 --hidden-size 2048 --ffn-hidden-size 6144 --normalization RMSNorm
--position-embedding-type rope --norm-epsilon 1e-6 --rotary-percent 1.0 --swiglu --untie-embeddings-and-output-weights
--vocab-size 151936 --rotary-base 1000000 --moe-ffn-hidden-size 768 --moe-router-score-function softmax
--moe-token-dispatcher-type alltoall --moe-router-topk 8 --moe-layer-freq [1]*48 --num-experts 128 --moe-grouped-gemm
--moe-token-drop-policy probs --moe-router-dtype fp32 --moe-permute-fusion --moe-aux-loss-coeff 0"""
DEEPSEEK_V3_ARGS = """--disable-bias-linear --num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432
--num-attention-heads 128 --kv-channels 128 --normalization RMSNorm --position-embedding-type rope --norm-epsilon 1e-6
--swiglu --untie-embeddings-and-output-weights --vocab-size 129280 --multi-latent-attention --q-lora-rank 1536
--kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 --qk-layernorm
--rotary-scaling-factor 40 --rotary-base 10000 --mscale 1.0 --mscale-all-dim 1.0 --attention-softmax-in-fp32
--no-rope-fusion --num-experts 256 --moe-layer-freq [0]*3+[1]*58 --moe-ffn-hidden-size 2048 --moe-router-topk 8
--moe-shared-expert-intermediate-size 2048 --moe-router-pre-softmax --moe-router-score-function sigmoid
--moe-router-enable-expert-bias --moe-router-load-balancing-type seq_aux_loss --moe-token-dispatcher-type alltoall
--moe-aux-loss-coeff 0 --moe-router-bias-update-rate 0 --moe-router-group-topk 4 --moe-router-num-groups 8
--moe-grouped-gemm --moe-router-topk-scaling-factor 2.5 --moe-router-dtype fp32 --moe-permute-fusion
--decoder-last-pipeline-num-layers 13"""


@pytest.mark.parametrize("family,config,args,checked,refuse", [
    ("GLM4", GLM4_9B_CONFIG, GLM4_9B_ARGS,
     "--post-self-attn-layernorm, --post-mlp-layernorm, --rotary-interleaved, --rotary-percent 0.5",
     ("--num-query-groups 2", "--num-query-groups 4", "says 2")),
    ("Qwen3-MoE", QWEN3_30B_A3B_CONFIG, QWEN3_30B_A3B_ARGS, "--num-experts 128, --moe-router-topk 8",
     ("--moe-ffn-hidden-size 768", "--moe-ffn-hidden-size 512", "says 768")),
    ("DeepSeek-V3", DEEPSEEK_V3_CONFIG, DEEPSEEK_V3_ARGS,
     "--q-lora-rank 1536, --kv-lora-rank 512, --qk-head-dim 128, --qk-pos-emb-head-dim 64, --v-head-dim 128, "
     "--mscale 1.0, --mscale-all-dim 1.0, --moe-router-group-topk 4, --moe-router-num-groups 8",
     ("--moe-router-num-groups 8", "--moe-router-num-groups 4", "says 8")),
])
def test_slimes_model_families_are_accepted_and_checked(tmp_path, family, config, args, checked, refuse):
    from slime_actors.config import ConfigError, parse_config
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    base = ["--config", str(ROOT / "examples" / "digits" / "config.toml"), "--hf-checkpoint", str(model)]
    cfg = parse_config(base + args.split())
    notes = "\n".join(cfg.notes)
    (agree,) = [n for n in cfg.notes if "these agree with it: " in n]
    assert set(checked.split(", ")) <= set(agree.split("these agree with it: ")[1].split(", ")), agree
    assert f"model family {family}" in notes and "the torch backend and the local engine run it through transformers" \
        in notes and "the megatron backend does not" in notes
    wrong = args.replace(refuse[0], refuse[1])
    with pytest.raises(ConfigError, match=f"{refuse[1]}: .*{refuse[2]}"):
        parse_config(base + wrong.split())
    with pytest.raises(ConfigError, match=f"--train-backend megatron: the model is '{config['model_type']}'"):
        parse_config(base + args.split() + ["--train-backend", "megatron"])


def test_a_family_flag_on_a_model_without_it_is_refused(tmp_path):
    from slime_actors.config import ConfigError, parse_config
    from test_flags import QWEN3_4B_CONFIG
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_4B_CONFIG))
    with pytest.raises(ConfigError) as exc:
        parse_config(["--config", str(ROOT / "examples" / "digits" / "config.toml"), "--hf-checkpoint",
                      str(tmp_path), "--post-mlp-layernorm", "--multi-latent-attention"])
    assert exc.value.problems == [
        f"--post-mlp-layernorm: {tmp_path}/config.json describes a model without it (model_type 'qwen3'); the model "
        "trained is the one config.json describes -- drop the flag or use the matching checkpoint",
        f"--multi-latent-attention: {tmp_path}/config.json describes a model without it (model_type 'qwen3'); the "
        "model trained is the one config.json describes -- drop the flag or use the matching checkpoint"]


def test_function_paths_are_checked_at_parse_time(tmp_path):
    """slime's paths map to the built-ins or are refused with the reason; a path of the user's that names nothing
    is refused before the job starts (found without running the module)."""
    from slime_actors.config import ConfigError, parse_config
    base = ["--config", str(ROOT / "examples" / "digits" / "config.toml")]
    cfg = parse_config(base + ["--rollout-function-path", "slime.rollout.sglang_rollout.generate_rollout",
                               "--dynamic-sampling-filter-path", "slime.rollout.filter_hub.dynamic_sampling_filters."
                               "check_reward_nonzero_std_with_fallback"])
    assert cfg.rollout.rollout_function_path is None
    assert cfg.rollout.dynamic_sampling_filter_path == "slime_actors.filters.check_reward_nonzero_std_with_fallback"
    assert any(n.startswith("--rollout-function-path slime.rollout.sglang_rollout.generate_rollout: slime's "
                            "function, here the built-in one") for n in cfg.notes)
    rewards = tmp_path / "my_rewards.py"
    rewards.write_text("import math\n\nasync def score(args, sample):\n    return 1.0\n")
    assert parse_config(base + ["--custom-rm-path", f"{rewards}:score"]).reward.custom_rm_path == f"{rewards}:score"
    with pytest.raises(ConfigError) as exc:
        parse_config(base + ["--custom-rm-path", f"{rewards}:scor", "--dynamic-sampling-filter-path",
                             "slime_actors.filters.no_such_filter", "--custom-generate-function-path",
                             "no_such_package.gen.generate", "--rollout-function-path",
                             "slime.rollout.fully_async_rollout.generate_rollout_fully_async"])
    assert exc.value.problems == [
        "--rollout-function-path slime.rollout.fully_async_rollout.generate_rollout_fully_async: slime's fully "
        "asynchronous rollout is not implemented here; --async-train generates the next rollout while the trainer "
        "trains on this one",
        "--dynamic-sampling-filter-path: cannot load 'slime_actors.filters.no_such_filter': "
        f"{ROOT}/slime_actors/filters.py defines no 'no_such_filter'; did you mean call_filter?",
        "--custom-generate-function-path: cannot load 'no_such_package.gen.generate': module 'no_such_package.gen' "
        "not found (is its directory on PYTHONPATH? a file can be named as 'path/to/file.py:function')",
        f"--custom-rm-path: cannot load '{rewards}:scor': {rewards} defines no 'scor'; did you mean score?"]
