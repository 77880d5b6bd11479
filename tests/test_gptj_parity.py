"""Parity with transformers.GPTJForCausalLM: the "interleaved" rotary pairing (on a partial
rotary_dim), parallel attention and MLP, unembedding bias.

The oracle is Hugging Face's GPT-J on seeded random weights, LayerNorm weights and every bias
perturbed; rotary_dim 6 of d_head 8 checks that the unrotated dims pass through.
"""

import pytest
import torch

from conftest import assert_round_trips, perturb_vectors
from glassbox.models import HookedTransformer
from glassbox.weights.gptj import config_from_gptj, config_to_gptj, glassbox_to_gptj, gptj_to_glassbox

SIZES = dict(n_embd=24, n_head=3, rotary_dim=6, n_layer=2, n_inner=37, vocab_size=29, n_positions=19)


def make_hf_gptj(seed=0):
    from transformers import GPTJConfig, GPTJForCausalLM

    torch.manual_seed(seed)
    config = GPTJConfig(**SIZES, initializer_range=0.3, attn_implementation="eager", bos_token_id=0,
                        eos_token_id=0)
    model = GPTJForCausalLM(config)
    perturb_vectors(model)
    return model.eval()


def build(cfg, state):
    model = HookedTransformer(cfg, init=False)
    model.load_state_dict(state, strict=True)
    return model.eval()


@pytest.fixture(scope="module")
def hf_gptj():
    return make_hf_gptj()


@pytest.fixture
def tokens():
    return torch.randint(0, SIZES["vocab_size"], (3, 13), generator=torch.Generator().manual_seed(1))


def test_config_maps_to_gptj_options(hf_gptj):
    cfg = config_from_gptj(hf_gptj.config)
    assert (cfg.parallel_attn_mlp, cfg.positional, cfg.rotary_style, cfg.rotary_dim, cfg.d_head) == (
        True, "rotary", "interleaved", 6, 8)
    assert (cfg.unembed_bias, cfg.tied_unembed, cfg.act_fn) == (True, False, "gelu_new")


def test_logits_match_gptj(hf_gptj, tokens):
    cfg = config_from_gptj(hf_gptj.config)
    model = build(cfg, gptj_to_glassbox(hf_gptj.state_dict(), cfg))
    with torch.no_grad():
        expected = hf_gptj(tokens).logits
        got = model(tokens)
    assert expected.abs().max() > 1.0, "logits too small for the comparison to mean anything"
    # measured 1.7e-6 (values up to 5.4), bound 1e-5: 6x
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_half_pairing_does_not_match_gptj(hf_gptj, tokens):
    """The pairing convention is what the parity test proves: the other one is far off."""
    cfg = config_from_gptj(hf_gptj.config).replace(rotary_style="half")
    model = build(cfg, gptj_to_glassbox(hf_gptj.state_dict(), cfg))
    with torch.no_grad():
        assert (model(tokens) - hf_gptj(tokens).logits).abs().max() > 0.1


def test_every_layer_matches_gptj_hidden_states_and_attentions(hf_gptj, tokens):
    cfg = config_from_gptj(hf_gptj.config)
    model = build(cfg, gptj_to_glassbox(hf_gptj.state_dict(), cfg))
    acts = {}
    with torch.no_grad():
        out = hf_gptj(tokens, output_hidden_states=True, output_attentions=True)
        model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith(("resid_pre", "pattern")),
                                                 lambda x, hook: acts.__setitem__(hook.name, x))])
    for L in range(cfg.n_layers):
        # measured 1.3e-6 (values up to 10), bound 1e-5: 8x
        torch.testing.assert_close(acts[f"blocks.{L}.hook_resid_pre"], out.hidden_states[L], atol=1e-5, rtol=0,
                                   msg=lambda m, L=L: f"resid_pre of layer {L} differs from HF hidden_states[{L}]: {m}")
        # measured 4.5e-7 (probabilities); bound 5e-6, 11x
        torch.testing.assert_close(acts[f"blocks.{L}.attn.hook_pattern"], out.attentions[L], atol=5e-6, rtol=0,
                                   msg=lambda m, L=L: f"pattern of layer {L} differs from HF attentions[{L}]: {m}")


def test_round_trip_ours_gptj_ours_is_exact(hf_gptj):
    cfg = config_from_gptj(hf_gptj.config)
    ours = gptj_to_glassbox(hf_gptj.state_dict(), cfg)
    back = gptj_to_glassbox(glassbox_to_gptj(ours, cfg), cfg)
    assert set(back) == set(ours)
    for key in ours:
        assert torch.equal(back[key], ours[key]), key


def test_export_to_gptj_gives_same_logits(hf_gptj, tokens):
    from transformers import GPTJForCausalLM

    cfg = config_from_gptj(hf_gptj.config)
    torch.manual_seed(5)
    model = HookedTransformer(cfg).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("b_Q", "b_K", "b_V", "b_O")):
                param.zero_()  # GPT-J has no attention biases
            else:
                param.add_(0.2 * torch.randn_like(param))
    exported = GPTJForCausalLM(config_to_gptj(cfg)).eval()
    exported.load_state_dict(glassbox_to_gptj(model.state_dict(), cfg), strict=True)
    with torch.no_grad():  # measured 2.2e-6 (logits up to 5.8); bound 2e-5, 9x
        torch.testing.assert_close(exported(tokens).logits, model(tokens), atol=2e-5, rtol=0)


def test_export_refuses_attention_biases(hf_gptj):
    cfg = config_from_gptj(hf_gptj.config)
    state = gptj_to_glassbox(hf_gptj.state_dict(), cfg)
    state["blocks.1.attn.b_V"] = state["blocks.1.attn.b_V"] + 0.5
    with pytest.raises(ValueError, match=r"blocks\.1\.attn\.b_V is nonzero"):
        glassbox_to_gptj(state, cfg)
    with pytest.raises(ValueError, match="not a GPT-J-architecture config.*'parallel_attn_mlp': False"):
        config_to_gptj(cfg.replace(parallel_attn_mlp=False))


def test_model_level_from_hf_to_hf_and_folders(hf_gptj, tokens, tmp_path):
    from transformers import GPTJForCausalLM

    assert_round_trips(hf_gptj, GPTJForCausalLM, tokens, tmp_path)


def test_classic_preset_has_no_hf_export():
    from glassbox.models import preset_config

    model = HookedTransformer(preset_config("classic", d_model=24, n_layers=1, n_heads=3, d_vocab=29, n_ctx=19))
    with pytest.raises(ValueError, match="no Hugging Face architecture can represent this config"):
        model.to_hf()
