"""Parity with transformers' Qwen2ForCausalLM (Qwen2, Qwen2.5) and Qwen3ForCausalLM.

Oracles: Hugging Face's own classes on seeded random weights (every norm weight and bias perturbed
away from 1 and 0, weights large enough that attention is far from uniform), and, for float64, a
forward pass written out here from the Qwen formulas (transformers computes its RMSNorms, rotary
angles and softmax in float32 even in a float64 model, so it cannot check float64 to 1e-12).

Sizes are distinct: Qwen2 has 6 query heads of 10 over 2 key/value heads in d_model 60; Qwen3 has
6 heads of head_dim 8 (independent of d_model 21) over 2 key/value heads. SLIDING configs have a
window of 4 over sequences of 13 with only some layers sliding, as transformers 5.24 derives them
(layers from max_window_layers on) or lists them (layer_types).
"""

import math

import pytest
import torch

from conftest import assert_round_trips, perturb_vectors
from glassbox.models import HookedTransformer
from glassbox.weights.qwen import (config_from_qwen2, config_from_qwen3, config_to_qwen2, config_to_qwen3,
                                   glassbox_to_qwen, qwen_to_glassbox)

SIZES = {
    "qwen2": dict(hidden_size=60, num_attention_heads=6, num_key_value_heads=2, intermediate_size=37,
                  vocab_size=29, num_hidden_layers=3, max_position_embeddings=41),
    "qwen3": dict(hidden_size=21, num_attention_heads=6, num_key_value_heads=2, head_dim=8, intermediate_size=37,
                  vocab_size=29, num_hidden_layers=3, max_position_embeddings=41),
}
# Layers 1 and 2 slide (from max_window_layers=1 on), layer 0 is global.
SLIDING = dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)
# Listed: layers 0 and 2 slide, layer 1 is global.
LISTED = dict(use_sliding_window=True, sliding_window=4,
              layer_types=["sliding_attention", "full_attention", "sliding_attention"])
CONFIG_FROM = {"qwen2": config_from_qwen2, "qwen3": config_from_qwen3}
CONFIG_TO = {"qwen2": config_to_qwen2, "qwen3": config_to_qwen3}
FAMILIES = ("qwen2", "qwen3")
PAD = 0


def _make(family, seed, overrides):
    import transformers

    name = {"qwen2": "Qwen2", "qwen3": "Qwen3"}[family]
    torch.manual_seed(seed)
    kwargs = dict(SIZES[family], initializer_range=0.3, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 500.0}, attn_implementation="eager")
    kwargs.update(overrides)
    model = getattr(transformers, f"{name}ForCausalLM")(getattr(transformers, f"{name}Config")(**kwargs))
    perturb_vectors(model)
    with torch.no_grad():  # q/k norms of ~3 make Qwen3's normalised scores large enough to be peaked
        for key, param in model.named_parameters():
            if key.endswith(("q_norm.weight", "k_norm.weight")):
                param.mul_(3.0)
    return model.eval()


def make_hf_qwen2(seed=0, **config_overrides):
    """A ``transformers.Qwen2ForCausalLM`` (eager attention, untied unless overridden) with seeded
    random weights, every norm weight and bias perturbed; ``config_overrides`` go to Qwen2Config."""
    return _make("qwen2", seed, config_overrides)


def make_hf_qwen3(seed=0, **config_overrides):
    """A ``transformers.Qwen3ForCausalLM`` like ``make_hf_qwen2`` (q/k norms perturbed too)."""
    return _make("qwen3", seed, config_overrides)


MAKE = {"qwen2": make_hf_qwen2, "qwen3": make_hf_qwen3}


def tokens_for(batch=3, pos=13, seed=1):
    return torch.randint(1, 29, (batch, pos), generator=torch.Generator().manual_seed(seed))


