"""A frozen key-value cache: forwards read the cached prefix without extending it.

Oracle: the same model without a cache on the whole sequence (prefix + continuation, with the
concatenated padding mask), which must agree with the cached run at the continuation's positions.
Then the hostile cases: caches of another batch or model, masks of the wrong shape or values, a
start_at_layer forward on an unfrozen cache; each refused by name with the cache left as it was.
"""

import pytest
import torch

from glassbox.models import Config, HookedTransformer
from glassbox.models.kv_cache import KVCache

VOCAB = 41


def seeded(seed=0, **fields):
    options = dict(d_model=18, n_layers=3, n_heads=3, d_vocab=VOCAB, n_ctx=23, d_mlp=22, init_range=1.0)
    options.update(fields)
    torch.manual_seed(seed)
    model = HookedTransformer(Config(**options)).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim == 1:
                param.add_(0.2 * torch.randn_like(param))
    return model


@pytest.fixture(scope="module", params=["learned", "rotary"])
def model(request):
    return seeded(positional=request.param)


def ids(batch, pos, seed):
    return torch.randint(0, VOCAB, (batch, pos), generator=torch.Generator().manual_seed(seed))


def state(kv):
    return [(layer.k, layer.v) for layer in kv.layers], kv.key_mask


def assert_same_state(kv, before):
    layers, mask = before
    for i, ((k, v), layer) in enumerate(zip(layers, kv.layers)):
        assert layer.k is k and layer.v is v, f"layer {i}'s keys or values changed"
    assert kv.key_mask is mask


# measured max |cached - uncached|: 5.7e-6 (logits up to 14; the continuation and start_at_layer=2
# cases, learned and rotary), bound 5e-5: 9x
ATOL = 5e-5


