"""Weight processing on today's families' options: each step keeps predictions, or is refused by name.

For every option of Config that today's families use (grouped- and multi-query attention, per-part
biases, the RMSNorm weight offset, q/k norms, sandwich and output norm placements, GPT-NeoX's parallel
blocks with two norms, soft caps, attention scales, local layers, rope scaling, scaled embeddings)
and every step of glassbox.weights.processing, either the step applies and the oracle is the identity
that must hold (float64 logits, or log-probs and logits up to one constant per position for
center_unembed, and every attention pattern, equal before and after), or it is refused with a
ValueError naming the step and the option. Every parameter is random (norm weights and biases too),
so a norm folded into the wrong matrix, or a kv head's bias summed into the wrong query head, shows.
Hand computations check the folds themselves where an option changes them.
"""

import pytest
import torch

from conftest import perturbed
from glassbox.models import Config
from glassbox.weights.processing import ALL_STEPS, config_for, fold_ln, fold_value_biases, process

SIZES = dict(d_model=22, n_layers=1, n_heads=4, d_head=5, d_mlp=37, d_vocab=29, n_ctx=19)
RMS = dict(normalization="RMS")
ROTARY = dict(positional="rotary", rotary_dim=4)
TWO_LAYERS = dict(n_layers=2)  # for options that differ by layer (inverse-layer scaling, local/global)

# option -> Config fields on top of SIZES (GPT-2's defaults: learned positions, pre-LayerNorm, biases).
# Options that no step refuses share a model (the score options; the rotary ones) to keep the file fast.
OPTIONS = {
    "grouped_query": dict(n_key_value_heads=2),
    "multi_query_rms_gated_ungrouped": dict(n_key_value_heads=1, **RMS, gated_mlp=True, act_fn="silu",
                                            ungroup_grouped_query_attention=True),
    "qkv_bias_without_attn_out_bias": dict(**RMS, use_bias=False, qkv_bias=True),
    "norm_weight_offset": dict(**RMS, norm_weight_offset=1.0, act_fn="gelu_new", gated_mlp=True),
    "qk_norm_head": dict(**RMS, qk_norm="head", n_key_value_heads=2),
    "qk_norm_full": dict(**RMS, qk_norm="full"),
    "sandwich_rms_offset": dict(**RMS, norm_placement="sandwich", norm_weight_offset=1.0),
    "sandwich_ln": dict(norm_placement="sandwich"),
    "output_norms_rms": dict(**RMS, norm_placement="output"),
    "output_norms_ln": dict(norm_placement="output"),
    "post_norms": dict(norm_placement="post"),
    "parallel_ln2": dict(parallel_attn_mlp=True, parallel_ln2=True),
    "output_logits_soft_cap": dict(output_logits_soft_cap=2.5),
    "score_options_local_layers_scale_embed": dict(
        attn_scores_soft_cap=1.5, attn_scale=0.3, scale_attn_by_inverse_layer_idx=True,
        attn_types=("local", "global"), window_size=3, scale_embed=True, **TWO_LAYERS),
    "rotary_local_layers_rope_scaling": dict(
        **ROTARY, attn_types=("local", "global"), window_size=3, rotary_base_local=500.0,
        rope_scaling={"rope_type": "linear", "factor": 2.0}, tied_unembed=False, **TWO_LAYERS),
}

# option -> {step: a pattern the refusal's message must match (it names the step and the option)}.
REFUSED = {
    "qk_norm_head": {"refactor_factored_attn_matrices": r"refactor_factored_attn_matrices is not exact with "
                                                        r"qk_norm='head'"},
    "qk_norm_full": {"refactor_factored_attn_matrices": r"refactor_factored_attn_matrices is not exact with "
                                                        r"qk_norm='full'"},
    "sandwich_ln": {"center_writing_weights": r"center_writing_weights cannot centre .*norm_placement='sandwich'.*"
                                              r"ln1_post/ln2_post"},
    "output_norms_ln": {"center_writing_weights": r"center_writing_weights cannot centre .*norm_placement='output'"},
    "post_norms": {step: rf"{step} needs a pre-norm model; norm_placement='post'"
                   for step in ("fold_ln", "center_reader_weights", "center_writing_weights")},
    "output_logits_soft_cap": {"center_unembed": r"center_unembed is not exact with output_logits_soft_cap=2.5"},
}
RMS_REFUSALS = {"center_writing_weights": r"center_writing_weights relies on LayerNorm.*normalization='RMS'",
                "center_reader_weights": r"center_reader_weights relies on LayerNorm.*normalization='RMS'"}
