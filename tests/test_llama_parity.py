"""Parity with transformers.LlamaForCausalLM: RMSNorm, "half" rotary, SwiGLU, no biases, untied.

The oracle is Hugging Face's Llama on seeded random weights (every RMSNorm weight perturbed away
from 1, and weights large enough that attention is far from uniform, so a wrong rotary pairing or
norm cannot pass). Sizes are distinct: d_head 8 != d_model / n_heads 7 is allowed by Llama and
catches a head axis confused with d_model.
"""

import pytest
import torch

from conftest import assert_round_trips, perturb_vectors
from glassbox.models import HookedTransformer
from glassbox.weights.llama import (config_from_llama, config_to_llama, glassbox_to_llama,
                                    llama_to_glassbox)

SIZES = dict(hidden_size=21, num_attention_heads=3, head_dim=8, intermediate_size=37, vocab_size=29,
             num_hidden_layers=2, max_position_embeddings=19)


def make_hf_llama(seed=0, tied=False, rope_theta=500.0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**SIZES, initializer_range=0.3, tie_word_embeddings=tied, rms_norm_eps=1e-5,
                         rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
                         attn_implementation="eager", bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config)
    perturb_vectors(model)
    return model.eval()


def build(cfg, state):
    model = HookedTransformer(cfg, init=False)
    model.load_state_dict(state, strict=True)
    return model.eval()


@pytest.fixture(scope="module")
def hf_llama():
    return make_hf_llama()


@pytest.fixture
def tokens():
    return torch.randint(0, SIZES["vocab_size"], (3, 13), generator=torch.Generator().manual_seed(1))


def test_config_maps_to_llama_options(hf_llama):
    cfg = config_from_llama(hf_llama.config)
    assert (cfg.normalization, cfg.positional, cfg.rotary_style, cfg.gated_mlp, cfg.act_fn) == (
        "RMS", "rotary", "half", True, "silu")
    assert (cfg.use_bias, cfg.tied_unembed, cfg.d_head, cfg.rotary_dim, cfg.rotary_base) == (False, False, 8, 8, 500.0)


@pytest.mark.parametrize("tied", [False, True])
def test_logits_match_llama(tied, tokens):
    hf = make_hf_llama(tied=tied)
    cfg = config_from_llama(hf.config)
    model = build(cfg, llama_to_glassbox(hf.state_dict(), cfg))
    with torch.no_grad():
        expected = hf(tokens).logits
        got = model(tokens)
    assert expected.abs().max() > 1.0, "logits too small for the comparison to mean anything"
    # measured 4.8e-6 (logits up to 6.0); bound 5e-5, 10x
    torch.testing.assert_close(got, expected, atol=5e-5, rtol=0)


def test_every_layer_matches_llama_hidden_states_and_attentions(hf_llama, tokens):
    cfg = config_from_llama(hf_llama.config)
    model = build(cfg, llama_to_glassbox(hf_llama.state_dict(), cfg))
    acts = {}
    with torch.no_grad():
        out = hf_llama(tokens, output_hidden_states=True, output_attentions=True)
        model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith(("resid_pre", "pattern")),
                                                 lambda x, hook: acts.__setitem__(hook.name, x))])
    for L in range(cfg.n_layers):
        # measured 3.8e-6 (residual stream up to 12.8); bound 4e-5, 10x
        torch.testing.assert_close(acts[f"blocks.{L}.hook_resid_pre"], out.hidden_states[L], atol=4e-5, rtol=0,
                                   msg=lambda m, L=L: f"resid_pre of layer {L} differs from HF hidden_states[{L}]: {m}")
        # measured 3.6e-7 (probabilities); bound 4e-6, 11x
        torch.testing.assert_close(acts[f"blocks.{L}.attn.hook_pattern"], out.attentions[L], atol=4e-6, rtol=0,
                                   msg=lambda m, L=L: f"pattern of layer {L} differs from HF attentions[{L}]: {m}")


