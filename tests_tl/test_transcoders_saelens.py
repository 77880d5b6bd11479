"""A TranscoderSet written as SAELens transcoder folders loads in SAELens 6.54 (``SAE.load_from_disk``) with
each layer's encode and forward equal to the set's bit for bit; SAELens-written folders load as a set."""

import pytest
import torch
from sae_lens import SAE as LensSAE

from glassbox.interp.transcoders import load_saelens_set, save_saelens_set, seeded_set

N, D, F = 3, 24, 37


@pytest.mark.parametrize("kind", [dict(), dict(skip=True), dict(activation="jumprelu"),
                                  dict(activation="jumprelu", skip=True)], ids=str)
def test_glassbox_set_loads_in_saelens_with_equal_outputs(tmp_path, kind):
    ts = seeded_set(N, D, F, seed=1, input_hook="ln2.hook_normalized", bias=-0.5, **kind)
    save_saelens_set(ts, tmp_path / "set")
    x = torch.randn(6, D, generator=torch.Generator().manual_seed(2))
    recon = ts.reconstruct({l: x for l in range(N)})
    for l in range(N):
        lens = LensSAE.load_from_disk(str(tmp_path / "set" / f"layer_{l}")).eval()
        assert lens.cfg.metadata.hook_name == f"blocks.{l}.ln2.hook_normalized"
        assert lens.cfg.metadata.hook_name_out == f"blocks.{l}.hook_mlp_out"
        with torch.no_grad():
            acts = lens.encode(x)
            assert int((acts != 0).sum()) > 0
            assert torch.equal(acts, ts.encode(l, x).detach()), f"layer {l} encode"
            assert torch.equal(lens(x), recon[l].detach()), f"layer {l} forward"
    # and the folders SAELens reads load back as the same set
    back = load_saelens_set(tmp_path / "set")
    for key, value in ts.state_dict().items():
        assert torch.equal(value, back.state_dict()[key]), key


def test_saelens_written_folders_load_as_a_set(tmp_path):
    ts = seeded_set(N, D, F, seed=3, input_hook="ln2.hook_normalized", activation="jumprelu", skip=True)
    save_saelens_set(ts, tmp_path / "gb")
    folders = []
    for l in range(N):
        lens = LensSAE.load_from_disk(str(tmp_path / "gb" / f"layer_{l}"))
        lens.save_model(str(tmp_path / "lens" / f"tc{N - l}"))  # any names: the layer is the hook's
        folders.append(tmp_path / "lens" / f"tc{N - l}")
    back = load_saelens_set(tmp_path / "lens")
    x = torch.randn(5, D, generator=torch.Generator().manual_seed(4))
    for l in range(N):
        assert torch.equal(back.reconstruct({l: x})[l], ts.reconstruct({l: x})[l])
