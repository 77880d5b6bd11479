"""Parity with transformers.Olmo2ForCausalLM (OLMo 2): output norms (post_attention_layernorm after the
attention, post_feedforward_layernorm after the MLP, no input norms), q/k RMSNorm over all heads,
grouped-query attention, SwiGLU, "half" rotary, untied or tied unembedding, optional attention biases.

The oracle is Hugging Face's OLMo 2 on seeded random weights (every RMSNorm weight, q/k norms
included, perturbed away from 1, init large enough that attention is far from uniform). Sizes are
distinct: d_model 21, 4 query heads and 2 key/value heads of head_dim 8 (4 * 8 = 32 != 21, so a head
axis confused with d_model fails, and the q norm's 32 weights differ from the k norm's 16), d_mlp 37,
vocabulary 29, context 19; one case has no head_dim (d_head = 40 // 4) and one key/value head.

transformers' OLMo 2 is not float64 throughout: its rotary angles, its RMSNorms (they cast to
float32 whatever the input) and its eager softmax are float32, a 1e-6..2e-6 gap between float64
runs. ``float64_oracle`` swaps those three for float64 versions of the same formulas (the module's
own code otherwise), and the gap collapses to ~5e-15.
"""

import copy
from contextlib import contextmanager
from unittest import mock

import pytest
import torch

from conftest import assert_round_trips, perturb_vectors
from glassbox.models import HookedTransformer
from glassbox.weights.olmo2 import config_from_olmo2, config_to_olmo2, glassbox_to_olmo2, olmo2_to_glassbox

SIZES = dict(hidden_size=21, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=37,
             vocab_size=29, num_hidden_layers=2, max_position_embeddings=19)
CASES = {
    "gqa_untied": {},
    "attention_bias_tied": dict(attention_bias=True, tie_word_embeddings=True, num_key_value_heads=4),
    "mqa_default_head_dim": dict(hidden_size=40, head_dim=None, num_key_value_heads=1),
}


def make_hf_olmo2(seed=0, **config_overrides):
    """An eval()'d eager ``Olmo2ForCausalLM`` of the test's sizes, seeded random weights with every 1-d
    parameter perturbed (``config_overrides`` replace Olmo2Config fields; head_dim=None drops it)."""
    from transformers import Olmo2Config, Olmo2ForCausalLM

    torch.manual_seed(seed)
    fields = dict(SIZES, initializer_range=0.3, hidden_act="silu", rms_norm_eps=1e-5, tie_word_embeddings=False,
                  attention_bias=False, rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                  pad_token_id=1, bos_token_id=None, eos_token_id=2)
    fields.update(config_overrides)
    fields = {k: v for k, v in fields.items() if not (k == "head_dim" and v is None)}
    model = Olmo2ForCausalLM(Olmo2Config(**fields, attn_implementation="eager"))
    perturb_vectors(model)
    return model.eval()


