"""Parity with transformers.LlamaForCausalLM: RMSNorm, "half" rotary, SwiGLU, and the Llama 2/3
options: grouped- and multi-query attention, attention and MLP biases, tied embeddings, rope_theta
and rope scaling ("linear", "dynamic", "llama3", "yarn").

The oracle is Hugging Face's Llama on seeded random weights (every RMSNorm weight and bias perturbed
away from 1 and 0, and weights large enough that attention is far from uniform, so a wrong rotary
pairing, kv-head order or norm cannot pass). Sizes are distinct: d_head 8 != d_model / n_heads
(7 or 5) is allowed by Llama and catches a head axis confused with d_model; 6 query heads over 2 kv
heads catch a kv head repeated in the wrong order (tile instead of repeat_interleave).

Float64: transformers' Llama is not a float64 computation as is (its RMSNorm, softmax and rotary
tables run in float32 whatever the model's dtype), so against it our float64 agrees to float32's
rounding only. ``float64_transformers`` runs transformers' own code with exactly those islands
widened to float64 (for the default rotation: a scaled rotation's frequencies are computed in
float32 by transformers' rope functions, so rope cases stay float32-limited); against that our
float64 agrees to ~1e-15, and it is the reference of the half-precision checks.

Errors measured (this machine, 3 x 23 tokens; logits up to ~7): the table above LOGITS_F32.
"""

import copy

import conftest
import pytest
import torch

from conftest import perturb_vectors
from glassbox.models import HookedTransformer
from glassbox.weights.llama import (config_from_llama, config_to_llama, glassbox_to_llama,
                                    llama_to_glassbox)

SIZES = dict(hidden_size=21, num_attention_heads=3, head_dim=8, intermediate_size=37, vocab_size=29,
             num_hidden_layers=2, max_position_embeddings=40)
GQA = dict(hidden_size=30, num_attention_heads=6, num_key_value_heads=2)

ROPE_SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    # original_max_position_embeddings 8: pair wavelengths 6.3 (smoothed), 30 and 140 (scaled) all act
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 10},
}

# The options, each on a config that exercises it.
CASES = {
    "plain": {},
    "gqa": GQA,
    "mqa": dict(num_key_value_heads=1),
    "biases": dict(GQA, num_key_value_heads=3, attention_bias=True, mlp_bias=True),
    "tied": dict(GQA, tie_word_embeddings=True),
    "gelu_new": dict(hidden_act="gelu_new"),
    **{f"rope_{name}": dict(GQA, rope_parameters={**rope, "rope_theta": 500.0})
       for name, rope in ROPE_SCALINGS.items()},
}
ROPE_CASES = [name for name in CASES if name.startswith("rope_")]


def make_hf_llama(seed=0, **config_overrides):
    """A perturbed, eval()'d, eager ``transformers.LlamaForCausalLM`` of SIZES with the overrides
    (LlamaConfig fields); rope_theta 500 unless rope_parameters is given."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    fields = {**SIZES, "initializer_range": 0.3, "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2,
              "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}, **config_overrides}
    model = LlamaForCausalLM(LlamaConfig(**fields, attn_implementation="eager"))
    perturb_vectors(model)
    return model.eval()


def float64_transformers(hf, monkeypatch):
    """A float64 copy of ``hf`` (Llama or Mistral) with transformers' float32 islands widened: RMSNorm,
    the default rotation's angles and the eager softmax run in float64; every other dtype, and a scaled
    rotation, run transformers' code unchanged."""
    from transformers.models.llama import modeling_llama
    from transformers.models.mistral import modeling_mistral

    def norm(original):
        def forward(self, x):
            if x.dtype != torch.float64:
                return original(self, x)
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))
        return forward

    def rotary(original):
        def forward(self, x, position_ids):
            if x.dtype != torch.float64 or self.rope_type != "default":
                return original(self, x, position_ids)
            dim = self.config.head_dim
            angles = position_ids[..., None].double() * self.config.rope_parameters["rope_theta"] ** (
                -torch.arange(0, dim, 2, dtype=torch.float64) / dim)
            angles = torch.cat((angles, angles), dim=-1)
            return angles.cos(), angles.sin()
        return forward

    def eager(original):
        def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
            if query.dtype != torch.float64:
                return original(module, query, key, value, attention_mask, scaling, dropout=dropout, **kwargs)
            groups = module.num_key_value_groups
            key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
            scores = query @ key.transpose(2, 3) * scaling
            if attention_mask is not None:
                scores = scores + attention_mask
            pattern = scores.softmax(-1)
            return (pattern @ value).transpose(1, 2).contiguous(), pattern
        return attention

    for module, prefix in ((modeling_llama, "Llama"), (modeling_mistral, "Mistral")):
        for name, widen in (("RMSNorm", norm), ("RotaryEmbedding", rotary)):
            cls = getattr(module, prefix + name)
            if "float64_transformers" not in cls.forward.__qualname__:
                monkeypatch.setattr(cls, "forward", widen(cls.forward))
        if "float64_transformers" not in module.eager_attention_forward.__qualname__:
            monkeypatch.setattr(module, "eager_attention_forward", eager(module.eager_attention_forward))
    return copy.deepcopy(hf).double()