# -- an independent float64 forward pass ------------------------------------------------------------
def reference_logits(hf, tokens):
    """Qwen2 / Qwen3 logits computed from the formulas in float64 from hf's weights and config."""
    c = hf.config
    p = {k: v.detach().double() for k, v in hf.state_dict().items()}
    H, KV = c.num_attention_heads, c.num_key_value_heads
    Dh = getattr(c, "head_dim", None) or c.hidden_size // H
    eps, qwen3 = c.rms_norm_eps, c.model_type == "qwen3"

    def rms(x, w):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def lin(x, name):
        out = x @ p[name + ".weight"].T
        return out + p[name + ".bias"] if name + ".bias" in p else out

    n = tokens.shape[1]
    pos = torch.arange(n, dtype=torch.float64)
    angles = pos[:, None] * c.rope_parameters["rope_theta"] ** (-torch.arange(0, Dh, 2, dtype=torch.float64) / Dh)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)

    def rotate(x):  # [b n h Dh], dims i and i + Dh/2 paired
        half = torch.cat([-x[..., Dh // 2:], x[..., :Dh // 2]], -1)
        return x * cos[:, None] + half * sin[:, None]

    q_idx, k_idx = torch.arange(n)[:, None], torch.arange(n)[None]
    x = p["model.embed_tokens.weight"][tokens]
    for L in range(c.num_hidden_layers):
        a = f"model.layers.{L}."
        h = rms(x, p[a + "input_layernorm.weight"])
        q = lin(h, a + "self_attn.q_proj").view(*h.shape[:2], H, Dh)
        k = lin(h, a + "self_attn.k_proj").view(*h.shape[:2], KV, Dh)
        v = lin(h, a + "self_attn.v_proj").view(*h.shape[:2], KV, Dh)
        if qwen3:
            q, k = rms(q, p[a + "self_attn.q_norm.weight"]), rms(k, p[a + "self_attn.k_norm.weight"])
        q, k = rotate(q), rotate(k)
        k, v = k.repeat_interleave(H // KV, dim=2), v.repeat_interleave(H // KV, dim=2)
        allowed = k_idx <= q_idx
        if c.layer_types[L] == "sliding_attention":
            allowed &= q_idx - k_idx < c.sliding_window
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(Dh)
        pattern = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        z = torch.einsum("bhqk,bkhd->bqhd", pattern, v).reshape(*h.shape[:2], H * Dh)
        x = x + lin(z, a + "self_attn.o_proj")
        h = rms(x, p[a + "post_attention_layernorm.weight"])
        gate, up = lin(h, a + "mlp.gate_proj"), lin(h, a + "mlp.up_proj")
        x = x + lin(gate * torch.sigmoid(gate) * up, a + "mlp.down_proj")
    x = rms(x, p["model.norm.weight"])
    return x @ p.get("lm_head.weight", p["model.embed_tokens.weight"]).T


def build(hf, dtype=None):
    return HookedTransformer.from_hf(hf, dtype=dtype)


# -- the config ---------------------------------------------------------------------------------------
def test_config_maps_qwen2_options():
    cfg = config_from_qwen2(make_hf_qwen2(**SLIDING).config)
    assert (cfg.normalization, cfg.positional, cfg.rotary_style, cfg.gated_mlp, cfg.act_fn) == (
        "RMS", "rotary", "half", True, "silu")
    assert (cfg.use_bias, cfg.qkv_bias, cfg.attn_out_bias, cfg.mlp_bias, cfg.qk_norm) == (False, True, False, False, None)
    assert (cfg.n_heads, cfg.n_key_value_heads, cfg.d_head, cfg.rotary_dim, cfg.rotary_base) == (6, 2, 10, 10, 500.0)
    assert (cfg.attn_types, cfg.window_size, cfg.tied_unembed, cfg.rope_scaling) == (
        ("global", "local", "local"), 4, False, None)


def test_config_maps_qwen3_options():
    cfg = config_from_qwen3(make_hf_qwen3(**LISTED, attention_bias=True).config)
    assert (cfg.qk_norm, cfg.qkv_bias, cfg.attn_out_bias, cfg.mlp_bias, cfg.use_bias) == ("head", True, True, False, False)
    assert (cfg.d_model, cfg.n_heads, cfg.n_key_value_heads, cfg.d_head, cfg.rotary_dim) == (21, 6, 2, 8, 8)
    assert (cfg.attn_types, cfg.window_size) == (("local", "global", "local"), 4)
    assert config_from_qwen3(make_hf_qwen3().config).qkv_bias is False
    # use_sliding_window=False: transformers drops the window and no layer slides
    assert config_from_qwen3(make_hf_qwen3(sliding_window=4, max_window_layers=1).config).attn_types is None


@pytest.mark.parametrize("family", FAMILIES)
def test_rope_parameters_map_onto_rope_scaling_and_back(family):
    from transformers import Qwen2Config, Qwen3Config

    config_class = {"qwen2": Qwen2Config, "qwen3": Qwen3Config}[family]
    hf_config = config_class(**SIZES[family], rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0})
    cfg = CONFIG_FROM[family](hf_config)
    assert (cfg.rope_scaling, cfg.rotary_base) == ({"rope_type": "linear", "factor": 2.0}, 1000.0)
    assert CONFIG_TO[family](cfg).rope_parameters == {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0}
    # transformers' dynamic type scales from max_position_embeddings: the original length, both ways
    dynamic = CONFIG_FROM[family](config_class(**SIZES[family], rope_parameters={
        "rope_type": "dynamic", "factor": 2.0, "rope_theta": 1000.0}))
    assert dynamic.rope_scaling == {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 41}
    back = CONFIG_TO[family](dynamic)
    assert (back.rope_parameters, back.max_position_embeddings) == (
        {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1000.0}, 41)


ROPE_SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8},
    "yarn": {"rope_type": "yarn", "factor": 4.1, "original_max_position_embeddings": 10},  # 4.1 = 41 / 10
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("rope", list(ROPE_SCALINGS))
def test_rope_scaling_matches_transformers(family, rope):
    """Scaled rotary tables (positional.py's) inside each family: logits and export. (The dynamic type
    equals the default within n_ctx = max_position_embeddings; its growth is tested with the tables.)"""
    hf = MAKE[family](rope_parameters={**ROPE_SCALINGS[rope], "rope_theta": 500.0}, **SLIDING)
    model = build(hf)
    plain = build(MAKE[family](**SLIDING))
    tokens = tokens_for()
    with torch.no_grad():
        expected = hf(tokens).logits
        got = model(tokens)
        assert (plain(tokens) - got).abs().max() > 1e-2, "the scaling changes the logits"
        # measured <= 9.8e-6 (logits up to 9.6); bound 1e-4, 10x
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
        exported = model.to_hf()
        assert exported.config.rope_parameters == hf.config.rope_parameters
        torch.testing.assert_close(exported(tokens).logits, expected, atol=0, rtol=0)


# -- float32 and float64 parity ---------------------------------------------------------------------------
# Each option in at least one case: grouped (2 of 6), multi-query (1) and plain (6) key/value heads,
# tied and untied embeddings, sliding layers derived and listed, Qwen3's attention_bias, and a Qwen2
# head_dim attribute (which transformers' Qwen2 honours) independent of d_model / heads.
VARIANTS = {
    "gqa": {},
    "mqa_tied_sliding": dict(num_key_value_heads=1, tie_word_embeddings=True, **SLIDING),
    "mha_listed": dict(num_key_value_heads=6, **LISTED),
}
CASES = [(f, v) for f in FAMILIES for v in VARIANTS]


def overrides(family, variant):
    extra = {"qwen2": dict(head_dim=8), "qwen3": dict(attention_bias=True)}[family]
    return dict(VARIANTS[variant], **(extra if variant == "mqa_tied_sliding" else {}))


@pytest.mark.parametrize("family, variant", CASES)
def test_logits_and_every_layer_match_transformers_in_float32(family, variant):
    hf = MAKE[family](**overrides(family, variant))
    model = build(hf)
    tokens = tokens_for()
    acts = {}
    with torch.no_grad():
        out = hf(tokens, output_hidden_states=True, output_attentions=True)
        got = model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith(("resid_pre", "pattern", "ln_final.hook_out")),
                                                       lambda x, hook: acts.__setitem__(hook.name, x))])
    assert out.logits.abs().max() > 3.0, "logits too small for the comparison to mean anything"
    # measured <= 2.8e-5 over the cases (logits up to 9.3, so 3e-6 of their scale); bound 3e-4, 11x
    torch.testing.assert_close(got, out.logits, atol=3e-4, rtol=0)
    for L in range(hf.config.num_hidden_layers):
        # measured <= 5.6e-5 (residual stream up to 74); bound 6e-4, 11x
        torch.testing.assert_close(acts[f"blocks.{L}.hook_resid_pre"], out.hidden_states[L], atol=6e-4, rtol=0,
                                   msg=lambda m, L=L: f"resid_pre of layer {L} differs from HF hidden_states[{L}]: {m}")
        # measured <= 1.6e-5 (probabilities); bound 2e-4, 12x
        torch.testing.assert_close(acts[f"blocks.{L}.attn.hook_pattern"], out.attentions[L], atol=2e-4, rtol=0,
                                   msg=lambda m, L=L: f"pattern of layer {L} differs from HF attentions[{L}]: {m}")
    # HF's last hidden state is after the final norm; measured <= 2.4e-5 (values up to 4.8); bound 3e-4, 12x
    torch.testing.assert_close(acts["ln_final.hook_out"], out.hidden_states[-1], atol=3e-4, rtol=0)