def test_left_padded_batch_matches_unpadded_rows(hf_llama):
    cfg = config_from_llama(hf_llama.config)
    model = build(cfg, llama_to_glassbox(hf_llama.state_dict(), cfg))
    row = torch.randint(0, 29, (1, 9), generator=torch.Generator().manual_seed(3))
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), row], dim=1)
    mask = torch.cat([torch.zeros(1, 4), torch.ones(1, 9)], dim=1)
    with torch.no_grad():
        # measured 3.0e-6 (logits up to 6.0); bound 3e-5, 10x
        torch.testing.assert_close(model(padded, attention_mask=mask)[:, 4:], hf_llama(row).logits, atol=3e-5, rtol=0)


def test_round_trip_ours_llama_ours_is_exact(hf_llama):
    cfg = config_from_llama(hf_llama.config)
    ours = llama_to_glassbox(hf_llama.state_dict(), cfg)
    back = llama_to_glassbox(glassbox_to_llama(ours, cfg), cfg)
    assert set(back) == set(ours)
    for key in ours:
        assert torch.equal(back[key], ours[key]), key


def test_export_to_llama_gives_same_logits(tokens):
    """A glassbox model with its own random weights, exported: transformers computes our logits."""
    from transformers import LlamaForCausalLM

    hf = make_hf_llama(seed=4)
    cfg = config_from_llama(hf.config)
    torch.manual_seed(5)
    model = HookedTransformer(cfg).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.2 * torch.randn_like(param))
    exported = LlamaForCausalLM(config_to_llama(cfg)).eval()
    exported.load_state_dict(glassbox_to_llama(model.state_dict(), cfg), strict=True)
    with torch.no_grad():  # measured 3.8e-6 (logits up to 6.3); bound 4e-5, 10x
        torch.testing.assert_close(exported(tokens).logits, model(tokens), atol=4e-5, rtol=0)


def test_refusals_name_the_problem(hf_llama):
    from transformers import LlamaConfig

    with pytest.raises(ValueError, match="grouped-query attention"):
        config_from_llama(LlamaConfig(**{**SIZES, "num_key_value_heads": 1}))
    with pytest.raises(ValueError, match="attention_bias=True"):
        config_from_llama(LlamaConfig(**SIZES, attention_bias=True))
    cfg = config_from_llama(hf_llama.config)
    with pytest.raises(ValueError, match="not a Llama-architecture config.*'use_bias': True"):
        config_to_llama(cfg.replace(use_bias=True))
    sd = dict(hf_llama.state_dict())
    sd["model.layers.1.mlp.up_proj.weight"] = sd["model.layers.1.mlp.up_proj.weight"][:-1]
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight has shape \(36, 21\), expected \(37, 21\)"):
        llama_to_glassbox(sd, cfg)


@pytest.mark.parametrize("tied", [False, True])
def test_model_level_from_hf_to_hf_and_folders(tied, tokens, tmp_path):
    """from_hf, to_hf, save_pretrained and from_pretrained dispatch on the Llama architecture."""
    from transformers import LlamaForCausalLM

    hf = make_hf_llama(seed=6, tied=tied)
    assert_round_trips(hf, LlamaForCausalLM, tokens, tmp_path)
    with torch.no_grad():  # the written folder is a real Llama folder for transformers too
        reloaded_by_hf = LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
        torch.testing.assert_close(reloaded_by_hf(tokens).logits, hf(tokens).logits, atol=0, rtol=0)


def test_modern_preset_exports_as_llama(tokens):
    from transformers import LlamaForCausalLM

    from glassbox.models import preset_config

    torch.manual_seed(0)
    model = HookedTransformer(preset_config("modern", d_model=21, n_layers=2, n_heads=3, d_head=8, d_vocab=29,
                                            n_ctx=19)).eval()
    exported = model.to_hf()
    assert isinstance(exported, LlamaForCausalLM)
    with torch.no_grad():
        # measured 1.1e-6 (values up to 3.1), bound 1e-5: 9x
        torch.testing.assert_close(exported(tokens).logits, model(tokens), atol=1e-5, rtol=0)