ROTARY_REFUSAL = {"refactor_factored_attn_matrices": r"refactor_factored_attn_matrices is not exact with "
                                                     r"positional='rotary'"}


def refusals(option: str) -> dict:
    """The steps refused for an option: its own, RMSNorm's and rotary's (these two checked first)."""
    fields, refused = OPTIONS[option], {}
    if fields.get("n_key_value_heads", SIZES["n_heads"]) < SIZES["n_heads"]:
        refused["refactor_factored_attn_matrices"] = (r"refactor_factored_attn_matrices .*n_key_value_heads="
                                                      rf"{fields['n_key_value_heads']} < n_heads=4")
    refused.update(REFUSED.get(option, {}))
    if fields.get("normalization") == "RMS":
        refused.update(RMS_REFUSALS)
    if fields.get("positional") == "rotary":
        refused.update(ROTARY_REFUSAL)
    return refused


def config(option: str) -> Config:
    return Config(**{**SIZES, **OPTIONS[option]})


_MODELS, _RUNS = {}, {}


def model_for(option: str):
    """The option's random float64 model (built once). Output- and post-norm models read the raw
    embeddings, so those are scaled up for attention that is far from uniform."""
    if option not in _MODELS:
        try:
            model = perturbed(config(option), seed=len(_MODELS))
        except NotImplementedError as e:  # rope scaling lands with its own component
            pytest.skip(f"{option}: {e}")
        if model.cfg.norm_placement in ("output", "post"):
            with torch.no_grad():
                model.embed.W_E.mul_(4)
        _MODELS[option] = model
    return _MODELS[option]


TOKENS = torch.randint(0, SIZES["d_vocab"], (3, 13), generator=torch.Generator().manual_seed(3))
PAIRS = [(o, s) for o in OPTIONS for s in ALL_STEPS]


def run(model):
    with torch.no_grad():
        logits, cache = model.run_with_cache(TOKENS, names_filter=lambda name: name.endswith("hook_pattern"))
    return logits, [cache[f"blocks.{L}.attn.hook_pattern"] for L in range(model.cfg.n_layers)]


def steps_for(step: str) -> dict:
    """center_reader_weights needs folded norms: it runs after fold_ln."""
    return dict(fold_ln=True, center_reader_weights=True) if step == "center_reader_weights" else {step: True}


# (logits, log-probs and flatness with center_unembed, patterns): the largest error measured over every
# option and step, without and with refactor_factored_attn_matrices (its SVDs add rounding), logits up
# to 11 (log-probs down to -19), and the bound, ~10x that.
BOUNDS = {
    # measured 1.7e-14 (logits), 1.6e-14 (log-probs), 1.1e-14 (flatness), 2.7e-15 (patterns): 12x, 12x, 11x, 11x
    False: dict(logits=2e-13, log_probs=2e-13, flat=1.2e-13, pattern=3e-14),
    # measured 1.9e-13 (logits), 2.4e-13 (log-probs), 1.9e-13 (flatness), 1.3e-14 (patterns): 11x, 10x, 11x, 11x
    True: dict(logits=2e-12, log_probs=2.5e-12, flat=2e-12, pattern=1.5e-13),
}