def test_attention_is_peaked_and_windows_slide():
    """The comparisons above mean something: attention is far from uniform, and a sliding layer's
    pattern is zero beyond its window while a global layer's is not."""
    for make in (make_hf_qwen2, make_hf_qwen3):
        hf = make(**SLIDING)
        with torch.no_grad():
            attentions = hf(tokens_for(), output_attentions=True).attentions
        assert min(a[..., 4:, :].max(-1).values.mean() for a in attentions) > 0.6
        far = torch.ones(13, 13, dtype=torch.bool).tril(-4)  # keys 4 or more positions back
        assert attentions[0][..., far].min() > 0 and torch.all(attentions[1][..., far] == 0)


@pytest.mark.parametrize("family, variant", CASES)
def test_float64_matches_the_formulas_and_transformers(family, variant):
    hf = MAKE[family](**overrides(family, variant)).double()
    model = build(hf)
    tokens = tokens_for()
    with torch.no_grad():
        got, hf_logits = model(tokens), hf(tokens).logits
    reference = reference_logits(hf, tokens)
    # measured <= 7.8e-14 (logits up to 9); bound 1e-12, 13x
    torch.testing.assert_close(got, reference, atol=1e-12, rtol=0)
    # transformers' float64 model keeps its norms, rotary angles and softmax in float32:
    # measured <= 1.04e-5 against the float64 formulas; bound 1.2e-4, 11x
    torch.testing.assert_close(hf_logits, reference, atol=1.2e-4, rtol=0)


