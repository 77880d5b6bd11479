"""The TransformerLens internals circuit-tracer's TransformerLens backend reaches into, on glassbox.tl and
on TransformerLens 3.9 holding the same weights (``tl_twin``).

circuit-tracer (0.5) subclasses ``HookedTransformer``, wraps every ``block.mlp`` and the ``unembed`` in
modules of its own that call the originals, hangs a new ``HookPoint`` on ``hook_mlp_out``
(``hook_mlp_out.hook_out_grad``) and renames with ``setup()``, reads and shares ``attn.mask`` by
``attn.attn_type``, collects activations with ``get_caching_hooks``, and runs its backward passes
after the ``hooks()`` block that attached its backward hooks has exited. Each test does the same on
both libraries and compares.
"""

import pytest
import torch
from torch import nn

import glassbox.tl
import transformer_lens
from transformer_lens.hook_points import HookPoint as TLHookPoint
from tl_oracle import max_diff, tiny_model, tl_twin, tokens


def pair(dtype=torch.float64):
    base = tiny_model(0, dtype=dtype)
    ours = glassbox.tl.HookedTransformer.from_glassbox(base, fold_ln=False, center_writing_weights=False,
                                                       center_unembed=False, fold_value_biases=False)
    return ours, tl_twin(base)


class Wrapper(nn.Module):
    """A module around another with a hook point on each side (circuit-tracer's ReplacementMLP)."""

    def __init__(self, inner, hook_point):
        super().__init__()
        self.inner, self.hook_in, self.hook_out = inner, hook_point(), hook_point()

    def forward(self, x):
        return self.hook_out(self.inner(self.hook_in(x)))


def test_backward_hooks_fire_after_their_block_exits_as_in_transformer_lens():
    ours, twin = pair()
    toks = tokens(ours, 1, 9)
    seen = {}
    for label, model in (("ours", ours), ("tl", twin)):
        grads = []
        with model.hooks(bwd_hooks=[("blocks.1.hook_resid_mid", lambda g, hook: grads.append(g.clone()))]):
            logits = model(toks)
        assert not model.hook_dict["blocks.1.hook_resid_mid"].bwd_hooks
        logits[0, -1, :7].sum().backward(retain_graph=True)
        logits[0, -1, :7].sum().backward()
        model.zero_grad(set_to_none=True)
        seen[label] = grads
    assert len(seen["ours"]) == len(seen["tl"]) == 2  # TransformerLens: 2, fired after the block exited
    # float64, the same weights: measured 5.6e-16 (gradients up to 2.3), bound 1e-12
    assert max_diff(seen["ours"][0], seen["tl"][0]) < 1e-12 and max_diff(seen["ours"][1], seen["tl"][1]) < 1e-12
    assert seen["tl"][0].abs().max() > 1e-3


@pytest.mark.parametrize("attn_types", [None, ["global", "local", "local"]])
def test_attention_mask_buffer_and_type_match_transformer_lens(attn_types):
    fields = dict(n_layers=3, d_model=12, n_ctx=13, d_head=4, n_heads=3, d_vocab=29, act_fn="gelu_new",
                  normalization_type="LN", dtype=torch.float32)
    if attn_types is not None:
        fields.update(attn_types=attn_types, window_size=5, use_local_attn=True)
    ours = glassbox.tl.HookedTransformer(glassbox.tl.HookedTransformerConfig(**fields))
    theirs = transformer_lens.HookedTransformer(transformer_lens.HookedTransformerConfig(**fields))
    for layer in range(3):
        a, b = ours.blocks[layer].attn, theirs.blocks[layer].attn
        assert a.attn_type == b.attn_type, layer
        # TransformerLens 3.9: an empty placeholder, the mask is built at forward time
        assert a.mask.dtype == b.mask.dtype == torch.bool and a.mask.shape == b.mask.shape == (0, 0), layer
    # circuit-tracer (for TransformerLens 3.2's [n_ctx n_ctx] buffers) shares one buffer between the
    # layers of a type; the forward never reads it.
    toks = torch.randint(0, 29, (2, 13), generator=torch.Generator().manual_seed(3))
    before = ours(toks)
    shared = torch.ones(13, 13, dtype=torch.bool).tril()
    for block in ours.blocks:
        block.attn.mask = shared
    assert all(block.attn.mask is shared for block in ours.blocks)
    assert torch.equal(ours(toks), before)
    with pytest.raises(ValueError, match=r"attn.mask must be a 2-D bool tensor.*\(13, 13\) torch.float32"):
        ours.blocks[2].attn.mask = shared.float()


