"""Parity with transformers' Gemma (1), Gemma 2 and Gemma 3 (text) causal LMs.

The oracles are transformers' own classes on seeded random weights: every norm weight perturbed
away from 0 (Gemma multiplies by 1 + w, so 0 is the identity), init wide enough that attention is
far from uniform, soft caps small enough to bend the scores and logits, and a sliding window (4)
shorter than the sequences, so local layers see fewer keys than global ones. Sizes are distinct and
head_dim differs from d_model / n_heads; Gemma 1 has multi-query attention, Gemma 2 and 3
grouped-query attention.

Float64: transformers' Gemma computes the norms, the rotary angles and the softmax in float32 even
in a float64 model (and rounds sqrt(d_model) to float32 when a float32 model is cast), so against it
as is, agreement stops at float32's rounding. ``float64_transformers`` widens exactly those islands
(the rest is transformers' code) and the agreement is then ~1e-15.
"""

import copy

import pytest
import torch

from conftest import assert_round_trips, perturb_vectors
from glassbox.models import HookedTransformer
from glassbox.weights.gemma import (config_from_gemma, config_to_gemma, gemma_to_glassbox, glassbox_to_gemma)

WINDOW = 4
SIZES = {
    "gemma": dict(hidden_size=21, num_attention_heads=3, num_key_value_heads=1, head_dim=8, intermediate_size=37,
                  vocab_size=29, num_hidden_layers=2, max_position_embeddings=31),
    "gemma2": dict(hidden_size=30, num_attention_heads=6, num_key_value_heads=2, head_dim=10, intermediate_size=41,
                   vocab_size=31, num_hidden_layers=3, max_position_embeddings=31),
    "gemma3_text": dict(hidden_size=24, num_attention_heads=4, num_key_value_heads=2, head_dim=6,
                        intermediate_size=43, vocab_size=37, num_hidden_layers=3, max_position_embeddings=31),
}
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]


def _make(model_type, seed, overrides):
    import transformers

    config_class, model_class = {"gemma": ("GemmaConfig", "GemmaForCausalLM"),
                                 "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
                                 "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM")}[model_type]
    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(**{**SIZES[model_type], **overrides})
    model = getattr(transformers, model_class)(config)
    perturb_vectors(model)
    return model.eval()


COMMON = dict(initializer_range=0.3, rms_norm_eps=1e-6, attn_implementation="eager", pad_token_id=0, eos_token_id=1,
              bos_token_id=2)


def make_hf_gemma(seed=0, **config_overrides):
    """A transformers GemmaForCausalLM (eager) with seeded random, perturbed weights."""
    return _make("gemma", seed, {**COMMON, "rope_parameters": {"rope_type": "default", "rope_theta": 100.0},
                                 **config_overrides})


def make_hf_gemma2(seed=0, **config_overrides):
    """A transformers Gemma2ForCausalLM (eager): sliding, full, sliding layers, both soft caps binding."""
    return _make("gemma2", seed, {
        **COMMON, "rope_parameters": {"rope_type": "default", "rope_theta": 300.0}, "query_pre_attn_scalar": 13,
        "sliding_window": WINDOW, "layer_types": LAYER_TYPES, "attn_logit_softcapping": 4.0,
        "final_logit_softcapping": 3.0, **config_overrides})


def make_hf_gemma3_text(seed=0, **config_overrides):
    """A transformers Gemma3ForCausalLM (eager): q/k norms, local and global rope bases, a final soft cap."""
    return _make("gemma3_text", seed, {
        **COMMON, "query_pre_attn_scalar": 11, "sliding_window": WINDOW, "layer_types": LAYER_TYPES,
        "final_logit_softcapping": 3.0,
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000.0},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 20.0}}, **config_overrides})


MAKERS = {"gemma": make_hf_gemma, "gemma2": make_hf_gemma2, "gemma3_text": make_hf_gemma3_text}
# Each mapped option in some config: the defaults above, then biases, untied embeddings, other activations.
VARIANTS = [
    ("gemma", {}), ("gemma", dict(attention_bias=True, tie_word_embeddings=False)),
    ("gemma2", {}), ("gemma2", dict(attention_bias=True, hidden_activation="gelu", attn_logit_softcapping=None,
                                    final_logit_softcapping=None, tie_word_embeddings=False)),
    ("gemma3_text", {}), ("gemma3_text", dict(attention_bias=True, tie_word_embeddings=False,
                                              final_logit_softcapping=None, hidden_activation="silu")),
]


