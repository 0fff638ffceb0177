"""LoRA (issue 32) on CPU with the tiny model: the flags and their checks, training steps through peft, the reference
model as the base with the adapters off, adapter-only checkpoints that resume exactly, the PEFT export (and the
merged one) loading in transformers / peft with the trainer's logits, the local engine serving adapters (its
outputs follow the trainer's adapters, log-probs agree as for full weights), and the megatron backend's refusal."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from slime_actors.backends import lora as L
from slime_actors.backends.rl_update import rl_update
from slime_actors.config import MEGATRON_LORA_REFUSAL, ConfigError
from test_torch_backend import D, EOS, backend_for, make_args, make_batch, toy_batch, weights

torch.set_num_threads(1)
LLAMA_LINEAR = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    from slime_actors.models.tiny import make_tiny_model
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


def lora_args(tmp, model_dir, **kw):
    return make_args(tmp, model_dir, **{"lora_rank": 4, "lr": 1e-2, "clip_grad": 1.0, **kw})


def logits_of(model, tokens) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0].float()


# -- flags ----------------------------------------------------------------------------------------------------------

def parse(tmp, model_dir, *argv):
    """The real parser on the tiny model's job plus `argv` (list flags take several values)."""
    from slime_actors.config import parse_config
    make_args(tmp, model_dir)   # writes the prompt file
    return parse_config(["--prompt-data", str(tmp / "prompts.jsonl"), "--hf-checkpoint", model_dir, "--rm-type",
                         "exact_match", "--run-dir", str(tmp / "run"), *argv])


def test_flags_are_checked_at_parse_time(tmp_path, tiny_dir):
    def err(*argv):
        with pytest.raises(ConfigError) as exc:
            parse(tmp_path, tiny_dir, *argv)
        return str(exc.value)

    assert "--lora-rank must be >= 0" in err("--lora-rank", "-1")
    assert err("--lora-alpha", "16") == ("--lora-alpha given without --lora-rank: LoRA is off (give --lora-rank N, "
                                         "N > 0)")
    assert "--lora-dropout must be in [0, 1)" in err("--lora-rank", "4", "--lora-dropout", "1.5")
    assert "--lora-alpha must be > 0" in err("--lora-rank", "4", "--lora-alpha", "0")
    assert "'q.proj' is not a module name" in err("--lora-rank", "4", "--lora-target-modules", "q_proj", "q.proj")
    assert "give it alone" in err("--lora-rank", "4", "--lora-target-modules", "all-linear", "q_proj")
    assert "--lora-save-merged writes next to --save-hf" in err("--lora-rank", "4", "--lora-save-merged")
    assert "invalid choice" in err("--lora-rank", "4", "--lora-sync", "bucket")
    # the megatron backend refuses LoRA, saying why
    assert err("--lora-rank", "4", "--train-backend", "megatron") == MEGATRON_LORA_REFUSAL
    assert "the megatron backend (megatron-core's GPTModel) has no LoRA" in MEGATRON_LORA_REFUSAL
    cfg = parse(tmp_path, tiny_dir, "--lora-rank", "8")
    assert cfg.lora.lora_alpha == 16.0 and cfg.lora.lora_target_modules == ["all-linear"]


def test_module_names_are_checked_against_the_model(tmp_path, tiny_dir):
    from slime_actors.config import Problems
    from slime_actors.launch.checks import check_lora_flags

    def check(cfg):
        problems = Problems()
        check_lora_flags(cfg, problems)
        problems.raise_if_any()

    cfg = make_args(tmp_path, tiny_dir, lora_rank=4)
    check(cfg)   # all-linear, spelled out: the trainer and the engines' --lora-target-modules agree
    assert cfg.lora.lora_target_modules == LLAMA_LINEAR
    cfg = parse(tmp_path, tiny_dir, "--lora-rank", "4", "--lora-target-modules", "q_proj", "qproj",
                "--lora-exclude-modules", "mlp")
    with pytest.raises(ConfigError) as exc:   # every unknown name at once, with the model's names
        check(cfg)
    msg = str(exc.value)
    assert "--lora-target-modules qproj: no linear layer of that name" in msg
    assert "--lora-exclude-modules mlp: no linear layer of that name" in msg
    assert "the model's linear layers: " + " ".join(LLAMA_LINEAR) in msg
    cfg = parse(tmp_path, tiny_dir, "--lora-rank", "4", "--lora-exclude-modules", "down_proj", "gate_proj",
                "up_proj")
    check(cfg)
    assert cfg.lora.lora_target_modules == ["k_proj", "o_proj", "q_proj", "v_proj"]
    # the built-in specs are read without making the model
    assert L.spec_linear_names("tiny:anything") == {n: 2 for n in LLAMA_LINEAR}