@contextmanager
def float64_oracle():
    """transformers' OLMo 2 with its float32 steps (rotary angles, RMSNorm, softmax) in the input dtype."""
    from transformers.models.olmo2 import modeling_olmo2 as olmo2

    def rotary(self, x, position_ids):
        dim = 2 * self.inv_freq.shape[0]
        inv_freq = self.config.rope_parameters["rope_theta"] ** (
            -torch.arange(0, dim, 2, dtype=torch.float64, device=x.device) / dim)
        angles = position_ids[..., None].double() * inv_freq
        emb = torch.cat((angles, angles), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def norm(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        key = olmo2.repeat_kv(key, module.num_key_value_groups)
        value = olmo2.repeat_kv(value, module.num_key_value_groups)
        weights = torch.matmul(query, key.transpose(2, 3)) * scaling
        if attention_mask is not None:
            weights = weights + attention_mask
        weights = weights.softmax(dim=-1)
        return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

    with mock.patch.object(olmo2.Olmo2RotaryEmbedding, "forward", rotary), \
            mock.patch.object(olmo2.Olmo2RMSNorm, "forward", norm), \
            mock.patch.object(olmo2, "eager_attention_forward", eager):
        yield


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    hf = make_hf_olmo2(**CASES[request.param])
    return request.param, hf, HookedTransformer.from_hf(hf)


@pytest.fixture
def tokens():
    return torch.randint(0, SIZES["vocab_size"], (3, 13), generator=torch.Generator().manual_seed(1))


def test_config_maps_olmo2_options():
    cfg = config_from_olmo2(make_hf_olmo2().config)
    assert (cfg.normalization, cfg.norm_placement, cfg.qk_norm, cfg.positional, cfg.rotary_style, cfg.gated_mlp,
            cfg.act_fn) == ("RMS", "output", "full", "rotary", "half", True, "silu")
    assert (cfg.n_heads, cfg.n_key_value_heads, cfg.d_head, cfg.rotary_dim, cfg.rotary_base, cfg.layer_norm_eps) == (
        4, 2, 8, 8, 500.0, 1e-5)
    assert (cfg.use_bias, cfg.qkv_bias, cfg.attn_out_bias, cfg.mlp_bias, cfg.tied_unembed) == (
        False, False, False, False, False)
    cfg = config_from_olmo2(make_hf_olmo2(**CASES["attention_bias_tied"]).config)
    assert (cfg.qkv_bias, cfg.attn_out_bias, cfg.mlp_bias, cfg.tied_unembed, cfg.n_key_value_heads) == (
        True, True, False, True, 4)
    cfg = config_from_olmo2(make_hf_olmo2(**CASES["mqa_default_head_dim"]).config)
    assert (cfg.d_model, cfg.d_head, cfg.n_key_value_heads) == (40, 10, 1)


def test_qk_norm_weights_cover_all_heads(case):
    name, hf, model = case
    attn = hf.model.layers[1].self_attn
    assert torch.equal(model.blocks[1].attn.q_norm.w, attn.q_norm.weight)  # [n_heads * d_head]
    assert torch.equal(model.blocks[1].attn.k_norm.w, attn.k_norm.weight)  # [n_key_value_heads * d_head]
    assert model.blocks[1].attn.k_norm.w.shape == (model.cfg.n_key_value_heads * model.cfg.d_head,)


def test_logits_match_olmo2(case, tokens):
    name, hf, model = case
    with torch.no_grad():
        expected = hf(tokens).logits
        got = model(tokens)
    assert expected.abs().max() > 3.0, "logits too small for the comparison to mean anything"
    # measured <= 4.5e-6 over the cases (logits up to 6.8); bound 5e-5, 11x
    torch.testing.assert_close(got, expected, atol=5e-5, rtol=0)


def test_every_layer_matches_hidden_states_and_attentions(case, tokens):
    name, hf, model = case
    acts = {}
    with torch.no_grad():
        out = hf(tokens, output_hidden_states=True, output_attentions=True)
        model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith(("resid_pre", "pattern", "ln_final.hook_out")),
                                                 lambda x, hook: acts.__setitem__(hook.name, x))])
    n = model.cfg.n_layers
    assert len(out.hidden_states) == n + 1  # the last is after the final norm
    for L in range(n):
        # measured <= 4.1e-6 (residual stream up to 7.8); bound 4e-5, 10x
        torch.testing.assert_close(acts[f"blocks.{L}.hook_resid_pre"], out.hidden_states[L], atol=4e-5, rtol=0,
                                   msg=lambda m, L=L: f"{name}: resid_pre of layer {L} differs from hidden_states[{L}]: {m}")
        # measured <= 7.8e-7 (probabilities); bound 8e-6, 10x
        torch.testing.assert_close(acts[f"blocks.{L}.attn.hook_pattern"], out.attentions[L], atol=8e-6, rtol=0,
                                   msg=lambda m, L=L: f"{name}: pattern of layer {L} differs from attentions[{L}]: {m}")
    # measured <= 3.0e-6 (values up to 4.4); bound 3e-5, 10x
    torch.testing.assert_close(acts["ln_final.hook_out"], out.hidden_states[n], atol=3e-5, rtol=0)
    assert out.attentions[0].amax(-1).min() < 0.9 and out.attentions[0][..., 5:, :].amax(-1).max() > 0.3  # not uniform


