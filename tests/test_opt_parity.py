"""Parity with transformers.OPTForCausalLM: positions offset by 2, separate q/k/v projections, the
ReLU MLP, pre- and post-LN, enable_bias, norms without weights, tied and untied unembeddings, padding.

The oracle is Hugging Face's OPT on seeded random weights (every norm weight and bias perturbed).
Float64: transformers' eager OPT attention takes its softmax in float32 whatever the dtype, so
against it our float64 agrees to float32's rounding; ``float64_transformers`` runs transformers' own
code with that softmax in float64, and against it the gap collapses.

Errors measured (this machine, 3 x 13 tokens, logits up to ~6): beside each bound.
"""

import copy
import json

import pytest
import torch

from conftest import perturb_vectors
from glassbox.models import HookedTransformer
from glassbox.weights.opt import config_from_opt, config_to_opt, glassbox_to_opt, opt_to_glassbox

SIZES = dict(hidden_size=24, num_hidden_layers=3, num_attention_heads=3, ffn_dim=37, vocab_size=29,
             max_position_embeddings=19)
CONFIGS = {
    "pre_ln": {},
    "post_ln": dict(do_layer_norm_before=False),
    "no_bias": dict(enable_bias=False),
    "no_affine": dict(layer_norm_elementwise_affine=False),
    "untied_gelu": dict(tie_word_embeddings=False, activation_function="gelu"),
}


def make_hf_opt(seed=0, **overrides):
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(seed)
    config = OPTConfig(**{**SIZES, **overrides}, init_std=0.3, attn_implementation="eager", pad_token_id=1,
                       bos_token_id=2, eos_token_id=2)
    model = OPTForCausalLM(config)
    perturb_vectors(model)
    return model.eval()


def build(hf, dtype=torch.float32):
    cfg = config_from_opt(hf.config)
    model = HookedTransformer(cfg, init=False, dtype=dtype)
    model.load_state_dict(opt_to_glassbox(hf.state_dict(), cfg), strict=True)
    return model.eval()


def float64_transformers(hf, monkeypatch):
    """A float64 copy of ``hf`` whose eager attention (transformers' own function) takes its softmax in
    float64 instead of float32; everything else is transformers' code unchanged."""
    from transformers.models.opt import modeling_opt

    original = modeling_opt.eager_attention_forward

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        if query.dtype != torch.float64:
            return original(module, query, key, value, attention_mask, scaling, dropout=dropout, **kwargs)
        scores = query @ key.transpose(-1, -2) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        pattern = scores.softmax(-1)
        return (pattern @ value).transpose(1, 2).contiguous(), pattern

    monkeypatch.setattr(modeling_opt, "eager_attention_forward", attention)
    return copy.deepcopy(hf).double()


@pytest.fixture(scope="module", params=list(CONFIGS))
def hf_opt(request):
    return make_hf_opt(**CONFIGS[request.param])


@pytest.fixture
def tokens():
    return torch.randint(0, SIZES["vocab_size"], (3, 13), generator=torch.Generator().manual_seed(1))


def test_config_maps_to_opt_options():
    cfg = config_from_opt(make_hf_opt().config)
    assert (cfg.positional, cfg.norm_placement, cfg.act_fn, cfg.layer_norm_eps, cfg.tied_unembed) == (
        "learned", "pre", "relu", 1e-5, True)
    assert (cfg.attn_scale, cfg.qkv_bias, cfg.mlp_bias, cfg.unembed_bias, cfg.n_ctx, cfg.d_head) == (
        None, True, True, False, 19, 8)
    post = config_from_opt(make_hf_opt(do_layer_norm_before=False, enable_bias=False).config)
    assert (post.norm_placement, post.qkv_bias, post.attn_out_bias, post.mlp_bias, post.use_bias) == (
        "post", False, False, False, True)


def test_logits_hidden_states_and_patterns_match_opt(hf_opt, tokens):
    model = build(hf_opt)
    acts = {}
    with torch.no_grad():
        out = hf_opt(tokens, output_hidden_states=True, output_attentions=True)
        logits = model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith(("resid_pre", "pattern")),
                                                          lambda x, hook: acts.__setitem__(hook.name, x))])
    assert out.logits.abs().max() > 1.0, "logits too small for the comparison to mean anything"
    # measured 0.0 in every config (hooks on the pattern: the explicit attention path does transformers'
    # float32 operations); the fused kernel's logits are within 2.3e-6 (other tests); bound 2e-5
    torch.testing.assert_close(logits, out.logits, atol=2e-5, rtol=0)
    for L in range(model.cfg.n_layers):
        # measured 0.0 in every config; bound 2e-5
        torch.testing.assert_close(acts[f"blocks.{L}.hook_resid_pre"], out.hidden_states[L], atol=2e-5, rtol=0,
                                   msg=lambda m, L=L: f"resid_pre of layer {L} differs from HF hidden_states[{L}]: {m}")
        # measured 0.0 in every config (probabilities); bound 5e-6
        torch.testing.assert_close(acts[f"blocks.{L}.attn.hook_pattern"], out.attentions[L], atol=5e-6, rtol=0,
                                   msg=lambda m, L=L: f"pattern of layer {L} differs from HF attentions[{L}]: {m}")