def ours(hf, dtype=torch.float32):
    cfg = config_from_gemma(hf.config)
    model = HookedTransformer(cfg, init=False)
    model.load_state_dict(gemma_to_glassbox(hf.state_dict(), cfg), strict=True)
    return model.to(dtype).eval()


def tokens_for(model_type, batch=3, pos=13, seed=1):
    return torch.randint(0, SIZES[model_type]["vocab_size"], (batch, pos), generator=torch.Generator().manual_seed(seed))


def test_config_maps_every_option(hf_models):
    import transformers

    g1 = config_from_gemma(hf_models["gemma"].config)
    assert (g1.normalization, g1.norm_placement, g1.norm_weight_offset, g1.scale_embed, g1.gated_mlp, g1.act_fn) == (
        "RMS", "pre", 1.0, True, True, "gelu_new")
    assert (g1.d_head, g1.n_key_value_heads, g1.rotary_dim, g1.rotary_base, g1.attn_scale, g1.attn_types) == (
        8, 1, 8, 100.0, None, None)
    assert (g1.tied_unembed, g1.qkv_bias, g1.attn_out_bias, g1.mlp_bias) == (True, False, False, False)
    g2 = config_from_gemma(hf_models["gemma2"].config)
    assert (g2.norm_placement, g2.qk_norm, g2.attn_scale, g2.attn_scores_soft_cap, g2.output_logits_soft_cap) == (
        "sandwich", None, 13 ** -0.5, 4.0, 3.0)
    assert (g2.attn_types, g2.window_size, g2.rotary_base, g2.rotary_base_local, g2.n_key_value_heads) == (
        ("local", "global", "local"), WINDOW, 300.0, None, 2)
    g3 = config_from_gemma(hf_models["gemma3_text"].config)
    assert (g3.norm_placement, g3.qk_norm, g3.attn_scale, g3.attn_scores_soft_cap, g3.output_logits_soft_cap) == (
        "sandwich", "head", 11 ** -0.5, None, 3.0)
    assert (g3.rotary_base, g3.rotary_base_local, g3.rope_scaling, g3.window_size) == (1000.0, 20.0, None, WINDOW)
    biased = config_from_gemma(transformers.Gemma3TextConfig(**SIZES["gemma3_text"], attention_bias=True,
                                                             tie_word_embeddings=False))
    assert (biased.qkv_bias, biased.attn_out_bias, biased.mlp_bias, biased.tied_unembed) == (True, True, False, False)
    assert config_from_gemma(transformers.Gemma2Config(**SIZES["gemma2"], hidden_activation="gelu")).act_fn == "gelu"
    # transformers reads Gemma 1's legacy hidden_act "gelu" as the tanh GELU, and so does glassbox
    assert config_from_gemma(transformers.GemmaConfig(**SIZES["gemma"], hidden_act="gelu")).act_fn == "gelu_new"


@pytest.mark.parametrize("model_type, overrides", VARIANTS)
def test_logits_and_every_residual_stream_match_in_float32(model_type, overrides):
    hf = MAKERS[model_type](**overrides)
    model, tokens = ours(hf), tokens_for(model_type)
    with torch.no_grad():
        out = hf(tokens, output_hidden_states=True, output_attentions=True)
        logits, cache = model.run_with_cache(tokens)
    assert out.logits.abs().max() > 1.0, "logits too small for the comparison to mean anything"
    assert max(a.max() for a in out.attentions) > 0.6, "attention too uniform to test positions and masks"
    # measured <= 3.2e-6 over the variants (logits up to 6.1); bound 4e-5, 12x
    torch.testing.assert_close(logits, out.logits, atol=4e-5, rtol=0)
    cfg = model.cfg
    if cfg.output_logits_soft_cap is not None:  # the cap bends the logits: tanh far from linear
        assert cache["unembed.hook_pre_cap"].abs().max() > 1.5 * cfg.output_logits_soft_cap
    if cfg.attn_scores_soft_cap is not None:
        scores = cache["blocks.0.attn.hook_attn_scores"]
        assert scores[scores.isfinite()].abs().max() > 0.6 * cfg.attn_scores_soft_cap
    assert len(out.hidden_states) == model.cfg.n_layers + 1  # the last is after the final norm
    for L in range(model.cfg.n_layers):
        # measured <= 4.8e-6 (residual stream up to 12.9); bound 5e-5, 10x
        torch.testing.assert_close(cache[f"blocks.{L}.hook_resid_pre"], out.hidden_states[L], atol=5e-5, rtol=0,
                                   msg=lambda m, L=L: f"resid_pre of layer {L} differs from hidden_states[{L}]: {m}")
        # measured <= 8.0e-7 (probabilities); bound 8e-6, 10x
        torch.testing.assert_close(cache[f"blocks.{L}.attn.hook_pattern"], out.attentions[L], atol=8e-6, rtol=0,
                                   msg=lambda m, L=L: f"pattern of layer {L} differs from attentions[{L}]: {m}")
    # measured <= 2.6e-6 (values up to 4.5); bound 3e-5, 11x
    torch.testing.assert_close(cache["ln_final.hook_out"], out.hidden_states[-1], atol=3e-5, rtol=0)