def assert_invariant(model, processed, steps: dict):
    if id(model) not in _RUNS:  # the model is kept with its run, so its id is never reused
        _RUNS[id(model)] = (model, run(model))
    logits, patterns = _RUNS[id(model)][1]
    new_logits, new_patterns = run(processed)
    bound = BOUNDS[bool(steps.get("refactor_factored_attn_matrices"))]
    assert logits.abs().max() > 2, "logits too small for the comparison to mean anything"
    if steps.get("center_unembed"):  # one constant per position: flat along the vocabulary, log-probs equal
        diff = new_logits - logits
        torch.testing.assert_close(diff, diff.mean(-1, keepdim=True).expand_as(diff), atol=bound["flat"], rtol=0)
        torch.testing.assert_close(new_logits.log_softmax(-1), logits.log_softmax(-1), atol=bound["log_probs"], rtol=0)
        assert diff.abs().max() > 1e-3, "center_unembed did not move the logits"
    else:
        torch.testing.assert_close(new_logits, logits, atol=bound["logits"], rtol=0)
    for L, (new, old) in enumerate(zip(new_patterns, patterns)):
        assert old[..., -1, :].max() > 2 / old.shape[-1], f"layer {L}: attention too uniform to test anything"
        torch.testing.assert_close(new, old, atol=bound["pattern"], rtol=0, msg=lambda m: f"layer {L} pattern: {m}")


def assert_step_did_its_work(step: str, model, processed) -> None:
    """What each step promises, so that an invariance test cannot pass by doing nothing."""
    old, new = model.state_dict(), processed.state_dict()
    offset = model.cfg.norm_weight_offset
    if step in ("fold_ln", "center_reader_weights"):
        folded = ["ln_final.w"] + ([] if model.cfg.norm_placement == "output" else
                                   [k for k in new if k.endswith(("ln1.w", "ln2.w"))])
        for key in folded:
            assert not torch.equal(old[key], new[key]) and bool((new[key] == 1 - offset).all()), key
    if step == "center_reader_weights":
        # measured 8.1e-17 (entries up to 5.7), bound 1e-15: 12x
        assert float(new["unembed.W_U_T"].mean(1).abs().max()) < 1e-15
        if model.cfg.norm_placement == "output":  # the attention reads the residual stream: no norm to rely on
            assert torch.equal(new["blocks.0.attn.W_Q"], old["blocks.0.attn.W_Q"])
        else:
            # measured 3.5e-17 (entries up to 1.4), bound 5e-16: 14x
            assert float(new["blocks.0.attn.W_Q"].mean(1).abs().max()) < 5e-16
            assert float(old["blocks.0.attn.W_Q"].mean(1).abs().max()) > 1e-3
    if step == "center_writing_weights":
        for key in ("embed.W_E", "blocks.0.attn.W_O"):
            # measured 3.5e-17 (entries up to 1.3), bound 4e-16: 11x
            assert float(new[key].mean(-1).abs().max()) < 4e-16, key
            assert float(old[key].mean(-1).abs().max()) > 1e-3, key
    if step == "fold_value_biases" and "blocks.0.attn.b_V" in old:
        assert not new["blocks.0.attn.b_V"].any() and old["blocks.0.attn.b_V"].abs().min() > 0
        old_b_O = old.get("blocks.0.attn.b_O", torch.zeros_like(new["blocks.0.attn.b_O"]))  # Qwen2: made here
        assert float((new["blocks.0.attn.b_O"] - old_b_O).abs().max()) > 1e-3
    if step == "refactor_factored_attn_matrices":
        W_O = new["blocks.0.attn.W_O"]
        eye = torch.eye(W_O.shape[1], dtype=W_O.dtype).expand(W_O.shape[0], -1, -1)
        # measured 2.3e-15, bound 3e-14: 13x (the original's W_O W_O^T is far from it)
        torch.testing.assert_close(W_O @ W_O.transpose(1, 2), eye, atol=3e-14, rtol=0)


@pytest.mark.parametrize("option,step", PAIRS, ids=[f"{o}-{s}" for o, s in PAIRS])
def test_each_step_keeps_predictions_or_is_refused_by_name(option, step):
    model = model_for(option)
    refused = refusals(option)
    if step in refused:
        with pytest.raises(ValueError, match=refused[step]):
            process(model, **{step: True})
        return
    processed = process(model, **steps_for(step))
    assert processed.processing == tuple(s for s in ALL_STEPS if s in steps_for(step))
    assert_step_did_its_work(step, model, processed)
    assert_invariant(model, processed, steps_for(step))


