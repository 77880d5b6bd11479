"""run_with_cache, ActivationCache, act_name and cache_size, each against an independent oracle:
values captured by plain hooks, hand-written name tables, autograd, and measured bytes."""

import warnings

import pytest
import torch

from glassbox import Config, HookedTransformer
from glassbox.interp import ActivationCache, CacheSizeWarning, act_name, cache
from glassbox.models import hook_shape

CFG = Config(d_model=15, n_layers=2, n_heads=3, d_head=5, d_mlp=23, d_vocab=29, n_ctx=17)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HookedTransformer(CFG).eval()


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, CFG.d_vocab, (3, 11), generator=torch.Generator().manual_seed(1))


def captured(model, tokens, names):
    """The oracle: every named activation, recorded by plain hooks that clone."""
    seen = {}
    with model.hooks([(n, lambda act, hook: seen.__setitem__(hook.name, act.detach().clone())) for n in names]):
        logits = model(tokens)
    return logits, seen


def test_cache_holds_every_activation_as_plain_hooks_see_it(model, tokens):
    logits, cache_ = model.run_with_cache(tokens)
    ref_logits, ref = captured(model, tokens, list(model.hook_dict))
    assert isinstance(cache_, ActivationCache)
    assert sorted(cache_.keys()) == sorted(model.hook_dict) and len(cache_) == len(model.hook_dict) == 45  # 19 a block; embed, pos_embed, ln_final x3, unembed x2
    torch.testing.assert_close(logits, ref_logits, atol=0, rtol=0)
    # measured 3.0e-8 (values up to 0.38), bound 1e-6: 34x
    torch.testing.assert_close(logits, model(tokens), atol=1e-6, rtol=0)  # unhooked (fused) path
    for name, value in ref.items():
        torch.testing.assert_close(cache_[name], value, atol=0, rtol=0, msg=name)
        sizes = {"batch": 3, "pos": 11, "query_pos": 11, "key_pos": 11, "head": 3, "d_model": 15,
                 "d_head": 5, "d_mlp": 23, "d_vocab": 29, "1": 1}
        assert tuple(cache_[name].shape) == tuple(sizes[a] for a in hook_shape(name).split()), name
    assert not model.has_hooks


def test_shorthand_keys_follow_an_exact_table(model, tokens):
    _, cache_ = model.run_with_cache(tokens)
    table = {
        ("pattern", 1): "blocks.1.attn.hook_pattern",
        ("attn", 1): "blocks.1.attn.hook_pattern",
        ("resid_pre", 0): "blocks.0.hook_resid_pre",
        ("q", 1, "attn"): "blocks.1.attn.hook_q",
        ("q", 1, "a"): "blocks.1.attn.hook_q",
        ("k", 0): "blocks.0.attn.hook_k",
        ("attn_scores", 0): "blocks.0.attn.hook_attn_scores",
        ("post", 1): "blocks.1.mlp.hook_post",
        ("pre", 0, "mlp"): "blocks.0.mlp.hook_pre",
        ("mlp_out", 1): "blocks.1.hook_mlp_out",
        ("scale", 1, "ln2"): "blocks.1.ln2.hook_scale",
        ("normalized", 0, "ln1"): "blocks.0.ln1.hook_normalized",
        ("scale",): "ln_final.hook_scale",
        ("embed",): "hook_embed",
        ("resid_pre_grad", 1): "blocks.1.hook_resid_pre_grad",
    }
    for key, name in table.items():
        assert act_name(*key) == name, key
        if not name.endswith("_grad"):
            assert cache_[key] is cache_[name]
    assert cache_["embed"] is cache_["hook_embed"] and cache_["scale"] is cache_["ln_final.hook_scale"]
    assert "embed" in cache_ and ("pattern", 1) in cache_ and ("pattern", 2) not in cache_


@pytest.mark.parametrize("key, words", [
    (("pattrn", 1), ["pattern"]),
    (("q", 1, "mlp"), ["attn"]),
    (("scale", 1), ["ln1", "ln2"]),
    (("resid_pre",), ["give a layer"]),
    (("pattern", 5), ["layer 5", "n_layers", "[-2, 2)"]),
    ("blocks.0.attn.hook_patern", ["blocks.0.attn.hook_pattern"]),
])
def test_unknown_keys_name_the_closest(model, tokens, key, words):
    _, cache_ = model.run_with_cache(tokens)
    with pytest.raises(KeyError) as err:
        cache_[key]
    for word in words:
        assert word in str(err.value)


