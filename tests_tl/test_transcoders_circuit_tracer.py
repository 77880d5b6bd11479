"""Transcoder folders written by glassbox load in circuit-tracer 0.5's own loaders with equal outputs, and
folders circuit-tracer writes (``to_safetensors`` plus its cache's ``config.yaml``) load in glassbox.

Skipped where circuit-tracer is not importable (``.tlenv`` has no circuit-tracer; its own environment,
or ``PYTHONPATH`` holding the unpacked 0.5.0 wheel, runs it). Only circuit-tracer's ``transcoder``
modules are imported (its Hub helpers need another huggingface_hub)."""

import pytest
import torch
import yaml

slt = pytest.importorskip("circuit_tracer.transcoder.single_layer_transcoder")
clt_mod = pytest.importorskip("circuit_tracer.transcoder.cross_layer_transcoder")

from glassbox.interp.transcoders import load_circuit_tracer, save_circuit_tracer, seeded_set  # noqa: E402

N, D, F = 3, 24, 37
CPU = torch.device("cpu")


def _ct_per_layer(folder):
    paths = {l: str(folder / f"layer_{l}.safetensors") for l in range(N)}
    return slt.load_transcoder_set(paths, scan="test", feature_input_hook="mlp.hook_in",
                                   feature_output_hook="hook_mlp_out", device=CPU, dtype=torch.float32,
                                   lazy_encoder=False, lazy_decoder=False)


@pytest.mark.parametrize("kind", [dict(), dict(skip=True), dict(activation="jumprelu"),
                                  dict(activation="jumprelu", skip=True)], ids=str)
def test_per_layer_set_loads_in_circuit_tracer_with_equal_outputs(tmp_path, kind):
    ts = seeded_set(N, D, F, seed=1, bias=-0.5, **kind)
    save_circuit_tracer(ts, tmp_path / "tc")
    ct = _ct_per_layer(tmp_path / "tc")
    assert ct.skip_connection == ts.skip
    x = torch.randn(N, 6, D, generator=torch.Generator().manual_seed(2))
    recon = ts.reconstruct({l: x[l] for l in range(N)})
    with torch.no_grad():
        for l in range(N):
            acts = ct.encode_layer(x[l], l)
            assert int((acts != 0).sum()) > 0
            # F.linear (addmm) against matmul + add: measured max |diff| 4.8e-7 (values up to 2.2); bound 2e-6
            torch.testing.assert_close(acts, ts.encode(l, x[l]), rtol=0, atol=2e-6)
            torch.testing.assert_close(ct[l](x[l]), recon[l], rtol=0, atol=2e-6)


@pytest.mark.parametrize("activation", ["relu", "jumprelu"])
def test_cross_layer_set_loads_in_circuit_tracer_with_equal_outputs(tmp_path, activation):
    ts = seeded_set(N, D, F, seed=3, bias=-0.5, cross_layer=True, activation=activation, input_hook="hook_resid_mid")
    save_circuit_tracer(ts, tmp_path / "clt")
    ct = clt_mod.load_clt(str(tmp_path / "clt"), feature_input_hook="hook_resid_mid", device=CPU,
                          dtype=torch.float32, lazy_decoder=False)
    x = torch.randn(N, 6, D, generator=torch.Generator().manual_seed(4))
    recon = ts.reconstruct({l: x[l] for l in range(N)})
    with torch.no_grad():  # measured max |diff| 7.2e-7 (values up to 3.4); bound 2e-6
        for l in range(N):
            torch.testing.assert_close(ct.encode_layer(x[l], l), ts.encode(l, x[l]), rtol=0, atol=2e-6)
        got = ct.decode(ct.encode(x).to_sparse())
        for l in range(N):
            torch.testing.assert_close(got[l], recon[l], rtol=0, atol=2e-6)


def test_folders_circuit_tracer_writes_load_in_glassbox(tmp_path):
    ts = seeded_set(N, D, F, seed=5, bias=-0.5, activation="jumprelu", skip=True)
    save_circuit_tracer(ts, tmp_path / "gb")
    ct = _ct_per_layer(tmp_path / "gb")
    ct.to_safetensors(str(tmp_path / "ct"))
    config = {"model_kind": "transcoder_set", "feature_input_hook": "mlp.hook_in",
              "feature_output_hook": "hook_mlp_out", "scan": "test"}
    (tmp_path / "ct" / "config.yaml").write_text(yaml.dump(config))
    back = load_circuit_tracer(tmp_path / "ct")
    for key, value in ts.state_dict().items():
        assert torch.equal(value, back.state_dict()[key]), key
    clt = seeded_set(N, D, F, seed=6, cross_layer=True, activation="jumprelu", input_hook="hook_resid_mid")
    save_circuit_tracer(clt, tmp_path / "gbclt")
    ct = clt_mod.load_clt(str(tmp_path / "gbclt"), device=CPU, dtype=torch.float32, lazy_decoder=False)
    ct.to_safetensors(str(tmp_path / "ctclt"))
    config.update(model_kind="cross_layer_transcoder", feature_input_hook="hook_resid_mid")
    (tmp_path / "ctclt" / "config.yaml").write_text(yaml.dump(config))
    back = load_circuit_tracer(tmp_path / "ctclt")
    for key, value in clt.state_dict().items():
        assert torch.equal(value, back.state_dict()[key]), key