def build(cfg, state):
    model = HookedTransformer(cfg, init=False)
    model.load_state_dict(state, strict=True)
    return model.eval()


@pytest.fixture(scope="module")
def hf_llama():
    return make_hf_llama()


@pytest.fixture
def tokens():
    # 23 positions: past every rope case's original_max_position_embeddings (8, 10)
    return torch.randint(0, SIZES["vocab_size"], (3, 23), generator=torch.Generator().manual_seed(1))


def test_config_maps_to_llama_options(hf_llama):
    cfg = config_from_llama(hf_llama.config)
    assert (cfg.normalization, cfg.positional, cfg.rotary_style, cfg.gated_mlp, cfg.act_fn) == (
        "RMS", "rotary", "half", True, "silu")
    assert (cfg.use_bias, cfg.tied_unembed, cfg.d_head, cfg.rotary_dim, cfg.rotary_base) == (False, False, 8, 8, 500.0)
    assert (cfg.n_key_value_heads, cfg.rope_scaling, cfg.attn_types, cfg.window_size) == (3, None, None, None)


def test_options_map_to_config():
    gqa = config_from_llama(make_hf_llama(**CASES["biases"]).config)
    assert (gqa.n_heads, gqa.n_key_value_heads, gqa.n_kv_groups) == (6, 3, 2)
    assert (gqa.qkv_bias, gqa.attn_out_bias, gqa.mlp_bias, gqa.use_bias) == (True, True, True, False)
    assert config_from_llama(make_hf_llama(**CASES["mqa"]).config).n_key_value_heads == 1
    assert config_from_llama(make_hf_llama(**CASES["tied"]).config).tied_unembed is True
    assert config_from_llama(make_hf_llama(**CASES["gelu_new"]).config).act_fn == "gelu_new"
    for name, rope in ROPE_SCALINGS.items():  # every key but rope_theta, unchanged
        cfg = config_from_llama(make_hf_llama(**CASES[f"rope_{name}"]).config)
        if name == "dynamic":  # transformers' dynamic scaling starts from max_position_embeddings
            rope = {**rope, "original_max_position_embeddings": SIZES["max_position_embeddings"]}
        assert (cfg.rotary_base, cfg.rope_scaling) == (500.0, rope), name
    stated = make_hf_llama(rope_parameters={**ROPE_SCALINGS["dynamic"], "rope_theta": 500.0,
                                            "original_max_position_embeddings": 11})
    assert config_from_llama(stated.config).rope_scaling["original_max_position_embeddings"] == 40
    from transformers import LlamaConfig

    # a pre-5.x config (rope_theta and rope_scaling with the old "type" key), as an older config.json has
    legacy = config_from_llama(LlamaConfig(**SIZES, rope_theta=123.0, rope_scaling={"type": "linear", "factor": 2.0}))
    assert (legacy.rotary_base, legacy.rope_scaling) == (123.0, {"rope_type": "linear", "factor": 2.0})


