"""hook_z SAEs against SAELens 6.54: the shapes every method takes and returns, and the values.

A hook_z SAE reads ``[... head d_head]`` and flattens the heads (head-major) to ``d_in = head * d_head``.
SAELens's ``encode`` takes the unflattened value, its ``decode`` and ``forward`` give it back unflattened
(``d_head`` remembered from the input encoded), and its hook points ``hook_sae_input`` and
``hook_sae_recons`` fire on the flattened values. glassbox must take and give the same shapes and
values, for every architecture that can read hook_z, with and without an input normalisation, on
inputs with one, two and three leading axes.
"""

import pytest
import torch
from sae_lens import SAE as LensSAE

from glassbox.interp.sae.architectures import make_sae
from glassbox.interp.sae.config import SAEConfig
from glassbox.interp.sae.format import save_sae

N_HEADS, D_HEAD, D_SAE = 3, 8, 41
D_IN = N_HEADS * D_HEAD
HOOK_Z = "blocks.1.attn.hook_z"
CASES = {
    "standard": ("standard", {}),
    "topk": ("topk", dict(k=5)),
    "topk_rescaled": ("topk", dict(k=5, rescale_acts_by_decoder_norm=True)),
    "jumprelu": ("jumprelu", {}),
    "gated": ("gated", {}),
    "constant_norm_rescale": ("standard", dict(normalize_activations="constant_norm_rescale")),
    "layer_norm": ("jumprelu", dict(normalize_activations="layer_norm")),
}
LEADING = [(), (5,), (3, 5), (2, 3, 4)]


def pair(case, seed, tmp_path):
    arch, kw = CASES[case]
    gb = make_sae(SAEConfig(arch, D_IN, D_SAE, HOOK_Z, reshape_activations="hook_z", **kw))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in gb.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.7)
            if name == "threshold":
                p.abs_()
    save_sae(gb, tmp_path / case)
    return gb, LensSAE.load_from_disk(str(tmp_path / case))


def cached(sae, x):
    """Every hook point's value in one encode + decode, and the decode's output."""
    seen = {}
    hooks = [(name, lambda t, hook, name=name: seen.__setitem__(name, t.detach().clone())) for name in
             ("hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons")]
    with torch.no_grad(), sae.hooks(fwd_hooks=hooks):
        out = sae.decode(sae.encode(x))
    return out, seen


@pytest.mark.parametrize("leading", LEADING, ids=[f"lead{len(s)}" for s in LEADING])
@pytest.mark.parametrize("case", list(CASES))
def test_shapes_and_values_are_saelens(tmp_path, case, leading):
    gb, lens = pair(case, 1, tmp_path)
    x = torch.randn(*leading, N_HEADS, D_HEAD, generator=torch.Generator().manual_seed(7)) * 2
    with torch.no_grad():
        acts_g, acts_l = gb.encode(x), lens.encode(x)
        assert acts_g.shape == acts_l.shape == (*leading, D_SAE)
        assert torch.equal(acts_g, acts_l)
        gb.encode(x), lens.encode(x)  # the normalisation coefficient of this input, for decode
        dec_g, dec_l = gb.decode(acts_l), lens.decode(acts_l)
        assert dec_g.shape == dec_l.shape == x.shape  # [... head d_head], not the flattened [... d_in]
        assert torch.equal(dec_g, dec_l)
        out_g, out_l = gb(x), lens(x)
        assert out_g.shape == out_l.shape == x.shape and torch.equal(out_g, out_l)
    (rec_g, seen_g), (rec_l, seen_l) = cached(gb, x), cached(lens, x)
    assert torch.equal(rec_g, rec_l)
    assert set(seen_g) == set(seen_l)
    for name in seen_g:
        assert seen_g[name].shape == seen_l[name].shape, name  # hook_sae_input, hook_sae_recons: flattened
        assert torch.equal(seen_g[name], seen_l[name]), name
    assert seen_g["hook_sae_recons"].shape == (*leading, D_IN)


def test_decode_before_any_encode_is_refused_as_saelens_refuses_it(tmp_path):
    """Neither knows d_head before an encode: SAELens fails inside einops, glassbox says why."""
    gb, lens = pair("standard", 0, tmp_path)
    acts = torch.rand(2, 5, D_SAE)
    with pytest.raises(Exception):
        lens.decode(acts)
    with pytest.raises(ValueError, match=rf"hook_z SAE at {HOOK_Z}.*d_head.*encode"):
        gb.decode(acts)


def test_flattened_input_is_refused_by_both(tmp_path):
    gb, lens = pair("standard", 0, tmp_path)
    flat = torch.randn(2, 5, D_IN)
    with pytest.raises(Exception):
        lens.encode(flat)
    with pytest.raises(ValueError, match=rf"SAE at {HOOK_Z} reads d_in={D_IN}"):
        gb.encode(flat)