def test_float64_matches_to_rounding(case, tokens):
    name, hf, _ = case
    hf64 = copy.deepcopy(hf).double()
    model = HookedTransformer.from_hf(hf64)
    assert next(model.parameters()).dtype == torch.float64
    with torch.no_grad(), float64_oracle():
        expected = hf64(tokens, output_hidden_states=True)
        acts = {}
        got = model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith("resid_pre"),
                                                       lambda x, hook: acts.__setitem__(hook.name, x))])
    # measured <= 1.0e-14 (logits up to 6.8); bound 1e-13, 10x
    torch.testing.assert_close(got, expected.logits, atol=1e-13, rtol=0)
    for L in range(model.cfg.n_layers):  # measured <= 6.7e-15 (values up to 7.8); bound 7e-14, 10x
        torch.testing.assert_close(acts[f"blocks.{L}.hook_resid_pre"], expected.hidden_states[L], atol=7e-14, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_error_no_worse_than_transformers(case, dtype):
    """Against HF's float64 logits on the same weights, our mean |error| in bf16/fp16 is at most 1.2x
    transformers' own in that dtype (which computes its norms and rotation in float32)."""
    name, hf, _ = case
    tokens = torch.randint(0, SIZES["vocab_size"], (4, 17), generator=torch.Generator().manual_seed(2))
    half = copy.deepcopy(hf).to(dtype)
    model = HookedTransformer.from_hf(half)
    with torch.no_grad():
        with float64_oracle():
            reference = copy.deepcopy(hf).double()(tokens).logits
        hf_error = (half(tokens).logits.double() - reference).abs().mean()
        our_error = (model(tokens).double() - reference).abs().mean()
    assert hf_error > 0
    # measured ratio 0.97..1.05 over the cases and dtypes (0.90..1.08 over 16 seeds); bf16 errors 9e-3..2e-2,
    # fp16 1.1e-3..2.4e-3
    assert our_error <= 1.2 * hf_error, f"{name} {dtype}: ours {our_error:.3e}, transformers {hf_error:.3e}"


@pytest.mark.parametrize("name", ["gqa_untied", "mqa_default_head_dim"])
def test_greedy_generation_equals_hf_generate(name):
    hf = make_hf_olmo2(**CASES[name])
    model = HookedTransformer.from_hf(hf)
    gen = torch.Generator().manual_seed(3)
    lengths, width, new = (5, 8, 3), 8, 10
    tokens = torch.zeros(3, width, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.long)
    for i, n in enumerate(lengths):
        tokens[i, width - n:] = torch.randint(3, SIZES["vocab_size"], (n,), generator=gen)
        mask[i, width - n:] = 1
    with torch.no_grad():
        expected = hf.generate(tokens, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=1,
                               eos_token_id=None)
    got = model.generate(tokens, new, attention_mask=mask.bool(), eos_token_id=None)
    assert torch.equal(got, expected)
    assert len(set(expected[:, width:].flatten().tolist())) > 4  # varied text, not one repeated token


def test_left_padding_equals_each_prompt_alone(case):
    name, hf, model = case
    gen = torch.Generator().manual_seed(4)
    rows = [torch.randint(0, SIZES["vocab_size"], (n,), generator=gen) for n in (9, 4)]
    padded = torch.zeros(2, 9, dtype=torch.long)
    mask = torch.zeros(2, 9, dtype=torch.bool)
    for i, row in enumerate(rows):
        padded[i, 9 - len(row):], mask[i, 9 - len(row):] = row, True
    with torch.no_grad():
        logits = model(padded, attention_mask=mask)
        for i, row in enumerate(rows):
            # measured <= 1.9e-6 (logits up to 7.2); bound 2e-5, 10x
            torch.testing.assert_close(logits[i, 9 - len(row):], model(row[None])[0], atol=2e-5, rtol=0)
            # measured <= 4.4e-6; bound 4.5e-5, 10x
            torch.testing.assert_close(logits[i, 9 - len(row):], hf(row[None]).logits[0], atol=4.5e-5, rtol=0)


def test_round_trip_ours_olmo2_ours_is_exact(case):
    name, hf, model = case
    cfg = model.cfg
    ours = olmo2_to_glassbox(hf.state_dict(), cfg)
    theirs = glassbox_to_olmo2(ours, cfg)
    assert set(theirs) == set(hf.state_dict())
    back = olmo2_to_glassbox(theirs, cfg)
    assert set(back) == set(ours) == set(model.state_dict())
    for key in ours:
        assert torch.equal(back[key], ours[key]), key


def test_export_of_our_own_weights_loads_in_transformers(case, tokens, tmp_path):
    """A glassbox model with its own random weights, exported and saved: transformers loads the folder
    with no missing or unexpected keys and computes our logits."""
    from transformers import Olmo2ForCausalLM

    from glassbox.weights import save_pretrained

    name, _, template = case
    torch.manual_seed(5)
    model = HookedTransformer(template.cfg).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.2 * torch.randn_like(param))
    save_pretrained(model, tmp_path)
    loaded, info = Olmo2ForCausalLM.from_pretrained(tmp_path, attn_implementation="eager", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert (loaded.config.num_key_value_heads, loaded.config.tie_word_embeddings) == (
        model.cfg.n_key_value_heads, model.cfg.tied_unembed)
    with torch.no_grad():  # measured <= 8.6e-6 (logits up to 8.3); bound 9e-5, 10x
        torch.testing.assert_close(loaded.eval()(tokens).logits, model(tokens), atol=9e-5, rtol=0)
        torch.testing.assert_close(model.to_hf()(tokens).logits, loaded(tokens).logits, atol=0, rtol=0)


def test_model_level_from_hf_to_hf_and_folders(case, tokens, tmp_path):
    from transformers import Olmo2ForCausalLM

    name, hf, _ = case
    assert_round_trips(hf, Olmo2ForCausalLM, tokens, tmp_path)


def test_refusals_name_the_option():
    from transformers import Olmo2Config

    def config(**fields):
        return Olmo2Config(**{**SIZES, **fields})

    with pytest.raises(ValueError, match="rope_type='longrope' is not supported"):
        config_from_olmo2(config(rope_parameters={"rope_type": "longrope", "factor": 2.0, "rope_theta": 1e4,
                                                  "short_factor": [1.0] * 4, "long_factor": [1.0] * 4}))
    with pytest.raises(ValueError, match="hidden_act 'prelu' is not supported"):
        config_from_olmo2(config(hidden_act="prelu"))
    cfg = config_from_olmo2(config())
    for change, named in [(dict(norm_placement="pre"), "'norm_placement': 'pre'"),
                          (dict(qk_norm="head"), "'qk_norm': 'head'"),
                          (dict(rotary_dim=4), "'rotary_dim': 4"),
                          (dict(mlp_bias=True), "'mlp_bias': True"),
                          (dict(qkv_bias=True), "qkv_bias != attn_out_bias"),
                          (dict(attn_scores_soft_cap=50.0), "'attn_scores_soft_cap': 50.0")]:
        with pytest.raises(ValueError, match="not an OLMo-2-architecture config.*" + named):
            config_to_olmo2(cfg.replace(**change))
    sd = dict(make_hf_olmo2().state_dict())
    sd["model.layers.1.self_attn.k_norm.weight"] = sd["model.layers.1.self_attn.k_norm.weight"][:-1]
    with pytest.raises(ValueError, match=r"k_norm\.weight has shape \(15,\), expected \(16,\)"):
        olmo2_to_glassbox(sd, cfg)
    sd = dict(make_hf_olmo2().state_dict())
    sd["model.layers.0.input_layernorm.weight"] = torch.ones(21)  # a pre-norm model's weights are not OLMo 2's
    with pytest.raises(ValueError, match=r"1 tensor\(s\) that its config does not describe.*input_layernorm"):
        olmo2_to_glassbox(sd, cfg)


ROPE_SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},  # acts past max_position_embeddings only: as default here
    "llama3": {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 8, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 8},
}


