"""Splicing SAEs and transcoders into a model (glassbox.interp.sae.splice).

Oracles: the clean model (the error term must leave every downstream value and gradient bit-equal to
it), a reconstruction written out by hand from the SAE's weights (relu((x - b_dec) @ W_enc + b_enc) @
W_dec + b_dec) put in with run_with_hooks, and one-patch-per-forward loops for the patching engine.
"""

import pytest
import torch
from torch import nn

from glassbox.hooks import HookedRootModule, HookPoint
from glassbox.interp.patching import LogitDiff, activation_patch, path_patch
from glassbox.interp.sae.base import SAE_HOOKS, StandardSAE
from glassbox.interp.sae.config import SAEConfig
from glassbox.interp.sae.splice import add_sae, remove_sae
from glassbox.models import Config, HookedTransformer

CFG = Config(n_layers=2, d_model=24, n_heads=3, d_head=8, d_mlp=40, d_vocab=50, n_ctx=16)
D_SAE = 37

# (hook the SAE reads, hook it writes or None, d_in, reshape)
PLACES = {
    "resid_pre": ("blocks.1.hook_resid_pre", None, 24, "none"),
    "mlp_out": ("blocks.0.hook_mlp_out", None, 24, "none"),
    "hook_z": ("blocks.1.attn.hook_z", None, 24, "hook_z"),
    "transcoder": ("blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out", 24, "none"),
}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HookedTransformer(CFG)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, CFG.d_vocab, (3, 9), generator=torch.Generator().manual_seed(1))


