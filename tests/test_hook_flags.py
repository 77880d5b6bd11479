"""Hook flags (use_attn_result, use_split_qkv_input, use_attn_in, use_hook_mlp_in), the norms' hook_normalized
/ hook_out, the unembedding's hooks and attention-only models: hand computations and identities.

Oracles: the per-head inputs are copies of resid_pre (bit-equal); each head's q/k/v and output by
hand in float64; hook_result summed plus b_O is hook_attn_out; the logits with a flag on equal the
logits with it off; an attention-only model's logits by hand from its weights.
"""

import copy

import pytest
import torch
from torch.testing import assert_close

from glassbox import Config, HookedTransformer
from glassbox.models import preset_config
from glassbox.models.hook_flags import FLAG_NAMES, HookFlagError, HookFlags

SIZES = dict(d_model=13, n_layers=2, n_heads=3, d_head=6, d_vocab=31, n_ctx=17, d_mlp=19)
ARCHS = {
    "gpt2": preset_config("gpt2", **SIZES),
    "modern": preset_config("modern", **SIZES),      # rotary, RMSNorm, SwiGLU
    "classic": preset_config("classic", **SIZES),    # post-norm, sinusoidal
    "parallel": preset_config("gpt2", **SIZES, parallel_attn_mlp=True, positional="rotary",
                              rotary_style="interleaved", rotary_dim=4),
    "attn_only": preset_config("gpt2", **SIZES, attn_only=True),
}
# Every combination each architecture computes (split q/k/v and attn_in are never on together).
COMBOS = [dict(use_attn_result=True), dict(use_split_qkv_input=True), dict(use_attn_in=True),
          dict(use_hook_mlp_in=True), dict(use_attn_result=True, use_split_qkv_input=True, use_hook_mlp_in=True),
          dict(use_attn_result=True, use_attn_in=True, use_hook_mlp_in=True)]


def allowed(arch: str, combo: dict) -> bool:
    if arch == "parallel":
        return set(combo) == {"use_attn_result"}
    return not (arch == "attn_only" and "use_hook_mlp_in" in combo)


def build(arch: str, dtype=torch.float64, seed=0, flags=None) -> HookedTransformer:
    """Every parameter random (norm weights and biases too), so none can be ignored."""
    torch.manual_seed(seed)
    model = HookedTransformer(ARCHS[arch], dtype=dtype, hook_flags=flags).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.3 * torch.randn_like(param))
    return model


TOKENS = torch.randint(0, SIZES["d_vocab"], (2, 11), generator=torch.Generator().manual_seed(3))


def record(model, tokens=TOKENS, extra=()):
    """(logits, every activation as the hooks in ``extra`` left it)."""
    acts = {}
    with torch.no_grad(), model.hooks([*extra, (lambda n: True, lambda x, hook: acts.__setitem__(hook.name, x.clone()))]):
        logits = model(tokens)
    return logits, acts


# -- the flags object and hook_dict -----------------------------------------------------------------
def test_flags_default_off_shared_by_every_component_and_gate_hook_dict():
    model = build("gpt2")
    assert model.hook_flags == HookFlags() and all(not getattr(model.hook_flags, f) for f in FLAG_NAMES)
    for block in model.blocks:
        assert block.flags is model.hook_flags and block.attn.flags is model.hook_flags
    hook_dict = model.hook_dict
    base = set(hook_dict)
    gated = {"use_attn_result": ["attn.hook_result"], "use_split_qkv_input": ["hook_q_input", "hook_k_input", "hook_v_input"],
             "use_attn_in": ["hook_attn_in"], "use_hook_mlp_in": ["hook_mlp_in"]}
    for flag, leaves in gated.items():
        getattr(model, f"set_{flag}")(True)
        assert getattr(model.hook_flags, flag) is True
        assert set(model.hook_dict) - base == {f"blocks.{L}.{leaf}" for L in range(2) for leaf in leaves}, flag
        assert model.hook_dict is hook_dict  # updated in place
        getattr(model, f"set_{flag}")(False)
        assert set(model.hook_dict) == base, flag