def test_cache_is_read_only_and_sized(model, tokens):
    _, cache_ = model.run_with_cache(tokens, names_filter="blocks.0.hook_resid_post")
    with pytest.raises(TypeError):
        cache_["blocks.0.hook_resid_post"] = torch.zeros(1)
    assert list(cache_) == ["blocks.0.hook_resid_post"]
    assert cache_.nbytes == 3 * 11 * 15 * 4
    with pytest.raises(KeyError, match="names_filter"):  # a real hook that was not cached
        cache_["blocks.1.hook_resid_post"]


def test_names_filter_forms(model, tokens):
    names = ["blocks.1.hook_attn_out", "hook_embed"]
    assert sorted(model.run_with_cache(tokens, names_filter=names)[1]) == sorted(names)
    assert list(model.run_with_cache(tokens, names_filter="hook_embed")[1]) == ["hook_embed"]
    by_fn = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_z"))[1]
    assert sorted(by_fn) == ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]
    with pytest.raises(KeyError, match="blocks.0.hook_resid_post"):
        model.run_with_cache(tokens, names_filter=["blocks.0.hook_resid_pots"])
    assert not model.has_hooks


def test_cached_values_are_detached_copies(model, tokens):
    """A later hook that edits an earlier activation in place does not reach the cache."""
    held = {}

    def keep(act, hook):
        held["embed"] = act

    def vandalise(act, hook):
        held["embed"].mul_(0)

    params = dict(model.named_parameters())
    needs_grad = model.embed.W_E.requires_grad
    with model.hooks([("hook_embed", keep), ("blocks.0.hook_resid_pre", vandalise)]):
        _, cache_ = model.run_with_cache(tokens, names_filter="hook_embed")
    assert float(held["embed"].detach().abs().max()) == 0.0  # the edit happened
    torch.testing.assert_close(cache_["hook_embed"], params["embed.W_E"].detach()[tokens], atol=0, rtol=0)
    assert needs_grad and not cache_["hook_embed"].requires_grad


def test_device_and_dtype_apply_as_cached(model, tokens):
    _, full = model.run_with_cache(tokens)
    _, half = model.run_with_cache(tokens, device="cpu", dtype=torch.float16)
    for name in full:
        assert half[name].dtype == torch.float16 and half[name].device.type == "cpu"
        torch.testing.assert_close(half[name], full[name].half(), atol=0, rtol=0, msg=name)
    moved = full.to("cpu", torch.float64)
    assert moved["hook_embed"].dtype == torch.float64 and moved.nbytes == 2 * full.nbytes
    assert full["hook_embed"].dtype == torch.float32  # .to returns a new cache


def test_remove_batch_dim(model, tokens):
    _, batched = model.run_with_cache(tokens[:1])
    _, single = model.run_with_cache(tokens[:1], remove_batch_dim=True)
    assert not single.has_batch_dim
    for name in batched:
        torch.testing.assert_close(single[name], batched[name][0], atol=0, rtol=0)
    with pytest.raises(ValueError, match="batch of 1"):
        model.run_with_cache(tokens, remove_batch_dim=True)


def test_return_type_none_stops_after_last_requested(model, tokens):
    fired = []
    late = ["blocks.0.hook_mlp_out", "blocks.1.hook_resid_pre", "ln_final.hook_normalized"]
    with model.hooks([(n, lambda act, hook: fired.append(hook.name)) for n in late]):
        out, cache_ = model.run_with_cache(tokens, names_filter=["blocks.0.hook_resid_mid", "hook_embed"],
                                           return_type=None)
        assert out is None and fired == []
        model.run_with_cache(tokens, names_filter=["blocks.0.hook_resid_mid"])  # logits: runs to the end
        assert fired == late
    _, ref = captured(model, tokens, ["blocks.0.hook_resid_mid"])
    torch.testing.assert_close(cache_["blocks.0.hook_resid_mid"], ref["blocks.0.hook_resid_mid"], atol=0, rtol=0)
    assert not model.has_hooks


def test_stop_at_layer(model, tokens):
    resid, cache_ = model.run_with_cache(tokens, stop_at_layer=1)
    _, ref = captured(model, tokens, ["blocks.1.hook_resid_pre"])
    # The full cache hooks the pattern (explicit attention); the oracle runs the fused kernel.
    # measured 3.7e-9 (values up to 0.11), bound 1e-6: 268x
    torch.testing.assert_close(resid, ref["blocks.1.hook_resid_pre"], atol=1e-6, rtol=0)
    assert "blocks.0.hook_resid_post" in cache_ and "blocks.1.hook_resid_pre" not in cache_
    with pytest.raises(ValueError, match="blocks.1.hook_mlp_out"):
        model.run_with_cache(tokens, names_filter=["blocks.1.hook_mlp_out"], stop_at_layer=1)


