"""glassbox.tl's HookedTransformerConfig on today's families, against TransformerLens 3.9.

The oracle: a ``transformer_lens.HookedTransformer`` built from TransformerLens's own config with the
same fields, its random weights loaded into the glassbox.tl model built from glassbox.tl's config
(TransformerLens's state dict, its grouped keys and values ``_W_K``/``_W_V`` [kv_head d_model d_head]
renamed to glassbox's ``W_K``/``W_V``), must give the same logits and hook shapes; the config fields
must read back as TransformerLens's, and the glassbox options they map to are stated here by hand.
"""

import warnings

import pytest
import torch

import glassbox.tl as gtl
import transformer_lens as TL

warnings.filterwarnings("ignore", message="HookedTransformer is deprecated")

BASE = dict(d_model=36, d_head=6, n_heads=6, n_layers=3, n_ctx=23, d_vocab=41, d_mlp=22, act_fn="silu",
            normalization_type="RMS", positional_embedding_type="rotary", rotary_dim=4, gated_mlp=True,
            dtype=torch.float64, device="cpu", seed=0)
LOCAL = dict(use_local_attn=True, attn_types=["local", "global", "local"], window_size=4)
CASES = {  # TransformerLens fields -> the glassbox Config options they must give (beyond BASE's)
    "gqa": (dict(n_key_value_heads=2), dict(n_key_value_heads=2)),
    "mqa_ungrouped": (dict(n_key_value_heads=1, ungroup_grouped_query_attention=True),
                      dict(n_key_value_heads=1, ungroup_grouped_query_attention=True)),
    "qwen3_qk_norm": (dict(n_key_value_heads=3, use_qk_norm=True), dict(n_key_value_heads=3, qk_norm="head")),
    "gemma2": (dict(n_key_value_heads=2, use_normalization_before_and_after=True, attn_scores_soft_cap=5.0,
                    output_logits_soft_cap=3.0, attn_scale=4.0, act_fn="gelu_new", **LOCAL),
               dict(n_key_value_heads=2, norm_placement="sandwich", attn_scores_soft_cap=5.0,
                    output_logits_soft_cap=3.0, attn_scale=0.25, attn_types=("local", "global", "local"),
                    window_size=4, act_fn="gelu_new")),
    "gemma3_local_base_linear": (dict(use_qk_norm=True, use_normalization_before_and_after=True,
                                      rotary_base_local=100.0, rotary_scaling_factor=2.0, **LOCAL),
                                 dict(qk_norm="head", norm_placement="sandwich", rotary_base_local=100.0,
                                      rope_scaling={"rope_type": "linear", "factor": 2.0},
                                      attn_types=("local", "global", "local"), window_size=4)),
    "olmo2": (dict(original_architecture="Olmo2ForCausalLM", n_key_value_heads=2),
              dict(norm_placement="output", qk_norm="full", n_key_value_heads=2)),
    "stanford_gpt2": (dict(scale_attn_by_inverse_layer_idx=True, use_attn_scale=False, normalization_type="LN",
                           positional_embedding_type="standard", rotary_dim=None, gated_mlp=False, act_fn="gelu_new"),
                      dict(scale_attn_by_inverse_layer_idx=True, attn_scale=1.0, normalization="LN",
                           positional="learned", rotary_dim=None, gated_mlp=False, act_fn="gelu_new")),
    "neox_parallel": (dict(parallel_attn_mlp=True, normalization_type="LN", gated_mlp=False, act_fn="gelu"),
                      dict(parallel_attn_mlp=True, parallel_ln2=True, normalization="LN", gated_mlp=False,
                           act_fn="gelu")),
    "llama3_rope": (dict(n_key_value_heads=2, use_NTK_by_parts_rope=True, NTK_by_parts_factor=4.0,
                         NTK_original_ctx_len=6, NTK_by_parts_low_freq_factor=1.0, NTK_by_parts_high_freq_factor=3.0),
                    dict(n_key_value_heads=2, rope_scaling={"rope_type": "llama3", "factor": 4.0,
                                                            "low_freq_factor": 1.0, "high_freq_factor": 3.0,
                                                            "original_max_position_embeddings": 6})),
    "yarn_global_only": (dict(use_yarn_rope=True, yarn_factor=3.0, yarn_attention_factor=1.2,
                              yarn_original_max_position_embeddings=8, yarn_global_attn_only=True, **LOCAL),
                         dict(rope_scaling={"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 8,
                                            "attention_factor": 1.2, "beta_fast": 32.0, "beta_slow": 1.0,
                                            "truncate": True},
                              rotary_base_local=10000.0, attn_types=("local", "global", "local"), window_size=4)),
}
GLASSBOX_BASE = dict(normalization="RMS", positional="rotary", rotary_dim=4, gated_mlp=True, act_fn="silu",
                     n_key_value_heads=6, ungroup_grouped_query_attention=False, qk_norm=None, attn_scale=None,
                     attn_scores_soft_cap=None, output_logits_soft_cap=None, attn_types=None, window_size=None,
                     rotary_base_local=None, rope_scaling=None, norm_placement="pre", parallel_attn_mlp=False,
                     parallel_ln2=False, scale_attn_by_inverse_layer_idx=False, norm_weight_offset=0.0,
                     scale_embed=False)