def test_writing_a_field_is_the_same_as_the_setter_and_copies_are_independent():
    model = build("gpt2")
    model.hook_flags.use_attn_result = True
    assert "blocks.1.attn.hook_result" in model.hook_dict
    twin = copy.deepcopy(model)
    twin.set_use_attn_result(False)
    assert model.hook_flags.use_attn_result and "blocks.1.attn.hook_result" in model.hook_dict
    assert "blocks.1.attn.hook_result" not in twin.hook_dict and twin.blocks[1].attn.flags is twin.hook_flags
    with pytest.raises(HookFlagError, match="use_attn_in must be a bool"):
        model.hook_flags.use_attn_in = 1
    with pytest.raises(AttributeError, match="cannot be replaced"):
        model.hook_flags = HookFlags()


def test_a_flag_off_names_itself_and_its_setter():
    model = build("gpt2")
    for name, flag in [("blocks.0.attn.hook_result", "use_attn_result"), ("blocks.1.hook_q_input", "use_split_qkv_input"),
                       ("blocks.0.hook_attn_in", "use_attn_in"), ("blocks.1.hook_mlp_in", "use_hook_mlp_in")]:
        message = f"only while {flag} is on; turn it on with model.set_{flag}\\(True\\)"
        with pytest.raises(KeyError, match=message):
            model.add_hook(name, lambda x, hook: None)
        with pytest.raises(KeyError, match=message):
            model.run_with_cache(TOKENS, names_filter=name)
        with pytest.raises(KeyError, match=message):
            model.cache_size((2, 11), names_filter=[name])
    assert not model.has_hooks


@pytest.mark.parametrize("arch,flags,message", [
    ("gpt2", dict(use_split_qkv_input=True, use_attn_in=True), "use_split_qkv_input and use_attn_in cannot both"),
    ("attn_only", dict(use_hook_mlp_in=True), "use_hook_mlp_in needs an MLP.*attn_only=True"),
    ("parallel", dict(use_attn_in=True), "use_attn_in is not supported with parallel blocks"),
    ("parallel", dict(use_split_qkv_input=True), "use_split_qkv_input is not supported with parallel blocks"),
    ("parallel", dict(use_hook_mlp_in=True), "use_hook_mlp_in is not supported with parallel blocks"),
])
def test_refused_combinations_are_named_at_construction_and_by_the_setters(arch, flags, message):
    with pytest.raises(HookFlagError, match=message):
        HookedTransformer(ARCHS[arch], hook_flags=HookFlags(**flags))
    model = build(arch)
    *first, last = flags
    for flag in first:  # these alone are allowed
        getattr(model, f"set_{flag}")(True)
    before = dict(model.hook_dict)
    with pytest.raises(HookFlagError, match=message):
        getattr(model, f"set_{last}")(True)
    assert not getattr(model.hook_flags, last) and model.hook_dict == before  # nothing changed


def test_turning_a_flag_off_under_attached_hooks_is_refused():
    model = build("gpt2", flags=HookFlags(use_split_qkv_input=True))
    with model.hooks([("blocks.1.hook_k_input", lambda x, hook: None)]):
        with pytest.raises(HookFlagError, match="cannot turn use_split_qkv_input off while hooks are attached to "
                                                "blocks.1.hook_k_input"):
            model.set_use_split_qkv_input(False)
        assert model.hook_flags.use_split_qkv_input and "blocks.1.hook_k_input" in model.hook_dict
    model.set_use_split_qkv_input(False)
    assert "blocks.1.hook_k_input" not in model.hook_dict


# -- per-head inputs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["gpt2", "modern", "classic", "attn_only"])
def test_each_heads_inputs_are_copies_of_resid_pre(arch):
    for flags, leaves in [(HookFlags(use_split_qkv_input=True), ("hook_q_input", "hook_k_input", "hook_v_input")),
                          (HookFlags(use_attn_in=True), ("hook_attn_in",))]:
        _, acts = record(build(arch, flags=flags))
        for L in range(2):
            resid = acts[f"blocks.{L}.hook_resid_pre"]
            for leaf in leaves:
                per_head = acts[f"blocks.{L}.{leaf}"]
                assert per_head.shape == (2, 11, 3, 13)
                for h in range(3):
                    assert torch.equal(per_head[:, :, h], resid), (arch, leaf, L, h)


