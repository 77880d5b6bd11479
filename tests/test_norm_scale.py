"""hook_scale on LayerNorm and RMSNorm: reading it changes nothing, editing it changes the output.

The fused kernel computes a norm's output unless a hook replaced or edited the scale, or a gradient
hook needs it on the autograd path (glassbox/models/norm_scale.py). The oracles: the unhooked run
(bits), the textbook formulas with the edited scale, and autograd on the textbook formulas.
"""

import pytest
import torch

from glassbox.models import HookedTransformer, preset_config

from conftest import perturbed

SIZES = dict(d_model=22, n_layers=2, n_heads=2, d_head=6, d_vocab=29, n_ctx=19, d_mlp=37)
SCALES = lambda name: name.endswith("hook_scale")


def model_for(preset: str) -> HookedTransformer:
    return perturbed(preset_config(preset, **SIZES))  # norm weights and biases away from 1 and 0


def textbook(preset: str, norm, x, scale):
    """LayerNorm (the gpt2 preset) or RMSNorm (modern) with the given scale."""
    if preset == "gpt2":
        return (x - x.mean(-1, keepdim=True)) / scale * norm.w + norm.b
    return x / scale * norm.w


TOKENS = torch.tensor([[3, 14, 15, 9, 26, 5, 3, 5, 8]])


@pytest.mark.parametrize("preset", ["gpt2", "modern"])
@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_reading_the_scale_leaves_every_bit_of_the_output(preset, mode):
    model = model_for(preset)
    with mode():
        plain = model(TOKENS)
        logits, cache = model.run_with_cache(TOKENS, names_filter=SCALES)
    assert torch.equal(logits, plain)
    assert len(cache) == 2 * SIZES["n_layers"] + 1
    # The cached scale is still the real one: sqrt(var + eps) (LayerNorm) or sqrt(mean x^2 + eps).
    with torch.no_grad():
        x = model.run_with_cache(TOKENS, names_filter="blocks.1.hook_resid_mid")[1]["blocks.1.hook_resid_mid"]
    stat = x.var(-1, unbiased=False, keepdim=True) if preset == "gpt2" else x.pow(2).mean(-1, keepdim=True)
    expected = (stat + model.cfg.layer_norm_eps).sqrt()
    # measured 8.9e-16 (values up to 6.5), bound 1e-14: 11x
    torch.testing.assert_close(cache["blocks.1.ln2.hook_scale"], expected, atol=1e-14, rtol=0)


@pytest.mark.parametrize("preset", ["gpt2", "modern"])
@pytest.mark.parametrize("edit", ["replace", "in_place"])
@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])  # inference tensors: no version counter
def test_an_edited_scale_is_used(preset, edit, mode):
    model = model_for(preset)
    norm = model.blocks[1].ln2
    seen = {}

    def double(scale, hook):
        seen["scale"] = scale.clone()
        if edit == "replace":
            return scale * 2
        scale.mul_(2)

    def keep_input(x, hook):
        seen["x"] = x.clone()

    with mode(), model.hooks([("blocks.1.hook_resid_mid", keep_input), ("blocks.1.ln2.hook_scale", double),
                                        ("blocks.1.ln2.hook_out", lambda out, hook: seen.update(out=out))]):
        edited_logits = model(TOKENS)
        plain_logits = model(TOKENS)  # hooks still attached: same edit, same result
    assert torch.equal(edited_logits, plain_logits)
    expected = textbook(preset, norm, seen["x"], 2 * seen["scale"])
    # measured 0 (values up to 2.2), bound 1e-12 (exact here)
    torch.testing.assert_close(seen["out"], expected, atol=1e-12, rtol=0)
    with mode():
        unedited = model(TOKENS)
    assert float((unedited - edited_logits).abs().max()) > 1e-3  # the edit reached the logits


@pytest.mark.parametrize("preset", ["gpt2", "modern"])
def test_scale_gradient_matches_autograd_on_the_textbook_formula(preset):
    model = model_for(preset)
    name = "blocks.1.ln2.hook_scale"
    loss, cache = model.run_with_cache(TOKENS, names_filter=[name, "blocks.1.hook_resid_mid"], incl_bwd=True,
                                       return_type="loss")
    # Oracle: the same loss, with ln2's output rebuilt from a leaf scale by the textbook formula.
    norm = model.blocks[1].ln2
    scale = cache[name].clone().requires_grad_(True)

    def rebuild(out, hook):
        return textbook(preset, norm, cache["blocks.1.hook_resid_mid"], scale)

    with model.hooks([("blocks.1.ln2.hook_out", rebuild)]):
        ref = model(TOKENS, return_type="loss")
    (grad,) = torch.autograd.grad(ref, scale)
    # measured 0 (values up to 4.9), bound 1e-12 (exact here)
    torch.testing.assert_close(loss, ref.detach(), atol=1e-12, rtol=0)
    # measured 0 (values up to 0.089), bound 1e-12 (exact here)
    torch.testing.assert_close(cache[name + "_grad"], grad, atol=1e-12, rtol=1e-9)
    assert float(grad.abs().max()) > 1e-6


@pytest.mark.parametrize("norm", ["RMS", "LN"])
def test_a_float16_scale_above_256_is_finite_and_freezing_it_keeps_the_output(norm):
    """An RMS (or deviation) above 256 has a mean square above float16's 65504: the scale is computed
    in float32 and cast, so it is finite, equal to the float64 scale of the same stream to float16
    rounding, and writing it back (freezing it) leaves the logits; the logit lens stays finite too."""
    from glassbox.models import Config

    cfg = Config(d_model=32, n_layers=1, n_heads=4, d_vocab=50, n_ctx=16, normalization=norm, positional="rotary")
    torch.manual_seed(0)
    model = HookedTransformer(cfg).to(torch.float16)
    with torch.no_grad():
        model.embed.W_E.mul_(20000)  # residual stream entries ~400
    tokens = torch.randint(0, 50, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
        x = cache["blocks.0.hook_resid_pre"].double()
        spread = x.var(-1, correction=0, keepdim=True) if norm == "LN" else x.pow(2).mean(-1, keepdim=True)
        exact = (spread + cfg.layer_norm_eps).sqrt()
        assert float(exact.min()) > 256, "the stream must be large enough to overflow a float16 mean square"
        # float16 rounding: measured <= 4.3e-4 relative, bound 4e-3: 9x (float16's epsilon is 9.8e-4)
        torch.testing.assert_close(cache["blocks.0.ln1.hook_scale"].double(), exact, rtol=4e-3, atol=0)
        frozen = cache["blocks.0.ln1.hook_scale"]
        again = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.ln1.hook_scale", lambda s, hook: frozen)])
        assert torch.equal(again, logits)  # the frozen scale is the scale: the same bits
        if norm == "RMS":
            lens = cache.accumulated_resid(apply_ln=True)[-1]
            # measured 2.0e-3 (values up to 2.4), bound 2e-2: 10x
            torch.testing.assert_close(lens.float(), cache["ln_final.hook_out"].float(), atol=2e-2, rtol=0)
