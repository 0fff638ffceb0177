"""HF <-> Megatron conversion as pure tensor mapping (no megatron-core needed): names, layouts, tensor-parallel
sharding and gathering, bit-exact round trips for Llama, Qwen2 (qkv bias) and Qwen3 (q/k norm)."""

import pytest
import torch
import torch.nn.functional as F

from slime_actors.backends import megatron_convert as mc

ARCHS = ["llama", "qwen2", "qwen3"]


def hf_model(arch: str, tie: bool = False, seed: int = 0, **over):
    from transformers import AutoConfig, AutoModelForCausalLM
    kw = dict(vocab_size=37, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
              num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tie, rms_norm_eps=1e-6)
    if arch == "qwen3":
        kw["head_dim"] = 16  # Qwen3 sets head_dim independently of hidden / heads
    kw.update(over)
    cfg = AutoConfig.for_model(arch, **kw)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # norms start at 1.0: make them random too, so a swapped norm would show
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.normal_()
    return model


def hf_state(model) -> dict:
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    return sd


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tie", [False, True])
def test_names_cover_the_hf_model(arch, tie):
    model = hf_model(arch, tie)
    spec = mc.ArchSpec.from_hf(model.config)
    assert spec.qkv_bias == (arch == "qwen2") and spec.qk_norm == (arch == "qwen3")
    sd = hf_state(model)
    assert sorted(mc.hf_names(spec)) == sorted(sd)
    for name in mc.mcore_names(spec):
        for hf_name, shape in mc.hf_shapes(spec, name):
            assert tuple(sd[hf_name].shape) == shape, (name, hf_name)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("tp", [1, 2])
def test_round_trip_bit_exact_through_tp_shards(arch, tie, tp):
    model = hf_model(arch, tie, vocab_size=37)  # 37: odd, so tp=2 pads the vocabulary
    spec = mc.ArchSpec.from_hf(model.config)
    sd = hf_state(model)
    full = dict(mc.hf_to_mcore(spec, sd.__getitem__))
    assert list(full) == mc.mcore_names(spec)
    shards = {n: [mc.tp_shard(spec, n, t, r, tp) for r in range(tp)] for n, t in full.items()}
    for n, parts in shards.items():
        assert all(tuple(p.shape) == mc.mcore_local_shapes(spec, n, tp) for p in parts), n
    gathered = {n: mc.tp_gather(spec, n, parts) for n, parts in shards.items()}
    back = mc.mcore_state_to_hf(spec, gathered)
    assert sorted(back) == sorted(sd)
    for k in sd:
        assert back[k].dtype == sd[k].dtype and torch.equal(back[k], sd[k]), k


def test_vocab_padding_rows_are_zero_and_dropped():
    model = hf_model("llama", vocab_size=37)
    spec = mc.ArchSpec.from_hf(model.config)
    emb = model.state_dict()["model.embed_tokens.weight"]
    assert mc.padded_vocab_size(37, 2) == 38 and mc.padded_vocab_size(37, 1) == 37
    s0 = mc.tp_shard(spec, "embedding.word_embeddings.weight", emb, 0, 2)
    s1 = mc.tp_shard(spec, "embedding.word_embeddings.weight", emb, 1, 2)
    assert s0.shape == s1.shape == (19, 48)
    assert torch.equal(s1[-1], torch.zeros(48)) and torch.equal(s1[:-1], emb[19:])
    assert torch.equal(mc.tp_gather(spec, "output_layer.weight", [s0, s1]), emb)