# -- half precision ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_error_is_no_worse_than_transformers(family, dtype):
    """Against float64 logits of the same (rounded) weights, our mean |error| in bfloat16 and float16
    is at most 1.2 x transformers' own in that dtype, for two seeds of the sliding GQA config."""
    tokens = tokens_for(batch=4, pos=20)
    for seed in (0, 1):
        hf = MAKE[family](seed, **SLIDING).to(dtype)
        reference = MAKE[family](seed, **SLIDING).to(dtype).double()
        model = build(hf)
        assert model.cfg.upcast_attn is False and next(model.parameters()).dtype == dtype
        with torch.no_grad():
            expected = reference(tokens).logits
            ours = (model(tokens).double() - expected).abs().mean()
            theirs = (hf(tokens).logits.double() - expected).abs().mean()
        # measured ratio ours / transformers' 0.80..0.97 over these cases (bfloat16 means 4.6e-2..7.8e-2,
        # float16 5.5e-3..1.1e-2); bound 1.2 (the issue's)
        assert ours <= 1.2 * theirs, f"{family} {dtype} seed {seed}: ours {ours:.3e} vs transformers' {theirs:.3e}"
        assert theirs > 0


# -- generation and padding ---------------------------------------------------------------------------------
LENGTHS, NEW = (5, 9, 3), 7