def kwargs(case):
    return {**BASE, **CASES[case][0]}


@pytest.mark.parametrize("case", CASES)
def test_fields_map_onto_glassbox_options_and_read_back(case):
    ours, theirs = gtl.HookedTransformerConfig(**kwargs(case)), TL.HookedTransformerConfig(**kwargs(case))
    expected = {**GLASSBOX_BASE, **CASES[case][1]}
    got = {name: getattr(ours.glassbox, name) for name in expected}
    assert got == expected
    mine, reference = ours.to_dict(), theirs.to_dict()
    assert list(mine) == list(reference)
    for field, value in reference.items():
        assert mine[field] == value, f"{field}: glassbox.tl {mine[field]!r}, TransformerLens {value!r}"
    assert gtl.HookedTransformerConfig(**mine) == ours
    # and back: the TransformerLens view of the glassbox Config builds the same glassbox Config
    view = gtl.HookedTransformerConfig.from_glassbox(ours.glassbox)
    rebuilt = {k: v for k, v in view.to_dict().items() if k not in ("n_params", "device", "dtype", "seed")}
    assert gtl.HookedTransformerConfig(**rebuilt, dtype=torch.float64).glassbox == ours.glassbox


def perturbed_tl(case) -> "TL.HookedTransformer":
    model = TL.HookedTransformer(TL.HookedTransformerConfig(**kwargs(case)))
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=param.dtype)
            if name.endswith(".w"):  # norm weights away from 1
                param.add_(0.3 * noise)
            elif name.split(".")[-1].startswith(("b", "_b")):
                param.copy_(0.2 * noise)
            else:  # sharp attention, so a wrong head, window or rotation moves the logits
                param.copy_(0.35 * noise)
    return model.eval()


def glassbox_twin(tl_model, case) -> "gtl.HookedTransformer":
    model = gtl.HookedTransformer(gtl.HookedTransformerConfig(**kwargs(case)))
    state = {k.replace(".attn._", ".attn."): v for k, v in tl_model.state_dict().items()}  # _W_K -> W_K ...
    model.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                      fold_value_biases=False)
    return model.eval()