@pytest.mark.parametrize("option", list(OPTIONS))
def test_every_allowed_step_together_keeps_predictions(option):
    model = model_for(option)
    refused = refusals(option)
    steps = {s: True for s in ALL_STEPS if s not in refused and not (s == "center_reader_weights"
                                                                     and "fold_ln" in refused)}
    processed = process(model, **steps)
    assert processed.processing == tuple(s for s in ALL_STEPS if s in steps)
    # The Config afterwards: untied (fold_ln or center_unembed ran), with b_U when ln_final's LayerNorm
    # bias was folded, with b_O when fold_value_biases gave the attention one (b_V without b_O); every
    # other field, norm_weight_offset included, as it was.
    new_b_U = model.cfg.normalization == "LN" and "fold_ln" in steps
    new_b_O = model.cfg.qkv_bias and "fold_value_biases" in steps
    assert processed.cfg == model.cfg.replace(tied_unembed=False, unembed_bias=model.cfg.unembed_bias or new_b_U,
                                              attn_out_bias=model.cfg.attn_out_bias or new_b_O)
    assert processed.cfg == config_for(processed.state_dict(), model.cfg)
    assert_invariant(model, processed, steps)


# -- the folds themselves, by hand -----------------------------------------------------------------
def test_grouped_query_folds_per_kv_head_and_sums_each_query_heads_value_bias():
    model = model_for("grouped_query")  # 4 query heads, 2 kv heads: query head h reads kv head h // 2
    old = model.state_dict()
    folded = fold_ln(old, model.cfg)
    w, b = old["blocks.0.ln1.w"], old["blocks.0.ln1.b"]
    assert folded["blocks.0.attn.W_K"].shape == old["blocks.0.attn.W_K"].shape == (2, 22, 5)
    for g in range(2):
        for key in ("K", "V"):
            W = old[f"blocks.0.attn.W_{key}"][g]
            # measured 0 (exact here), bound 1e-15
            torch.testing.assert_close(folded[f"blocks.0.attn.W_{key}"][g], w[:, None] * W, atol=1e-15, rtol=0)
            # measured 0 (the same products; values up to 0.71), bound 1e-15
            torch.testing.assert_close(folded[f"blocks.0.attn.b_{key}"][g], old[f"blocks.0.attn.b_{key}"][g] + b @ W,
                                       atol=1e-15, rtol=0)
    out = fold_value_biases(old, model.cfg)
    expected = old["blocks.0.attn.b_O"].clone()
    for h in range(4):
        expected += old["blocks.0.attn.b_V"][h // 2] @ old["blocks.0.attn.W_O"][h]
    # measured 1.1e-16 (values up to 0.95), bound 1.5e-15: 14x
    torch.testing.assert_close(out["blocks.0.attn.b_O"], expected, atol=1.5e-15, rtol=0)
    assert not out["blocks.0.attn.b_V"].any()


@pytest.mark.parametrize("offset", [1.0, 0.5])
def test_norm_weight_offset_folds_offset_plus_w_and_keeps_the_config(offset):
    cfg = config("norm_weight_offset").replace(norm_weight_offset=offset)
    model = perturbed(cfg, seed=7)
    old = model.state_dict()
    processed = process(model, fold_ln=True)
    new = processed.state_dict()
    # The folded norms' effective weight offset + w is 1: Gemma's w = 0, exactly.
    for key in ("blocks.0.ln1.w", "blocks.0.ln2.w", "ln_final.w"):
        assert torch.equal(new[key], torch.full_like(old[key], 1 - offset)), key
    assert processed.cfg == cfg.replace(tied_unembed=False) and processed.cfg.norm_weight_offset == offset
    w = offset + old["blocks.0.ln1.w"]
    # measured 0 (exact here), bound 1e-15
    torch.testing.assert_close(new["blocks.0.attn.W_Q"], old["blocks.0.attn.W_Q"] * w[None, :, None],
                               atol=1e-15, rtol=0)
    w2 = offset + old["blocks.0.ln2.w"]
    torch.testing.assert_close(new["blocks.0.mlp.W_gate"], old["blocks.0.mlp.W_gate"] * w2[:, None], atol=1e-15, rtol=0)
    assert_invariant(model, processed, dict(fold_ln=True))
    twice = fold_ln(new, processed.cfg)  # idempotent: the effective weight is 1 already
    for key, value in new.items():
        # measured 0 (values up to 2.1), bound 1e-15
        torch.testing.assert_close(twice[key], value, atol=1e-15, rtol=0, msg=lambda m: f"{key}: {m}")


def test_sandwich_folds_the_input_norms_and_keeps_the_post_norms():
    model = model_for("sandwich_rms_offset")
    old, new = model.state_dict(), process(model, fold_ln=True).state_dict()
    for key in ("blocks.0.ln1_post.w", "blocks.0.ln2_post.w"):
        assert torch.equal(new[key], old[key]), f"{key} reads a sublayer's output: nothing to fold it into"
    # measured 0 (exact here), bound 1e-15
    w2 = 1 + old["blocks.0.ln2.w"]
    torch.testing.assert_close(new["blocks.0.mlp.W_in"], old["blocks.0.mlp.W_in"] * w2[:, None], atol=1e-15, rtol=0)


@pytest.mark.parametrize("option", ["output_norms_rms", "output_norms_ln"])
def test_output_norms_fold_only_ln_final(option):
    model = model_for(option)
    old, new = model.state_dict(), process(model, fold_ln=True).state_dict()
    for key, value in old.items():
        if key.startswith("blocks."):
            assert torch.equal(new[key], value), f"{key}: only ln_final reads the residual stream"
    w = old["ln_final.w"]
    # measured 0 (exact here), bound 1e-15
    torch.testing.assert_close(new["unembed.W_U_T"], old["embed.W_E"] * w, atol=1e-15, rtol=0)


def test_parallel_ln2_folds_ln1_into_the_attention_and_ln2_into_the_mlp():
    model = model_for("parallel_ln2")
    old, new = model.state_dict(), process(model, fold_ln=True).state_dict()
    w1, b1, w2, b2 = (old[f"blocks.0.ln{i}.{p}"] for i in (1, 2) for p in ("w", "b"))
    # measured 0 (exact here), bound 1e-15
    torch.testing.assert_close(new["blocks.0.attn.W_V"], old["blocks.0.attn.W_V"] * w1[None, :, None],
                               atol=1e-15, rtol=0)
    torch.testing.assert_close(new["blocks.0.mlp.W_in"], old["blocks.0.mlp.W_in"] * w2[:, None], atol=1e-15, rtol=0)
    b_Q = old["blocks.0.attn.b_Q"] + torch.einsum("d,hde->he", b1, old["blocks.0.attn.W_Q"])
    # measured 0 (the same products), bound 1e-15
    torch.testing.assert_close(new["blocks.0.attn.b_Q"], b_Q, atol=1e-15, rtol=0)
    # measured 0 (the same products; values up to 1.6), bound 1e-15
    torch.testing.assert_close(new["blocks.0.mlp.b_in"], old["blocks.0.mlp.b_in"] + b2 @ old["blocks.0.mlp.W_in"],
                               atol=1e-15, rtol=0)


@pytest.mark.parametrize("part,option", [("attn", "qkv_bias"), ("mlp", "mlp_bias")])
def test_a_layernorm_bias_without_reader_biases_is_refused_untouched(part, option):
    model = perturbed(Config(**SIZES, **{option: False}), seed=5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=rf"fold_ln cannot fold blocks.0.ln[12].b into blocks.0.{part}.W_\w+: the "
                                         rf"model has no blocks.0.{part}.b_\w+ \(Config.{option}=False"):
        process(model, fold_ln=True)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