@torch.no_grad()
def test_frozen_cache_reads_the_prefix_and_keeps_it(model):
    prefix, a, b = ids(2, 6, 0), ids(2, 5, 1), ids(2, 3, 2)
    kv = KVCache(model.cfg.n_layers)
    model(prefix, past_kv_cache=kv)
    kv.freeze()
    assert kv.frozen and all(layer.frozen for layer in kv.layers)
    before = state(kv)
    for cont in (a, b, a):
        got = model(cont, past_kv_cache=kv)
        want = model(torch.cat([prefix, cont], 1))[:, prefix.shape[1]:]
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        assert len(kv) == 6
        assert_same_state(kv, before)
    kv.unfreeze()
    assert not kv.frozen and not any(layer.frozen for layer in kv.layers)
    model(a, past_kv_cache=kv)
    assert len(kv) == 11
    got = model(b, past_kv_cache=kv)
    torch.testing.assert_close(got, model(torch.cat([prefix, a, b], 1))[:, 11:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("pre_side", ["left", "right"])
@pytest.mark.parametrize("post_side", ["left", "right", None])
@torch.no_grad()
def test_frozen_cache_with_padding_on_both_sides(model, pre_side, post_side):
    prefix, cont = ids(2, 6, 3), ids(2, 4, 4)
    pre_mask = torch.ones(2, 6, dtype=torch.long)
    pre_mask[1, :2] = 0 if pre_side == "left" else 1
    if pre_side == "right":
        pre_mask[1, 4:] = 0
    post_mask = None
    if post_side is not None:
        post_mask = torch.ones(2, 4, dtype=torch.long)
        if post_side == "left":
            post_mask[0, :1] = 0
        else:
            post_mask[0, 3:] = 0
    kv = KVCache(model.cfg.n_layers)
    model(prefix, attention_mask=pre_mask, past_kv_cache=kv)
    kv.freeze()
    before = state(kv)
    got = model(cont, attention_mask=post_mask, past_kv_cache=kv)
    full_mask = torch.cat([pre_mask, torch.ones(2, 4, dtype=torch.long) if post_mask is None else post_mask], 1)
    want = model(torch.cat([prefix, cont], 1), attention_mask=full_mask)[:, 6:]
    real = full_mask[:, 6:].bool()
    torch.testing.assert_close(got[real], want[real], atol=ATOL, rtol=0)
    assert_same_state(kv, before)


@torch.no_grad()
def test_start_at_layer_reads_a_frozen_cache(model):
    prefix, cont = ids(2, 5, 5), ids(2, 3, 6)
    kv = KVCache(model.cfg.n_layers)
    model(prefix, past_kv_cache=kv)
    kv.freeze()
    before = state(kv)
    want = model(torch.cat([prefix, cont], 1))[:, 5:]
    resid, toks, _, mask = model.input_to_embed(cont, past_kv_cache=kv)
    assert mask is None
    for layer in (0, 2):
        mid = model(cont, past_kv_cache=kv, stop_at_layer=layer) if layer else resid
        got = model(mid, start_at_layer=layer, past_kv_cache=kv)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        full_mask = torch.ones(2, 8, dtype=torch.long)  # input_to_embed's form: cached and new positions
        got = model(mid, start_at_layer=layer, past_kv_cache=kv, attention_mask=full_mask)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    assert_same_state(kv, before)


@torch.no_grad()
def test_start_at_layer_with_a_padded_frozen_cache(model):
    prefix, cont = ids(2, 5, 7), ids(2, 3, 8)
    pre_mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    kv = KVCache(model.cfg.n_layers)
    model(prefix, attention_mask=pre_mask, past_kv_cache=kv)
    kv.freeze()
    want = model(torch.cat([prefix, cont], 1), attention_mask=torch.cat([pre_mask, torch.ones(2, 3, dtype=torch.long)], 1))
    resid, toks, _, mask = model.input_to_embed(cont, past_kv_cache=kv)
    assert mask.shape == (2, 8)
    mid = model(cont, past_kv_cache=kv, stop_at_layer=1)
    for m in (mask, None, mask[:, 5:]):
        got = model(mid, start_at_layer=1, past_kv_cache=kv, attention_mask=m)
        torch.testing.assert_close(got, want[:, 5:], atol=ATOL, rtol=0)
    loss = model(mid, start_at_layer=1, past_kv_cache=kv, return_type="loss", tokens=toks)
    from glassbox.models.loss import lm_loss
    torch.testing.assert_close(loss, lm_loss(want[:, 5:], cont, None, False), atol=ATOL, rtol=0)


# -- hostile ---------------------------------------------------------------------------------------
@pytest.fixture()
def filled(model):
    kv = KVCache(model.cfg.n_layers)
    with torch.no_grad():
        model(ids(2, 5, 9), past_kv_cache=kv)
    return kv


@pytest.mark.parametrize("frozen", [False, True])
def test_a_batch_of_another_size_is_refused(model, filled, frozen):
    if frozen:
        filled.freeze()
    before = state(filled)
    with pytest.raises(ValueError, match="holds a batch of 2, the input has 3"):
        model(ids(3, 2, 10), past_kv_cache=filled)
    if frozen:
        with pytest.raises(ValueError, match="holds a batch of 2, the input has 1"):
            model(torch.randn(1, 2, model.cfg.d_model), start_at_layer=1, past_kv_cache=filled)
    assert_same_state(filled, before)


def test_a_cache_of_another_model_is_refused(model, filled):
    before = state(filled)
    with pytest.raises(ValueError, match="has 3 layers, the model 2"):
        seeded(positional=model.cfg.positional, n_layers=2)(ids(2, 2, 11), past_kv_cache=filled)
    other = seeded(positional=model.cfg.positional, n_heads=2, d_model=16)  # 3 layers, other heads
    with pytest.raises(ValueError, match="do not fit the cached keys"):
        other(ids(2, 2, 11), past_kv_cache=filled)
    assert_same_state(filled, before)
    with pytest.raises(TypeError, match="past_kv_cache"):  # the type checker in tests, else the forward
        model(ids(2, 2, 11), past_kv_cache=[None] * 3)


@pytest.mark.parametrize("mask, match", [
    (torch.ones(2, 3), "shape"),                     # not the new tokens' [batch pos]
    (torch.ones(3, 2), "shape"),
    (torch.tensor([[1, 0.5], [1, 1]]), "0.5"),
    (torch.tensor([[1, 2], [1, 1]]), "holds 2"),
])
def test_masks_of_the_wrong_shape_or_values_are_refused(model, filled, mask, match):
    filled.freeze()
    before = state(filled)
    with pytest.raises(ValueError, match=match):
        model(ids(2, 2, 12), attention_mask=mask, past_kv_cache=filled)
    with pytest.raises(ValueError, match=match):
        model(torch.zeros(2, 2, model.cfg.d_model), start_at_layer=1, past_kv_cache=filled, attention_mask=mask)
    assert_same_state(filled, before)


def test_append_mask_is_checked_and_a_longer_mask_is_refused_by_the_forward(model, filled):
    with pytest.raises(ValueError, match="batch of 3, the key-value cache 2"):
        filled.append_mask(torch.ones(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="0/1"):
        filled.append_mask(torch.full((2, 2), 0.5))
    with pytest.raises(ValueError, match=r"\[batch new_tokens\]"):
        filled.append_mask(torch.ones(2))
    filled.freeze()
    mask = filled.append_mask(torch.tensor([[1, 0], [1, 1]]))
    assert mask.dtype == torch.bool and mask.tolist() == [[True] * 5 + [True, False], [True] * 7]
    assert filled.key_mask is None  # frozen: not kept
    filled.unfreeze()
    filled.append_mask(torch.tensor([[1, 0], [1, 1]]))
    assert filled.key_mask.shape == (2, 7)
    with pytest.raises(ValueError, match="appended outside a forward"):
        model(ids(2, 2, 13), past_kv_cache=filled)


def test_start_at_layer_needs_a_frozen_cache_and_its_own_mask(model, filled):
    before = state(filled)
    with pytest.raises(ValueError, match=r"needs a frozen cache \(past_kv_cache.freeze\(\)\)"):
        model(torch.zeros(2, 2, model.cfg.d_model), start_at_layer=1, past_kv_cache=filled)
    filled.freeze()
    other = torch.ones(2, 7, dtype=torch.long)
    other[0, 0] = 0  # the cached positions were all real
    with pytest.raises(ValueError, match="differ from the key-value cache's mask"):
        model(torch.zeros(2, 2, model.cfg.d_model), start_at_layer=1, past_kv_cache=filled, attention_mask=other)
    with pytest.raises(ValueError, match="exceed n_ctx=23"):
        model(torch.zeros(2, 19, model.cfg.d_model), start_at_layer=1, past_kv_cache=filled)
    assert_same_state(filled, before)


def test_a_hook_raising_on_a_frozen_cache_leaves_it(model, filled):
    filled.freeze()
    before = state(filled)

    def boom(act, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        model.run_with_hooks(ids(2, 2, 14), past_kv_cache=filled, fwd_hooks=[("blocks.1.hook_resid_pre", boom)])
    assert_same_state(filled, before)
    assert filled.frozen