# -- training -------------------------------------------------------------------------------------------------------

def test_training_moves_the_adapters_only_and_the_reference_is_the_base(tmp_path, tiny_dir):
    args = lora_args(tmp_path, tiny_dir, use_kl_loss=True, kl_loss_coef=0.1)
    b = backend_for(args)
    base = backend_for(make_args(tmp_path, tiny_dir))   # the same model without LoRA
    summary = b.lora_summary()
    # rank 4 on every linear layer of 2 layers: q,k,v,o (64x64, kv 64->32) and the MLP (64<->128)
    assert summary["targets"] == LLAMA_LINEAR and 0 < summary["trainable_params"] < summary["total_params"] / 5
    # no second copy of the weights for the reference model: the actor with its adapters off
    assert b.ref_model is None
    n_params = sum(p.numel() for p in b._raw_model.parameters())
    assert n_params == sum(p.numel() for p in base._raw_model.parameters()) + summary["trainable_params"]
    opt_params = [p for g in b.optimizer.param_groups for p in g["params"]]
    assert sum(p.numel() for p in opt_params) == summary["trainable_params"]
    w0 = weights(b)
    assert all(torch.equal(w0[k], v) for k, v in weights(base).items())   # B = 0: the merged weights are the base
    for k in range(3):
        m = rl_update(b, args, toy_batch(), k)
    assert m["ref_kl"] > 0 and "kl_loss" in m
    batch = toy_batch()
    ref, _ = b.compute_log_probs(batch, model="ref")
    actor, _ = b.compute_log_probs(batch, model="actor")
    plain, _ = base.compute_log_probs(batch)
    assert all(torch.equal(r, p) for r, p in zip(ref, plain))                 # adapters off: exactly the base
    assert max((a - p).abs().max().item() for a, p in zip(actor, plain)) > 1e-3   # the adapters trained
    # the frozen base did not move (merged weights minus the adapters' product are the initial weights)
    ad = b.adapter_weights()
    assert ad and all(k.startswith("base_model.model.") and (".lora_A." in k or ".lora_B." in k) for k in ad)
    assert any(v.abs().sum() > 0 for k, v in ad.items() if ".lora_B." in k)
    raw_state = b._raw_model.state_dict()
    for k, v in raw_state.items():
        if ".base_layer." in k or ("lora_" not in k):
            hf = L._hf_name(k)
            if hf in w0:
                assert torch.equal(v, w0[hf]), k


@pytest.mark.parametrize("estimator", ["ppo", "reinforce_plus_plus", "gspo"])
def test_other_estimators_train_with_lora(tmp_path, tiny_dir, estimator):
    extra = {"kl_coef": 0.05} if estimator != "gspo" else {}
    args = lora_args(tmp_path, tiny_dir, advantage_estimator=estimator, gamma=0.9, lambd=0.95, **extra)
    b = backend_for(args)
    batch = make_batch([[D(2), EOS], [D(3), EOS], [D(2), D(4)], [D(1)]], [1, 0, 1, 0], groups=[0, 0, 1, 1])
    a0 = {k: v.clone() for k, v in b.adapter_weights().items()}
    m = rl_update(b, args, batch, 0)
    assert all(torch.isfinite(torch.tensor(v)) for v in m.values())
    assert any(not torch.equal(a0[k], v) for k, v in b.adapter_weights().items())
    if extra:
        assert "ref_kl" in m


def test_dropout_acts_in_training_forwards_only(tmp_path, tiny_dir):
    args = lora_args(tmp_path, tiny_dir, lora_dropout=0.5)
    b = backend_for(args)
    rl_update(b, args, toy_batch(), 0)   # B != 0 from here on: dropout changes the adapters' output
    batch = toy_batch()
    x, _ = b.compute_log_probs(batch)
    y, _ = b.compute_log_probs(batch)
    assert all(torch.equal(p, q) for p, q in zip(x, y))   # log-prob forwards: deterministic, no dropout
    assert all(not m.training for m in b._lora_dropouts) and b._lora_dropouts


# -- checkpoints and exports ----------------------------------------------------------------------------------------

