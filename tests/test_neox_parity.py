"""Parity with transformers.GPTNeoXForCausalLM (GPT-NeoX, Pythia): parallel and sequential blocks,
partial "half" rotary, the fused per-head query_key_value layout, biases, untied embed_out.

The oracle is Hugging Face's GPT-NeoX on seeded random weights (every LayerNorm weight and bias and
every linear bias perturbed away from 1 and 0, init large enough that attention is far from
uniform). Sizes are distinct: d_model 42 = 3 heads of d_head 14, of which rotary_pct 0.3 rotates
int(4.2) = 4 dims (so transformers' rounding and the "half" pairing over the rotated dims both
matter), d_mlp 37, vocabulary 29, context 19.

transformers' GPT-NeoX is not float64 throughout: its rotary angles are float32 and its eager
softmax runs in float32 for every dtype, which leaves a 6e-7..1.4e-6 gap between float64 runs.
``float64_oracle`` swaps those two steps for float64 versions of the same formulas (the module's
own code otherwise), and the gap collapses to ~1e-14.
"""

import copy
from contextlib import contextmanager
from unittest import mock

import pytest
import torch

from conftest import assert_round_trips, perturb_vectors
from glassbox.models import HookedTransformer
from glassbox.weights.neox import config_from_neox, config_to_neox, glassbox_to_neox, neox_to_glassbox

SIZES = dict(hidden_size=42, num_attention_heads=3, intermediate_size=37, vocab_size=29, num_hidden_layers=2,
             max_position_embeddings=19)
# Every option mapped: parallel (Pythia) and sequential blocks, biases on and off, tied and untied,
# partial and full rotary, exact GELU and ReLU.
CASES = {
    "parallel": {},
    "sequential": dict(use_parallel_residual=False),
    "no_attention_bias_tied_full_rotary_relu": dict(attention_bias=False, tie_word_embeddings=True, rotary_pct=1.0,
                                                    hidden_act="relu"),
}