def make_sae(place: str, seed: int = 0, dtype=torch.float32) -> StandardSAE:
    read, write, d_in, reshape = PLACES[place]
    sae = StandardSAE(SAEConfig("standard", d_in, D_SAE, read, hook_name_out=write, reshape_activations=reshape),
                      dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (sae.W_enc, sae.W_dec):
            p.copy_(torch.randn(p.shape, generator=g) / d_in ** 0.5)
        for p in (sae.b_enc, sae.b_dec):
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return sae


def by_hand(sae: StandardSAE, x: torch.Tensor) -> torch.Tensor:
    """The SAE's reconstruction of x, written out from its weights (heads flattened for hook_z)."""
    flat = x.flatten(-2) if sae.cfg.reshape_activations == "hook_z" else x
    acts = torch.relu((flat - sae.b_dec if sae.cfg.apply_b_dec_to_input else flat) @ sae.W_enc + sae.b_enc)
    return (acts @ sae.W_dec + sae.b_dec).reshape(x.shape)


def model_keys(cache) -> set:
    return {k for k in cache.keys() if ".hook_sae_" not in k}


def noop(act, hook):
    return None


# -- the error term is exact ---------------------------------------------------------------------
@pytest.mark.parametrize("place", list(PLACES))
def test_error_term_leaves_every_value_bit_equal(model, tokens, place):
    sae = make_sae(place)
    read, write = PLACES[place][:2]
    # Against the unhooked model: at ln2.hook_normalized the splice reads the value the norm computes on
    # the side, and the norm's output stays its fused kernel's.
    clean = model(tokens)
    clean_logits_c, clean_cache = model.run_with_cache(tokens)
    with model.saes([sae], use_error_term=True):
        logits = model(tokens)
        logits_c, cache = model.run_with_cache(tokens)
    assert torch.equal(logits, clean)
    assert torch.equal(logits_c, clean_logits_c)
    assert model_keys(cache) == set(clean_cache.keys())
    for name in clean_cache.keys():
        assert torch.equal(cache[name], clean_cache[name]), name
    out = write or read
    assert {k for k in cache.keys() if ".hook_sae_" in k} == {f"{out}.{h}" for h in SAE_HOOKS}
    assert cache[f"{out}.hook_sae_acts_post"].shape == (3, 9, D_SAE)
    # the SAE really is active: without the error term the model carries on with the reconstruction
    with model.saes([sae]):
        spliced = model(tokens)
    assert (spliced - clean).abs().max() > 0.05


def test_transcoder_error_term_against_the_unhooked_model(model, tokens):
    """Against a run with no hook at all, under autograd, no_grad and inference_mode: the LayerNorm at
    the read hook keeps its fused kernel's bits (its normalised value for the transcoder is computed on
    the side), so the logits are bit-equal."""
    sae = make_sae("transcoder")
    for mode in (torch.enable_grad, torch.no_grad, torch.inference_mode):
        with mode():
            clean = model(tokens)
            with model.saes([sae], use_error_term=True):
                logits = model(tokens)
        assert torch.equal(logits, clean), mode


@pytest.mark.parametrize("place", list(PLACES))
def test_without_error_term_the_model_carries_the_reconstruction(model, tokens, place):
    sae = make_sae(place)
    read, write = PLACES[place][:2]
    seen = {}

    def keep(act, hook):
        seen["x"] = act

    def replace(act, hook):
        return by_hand(sae, seen["x"] if write else act)

    with torch.no_grad():
        expected = model.run_with_hooks(tokens, fwd_hooks=[(read, keep), (write or read, replace)])
        with model.saes([sae]):
            logits = model(tokens)
    # measured 0 (logits up to 0.48), bound 1e-6
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("place", ["resid_pre", "hook_z", "transcoder"])
def test_read_only_hooks_on_the_sae_points_keep_the_error_term_exact(model, tokens, place):
    sae = make_sae(place)
    read, write = PLACES[place][:2]
    out = write or read
    clean = model(tokens)
    calls = []
    hooks = [(f"{out}.{h}", lambda act, hook: calls.append(hook.name)) for h in SAE_HOOKS]
    with model.saes([sae], use_error_term=True):
        logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
    assert torch.equal(logits, clean)
    assert calls == [f"{out}.{h}" for h in SAE_HOOKS]


def test_a_feature_hook_moves_the_output_by_its_decoder_share(model, tokens):
    """With the error term, zeroing feature f at hook H adds -acts[f] * W_dec[f] to H's value, exactly
    the SAE's own change (the error term is the clean reconstruction's)."""
    sae = make_sae("resid_pre")
    name = "blocks.1.hook_resid_pre"
    acts = {}
    with torch.no_grad():
        x = model.run_with_cache(tokens, names_filter=name)[1][name]
        acts_clean = torch.relu((x - sae.b_dec) @ sae.W_enc + sae.b_enc)
        f = int(acts_clean.sum((0, 1)).argmax())
        shift = -acts_clean[..., f:f + 1] * sae.W_dec[f]

        def zero(act, hook):
            act = act.clone()
            act[..., f] = 0
            return act

        expected = model.run_with_hooks(tokens, fwd_hooks=[(name, lambda act, hook: act + shift)])
        with model.saes([sae], use_error_term=True):
            logits = model.run_with_hooks(tokens, fwd_hooks=[(f"{name}.hook_sae_acts_post", zero)])
    assert (expected - model(tokens)).abs().max() > 0.01
    # measured 9.7e-8 (logits up to 0.32), bound 1e-6: 10x
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("place", list(PLACES))
def test_gradient_upstream_is_the_clean_models(model, tokens, place):
    sae = make_sae(place)
    read = PLACES[place][0]

    def grads(saes):  # the clean run reads the SAE's input too: the norm's gradient then takes the same formula
        model.zero_grad()
        with model.saes(saes, use_error_term=True), model.hooks([(read, noop)]):
            model(tokens, return_type="loss").backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    clean, spliced = grads([]), grads([sae])
    model.zero_grad()
    assert clean.keys() == spliced.keys()
    for name in clean:
        assert torch.equal(clean[name], spliced[name]), name
    assert sae.W_enc.grad is None or not sae.W_enc.grad.any()


# -- names everywhere ----------------------------------------------------------------------------
def test_sae_hook_names_in_run_with_hooks_and_generate(model, tokens):
    sae = make_sae("mlp_out")
    name = "blocks.0.hook_mlp_out.hook_sae_acts_post"
    shapes = []
    with model.saes([sae], use_error_term=True):
        assert name in model.hook_dict
        model.run_with_hooks(tokens, fwd_hooks=[(name, lambda act, hook: shapes.append(tuple(act.shape)))])
        assert shapes == [(3, 9, D_SAE)]
        shapes.clear()
        with model.hooks([(name, lambda act, hook: shapes.append(tuple(act.shape)))]):
            out = model.generate(tokens[:1, :4], max_new_tokens=3, do_sample=False, verbose=False)
    clean = model.generate(tokens[:1, :4], max_new_tokens=3, do_sample=False, verbose=False)
    assert torch.equal(out, clean)
    assert shapes[0] == (1, 4, D_SAE) and len(shapes) >= 3  # the prompt, then a step per new token
    assert name not in model.hook_dict


def test_several_saes_at_once(model, tokens):
    saes = [make_sae("resid_pre", 1), make_sae("hook_z", 2), make_sae("transcoder", 3)]
    clean = model(tokens)
    with model.saes(saes, use_error_term=True):
        assert set(model.acts_to_saes) == {"blocks.1.hook_resid_pre", "blocks.1.attn.hook_z", "blocks.0.hook_mlp_out"}
        assert torch.equal(model(tokens), clean)
        _, cache = model.run_with_cache(tokens)
        assert sum(".hook_sae_acts_post" in k for k in cache.keys()) == 3
    seen = {}
    hooks = [("blocks.0.ln2.hook_normalized", lambda act, hook: seen.__setitem__("x", act)),
             ("blocks.0.hook_mlp_out", lambda act, hook: by_hand(saes[2], seen["x"])),
             ("blocks.1.attn.hook_z", lambda act, hook: by_hand(saes[1], act)),
             ("blocks.1.hook_resid_pre", lambda act, hook: by_hand(saes[0], act))]
    with torch.no_grad():
        expected = model.run_with_hooks(tokens, fwd_hooks=hooks)
        with model.saes(saes):
            logits = model(tokens)
    # measured 0 (logits up to 0.37), bound 1e-6
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-6)
    assert model.acts_to_saes == {}


