"""TransformerLens's own-format architectures against TransformerLens 3.9: its norm components
(LayerNorm, LayerNormPre, RMSNorm, RMSNormPre), the SoLU MLP with its LayerNorm over d_mlp
(act_fn "solu_ln": glassbox's act_fn "solu" with mlp_ln) and attention-only models, unprocessed and
after TransformerLens's default processing (fold_ln folds the MLP's norm into W_out too), with the
same seeded weights (tl_oracle.tl_twin). Distinct sizes (d_model 20, 4 heads of 5, d_mlp 28, n_ctx 17)
so a swapped axis cannot pass."""

import pytest
import torch

import glassbox.tl as gtl
import glassbox.tl.components as G
import transformer_lens as TL
import transformer_lens.components as T
from tl_oracle import max_diff, tiny_model, tl_config, tl_twin, tokens

SIZES = dict(d_model=20, n_heads=4, d_head=5, d_mlp=28, n_ctx=17, n_layers=2)
MODELS = {"solu_ln": dict(act_fn="solu", mlp_ln=True), "attn_only": dict(attn_only=True)}
# measured (float32 | float64): logits <= 3.3e-6 | 4.4e-15, every hook <= 4.5e-6 | 6.2e-15 (values up to ~6)
BOUNDS = {torch.float32: 5e-5, torch.float64: 1e-12}


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over the finite entries; the masked (-inf) scores must sit at the same places."""
    assert a.shape == b.shape and torch.equal(torch.isinf(a), torch.isinf(b))
    finite = torch.isfinite(a)
    return max_diff(a[finite], b[finite])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", MODELS)
def test_model_and_every_hook_equal_transformer_lens_s(name, dtype):
    model = tiny_model(3, dtype=dtype, **SIZES, **MODELS[name])
    twin = tl_twin(model)
    assert twin.cfg.act_fn == ("solu_ln" if name == "solu_ln" else twin.cfg.act_fn)
    toks = tokens(model, 3, 11)
    with torch.no_grad():
        ours, cache = model.run_with_cache(toks)
        theirs, tl_cache = twin.run_with_cache(toks)
    assert max_diff(ours, theirs) <= BOUNDS[dtype]
    assert set(tl_cache.keys()) <= set(cache.keys()), set(tl_cache.keys()) - set(cache.keys())
    if name == "solu_ln":
        assert {"blocks.1.mlp.hook_mid", "blocks.1.mlp.ln.hook_scale", "blocks.1.mlp.ln.hook_normalized"} <= set(
            tl_cache.keys())
    for key in tl_cache.keys():
        assert gap(cache[key], tl_cache[key]) <= BOUNDS[dtype], key


@pytest.mark.parametrize("name", MODELS)
def test_processing_equals_transformer_lens_s(name):
    model = tiny_model(5, **SIZES, **MODELS[name])
    twin = tl_twin(model)
    processed = TL.HookedTransformer(tl_config(model.cfg), move_to_device=False)
    processed.load_and_process_state_dict(twin.state_dict(), fold_ln=True, center_writing_weights=True,
                                          center_unembed=True, fold_value_biases=True)
    ours = gtl.HookedTransformer.from_glassbox(model)
    assert ours.cfg.normalization_type == processed.cfg.normalization_type == "LNPre"
    state = {k: v.detach() for k, v in ours.state_dict().items()}
    state["unembed.W_U"] = ours.W_U.detach()
    for key, value in processed.state_dict().items():
        if key.endswith((".mask", ".IGNORE")):
            continue
        # measured <= 8.9e-8 (W_out carries mlp.ln's w and b), bound 1e-6: 11x
        assert max_diff(state[key], value) <= 1e-6, key
    toks = tokens(model, 3, 11)
    with torch.no_grad():
        logits, cache = ours.run_with_cache(toks)
        tl_logits, tl_cache = processed.run_with_cache(toks)
    # measured <= 2.9e-6 (logits up to 4.5), bound 3e-5: 10x
    assert max_diff(logits, tl_logits) <= 3e-5
    for key in tl_cache.keys():
        assert gap(cache[key], tl_cache[key]) <= 3e-5, key  # measured <= 3.6e-6
    # TransformerLens's classes for the folded norms, the MLP's own norm included
    assert isinstance(ours.ln_final, G.LayerNormPre) and isinstance(ours.blocks[1].ln1, G.LayerNormPre)
    if name == "solu_ln":
        assert isinstance(ours.blocks[0].mlp.ln, G.LayerNormPre) and isinstance(processed.blocks[0].mlp.ln, T.LayerNormPre)


def test_unfolded_models_have_transformer_lens_s_layer_norm_class():
    ours = gtl.HookedTransformer.from_glassbox(tiny_model(1, **SIZES, **MODELS["solu_ln"]), fold_ln=False)
    assert ours.cfg.normalization_type == "LN"
    for norm in (ours.ln_final, ours.blocks[0].ln2, ours.blocks[0].mlp.ln):
        assert isinstance(norm, G.LayerNorm) and not isinstance(norm, G.LayerNormPre)
    assert type(gtl.HookedTransformer(dict(n_layers=1, d_model=8, d_head=4, n_ctx=5, d_vocab=7,
                                           act_fn="solu_ln", normalization_type="RMS")).blocks[0].mlp.ln) is G.RMSNorm


NORMS = [("LayerNorm", None), ("LayerNorm", 9), ("RMSNorm", None), ("RMSNorm", 9), ("LayerNormPre", None),
         ("RMSNormPre", None)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name,length", NORMS)
def test_norm_components_equal_transformer_lens_s(name, length, dtype):
    cfg = dict(d_model=7, d_head=1, n_layers=1, n_ctx=5, d_vocab=11, eps=1e-3, dtype=dtype)
    args = (cfg,) if length is None else (cfg, length)
    ours, theirs = getattr(G, name)(*args), getattr(TL.components, name)(*args)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for (_, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
            assert p.dtype == q.dtype == dtype and p.shape == q.shape
            p.copy_(torch.randn(p.shape, generator=generator, dtype=dtype))
            q.copy_(p)
    width = 7 if length is None else length
    x = torch.randn(3, 5, width, generator=generator, dtype=dtype) * 3 + 1  # a mean to remove
    seen = {}
    for module, tag in ((ours, "ours"), (theirs, "theirs")):
        for hook in ("hook_scale", "hook_normalized"):
            getattr(module, hook).add_hook(lambda act, hook, key=(tag, hook): seen.__setitem__(key, act.detach()))
    with torch.no_grad():
        out, tl_out = ours(x), theirs(x)
    # outputs measured float64 <= 8.9e-16, float32 <= 4.8e-7 (values up to ~6); bounds 1e-12 and 1e-5
    bound = 1e-12 if dtype == torch.float64 else 1e-5
    assert out.dtype == tl_out.dtype and max_diff(out, tl_out) <= bound
    for hook in ("hook_scale", "hook_normalized"):
        assert seen["ours", hook].shape == seen["theirs", hook].shape
        assert max_diff(seen["ours", hook], seen["theirs", hook]) <= bound, hook


def test_transformer_lens_s_module_paths_give_the_norms():
    from transformer_lens.components.layer_norm_pre import LayerNormPre
    from transformer_lens.components.rms_norm_pre import RMSNormPre

    assert LayerNormPre.__module__.startswith("transformer_lens")  # the oracle's own class, not ours
    import glassbox.tl._alias as alias

    assert alias.MODULE_PATHS["components.layer_norm_pre"] == ("components", ["LayerNormPre"])
    assert alias.MODULE_PATHS["components.rms_norm_pre"] == ("components", ["RMSNormPre"])
    assert G.LayerNormPre.__name__ == LayerNormPre.__name__ and G.RMSNormPre.__name__ == RMSNormPre.__name__


def test_the_names_transformer_lens_s_own_tests_import_next_to_these_models():
    from transformer_lens.HookedTransformer import DTYPE_FROM_STRING
    from transformer_lens.utilities import solu as tl_solu

    assert gtl.HookedTransformer.__module__ == "glassbox.tl.HookedTransformer"
    from glassbox.tl.HookedTransformer import DTYPE_FROM_STRING as ours

    assert ours == DTYPE_FROM_STRING
    x = torch.randn(3, 5, 28, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 4
    # measured 0 (the same formula), bound 1e-15
    assert max_diff(gtl.utils.solu(x), tl_solu(x)) <= 1e-15


def test_remove_batch_dim_of_a_batch_raises_what_transformer_lens_raises():
    model = gtl.HookedTransformer.from_glassbox(tiny_model(0, **SIZES, **MODELS["solu_ln"]))
    _, cache = model.run_with_cache(tokens(model, 2, 5))
    twin = tl_twin(tiny_model(0, **SIZES, **MODELS["solu_ln"]))
    _, tl_cache = twin.run_with_cache(tokens(model, 2, 5))
    with pytest.raises(AssertionError):
        tl_cache.remove_batch_dim()
    with pytest.raises(AssertionError, match="remove_batch_dim needs batch size 1"):
        cache.remove_batch_dim()
    with pytest.raises(ValueError):  # glassbox's own type too
        cache.remove_batch_dim()
    assert cache.has_batch_dim and cache["hook_embed"].shape[0] == 2  # left as it was