# Measured on this machine, 3 x 23 tokens, per case: max |error| of the float32 logits against
# transformers' float32, of the float64 logits against transformers' float64 as is and widened
# (``float64_transformers``), and mean |error| of all logits in bfloat16 and float16 against the
# widened float64 logits, ours / transformers' own (the ratio in brackets):
#   case          float32  float64 as is  widened   bfloat16            float16
#   plain         3.6e-6   2.7e-6         9.7e-15   0.014/0.016 (0.91)  1.8e-3/1.8e-3 (1.00)
#   gqa           6.3e-6   4.1e-6         2.0e-14   0.025/0.031 (0.80)  3.3e-3/3.6e-3 (0.91)
#   mqa           6.9e-6   4.3e-6         9.5e-15   0.016/0.020 (0.80)  2.7e-3/3.1e-3 (0.88)
#   biases        8.6e-6   3.1e-6         7.9e-15   0.023/0.026 (0.88)  3.1e-3/3.4e-3 (0.89)
#   tied          5.7e-6   4.5e-6         1.8e-14   0.024/0.029 (0.83)  3.1e-3/3.4e-3 (0.91)
#   gelu_new      2.9e-6   2.3e-6         7.1e-15   0.013/0.015 (0.87)  1.8e-3/1.8e-3 (1.01)
#   rope_linear   9.8e-6   9.2e-6         1.5e-6    0.033/0.035 (0.93)  3.1e-3/3.5e-3 (0.90)
#   rope_dynamic  6.3e-6   4.1e-6         3.1e-6    0.025/0.031 (0.80)  3.3e-3/3.6e-3 (0.91)
#   rope_llama3   5.5e-6   4.8e-6         1.7e-6    0.028/0.030 (0.95)  3.0e-3/3.3e-3 (0.90)
#   rope_yarn     8.3e-6   4.2e-6         3.2e-6    0.037/0.038 (0.96)  4.1e-3/4.6e-3 (0.90)
# (rope cases, widened: transformers computes the scaled frequencies themselves in float32)
# (rope_dynamic equals the default rotation here: transformers' dynamic scaling acts only past
# max_position_embeddings; test_dynamic_rope_runs_past_max_position_embeddings goes there.)
# float32: max 9.8e-6 over the cases (logits up to 6.7); bound 1e-4, 10x
LOGITS_F32 = 1e-4
# float64: limited by transformers' float32 norms, softmax and tables; max 9.2e-6, bound 1e-4, 11x
LOGITS_F64 = 1e-4


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_llama(case, tokens):
    hf = make_hf_llama(**CASES[case])
    model = HookedTransformer.from_hf(hf)
    with torch.no_grad():
        expected = hf(tokens).logits
        got = model(tokens)
    assert expected.abs().max() > 3.0, "logits too small for the comparison to mean anything"
    torch.testing.assert_close(got, expected, atol=LOGITS_F32, rtol=0)
    hf64 = hf.double()
    model64 = HookedTransformer.from_hf(hf64)
    with torch.no_grad():
        torch.testing.assert_close(model64(tokens), hf64(tokens).logits, atol=LOGITS_F64, rtol=0)


@pytest.mark.parametrize("case", [name for name in CASES if name not in ROPE_CASES])
def test_float64_matches_transformers_widened(case, tokens, monkeypatch):
    hf = make_hf_llama(**CASES[case])
    with torch.no_grad():
        got = HookedTransformer.from_hf(copy.deepcopy(hf).double())(tokens)
        expected = float64_transformers(hf, monkeypatch)(tokens).logits
    # measured <= 2.0e-14 over the cases (logits up to 6.7); bound 2e-13, 10x
    torch.testing.assert_close(got, expected, atol=2e-13, rtol=0)


@pytest.mark.parametrize("case", ["gqa", "mqa", "biases", "rope_llama3", "rope_yarn"])
def test_every_layer_matches_llama_hidden_states_and_attentions(case, tokens):
    hf = make_hf_llama(**CASES[case])
    model = HookedTransformer.from_hf(hf)
    acts = {}
    with torch.no_grad():
        out = hf(tokens, output_hidden_states=True, output_attentions=True, use_cache=True)
        model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith(("resid_pre", "pattern", "hook_rot_k", "hook_v")),
                                                 lambda x, hook: acts.__setitem__(hook.name, x))])
    cfg = model.cfg
    for L in range(cfg.n_layers):
        # grouped keys and values: [batch pos kv_head d_head], HF's cached (rotated) keys and values
        # [batch kv_head pos d_head] with the axes swapped, so the kv heads come in HF's order;
        # measured <= 5.6e-6 over the cases (values up to 9); bound 6e-5, 11x
        for ours, theirs in (("hook_rot_k", out.cache.layers[L].keys), ("hook_v", out.cache.layers[L].values)):
            assert acts[f"blocks.{L}.attn.{ours}"].shape == (3, 23, cfg.n_key_value_heads, cfg.d_head)
            torch.testing.assert_close(acts[f"blocks.{L}.attn.{ours}"], theirs.transpose(1, 2), atol=6e-5, rtol=0,
                                       msg=lambda m, L=L, ours=ours: f"{ours} of layer {L} differs from HF's cache: {m}")
        # measured <= 1.2e-5 over the cases (residual stream up to 26); bound 1.2e-4, 10x
        torch.testing.assert_close(acts[f"blocks.{L}.hook_resid_pre"], out.hidden_states[L], atol=1.2e-4, rtol=0,
                                   msg=lambda m, L=L: f"resid_pre of layer {L} differs from HF hidden_states[{L}]: {m}")
        # measured <= 2.2e-6 over the cases (probabilities); bound 2e-5, 9x
        torch.testing.assert_close(acts[f"blocks.{L}.attn.hook_pattern"], out.attentions[L], atol=2e-5, rtol=0,
                                   msg=lambda m, L=L: f"pattern of layer {L} differs from HF attentions[{L}]: {m}")
    # HF's last hidden state is after the final norm: compare it with ln_final's output
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter="ln_final.hook_out")
    # measured <= 3.9e-6 over the cases (values up to 5.2); bound 4e-5, 10x
    torch.testing.assert_close(cache["ln_final.hook_out"], out.hidden_states[-1], atol=4e-5, rtol=0)


