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