@pytest.fixture(scope="module")
def hf_models():
    return {model_type: make() for model_type, make in MAKERS.items()}


def float64_transformers(hf, monkeypatch):
    """``hf`` in float64 with its float32 islands (norms, rotary angles, softmax, sqrt(d_model)) in float64;
    the patched functions run transformers' own code for any other dtype."""
    from transformers.models.gemma import modeling_gemma
    from transformers.models.gemma2 import modeling_gemma2
    from transformers.models.gemma3 import modeling_gemma3

    def norm(original):
        def forward(self, x):
            if x.dtype != torch.float64:
                return original(self, x)
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)
        return forward

    def rotary(original):
        def forward(self, x, position_ids, *layer_type):
            if x.dtype != torch.float64:
                return original(self, x, position_ids, *layer_type)
            params = self.config.rope_parameters[layer_type[0]] if layer_type else self.config.rope_parameters
            dim = self.config.head_dim
            angles = position_ids[..., None].double() * params["rope_theta"] ** (
                -torch.arange(0, dim, 2, dtype=torch.float64) / dim)
            angles = torch.cat((angles, angles), dim=-1)
            return angles.cos(), angles.sin()
        return forward

    def eager(original):
        def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kwargs):
            if query.dtype != torch.float64:
                return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                softcap=softcap, **kwargs)
            groups = module.num_key_value_groups
            key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
            scores = query @ key.transpose(2, 3) * scaling
            if softcap is not None:
                scores = torch.tanh(scores / softcap) * softcap
            if attention_mask is not None:
                scores = scores + attention_mask
            pattern = scores.softmax(-1)
            return (pattern @ value).transpose(1, 2).contiguous(), pattern
        return attention

    for module, prefix in ((modeling_gemma, "Gemma"), (modeling_gemma2, "Gemma2"), (modeling_gemma3, "Gemma3")):
        for name, widen in (("RMSNorm", norm), ("RotaryEmbedding", rotary)):
            cls = getattr(module, prefix + name)
            if "float64_transformers" not in cls.forward.__qualname__:
                monkeypatch.setattr(cls, "forward", widen(cls.forward))
        if "float64_transformers" not in module.eager_attention_forward.__qualname__:
            monkeypatch.setattr(module, "eager_attention_forward", eager(module.eager_attention_forward))
    wide = copy.deepcopy(hf).to(torch.float64)
    wide.model.embed_tokens.embed_scale.fill_(hf.config.hidden_size ** 0.5)
    return wide