def test_float64_collapses_against_float64_transformers(hf_opt, tokens, monkeypatch):
    with torch.no_grad():
        plain = copy.deepcopy(hf_opt).double()(tokens).logits
        wide = float64_transformers(hf_opt, monkeypatch)
        got = build(hf_opt, torch.float64)(tokens)
        expected = wide(tokens).logits
    # measured <= 4.3e-15 over the five configs (logits up to ~7); bound 1e-12
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
    # transformers' own float64 rounds its softmax to float32: measured 4.8e-7 from ours (pre_ln); the gap is real
    assert 1e-9 < (got - plain).abs().max() < 1e-5


def test_padding_left_and_right_matches_opt_at_real_positions(tokens):
    hf = make_hf_opt()
    model = build(hf)
    mask = torch.ones(tokens.shape, dtype=torch.long)
    mask[0, :4] = 0  # left padding
    mask[1, 9:] = 0  # right padding
    with torch.no_grad():
        expected = hf(tokens, attention_mask=mask).logits
        got = model(tokens, attention_mask=mask)
    real = mask.bool()
    # transformers counts positions over real tokens, as glassbox does: measured 2.2e-6; bound 2e-5
    torch.testing.assert_close(got[real], expected[real], atol=2e-5, rtol=0)
    # the oracle is sensitive to the positions: the unpadded row 0 differs from its padded self
    with torch.no_grad():
        assert (hf(tokens).logits[0, 4:] - expected[0, 4:]).abs().max() > 0.1


def test_position_offset_of_two_is_what_parity_proves(tokens):
    hf = make_hf_opt()
    cfg = config_from_opt(hf.config)
    state = opt_to_glassbox(hf.state_dict(), cfg)
    state["pos_embed.W_pos"] = hf.state_dict()["model.decoder.embed_positions.weight"][:-2]  # no offset
    model = HookedTransformer(cfg, init=False)
    model.load_state_dict(state, strict=True)
    with torch.no_grad():
        assert (model.eval()(tokens) - hf(tokens).logits).abs().max() > 0.1


def test_round_trips_are_exact(hf_opt):
    cfg = config_from_opt(hf_opt.config)
    ours = opt_to_glassbox(hf_opt.state_dict(), cfg)
    back = opt_to_glassbox(glassbox_to_opt(ours, cfg), cfg)
    assert set(back) == set(ours)
    for key in ours:
        assert torch.equal(back[key], ours[key]), key
    theirs = hf_opt.state_dict()
    exported = glassbox_to_opt(ours, cfg)
    for key, value in exported.items():
        if key == "model.decoder.embed_positions.weight":  # rows 0 and 1 are read by no real token: zeros
            assert torch.equal(value[2:], theirs[key][2:]) and not value[:2].any()
        elif key in theirs:
            assert torch.equal(value, theirs[key]), key
        else:  # layer_norm_elementwise_affine=False: transformers has no weights, ours are exactly 1 and 0
            assert torch.equal(value, torch.ones_like(value) if key.endswith("weight") else torch.zeros_like(value))


def test_export_to_opt_gives_same_logits(hf_opt, tokens):
    from transformers import OPTForCausalLM

    cfg = config_from_opt(hf_opt.config)
    torch.manual_seed(5)
    model = HookedTransformer(cfg).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.2 * torch.randn_like(param))
    exported = OPTForCausalLM(config_to_opt(cfg)).eval()
    exported.load_state_dict(glassbox_to_opt(model.state_dict(), cfg), strict=True)
    with torch.no_grad():  # measured <= 6.9e-6 over the five configs (logits up to ~6.3); bound 4e-5
        torch.testing.assert_close(exported(tokens).logits, model(tokens), atol=4e-5, rtol=0)