def test_adapter_checkpoint_resumes_exactly(tmp_path, tiny_dir):
    args = lora_args(tmp_path, tiny_dir, use_kl_loss=True, kl_loss_coef=0.1, micro_batch_size=2,
                     global_batch_size=4, rollout_batch_size=4, lora_dropout=0.1)
    a = backend_for(args)
    for k in range(2):
        rl_update(a, args, toy_batch(), k)
    a.weight_version = 2
    ckpt = tmp_path / "ckpt"
    a.save(str(ckpt))
    # the adapters and their optimizer state only: no copy of the base weights
    assert sorted(p.name for p in ckpt.iterdir()) == ["adapter", "meta.json", "optim.pt", "rng_rank0.pt"]
    assert sorted(p.name for p in (ckpt / "adapter").iterdir()) == [L.ADAPTER_CONFIG, L.ADAPTER_FILE]
    assert (ckpt / "adapter" / L.ADAPTER_FILE).stat().st_size < 0.5 * sum(
        v.numel() * 4 for v in weights(a).values())
    rl_update(a, args, toy_batch(), 2)
    wa = weights(a)

    b = backend_for(args)
    b.load(str(ckpt))
    assert b.weight_version == 2
    rl_update(b, args, toy_batch(), 2)   # dropout draws from the restored RNG: the same masks
    wb = weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # a checkpoint of other LoRA settings is refused with what differs
    other = backend_for(lora_args(tmp_path, tiny_dir, lora_rank=8))
    with pytest.raises(ValueError, match=r"other LoRA settings: r 4 \(this run: 8\)"):
        other.load(str(ckpt))
    # and a full fine-tuning run does not take it for its own
    with pytest.raises(FileNotFoundError, match="it holds LoRA adapters"):
        backend_for(make_args(tmp_path, tiny_dir)).load(str(ckpt))


