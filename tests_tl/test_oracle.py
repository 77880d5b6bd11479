"""The twin is faithful: TransformerLens 3.9 on glassbox's weights gives glassbox's logits.

Every other test in this folder compares against ``tl_twin``; this one shows the twin computes the
same model (and that a planted difference in one weight is seen), so those comparisons mean
something.
"""

import pytest
import torch

from tl_oracle import max_diff, tiny_model, tl_twin, tokens

CONFIGS = {
    "gpt2": {},
    "rms_rotary_gated": dict(normalization="RMS", positional="rotary", gated_mlp=True, act_fn="silu",
                             use_bias=False, tied_unembed=False),
    "parallel_interleaved": dict(parallel_attn_mlp=True, positional="rotary", rotary_dim=4,
                                 rotary_style="interleaved"),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_twin_logits_equal_glassbox(name):
    model = tiny_model(0, **CONFIGS[name])
    twin = tl_twin(model)
    toks = tokens(model, 2, 12)
    with torch.no_grad():
        ours, theirs = model(toks), twin(toks)
    assert ours.shape == theirs.shape
    # measured up to 2.8e-6 (logits up to 5.4) across the configs, bound 3e-5: 11x
    assert max_diff(ours, theirs) < 3e-5


def test_twin_sees_a_changed_weight():
    model = tiny_model(0)
    twin = tl_twin(model)
    with torch.no_grad():
        twin.blocks[1].attn.W_Q[0] *= 1.01
    toks = tokens(model, 2, 12)
    with torch.no_grad():
        assert max_diff(model(toks), twin(toks)) > 1e-3
