"""glassbox.tl's from_pretrained, with TransformerLens's processing defaults, on the new families: each
default step runs where it is exact (fold_ln on sandwich and output-norm models, fold_value_biases on
Qwen2 by giving it a b_O) and is skipped with a warning where it is not (center_unembed under Gemma 2's
logit soft cap, centring writers through post-norms); the log-probabilities equal transformers'."""

import warnings

import pytest
import torch

from test_gemma_parity import make_hf_gemma2
from test_olmo2_parity import make_hf_olmo2
from test_qwen_parity import make_hf_qwen2

FACTORIES = {"gemma2": make_hf_gemma2, "qwen2": make_hf_qwen2, "olmo2": make_hf_olmo2}


@pytest.mark.parametrize("family", sorted(FACTORIES))
def test_default_processing_keeps_the_log_probs(family, tmp_path):
    from glassbox.tl import HookedTransformer

    hf = FACTORIES[family]()
    hf.save_pretrained(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = HookedTransformer.from_pretrained(str(tmp_path))
    skipped = " ".join(str(w.message) for w in caught)
    steps = set(model.processing)
    assert "fold_ln" in steps
    if family == "gemma2":
        assert "center_unembed" not in steps and "soft-caps its logits" in skipped
    if family == "qwen2":
        assert "fold_value_biases" in steps and model.cfg.glassbox.attn_out_bias
    tokens = torch.randint(0, hf.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = hf(tokens).logits.log_softmax(-1)
        got = model(tokens).log_softmax(-1)
    # measured <= 3.4e-5 (Qwen2; log-probs down to -14), bound 3e-4: 9x
    torch.testing.assert_close(got, expected, atol=3e-4, rtol=0)


def test_a_yarn_model_rebuilt_from_its_transformer_lens_config_is_the_same_model():
    """A YaRN config without attention_factor (transformers then derives 0.1 ln(factor) + 1) reaches the
    TransformerLens fields with that factor, so HookedTransformerConfig(**cfg.to_dict()) rebuilds it."""
    import transformers

    from glassbox.tl import HookedTransformer, HookedTransformerConfig

    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=37, hidden_size=32, intermediate_size=19, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, rope_parameters=dict(rope_type="yarn", factor=4.0, rope_theta=500.0,
                                                         original_max_position_embeddings=16))).double().eval()
    model = HookedTransformer.from_pretrained_no_processing("yarn", hf_model=hf, dtype=torch.float64)
    fields = model.cfg.to_dict()
    assert fields["use_yarn_rope"] and fields["yarn_factor"] == 4.0
    rebuilt = HookedTransformer(HookedTransformerConfig(**fields))
    rebuilt.load_and_process_state_dict(model.state_dict(), fold_ln=False, center_writing_weights=False,
                                        center_unembed=False, fold_value_biases=False)
    tokens = torch.randint(0, 37, (1, 40), generator=torch.Generator().manual_seed(1))  # past the original 16
    with torch.no_grad():
        assert torch.equal(rebuilt(tokens), model(tokens))
