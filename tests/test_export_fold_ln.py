"""Exporting a model loaded with ``fold_ln=True`` to GPT-2: folding moves ln_final's bias into a new
unembedding bias (``unembed_bias=True``), which GPT-2's lm_head cannot hold. The refusal names that
bias and the step that added it, not the architecture."""

import pytest

from glassbox import HookedTransformer
from glassbox.weights import save_pretrained, to_hf
from glassbox.weights.gpt2 import config_to_hf


def test_exporting_a_folded_gpt2_names_the_unembedding_bias_fold_ln_added(tmp_path):
    model = HookedTransformer.from_pretrained("glassbox-austen", fold_ln=True)
    assert model.cfg.unembed_bias
    for export in (lambda: to_hf(model), lambda: save_pretrained(model, tmp_path / "out")):
        with pytest.raises(ValueError) as err:
            export()
        message = str(err.value)
        assert "fold_ln" in message and "unembed_bias" in message and "gpt2" in message, message
        assert "only GPT-2-architecture configs" not in message, message
    assert not (tmp_path / "out").exists()


def test_the_gpt2_refusal_names_each_option_it_cannot_hold():
    cfg = HookedTransformer.from_pretrained("glassbox-austen").cfg
    with pytest.raises(ValueError, match=r"not a GPT-2-architecture config: \{'unembed_bias': True\}"):
        config_to_hf(cfg.replace(unembed_bias=True))
    with pytest.raises(ValueError, match=r"not a GPT-2-architecture config: \{'normalization': 'RMS'"):
        config_to_hf(cfg.replace(normalization="RMS"))


def test_processing_that_keeps_the_architecture_still_exports():
    model = HookedTransformer.from_pretrained("glassbox-austen", center_writing_weights=True)
    assert type(to_hf(model)).__name__ == "GPT2LMHeadModel"