# mean |error| over all logits against HF's float64 logits, ours / HF's: measured 0.80..0.96 in
# bfloat16 and 0.88..1.01 in float16 over the cases (the table above). Required: <= 1.2.
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", ["plain", "gqa", "mqa", "biases", "tied", *ROPE_CASES])
def test_half_precision_error_no_worse_than_transformers(case, dtype, tokens, monkeypatch):
    hf = make_hf_llama(**CASES[case])
    assert_half_error_within(hf, dtype, tokens, monkeypatch)


def assert_half_error_within(hf, dtype, tokens, monkeypatch, ratio=1.2):
    """Our mean |logit error| in ``dtype`` against transformers' (widened) float64 logits <= ratio x
    transformers' own in ``dtype``."""
    with torch.no_grad():
        reference = float64_transformers(hf, monkeypatch)(tokens).logits
        half = copy.deepcopy(hf).to(dtype)
        theirs = (half(tokens).logits.double() - reference).abs().mean().item()
        ours = (HookedTransformer.from_hf(half)(tokens).double() - reference).abs().mean().item()
    assert theirs > 0, "transformers' half-precision logits equal the float64 ones: nothing measured"
    assert ours <= ratio * theirs, f"{dtype}: our mean error {ours:.3g} vs transformers' {theirs:.3g}"


NEW = 12


@pytest.mark.parametrize("case", ["gqa", "mqa", "biases", "tied", *ROPE_CASES])
def test_greedy_generation_and_left_padding_match_transformers(case):
    hf = make_hf_llama(**CASES[case])
    model = HookedTransformer.from_hf(hf)
    assert_generation_matches(hf, model)


def assert_generation_matches(hf, model, lengths=(9, 5, 7), new=NEW, recompute=False):
    """Greedy generation from a left-padded batch equals hf.generate token for token (and, with
    ``recompute``, our generation without the key-value cache); the padded batch's logits at the real
    positions equal each row's alone."""
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, model.cfg.d_vocab, (n,), generator=gen) for n in lengths]
    width = max(lengths)
    tokens = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for i, p in enumerate(prompts):
        tokens[i, width - len(p):], mask[i, width - len(p):] = p, True
    with torch.no_grad():
        ref = hf.generate(tokens, attention_mask=mask.long(), max_new_tokens=new, do_sample=False,
                          pad_token_id=0, eos_token_id=None)[:, width:]
    cached = model.generate(tokens, new, attention_mask=mask)
    assert torch.equal(cached[:, :width], tokens)
    assert torch.equal(cached[:, width:], ref)
    assert len(set(ref.flatten().tolist())) > 5, "the generations are one repeated token"
    if recompute:
        assert torch.equal(model.generate(tokens, new, attention_mask=mask, use_past_kv_cache=False), cached)
    if len(prompts) > 1:
        with torch.no_grad():
            padded_logits = model(tokens, attention_mask=mask)
            for i, p in enumerate(prompts):
                # measured <= 1.8e-6 over the Llama and Mistral cases (logits up to 7); bound 2e-5, 11x
                torch.testing.assert_close(padded_logits[i, width - len(p):], model(p[None])[0], atol=2e-5, rtol=0,
                                           msg=lambda m, i=i: f"prompt {i}, left-padded, differs from alone: {m}")


def assert_round_trips(hf, hf_class, tokens, folder) -> HookedTransformer:
    # measured <= 1.2e-5 over the Llama and Mistral cases of seed 6 (logits up to 7); bound 1e-4, 8x
    return conftest.assert_round_trips(hf, hf_class, tokens, folder, atol=LOGITS_F32)