def test_editing_one_heads_q_input_moves_only_that_heads_queries():
    model = build("gpt2", flags=HookFlags(use_split_qkv_input=True))
    clean_logits, clean = record(model)
    noise = torch.randn(2, 11, 13, generator=torch.Generator().manual_seed(5), dtype=torch.float64)

    def edit_head_1(x, hook):
        x = x.clone()
        x[:, :, 1] += noise
        return x

    logits, acts = record(model, extra=[("blocks.1.hook_q_input", edit_head_1)])
    q, q0 = acts["blocks.1.attn.hook_q"], clean["blocks.1.attn.hook_q"]
    assert torch.equal(q[:, :, [0, 2]], q0[:, :, [0, 2]])
    assert float((q[:, :, 1] - q0[:, :, 1]).abs().min()) > 0  # every query of head 1 moved
    assert torch.equal(acts["blocks.1.attn.hook_k"], clean["blocks.1.attn.hook_k"])
    assert torch.equal(acts["blocks.1.attn.hook_v"], clean["blocks.1.attn.hook_v"])
    assert torch.equal(acts["blocks.1.hook_resid_pre"], clean["blocks.1.hook_resid_pre"])
    assert float((logits - clean_logits).abs().max()) > 1e-2
    # Head 1's queries by hand from its own edited input.
    ln, attn = model.blocks[1].ln1, model.blocks[1].attn
    x = clean["blocks.1.hook_resid_pre"] + noise
    normed = (x - x.mean(-1, keepdim=True)) / (x.var(-1, correction=0, keepdim=True) + ln.eps).sqrt() * ln.w + ln.b
    # measured 0 (values up to 2.5), bound 1e-14
    assert_close(q[:, :, 1], normed @ attn.W_Q[1] + attn.b_Q[1], atol=1e-14, rtol=0)


def test_an_in_place_edit_of_a_per_head_input_reaches_only_its_own_use():
    model = build("gpt2", flags=HookFlags(use_split_qkv_input=True, use_hook_mlp_in=True))
    _, clean = record(model)

    def bump(x, hook):
        x.add_(1.0)

    _, acts = record(model, extra=[("blocks.0.hook_v_input", bump), ("blocks.0.hook_mlp_in", bump)])
    for name in ("blocks.0.hook_q_input", "blocks.0.hook_k_input", "blocks.0.hook_resid_pre", "blocks.0.attn.hook_q",
                 "blocks.0.attn.hook_k"):
        assert torch.equal(acts[name], clean[name]), name
    assert not torch.equal(acts["blocks.0.attn.hook_v"], clean["blocks.0.attn.hook_v"])
    b = "blocks.0."
    # the bumped MLP input is a copy: resid_post still adds mlp_out to the unbumped resid_mid
    assert torch.equal(acts[b + "hook_mlp_in"], acts[b + "hook_resid_mid"] + 1.0)
    assert torch.equal(acts[b + "hook_resid_post"], acts[b + "hook_resid_mid"] + acts[b + "hook_mlp_out"])


def test_under_split_qkv_ln1_sees_one_input_per_head():
    model = build("modern", flags=HookFlags(use_split_qkv_input=True))
    seen = []
    with torch.no_grad(), model.hooks([("blocks.0.ln1.hook_out", lambda x, hook: seen.append(tuple(x.shape)))]):
        model(TOKENS)
    assert seen == [(2, 11, 3, 13)] * 3  # q, k, v inputs


# -- the head outputs, the MLP input, the unembedding ---------------------------------------------------
@pytest.mark.parametrize("arch", ["gpt2", "modern", "parallel", "attn_only"])
def test_hook_result_is_each_heads_output_and_sums_to_attn_out(arch):
    model = build(arch, flags=HookFlags(use_attn_result=True))
    _, acts = record(model)
    for L in range(2):
        attn = model.blocks[L].attn
        z, result = acts[f"blocks.{L}.attn.hook_z"], acts[f"blocks.{L}.attn.hook_result"]
        for h in range(3):
            # measured 0 (values up to 4.8), bound 1e-14
            assert_close(result[:, :, h], z[:, :, h] @ attn.W_O[h], atol=1e-14, rtol=0)
        # measured 0 (values up to 4.8): the same sum
        out = result.sum(-2) + attn.b_O if attn.b_O is not None else result.sum(-2)
        assert_close(out, acts[f"blocks.{L}.hook_attn_out"], atol=0, rtol=0)