def test_folder_loads_by_model_type_and_post_ln_exports_as_opt(tmp_path, tokens):
    from transformers import OPTForCausalLM

    from glassbox.weights import from_pretrained, save_pretrained

    hf = make_hf_opt(do_layer_norm_before=False)
    hf.save_pretrained(tmp_path / "hf")
    model = from_pretrained(tmp_path / "hf")
    with torch.no_grad():  # measured 1.1e-6; bound 2e-5
        torch.testing.assert_close(model(tokens), hf(tokens).logits, atol=2e-5, rtol=0)
    exported = model.to_hf()  # a post-LN learned-position model is OPT's, not GPT-2's
    assert isinstance(exported, OPTForCausalLM)
    save_pretrained(model, tmp_path / "ours")
    with torch.no_grad():
        torch.testing.assert_close(exported(tokens).logits, hf(tokens).logits, atol=0, rtol=0)
        torch.testing.assert_close(from_pretrained(tmp_path / "ours")(tokens), model(tokens), atol=0, rtol=0)


def test_pre_ln_model_exports_as_gpt2_with_the_same_logits(tokens):
    """Documented footgun: a pre-LN OPT Config is also a GPT-2 one; the export computes the same logits."""
    from transformers import GPT2LMHeadModel

    hf = make_hf_opt()
    model = build(hf)
    exported = model.to_hf()
    assert isinstance(exported, GPT2LMHeadModel)
    with torch.no_grad():  # measured 1.8e-6 (GPT-2 scales the scores, OPT the queries); bound 2e-5
        torch.testing.assert_close(exported(tokens).logits, hf(tokens).logits, atol=2e-5, rtol=0)


@pytest.mark.parametrize("field, value, message", [
    ("word_embed_proj_dim", 12, r"word_embed_proj_dim=12 differs from hidden_size=24: the project_in/project_out"),
    ("_remove_final_layer_norm", True, r"_remove_final_layer_norm=True with do_layer_norm_before=True"),
    ("activation_function", "rleu", r"activation_function 'rleu' is not supported.*did you mean .relu."),
    ("activation_function", "prelu", r"activation_function 'prelu' is not supported"),
    ("layer_types", ["full_attention", "sliding_attention", "full_attention"], r"layer_types=.*does not read layer_types"),
])
def test_refused_config_fields_name_the_field(field, value, message, tmp_path):
    from transformers import OPTConfig

    from glassbox.weights import from_pretrained

    config = OPTConfig(**SIZES)
    setattr(config, field, value)
    with pytest.raises(ValueError, match=message):
        config_from_opt(config)
    hf = make_hf_opt()
    hf.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data[field] = value
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="config.json"):
        from_pretrained(tmp_path)


@pytest.mark.parametrize("field, value", [("do_layer_norm_before", "yes"), ("ffn_dim", 0), ("enable_bias", 1),
                                          ("word_embed_proj_dim", 2.5)])
def test_mistyped_config_json_fields_are_named(field, value, tmp_path):
    from glassbox.weights import from_pretrained

    make_hf_opt().save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data[field] = value
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"field '{field}' must be"):
        from_pretrained(tmp_path)


def test_damaged_state_dicts_name_the_tensor():
    hf = make_hf_opt()
    cfg = config_from_opt(hf.config)
    state = dict(hf.state_dict())
    short = {**state, "model.decoder.embed_positions.weight": state["model.decoder.embed_positions.weight"][2:]}
    with pytest.raises(ValueError, match=r"embed_positions\.weight has shape \(19, 24\), expected \(21, 24\)"):
        opt_to_glassbox(short, cfg)
    missing = {k: v for k, v in state.items() if k != "model.decoder.layers.2.fc2.bias"}
    with pytest.raises(ValueError, match=r"missing 1 tensor.*layers\.2\.fc2\.bias"):
        opt_to_glassbox(missing, cfg)
    extra = {**state, "model.decoder.project_in.weight": torch.zeros(24, 12)}
    with pytest.raises(ValueError, match=r"does not describe.*project_in"):
        opt_to_glassbox(extra, cfg)


@pytest.mark.parametrize("change, named", [
    (dict(layer_norm_eps=1e-6), "'layer_norm_eps': 1e-06"),
    (dict(qkv_bias=False), "'qkv_bias, attn_out_bias, mlp_bias': (False, True, True)"),
    (dict(positional="rotary"), "'positional': 'rotary'"),
    (dict(attn_scale=1.0), "'attn_scale': 1.0"),
    (dict(norm_placement="sandwich", normalization="RMS"), "'norm_placement': 'sandwich'"),
])
def test_export_refuses_what_opt_cannot_represent(change, named):
    cfg = config_from_opt(make_hf_opt().config).replace(**change)
    with pytest.raises(ValueError, match="not an OPT-architecture config") as err:
        config_to_opt(cfg)
    assert named in str(err.value)
