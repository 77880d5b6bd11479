"""Hook flags, the norms' hook_normalized / hook_out, the unembedding's hooks and attention-only models
against TransformerLens 3.9 on the same weights (``tl_twin``).

For every flag combination both libraries compute (glassbox refuses split q/k/v with attn_in, and
the input flags with parallel blocks; TransformerLens refuses hook_mlp_in when attention-only), the
cached key sets are equal apart from the norms' ``hook_out`` (glassbox's name for the post-affine
output, which TransformerLens does not hook) and, in parallel blocks, TransformerLens's ln2 (glassbox's
parallel MLP reads ln1, as GPT-J does); every shared activation has the same shape and value. Edits
at the flag-gated hooks and at hook_normalized move both models' logits alike.
"""

import pytest
import torch

from tl_oracle import max_diff, tiny_model, tl_twin, tokens

CONFIGS = {
    "gpt2": {},
    "rms_rotary_gated": dict(normalization="RMS", positional="rotary", gated_mlp=True, act_fn="silu",
                             use_bias=False, tied_unembed=False),
    "parallel": dict(parallel_attn_mlp=True, positional="rotary", rotary_dim=4, rotary_style="interleaved"),
    "attn_only": dict(attn_only=True),
}
COMBOS = {
    "none": {},
    "attn_result": dict(use_attn_result=True),
    "split_qkv": dict(use_split_qkv_input=True),
    "attn_in": dict(use_attn_in=True),
    "mlp_in": dict(use_hook_mlp_in=True),
    "result_split_mlp_in": dict(use_attn_result=True, use_split_qkv_input=True, use_hook_mlp_in=True),
    "result_attn_in_mlp_in": dict(use_attn_result=True, use_attn_in=True, use_hook_mlp_in=True),
}


def computable(config: str, combo: dict) -> bool:
    if config == "parallel":
        return set(combo) <= {"use_attn_result"}
    return not (config == "attn_only" and "use_hook_mlp_in" in combo)


CASES = [(c, k) for c in CONFIGS for k in COMBOS if computable(c, COMBOS[k])]


def pair(config: str, combo: dict, dtype=torch.float64):
    model = tiny_model(0, dtype=dtype, **CONFIGS[config])
    twin = tl_twin(model)
    for flag, value in combo.items():
        getattr(model, f"set_{flag}")(value)
        getattr(twin, f"set_{flag}")(value)
    return model, twin


def only_ours(model, config: str) -> set:
    norms = ["ln_final"] + [f"blocks.{L}.ln1" for L in range(2)]
    if config not in ("parallel", "attn_only"):
        norms += [f"blocks.{L}.ln2" for L in range(2)]
    return {f"{n}.hook_out" for n in norms}


def only_theirs(config: str) -> set:
    if config != "parallel":
        return set()
    return {f"blocks.{L}.ln2.{h}" for L in range(2) for h in ("hook_scale", "hook_normalized")}


@pytest.mark.parametrize("config,combo", CASES)
def test_cached_keys_shapes_and_values_match_transformer_lens(config, combo):
    model, twin = pair(config, COMBOS[combo])
    toks = tokens(model, 2, 12)
    with torch.no_grad():
        ours_logits, ours = model.run_with_cache(toks)
        theirs_logits, theirs = twin.run_with_cache(toks)
    assert set(ours.keys()) == set(model.hook_dict)  # the hooks in hook_dict are exactly those that fire
    assert set(ours.keys()) - set(theirs.keys()) == only_ours(model, config)
    assert set(theirs.keys()) - set(ours.keys()) == only_theirs(config)
    causal = torch.ones(12, 12, dtype=torch.bool).tril()
    for name in set(ours.keys()) & set(theirs.keys()):
        a, b = ours[name], theirs[name]
        assert a.shape == b.shape, name
        if name.endswith("hook_attn_scores"):  # masked entries: -inf here, TransformerLens's own fill there
            assert torch.isinf(a[..., ~causal]).all(), name
            a, b = a[..., causal], b[..., causal]
        # float64: measured 6.3e-15 at worst (values up to 5.4), bound 7e-14: 11x
        assert max_diff(a, b) < 7e-14, name
    # float64: measured 6.3e-15 (logits up to 5.4), bound 7e-14: 11x
    assert max_diff(ours_logits, theirs_logits) < 7e-14


@pytest.mark.parametrize("config,combo", [(c, k) for c, k in CASES if k in ("none", "result_split_mlp_in",
                                                                            "result_attn_in_mlp_in", "attn_result")])
def test_float32_logits_with_flags_match_transformer_lens(config, combo):
    model, twin = pair(config, COMBOS[combo], dtype=torch.float32)
    toks = tokens(model, 2, 12)
    with torch.no_grad():
        # measured 3.7e-6 at worst (logits up to 5.4), bound 4e-5: 11x
        assert max_diff(model(toks), twin(toks)) < 4e-5