def left_padded(seed=2):
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 29, (n,), generator=gen) for n in LENGTHS]
    width = max(LENGTHS)
    tokens, mask = torch.full((len(prompts), width), PAD), torch.zeros(len(prompts), width, dtype=torch.bool)
    for i, p in enumerate(prompts):
        tokens[i, width - len(p):], mask[i, width - len(p):] = p, True
    return prompts, tokens, mask


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_equals_transformers_generate(family):
    """Left-padded greedy decoding with grouped-query attention, past the sliding window of 4 (the
    key-value cache of a sliding layer), token for token; the most padded prompt alone continues the
    same. (Few steps: each is a forward under the shape checks.)"""
    hf = MAKE[family](**SLIDING)
    model = build(hf)
    prompts, tokens, mask = left_padded()
    width = tokens.shape[1]
    with torch.no_grad():
        expected = hf.generate(tokens, attention_mask=mask.long(), max_new_tokens=NEW, do_sample=False,
                               pad_token_id=PAD, eos_token_id=None)[:, width:]
    got = model.generate(tokens, NEW, attention_mask=mask, eos_token_id=None)
    assert torch.equal(got[:, :width], tokens) and torch.equal(got[:, width:], expected)
    assert len(set(expected.flatten().tolist())) > 6, "a varied continuation, not one repeated token"
    alone = model.generate(prompts[2][None], NEW, eos_token_id=None)
    assert torch.equal(alone[0, len(prompts[2]):], expected[2]), "the prompt alone continues differently"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("variant", ["gqa", "mqa_tied_sliding"])
def test_left_padding_equals_each_prompt_alone(family, variant):
    model = build(MAKE[family](**overrides(family, variant)))
    prompts, tokens, mask = left_padded(seed=3)
    with torch.no_grad():
        padded = model(tokens, attention_mask=mask)
        for i, p in enumerate(prompts):
            # measured <= 5.5e-6 (logits up to 9); bound 6e-5, 11x
            torch.testing.assert_close(padded[i, tokens.shape[1] - len(p):], model(p[None])[0], atol=6e-5, rtol=0,
                                       msg=lambda m, i=i: f"left-padded row {i} differs from the prompt alone: {m}")