@pytest.mark.parametrize("options", [
    dict(names_filter=lambda name: name.endswith("hook_resid_mid")),
    dict(names_filter="blocks.1.attn.hook_pattern"),
    dict(names_filter=["blocks.0.hook_mlp_out", "hook_embed"], remove_batch_dim=True),
    dict(names_filter=lambda name: "hook_z" in name or "hook_resid_post" in name, pos_slice=[2, 5]),
    dict(names_filter=lambda name: name.endswith("hook_mlp_out"), incl_bwd=True),
])
def test_get_caching_hooks_match_transformer_lens(options):
    ours, twin = pair()
    toks = tokens(ours, 2, 9)
    caches = []
    for model in (ours, twin):
        cache, fwd, bwd = model.get_caching_hooks(**options)
        with model.hooks(fwd_hooks=fwd, bwd_hooks=bwd):
            loss = model(toks, return_type="loss")
            if options.get("incl_bwd"):
                loss.backward()
        model.zero_grad(set_to_none=True)
        caches.append(cache)
    assert list(caches[0]) == list(caches[1]) and caches[0]
    for name in caches[1]:
        assert caches[0][name].shape == caches[1][name].shape, name
        assert not caches[0][name].requires_grad, name
        # float64, the same weights: measured 1.3e-15 (worst over these filters), bound 1e-12
        assert max_diff(caches[0][name], caches[1][name]) < 1e-12, name


def test_get_caching_hooks_refuses_an_unknown_name():
    ours, _ = pair()
    with pytest.raises(KeyError, match="hook_resid_mid"):
        ours.get_caching_hooks(names_filter="blocks.0.hook_resid_mdi")


def test_wrapped_mlps_unembed_and_a_hook_point_on_a_hook_point_as_in_transformer_lens():
    ours, twin = pair()
    toks = tokens(ours, 2, 9)
    reference = twin(toks)
    for model, point in ((ours, glassbox.tl.HookPoint), (twin, TLHookPoint)):
        for block in model.blocks:
            block.mlp = Wrapper(block.mlp, point)
        model.unembed = Wrapper(model.unembed, point)
        model.blocks[1].hook_mlp_out.hook_out_grad = point()
        model.setup()
    names = [n for n in twin.hook_dict if "mlp.hook_" in n or "unembed.hook_" in n or "hook_out_grad" in n]
    assert names and all(n in ours.hook_dict for n in names), names
    seen = []
    for model in (ours, twin):
        def through(x, hook, model=model):
            return model.blocks[1].hook_mlp_out.hook_out_grad(x * 2)

        model.hook_dict["blocks.1.hook_mlp_out.hook_out_grad"].add_hook(lambda x, hook: seen.append(hook.name))
        with model.hooks(fwd_hooks=[("blocks.1.hook_mlp_out", through)]):
            out = model(toks)
        model.reset_hooks(including_permanent=True)
        seen.append(max_diff(out, twin(toks)) if model is ours else None)
    assert seen[0] == seen[2] == "blocks.1.hook_mlp_out.hook_out_grad"
    # float64: the wrapped models compute what the unwrapped twin did (measured 4.4e-15, bound 1e-12)
    assert max_diff(ours(toks), reference) < 1e-12 and max_diff(twin(toks), reference) < 1e-12