def test_round_trip_ours_llama_ours_is_exact():
    for case in ("gqa", "biases", "tied"):
        hf = make_hf_llama(**CASES[case])
        cfg = config_from_llama(hf.config)
        ours = llama_to_glassbox(hf.state_dict(), cfg)
        back = llama_to_glassbox(glassbox_to_llama(ours, cfg), cfg)
        assert set(back) == set(ours)
        for key in ours:
            assert torch.equal(back[key], ours[key]), (case, key)
        exported = glassbox_to_llama(ours, cfg)  # and the HF layout itself is reproduced bit for bit
        assert set(exported) == set(hf.state_dict())
        for key, tensor in hf.state_dict().items():
            assert torch.equal(exported[key], tensor), (case, key)


def test_export_to_llama_gives_same_logits(tokens):
    """A glassbox model with its own random weights, exported: transformers computes our logits."""
    from transformers import LlamaForCausalLM

    for case in ("plain", "biases"):
        cfg = config_from_llama(make_hf_llama(seed=4, **CASES[case]).config)
        torch.manual_seed(5)
        model = HookedTransformer(cfg).eval()
        with torch.no_grad():
            for param in model.parameters():
                param.add_(0.2 * torch.randn_like(param))
        hf_config = config_to_llama(cfg)
        assert (hf_config.num_key_value_heads, hf_config.attention_bias, hf_config.mlp_bias) == (
            cfg.n_key_value_heads, cfg.qkv_bias, cfg.mlp_bias)
        exported = LlamaForCausalLM(hf_config).eval()
        exported.load_state_dict(glassbox_to_llama(model.state_dict(), cfg), strict=True)
        with torch.no_grad():  # measured <= 8.1e-6 (logits up to 6.8); bound 8e-5, 10x
            torch.testing.assert_close(exported(tokens).logits, model(tokens), atol=8e-5, rtol=0)


@pytest.mark.parametrize("case", ["plain", "gqa", "mqa", "biases", "tied", *ROPE_CASES])
def test_model_level_from_hf_to_hf_and_folders(case, tokens, tmp_path):
    """from_hf, to_hf, save_pretrained and from_pretrained dispatch on the Llama architecture; the
    written folder loads in transformers with no missing or unexpected keys and the same logits."""
    from transformers import LlamaForCausalLM

    hf = make_hf_llama(seed=6, **CASES[case])
    model = assert_round_trips(hf, LlamaForCausalLM, tokens, tmp_path)
    assert model.to_hf().config.rope_parameters == hf.config.rope_parameters
    with torch.no_grad():
        reloaded_by_hf, info = LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="eager",
                                                                output_loading_info=True)
        assert (set(info["missing_keys"]), set(info["unexpected_keys"])) == (set(), set())
        assert reloaded_by_hf.config.rope_parameters == hf.config.rope_parameters
        torch.testing.assert_close(reloaded_by_hf(tokens).logits, hf(tokens).logits, atol=0, rtol=0)


def test_refusals_name_the_problem(hf_llama):
    from transformers import LlamaConfig

    for act in ("prelu", "no_such_act"):
        with pytest.raises(ValueError, match=f"Llama hidden_act '{act}' is not supported"):
            config_from_llama(LlamaConfig(**SIZES, hidden_act=act))
    with pytest.raises(ValueError, match="rope_type='longrope' is not supported"):
        config_from_llama(LlamaConfig(**SIZES, rope_parameters={
            "rope_type": "longrope", "rope_theta": 500.0, "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
            "original_max_position_embeddings": 10}))
    with pytest.raises(ValueError, match="partial_rotary_factor=0.5 with rope_type='linear' is not supported"):
        config_from_llama(LlamaConfig(**SIZES, rope_parameters={
            "rope_type": "linear", "rope_theta": 500.0, "factor": 2.0, "partial_rotary_factor": 0.5}))
    with pytest.raises(ValueError, match="sliding_window=7 .*generation cache keeps only"):
        config_from_llama(LlamaConfig(**SIZES, sliding_window=7))
    assert config_from_llama(LlamaConfig(**SIZES, sliding_window=40)).attn_types is None  # never acts
    cfg = config_from_llama(hf_llama.config)
    for change, named in [(dict(use_bias=True), "'use_bias': True"), (dict(qk_norm="head"), "'qk_norm': 'head'"),
                          (dict(qkv_bias=True), "'qkv_bias': True, 'attn_out_bias': False"),
                          (dict(attn_scale=1.0), "'attn_scale': 1.0"), (dict(rotary_dim=4), "'rotary_dim': 4"),
                          (dict(attn_types=("local", "global"), window_size=4), "'attn_types': \\('local', 'global'\\)"),
                          (dict(norm_weight_offset=1.0), "'norm_weight_offset': 1.0"),
                          (dict(upcast_attn=True), "'upcast_attn': True"),
                          (dict(output_logits_soft_cap=30.0), "'output_logits_soft_cap': 30.0")]:
        with pytest.raises(ValueError, match="not a Llama-architecture config.*" + named):
            config_to_llama(cfg.replace(**change))
    sd = dict(hf_llama.state_dict())
    sd["model.layers.1.mlp.up_proj.weight"] = sd["model.layers.1.mlp.up_proj.weight"][:-1]
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight has shape \(36, 21\), expected \(37, 21\)"):
        llama_to_glassbox(sd, cfg)
    sd = dict(hf_llama.state_dict(), **{"model.layers.0.self_attn.q_proj.bias": torch.zeros(24)})
    with pytest.raises(ValueError, match=r"1 tensor\(s\) that its config does not describe.*q_proj\.bias"):
        llama_to_glassbox(sd, cfg)  # a bias tensor the config (attention_bias=False) has no place for