def test_save_hf_is_a_peft_adapter_that_loads_with_the_trainers_logits(tmp_path, tiny_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    out = tmp_path / "hf"
    args = lora_args(tmp_path, tiny_dir, save_hf=str(out), lora_save_merged=True)
    b = backend_for(args)
    for k in range(2):
        rl_update(b, args, toy_batch(), k)
    b.save_hf(str(out))
    names = sorted(p.name for p in out.iterdir())
    assert L.ADAPTER_FILE in names and L.ADAPTER_CONFIG in names and "config.json" not in names
    assert "tokenizer.json" in names and "merged" in names
    config = json.loads((out / L.ADAPTER_CONFIG).read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and sorted(config["target_modules"]) == LLAMA_LINEAR
    tokens = toy_batch()["tokens"][5]
    trainer = logits_of(b._raw_model, tokens)
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    peft = PeftModel.from_pretrained(base, str(out)).eval()
    torch.testing.assert_close(logits_of(peft, tokens), trainer, atol=1e-5, rtol=0)
    # the merged model is a plain Hugging Face model: the same logits, up to the merge's rounding
    merged = AutoModelForCausalLM.from_pretrained(str(out / "merged"), dtype=torch.float32).eval()
    torch.testing.assert_close(logits_of(merged, tokens), trainer, atol=1e-4, rtol=0)
    assert (trainer - logits_of(AutoModelForCausalLM.from_pretrained(tiny_dir).eval(), tokens)).abs().max() > 1e-3


# -- the local engine -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lora_engine(tiny_dir, tmp_path_factory):
    from slime_actors.backends.engine_process import LOCAL_ENGINE_MODULE, launch_engine
    d = tmp_path_factory.mktemp("engine")
    proc = launch_engine(LOCAL_ENGINE_MODULE, {"model-path": tiny_dir, "random-seed": 0, "enable-lora": True,
                                               "max-lora-rank": 8, "lora-target-modules": LLAMA_LINEAR},
                         log_path=d / "engine.log", startup_timeout=120)
    yield proc
    assert proc.stop() == 0


def _generate(url, prompts, lora=None, **sp):
    from slime_actors.backends.engine_client import EngineClient, parse_generate_output

    async def go():
        async with EngineClient(url, timeout=60) as c:
            c.lora_path = lora
            outs = await asyncio.gather(*(c.generate(p, {"max_new_tokens": 4, "temperature": 0, **sp})
                                          for p in prompts))
            return [parse_generate_output(o) for o in outs]
    return asyncio.run(go())


def _engine(url, method, *args):
    from slime_actors.backends.engine_client import EngineClient

    async def go():
        async with EngineClient(url, timeout=60) as c:
            return await getattr(c, method)(*args)
    return asyncio.run(go())


def test_engine_generates_with_the_trainers_adapters(tmp_path, tiny_dir, lora_engine):
    """Adapter sync to the local engine as the rollout worker does it (a PEFT directory, /load_lora_adapter, then
    lora_path on every /generate): the engine's outputs change as the adapters train, and the trainer's log-probs of
    what it generated agree with the engine's as they do for full weights (fp32, CPU)."""
    from slime_actors.types import batch_from_samples  # noqa: F401 -- the batch layout the trainer takes
    args = lora_args(tmp_path, tiny_dir, lr=3e-2)
    b = backend_for(args)
    url = lora_engine.base_url
    prompts = [[1, D(1), 13, D(1), 16], [1, D(2), 13, D(3), 16], [1, D(7), 13, D(0), 16]]
    before = _generate(url, prompts)
    previous = before
    for version in (1, 2):
        for k in range(3):
            rl_update(b, args, toy_batch(), k)
        path = tmp_path / "lora" / f"v{version}"
        L.write_adapter_dir(path, b.adapter_weights(), b.adapter_config())
        res = _engine(url, "load_lora_adapter", f"v{version}", str(path))
        assert f"v{version}" in res["loaded_adapters"]
        outs = _generate(url, prompts, lora=f"v{version}", temperature=1.0, sampling_seed=7)
        greedy = _generate(url, prompts, lora=f"v{version}")
        # the engine now computes with the adapters: its log-probs moved ...
        assert max(abs(x - y) for o, p in zip(greedy, previous) for x, y in zip(o.logprobs, p.logprobs)) > 1e-3
        # ... to the trainer's: the trainer's log-probs of the engine's samples equal the engine's
        batch = make_batch([o.output_ids for o in outs], [0] * len(outs), prompt=prompts)
        lps, _ = b.compute_log_probs(batch)
        diff = max((lp - torch.tensor(o.logprobs)).abs().max().item() for lp, o in zip(lps, outs))
        assert diff <= 1e-5, diff
        previous = greedy
    # a batch may mix adapters and the base; the base rows are what the engine gave before any adapter
    mixed = _generate(url, prompts, lora=None)
    assert [o.output_ids for o in mixed] == [o.output_ids for o in before]
    assert all(abs(x - y) <= 1e-5 for o, p in zip(mixed, before) for x, y in zip(o.logprobs, p.logprobs))
    for v in ("v1", "v2"):
        _engine(url, "unload_lora_adapter", v)


def test_engine_refuses_bad_adapters_and_unknown_names(tmp_path, tiny_dir, lora_engine):
    from slime_actors.backends.engine_client import EngineError
    url = lora_engine.base_url
    with pytest.raises(EngineError, match="The following requested LoRA adapters are not loaded: nope"):
        _generate(url, [[1, D(1), 16]], lora="nope")
    b = backend_for(lora_args(tmp_path, tiny_dir, lora_rank=16))
    good = b.adapter_weights()
    L.write_adapter_dir(tmp_path / "r16", good, b.adapter_config())
    with pytest.raises(EngineError, match="r 16 is above --max-lora-rank 8"):
        _engine(url, "load_lora_adapter", "big", str(tmp_path / "r16"))
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / L.ADAPTER_CONFIG).write_text(json.dumps(b.adapter_config()))
    torch.save(good, pickled / "adapter_model.bin")
    with pytest.raises(EngineError, match="adapter_model.bin is pickled: only safetensors are loaded"):
        _engine(url, "load_lora_adapter", "pickled", str(pickled))
    b4 = backend_for(lora_args(tmp_path, tiny_dir))
    L.write_adapter_dir(tmp_path / "ok", b4.adapter_weights(), b4.adapter_config())
    _engine(url, "load_lora_adapter", "ok", str(tmp_path / "ok"))
    with pytest.raises(EngineError, match="Failed to load LoRA adapter ok because it is already loaded"):
        _engine(url, "load_lora_adapter", "ok", str(tmp_path / "ok"))
    _engine(url, "unload_lora_adapter", "ok")
    with pytest.raises(EngineError, match="LoRA with name ok does not exist"):
        _engine(url, "unload_lora_adapter", "ok")


# -- the RL loop end to end -----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_lora_job_syncs_adapters_exports_and_resumes_exactly(tmp_path):
    """The digits job with LoRA: each step's weight sync carries the adapters alone, the engine generates with them
    (trainer-engine log-probs agree at every step as for full weights), checkpoints hold the adapters, a run resumed
    from one repeats the uninterrupted run's steps, and --save-hf is a PEFT adapter directory."""
    from peft import PeftConfig
    from test_rl_loop import metrics, train
    a, b = tmp_path / "a", tmp_path / "b"
    train(a, "--num-rollout", "4", "--eval-interval", "0", "--lora-rank", "8", "--lr", "2e-2", "--use-kl-loss",
          "--kl-loss-coef", "0.01", "--save", str(a / "ckpt"), "--save-interval", "2", "--save-hf", str(a / "hf"))
    ma = metrics(a)
    assert [m["weight_version_after"] for m in ma] == [1, 2, 3, 4]
    assert max(m["train/train_rollout_logprob_abs_diff_max"] for m in ma) <= 1e-5
    # rank 8 on the 7 linear layers of 2 layers (hidden 64, kv 32, MLP 128), fp32: 120 KiB, not the 330 KiB model
    adapter_bytes = 4 * 8 * 2 * ((64 + 64) * 2 + (64 + 32) * 2 + (64 + 128) * 3)
    assert all(m["weight_sync/bytes"] == adapter_bytes for m in ma)
    trainer = a / "ckpt" / "iter_0000002" / "trainer"
    assert (trainer / "adapter" / L.ADAPTER_FILE).exists() and not (trainer / "model.safetensors").exists()
    assert PeftConfig.from_pretrained(str(a / "hf")).r == 8
    # replay is unaffected: the rollout worker (its adapter message kept by checksum only: the replay feeds zeros
    # and writes nothing) and the trainer replay identically
    from slime_actors.traces.replay import replay
    for actor in ("rollout/0", "trainer/0"):
        rep = replay(str(a), actor)
        assert rep.identical, rep.render()
    (b / "ckpt").mkdir(parents=True)
    (b / "ckpt" / "iter_0000002").symlink_to(a / "ckpt" / "iter_0000002")
    (b / "ckpt" / "latest_checkpointed_iteration.txt").write_text("2")
    train(b, "--num-rollout", "4", "--eval-interval", "0", "--lora-rank", "8", "--lr", "2e-2", "--use-kl-loss",
          "--kl-loss-coef", "0.01", "--load", str(b / "ckpt"))
    mb = metrics(b)
    assert [m["rollout_id"] for m in mb] == [2, 3]
    for x, y in zip(ma[2:], mb):
        for key in ("rollout/reward_mean", "train/loss", "train/grad_norm", "train/entropy", "train/kl_loss"):
            assert abs(x[key] - y[key]) <= 1e-6, (key, x[key], y[key])
    # resuming LoRA adapters without --lora-rank is refused before anything starts
    p = train(tmp_path / "c", "--num-rollout", "4", "--load", str(b / "ckpt"), check=False)
    assert p.returncode != 0 and "holds LoRA adapters" in p.stderr


@pytest.mark.slow
def test_lora_merged_sync_colocated(tmp_path):
    """--lora-sync merged: an engine without LoRA gets the merged weights (here colocated: shared memory on CPU)."""
    from test_rl_loop import metrics, train
    run = tmp_path / "merged"
    train(run, "--num-rollout", "2", "--eval-interval", "0", "--lora-rank", "4", "--lr", "2e-2", "--lora-sync",
          "merged", "--colocate")
    steps = metrics(run)
    assert [s["weight_version_after"] for s in steps] == [1, 2]
    assert all(s["weight_sync/bytes"] > 300_000 for s in steps)   # the whole (merged) model
    # the merged weights compute what the adapters compute, up to the merge's rounding
    assert max(s["train/train_rollout_logprob_abs_diff_max"] for s in steps) <= 1e-4
    assert steps[1]["train/train_rollout_logprob_abs_diff_max"] > 0   # (the engine did not keep the base)
    assert "--enable-lora" not in (run / "logs" / "engine-0.log").read_text()


@pytest.mark.slow
def test_lora_async_train(tmp_path):
    from test_rl_loop import metrics, train
    run = tmp_path / "async"
    train(run, "--num-rollout", "3", "--eval-interval", "0", "--lora-rank", "4", "--lr", "2e-2", "--async-train")
    steps = metrics(run)
    assert [s["weight_version_after"] for s in steps] == [1, 2, 3]
    assert all(s["weight_version"] - s["rollout/weight_version_min"] <= 1 for s in steps)


@pytest.mark.slow
def test_lora_debug_modes(tmp_path):
    """--debug-rollout-only (generate with the engine's launch weights and save), then --debug-train-only (train the
    adapters on the saved rollout, no engine)."""
    from test_rl_loop import metrics, train
    data = tmp_path / "rollouts"
    train(tmp_path / "gen", "--num-rollout", "1", "--eval-interval", "0", "--lora-rank", "4", "--debug-rollout-only",
          "--save-debug-rollout-data", str(data))
    train(tmp_path / "fit", "--num-rollout", "1", "--eval-interval", "0", "--lora-rank", "4", "--debug-train-only",
          "--load-debug-rollout-data", str(data))
    assert metrics(tmp_path / "fit")[0]["train/grad_norm"] > 0


def test_lora_requests_follow_sglangs_contract(lora_engine, tmp_path, tiny_dir):
    """What the client sends to /load_lora_adapter, /unload_lora_adapter and /generate (lora_path) uses SGLang
    0.5.15.post1's fields (tests/data/sglang_api_0.5.15.post1.json), and the local engine answers SGLang's
    LoRAUpdateOutput; both endpoints take the admin key, as SGLang's @auth_level(ADMIN_OPTIONAL) marks them."""
    from slime_actors.backends.engine_auth import ADMIN_PATHS
    from slime_actors.backends.engine_client import EngineClient
    from test_sglang_contract import CONTRACT
    b = backend_for(lora_args(tmp_path, tiny_dir))
    L.write_adapter_dir(tmp_path / "a", b.adapter_weights(), b.adapter_config())
    sent, answers = [], []

    async def go():
        async with EngineClient(lora_engine.base_url, timeout=60) as c:
            c.request_hook = lambda m, p, body, q: sent.append((m, p, body))
            answers.append(await c.load_lora_adapter("contract", str(tmp_path / "a")))
            c.lora_path = "contract"
            await c.generate([1, D(1), 16], {"max_new_tokens": 2})
            await c.generate_body({"input_ids": [1, D(1), 16], "sampling_params": {"max_new_tokens": 2}})
            answers.append(await c.unload_lora_adapter("contract"))
    asyncio.run(go())
    by_path = {e["path"]: e for e in CONTRACT["endpoints"].values()}
    assert [p for _, p, _ in sent] == ["/load_lora_adapter", "/generate", "/generate", "/unload_lora_adapter"]
    for method, path, body in sent:
        ep = by_path[path]
        assert method in ep["methods"]
        assert set(body) <= set(CONTRACT["requests"][ep["request"]]["fields"]), path
    assert sent[1][2]["lora_path"] == sent[2][2]["lora_path"] == "contract"
    fields = set(CONTRACT["responses"]["LoRAUpdateOutput"]["fields"])
    assert all(set(a) <= fields and a["success"] for a in answers)
    lora_id, name, path, pinned = answers[0]["loaded_adapters"]["contract"]   # LoRARef, array_like
    assert (name, path, pinned) == ("contract", str(tmp_path / "a"), False) and len(lora_id) == 32
    assert {"/load_lora_adapter", "/unload_lora_adapter"} <= ADMIN_PATHS


def test_sglang_engines_get_the_lora_launch_flags(tmp_path, tiny_dir):
    from slime_actors.backends.sglang_launch import engine_command
    from slime_actors.config import Problems
    from slime_actors.launch.checks import check_lora_flags
    cfg = parse(tmp_path, tiny_dir, "--lora-rank", "8", "--rollout-engine", "sglang")
    check_lora_flags(cfg, Problems())
    _, argv = engine_command(cfg, 0, 30000)
    i = argv.index("--enable-lora")
    assert argv[i:i + 4 + len(LLAMA_LINEAR)] == ["--enable-lora", "--max-lora-rank", "8", "--lora-target-modules",
                                                 *LLAMA_LINEAR]
    cfg = parse(tmp_path, tiny_dir, "--lora-rank", "8", "--lora-sync", "merged")
    assert "--enable-lora" not in engine_command(cfg, 0, 30000)[1]   # merged weights: a plain engine
    assert "--enable-lora" not in engine_command(parse(tmp_path, tiny_dir), 0, 30000)[1]


@pytest.mark.parametrize("parallel,extra", [
    ("ddp", {}),
    ("fsdp", {"use_dynamic_batch_size": True, "max_tokens_per_gpu": 15}),   # (test_torch_backend's budget)
])
def test_two_ranks_train_lora_as_one(tmp_path, tiny_dir, parallel, extra):
    """2 ranks (DDP / FSDP2 over gloo) train the adapters to what 1 rank trains on the union batch; their adapter
    checkpoint loads into 1 rank (test_torch_backend's harness: SGD, last-bit noise, save / load on 2 ranks)."""
    from test_torch_backend import _run_distributed
    dist_result, w1, m1 = _run_distributed(tmp_path, tiny_dir, parallel, lora_rank=4, **extra)
    w2 = dist_result["weights"]
    base = weights(backend_for(make_args(tmp_path, tiny_dir)))
    assert set(w1) == set(w2) == set(base)
    assert max((w1[k] - base[k]).abs().max().item() for k in w1) > 1e-5   # the merged adapters moved
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], atol=1e-6, rtol=1e-4, msg=k)
    for k in ("loss", "kl_loss", "grad_norm"):
        assert abs(m1[k] - dist_result["metrics"][k]) <= 1e-4 * max(1.0, abs(m1[k])), k