@pytest.mark.parametrize("model_type", list(MAKERS))
def test_float64_matches_transformers(model_type, hf_models, monkeypatch):
    hf, tokens = hf_models[model_type], tokens_for(model_type)
    model = ours(hf, torch.float64)
    with torch.no_grad():
        got = model(tokens)
        as_is = copy.deepcopy(hf).to(torch.float64)(tokens).logits
        # transformers' own float64 keeps float32 norms, rotary and softmax:
        # measured <= 1.8e-6 (logits up to 6.1); bound 2e-5, 11x
        torch.testing.assert_close(got, as_is, atol=2e-5, rtol=0)
        wide = float64_transformers(hf, monkeypatch)(tokens).logits
    # measured <= 6.7e-15 (logits up to 6.1); bound 1e-13, 15x
    torch.testing.assert_close(got, wide, atol=1e-13, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("model_type", list(MAKERS))
def test_half_precision_error_no_worse_than_transformers(model_type, dtype, hf_models, monkeypatch):
    """Mean |error| of all logits against the float64 reference, ours vs transformers' own in ``dtype``."""
    hf = hf_models[model_type]
    tokens = tokens_for(model_type, batch=4, pos=29, seed=2)  # enough logits for a stable mean
    with torch.no_grad():
        reference = float64_transformers(hf, monkeypatch)(tokens).logits
        theirs = (copy.deepcopy(hf).to(dtype)(tokens).logits.double() - reference).abs().mean()
        mine = (ours(hf, dtype)(tokens).double() - reference).abs().mean()
    # measured ours / transformers' mean error: bfloat16 0.93 (gemma), 0.96 (gemma2), 1.03 (gemma3_text);
    # float16 0.92, 0.98, 1.00 (mean errors 1e-2 in bfloat16, 1.3e-3..1.9e-3 in float16); bound 1.2, the
    # issue's criterion
    assert mine <= 1.2 * theirs, f"{model_type} {dtype}: our mean error {mine:.3g} vs transformers' {theirs:.3g}"
    assert mine > 0.5 * theirs  # a 'reference' equal to ours would make the test empty


def left_padded(prompts, pad=0):
    width = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), width), pad)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        tokens[i, width - len(p):], mask[i, width - len(p):] = p, 1
    return tokens, mask


@pytest.mark.parametrize("model_type", list(MAKERS))
def test_greedy_generation_matches_transformers_generate(model_type):
    """Prompts longer than the window, left-padded together: ours equals hf.generate token for token.
    Untied: a tied random model mostly repeats its last token, which would prove little."""
    hf = MAKERS[model_type](seed=3, tie_word_embeddings=False)
    model = ours(hf)
    vocab = SIZES[model_type]["vocab_size"]
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, vocab, (n,), generator=gen) for n in (9, 6, 11)]
    tokens, mask = left_padded(prompts)
    new = 8
    with torch.no_grad():
        expected = hf.generate(tokens, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0,
                               eos_token_id=None)[:, tokens.shape[1]:]
    got = model.generate(tokens, new, attention_mask=mask.bool(), eos_token_id=None)[:, tokens.shape[1]:]
    assert torch.equal(got, expected)
    assert len(set(expected.flatten().tolist())) > 8  # varied text, not one repeated token
    alone = prompts[1]  # the most padded row continues the same way alone
    assert torch.equal(model.generate(alone[None], new, eos_token_id=None)[0, len(alone):], expected[1])


@pytest.mark.parametrize("model_type", list(MAKERS))
def test_left_padding_equals_each_prompt_alone(model_type, hf_models):
    model = ours(hf_models[model_type])
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, SIZES[model_type]["vocab_size"], (n,), generator=gen) for n in (13, 7)]
    tokens, mask = left_padded(prompts)
    with torch.no_grad():
        padded = model(tokens, attention_mask=mask.bool())
        for i, p in enumerate(prompts):
            # measured <= 2.3e-6 (logits up to 4.6); bound 3e-5, 13x
            torch.testing.assert_close(padded[i, tokens.shape[1] - len(p):], model(p[None])[0], atol=3e-5, rtol=0)


@pytest.mark.parametrize("model_type", ["gemma2", "gemma3_text"])
def test_sliding_window_layers_matter(model_type, hf_models):
    """At 13 positions with a window of 4 the local layers change the logits: with every layer global,
    or with Gemma 3's local rope base replaced by the global one, parity would fail by far."""
    hf, tokens = hf_models[model_type], tokens_for(model_type)
    cfg = config_from_gemma(hf.config)
    state = gemma_to_glassbox(hf.state_dict(), cfg)
    changes = [dict(attn_types=None, window_size=None)]
    if model_type == "gemma3_text":
        changes.append(dict(rotary_base_local=cfg.rotary_base))
    with torch.no_grad():
        expected = hf(tokens).logits
        for change in changes:
            wrong = HookedTransformer(cfg.replace(**change), init=False)
            wrong.load_state_dict(state, strict=True)
            # measured 3.2 (gemma2) and 4.2 (gemma3_text) all global, 0.55 with one rope base; parity bound 4e-5
            assert (wrong.eval()(tokens) - expected).abs().max() > 1e-2, change


@pytest.mark.parametrize("model_type, overrides", [("gemma", {}), ("gemma", dict(tie_word_embeddings=False)),
                                                   ("gemma2", {}), ("gemma3_text", dict(attention_bias=True))])