def test_incl_bwd_caches_gradients_of_the_loss(model, tokens):
    sentinel = {n: torch.full_like(p, 7.0) for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        p.grad = sentinel[n].clone()
    names = ["blocks.0.hook_resid_post", "blocks.1.attn.hook_pattern", "hook_embed"]
    try:
        loss, cache_ = model.run_with_cache(tokens, names_filter=names, incl_bwd=True, return_type="loss")
        for n, p in model.named_parameters():
            torch.testing.assert_close(p.grad, sentinel[n], atol=0, rtol=0, msg=n)
    finally:
        for p in model.parameters():
            p.grad = None
    # Oracle: retain_grad on the same activations and a plain backward.
    held = {}

    def retain(act, hook):
        act.retain_grad()
        held[hook.name] = act

    with model.hooks([(n, retain) for n in names]):
        ref_loss = model(tokens, return_type="loss")
        ref_loss.backward()
    for p in model.parameters():
        p.grad = None
    torch.testing.assert_close(loss, ref_loss.detach(), atol=0, rtol=0)
    assert sorted(cache_) == sorted(names + [n + "_grad" for n in names])
    for n in names:
        # measured 0 (values up to 0.12), bound 1e-9 (exact here)
        torch.testing.assert_close(cache_[n + "_grad"], held[n].grad, atol=1e-9, rtol=1e-6, msg=n)
        assert float(cache_[n + "_grad"].abs().max()) > 0
    assert not model.has_hooks


@pytest.mark.parametrize("names_filter, dtype", [
    (None, None), (None, torch.float16), (lambda n: "pattern" in n, None),
    (["blocks.0.mlp.hook_post", "ln_final.hook_scale"], torch.float64),
])
def test_cache_size_predicts_bytes(model, tokens, names_filter, dtype):
    predicted = model.cache_size(tokens.shape, names_filter=names_filter, dtype=dtype)
    _, cache_ = model.run_with_cache(tokens, names_filter=names_filter, dtype=dtype)
    assert abs(predicted - cache_.nbytes) <= 0.01 * cache_.nbytes
    assert model.cache_size(tokens, names_filter=names_filter, dtype=dtype) == predicted


def test_budget_warning_names_the_size_and_the_fix(model, tokens, monkeypatch):
    size = model.cache_size(tokens.shape)
    monkeypatch.setattr(cache, "CACHE_BUDGET_BYTES", size - 1)
    with pytest.warns(CacheSizeWarning, match="names_filter") as record:
        model.run_with_cache(tokens)
    assert f"{size / 2**30:.2f} GiB" in str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.run_with_cache(tokens, names_filter="hook_embed")  # filtered: no warning
        monkeypatch.setattr(cache, "CACHE_BUDGET_BYTES", size)
        model.run_with_cache(tokens)  # at the budget: no warning


def test_text_input_keeps_tokens_and_mask():
    from glassbox.models import gpt2_tokenizer

    small = HookedTransformer(Config(d_model=14, n_layers=1, n_heads=2, d_vocab=50257, n_ctx=13, d_mlp=17),
                              tokenizer=gpt2_tokenizer())
    logits, cache_ = small.run_with_cache(["a b c", "a"], names_filter="hook_embed")
    tokens, mask = small.tokenize(["a b c", "a"])
    assert torch.equal(cache_.tokens, tokens) and torch.equal(cache_.attention_mask, mask)
    # measured 0 (values up to 0.35), bound 1e-6 (exact here)
    torch.testing.assert_close(logits, small(tokens, attention_mask=mask), atol=1e-6, rtol=0)


def test_a_raising_hook_leaves_no_cache_hooks_behind(model, tokens):
    def boom(act, hook):
        raise RuntimeError("user hook failed")

    with model.hooks([("blocks.1.hook_resid_mid", boom)]):
        with pytest.raises(RuntimeError, match="user hook failed"):
            model.run_with_cache(tokens, incl_bwd=True)
        attached = {n: (len(p.fwd_hooks), len(p.bwd_hooks)) for n, p in model.hook_dict.items() if p.has_hooks}
        assert attached == {"blocks.1.hook_resid_mid": (1, 0)}
    assert not model.has_hooks and all(p.grad is None for p in model.parameters())
