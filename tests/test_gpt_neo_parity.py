"""Parity with transformers.GPTNeoForCausalLM: unscaled attention scores, global and local
(sliding-window) layers from ``attention_types`` and ``window_size``, q/k/v without biases and an
output projection with one, learned positions, tied and untied unembeddings.

The oracle is Hugging Face's GPT-Neo on seeded random weights (every norm weight and bias
perturbed), on 13 tokens: longer than the windows (4 and 1), so the local layers' masks matter.
Float64: transformers' GPT-Neo computes its scores and softmax in float32 whatever the dtype, so
``float64_transformers`` runs its own attention with those in float64; against it the gap collapses.

Errors measured (this machine, 3 x 13 tokens, logits up to ~6): beside each bound.
"""

import copy
import json

import pytest
import torch

from conftest import assert_round_trips, perturb_vectors
from glassbox.models import HookedTransformer
from glassbox.weights.gpt_neo import config_from_neo, config_to_neo, glassbox_to_neo, neo_to_glassbox

SIZES = dict(hidden_size=24, num_layers=3, num_heads=3, intermediate_size=37, vocab_size=29,
             max_position_embeddings=19)
CONFIGS = {
    "alternating": dict(attention_types=[[["global", "local"], 1], [["local"], 1]], window_size=4),
    "all_global": dict(attention_types=[[["global"], 3]], window_size=4),
    "window_1_untied_relu": dict(attention_types=[[["local"], 3]], window_size=1, tie_word_embeddings=False,
                                 activation_function="relu"),
}


def make_hf_neo(seed=0, **overrides):
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    torch.manual_seed(seed)
    config = GPTNeoConfig(**{**SIZES, **CONFIGS["alternating"], **overrides}, initializer_range=0.3,
                          attn_implementation="eager", bos_token_id=0, eos_token_id=0)
    model = GPTNeoForCausalLM(config)
    perturb_vectors(model)
    return model.eval()


make_hf_gpt_neo = make_hf_neo  # the name tests/test_hub_loading.py looks for


def build(hf, dtype=torch.float32, cfg=None):
    cfg = cfg or config_from_neo(hf.config)
    model = HookedTransformer(cfg, init=False, dtype=dtype)
    model.load_state_dict(neo_to_glassbox(hf.state_dict(), cfg), strict=True)
    return model.eval()


def float64_transformers(hf, monkeypatch):
    """A float64 copy of ``hf`` whose attention (transformers' own mask buffer and additive mask) keeps
    its scores and softmax in float64 instead of rounding them to float32."""
    from transformers.models.gpt_neo.modeling_gpt_neo import GPTNeoSelfAttention

    original = GPTNeoSelfAttention._attn

    def attn(self, query, key, value, attention_mask=None):
        if query.dtype != torch.float64:
            return original(self, query, key, value, attention_mask)
        scores = query @ key.transpose(-1, -2)
        q_len, k_len = query.size(-2), key.size(-2)
        causal = self.bias[:, :, k_len - q_len:k_len, :k_len]
        scores = torch.where(causal, scores, torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype))
        if attention_mask is not None:
            scores = scores + attention_mask
        pattern = scores.softmax(-1)
        return pattern @ value, pattern

    monkeypatch.setattr(GPTNeoSelfAttention, "_attn", attn)
    return copy.deepcopy(hf).double()


@pytest.fixture(scope="module", params=list(CONFIGS))
def hf_neo(request):
    return make_hf_neo(**CONFIGS[request.param])


@pytest.fixture
def tokens():
    return torch.randint(0, SIZES["vocab_size"], (3, 13), generator=torch.Generator().manual_seed(1))


def test_config_maps_to_gpt_neo_options():
    cfg = config_from_neo(make_hf_neo().config)
    assert (cfg.attn_types, cfg.window_size, cfg.attn_scale, cfg.upcast_attn) == (
        ("global", "local", "local"), 4, 1.0, True)
    assert (cfg.qkv_bias, cfg.attn_out_bias, cfg.mlp_bias, cfg.unembed_bias, cfg.tied_unembed, cfg.d_mlp) == (
        True, True, True, False, True, 37)  # q/k/v biases: zeros, as TransformerLens loads them
    glob = config_from_neo(make_hf_neo(**CONFIGS["all_global"]).config)
    assert (glob.attn_types, glob.window_size) == (None, None)