def test_hook_mlp_in_is_resid_mid_and_unembed_hooks_are_the_final_norm_and_the_logits():
    model = build("gpt2", flags=HookFlags(use_hook_mlp_in=True))
    logits, acts = record(model)
    for L in range(2):
        assert torch.equal(acts[f"blocks.{L}.hook_mlp_in"], acts[f"blocks.{L}.hook_resid_mid"])
    assert torch.equal(acts["unembed.hook_in"], acts["ln_final.hook_out"])
    assert torch.equal(acts["unembed.hook_out"], logits)
    post = build("classic", flags=HookFlags(use_hook_mlp_in=True))
    _, acts = record(post)
    assert torch.equal(acts["blocks.1.hook_mlp_in"], acts["blocks.1.hook_resid_mid"])
    assert torch.equal(acts["unembed.hook_in"], acts["blocks.1.hook_resid_post"])  # post-norm: no final norm


# -- the norms ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("arch", ["gpt2", "modern"])
def test_hook_normalized_is_before_w_and_b_and_hook_out_is_the_output(arch, dtype):
    model = build(arch, dtype=dtype)
    _, acts = record(model)
    fused = {}
    with torch.no_grad(), model.hooks([(lambda n: n.endswith(("hook_resid_pre", "hook_resid_mid", "hook_out")),
                                        lambda x, hook: fused.__setitem__(hook.name, x.clone()))]):
        model(TOKENS)
    # (hook_normalized by hand, explicit output against the fused kernel)
    # float32: measured 3.1e-7 (values up to 2.8), bound 3e-6: 10x; and 1.1e-6 (values up to 4.4), bound 1e-5: 9x
    # float64: measured 4.4e-16 (values up to 3.0), bound 5e-15: 11x; and 2.4e-15 (values up to 4.2), bound 3e-14: 12x
    tol_normalized, tol_fused = {torch.float32: (3e-6, 1e-5), torch.float64: (5e-15, 3e-14)}[dtype]
    for norm_name, input_name in [("blocks.0.ln1", "blocks.0.hook_resid_pre"), ("blocks.1.ln2", "blocks.1.hook_resid_mid")]:
        norm = model.get_submodule(norm_name)
        x = acts[input_name].double()
        centred = x - x.mean(-1, keepdim=True) if arch == "gpt2" else x
        normalized = centred / (centred.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
        assert_close(acts[norm_name + ".hook_normalized"].double(), normalized, atol=tol_normalized, rtol=0)
        bias = getattr(norm, "b", None)  # RMSNorm has none
        affine = acts[norm_name + ".hook_normalized"] * norm.w + (bias if bias is not None else 0)
        # reading hook_normalized leaves the fused kernel's output: hook_out is the unhooked norm's of the
        # same input, bit for bit (the cache's input differs from `fused`'s: its attention was explicit)
        with torch.no_grad():
            assert torch.equal(acts[norm_name + ".hook_out"], norm(acts[input_name]))
        # and w and b applied to the normalised value the hook saw give it to rounding
        assert_close(affine, acts[norm_name + ".hook_out"], atol=tol_fused, rtol=0)
        assert torch.equal(fused[norm_name + ".hook_out"], norm(fused[input_name]))  # reading hook_out: fused


def test_an_edit_at_hook_normalized_is_applied_before_w_and_b():
    model = build("gpt2")
    _, acts = record(model, extra=[("ln_final.hook_normalized", lambda x, hook: torch.zeros_like(x))])
    assert torch.equal(acts["ln_final.hook_out"], model.ln_final.b.detach().expand(2, 11, 13))


# -- flags on vs off ---------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", list(ARCHS))
def test_logits_with_flags_on_equal_logits_with_them_off(arch):
    model = build(arch, dtype=torch.float32)
    with torch.no_grad():
        off = model(TOKENS)
        for combo in COMBOS:
            if not allowed(arch, combo):
                continue
            for flag, value in combo.items():
                getattr(model, f"set_{flag}")(value)
            on = model(TOKENS)
            for flag in combo:
                getattr(model, f"set_{flag}")(False)
            # measured 1.9e-6 at worst (modern; logits up to 6.1), bound 2e-5: 10x
            assert_close(on, off, atol=2e-5, rtol=0, msg=lambda m: f"{arch} {combo}: {m}")
        assert torch.equal(model(TOKENS), off)  # flags back off: the unflagged forward, same bits


def test_key_value_cache_agrees_with_a_full_forward_under_the_flags():
    model = build("modern", flags=HookFlags(use_split_qkv_input=True, use_attn_result=True, use_hook_mlp_in=True))
    from glassbox.models import KVCache

    with torch.no_grad():
        full = model(TOKENS)
        cache = KVCache(model.cfg.n_layers)
        first = model(TOKENS[:, :6], past_kv_cache=cache)
        rest = [model(TOKENS[:, i:i + 1], past_kv_cache=cache) for i in range(6, 11)]
    # measured 3.7e-15 (values up to 4.9), bound 5e-14: 13x
    assert_close(torch.cat([first, *rest], dim=1), full, atol=5e-14, rtol=0)


def test_cache_size_predicts_the_flagged_cache_exactly():
    for arch, flags in [("gpt2", HookFlags(use_split_qkv_input=True, use_attn_result=True, use_hook_mlp_in=True)),
                        ("modern", HookFlags(use_attn_in=True)), ("classic", HookFlags(use_split_qkv_input=True))]:
        model = build(arch, flags=flags)
        _, cache = model.run_with_cache(TOKENS)
        assert set(cache.keys()) == set(model.hook_dict), arch
        assert model.cache_size(TOKENS.shape) == sum(t.numel() * t.element_size() for t in cache.values()), arch


def test_a_cache_keeps_ln1_of_the_value_input_under_split_qkv():
    model = build("gpt2", flags=HookFlags(use_split_qkv_input=True))

    def v_only(x, hook):
        x = x.clone()
        x[:, :, 2] *= 3.0
        return x

    with model.hooks([("blocks.0.hook_v_input", v_only)]):
        _, cache = model.run_with_cache(TOKENS, names_filter=["blocks.0.hook_resid_pre", "blocks.0.ln1.hook_scale"],
                                        return_type=None)
    scale, resid = cache["blocks.0.ln1.hook_scale"], cache["blocks.0.hook_resid_pre"]
    assert scale.shape == (2, 11, 3, 1)
    eps = model.blocks[0].ln1.eps
    # measured 0 (values up to 0.51), bound 1e-14
    assert_close(scale[:, :, 0], (resid.var(-1, correction=0, keepdim=True) + eps).sqrt(), atol=1e-14, rtol=0)
    # head 2 of the value input was scaled by 3, and the cache holds ln1 of the value input
    # measured 0 (values up to 1.5), bound 1e-14
    assert_close(scale[:, :, 2], ((3 * resid).var(-1, correction=0, keepdim=True) + eps).sqrt(), atol=1e-14, rtol=0)


# -- attention-only models ---------------------------------------------------------------------------
def test_attention_only_config_and_what_it_refuses():
    cfg = ARCHS["attn_only"]
    model = build("attn_only")
    assert not any(hasattr(b, "mlp") or hasattr(b, "ln2") for b in model.blocks)
    with pytest.raises(AttributeError):
        model.W_in
    with pytest.raises(ValueError, match="attn_only=True has no MLP to run in parallel"):
        cfg.replace(parallel_attn_mlp=True)
    with pytest.raises(ValueError, match="attn_only=True needs norm_placement='pre'"):
        cfg.replace(norm_placement="post")


def layer_norm(x, norm):
    return (x - x.mean(-1, keepdim=True)) / (x.var(-1, correction=0, keepdim=True) + norm.eps).sqrt() * norm.w + norm.b


def test_attention_only_logits_by_hand():
    model = build("attn_only")
    with torch.no_grad():
        logits = model(TOKENS)
        resid = model.W_E[TOKENS] + model.W_pos[:11]
        causal = torch.ones(11, 11, dtype=torch.bool).tril()
        for block in model.blocks:
            attn, x = block.attn, layer_norm(resid, block.ln1)
            out = attn.b_O.clone()
            for h in range(3):
                q, k, v = (x @ W[h] + b[h] for W, b in ((attn.W_Q, attn.b_Q), (attn.W_K, attn.b_K), (attn.W_V, attn.b_V)))
                scores = (q @ k.transpose(-1, -2) / 6 ** 0.5).masked_fill(~causal, float("-inf"))
                out = out + scores.softmax(-1) @ v @ attn.W_O[h]
            resid = resid + out
        expected = layer_norm(resid, model.ln_final) @ model.W_U
    # measured 2.7e-15 (values up to 4.2), bound 3e-14: 11x
    assert_close(logits, expected, atol=3e-14, rtol=0)


# -- patching sweeps over the flag-gated hooks -------------------------------------------------------
@pytest.mark.parametrize("template,axes", [("blocks.{L}.attn.hook_result", ("layer", "pos", "head")),
                                           ("blocks.{L}.hook_q_input", ("layer", "pos", "head")),
                                           ("blocks.{L}.hook_mlp_in", ("layer", "pos"))])
def test_a_patching_sweep_over_a_flag_gated_hook_matches_one_patch_per_forward(template, axes):
    from glassbox.interp.patching import LogitDiff, activation_patch

    model = build("gpt2", flags=HookFlags(use_attn_result=True, use_split_qkv_input=True, use_hook_mlp_in=True))
    clean = TOKENS[:1, :8]
    corrupted = clean.clone()
    corrupted[0, 3] = (corrupted[0, 3] + 1) % SIZES["d_vocab"]
    metric = LogitDiff(1, 2)
    with torch.no_grad():
        _, cache = model.run_with_cache(clean)
        swept = activation_patch(model, corrupted, cache, metric, template, axes)
        swept = getattr(swept, "values", swept)
        for index in torch.cartesian_prod(*(torch.arange(n) for n in swept.shape)).tolist():
            layer, pos, *head = index
            name = template.format(L=layer)

            def patch(x, hook, pos=pos, head=head, name=name):
                x = x.clone()
                x[(slice(None), pos, *head)] = cache[name][(slice(None), pos, *head)]
                return x

            expected = metric(model.run_with_hooks(corrupted, fwd_hooks=[(name, patch)]))
            # measured 8.9e-16 at worst (metric values up to 2.1), bound 1e-14: 11x
            assert_close(swept[tuple(index)], expected.reshape(()), atol=1e-14, rtol=0, msg=lambda m: f"{index}: {m}")


def test_attention_only_models_are_refused_by_the_hugging_face_export(tmp_path):
    model = build("attn_only", dtype=torch.float32)
    for export in (lambda: model.to_hf(), lambda: model.save_pretrained(tmp_path / "out")):
        with pytest.raises(ValueError, match="attention-only blocks"):
            export()
    assert not (tmp_path / "out").exists()


def test_processing_keeps_the_flags_in_a_copy_of_their_own():
    from glassbox.weights.processing import process

    model = build("gpt2", flags=HookFlags(use_attn_result=True, use_hook_mlp_in=True))
    folded = process(model, fold_ln=True)
    assert folded.hook_flags.as_dict() == model.hook_flags.as_dict()
    assert folded.hook_flags is not model.hook_flags
    assert "blocks.0.attn.hook_result" in folded.hook_dict
    folded.set_use_attn_result(False)
    assert model.hook_flags.use_attn_result


def test_the_loss_of_float64_logits_is_computed_in_float64():
    model = build("gpt2", dtype=torch.float64)
    with torch.no_grad():
        logits = model(TOKENS)
    by_hand = -torch.log_softmax(logits[:, :-1], -1).gather(-1, TOKENS[:, 1:, None]).mean()
    loss = model.loss_fn(logits, TOKENS)
    assert loss.dtype == torch.float64
    # measured 0 (loss 3.99; computed in float32 it is off by 1.7e-7), bound 1e-12
    assert abs(float(loss - by_hand)) < 1e-12


def test_copied_flags_are_independent_and_owners_are_not_kept_alive():
    import gc
    import weakref

    a = build("gpt2")
    b = HookedTransformer(ARCHS["attn_only"], hook_flags=copy.copy(a.hook_flags), dtype=torch.float64)
    a.set_use_hook_mlp_in(True)  # b (attention-only, which would refuse it) shares nothing with a
    assert "blocks.0.hook_mlp_in" in a.hook_dict and not b.hook_flags.use_hook_mlp_in
    flags = HookFlags()
    model = HookedTransformer(ARCHS["gpt2"], hook_flags=flags)
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None  # the caller's flags object does not keep its model alive


def test_a_deep_copy_has_its_own_flags_and_no_open_hook_blocks():
    model = build("gpt2")
    with model.hooks([("blocks.0.hook_resid_pre", lambda x, hook: None)]):
        twin = copy.deepcopy(model)
    assert twin.context_level == 0 and model.context_level == 0
    assert twin.hook_flags is not model.hook_flags
    assert all(block.attn.flags is twin.hook_flags for block in twin.blocks)
    twin.set_use_attn_result(True)
    assert "blocks.0.attn.hook_result" in twin.hook_dict and "blocks.0.attn.hook_result" not in model.hook_dict
