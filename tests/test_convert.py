"""`slime-actors convert`: our torch backend's checkpoints and torch_dist checkpoints (Megatron's, slime's) to a
Hugging Face directory transformers loads, and HF to torch_dist -- bit-exact, without megatron-core (it is checked
against megatron-core's own saving and loading in tests/test_megatron_backend.py where that is installed). Wrong
inputs are errors that say what was found."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BIN = Path(sys.executable).parent / "slime-actors"


def convert(*argv, ok=True):
    p = subprocess.run([str(BIN), "convert", *map(str, argv)], capture_output=True, text=True, timeout=300)
    if ok:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


def hf_state(d) -> dict:
    from slime_actors.backends.weight_sync import load_weights_from_disk
    return dict(load_weights_from_disk(d))


def random_model(path, arch, tie, vocab=37):
    from transformers import AutoConfig, AutoModelForCausalLM
    kw = dict(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tie, pad_token_id=0)
    if arch == "qwen3":
        kw["head_dim"] = 16
    torch.manual_seed(7)
    m = AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **kw))
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.normal_(1.0, 0.2)
    m.save_pretrained(path)
    return Path(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from slime_actors.models.tiny import make_tiny_model
    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


def test_torch_backend_checkpoint_to_hf(tmp_path, tiny):
    """What --save writes with the torch backend (after a training step) becomes an HF directory whose weights are
    the trained ones; from the --save root (newest iteration), an iteration, or its trainer/ directory."""
    from test_torch_backend import make_args, toy_batch

    from slime_actors.backends.rl_update import rl_update
    from slime_actors.backends.torch_backend import TorchBackend
    args = make_args(tmp_path, str(tiny), lr=1e-2)
    b = TorchBackend(args, 0, 1)
    b.init()
    rl_update(b, args, toy_batch(), 0)
    trained = {k: v.detach().clone() for k, v in b.named_weights()}
    root = tmp_path / "ckpt"
    it = root / "iter_0000001"
    b.save(str(it / "trainer"))
    (it / "meta.json").write_text(json.dumps({"next_rollout_id": 1, "weight_version": 1}))
    (root / "latest_checkpointed_iteration.txt").write_text("1")
    for i, src in enumerate((root, it, it / "trainer")):
        out = tmp_path / f"hf{i}"
        p = convert(src, out)  # the model comes from the trainer's meta.json
        assert "Hugging Face directory written" in p.stdout
        got = hf_state(out)
        assert sorted(got) == sorted(trained) and all(torch.equal(got[k], trained[k]) for k in trained)
        from transformers import AutoModelForCausalLM, AutoTokenizer
        AutoModelForCausalLM.from_pretrained(out)
        assert len(AutoTokenizer.from_pretrained(out)) == 36
        marker = json.loads((out / ".slime-actors-export").read_text())
        assert marker["format"] == "torch backend checkpoint"


@pytest.mark.parametrize("arch,tie", [("llama", True), ("qwen2", False), ("qwen3", True)])
def test_hf_to_torch_dist_and_back_is_exact(tmp_path, arch, tie):
    from slime_actors.backends.torch_dist_io import tensor_metadata
    model = random_model(tmp_path / "model", arch, tie)
    dist = tmp_path / "dist"
    p = convert(model, dist, "--padded-vocab-size", "40")
    assert "torch_dist checkpoint written" in p.stdout
    # slime's converter layout; megatron-core's keys: layers stacked, norms under their storage names
    assert (dist / "latest_checkpointed_iteration.txt").read_text() == "release"
    meta = tensor_metadata(dist / "release")
    assert meta["decoder.layers.self_attention.linear_qkv.weight"][0][0] == 3
    assert "decoder.layers.self_attention.linear_qkv.layer_norm_weight" in meta
    assert meta["embedding.word_embeddings.weight"][0] == (40, 32)  # padded
    assert ("output_layer.weight" in meta) == (not tie)
    assert json.loads((dist / "release" / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    back = tmp_path / "back"
    convert(dist, back, "--hf-checkpoint", model)
    a, b = hf_state(model), hf_state(back)
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_torch_dist_with_te_names_and_tp_padding(tmp_path):
    """A checkpoint as slime's Megatron (Transformer Engine layer spec) writes it: fused norm names, the vocabulary
    padded to a multiple of 128, optimizer state and extra state next to the weights, and bf16."""
    from torch.distributed.checkpoint import DefaultSavePlanner, FileSystemWriter, save

    from slime_actors.backends import megatron_convert as mc
    model = random_model(tmp_path / "model", "qwen2", tie=False)
    spec = mc.ArchSpec.from_hf(model)
    full = dict(mc.hf_to_mcore(spec, mc.HFReader(model).get))
    state = {}
    for suffix in ("input_layernorm.weight", "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
                   "self_attention.linear_proj.weight", "pre_mlp_layernorm.weight", "mlp.linear_fc1.weight",
                   "mlp.linear_fc2.weight"):
        te = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
              "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}.get(suffix, suffix)
        state[f"decoder.layers.{te}"] = torch.stack([full[f"decoder.layers.{i}.{suffix}"] for i in range(3)])
    for name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        state[name] = torch.cat([full[name], torch.zeros(128 - 37, 32)])
    state["decoder.final_layernorm.weight"] = full["decoder.final_layernorm.weight"]
    state = {k: v.to(torch.bfloat16) for k, v in state.items()}
    state["optimizer.state.exp_avg.decoder.final_layernorm.weight"] = torch.ones(32)
    state["decoder.layers.self_attention.core_attention._extra_state/shard_0_3"] = [None]
    ck = tmp_path / "slime_ckpt"
    save(state, storage_writer=FileSystemWriter(str(ck / "iter_0000019")),
         planner=DefaultSavePlanner(flatten_state_dict=False), no_dist=True)
    (ck / "iter_0000019" / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (ck / "latest_checkpointed_iteration.txt").write_text("19")
    out = tmp_path / "hf"
    convert(ck, out, "--hf-checkpoint", model)
    got, ref = hf_state(out), hf_state(model)
    assert sorted(got) == sorted(ref)
    for k in ref:
        assert got[k].dtype == torch.bfloat16 and torch.equal(got[k], ref[k].to(torch.bfloat16)), k
    # and a Megatron checkpoint is what --load refuses, naming this command
    from slime_actors.checkpoints import detect_layout
    assert detect_layout(ck).kind == "megatron"


def test_wrong_inputs_are_clear_errors(tmp_path, tiny):
    def err(*argv):
        p = convert(*argv, ok=False)
        assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr
        return p.stderr

    assert "does not exist" in err(tmp_path / "nope", tmp_path / "o")
    (tmp_path / "empty").mkdir()
    assert "empty directory" in err(tmp_path / "empty", tmp_path / "o")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "x.npz").write_bytes(b"x")
    assert "holds x.npz" in err(tmp_path / "odd", tmp_path / "o")
    # the output must be new, empty or an export of ours
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("mine")
    assert "not empty" in err(tiny, tmp_path / "busy")
    assert (tmp_path / "busy" / "mine.txt").read_text() == "mine"
    # a torch_dist without saying which model it is; a model that does not fit it
    model = random_model(tmp_path / "model", "llama", tie=False)
    convert(model, tmp_path / "dist")
    assert "--hf-checkpoint" in err(tmp_path / "dist", tmp_path / "o")
    other = random_model(tmp_path / "other", "qwen3", tie=True)
    e = err(tmp_path / "dist", tmp_path / "o", "--hf-checkpoint", other)
    assert "does --hf-checkpoint describe this model" in e or "no place for" in e
    assert not (tmp_path / "o").exists()
    assert "is the source model directory" in err(tmp_path / "dist", model, "--hf-checkpoint", model)
    assert "smaller than the vocabulary" in err(model, tmp_path / "d2", "--padded-vocab-size", "8")