# -- export back ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family, variant", CASES)
def test_export_loads_in_transformers_with_every_key_and_equal_logits(family, variant, tmp_path):
    """to_hf, save_pretrained (transformers loads it: no missing, unexpected or mismatched keys) and
    from_pretrained, all dispatching on the family; the converters round-trip ours -> HF -> ours exactly."""
    import transformers

    from glassbox.weights import from_pretrained, save_pretrained

    hf = MAKE[family](**overrides(family, variant))
    hf_class = type(hf)
    model = build(hf)
    tokens = tokens_for()
    exported = model.to_hf()
    assert type(exported) is hf_class and exported.config.layer_types == hf.config.layer_types
    save_pretrained(model, tmp_path)
    reloaded, info = hf_class.from_pretrained(tmp_path, attn_implementation="eager", output_loading_info=True)
    assert {k: list(info[k]) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")} == {
        "missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}, info
    again = from_pretrained(tmp_path)
    with torch.no_grad():
        expected = hf(tokens).logits
        torch.testing.assert_close(exported(tokens).logits, expected, atol=0, rtol=0)
        torch.testing.assert_close(reloaded(tokens).logits, expected, atol=0, rtol=0)
        torch.testing.assert_close(again(tokens), model(tokens), atol=0, rtol=0)
    assert transformers.AutoConfig.from_pretrained(tmp_path).model_type == family
    ours = model.state_dict()
    back = qwen_to_glassbox(glassbox_to_qwen(ours, model.cfg), model.cfg)
    assert set(back) == set(ours) and all(torch.equal(back[k], ours[k]) for k in ours)


@pytest.mark.parametrize("family", FAMILIES)
def test_export_of_glassbox_weights_gives_our_logits(family):
    """A model with weights transformers never made (every parameter moved at random): its export
    computes our logits, so no transposition or head split cancels out in a round trip."""
    model = build(MAKE[family](4, **overrides(family, "mqa_tied_sliding")))
    torch.manual_seed(5)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
        tokens = tokens_for()
        # measured <= 3.7e-5 (logits up to 7.8); bound 4e-4, 11x
        torch.testing.assert_close(model.to_hf()(tokens).logits, model(tokens), atol=4e-4, rtol=0)


def test_export_picks_the_qwen_architecture():
    from glassbox.weights.architectures import architecture_of_config

    for family in FAMILIES:
        for variant in VARIANTS:
            cfg = build(MAKE[family](**overrides(family, variant))).cfg
            assert architecture_of_config(cfg).model_type == family, (family, variant)


# -- weight processing --------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_weight_processing_keeps_the_logits_or_is_refused_by_name(family):
    """fold_ln, center_unembed and fold_value_biases (Qwen2 gains a b_O for it) keep the model's
    logits (up to a constant per position for center_unembed); what cannot be exact is refused."""
    from glassbox.weights.processing import process

    def fresh():
        return build(MAKE[family](**overrides(family, "mqa_tied_sliding")))

    tokens = tokens_for()
    steps = dict(fold_ln=True, center_unembed=True, fold_value_biases=True)
    with torch.no_grad():
        before, after = fresh()(tokens), process(fresh(), **steps)(tokens)
    shift = (after - before).mean(-1, keepdim=True)
    # measured <= 3.0e-5 (logits up to 9); bound 3e-4, 10x
    torch.testing.assert_close(after - shift, before, atol=3e-4, rtol=0)
    assert shift.abs().max() > 1e-3, "center_unembed moved the logits by a constant, as it must"
    with pytest.raises(ValueError, match="center_writing_weights relies on LayerNorm removing the mean; "
                                         "normalization='RMS'"):
        process(fresh(), center_writing_weights=True)
    folded = process(fresh(), fold_value_biases=True)
    assert folded.cfg.attn_out_bias and float(folded.blocks[0].attn.b_V.abs().max()) == 0.0
    if family == "qwen2":
        assert float(folded.blocks[0].attn.b_O.abs().max()) > 1e-3, "the value biases moved into a new b_O"


# -- refusals ------------------------------------------------------------------------------------------------------
def test_config_from_refuses_what_glassbox_does_not_compute():
    from transformers import Qwen2Config, Qwen3Config

    sizes = SIZES["qwen2"]
    with pytest.raises(ValueError, match="expected a Qwen2 config, got model_type='qwen3'"):
        config_from_qwen2(Qwen3Config(**SIZES["qwen3"]))
    with pytest.raises(ValueError, match="Qwen2 hidden_act 'prelu' is not supported"):
        config_from_qwen2(Qwen2Config(**sizes, hidden_act="prelu"))
    longrope = Qwen2Config(**sizes)
    longrope.rope_parameters = {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 5,
                                "long_factor": [1.0] * 5}
    with pytest.raises(ValueError, match="Qwen2 rope scaling 'longrope' .* is not supported"):
        config_from_qwen2(longrope)
    partial = Qwen2Config(**sizes, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4,
                                                    "partial_rotary_factor": 0.5})
    with pytest.raises(ValueError, match="Qwen2 rope_parameters partial_rotary_factor=0.5"):
        config_from_qwen2(partial)
    chunked = Qwen3Config(**{**SIZES["qwen3"], "num_hidden_layers": 2},
                          layer_types=["full_attention", "chunked_attention"])
    with pytest.raises(ValueError, match=r"Qwen3 layer_types=.* has \['chunked_attention'\]: glassbox computes full_attention, sliding_attention"):
        config_from_qwen3(chunked)
    no_window = Qwen2Config(**{**sizes, "num_hidden_layers": 2}, layer_types=["full_attention", "sliding_attention"])
    with pytest.raises(ValueError, match="sliding_attention layers but sliding_window is None"):
        config_from_qwen2(no_window)


def test_config_to_refuses_what_the_family_cannot_represent():
    qwen2 = config_from_qwen2(make_hf_qwen2(**SLIDING).config)
    qwen3 = config_from_qwen3(make_hf_qwen3(**SLIDING).config)
    # integer numbers are written as the floats transformers' strict configs require
    exported = config_to_qwen2(qwen2.replace(layer_norm_eps=1, rotary_base=1000, init_range=1))
    assert (exported.rms_norm_eps, exported.rope_parameters["rope_theta"], exported.initializer_range) == (1.0, 1000.0, 1.0)
    assert isinstance(exported.rms_norm_eps, float) and isinstance(exported.rope_parameters["rope_theta"], float)
    with pytest.raises(ValueError, match=r"not a Qwen2-architecture config: \{'attn_out_bias': True\}"):
        config_to_qwen2(qwen2.replace(attn_out_bias=True))
    with pytest.raises(ValueError, match=r"not a Qwen2-architecture config: \{'qk_norm': 'head'\}"):
        config_to_qwen2(qwen2.replace(qk_norm="head"))
    with pytest.raises(ValueError, match=r"not a Qwen3-architecture config: \{'qkv_bias': True, 'attn_out_bias': False\}"):
        config_to_qwen3(qwen3.replace(qkv_bias=True))
    with pytest.raises(ValueError, match=r"not a Qwen3-architecture config: \{'qk_norm': 'full'\}"):
        config_to_qwen3(qwen3.replace(qk_norm="full"))
    with pytest.raises(ValueError, match=r"not a Qwen2-architecture config: \{'attn_scale': 0.5\}"):
        config_to_qwen2(qwen2.replace(attn_scale=0.5))
    # options this module does not list are caught by converting back
    with pytest.raises(ValueError, match=r"a Qwen3 config cannot represent \{'rotary_base_local': 100.0\}"):
        config_to_qwen3(qwen3.replace(rotary_base_local=100.0))
    with pytest.raises(ValueError, match=r"a Qwen2 config cannot represent \{'norm_weight_offset': 1.0\}"):
        config_to_qwen2(qwen2.replace(norm_weight_offset=1.0))
    with pytest.raises(ValueError, match=r"a Qwen2 config cannot represent \{'output_logits_soft_cap': 30.0\}"):
        config_to_qwen2(qwen2.replace(output_logits_soft_cap=30.0))