# -- the context restores exactly ----------------------------------------------------------------
def state(model) -> tuple:
    return (list(model.hook_dict), {n: (type(s.owner), s.transform.__class__) for n, s in model.splices.items()},
            {n: len(p.fwd_hooks) for n, p in model.hook_dict.items()})


def test_saes_context_restores_what_it_replaced(model, tokens):
    outer, inner, other = make_sae("resid_pre", 1), make_sae("resid_pre", 2), make_sae("mlp_out", 3)
    handle = model.add_hook("blocks.1.hook_resid_pre", noop)
    add_sae(model, outer, use_error_term=True)
    try:
        before = state(model)
        with model.saes([inner, other]):
            assert model.acts_to_saes["blocks.1.hook_resid_pre"] is inner
            assert len(model.hook_dict["blocks.1.hook_resid_pre"].fwd_hooks) == 1  # the user's hook is shared
        assert state(model) == before
        assert model.acts_to_saes == {"blocks.1.hook_resid_pre": outer}
        assert model.splices["blocks.1.hook_resid_pre"].transform.use_error_term is True
        # two of the block's own SAEs at one hook: the second replaces the first, neither stays after
        with model.saes([inner, make_sae("resid_pre", 4)]):
            pass
        assert model.acts_to_saes == {"blocks.1.hook_resid_pre": outer}
    finally:
        remove_sae(model, "blocks.1.hook_resid_pre")
        for h in handle:
            h.remove()
    assert model.acts_to_saes == {} and not model.has_hooks


def test_saes_context_restores_when_the_body_or_a_hook_raises(model, tokens):
    clean_names = list(model.hook_dict)
    sae = make_sae("transcoder")
    with pytest.raises(RuntimeError, match="body"):
        with model.saes([sae, make_sae("resid_pre")]):
            raise RuntimeError("body")
    assert list(model.hook_dict) == clean_names and model.splices == {}

    def boom(act, hook):
        raise RuntimeError("hook")

    with pytest.raises(RuntimeError, match="hook"):
        with model.saes([sae], use_error_term=True):
            model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_mlp_out.hook_sae_acts_post", boom)])
    assert list(model.hook_dict) == clean_names and model.splices == {} and not model.has_hooks
    # the SAE's points got their own names back and no hook was left on them
    assert sae.hook_sae_acts_post.name == "hook_sae_acts_post" and not sae.hook_sae_acts_post.fwd_hooks
    # a bad SAE in the list: the ones before it are taken out again, what was there is put back
    keep = make_sae("mlp_out")
    add_sae(model, keep)
    with pytest.raises(ValueError, match="d_in=23"):
        with model.saes([make_sae("resid_pre"), StandardSAE(SAEConfig("standard", 23, 5, "blocks.0.hook_mlp_out"))]):
            pass
    assert model.acts_to_saes == {"blocks.0.hook_mlp_out": keep}
    model.reset_saes()
    assert list(model.hook_dict) == clean_names


def test_parameters_and_state_dict_unchanged(model):
    params = dict(model.named_parameters())
    sd = model.state_dict()
    with model.saes([make_sae("resid_pre"), make_sae("transcoder")]):
        assert dict(model.named_parameters()).keys() == params.keys()
        assert all(p is params[n] for n, p in model.named_parameters())
        inside = model.state_dict()
        assert inside.keys() == sd.keys()
        assert all(torch.equal(inside[k], sd[k]) for k in sd)


