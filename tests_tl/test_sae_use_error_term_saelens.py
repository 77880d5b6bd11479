"""The SAE's own ``use_error_term`` (SAELens's attribute, False by default): SAELens's ``add_sae`` and
``saes`` take it when their ``use_error_term`` is None, and its ``SAE.forward`` adds the error term
``x - decode(encode(x))``. glassbox must do the same rather than ignore the attribute (which would
splice without the error term where SAELens splices with it)."""

import torch
from sae_lens import SAE as LensSAE
from sae_lens import HookedSAETransformer

from glassbox.interp.sae.architectures import make_sae
from glassbox.interp.sae.config import SAEConfig
from glassbox.interp.sae.format import save_sae
from tl_oracle import max_diff, tiny_gpt2, tl_twin, tokens

HOOK = "blocks.1.hook_resid_pre"


def pair(tmp_path, **kw):
    gb = make_sae(SAEConfig("standard", 24, 37, HOOK, **kw))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in gb.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    save_sae(gb, tmp_path / "sae")
    return gb, LensSAE.load_from_disk(str(tmp_path / "sae")).eval()


def test_the_sae_attribute_is_read_as_saelens_reads_it(tmp_path):
    model = tiny_gpt2(0, n_heads=3, d_head=8)
    twin = tl_twin(model)
    lens_model = HookedSAETransformer(twin.cfg, move_to_device=False, tokenizer=twin.tokenizer)
    lens_model.load_state_dict(twin.state_dict(), strict=False)
    gb, lens = pair(tmp_path)
    assert gb.use_error_term is False and lens.use_error_term is False
    gb.use_error_term, lens.use_error_term = True, True
    toks = tokens(model, batch=2, pos=7)
    with torch.no_grad():
        clean, lens_clean = model(toks), lens_model(toks)
        model.add_sae(gb)
        lens_model.add_sae(lens)
        ours, theirs = model(toks), lens_model(toks)
        model.reset_saes()
        lens_model.reset_saes()
        with model.saes([gb]):
            ours_block = model(toks)
        with lens_model.saes([lens]):
            theirs_block = lens_model(toks)
    # both spliced with the error term: each its clean model (glassbox exactly; SAELens within its rounding of
    # recons + (x - recons): measured 1.4e-6, bound 1e-5); between the two models: measured 2.1e-6, bound 4e-5
    # (measure_sae_splice.py's sweep: 9.4e-6)
    assert torch.equal(ours, clean) and torch.equal(ours_block, clean)
    assert max_diff(theirs, lens_clean) <= 1e-5 and max_diff(theirs_block, lens_clean) <= 1e-5
    assert max_diff(ours, theirs) <= 4e-5
    with torch.no_grad():
        model.add_sae(gb, use_error_term=False)  # an explicit argument wins, as in SAELens
        assert max_diff(model(toks), clean) > 0.05  # measured 7.2
        model.reset_saes()


def test_forward_adds_the_error_term_as_saelens(tmp_path):
    gb, lens = pair(tmp_path)
    x = torch.randn(3, 5, 24, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(gb(x), lens(x))  # off: the reconstruction
        gb.use_error_term, lens.use_error_term = True, True
        assert torch.equal(gb(x), lens(x))  # on: recons + (x - recons), the same float32 operations
        assert max_diff(gb(x), x) <= 4e-6  # recons + (x - recons) rounds: measured 2.4e-7 (x up to 3.4)
