"""glassbox.tl's standalone TransformerLens components: constructors, state-dict keys, hostile configs and
inputs (each error names what was wrong). The numbers are checked against TransformerLens 3.9 in
tests_tl/test_components_tl.py; here, identities that must hold."""

import pytest
import torch

import glassbox.tl as gtl

C = gtl.components
CFG = dict(n_layers=2, d_model=30, n_ctx=16, d_head=6, n_heads=5, act_fn="relu")


def filled(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(module.named_parameters()):
            p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return module


def test_constructors_take_a_dict_or_a_config_with_transformer_lens_shapes():
    for cfg in (CFG, gtl.HookedTransformerConfig(**CFG)):
        attn = C.Attention(cfg)
        assert isinstance(attn.cfg, gtl.HookedTransformerConfig) and attn.cfg.d_model == 30
        assert attn.W_Q.shape == (5, 30, 6) and attn.W_O.shape == (5, 6, 30) and attn.b_K.shape == (5, 6)
        assert list(attn.state_dict()) == ["W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "mask", "IGNORE"]
    assert C.Attention(dict(CFG, dtype=torch.float64)).W_Q.dtype == torch.float64
    mlp = C.MLP(dict(CFG, d_mlp=44))
    assert mlp.W_in.shape == (30, 44) and mlp.act_fn is torch.nn.functional.relu and mlp.d_mlp == 44
    gqa = C.GroupedQueryAttention(dict(CFG, n_heads=6, d_head=5, n_key_value_heads=3))
    assert sorted(gqa.state_dict())[:4] == ["IGNORE", "W_O", "W_Q", "_W_K"] and gqa._W_K.shape == (3, 30, 5)


def test_a_legacy_full_mask_loads_and_other_masks_are_refused():
    attn = filled(C.Attention(CFG))
    sd = attn.state_dict()
    assert attn.load_state_dict({**sd, "mask": torch.ones(16, 16, dtype=torch.bool).tril()}, strict=True)
    assert attn.mask.shape == (0, 0)
    with pytest.raises(RuntimeError, match="mask"):
        attn.load_state_dict({**sd, "mask": torch.ones(16, 16)})  # a float mask is no causal buffer


def test_attention_ignores_n_key_value_heads_as_transformer_lens():
    attn = C.Attention(dict(CFG, n_heads=6, d_head=5, n_key_value_heads=2))
    assert attn.W_K.shape == (6, 30, 5)


def test_grouped_attention_equals_attention_with_repeated_weights():
    """GQA with kv heads repeated per query head is plain attention (TransformerLens's own identity)."""
    cfg = dict(CFG, n_heads=6, d_head=5, n_key_value_heads=2)
    gqa, attn = filled(C.GroupedQueryAttention(cfg)), C.Attention(cfg)
    attn.load_state_dict({**{k: v for k, v in gqa.state_dict().items() if not k.startswith("_")},
                          "W_K": gqa.W_K, "W_V": gqa.W_V, "b_K": gqa.b_K, "b_V": gqa.b_V})
    x = torch.randn(2, 7, 30, generator=torch.Generator().manual_seed(1))
    # measured 0 (the same kernel, keys repeated inside it or before it); bound float32 rounding
    assert (gqa(x, x, x) - attn(x, x, x)).abs().max().item() <= 1e-5


def test_cached_forward_equals_the_full_forward():
    attn = filled(C.Attention(CFG))
    x = torch.randn(2, 7, 30, generator=torch.Generator().manual_seed(2))
    entry = gtl.past_key_value_caching.HookedTransformerKeyValueCacheEntry()
    parts = [attn(p, p, p, past_kv_cache_entry=entry) for p in (x[:, :3], x[:, 3:])]
    # measured 3.8e-6 on values up to ~15; bound 1e-5 relative
    full = attn(x, x, x)
    assert (torch.cat(parts, 1) - full).abs().max().item() <= 1e-5 * full.abs().max().item()


def test_gated_mlp_has_transformer_lens_bias_placement():
    mlp = filled(C.GatedMLP(dict(CFG, d_mlp=44, act_fn="silu")))
    assert not hasattr(mlp, "b_gate") or mlp.b_gate is None
    x = torch.randn(1, 3, 30, dtype=torch.float32, generator=torch.Generator().manual_seed(3))
    post = torch.nn.functional.silu(x @ mlp.W_gate) * (x @ mlp.W_in) + mlp.b_in
    # measured 2.4e-7 (one addmm against a matmul and an add)
    assert (mlp(x) - (post @ mlp.W_out + mlp.b_out)).abs().max().item() <= 5e-6


@pytest.mark.parametrize("cls", [C.Attention, C.GroupedQueryAttention, C.MLP, C.GatedMLP, C.CanBeUsedAsMLP])
def test_a_config_that_is_not_one_is_a_type_error(cls):
    with pytest.raises(TypeError, match="cfg must be a dict"):
        cls([("d_model", 30)])
    with pytest.raises(TypeError, match="cfg.dtype"):
        cls(dict(CFG, n_key_value_heads=1, dtype=torch.int64))


@pytest.mark.parametrize("kwargs, fields, match", [
    (dict(attn_type="sliding"), {}, "attn_type"),
    (dict(attn_type="local"), {}, "window_size"),
    (dict(attn_type="local"), dict(window_size=2.5), "window_size"),
    (dict(layer_id=-1), {}, "layer_id"),
    (dict(layer_id=True), {}, "layer_id"),
    ({}, dict(scale_attn_by_inverse_layer_idx=True), "layer_id"),
    ({}, dict(positional_embedding_type="rotary"), "positional_embedding_type"),
    ({}, dict(d_head=7), "d_model"),  # n_heads given: 5 x 7 != 30 is fine for TransformerLens, d_head wins
])
def test_bad_attention_configs_name_the_field(kwargs, fields, match):
    if match == "d_model":
        assert C.Attention(dict(CFG, **fields)).W_Q.shape == (5, 30, 7)
        return
    with pytest.raises(ValueError, match=match):
        C.Attention(dict(CFG, **fields), **kwargs)


def test_grouped_attention_needs_its_kv_heads():
    with pytest.raises(ValueError, match="n_key_value_heads"):
        C.GroupedQueryAttention(CFG)
    with pytest.raises(ValueError, match="n_key_value_heads"):
        C.GroupedQueryAttention(dict(CFG, n_key_value_heads=2))  # does not divide 5 heads


def test_bad_forward_inputs_are_refused_by_name():
    attn = filled(C.Attention(CFG))
    x = torch.randn(2, 7, 30)
    with pytest.raises(ValueError, match="position_bias"):
        attn(x, x, x, position_bias=torch.zeros(1, 5, 7, 7))
    with pytest.raises(ValueError, match="key_input"):
        attn(x, x[:, :5], x[:, :5])
    with pytest.raises(ValueError, match="attention_mask"):
        attn(x, x, x, attention_mask=torch.ones(2, 6))
    with pytest.raises(ValueError, match="additive_attention_mask"):
        attn(x, x, x, additive_attention_mask=torch.full((2, 1, 1, 7), -1e4))
    with pytest.raises(ValueError, match="additive_attention_mask"):
        attn(x, x, x, additive_attention_mask=torch.zeros(3, 1, 1, 7))
    with pytest.raises(ValueError, match="query_input"):
        attn(x.long(), x, x)


def test_unknown_activation_is_named():
    mlp = C.CanBeUsedAsMLP(dict(CFG, d_mlp=44))
    mlp.select_activation_function()
    assert mlp.act_fn is torch.nn.functional.relu
    with pytest.raises(ValueError, match="act_fn"):
        C.MLP(dict(CFG, act_fn="relu3"))


def test_attention_projection_helpers_refuse_misfit_shapes():
    w, b = torch.randn(5, 30, 6), torch.randn(5, 6)
    with pytest.raises(ValueError, match="simple_attn_linear"):
        gtl.utils.simple_attn_linear(torch.randn(2, 7, 29), w, b)
    with pytest.raises(ValueError, match="complex_attn_linear"):
        gtl.utils.complex_attn_linear(torch.randn(2, 7, 4, 30), w, b)


def test_transformer_lens_module_paths():
    gtl.as_transformer_lens()
    from transformer_lens.components import AbstractAttention, GroupedQueryAttention  # noqa: F401
    from transformer_lens.components.abstract_attention import AbstractAttention as A2
    from transformer_lens.components.mlps.gated_mlp import GatedMLP
    from transformer_lens.utilities import solu
    from transformer_lens.utilities.activation_functions import SUPPORTED_ACTIVATIONS, XIELU, apply_softcap
    from transformer_lens.utilities.attention import complex_attn_linear, simple_attn_linear  # noqa: F401
    from transformer_lens.utils import ACTIVATION_FN_DICT, xielu

    assert A2 is AbstractAttention and GatedMLP is C.GatedMLP and ACTIVATION_FN_DICT["xielu"] is xielu
    assert SUPPORTED_ACTIVATIONS["solu_ln"] is solu and XIELU is gtl.utils.XIELU
    x = torch.tensor([-50.0, 50.0])
    assert torch.equal(apply_softcap(x, -1.0), x) and torch.equal(apply_softcap(x, 30.0), 30 * torch.tanh(x / 30))