# -- bad inputs ----------------------------------------------------------------------------------
def test_bad_inputs_are_named(model, tokens):
    meta = StandardSAE(SAEConfig("standard", 24, 5, "blocks.0.hook_resid_pre"), device="meta")
    with pytest.raises(ValueError, match="meta"):
        add_sae(model, meta)
    with pytest.raises(KeyError, match="blocks.7.hook_resid_pre"):
        add_sae(model, StandardSAE(SAEConfig("standard", 24, 5, "blocks.7.hook_resid_pre")))
    with pytest.raises(ValueError, match="reads d_in=23 values per position at blocks.0.hook_resid_pre, where the "
                                         "model has d_model = 24"):
        add_sae(model, StandardSAE(SAEConfig("standard", 23, 5, "blocks.0.hook_resid_pre")))
    with pytest.raises(ValueError, match="reads d_in=8 .* at blocks.0.attn.hook_z, where the model has head x "
                                         "d_head = 24"):
        add_sae(model, StandardSAE(SAEConfig("standard", 8, 5, "blocks.0.attn.hook_z", reshape_activations="hook_z")))
    with pytest.raises(ValueError, match="writes d_out=40 .* at blocks.0.hook_mlp_out, where the model has "
                                         "d_model = 24"):
        add_sae(model, StandardSAE(SAEConfig("standard", 40, 5, "blocks.0.mlp.hook_post",
                                             hook_name_out="blocks.0.hook_mlp_out")))
    with pytest.raises(TypeError, match="use_error_term"):
        add_sae(model, make_sae("resid_pre"), use_error_term=1)
    sae = make_sae("resid_pre")
    add_sae(model, sae)
    with pytest.raises(ValueError, match="already spliced"):
        add_sae(model, sae)
    with pytest.raises(ValueError, match="cannot be spliced inside another"):
        add_sae(model, StandardSAE(SAEConfig("standard", D_SAE, 5, "blocks.1.hook_resid_pre.hook_sae_acts_post")))
    model.reset_saes()
    with pytest.raises(KeyError, match="no SAE is spliced at 'blocks.0.hook_resid_pre'"):
        model.reset_saes(["blocks.0.hook_resid_pre"])
    assert model.splices == {}