def make_hf_gpt_neox(seed=0, **config_overrides):
    """An eval()'d eager ``GPTNeoXForCausalLM`` of the test's sizes, seeded random weights with every 1-d
    parameter perturbed (``config_overrides`` replace GPTNeoXConfig fields)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(seed)
    fields = dict(SIZES, rotary_pct=0.3, rotary_emb_base=500.0, initializer_range=0.3, hidden_act="gelu",
                  use_parallel_residual=True, attention_bias=True, tie_word_embeddings=False, layer_norm_eps=1e-5,
                  bos_token_id=0, eos_token_id=2)
    fields.update(config_overrides)
    model = GPTNeoXForCausalLM(GPTNeoXConfig(**fields, attn_implementation="eager"))
    perturb_vectors(model)
    return model.eval()


@contextmanager
def float64_oracle():
    """transformers' GPT-NeoX with its two float32 steps (rotary angles, softmax) done in the input dtype."""
    from transformers.models.gpt_neox import modeling_gpt_neox as neox

    def rotary(self, x, position_ids):
        dim = 2 * self.inv_freq.shape[0]
        inv_freq = self.config.rope_parameters["rope_theta"] ** (
            -torch.arange(0, dim, 2, dtype=torch.float64, device=x.device) / dim)
        angles = position_ids[..., None].double() * inv_freq
        emb = torch.cat((angles, angles), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        weights = torch.matmul(query, key.transpose(2, 3)) * scaling
        if attention_mask is not None:
            weights = weights + attention_mask
        weights = weights.softmax(dim=-1)
        return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

    with mock.patch.object(neox.GPTNeoXRotaryEmbedding, "forward", rotary), \
            mock.patch.object(neox, "eager_attention_forward", eager):
        yield


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    hf = make_hf_gpt_neox(**CASES[request.param])
    return request.param, hf, HookedTransformer.from_hf(hf)


@pytest.fixture
def tokens():
    return torch.randint(0, SIZES["vocab_size"], (3, 13), generator=torch.Generator().manual_seed(1))


def test_config_maps_gpt_neox_options():
    cfg = config_from_neox(make_hf_gpt_neox().config)
    assert (cfg.normalization, cfg.norm_placement, cfg.positional, cfg.rotary_style, cfg.gated_mlp) == (
        "LN", "pre", "rotary", "half", False)
    assert (cfg.parallel_attn_mlp, cfg.parallel_ln2, cfg.d_head, cfg.rotary_dim, cfg.rotary_base) == (
        True, True, 14, 4, 500.0)
    assert (cfg.use_bias, cfg.qkv_bias, cfg.attn_out_bias, cfg.mlp_bias, cfg.tied_unembed, cfg.unembed_bias,
            cfg.act_fn) == (True, True, True, True, False, False, "gelu")
    cfg = config_from_neox(make_hf_gpt_neox(**CASES["sequential"]).config)
    assert (cfg.parallel_attn_mlp, cfg.parallel_ln2) == (False, False)
    cfg = config_from_neox(make_hf_gpt_neox(**CASES["no_attention_bias_tied_full_rotary_relu"]).config)
    assert (cfg.qkv_bias, cfg.attn_out_bias, cfg.mlp_bias, cfg.use_bias, cfg.tied_unembed, cfg.rotary_dim,
            cfg.act_fn) == (False, False, True, True, True, 14, "relu")


def test_fused_qkv_rows_are_per_head_query_key_value():
    """Head h's query, key and value are rows h*3*d_head + [0, 14), [14, 28), [28, 42) of query_key_value."""
    hf = make_hf_gpt_neox()
    cfg = config_from_neox(hf.config)
    ours = neox_to_glassbox(hf.state_dict(), cfg)
    W = hf.state_dict()["gpt_neox.layers.1.attention.query_key_value.weight"]
    b = hf.state_dict()["gpt_neox.layers.1.attention.query_key_value.bias"]
    for h in range(3):
        for i, name in enumerate("QKV"):
            rows = slice(h * 42 + i * 14, h * 42 + (i + 1) * 14)
            assert torch.equal(ours[f"blocks.1.attn.W_{name}"][h], W[rows].T)
            assert torch.equal(ours[f"blocks.1.attn.b_{name}"][h], b[rows])


def test_logits_match_gpt_neox(case, tokens):
    name, hf, model = case
    with torch.no_grad():
        expected = hf(tokens).logits
        got = model(tokens)
    assert expected.abs().max() > 3.0, "logits too small for the comparison to mean anything"
    # measured <= 3.8e-6 over the cases (logits up to 7.8); bound 4e-5, 10x
    torch.testing.assert_close(got, expected, atol=4e-5, rtol=0)


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
        # measured <= 6.7e-6 (residual stream up to 16.4); bound 7e-5, 10x
        torch.testing.assert_close(acts[f"blocks.{L}.hook_resid_pre"], out.hidden_states[L], atol=7e-5, rtol=0,
                                   msg=lambda m, L=L: f"{name}: resid_pre of layer {L} differs from hidden_states[{L}]: {m}")
        # measured <= 1.8e-6 (probabilities); bound 2e-5, 11x
        torch.testing.assert_close(acts[f"blocks.{L}.attn.hook_pattern"], out.attentions[L], atol=2e-5, rtol=0,
                                   msg=lambda m, L=L: f"{name}: pattern of layer {L} differs from attentions[{L}]: {m}")
    # measured <= 2.6e-6 (values up to 4.2); bound 3e-5, 11x
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
    # measured <= 1.3e-14 (logits up to 7.8); bound 1.5e-13, 11x
    torch.testing.assert_close(got, expected.logits, atol=1.5e-13, rtol=0)
    for L in range(model.cfg.n_layers):  # measured <= 1.5e-14 (values up to 16.4); bound 1.5e-13, 10x
        torch.testing.assert_close(acts[f"blocks.{L}.hook_resid_pre"], expected.hidden_states[L], atol=1.5e-13, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_error_no_worse_than_transformers(case, dtype):
    """Against HF's float64 logits on the same weights, our mean |error| in bf16/fp16 is at most 1.2x
    transformers' own in that dtype."""
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
    # measured ratio 0.86..0.99 over the cases and dtypes (bf16 errors 1.8e-2..2.3e-2, fp16 2.1e-3..2.8e-3)
    assert our_error <= 1.2 * hf_error, f"{name} {dtype}: ours {our_error:.3e}, transformers {hf_error:.3e}"


@pytest.mark.parametrize("name", ["parallel", "sequential"])
def test_greedy_generation_equals_hf_generate(name):
    hf = make_hf_gpt_neox(**CASES[name])
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
            # measured <= 1.9e-6 (logits up to 9.5); bound 2e-5, 10x
            torch.testing.assert_close(logits[i, 9 - len(row):], model(row[None])[0], atol=2e-5, rtol=0)
            # measured <= 2.9e-6; bound 3e-5, 10x
            torch.testing.assert_close(logits[i, 9 - len(row):], hf(row[None]).logits[0], atol=3e-5, rtol=0)


def test_round_trip_ours_neox_ours_is_exact(case):
    name, hf, model = case
    cfg = model.cfg
    ours = neox_to_glassbox(hf.state_dict(), cfg)
    theirs = glassbox_to_neox(ours, cfg)
    assert set(theirs) == set(hf.state_dict())
    back = neox_to_glassbox(theirs, cfg)
    assert set(back) == set(ours) == set(model.state_dict())
    for key in ours:
        assert torch.equal(back[key], ours[key]), key


def test_export_of_our_own_weights_loads_in_transformers(case, tokens, tmp_path):
    """A glassbox model with its own random weights, exported and saved: transformers loads the folder
    with no missing or unexpected keys and computes our logits."""
    from transformers import GPTNeoXForCausalLM

    from glassbox.weights import save_pretrained

    name, _, template = case
    torch.manual_seed(5)
    model = HookedTransformer(template.cfg).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.2 * torch.randn_like(param))
    save_pretrained(model, tmp_path)
    loaded, info = GPTNeoXForCausalLM.from_pretrained(tmp_path, attn_implementation="eager", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert loaded.config.use_parallel_residual == model.cfg.parallel_attn_mlp
    with torch.no_grad():  # measured <= 6.9e-6 (logits up to 9.7); bound 7e-5, 10x
        torch.testing.assert_close(loaded.eval()(tokens).logits, model(tokens), atol=7e-5, rtol=0)
        torch.testing.assert_close(model.to_hf()(tokens).logits, loaded(tokens).logits, atol=0, rtol=0)


def test_model_level_from_hf_to_hf_and_folders(case, tokens, tmp_path):
    from transformers import GPTNeoXForCausalLM

    name, hf, _ = case
    assert_round_trips(hf, GPTNeoXForCausalLM, tokens, tmp_path)


def test_hub_checkpoint_names_load():
    """The hub's Pythia files call the unembedding embed_out and carry mask and rotary buffers."""
    hf = make_hf_gpt_neox()
    cfg = config_from_neox(hf.config)
    sd = dict(hf.state_dict())
    sd["embed_out.weight"] = sd.pop("lm_head.weight")
    for L in range(2):
        sd[f"gpt_neox.layers.{L}.attention.bias"] = torch.ones(1, 1, 19, 19, dtype=torch.bool).tril()
        sd[f"gpt_neox.layers.{L}.attention.masked_bias"] = torch.tensor(-1e9)
        sd[f"gpt_neox.layers.{L}.attention.rotary_emb.inv_freq"] = torch.ones(2)
    ours = neox_to_glassbox(sd, cfg)
    assert torch.equal(ours["unembed.W_U_T"], hf.state_dict()["lm_head.weight"])
    sd["gpt_neox.layers.2.mlp.dense_h_to_4h.weight"] = torch.zeros(37, 42)
    with pytest.raises(ValueError, match=r"1 tensor\(s\) that its config does not describe.*layers\.2\.mlp"):
        neox_to_glassbox(sd, cfg)


def test_refusals_name_the_option():
    from transformers import GPTNeoXConfig

    def config(**fields):
        return GPTNeoXConfig(**{**SIZES, "rotary_pct": 0.3, **fields})

    with pytest.raises(ValueError, match="rope_type='longrope' is not supported"):
        config_from_neox(config(rope_parameters={"rope_type": "longrope", "factor": 2.0, "rope_theta": 1e4,
                                                 "short_factor": [1.0, 1.0], "long_factor": [1.0, 1.0],
                                                 "partial_rotary_factor": 0.3}))
    with pytest.raises(ValueError, match="hidden_act 'prelu' is not supported"):
        config_from_neox(config(hidden_act="prelu"))
    with pytest.raises(ValueError, match=r"rotary_pct \(partial_rotary_factor\)=0.5 gives 7 rotary dims of d_head=14"):
        config_from_neox(config(rotary_pct=0.5))  # transformers rotates 8 dims at the frequencies of 7
    cfg = config_from_neox(config())
    for change, named in [(dict(normalization="RMS"), "'normalization': 'RMS'"),
                          (dict(n_key_value_heads=1), "'n_key_value_heads': 1"),
                          (dict(qkv_bias=False), "qkv_bias != attn_out_bias"),
                          (dict(parallel_ln2=False), "parallel_ln2 != parallel_attn_mlp"),
                          (dict(rotary_style="interleaved"), "'rotary_style': 'interleaved'"),
                          (dict(output_logits_soft_cap=30.0), "'output_logits_soft_cap': 30.0")]:
        with pytest.raises(ValueError, match="not a GPT-NeoX-architecture config.*" + named.replace("(", r"\(")):
            config_to_neox(cfg.replace(**change))
    sd = dict(make_hf_gpt_neox().state_dict())
    sd["gpt_neox.layers.1.attention.query_key_value.weight"] = sd["gpt_neox.layers.1.attention.query_key_value.weight"][:-1]
    with pytest.raises(ValueError, match=r"query_key_value\.weight has shape \(125, 42\), expected \(126, 42\)"):
        neox_to_glassbox(sd, config_from_neox(make_hf_gpt_neox().config))


def test_rotary_pct_survives_export_for_every_rotary_dim():
    """int(d_head * partial_rotary_factor) gives rotary_dim back for each even rotary_dim (float rounding)."""
    cfg = config_from_neox(make_hf_gpt_neox().config)
    for d_head in (14, 80, 100):
        for rotary_dim in range(2, d_head + 1, 2):
            c = cfg.replace(d_model=3 * d_head, d_head=d_head, rotary_dim=rotary_dim)
            assert config_from_neox(config_to_neox(c)).rotary_dim == rotary_dim


def test_pythia_style_folder_loads(tmp_path):
    """A folder as the hub ships Pythia: config.json with rotary_pct and rotary_emb_base (no rope_parameters),
    the unembedding saved as embed_out.weight, the causal-mask buffers of older checkpoints."""
    import json

    from safetensors.torch import load_file, save_file

    from glassbox.weights import from_pretrained

    hf = make_hf_gpt_neox()
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["rope_parameters"]
    config.update(rotary_pct=0.3, rotary_emb_base=500.0)
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = load_file(tmp_path / "model.safetensors")
    if "lm_head.weight" in tensors:  # transformers 5 writes the hub's name itself
        tensors["embed_out.weight"] = tensors.pop("lm_head.weight")
    assert "embed_out.weight" in tensors
    tensors["gpt_neox.layers.0.attention.masked_bias"] = torch.tensor(-1e9)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    model = from_pretrained(tmp_path)
    assert (model.cfg.rotary_dim, model.cfg.rotary_base, model.cfg.parallel_attn_mlp) == (4, 500.0, True)
    tokens = torch.randint(0, SIZES["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():  # measured 2.4e-6 (logits up to 7.1); bound 3e-5, 12x
        torch.testing.assert_close(model(tokens), hf(tokens).logits, atol=3e-5, rtol=0)


ROPE_SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},  # acts past max_position_embeddings only: as default here
    "llama3": {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 8, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 8},
}


@pytest.mark.parametrize("rope", list(ROPE_SCALINGS))
def test_rope_scaling_of_the_partial_rotary_dims(rope, tokens):
    """transformers scales the frequencies of the int(d_head * partial_rotary_factor) rotated dims."""
    hf = make_hf_gpt_neox(rope_parameters={**ROPE_SCALINGS[rope], "rope_theta": 500.0, "partial_rotary_factor": 0.3})
    model = HookedTransformer.from_hf(hf)
    assert (model.cfg.rope_scaling["rope_type"], model.cfg.rotary_dim) == (rope, 4)
    with torch.no_grad():
        expected = hf(tokens).logits
        # measured <= 3.5e-6 over the rope types (logits up to 8.4); bound 4e-5, 11x
        torch.testing.assert_close(model(tokens), expected, atol=4e-5, rtol=0)
        if rope != "dynamic":  # the scaling changes the logits, so ignoring it would fail
            assert (expected - make_hf_gpt_neox()(tokens).logits).abs().max() > 1e-2
        torch.testing.assert_close(model.to_hf()(tokens).logits, expected, atol=0, rtol=0)


@pytest.mark.parametrize("flag", ["use_attn_result", "use_split_qkv_input", "use_attn_in", "use_hook_mlp_in"])
def test_hook_flags_keep_the_logits(case, flag, tokens):
    """Each hook flag's per-head or copied inputs compute the same model (GPT-NeoX's parallel block has
    its own attention input and MLP norm, so every flag applies)."""
    name, hf, model = case
    flagged = copy.deepcopy(model)
    getattr(flagged, f"set_{flag}")(True)
    with torch.no_grad():
        # measured <= 4.8e-6 over the flags and cases (logits up to 7.8); bound 5e-5, 10x
        torch.testing.assert_close(flagged(tokens), hf(tokens).logits, atol=5e-5, rtol=0)


def test_residual_stream_is_the_sum_of_the_hooked_outputs(case, tokens):
    name, hf, model = case
    _, cache = model.run_with_cache(tokens)
    for L in range(model.cfg.n_layers):
        pre, attn, mlp, post = (cache[f"blocks.{L}.{h}"] for h in ("hook_resid_pre", "hook_attn_out", "hook_mlp_out",
                                                                    "hook_resid_post"))
        if model.cfg.parallel_attn_mlp:
            assert f"blocks.{L}.hook_resid_mid" not in cache
            assert torch.equal(post, pre + attn + mlp)
        else:
            mid = cache[f"blocks.{L}.hook_resid_mid"]
            assert torch.equal(mid, pre + attn) and torch.equal(post, mid + mlp)