def test_logits_hidden_states_and_patterns_match_gpt_neo(hf_neo, tokens):
    model = build(hf_neo)
    acts = {}
    with torch.no_grad():
        out = hf_neo(tokens, output_hidden_states=True, output_attentions=True)
        logits = model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith(("resid_pre", "pattern")),
                                                          lambda x, hook: acts.__setitem__(hook.name, x))])
    assert out.logits.abs().max() > 1.0, "logits too small for the comparison to mean anything"
    # measured <= 1.7e-6 over the three configs (logits up to ~5.4); bound 2e-5
    torch.testing.assert_close(logits, out.logits, atol=2e-5, rtol=0)
    for L in range(model.cfg.n_layers):
        # measured <= 2.9e-6; bound 2e-5
        torch.testing.assert_close(acts[f"blocks.{L}.hook_resid_pre"], out.hidden_states[L], atol=2e-5, rtol=0,
                                   msg=lambda m, L=L: f"resid_pre of layer {L} differs from HF hidden_states[{L}]: {m}")
        # measured <= 8.4e-7 (probabilities); bound 1e-5
        torch.testing.assert_close(acts[f"blocks.{L}.attn.hook_pattern"], out.attentions[L], atol=1e-5, rtol=0,
                                   msg=lambda m, L=L: f"pattern of layer {L} differs from HF attentions[{L}]: {m}")


def test_float64_collapses_against_float64_transformers(hf_neo, tokens, monkeypatch):
    with torch.no_grad():
        plain = copy.deepcopy(hf_neo).double()(tokens).logits
        expected = float64_transformers(hf_neo, monkeypatch)(tokens).logits
        got = build(hf_neo, torch.float64)(tokens)
    # measured <= 5.6e-15 over the three configs (logits up to ~5.4); bound 1e-12
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
    if hf_neo.config.window_size > 1:  # (a window of 1 gives one-hot patterns, which no rounding changes)
        # transformers' own float64 rounds q and k to float32: measured 6.1e-6 from ours; the gap is real
        assert 1e-9 < (got - plain).abs().max() < 1e-4


@pytest.mark.parametrize("change", [dict(attn_scale=None), dict(window_size=5), dict(attn_types=None, window_size=None)])
def test_unscaled_scores_and_the_windows_are_what_parity_proves(change, tokens):
    hf = make_hf_neo()
    model = build(hf, cfg=config_from_neo(hf.config).replace(**change))
    with torch.no_grad():
        assert (model(tokens) - hf(tokens).logits).abs().max() > 0.05


def test_round_trip_ours_neo_ours_is_exact(hf_neo):
    cfg = config_from_neo(hf_neo.config)
    ours = neo_to_glassbox(hf_neo.state_dict(), cfg)
    back = neo_to_glassbox(glassbox_to_neo(ours, cfg), cfg)
    assert set(back) == set(ours)
    for key in ours:
        assert torch.equal(back[key], ours[key]), key


def test_model_level_from_hf_to_hf_and_folders(hf_neo, tokens, tmp_path):
    from transformers import GPT2LMHeadModel, GPTNeoForCausalLM

    if "local" not in hf_neo.config.attention_layers:
        # documented footgun: with no local layer the Config is also GPT-2's (scale_attn_weights=False,
        # reorder_and_upcast_attn), which computes the same logits: measured 0.0; bound 2e-5
        exported = HookedTransformer.from_hf(hf_neo).to_hf()
        assert isinstance(exported, GPT2LMHeadModel)
        with torch.no_grad():
            torch.testing.assert_close(exported(tokens).logits, hf_neo(tokens).logits, atol=2e-5, rtol=0)
        return
    # measured <= 4.3e-6 (the fused kernel; logits up to ~5.4); bound 2e-5
    model = assert_round_trips(hf_neo, GPTNeoForCausalLM, tokens, tmp_path, atol=2e-5)
    assert model.cfg.attn_types == config_from_neo(hf_neo.config).attn_types


def test_padded_batch_matches_gpt_neo_given_the_same_positions(tokens):
    """transformers' GPT-Neo numbers positions 0, 1, ... whatever the mask; glassbox counts real tokens.
    Given those position ids, transformers agrees at every real position."""
    hf = make_hf_neo()
    model = build(hf)
    mask = torch.ones(tokens.shape, dtype=torch.long)
    mask[0, :4] = 0
    mask[1, 9:] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        expected = hf(tokens, attention_mask=mask, position_ids=positions).logits
        got = model(tokens, attention_mask=mask)
    real = mask.bool()
    # measured 4.3e-6; bound 2e-5
    torch.testing.assert_close(got[real], expected[real], atol=2e-5, rtol=0)