def test_from_hf_to_hf_and_folders_round_trip(model_type, overrides, tmp_path):
    """from_hf, to_hf, save_pretrained and from_pretrained dispatch on the architecture; transformers
    loads the folder with no missing or unexpected keys and computes the same logits."""
    import transformers

    hf = MAKERS[model_type](seed=6, **overrides)
    hf_class = type(hf)
    tokens = tokens_for(model_type)
    model = assert_round_trips(hf, hf_class, tokens, tmp_path)
    assert type(model.to_hf().config) is type(hf.config)
    reloaded, info = hf_class.from_pretrained(tmp_path, attn_implementation="eager", output_loading_info=True)
    assert (set(info["missing_keys"]), set(info["unexpected_keys"])) == (set(), set())
    assert isinstance(transformers.AutoConfig.from_pretrained(tmp_path), type(hf.config))
    with torch.no_grad():
        torch.testing.assert_close(reloaded.eval()(tokens).logits, hf(tokens).logits, atol=0, rtol=0)


@pytest.mark.parametrize("model_type", list(MAKERS))
def test_round_trip_ours_theirs_ours_is_exact(model_type, hf_models):
    hf = hf_models[model_type]
    cfg = config_from_gemma(hf.config)
    ours_sd = gemma_to_glassbox(hf.state_dict(), cfg)
    theirs = glassbox_to_gemma(ours_sd, cfg)
    assert set(theirs) == set(hf.state_dict())
    assert config_from_gemma(config_to_gemma(cfg, model_type)) == cfg.replace(model_name=model_type)
    back = gemma_to_glassbox(theirs, cfg)
    assert set(back) == set(ours_sd) and all(torch.equal(back[k], ours_sd[k]) for k in ours_sd)


def test_refusals_name_the_option(hf_models):
    import transformers

    with pytest.raises(ValueError, match="gemma2 use_bidirectional_attention=True"):
        config_from_gemma(transformers.Gemma2Config(**SIZES["gemma2"], use_bidirectional_attention=True))
    with pytest.raises(ValueError, match="gemma3_text attn_logit_softcapping=50.0 is not supported"):
        config_from_gemma(transformers.Gemma3TextConfig(**SIZES["gemma3_text"], attn_logit_softcapping=50.0))
    scaled_local = {"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                    "sliding_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}
    with pytest.raises(ValueError, match="rope scaling on the sliding_attention layers"):
        config_from_gemma(transformers.Gemma3TextConfig(**SIZES["gemma3_text"], rope_parameters=scaled_local))
    with pytest.raises(ValueError, match="hidden_activation='prelu' is not an activation glassbox computes"):
        config_from_gemma(transformers.Gemma2Config(**SIZES["gemma2"], hidden_activation="prelu"))
    with pytest.raises(ValueError, match="expected a Gemma config"):
        config_from_gemma(transformers.LlamaConfig(hidden_size=16, num_attention_heads=2))
    cfg = config_from_gemma(hf_models["gemma2"].config)
    with pytest.raises(ValueError, match=r"not a gemma-architecture config: \{'norm_placement': 'sandwich'"):
        config_to_gemma(cfg, "gemma")
    with pytest.raises(ValueError, match=r"not a gemma3_text-architecture config: .*'qk_norm': None"):
        config_to_gemma(cfg, "gemma3_text")
    with pytest.raises(ValueError, match=r"'norm_weight_offset': 0.0"):
        config_to_gemma(cfg.replace(norm_weight_offset=0.0), "gemma2")
    with pytest.raises(ValueError, match=r"'attn_scale': '0.3 \(not query_pre_attn_scalar"):
        config_to_gemma(cfg.replace(attn_scale=0.3), "gemma2")
    with pytest.raises(ValueError, match=r"'d_model': \"22 \(transformers' gemma2 needs a multiple of n_heads=6\)"):
        config_to_gemma(cfg.replace(d_model=22), "gemma2")
    sd = dict(hf_models["gemma2"].state_dict())
    sd["model.layers.2.post_feedforward_layernorm.weight"] = sd["model.layers.2.post_feedforward_layernorm.weight"][:-1]
    with pytest.raises(ValueError, match=r"model\.layers\.2\.post_feedforward_layernorm\.weight has shape \(29,\)"):
        gemma_to_glassbox(sd, cfg)


