"""TranscoderSet: per-layer sets equal glassbox's interp.sae transcoders bit for bit; cross-layer
reconstruction equals a hand einsum; JumpReLU and TopK against hand computations; bad input refused."""

import pytest
import torch

from glassbox.interp.sae import SAEConfig, make_sae
from glassbox.interp.transcoders import TranscoderSet, from_saes, to_saes

# distinct sizes so that a swapped axis cannot pass
N_LAYERS, D_MODEL, D_T = 3, 7, 11


def _saes(architecture, seed=0, n_layers=N_LAYERS, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    out = []
    for l in range(n_layers):
        cfg = SAEConfig(architecture=architecture, d_in=D_MODEL, d_sae=D_T, hook_name=f"blocks.{l}.ln2.hook_out",
                        hook_name_out=f"blocks.{l}.hook_mlp_out", apply_b_dec_to_input=False, d_out=D_MODEL)
        sae = make_sae(cfg, dtype=dtype)
        with torch.no_grad():
            for p in sae.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(dtype))
            if hasattr(sae, "threshold"):
                sae.threshold.copy_(torch.rand(D_T, generator=g, dtype=torch.float64).to(dtype) * 0.5)
        out.append(sae)
    return out


def _inputs(seed=1, shape=(2, 5), dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return {l: torch.randn(*shape, D_MODEL, generator=g, dtype=torch.float64).to(dtype) for l in range(N_LAYERS)}


@pytest.mark.parametrize("architecture", ["transcoder", "skip_transcoder", "jumprelu_transcoder",
                                          "jumprelu_skip_transcoder"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_per_layer_set_equals_the_sae_transcoders_bit_for_bit(architecture, dtype):
    saes = _saes(architecture, dtype=dtype)
    ts = from_saes(saes)
    assert (ts.n_layers, ts.d_model, ts.d_transcoder, ts.cross_layer) == (N_LAYERS, D_MODEL, D_T, False)
    assert ts.skip == ("skip" in architecture)
    assert ts.feature_input_hook(2) == "blocks.2.ln2.hook_out" and ts.feature_output_hook(1) == "blocks.1.hook_mlp_out"
    x = _inputs(dtype=dtype)
    recon = ts.reconstruct(x)
    for l, sae in enumerate(saes):
        with torch.no_grad():
            assert torch.equal(ts.encode(l, x[l]), sae.encode(x[l])), f"layer {l} encode"
            assert torch.equal(recon[l], sae(x[l])), f"layer {l} reconstruction"
        assert ts.decoder_weights(l).shape == (D_T, 1, D_MODEL)
        assert torch.equal(ts.b_dec(l), sae.b_dec)
    # and back: to_saes gives transcoders computing the same
    for l, sae in enumerate(to_saes(ts)):
        with torch.no_grad():
            assert torch.equal(sae(x[l]), saes[l](x[l]))


def test_negative_sae_threshold_is_raised_to_zero_and_computes_the_same():
    saes = _saes("jumprelu_transcoder")
    with torch.no_grad():
        saes[0].threshold[:5] = -0.3
    ts = from_saes(saes)
    x = _inputs(shape=(40,))
    # the SAELens form relu(pre) * (pre > t) and the set's pre * (pre > max(t, 0)) agree
    assert torch.equal(ts.encode(0, x[0]), saes[0].encode(x[0]).detach())
    assert float(ts.threshold(0).detach().min()) == 0.0


def _cross_layer(seed=2, skip=False, activation="relu", dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    kwargs = {}
    if activation == "jumprelu":
        kwargs["threshold"] = torch.rand(N_LAYERS, D_T, generator=g, dtype=torch.float64).to(dtype)
    if activation == "topk":
        kwargs["k"] = 3
    return TranscoderSet(r(N_LAYERS, D_MODEL, D_T), r(N_LAYERS, D_T), [r(D_T, N_LAYERS - s, D_MODEL) for s in range(N_LAYERS)],
                         r(N_LAYERS, D_MODEL), input_hook="hook_resid_mid", W_skip=r(N_LAYERS, D_MODEL, D_MODEL) if skip else None,
                         activation=activation, **kwargs)


@pytest.mark.parametrize("skip", [False, True])
def test_cross_layer_reconstruction_equals_a_hand_einsum(skip):
    ts = _cross_layer(skip=skip)
    assert ts.cross_layer and ts.skip == skip
    assert [ts.decoder_weights(s).shape[1] for s in range(N_LAYERS)] == [3, 2, 1]
    assert list(ts.targets(1)) == [1, 2]
    x = _inputs(dtype=torch.float64)
    recon = ts.reconstruct(x)
    W_enc, b_enc = ts.encoder.detach(), ts.encoder_bias.detach()
    for t in range(N_LAYERS):
        want = ts.decoder_bias[t].detach().clone()
        for s in range(t + 1):
            acts = torch.einsum("bpd,df->bpf", x[s], W_enc[s]).add(b_enc[s]).relu()
            want = want + torch.einsum("bpf,fd->bpd", acts, ts.decoders[s].detach()[:, t - s, :])
        if skip:
            want = want + torch.einsum("bpd,ed->bpe", x[t], ts.skip_weights.detach()[t])
        # float64: measured max |diff| 7.1e-15 (values up to 33); bound 1e-12
        torch.testing.assert_close(recon[t], want, rtol=0, atol=1e-12, msg=f"target layer {t}")
    # a prefix only: layers 0..1 give the targets 0..1, exactly as from all three
    part = ts.reconstruct({0: x[0], 1: x[1]})
    assert sorted(part) == [0, 1] and torch.equal(part[1], recon[1])
    with pytest.raises(ValueError, match="without layer 0"):
        ts.reconstruct({1: x[1]})


def test_jumprelu_and_topk_against_hand_computations():
    ts = _cross_layer(activation="jumprelu")
    pre = torch.tensor([[-0.5, 0.2, 0.9, 0.31, 2.0, -3.0, 0.0, 0.7, 0.05, 1.1, -0.01]], dtype=torch.float64)
    thr = ts.threshold(1).detach()
    want = torch.where(pre > thr, pre, torch.zeros_like(pre))
    assert torch.equal(ts.activate(1, pre), want)
    with torch.no_grad():
        ts.thresholds[1] = -0.2  # circuit-tracer's form passes pre in (-0.2, 0]
    assert ts.activate(1, pre)[0, 10].item() == -0.01 and ts.activate(1, pre)[0, 0].item() == 0.0
    tk = _cross_layer(activation="topk")
    got = tk.activate(0, pre)
    # the 3 largest are 2.0, 1.1, 0.9 (indices 4, 9, 2)
    want = torch.zeros_like(pre)
    want[0, [4, 9, 2]] = torch.tensor([2.0, 1.1, 0.9], dtype=torch.float64)
    assert torch.equal(got, want)
    # fewer positive than k: the kept negatives are ReLU'd to 0 (SAELens's TopK)
    neg = -torch.arange(1, D_T + 1, dtype=torch.float64)[None]
    neg[0, 5] = 0.5
    out = tk.activate(0, neg)
    assert out[0, 5].item() == 0.5 and int((out != 0).sum()) == 1


def test_to_moves_and_casts():
    ts = _cross_layer(skip=True, activation="jumprelu", dtype=torch.float32)
    x = _inputs(dtype=torch.float64)
    ts64 = ts.to("cpu", torch.float64)
    assert ts64 is ts and ts.dtype == torch.float64 and ts.thresholds.dtype == torch.float64
    assert ts.W_skip(0).dtype == torch.float64 and ts.reconstruct(x)[2].dtype == torch.float64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_equals_cpu():
    ts = _cross_layer(skip=True, activation="jumprelu")
    x = _inputs(dtype=torch.float64)
    cpu = ts.reconstruct(x)
    ts.to("cuda")
    gpu = ts.reconstruct({l: v.cuda() for l, v in x.items()})
    for t in cpu:
        assert gpu[t].device.type == "cuda"
        torch.testing.assert_close(gpu[t].cpu(), cpu[t], rtol=0, atol=1e-10)


def test_bad_construction_is_refused_naming_what():
    g = torch.Generator().manual_seed(0)
    W_enc, b_enc = torch.randn(2, 4, 6, generator=g), torch.zeros(2, 6)
    W_dec, b_dec = torch.randn(2, 6, 4, generator=g), torch.zeros(2, 4)
    TranscoderSet(W_enc, b_enc, W_dec, b_dec, input_hook="ln2.hook_out")
    with pytest.raises(ValueError, match="b_enc has shape"):
        TranscoderSet(W_enc, torch.zeros(2, 5), W_dec, b_dec, input_hook="ln2.hook_out")
    with pytest.raises(ValueError, match=r"W_dec\[1\] has shape"):
        TranscoderSet(W_enc, b_enc, [torch.zeros(6, 2, 4), torch.zeros(6, 2, 4)], b_dec, input_hook="ln2.hook_out")
    bad = W_dec.clone()
    bad[1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match=r"W_dec\[1\] holds 1 non-finite value \(NaN; the first at index \(2, 0, 3\)"):
        TranscoderSet(W_enc, b_enc, bad, b_dec, input_hook="ln2.hook_out")
    with pytest.raises(ValueError, match="threshold holds"):
        TranscoderSet(W_enc, b_enc, W_dec, b_dec, input_hook="ln2.hook_out", activation="jumprelu",
                      threshold=torch.full((2, 6), float("inf")))
    with pytest.raises(ValueError, match="input_hook='ln2.hook_outt' is not a per-block hook.*did you mean 'ln2.hook_out'"):
        TranscoderSet(W_enc, b_enc, W_dec, b_dec, input_hook="ln2.hook_outt")
    with pytest.raises(ValueError, match="needs an int k in"):
        TranscoderSet(W_enc, b_enc, W_dec, b_dec, input_hook="ln2.hook_out", activation="topk", k=7)
    with pytest.raises(ValueError, match="threshold .* is for activation='jumprelu'"):
        TranscoderSet(W_enc, b_enc, W_dec, b_dec, input_hook="ln2.hook_out", threshold=torch.zeros(2, 6))
    ts = TranscoderSet(W_enc, b_enc, W_dec, b_dec, input_hook="ln2.hook_out")
    with pytest.raises(ValueError, match="reads blocks.1.ln2.hook_out with d_model=4"):
        ts.encode(1, torch.zeros(3, 5))
    with pytest.raises(ValueError, match=r"layer must be an int in \[0, n_layers=2\)"):
        ts.encode(2, torch.zeros(3, 4))


def test_from_saes_refuses_mismatched_transcoders():
    saes = _saes("transcoder")
    with pytest.raises(ValueError, match="transcoder 1 reads 'blocks.2"):
        from_saes([saes[0], saes[2]])
    mixed = _saes("transcoder", n_layers=2) + _saes("skip_transcoder")[2:]
    with pytest.raises(ValueError, match="transcoder 2 is a 'skip_transcoder'; transcoder 0 is a 'transcoder'"):
        from_saes(mixed)
    sae = make_sae(SAEConfig(architecture="standard", d_in=D_MODEL, d_sae=D_T, hook_name="blocks.0.hook_resid_pre"))
    with pytest.raises(TypeError, match="not a glassbox transcoder"):
        from_saes([sae])


def test_to_saes_refuses_what_saelens_cannot_hold():
    with pytest.raises(ValueError, match="cross-layer"):
        to_saes(_cross_layer())
    saes = _saes("jumprelu_transcoder")
    ts = from_saes(saes)
    with torch.no_grad():
        ts.thresholds[2, 4] = -0.1
    with pytest.raises(ValueError, match="threshold of layer 2, feature 4 is -0.1 < 0"):
        to_saes(ts)


def test_check_fits_names_the_missing_hook_and_sizes():
    from glassbox import HookedTransformer
    from glassbox.models import Config

    model = HookedTransformer(Config(n_layers=N_LAYERS, d_model=D_MODEL, n_heads=1, d_head=D_MODEL, d_mlp=13,
                                     d_vocab=17, n_ctx=8))
    from_saes(_saes("transcoder")).check_fits(model)
    with pytest.raises(ValueError, match="the transcoder set has 2 layers; the model has n_layers=3"):
        from_saes(_saes("transcoder", n_layers=2)).check_fits(model)