def test_bfloat16_matches_gpt_neo_in_bfloat16(tokens):
    """Both take the scores and the softmax in float32 (upcast_attn) from bfloat16 projections."""
    hf = make_hf_neo().to(torch.bfloat16)
    model = build(hf, torch.bfloat16)
    with torch.no_grad():
        got, expected = model(tokens).float(), hf(tokens).logits.float()
        no_upcast = build(hf, torch.bfloat16, config_from_neo(hf.config).replace(upcast_attn=False))(tokens).float()
    # measured 0.047, without the upcast 0.098 (bfloat16's step at logits ~5 is 0.03); bound 0.25
    torch.testing.assert_close(got, expected, atol=0.25, rtol=0)
    assert (got - expected).abs().max() <= (no_upcast - expected).abs().max()


@pytest.mark.parametrize("field, value, message", [
    ("activation_function", "gelu_nwe", r"activation_function 'gelu_nwe' is not supported.*did you mean"),
    ("activation_function", "xielu", r"activation_function 'xielu' is not supported"),
    ("layer_types", ["full_attention"] * 3, r"layer_types=.*does not read layer_types.*attention_layers=\['global', 'local', 'local'\]"),
    ("attention_layers", ["global", "sparse", "local"], r"attention_types=.*gives \['global', 'sparse', 'local'\]"),
])
def test_refused_config_fields_name_the_field(field, value, message, tmp_path):
    from glassbox.weights import from_pretrained

    hf = make_hf_neo()
    config = copy.deepcopy(hf.config)
    setattr(config, field, value)
    with pytest.raises(ValueError, match=message):
        config_from_neo(config)
    hf.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data[field] = value
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="config.json"):
        from_pretrained(tmp_path)


@pytest.mark.parametrize("field, value, message", [
    ("window_size", 0, "field 'window_size' must be"), ("num_heads", "3", "field 'num_heads' must be"),
    ("layer_norm_epsilon", float("nan"), "field 'layer_norm_epsilon' must be"),
    ("attention_layers", ["global", "local"], "(?s)transformers refused the config.*len\\(config.attention_layers\\) = 2"),
    ("num_layers", 5, r"num_layers=5, but .* holds weights for 3 layer"),
    ("max_position_embeddings", 23, r"max_position_embeddings=23, but .*wpe\.weight of shape \(19, 24\)"),
])
def test_damaged_config_json_is_named(field, value, message, tmp_path):
    from glassbox.weights import from_pretrained

    make_hf_neo().save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data[field] = value
    if field == "num_layers":  # transformers checks attention_layers' length itself
        data["attention_layers"] = ["global"] * value
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message):
        from_pretrained(tmp_path)


def test_export_refuses_nonzero_qkv_biases():
    hf = make_hf_neo()
    cfg = config_from_neo(hf.config)
    state = neo_to_glassbox(hf.state_dict(), cfg)
    assert all(not state[f"blocks.{L}.attn.b_{n}"].any() for L in range(cfg.n_layers) for n in "QKV")
    state["blocks.2.attn.b_K"] = state["blocks.2.attn.b_K"] + 0.5
    with pytest.raises(ValueError, match=r"blocks\.2\.attn\.b_K is nonzero"):
        glassbox_to_neo(state, cfg)


def test_damaged_state_dicts_name_the_tensor():
    hf = make_hf_neo()
    cfg = config_from_neo(hf.config)
    state = dict(hf.state_dict())
    biased = {**state, "transformer.h.0.attn.attention.q_proj.bias": torch.zeros(24)}
    with pytest.raises(ValueError, match=r"does not describe.*q_proj\.bias"):
        neo_to_glassbox(biased, cfg)
    wrong = {**state, "transformer.h.1.mlp.c_fc.weight": state["transformer.h.1.mlp.c_fc.weight"].T}
    with pytest.raises(ValueError, match=r"h\.1\.mlp\.c_fc\.weight has shape \(24, 37\), expected \(37, 24\)"):
        neo_to_glassbox(wrong, cfg)


@pytest.mark.parametrize("change, named", [
    (dict(attn_scale=None), "'attn_scale': None"), (dict(upcast_attn=False), "'upcast_attn': False"),
    (dict(qkv_bias=False), "'qkv_bias': False"), (dict(positional="rotary"), "'positional': 'rotary'"),
    (dict(scale_attn_by_inverse_layer_idx=True), "'scale_attn_by_inverse_layer_idx': True"),
])
def test_export_refuses_what_gpt_neo_cannot_represent(change, named):
    cfg = config_from_neo(make_hf_neo().config).replace(**change)
    with pytest.raises(ValueError, match="not a GPT-Neo-architecture config") as err:
        config_to_neo(cfg)
    assert named in str(err.value)
