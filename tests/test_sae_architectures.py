"""SAE architectures against hand computations (einsum and per-position loops written here)."""

import pytest
import torch

from glassbox.interp.sae.architectures import (ARCHITECTURES, BatchTopKSAE, GatedSAE, JumpReLUSAE,
                                               JumpReLUSkipTranscoder, JumpReLUTranscoder, SkipTranscoder,
                                               TopKSAE, Transcoder, batch_topk, make_sae, sae_class)
from glassbox.interp.sae.base import StandardSAE
from glassbox.interp.sae.config import SAEConfig

D_IN, D_SAE, D_OUT = 7, 23, 11
HOOK = "blocks.0.hook_resid_pre"
TC = dict(hook_name="blocks.0.ln2.hook_normalized", hook_name_out="blocks.0.hook_mlp_out",
          apply_b_dec_to_input=False, d_out=D_OUT)


def randomize(sae, seed=0, scale_dec=True):
    """Every parameter random (decoder rows of varied norms), so no term can be missing unseen."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype) * 0.5)
        if scale_dec:
            sae.W_dec.mul_(torch.rand(sae.W_dec.shape[0], 1, generator=g, dtype=torch.float64).to(sae.dtype) * 3 + 0.2)
    return sae


def make(arch, dtype=torch.float64, seed=0, **kw):
    base = dict(architecture=arch, d_in=D_IN, d_sae=D_SAE, hook_name=HOOK)
    if arch in ("transcoder", "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder"):
        base.update(TC)
    base.update(kw)
    return randomize(make_sae(SAEConfig(**base), dtype=dtype), seed)


def x_in(shape=(3, 5, D_IN), seed=1):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def pre_by_hand(sae, x, W=None, b=None):
    sae_in = x - sae.b_dec if sae.cfg.apply_b_dec_to_input else x
    W = sae.W_enc if W is None else W
    b = sae.b_enc if b is None else b
    return torch.einsum("bpi,if->bpf", sae_in, W) + b


def dec_by_hand(sae, acts):
    return torch.einsum("bpf,fo->bpo", acts, sae.W_dec) + sae.b_dec


def test_registry_has_saelens_inference_names_and_refuses_unknown():
    assert set(ARCHITECTURES) == {"standard", "topk", "batchtopk", "jumprelu", "gated", "transcoder",
                                  "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder"}
    assert sae_class("topk") is TopKSAE and sae_class("standard") is StandardSAE
    with pytest.raises(ValueError, match="unknown SAE architecture 'matryoshka'.*topk"):
        sae_class("matryoshka")
    with pytest.raises(TypeError, match="SAEConfig"):
        make_sae({"architecture": "topk"})


@torch.no_grad()
def test_standard_by_hand():
    sae, x = make("standard"), x_in()
    acts = sae.encode(x)
    want = pre_by_hand(sae, x).clamp_min(0)
    assert torch.equal(acts, want)
    # measured 0 (values up to 31), bound 1e-13: 14 float64 ulps at 32
    assert torch.allclose(sae.decode(acts), dec_by_hand(sae, want), rtol=0, atol=1e-13)


@torch.no_grad()
@pytest.mark.parametrize("rescale", [False, True])
def test_topk_by_hand(rescale):
    k = 4
    sae, x = make("topk", k=k, rescale_acts_by_decoder_norm=rescale), x_in()
    pre = pre_by_hand(sae, x)
    norms = sae.W_dec.norm(dim=-1)
    if rescale:
        pre = pre * norms
    want = torch.zeros_like(pre)
    for b in range(x.shape[0]):
        for p in range(x.shape[1]):
            order = sorted(range(D_SAE), key=lambda f: -float(pre[b, p, f]))
            for f in order[:k]:
                want[b, p, f] = max(float(pre[b, p, f]), 0.0)
    acts = sae.encode(x)
    # measured 0 (values up to 26), bound 1e-13: 14 float64 ulps at 32
    assert torch.allclose(acts, want, rtol=0, atol=1e-13)
    assert ((acts != 0).sum(-1) <= k).all() and ((acts != 0).sum(-1) >= 1).all()
    scaled = want / norms if rescale else want
    # measured 1.8e-15 (values up to 28), bound 2e-14: 11x
    assert torch.allclose(sae.decode(acts), dec_by_hand(sae, scaled), rtol=0, atol=2e-14)


@torch.no_grad()
def test_topk_keeps_negative_top_values_as_zero_and_refuses_bad_k():
    sae = make("topk", k=3, apply_b_dec_to_input=False)
    sae.b_enc.fill_(-100.0)  # every pre-activation negative: the top 3 are ReLU'd to 0
    assert torch.equal(sae.encode(x_in()), torch.zeros(3, 5, D_SAE, dtype=torch.float64))
    for k in (None, 0, D_SAE + 1, 2.5, True):
        with pytest.raises(ValueError, match="topk SAE needs an int k|SAEConfig.k must be a positive"):
            make_sae(SAEConfig("topk", D_IN, D_SAE, HOOK, k=k))


@torch.no_grad()
def test_batchtopk_by_hand_and_its_jumprelu_form():
    k = 2.4
    sae, x = make("batchtopk", k=k), x_in()
    pre = pre_by_hand(sae, x).clamp_min(0)
    n = int(k * 15)
    flat = pre.flatten().tolist()
    keep = sorted(range(len(flat)), key=lambda i: -flat[i])[:n]
    want = torch.zeros(len(flat), dtype=torch.float64)
    want[keep] = torch.tensor([flat[i] for i in keep], dtype=torch.float64)
    acts = sae.encode(x)
    assert torch.equal(acts, want.reshape(pre.shape))
    assert torch.equal(batch_topk(pre, k), want.reshape(pre.shape))
    sae.topk_threshold.fill_(0.37)
    jr = sae.to_jumprelu()
    assert isinstance(jr, JumpReLUSAE) and jr.cfg.k is None
    assert torch.equal(jr.threshold, torch.full((D_SAE,), 0.37, dtype=torch.float64))
    assert torch.equal(jr.encode(x), pre * (pre > 0.37))


@torch.no_grad()
def test_batchtopk_rescaled_folds_the_norms_into_its_jumprelu_form():
    sae, x = make("batchtopk", k=3.0, rescale_acts_by_decoder_norm=True), x_in()
    sae.topk_threshold.fill_(0.5)
    norms = sae.W_dec.norm(dim=-1)
    jr = sae.to_jumprelu()
    # measured 2.2e-16 (norms 1), bound 3e-15: 14x
    assert torch.allclose(jr.W_dec.norm(dim=-1), torch.ones(D_SAE, dtype=torch.float64), atol=3e-15)
    pre = pre_by_hand(sae, x) * norms
    # measured 7.1e-15 (values up to 26), bound 7e-14: 10x
    assert torch.allclose(jr.encode(x), pre.relu() * (pre > 0.5), rtol=0, atol=7e-14)


@torch.no_grad()
def test_jumprelu_by_hand():
    sae, x = make("jumprelu"), x_in()
    pre = pre_by_hand(sae, x)
    want = torch.where(pre > sae.threshold, pre.clamp_min(0), torch.zeros_like(pre))
    assert torch.equal(sae.encode(x), want)
    assert (sae.threshold < 0).any()  # a negative threshold still gives ReLU'd (never negative) values
    assert (sae.encode(x) >= 0).all()


@torch.no_grad()
def test_gated_by_hand():
    sae, x = make("gated"), x_in()
    assert sae.b_enc is None and "b_enc" not in sae.state_dict()
    assert set(sae.state_dict()) == {"W_enc", "W_dec", "b_dec", "r_mag", "b_gate", "b_mag"}
    gate = pre_by_hand(sae, x, b=sae.b_gate) > 0
    mag = pre_by_hand(sae, x, W=sae.W_enc * sae.r_mag.exp(), b=sae.b_mag).clamp_min(0)
    acts = sae.encode(x)
    # measured 0 (values up to 7.7), bound 3e-14: 17 float64 ulps at 8
    assert torch.allclose(acts, gate * mag, rtol=0, atol=3e-14)
    assert acts.count_nonzero() > 0 and (acts == 0).any()


@torch.no_grad()
@pytest.mark.parametrize("arch", ["transcoder", "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder"])
def test_transcoders_by_hand(arch):
    sae, x = make(arch), x_in()
    assert sae.W_dec.shape == (D_SAE, D_OUT) and sae.b_dec.shape == (D_OUT,)
    assert sae.cfg.is_transcoder and sae.cfg.hook_out == "blocks.0.hook_mlp_out"
    pre = torch.einsum("bpi,if->bpf", x, sae.W_enc) + sae.b_enc  # no b_dec on the input
    acts = pre.clamp_min(0)
    if "jumprelu" in arch:
        acts = acts * (pre > sae.threshold)
    # measured 0 (values up to 30), bound 1e-13: 14 float64 ulps at 32
    assert torch.allclose(sae.encode(x), acts, rtol=0, atol=1e-13)
    out = dec_by_hand(sae, acts)
    # measured 0 (values up to 30), bound 1e-13: 14 float64 ulps at 32
    assert torch.allclose(sae.decode(acts), out, rtol=0, atol=1e-13)
    if "skip" in arch:
        assert sae.W_skip.shape == (D_OUT, D_IN)
        out = out + torch.einsum("bpi,oi->bpo", x, sae.W_skip)
    # measured 0 (values up to 30), bound 1e-13: 14 float64 ulps at 32
    assert torch.allclose(sae(x), out, rtol=0, atol=1e-13)


def test_transcoder_refusals():
    with pytest.raises(ValueError, match="apply_b_dec_to_input=False"):
        make_sae(SAEConfig("transcoder", D_IN, D_SAE, HOOK, hook_name_out="blocks.0.hook_mlp_out", d_out=D_OUT))
    with pytest.raises(ValueError, match="normalize_activations='none' only"):
        make_sae(SAEConfig("skip_transcoder", D_IN, D_SAE, HOOK, normalize_activations="layer_norm",
                           **{k: v for k, v in TC.items() if k != "hook_name"}))
    with pytest.raises(ValueError, match="needs d_out == d_in"):
        make_sae(SAEConfig("standard", D_IN, D_SAE, HOOK, d_out=D_OUT))


@torch.no_grad()
def test_hook_z_flattens_heads_head_major():
    sae = make("standard", d_in=3 * 5, hook_name="blocks.1.attn.hook_z", reshape_activations="hook_z")
    z = torch.randn(2, 4, 3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    flat = torch.stack([z[..., h, :] for h in range(3)], dim=-2).reshape(2, 4, 15)  # head-major by hand
    want = pre_by_hand(sae, flat).clamp_min(0)
    assert torch.equal(sae.encode(z), want)
    out = sae(z)
    assert out.shape == z.shape
    # measured 0 (values up to 18), bound 5e-14: 14 float64 ulps at 32
    assert torch.allclose(out[..., 1, :], dec_by_hand(sae, want)[..., 5:10], rtol=0, atol=5e-14)


@torch.no_grad()
@pytest.mark.parametrize("mode", ["constant_norm_rescale", "layer_norm"])
def test_normalisations_by_hand(mode):
    sae, x = make("standard", normalize_activations=mode), x_in()
    if mode == "constant_norm_rescale":
        coeff = D_IN ** 0.5 / torch.sqrt((x * x).sum(-1, keepdim=True))
        xn, undo = x * coeff, (lambda y: y / coeff)
    else:
        mu = x.sum(-1, keepdim=True) / D_IN
        sd = torch.sqrt(((x - mu) ** 2).sum(-1, keepdim=True) / (D_IN - 1))  # unbiased, as torch.std
        xn, undo = (x - mu) / (sd + 1e-5), (lambda y: y * sd + mu)
    acts = sae.encode(x)
    want = pre_by_hand(sae, xn).clamp_min(0)
    assert torch.allclose(acts, want, rtol=0, atol=1e-14)  # measured 8.9e-16 (values up to 5.6), bound 1e-14: 11x
    # measured 3.8e-15 (values up to 35), bound 4e-14: 11x
    assert torch.allclose(sae.decode(acts), undo(dec_by_hand(sae, want)), rtol=0, atol=4e-14)
    with pytest.raises(RuntimeError, match="needs the encode of the same input"):
        sae.decode(acts)  # the coefficient was used by the decode above
    sae.encode(x[:1])
    with pytest.raises(RuntimeError, match="an encode of \\(1, 5\\) positions"):
        sae.decode(acts)


def test_unsupported_normalisations_refused_by_name():
    for mode in ("expected_average_only_in", "covariance_whitening"):
        with pytest.raises(ValueError, match=f"normalize_activations={mode!r} is not supported"):
            make_sae(SAEConfig("standard", D_IN, D_SAE, HOOK, normalize_activations=mode))


@torch.no_grad()
@pytest.mark.parametrize("arch,kw", [("standard", {}), ("jumprelu", {}), ("gated", {}),
                                     ("topk", dict(k=5, rescale_acts_by_decoder_norm=True)),
                                     ("transcoder", {}), ("jumprelu_skip_transcoder", {})])
def test_fold_W_dec_norm_keeps_the_reconstruction(arch, kw):
    sae, x = make(arch, **kw), x_in()
    before_acts, before = sae.encode(x), sae(x)
    norms = sae.W_dec.norm(dim=-1).clone()
    assert (norms - 1).abs().max() > 0.1
    sae.fold_W_dec_norm()
    # measured 2.2e-16 (norms 1), bound 3e-15: 14x
    assert torch.allclose(sae.W_dec.norm(dim=-1), torch.ones(D_SAE, dtype=torch.float64), rtol=0, atol=3e-15)
    assert torch.equal(sae.encode(x) != 0, before_acts != 0)
    # a rescaled TopK's activations are of pre * ||W_dec[f]|| already: the fold leaves them as they were
    scale = 1.0 if arch == "topk" else norms
    # measured 7.1e-15 (values up to 34), bound 7e-14: 10x
    assert torch.allclose(sae.encode(x), before_acts * scale, rtol=0, atol=7e-14)
    assert torch.allclose(sae(x), before, rtol=0, atol=1e-13)  # measured 1.1e-14 (values up to 31), bound 1e-13: 9x


def test_fold_W_dec_norm_refused_for_topk_without_rescale():
    sae = make("topk", k=3)
    with pytest.raises(ValueError, match="change which features are in the top k"):
        sae.fold_W_dec_norm()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dtype_and_device_are_the_parameters(dtype):
    sae = make_sae(SAEConfig("jumprelu", D_IN, D_SAE, HOOK), device="cpu", dtype=dtype)
    assert sae.dtype == dtype and sae.threshold.dtype == dtype and sae.device == torch.device("cpu")
    assert sae.encode(torch.randn(2, D_IN)).dtype == dtype


@torch.no_grad()
def test_folding_input_normalisations():
    x = x_in()
    sae = make("standard")
    before = sae(x * 2.0) / 2.0  # trained on 2 x, reconstructing 2 x
    sae.fold_activation_norm_scaling_factor(2.0)
    # measured 0 (values up to 29), bound 1e-13: 14 float64 ulps at 32
    assert torch.allclose(sae(x), before, rtol=0, atol=1e-13)
    bt = make("batchtopk", k=3.0, rescale_acts_by_decoder_norm=True)
    bt.topk_threshold.fill_(0.9)
    bt.fold_activation_norm_scaling_factor(3.0)  # W_dec / 3: pre * ||W_dec|| shrinks 3x, so does the threshold
    assert bt.topk_threshold.item() == 0.9 / 3.0
    tk = make("topk", k=4, rescale_acts_by_decoder_norm=True)
    g = torch.Generator().manual_seed(3)
    M = torch.eye(D_IN, dtype=torch.float64) + 0.2 * torch.randn(D_IN, D_IN, generator=g, dtype=torch.float64)
    mean = torch.randn(D_IN, generator=g, dtype=torch.float64)
    z = (x - mean) @ M
    want = tk(z) @ torch.linalg.inv(M) + mean
    tk.fold_activation_whitening(mean, M, torch.linalg.inv(M))
    assert tk.cfg.rescale_acts_by_decoder_norm is False  # the norms were folded first
    assert torch.allclose(tk(x), want, rtol=0, atol=3e-13)  # measured 2.5e-14 over 10 seeds (values < 53): 12x
    for arch in ("transcoder", "jumprelu_skip_transcoder"):
        with pytest.raises(ValueError, match="not supported"):
            make(arch).fold_activation_norm_scaling_factor(2.0)
        with pytest.raises(ValueError, match="not supported"):
            make(arch).fold_activation_whitening(mean[:D_IN], M, M)