def test_modern_preset_exports_as_llama(tokens):
    from transformers import LlamaForCausalLM

    from glassbox.models import preset_config

    torch.manual_seed(0)
    model = HookedTransformer(preset_config("modern", d_model=21, n_layers=2, n_heads=3, d_head=8, d_vocab=29,
                                            n_ctx=23)).eval()
    exported = model.to_hf()
    assert isinstance(exported, LlamaForCausalLM)
    with torch.no_grad():
        # measured 8.0e-7 (values up to 3.1), bound 1e-5: 12x
        torch.testing.assert_close(exported(tokens).logits, model(tokens), atol=1e-5, rtol=0)


def test_ungrouped_keys_and_values_repeat_each_kv_head_for_its_query_heads(tokens):
    """ungroup_grouped_query_attention: hook_k/hook_v [batch pos head d_head], query head h holding kv
    head h // 3 (6 heads over 2), and transformers' logits still."""
    hf = make_hf_llama(**CASES["gqa"])
    grouped = HookedTransformer.from_hf(hf)
    cfg = grouped.cfg.replace(ungroup_grouped_query_attention=True)
    ungrouped = build(cfg, grouped.state_dict())
    with torch.no_grad():
        logits, cache = ungrouped.run_with_cache(tokens, names_filter=lambda n: n.endswith(("hook_k", "hook_v")))
        _, grouped_cache = grouped.run_with_cache(tokens, names_filter=lambda n: n.endswith(("hook_k", "hook_v")))
        # measured 6.3e-6 (logits up to 6.5); bound 6e-5, 10x
        torch.testing.assert_close(logits, hf(tokens).logits, atol=6e-5, rtol=0)
    for name, value in cache.items():
        assert value.shape == (3, 23, 6, 8), name
        assert torch.equal(value, grouped_cache[name].repeat_interleave(3, dim=2)), name


def test_dynamic_rope_runs_past_max_position_embeddings():
    """A dynamic-rope Llama's context is factor x max_position_embeddings; past that length its
    frequencies change, as in transformers, and the export writes the original length back."""
    hf = make_hf_llama(**CASES["rope_dynamic"])
    cfg = config_from_llama(hf.config)
    original = SIZES["max_position_embeddings"]
    assert cfg.n_ctx == int(ROPE_SCALINGS["dynamic"]["factor"] * original)
    model = build(cfg, llama_to_glassbox(hf.state_dict(), cfg))
    tokens = torch.randint(0, SIZES["vocab_size"], (2, original + original // 2),
                           generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = hf(tokens).logits
        got = model(tokens)
        plain = build(cfg.replace(rope_scaling=None), llama_to_glassbox(hf.state_dict(), cfg))(tokens)
    assert (plain - expected).abs().max() > 0.1, "the sequence must reach the dynamic scaling"
    # measured 6.3e-6 (logits up to 7.2), bound 6e-5: 10x
    torch.testing.assert_close(got, expected, atol=6e-5, rtol=0)
    exported = config_to_llama(cfg)
    assert exported.max_position_embeddings == original and exported.rope_parameters["rope_type"] == "dynamic"