def test_converter_names_a_wrong_or_extra_tensor():
    hf = make_hf_qwen3(**SLIDING)
    cfg = config_from_qwen3(hf.config)
    sd = dict(hf.state_dict())
    sd["model.layers.1.self_attn.k_norm.weight"] = sd["model.layers.1.self_attn.k_norm.weight"][:-1]
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight has shape \(7,\), expected \(8,\)"):
        qwen_to_glassbox(sd, cfg)
    sd = dict(make_hf_qwen2().state_dict(), **{"model.layers.0.self_attn.o_proj.bias": torch.zeros(60)})
    with pytest.raises(ValueError, match=r"does not describe.*o_proj\.bias"):
        qwen_to_glassbox(sd, config_from_qwen2(make_hf_qwen2().config))


# -- checkpoints as released ----------------------------------------------------------------------------------
RELEASED_FIELDS = {  # config.json fields as Qwen2.5's and Qwen3's releases write them (transformers 4.x)
    "qwen2": dict(rope_theta=1000000.0, sliding_window=32768, use_sliding_window=False, max_window_layers=2,
                  rope_scaling=None, torch_dtype="bfloat16", bos_token_id=3, eos_token_id=3),
    "qwen3": dict(rope_theta=1000000, sliding_window=None, use_sliding_window=False, max_window_layers=3,
                  rope_scaling=None, torch_dtype="bfloat16", attention_bias=False, bos_token_id=3, eos_token_id=3),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_released_style_config_json_loads(family, tmp_path):
    """A folder whose config.json has the released checkpoints' fields (rope_theta at the top, no
    rope_parameters or layer_types, a sliding_window that use_sliding_window=False switches off):
    glassbox's from_pretrained computes what transformers computes from the same folder."""
    import json

    from glassbox.weights import from_pretrained

    hf = MAKE[family](tie_word_embeddings=True)
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for key in ("rope_parameters", "layer_types", "dtype"):
        config.pop(key, None)
    config.update(RELEASED_FIELDS[family])
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = from_pretrained(tmp_path)
    reference = type(hf).from_pretrained(tmp_path, attn_implementation="eager", dtype=torch.float32).eval()
    assert (model.cfg.attn_types, model.cfg.rotary_base, model.cfg.tied_unembed) == (None, 1e6, True)
    tokens = tokens_for()
    with torch.no_grad():
        expected = reference(tokens).logits
        assert (expected - hf(tokens).logits).abs().max() > 1e-2, "rope_theta 1e6 differs from the factory's 500"
        got = model(tokens)
    # With base 1e6 transformers' float32 rotary angles are the coarser: against the float64 formulas
    # transformers is measured <= 7.6e-5 off and ours <= 2.8e-5 (logits up to 7.7).
    # measured <= 8.7e-5 against transformers; bound 9e-4, 10x
    torch.testing.assert_close(got, expected, atol=9e-4, rtol=0)
    # measured <= 2.8e-5 against the formulas in float64; bound 3e-4, 11x
    torch.testing.assert_close(got.double(), reference_logits(reference, tokens), atol=3e-4, rtol=0)