def edits(flags: dict, config: str) -> list:
    """Hooks that edit one head or one value at each hook the flags turn on (out of place), and at
    hook_normalized (ln1's only outside parallel blocks, where TransformerLens's MLP reads ln2, ours ln1)."""
    def scale_head(h, factor):
        def fn(x, hook):
            x = x.clone()
            x[:, :, h] = x[:, :, h] * factor
            return x
        return fn

    hooks = [("ln_final.hook_normalized", lambda x, hook: x * 1.5)]
    if config != "parallel":
        hooks += [("blocks.0.ln1.hook_normalized", lambda x, hook: x.flip(-1))]
    if flags.get("use_split_qkv_input"):
        hooks += [("blocks.1.hook_q_input", scale_head(0, 2.0)), ("blocks.0.hook_k_input", scale_head(1, -1.0)),
                  ("blocks.1.hook_v_input", scale_head(2, 0.5))]
    if flags.get("use_attn_in"):
        hooks += [("blocks.1.hook_attn_in", scale_head(1, 3.0))]
    if flags.get("use_attn_result"):
        hooks += [("blocks.0.attn.hook_result", scale_head(2, 0.0))]
    if flags.get("use_hook_mlp_in"):
        hooks += [("blocks.1.hook_mlp_in", lambda x, hook: x * 0.7)]
    return hooks


@pytest.mark.parametrize("config,combo", [(c, k) for c, k in CASES if k != "none"])
def test_edits_at_the_new_hooks_move_both_models_alike(config, combo):
    model, twin = pair(config, COMBOS[combo])
    toks = tokens(model, 2, 12)
    hooks = edits(COMBOS[combo], config)
    with torch.no_grad():
        clean = model(toks)
        ours = model.run_with_hooks(toks, fwd_hooks=hooks)
        theirs = twin.run_with_hooks(toks, fwd_hooks=hooks)
        # the split ln1 caches hold the value input's norm in both (the last of q, k, v)
        if COMBOS[combo].get("use_split_qkv_input"):
            names = ["blocks.1.ln1.hook_scale", "blocks.1.ln1.hook_normalized"]
            with model.hooks(hooks):
                _, our_cache = model.run_with_cache(toks, names_filter=names)
            with twin.hooks(fwd_hooks=hooks):
                _, their_cache = twin.run_with_cache(toks, names_filter=names)
            for name in names:
                # measured 2.0e-15 (values up to 3.0), bound 2e-14: 10x
                assert max_diff(our_cache[name], their_cache[name]) < 2e-14, name
    assert max_diff(ours, clean) > 1e-2  # the edits did something
    # float64: measured 1.0e-14 (logits up to 7.9), bound 1e-13: 10x
    assert max_diff(ours, theirs) < 1e-13


def test_flag_gated_hooks_are_refused_while_off_in_both():
    model, twin = pair("gpt2", {})
    for name in ("blocks.0.attn.hook_result", "blocks.0.hook_q_input", "blocks.0.hook_attn_in", "blocks.0.hook_mlp_in"):
        with pytest.raises(KeyError, match="only while"):
            model.add_hook(name, lambda x, hook: None)
        with pytest.raises(AssertionError, match="Cannot add hook"):
            twin.add_hook(name, lambda x, hook: None)
    twin.reset_hooks()


def test_attention_only_model_builds_from_transformer_lens_config_fields():
    from glassbox import Config, HookedTransformer
    import transformer_lens

    tl_cfg = transformer_lens.HookedTransformerConfig(n_layers=2, d_model=24, n_ctx=32, d_head=8, n_heads=3,
                                                      d_vocab=50257, attn_only=True, act_fn=None,
                                                      normalization_type="LN")
    ours = HookedTransformer(Config(d_model=tl_cfg.d_model, n_layers=tl_cfg.n_layers, n_heads=tl_cfg.n_heads,
                                    d_head=tl_cfg.d_head, d_vocab=tl_cfg.d_vocab, n_ctx=tl_cfg.n_ctx,
                                    attn_only=tl_cfg.attn_only))
    theirs = transformer_lens.HookedTransformer(tl_cfg, move_to_device=False)
    ours_params = {n for n, _ in ours.named_parameters()} | {"unembed.W_U", "unembed.b_U"}
    theirs_params = {n for n, _ in theirs.named_parameters()}
    assert ours_params == theirs_params  # no ln2 or MLP weights in either


def test_a_backward_hook_returning_a_one_tuple_matches_transformer_lens():
    model = tiny_model(0, dtype=torch.float64)
    twin = tl_twin(model)
    toks = tokens(model, 2, 9)

    def halve(grad, hook):
        return (grad * 0.5,)  # torch's module-hook form, which TransformerLens's users return

    grads = []
    for m in (model, twin):
        m.zero_grad()
        m.blocks[1].hook_resid_pre.add_hook(halve, dir="bwd")
        m(toks, return_type="loss").backward()
        grads.append(m.blocks[0].attn.W_Q.grad.clone())
        m.reset_hooks()
        m.zero_grad()
        m(toks, return_type="loss").backward()
        grads.append(m.blocks[0].attn.W_Q.grad.clone())
    # float64, the same weights: measured 2.6e-16 (gradients up to 0.08), bound 1e-12
    assert max_diff(grads[0], grads[2]) < 1e-12 and max_diff(grads[1], grads[3]) < 1e-12
    assert max_diff(grads[0], grads[1]) > 1e-3  # the hook halved the gradient that reached block 0