@pytest.mark.parametrize("model_type", ["gemma2", "gemma3_text"])
def test_linear_rope_scaling(model_type):
    """Linear rope scaling (factor 8 in Gemma 3 4B-27B): Gemma 3 scales its global layers only, the local
    ones keep their own base unscaled; Gemma 2 scales every layer. Export writes it back."""
    scaling = {"rope_type": "linear", "factor": 4.0}
    if model_type == "gemma3_text":
        rope = {"full_attention": {"rope_theta": 1000.0, **scaling},
                "sliding_attention": {"rope_type": "default", "rope_theta": 20.0}}
    else:
        rope = {"rope_theta": 300.0, **scaling}
    hf = MAKERS[model_type](rope_parameters=rope)
    model, tokens = ours(hf), tokens_for(model_type)
    assert model.cfg.rope_scaling == {"rope_type": "linear", "factor": 4.0}
    assert config_from_gemma(config_to_gemma(model.cfg, model_type)) == model.cfg.replace(model_name=model_type)
    with torch.no_grad():
        expected = hf(tokens).logits
        # measured 2.4e-6 (gemma2), 1.4e-6 (gemma3_text), logits up to 3; bound 3e-5, 12x
        torch.testing.assert_close(model(tokens), expected, atol=3e-5, rtol=0)
        unscaled = HookedTransformer(model.cfg.replace(rope_scaling=None), init=False)
        unscaled.load_state_dict(model.state_dict(), strict=True)
        assert (unscaled.eval()(tokens) - expected).abs().max() > 1e-2  # the scaling is exercised


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_embedding_scale_rounds_as_transformers_at_released_widths(dtype):
    """sqrt(d_model) rounded to the model's dtype, bit for bit as transformers' scaled embedding (a
    float32 buffer cast to the dtype) at every released Gemma width."""
    from transformers.models.gemma2.modeling_gemma2 import Gemma2TextScaledWordEmbedding

    from glassbox.models import Config
    from glassbox.models.embed import Embed

    for width in (640, 1152, 2048, 2304, 2560, 3072, 3584, 3840, 4608, 5376):
        cfg = Config(d_model=width, n_layers=1, n_heads=1, d_vocab=1, n_ctx=1, scale_embed=True)
        embed = Embed(cfg).to(dtype)
        theirs = Gemma2TextScaledWordEmbedding(1, width, None, embed_scale=width ** 0.5).to(dtype)
        with torch.no_grad():
            embed.W_E.fill_(1.0)
            theirs.weight.fill_(1.0)
            token = torch.zeros(1, 1, dtype=torch.long)
            assert torch.equal(embed(token), theirs(token)), width


@pytest.mark.parametrize("model_type", list(MAKERS))
def test_weight_processing_is_invariant_or_refused(model_type, hf_models):
    """fold_ln folds (1 + w) into the readers (every norm of a sandwich block that feeds a linear map)
    and keeps the logits; centring the writers (RMSNorm removes no mean) and centring the unembedding
    under a logit soft cap are refused by name."""
    from glassbox.weights.processing import process

    hf, tokens = hf_models[model_type], tokens_for(model_type)
    with torch.no_grad():
        expected = ours(hf, torch.float64)(tokens)
        # measured <= 4.6e-15 (logits up to 6.1); bound 5e-14, 11x
        torch.testing.assert_close(process(ours(hf, torch.float64), fold_ln=True)(tokens), expected, atol=5e-14, rtol=0)
        with pytest.raises(ValueError, match="center_writing_weights relies on LayerNorm removing the mean"):
            process(ours(hf, torch.float64), fold_ln=True, center_writing_weights=True)
        if model_type == "gemma":  # no soft cap: the log-probabilities are unchanged
            centred = process(ours(hf, torch.float64), center_unembed=True)(tokens)
            # measured 2.7e-15 (log-probabilities down to -10.2); bound 3e-14, 11x
            torch.testing.assert_close(centred.log_softmax(-1), expected.log_softmax(-1), atol=3e-14, rtol=0)
        else:
            with pytest.raises(ValueError, match="center_unembed is not exact with output_logits_soft_cap=3.0"):
                process(ours(hf, torch.float64), center_unembed=True)