@pytest.mark.parametrize("rope", list(ROPE_SCALINGS))
def test_rope_scaling(rope, tokens):
    hf = make_hf_olmo2(rope_parameters={**ROPE_SCALINGS[rope], "rope_theta": 500.0})
    model = HookedTransformer.from_hf(hf)
    assert model.cfg.rope_scaling["rope_type"] == rope
    with torch.no_grad():
        expected = hf(tokens).logits
        # measured <= 3.0e-6 over the rope types (logits up to 5.2); bound 3e-5, 10x
        torch.testing.assert_close(model(tokens), expected, atol=3e-5, rtol=0)
        if rope != "dynamic":  # the scaling changes the logits, so ignoring it would fail
            assert (expected - make_hf_olmo2()(tokens).logits).abs().max() > 1e-2
        torch.testing.assert_close(model.to_hf()(tokens).logits, expected, atol=0, rtol=0)


@pytest.mark.parametrize("flag", ["use_attn_result", "use_split_qkv_input", "use_attn_in", "use_hook_mlp_in"])
def test_hook_flags_keep_the_logits(case, flag, tokens):
    """Each hook flag's per-head (per kv head for keys and values) or copied inputs compute the same model;
    use_attn_in, one key input per query head, is refused where the grouped keys are normalised together."""
    from glassbox.models.hook_flags import HookFlagError

    name, hf, model = case
    flagged = copy.deepcopy(model)
    if flag == "use_attn_in" and model.cfg.n_key_value_heads < model.cfg.n_heads:
        with pytest.raises(HookFlagError, match="use_attn_in.*qk_norm='full'"):
            flagged.set_use_attn_in(True)
        return
    getattr(flagged, f"set_{flag}")(True)
    with torch.no_grad():
        # measured <= 6.0e-6 over the flags and cases (logits up to 6.8); bound 6e-5, 10x
        torch.testing.assert_close(flagged(tokens), hf(tokens).logits, atol=6e-5, rtol=0)


def test_residual_stream_adds_the_normalised_outputs(case, tokens):
    """hook_attn_out and hook_mlp_out are the output norms' results, what the residual stream adds."""
    name, hf, model = case
    _, cache = model.run_with_cache(tokens)
    for L in range(model.cfg.n_layers):
        b = f"blocks.{L}."
        assert torch.equal(cache[b + "hook_attn_out"], cache[b + "ln1.hook_out"])
        assert torch.equal(cache[b + "hook_mlp_out"], cache[b + "ln2.hook_out"])
        assert torch.equal(cache[b + "hook_resid_mid"], cache[b + "hook_resid_pre"] + cache[b + "hook_attn_out"])
        assert torch.equal(cache[b + "hook_resid_post"], cache[b + "hook_resid_mid"] + cache[b + "hook_mlp_out"])