@pytest.mark.parametrize("case", CASES)
def test_logits_and_hook_shapes_equal_transformer_lens_s(case):
    theirs = perturbed_tl(case)
    ours = glassbox_twin(theirs, case)
    tokens = torch.randint(0, 41, (2, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits_theirs, cache_theirs = theirs.run_with_cache(tokens)
        logits_ours, cache_ours = ours.run_with_cache(tokens)
    err = float((logits_ours - logits_theirs).abs().max())
    scale = float(logits_theirs.abs().max())
    assert scale > 1.0  # not a degenerate model
    # measured at most 6.6e-15 x scale (mqa_ungrouped; logits up to 8.4), bound 1e-13 x scale: 15x
    assert err <= 1e-13 * scale, f"{case}: logits differ by {err} (scale {scale})"
    shapes = {name: tuple(t.shape) for name, t in cache_theirs.items()}
    for name in ("blocks.0.attn.hook_k", "blocks.1.attn.hook_v", "blocks.2.attn.hook_q", "blocks.0.attn.hook_z",
                 "blocks.1.attn.hook_pattern", "blocks.2.hook_attn_out", "blocks.2.hook_resid_post"):
        assert tuple(cache_ours[name].shape) == shapes[name], name
    cfg = ours.cfg
    kv = cfg.n_heads if cfg.ungroup_grouped_query_attention else (cfg.n_key_value_heads or cfg.n_heads)
    assert tuple(cache_ours["blocks.0.attn.hook_k"].shape) == (2, 11, kv, 6)
    # every hook both have holds the same activation (up to float64 rounding)
    for name in sorted(set(shapes) & set(cache_ours.keys())):
        theirs_t, ours_t = cache_theirs[name], cache_ours[name]
        if name == "unembed.hook_out" and cfg.glassbox.output_logits_soft_cap is not None:
            ours_t = cache_ours["unembed.hook_pre_cap"]  # TransformerLens hooks the logits before the cap
        if "_norm.hook_" in name and cfg.use_qk_norm:  # TransformerLens's per-head q/k norms see [-1 d_head]
            assert theirs_t.numel() == ours_t.numel(), name
            theirs_t = theirs_t.reshape(ours_t.shape)
        if name.endswith("hook_attn_scores"):  # masked entries: -inf in glassbox, a large negative in TL
            keep = torch.isfinite(ours_t)
            theirs_t, ours_t = theirs_t[keep], ours_t[keep]
        # measured at most 1.3e-14 x max(1, scale) (gqa's layer-2 pattern), bound 2e-13: 16x
        bound = 2e-13 * max(1.0, float(theirs_t.abs().max()))
        assert float((ours_t - theirs_t).abs().max()) <= bound, name


@pytest.mark.parametrize("case", ["gqa", "olmo2"])
def test_weight_views_repeat_kv_heads_as_transformer_lens(case):
    theirs = perturbed_tl(case)
    ours = glassbox_twin(theirs, case)
    for name in ("W_K", "W_V", "W_Q", "W_O"):
        assert torch.equal(getattr(ours, name), getattr(theirs, name)), name
    assert tuple(ours.W_K.shape) == (3, 6, 36, 6)
    for layer in range(3):
        assert torch.equal(ours.blocks[layer].attn.W_K, theirs.blocks[layer].attn._W_K)
        assert torch.equal(ours.blocks[layer].attn.b_V, theirs.blocks[layer].attn._b_V)


@pytest.mark.parametrize("fields, field", [
    (dict(use_qk_norm=True, normalization_type="LN"), "use_qk_norm"),
    (dict(use_normalization_before_and_after=True, normalization_type="LN"), "use_normalization_before_and_after"),
    (dict(use_local_attn=True, window_size=4), "use_local_attn"),
    (dict(use_local_attn=True, attn_types=["local", "banded", "local"], window_size=4), "use_local_attn"),
    (dict(n_key_value_heads=4), "n_key_value_heads"),
    (dict(use_NTK_by_parts_rope=True, rotary_scaling_factor=2.0), "use_NTK_by_parts_rope"),
    (dict(use_NTK_by_parts_rope=True, rotary_base_local=50.0, **LOCAL), "rotary_base_local"),
    (dict(use_yarn_rope=True, rotary_base_local=50.0, **LOCAL), "rotary_base_local"),
    (dict(use_dynamic_ntk_rope=True), "use_dynamic_ntk_rope"),
    (dict(original_architecture="Olmo2ForCausalLM", normalization_type="LN"), "original_architecture"),
    (dict(original_architecture="Olmo2ForCausalLM", use_qk_norm=True), "use_qk_norm"),
    (dict(attn_scale=-2.0), "attn_scale"),
])
def test_what_glassbox_cannot_compute_is_refused_by_field(fields, field):
    with pytest.raises(ValueError, match=f"HookedTransformerConfig.{field}="):
        gtl.HookedTransformerConfig(**{**BASE, **fields})


def test_a_combination_glassbox_cannot_build_names_the_glassbox_field():
    with pytest.raises(ValueError, match="glassbox cannot build.*qk_norm='full'.*ungroup_grouped_query_attention"):
        gtl.HookedTransformerConfig(**BASE, original_architecture="Olmo2ForCausalLM", n_key_value_heads=2,
                                    ungroup_grouped_query_attention=True)


def test_architecture_fields_are_fixed_on_a_built_model():
    model = gtl.HookedTransformer(gtl.HookedTransformerConfig(**kwargs("gqa")))
    for name, value in (("n_key_value_heads", 3), ("ungroup_grouped_query_attention", True),
                        ("original_architecture", "Olmo2ForCausalLM")):
        with pytest.raises(AttributeError, match="cannot change on a built model"):
            setattr(model.cfg, name, value)
    assert model.cfg.n_kv_groups == 3 and model.cfg.layer_attn_scale(1) == 6 ** -0.5