def test_gemma3_image_text_checkpoint_loads_its_text_model(tmp_path):
    """Gemma 3 4B-27B are Gemma3ForConditionalGeneration: glassbox builds the text model (the vision
    tower is left out), from memory, from a transformers folder and from the hub files' older key names;
    its export is a Gemma3ForCausalLM."""
    import transformers

    from glassbox.weights import from_pretrained
    from glassbox.weights.gemma import gemma3_multimodal_to_glassbox

    torch.manual_seed(7)
    text = {**SIZES["gemma3_text"], "layer_types": LAYER_TYPES, "sliding_window": WINDOW, "query_pre_attn_scalar": 11,
            "initializer_range": 0.3, "rope_parameters": {"full_attention": {"rope_type": "linear", "rope_theta": 1000.0, "factor": 4.0},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 20.0}}}
    vision = dict(hidden_size=16, intermediate_size=20, num_hidden_layers=1, num_attention_heads=2, image_size=8,
                  patch_size=4)
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                       image_token_index=36, boi_token_index=34, eoi_token_index=35,
                                       initializer_range=0.3)
    config._attn_implementation = "eager"
    hf = transformers.Gemma3ForConditionalGeneration(config)
    perturb_vectors(hf)
    hf.eval().save_pretrained(tmp_path)
    tokens = torch.randint(0, 34, (2, 13), generator=torch.Generator().manual_seed(8))  # text tokens only
    model = HookedTransformer.from_hf(hf)
    with torch.no_grad():
        expected = hf(tokens).logits
        assert expected.abs().max() > 1.0
        # measured 2.9e-6 (logits up to 7.3); bound 3e-5, 10x
        torch.testing.assert_close(model(tokens), expected, atol=3e-5, rtol=0)
        torch.testing.assert_close(from_pretrained(tmp_path)(tokens), model(tokens), atol=0, rtol=0)
        assert isinstance(model.to_hf(), transformers.Gemma3ForCausalLM)
    hub_names = {k.replace("model.language_model.", "language_model.model.").replace("model.vision_tower.", "vision_tower.")
                 .replace("model.multi_modal_projector.", "multi_modal_projector."): v for k, v in hf.state_dict().items()}
    assert "language_model.model.embed_tokens.weight" in hub_names and "vision_tower." in "".join(hub_names)
    again = gemma3_multimodal_to_glassbox(hub_names, model.cfg)
    assert set(again) == set(model.state_dict()) and all(torch.equal(again[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match=r"1 tensor\(s\) that its config does not describe, e\.g\. \['audio_tower\.w'\]"):
        gemma3_multimodal_to_glassbox({**hub_names, "audio_tower.w": torch.zeros(1)}, model.cfg)


@pytest.mark.parametrize("top_tie,text_tie", [(False, True), (True, False)])
def test_gemma3_image_text_ties_by_its_own_flag_and_refuses_an_unapplied_cap(top_tie, text_tie, tmp_path):
    """Gemma3ForConditionalGeneration ties its lm_head by the top-level tie_word_embeddings (text_config's
    is not read), and never applies text_config.final_logit_softcapping: glassbox follows the first and
    refuses the second by name."""
    import transformers

    from glassbox.weights import from_pretrained
    from glassbox.weights.gemma import config_from_gemma3_multimodal

    def config(**text_extra):
        text = dict(vocab_size=300, hidden_size=32, intermediate_size=19, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=4,
                    tie_word_embeddings=text_tie, **text_extra)
        vision = dict(hidden_size=16, intermediate_size=20, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                      patch_size=14)
        cfg = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                        image_token_index=299, boi_token_index=297, eoi_token_index=298,
                                        tie_word_embeddings=top_tie)
        cfg._attn_implementation = "eager"
        return cfg

    torch.manual_seed(0)
    hf = transformers.Gemma3ForConditionalGeneration(config())
    with torch.no_grad():
        hf.lm_head.weight.normal_()  # untied: a head of its own; tied: W_E itself
    hf.eval().save_pretrained(tmp_path)
    hf = transformers.Gemma3ForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.float64).eval()
    tokens = torch.randint(0, 290, (2, 12), generator=torch.Generator().manual_seed(1))
    model = from_pretrained(tmp_path, dtype=torch.float64)
    assert model.cfg.tied_unembed is top_tie
    with torch.no_grad():
        expected = hf(input_ids=tokens).logits
        # measured <= 2.9e-6 (logits up to 20; transformers computes norms and rotary in float32), bound 3e-5: 10x
        torch.testing.assert_close(model(tokens), expected, atol=3e-5, rtol=0)
    with pytest.raises(ValueError, match="final_logit_softcapping=5.0: Gemma3ForConditionalGeneration never applies it"):
        config_from_gemma3_multimodal(config(final_logit_softcapping=5.0))