class Toy(HookedRootModule):
    """A model with a hook point that HOOK_SHAPES does not describe: widths are checked at run time."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 7)
        self.hook_h = HookPoint()
        self.setup()

    def forward(self, x):
        return self.hook_h(self.lin(x))


def test_width_checked_at_run_time_where_the_table_cannot_say():
    toy = Toy()
    add_sae(toy, StandardSAE(SAEConfig("standard", 6, 4, "hook_h")))
    with pytest.raises(ValueError, match="reads d_in=6 values per position, got a tensor of shape \\(2, 3, 7\\)"):
        toy(torch.randn(2, 3, 5))
    remove_sae(toy, "hook_h")
    add_sae(toy, StandardSAE(SAEConfig("standard", 7, 4, "hook_h")))
    assert toy(torch.randn(2, 3, 5)).shape == (2, 3, 7)


# -- the patching engine and path patching with an SAE spliced -----------------------------------
def loop_patch(model, corrupted, clean_cache, metric, name: str, pos: int) -> float:
    def patch(act, hook):
        act = act.clone()
        act[:, pos] = clean_cache[name][:, pos]
        return act

    with torch.no_grad():
        return metric(model.run_with_hooks(corrupted, fwd_hooks=[(name, patch)])).mean().item()


@pytest.mark.parametrize("error_term", [False, True])
def test_activation_patch_with_an_sae_spliced_equals_the_loop(model, tokens, error_term):
    clean_tokens, corrupted = tokens[:, :6], tokens[:, :6].flip(0)
    metric = LogitDiff(torch.tensor([3, 4, 5]), torch.tensor([6, 7, 8]))
    with model.saes([make_sae("mlp_out"), make_sae("resid_pre", 5)], use_error_term=error_term):
        _, clean_cache = model.run_with_cache(clean_tokens)
        result = activation_patch(model, corrupted, clean_cache, metric, "resid_pre", ("layer", "pos"),
                                  memory_budget=2**16)
        loop = torch.tensor([[loop_patch(model, corrupted, clean_cache, metric, f"blocks.{L}.hook_resid_pre", p)
                              for p in range(6)] for L in range(CFG.n_layers)])
    assert result.values.shape == (2, 6)
    # measured 0 (values up to 0.07), bound 1e-6
    torch.testing.assert_close(result.values, loop, rtol=0, atol=1e-6)
    plain = activation_patch(model, corrupted, model.run_with_cache(clean_tokens)[1], metric, "resid_pre",
                             ("layer", "pos"), memory_budget=2**16)
    if error_term:  # exact splice: the sweep is the unspliced model's
        # measured 0 (values up to 0.07), bound 1e-6
        torch.testing.assert_close(result.values, plain.values, rtol=0, atol=1e-6)
    else:
        assert (result.values - plain.values).abs().max() > 1e-3


def test_path_patch_with_an_sae_spliced_equals_the_loop(model, tokens):
    """Sender (0, 1) into the logits with an SAE (no error term) at blocks.1.hook_resid_pre: the loop is
    one forward with head 1 of layer 0 clean and every head of layer 1 frozen at its corrupted value."""
    clean_tokens, corrupted = tokens, tokens.flip(0)
    metric = LogitDiff(torch.tensor([3, 4, 5]), torch.tensor([6, 7, 8]))
    z0, z1 = "blocks.0.attn.hook_z", "blocks.1.attn.hook_z"
    with model.saes([make_sae("resid_pre")]):
        _, clean_cache = model.run_with_cache(clean_tokens)
        _, corrupted_cache = model.run_with_cache(corrupted)
        value = path_patch(model, corrupted, clean_cache, metric, [(0, 1)])

        def sender(act, hook):
            act = act.clone()
            act[:, :, 1] = clean_cache[z0][:, :, 1]
            return act

        with torch.no_grad():
            logits = model.run_with_hooks(corrupted, fwd_hooks=[(z0, sender), (z1, lambda act, hook: corrupted_cache[z1])])
        expected = metric(logits).mean()
    plain = path_patch(model, corrupted, model.run_with_cache(clean_tokens)[1], metric, [(0, 1)])
    assert abs(float(value) - float(plain)) > 1e-3  # the SAE makes a difference
    # measured 1.5e-8 (values up to 0.13), bound 3e-7: 20x
    torch.testing.assert_close(value, expected.detach(), rtol=0, atol=3e-7)


# -- glassbox.tl's HookedTransformer -------------------------------------------------------------
def test_tl_hooked_transformer_takes_saes(model, tokens):
    from glassbox.tl import HookedTransformer as TLHookedTransformer

    tl_model = TLHookedTransformer(CFG)
    tl_model.load_state_dict(model.state_dict())
    sae = make_sae("hook_z")
    clean_logits, clean_cache = tl_model.run_with_cache(tokens)
    with tl_model.saes([sae], use_error_term=True):
        logits, cache = tl_model.run_with_cache(tokens)
    assert torch.equal(logits, clean_logits)
    assert torch.equal(cache["blocks.1.hook_resid_post"], clean_cache["blocks.1.hook_resid_post"])
    assert cache["blocks.1.attn.hook_z.hook_sae_acts_post"].shape == (3, 9, D_SAE)
    tl_model.add_sae(sae)
    assert list(tl_model.acts_to_saes) == ["blocks.1.attn.hook_z"]
    tl_model.reset_saes()
    assert tl_model.splices == {}


def test_a_skip_transcoder_writes_its_forward(model, tokens):
    """A skip transcoder's splice writes decode(encode(x)) + x @ W_skip.T (its forward), not decode alone."""
    from glassbox.interp.sae.architectures import make_sae as make_arch

    read, write = "blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out"
    sae = make_arch(SAEConfig("skip_transcoder", 24, D_SAE, read, hook_name_out=write, apply_b_dec_to_input=False))
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / 5)
    seen = {}
    hooks = [(read, lambda act, hook: seen.__setitem__("x", act)),
             (write, lambda act, hook: by_hand(sae, seen["x"]) + seen["x"] @ sae.W_skip.T)]
    with torch.no_grad():
        expected = model.run_with_hooks(tokens, fwd_hooks=hooks)
        clean = model(tokens)
        with model.saes([sae]):
            logits = model(tokens)
        with model.saes([sae], use_error_term=True):
            exact = model(tokens)
    assert torch.equal(exact, clean)
    # measured 0 (logits up to 0.5), bound 1e-6
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-6)