def test_qkv_layout_matches_megatron_attention_semantics():
    """Megatron splits x @ W_qkv^T per query group into [hpg query heads, key, value]; query head g*hpg+j must
    be HF's head g*hpg+j and its key/value HF's kv head g (HF repeats kv heads hpg times, contiguously)."""
    model = hf_model("qwen2")
    spec = mc.ArchSpec.from_hf(model.config)
    sd = hf_state(model)
    p = "model.layers.1.self_attn."
    w = mc.hf_to_mcore_tensor(spec, "decoder.layers.1.self_attention.linear_qkv.weight", sd.__getitem__)
    b = mc.hf_to_mcore_tensor(spec, "decoder.layers.1.self_attention.linear_qkv.bias", sd.__getitem__)
    x = torch.randn(5, spec.hidden_size)
    g, hpg, d = spec.num_query_groups, spec.heads_per_group, spec.head_dim
    mixed = (x @ w.T + b).view(5, g, (hpg + 2) * d)
    q, k, v = torch.split(mixed, [hpg * d, d, d], dim=-1)
    q = q.reshape(5, g * hpg, d)
    k = k.repeat_interleave(hpg, dim=1)  # what Megatron's DotProductAttention does for GQA
    v = v.repeat_interleave(hpg, dim=1)
    hq = (x @ sd[p + "q_proj.weight"].T + sd[p + "q_proj.bias"]).view(5, g * hpg, d)
    hk = (x @ sd[p + "k_proj.weight"].T + sd[p + "k_proj.bias"]).view(5, g, d).repeat_interleave(hpg, dim=1)
    hv = (x @ sd[p + "v_proj.weight"].T + sd[p + "v_proj.bias"]).view(5, g, d).repeat_interleave(hpg, dim=1)
    assert torch.allclose(q, hq, atol=1e-6) and torch.allclose(k, hk, atol=1e-6) and torch.allclose(v, hv, atol=1e-6)
    # tp=2: each rank's contiguous row chunk is whole groups, so the per-rank split gives that rank's heads
    for r in range(2):
        wr = mc.tp_shard(spec, "decoder.layers.1.self_attention.linear_qkv.weight", w, r, 2)
        br = mc.tp_shard(spec, "decoder.layers.1.self_attention.linear_qkv.bias", b, r, 2)
        qr, _, _ = torch.split((x @ wr.T + br).view(5, g // 2, (hpg + 2) * d), [hpg * d, d, d], dim=-1)
        heads = g * hpg // 2
        assert torch.allclose(qr.reshape(5, heads, d), hq[:, r * heads:(r + 1) * heads], atol=1e-6)


def test_swiglu_fc1_shards_compute_the_mlp():
    model = hf_model("llama")
    spec = mc.ArchSpec.from_hf(model.config)
    sd = hf_state(model)
    p = "model.layers.0.mlp."
    x = torch.randn(4, spec.hidden_size)
    ref = model.model.layers[0].mlp(x)
    fc1 = mc.hf_to_mcore_tensor(spec, "decoder.layers.0.mlp.linear_fc1.weight", sd.__getitem__)
    fc2 = sd[p + "down_proj.weight"]
    out = 0
    for r in range(2):  # column-parallel fc1 (Megatron chunks the local output in two), row-parallel fc2
        w1 = mc.tp_shard(spec, "decoder.layers.0.mlp.linear_fc1.weight", fc1, r, 2)
        w2 = mc.tp_shard(spec, "decoder.layers.0.mlp.linear_fc2.weight", fc2, r, 2)
        gate, up = torch.chunk(x @ w1.T, 2, dim=-1)
        out = out + (F.silu(gate) * up) @ w2.T
    assert torch.allclose(out, ref, atol=1e-5)


def test_tied_output_layer_comes_from_the_embedding():
    model = hf_model("qwen3", tie=True)
    spec = mc.ArchSpec.from_hf(model.config)
    sd = hf_state(model)
    assert "output_layer.weight" not in mc.mcore_names(spec)
    assert "output_layer.weight" in mc.mcore_names(spec, output_layer=True)
    t = mc.hf_to_mcore_tensor(spec, "output_layer.weight", sd.__getitem__)
    assert torch.equal(t, sd["model.embed_tokens.weight"])


def test_local_and_global_layer_names():
    assert mc.to_local_name("decoder.layers.7.mlp.linear_fc1.weight", 4) == "decoder.layers.3.mlp.linear_fc1.weight"
    assert mc.to_global_name("decoder.layers.3.mlp.linear_fc1.weight", 4) == "decoder.layers.7.mlp.linear_fc1.weight"
    assert mc.to_local_name("embedding.word_embeddings.weight", 4) == "embedding.word_embeddings.weight"
    assert mc.strip_prefixes("module.module.output_layer.weight") == "output_layer.weight"
    assert mc.layer_of("decoder.layers.12.input_layernorm.weight") == 12


def test_te_fused_norm_names_map_back():
    model = hf_model("llama")
    spec = mc.ArchSpec.from_hf(model.config)
    sd = hf_state(model)
    w = sd["model.layers.2.input_layernorm.weight"]
    assert mc.mcore_to_hf(spec, "decoder.layers.2.self_attention.linear_qkv.layer_norm_weight", w) == \
        [("model.layers.2.input_layernorm.weight", w)]
    w = sd["model.layers.2.post_attention_layernorm.weight"]
    (name, t), = mc.mcore_to_hf(spec, "module.decoder.layers.2.mlp.linear_fc1.layer_norm_weight", w)
    assert name == "model.layers.2.post_attention_layernorm.weight" and t is w


def test_spec_from_config_dict_and_errors(tmp_path):
    cfg = {"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 50, "rope_theta": 1e6,
           "tie_word_embeddings": True, "max_position_embeddings": 128}
    (tmp_path / "config.json").write_text(__import__("json").dumps(cfg))
    spec = mc.ArchSpec.from_hf(tmp_path)
    assert spec.rope_theta == 1e6 and spec.head_dim == 16 and spec.qkv_bias and spec.tie_word_embeddings
    spec.check_parallel(2, 2)
    with pytest.raises(mc.ConversionError, match="num_key_value_heads 2 is not divisible"):
        spec.check_parallel(4, 1)
    with pytest.raises(mc.ConversionError, match="num_hidden_layers 2"):
        spec.check_parallel(1, 4)
    with pytest.raises(mc.ConversionError, match="model_type 'gpt2'"):
        mc.ArchSpec.from_hf({**cfg, "model_type": "gpt2"})
    with pytest.raises(mc.ConversionError, match="rope type 'yarn'"):
        mc.ArchSpec.from_hf({**cfg, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(mc.ConversionError, match="attention_bias"):
        mc.ArchSpec.from_hf({**cfg, "model_type": "llama", "attention_bias": True})
    spec5 = mc.ArchSpec.from_hf({**cfg, "rope_theta": None, "rope_parameters": {"rope_type": "default",
                                                                                "rope_theta": 5e5}})
    assert spec5.rope_theta == 5e5
    with pytest.raises(mc.ConversionError, match="unknown Megatron tensor"):
        mc.mcore_to_hf(spec, "decoder.layers.0.mlp.router.weight", torch.zeros(1))
    with pytest.raises(mc.ConversionError, match="shape"):
        mc.mcore_to_hf(spec, "decoder.final_layernorm.weight", torch.zeros(3))


def test_hf_reader(tmp_path):
    from safetensors.torch import save_file
    model = hf_model("qwen3", tie=True)
    sd = hf_state(model)
    names = sorted(sd)
    save_file({k: sd[k].contiguous() for k in names[:5]}, str(tmp_path / "a.safetensors"))
    save_file({k: sd[k].contiguous() for k in names[5:]}, str(tmp_path / "b.safetensors"))
    r = mc.HFReader(tmp_path)
    assert sorted(r.keys()) == names and names[7] in r
    spec = mc.ArchSpec.from_hf(model.config)
    full = dict(mc.hf_to_mcore(spec, r.get))
    assert torch.equal(mc.mcore_state_to_hf(spec, full)["model.layers.1.self_attn.k_norm.weight"],
                       sd["model.layers.1.self_attn.k_norm.weight"])
    with pytest.raises(mc.ConversionError, match="no tensor"):
        r.get("lm_head.weight")