def test_convert_merges_a_lora_checkpoint(tmp_path, tiny_dir):
    """`slime-actors convert` of a LoRA checkpoint: the base of --hf-checkpoint with the adapters merged in, a plain
    Hugging Face model with the trainer's logits."""
    from transformers import AutoModelForCausalLM

    from slime_actors.convert import main as convert
    args = lora_args(tmp_path, tiny_dir)
    b = backend_for(args)
    rl_update(b, args, toy_batch(), 0)
    b.save(str(tmp_path / "trainer"))
    assert convert([str(tmp_path / "trainer"), str(tmp_path / "hf"), "--hf-checkpoint", tiny_dir]) == 0
    tokens = toy_batch()["tokens"][2]
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
    torch.testing.assert_close(logits_of(merged, tokens), logits_of(b._raw_model, tokens), atol=1e-4, rtol=0)


def test_bench_prints_lora_beside_full_and_refuses_bad_options(tmp_path):
    import re
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    run = lambda *a: subprocess.run([sys.executable, "bench/lora.py", *a], cwd=root, capture_output=True,  # noqa: E731
                                    text=True, timeout=600)
    p = run("--models", "nomodel")
    assert p.returncode == 2 and "--models nomodel: neither one of tiny, smollm2 nor a Hugging Face model" in p.stderr
    assert "--rank must be >= 1" in run("--rank", "0").stderr
    p = run("--models", "tiny", "--steps", "1", "--batch", "2", "--length", "8", "--json", str(tmp_path / "b.json"))
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [ln for ln in p.stdout.splitlines() if ln.startswith("| tiny |")]
    assert [r.split("|")[2].strip() for r in rows] == ["full", "LoRA r16"]
    assert all(re.fullmatch(r"\| tiny \| .* \| [\d,]+ \([\d.]+%\) \| [\d.]+ \| \d+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|", r)
               for r in rows), rows
    full, lora = json.loads((tmp_path / "b.json").read_text())
    assert lora["trainable"] < full["trainable"] and lora["optimizer_mib"] < full["optimizer_mib"]
    assert lora["sync_mib"] < full["sync_mib"]


def test_engine_ops_bench_counts_fewer_ops_with_one_active_adapter():
    """bench/lora_engine_ops.py on the tiny model: the plain forward with one active adapter runs fewer ops than
    peft's mixed-adapter forward (what the local engine now runs when a whole batch uses one adapter), more than the
    base model; a bad option is refused."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    run = lambda *a: subprocess.run([sys.executable, "bench/lora_engine_ops.py", *a], cwd=root,  # noqa: E731
                                    capture_output=True, text=True, timeout=600)
    assert "--rank and --batch must be at least 1" in run("--rank", "0").stderr
    p = run("--model", "tiny", "--rank", "4", "--batch", "4")
    assert p.returncode == 0, p.stderr[-3000:]
    counts = {ln.split("|")[1].strip(): int(ln.split("|")[2]) for ln in p.stdout.splitlines()
              if ln.startswith("| ") and ln.split("|")[2].strip().isdigit()}
    assert counts["base model"] < counts["one adapter active"] < counts["mixed-adapter (adapter_names)"], counts
