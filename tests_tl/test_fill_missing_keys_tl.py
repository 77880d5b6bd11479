"""``loading_from_pretrained.fill_missing_keys`` against TransformerLens 3.9's, on the same config.

Each model's own key names (glassbox's ``unembed.W_U_T`` is TransformerLens's ``unembed.W_U``); the
behaviour per kind of missing key must agree: an attention or MLP matrix refused with a ValueError
naming it, another weight matrix or a norm's w / b filled with the model's tensor and a warning naming
the key, nothing missing returns the dict as it was.
"""

import logging

import pytest
import torch

import glassbox.tl as gtl
import transformer_lens as TL
from glassbox.tl.loading_from_pretrained import fill_missing_keys as ours_fill
from transformer_lens.loading_from_pretrained import fill_missing_keys as theirs_fill

FIELDS = dict(d_model=24, d_head=8, n_heads=3, n_ctx=16, n_layers=2, d_vocab=97, d_mlp=40, act_fn="gelu_new",
              device="cpu")


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    return (gtl.HookedTransformer(gtl.HookedTransformerConfig(**FIELDS)),
            TL.HookedTransformer(TL.HookedTransformerConfig(**FIELDS)))


def filled(fill, model, drop, caplog):
    full = model.state_dict()
    partial = {k: v for k, v in full.items() if k not in drop}
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        out = fill(model, partial)
    assert out is partial and set(out) == set(full)
    for key in drop:
        assert out[key] is full[key] or torch.equal(out[key], full[key]), key
    return sorted(r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("drop", [["embed.W_E", "pos_embed.W_pos"], ["blocks.1.ln1.w", "ln_final.b"], []])
def test_filled_keys_and_warnings_agree(pair, drop, caplog):
    ours, theirs = pair
    assert filled(ours_fill, ours, drop, caplog) == filled(theirs_fill, theirs, drop, caplog)
    assert len(filled(ours_fill, ours, drop, caplog)) == len(drop)  # one warning per key, each naming it


@pytest.mark.parametrize("matrix", ["attn.W_Q", "attn.W_O", "mlp.W_in", "mlp.W_out"])
def test_a_missing_attention_or_mlp_matrix_is_refused_by_both(pair, matrix):
    for model, fill in zip(pair, (ours_fill, theirs_fill)):
        partial = {k: v for k, v in model.state_dict().items() if k != f"blocks.0.{matrix}"}
        with pytest.raises(ValueError, match=rf"blocks\.0\.{matrix}"):
            fill(model, partial)
        assert f"blocks.0.{matrix}" not in partial  # nothing was filled before the refusal


def test_bad_arguments_are_type_errors(pair):
    with pytest.raises(TypeError, match="state_dict must be a dict"):
        ours_fill(pair[0], [("embed.W_E", torch.zeros(1))])
    with pytest.raises(TypeError, match="model must be a torch module"):
        ours_fill("gpt2", {})
