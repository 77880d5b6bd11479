"""TransformerLens 3.9's ``utilities`` submodules that glassbox.tl gives (``_alias.SUBMODULES``, the
names of ``utils``) against TransformerLens 3.9 itself: ``tensors.filter_dict_by_prefix``,
``typed_module_list.TypedModuleList``, ``cache.get_pos_offset`` with the cache classes built as
TransformerLens's dataclasses, and ``logits_utils`` (``sample_logits``, ``_apply_repetition_penalty``,
``logits_to_df``). Every expected value is TransformerLens's output on the same input."""

import importlib

import pytest
import torch

import transformer_lens.utilities as tl_utilities
from glassbox.tl import utils as gb_utils
from glassbox.tl._alias import SUBMODULES
from glassbox.tl._utilities import logits_utils as gb_logits
from glassbox.tl._utilities.cache import get_pos_offset
from glassbox.tl.past_key_value_caching import HookedTransformerKeyValueCache as GbCache
from glassbox.tl.past_key_value_caching import HookedTransformerKeyValueCacheEntry as GbEntry
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache as TlCache
from transformer_lens.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry as TlEntry
from transformer_lens.utilities import logits_utils as tl_logits
from tl_oracle import max_diff, tiny_model, tl_twin
from transformer_lens.utilities.cache import get_pos_offset as tl_get_pos_offset


@pytest.mark.parametrize("path", sorted(SUBMODULES))
def test_each_submodule_gives_transformer_lens_3_9_public_names(path):
    theirs = importlib.import_module(f"transformer_lens.{path}")
    ours = importlib.import_module(f"glassbox.tl.{SUBMODULES[path]}")
    for name in ours.__all__:
        assert hasattr(theirs, name), f"TransformerLens 3.9's transformer_lens.{path} has no {name}"


@pytest.mark.parametrize("name", ["TypedModuleList", "filter_dict_by_prefix", "logits_to_df", "sample_logits"])
def test_utilities_package_names(name):
    assert hasattr(tl_utilities, name) and hasattr(gb_utils, name)


DICTS = [({"transformer.h.0.attn.W_Q": 1, "transformer.h.0.mlp.W_in": 2, "transformer.h.1.attn.W_K": 3,
           "transformer.h.01.x": 4, "transformer.h.0": 5, "transformer.h.0.": 6}, ["transformer.h.0",
                                                                                 "transformer.h.0.", "transformer",
                                                                                 "", ".", "nope"]),
         ({}, ["a"]), ({"a.b": 1, "ab.c": 2, ".x": 3}, ["a", "", "."])]


@pytest.mark.parametrize("dictionary,prefixes", DICTS)
def test_filter_dict_by_prefix_equals_transformer_lens(dictionary, prefixes):
    from transformer_lens.utilities.tensors import filter_dict_by_prefix

    for prefix in prefixes:
        ours = gb_utils.filter_dict_by_prefix(dictionary, prefix)
        theirs = filter_dict_by_prefix(dictionary, prefix)
        assert ours == theirs and list(ours) == list(theirs), prefix


def test_typed_module_list_is_a_module_list_like_transformer_lens():
    from transformer_lens.utilities import TypedModuleList as Theirs

    layers = [torch.nn.Linear(3, 5) for _ in range(4)]
    ours, theirs = gb_utils.TypedModuleList(layers), Theirs(layers)
    assert isinstance(ours, torch.nn.ModuleList) and gb_utils.TypedModuleList[torch.nn.Linear] is not None
    assert type(ours[1:3]) is gb_utils.TypedModuleList and type(theirs[1:3]) is Theirs
    assert list(ours[1:3]) == list(theirs[1:3]) == layers[1:3]
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]


@pytest.mark.parametrize("positions", [0, 1, 7])
def test_cache_built_as_transformer_lens_dataclass_gives_its_pos_offset(positions):
    keys = torch.randn(2, positions, 3, 5)
    values = torch.randn(2, positions, 3, 5)
    mask = torch.ones(2, 0, dtype=torch.int)
    theirs = TlCache(entries=[TlEntry(past_keys=keys, past_values=values)] * 2, previous_attention_mask=mask)
    ours = GbCache(entries=[GbEntry(past_keys=keys, past_values=values) for _ in range(2)],
                   previous_attention_mask=mask)
    assert tl_get_pos_offset(theirs, 2) == positions
    assert get_pos_offset(ours, 2) == positions and get_pos_offset(None, 2) == tl_get_pos_offset(None, 2) == 0
    assert ours.entries[1].past_keys is keys and ours.previous_attention_mask is None and len(ours) == positions


@torch.no_grad()
def test_cache_from_entries_continues_a_forward_as_transformer_lens_does():
    """A cache built, as TransformerLens's dataclass, from the keys and values its twin cached for a
    prefix serves the continuation as that twin's cache does, and as one full forward does."""
    model = tiny_model(0, n_layers=2, positional="learned").eval()
    twin = tl_twin(model)
    tokens = torch.randint(0, 50000, (2, 9), generator=torch.Generator().manual_seed(4))
    theirs_kv = TlCache.init_cache(twin.cfg, "cpu", 2)
    twin(tokens[:, :6], past_kv_cache=theirs_kv)
    rebuilt = GbCache(entries=[GbEntry(e.past_keys, e.past_values) for e in theirs_kv.entries],
                      previous_attention_mask=theirs_kv.previous_attention_mask)
    ours = model(tokens[:, 6:], past_kv_cache=rebuilt)
    theirs = twin(tokens[:, 6:], past_kv_cache=theirs_kv)
    assert max_diff(ours, theirs) < 3e-5  # measured 1.5e-6 (logits up to 4.5): 20x
    assert max_diff(ours, model(tokens)[:, 6:]) < 3e-5  # measured 1.4e-6
    assert len(rebuilt) == 9 and get_pos_offset(rebuilt, 2) == tl_get_pos_offset(theirs_kv, 2) == 9


@pytest.mark.parametrize("bad", [dict(past_keys=torch.zeros(1, 2, 3, 4)),
                                 dict(past_keys=torch.zeros(1, 2, 3, 4), past_values=torch.zeros(1, 3, 3, 4)),
                                 dict(past_keys=torch.zeros(2, 3, 4), past_values=torch.zeros(2, 3, 4))])
def test_entry_refuses_keys_and_values_that_do_not_pair(bad):
    with pytest.raises(ValueError, match="past_keys and past_values"):
        GbEntry(**bad)


def test_cache_refuses_a_layer_count_or_a_mask_of_other_length():
    with pytest.raises(ValueError, match="entries must be a non-empty list"):
        GbCache(2)
    entry = GbEntry(torch.zeros(1, 3, 2, 4), torch.zeros(1, 3, 2, 4))
    with pytest.raises(ValueError, match="covers 2 positions, the entries hold 3"):
        GbCache([entry], previous_attention_mask=torch.ones(1, 2, dtype=torch.int))
    padded = GbCache([entry], previous_attention_mask=torch.tensor([[0, 1, 1]]))
    assert padded.previous_attention_mask.tolist() == [[False, True, True]]


def test_repetition_penalty_equals_transformer_lens():
    torch.manual_seed(1)
    logits = torch.randn(3, 29) * 4
    logits[0, 5] = 0.0
    tokens = torch.randint(0, 29, (3, 11))
    tokens[0, 0] = 5
    for penalty in (0.5, 1.0, 1.7, 100.0):
        ours = gb_logits._apply_repetition_penalty(logits, tokens, penalty)
        assert torch.equal(ours, tl_logits._apply_repetition_penalty(logits, tokens, penalty)), penalty
    assert not torch.equal(gb_logits._apply_repetition_penalty(logits, tokens, 2.0), logits)


def test_greedy_and_deterministic_draws_equal_transformer_lens():
    torch.manual_seed(2)
    logits = torch.randn(4, 23) * 3
    tokens = torch.randint(0, 23, (4, 9))
    for kwargs in [dict(temperature=0.0), dict(temperature=0.0, repetition_penalty=50.0, tokens=tokens),
                   dict(top_k=1), dict(top_k=1, repetition_penalty=50.0, tokens=tokens),
                   dict(top_k=1, freq_penalty=100.0, tokens=tokens, temperature=0.7)]:
        ours = gb_logits.sample_logits(logits, **kwargs)
        assert torch.equal(ours, tl_logits.sample_logits(logits, **kwargs)), kwargs
    # top_p so small that only the most probable token survives: TransformerLens keeps exactly that one
    peaked = torch.tensor([[0.0, 9.0, 1.0], [4.0, 0.0, 8.0]])
    assert torch.equal(gb_logits.sample_logits(peaked, top_p=1e-3), tl_logits.sample_logits(peaked, top_p=1e-3))


def test_sampled_support_equals_transformer_lens():
    """Which ids a draw can give: top-k 3 of 11, top-p, and a frequency penalty that rules one id out."""
    logits = torch.tensor([[3.0, 2.9, 2.8, 0.0, -1.0, 2.7, 0.1, 0.2, -3.0, 1.0, 2.0]])
    torch.manual_seed(3)
    for kwargs in [dict(top_k=3), dict(top_p=0.6), dict(top_k=4, freq_penalty=1e4, tokens=torch.tensor([[0]]))]:
        ours = {gb_logits.sample_logits(logits, **kwargs).item() for _ in range(300)}
        theirs = {tl_logits.sample_logits(logits, **kwargs).item() for _ in range(300)}
        assert ours == theirs, kwargs  # e.g. top_k=3: {0, 1, 2}; p(any id unseen in 300) < 1e-40


@pytest.mark.parametrize("kwargs", [dict(top_k=0), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5),
                                    dict(freq_penalty=1.0)])
def test_bad_sampling_arguments_raise_assertion_error_as_transformer_lens(kwargs):
    logits = torch.randn(1, 4)
    with pytest.raises(AssertionError):
        tl_logits.sample_logits(logits, **kwargs)
    with pytest.raises(AssertionError) as info:
        gb_logits.sample_logits(logits, **kwargs)
    assert isinstance(info.value, ValueError) and list(kwargs)[0] in str(info.value)


def test_logits_to_df_equals_transformer_lens():
    class Tok:
        def decode(self, ids):
            return "".join(chr(97 + i) for i in ids)

    logits = torch.tensor([1.0, 3.0, 2.0, 0.5, -2.0, 3.5])
    for kwargs in [dict(), dict(tokenizer=Tok()), dict(top_k=2, tokenizer=Tok()), dict(top_k=10)]:
        ours, theirs = gb_logits.logits_to_df(logits, **kwargs), tl_logits.logits_to_df(logits, **kwargs)
        assert list(ours.columns) == list(theirs.columns)
        assert ours.equals(theirs), kwargs
    with pytest.raises(ValueError, match="1-D"):
        gb_logits.logits_to_df(torch.zeros(3, 4))


def test_softcap_helpers_equal_transformer_lens():
    from glassbox.tl import _activation_functions as ours
    from transformer_lens.utilities import activation_functions as theirs

    assert ours.SOFTCAP_DISABLED == theirs.SOFTCAP_DISABLED == -1.0
    x = torch.randn(4, 7, generator=torch.Generator().manual_seed(5)) * 80
    for cap in (None, 0, 0.0, -1.0, -5.0, 1e-3, 0.5, 30.0, 50, 1e6):
        assert ours.softcap_enabled(cap) is theirs.softcap_enabled(cap), cap
        got, want = ours.apply_softcap(x, cap), theirs.apply_softcap(x, cap)
        assert torch.equal(got, want), cap
        assert (got is x) == (want is x), cap
    assert torch.equal(ours.gelu_new(x), theirs.gelu_new(x))


class _Aliased(torch.nn.Module):
    """One Linear registered under two names, as a tied or aliased weight is."""

    def __init__(self):
        super().__init__()
        self.a = self.b = torch.nn.Linear(4, 3, bias=False)


@pytest.mark.parametrize("fail", [False, True])
def test_parameter_swap_equals_transformer_lens(fail):
    from glassbox.tl.utils import temporarily_swap_parameter as ours
    from transformer_lens.utilities.parameter_swap import temporarily_swap_parameter as theirs

    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(6))
    results = []
    for swap in (ours, theirs):
        torch.manual_seed(7)
        module = _Aliased()
        weight, before = module.a.weight, module.a.weight.detach().clone()
        weight.grad = torch.full_like(weight, 3.0)
        inside = None
        try:
            with swap(weight, 2.0 * before) as held:
                assert held is weight and module.b.weight is weight
                inside = module.a(x)
                if fail:
                    raise RuntimeError("inside the block")
        except RuntimeError:
            assert fail
        assert module.a.weight is weight and isinstance(module.b._parameters["weight"], torch.nn.Parameter)
        assert torch.equal(weight.detach(), before) and torch.equal(weight.grad, torch.full_like(weight, 3.0))
        results.append(inside)
    assert torch.equal(results[0], results[1])


@pytest.mark.parametrize("parameter,values,error", [
    (torch.zeros(2, 2), torch.zeros(2, 2), TypeError),
    (torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(2, 2)), TypeError),
    (torch.nn.Parameter(torch.zeros(2, 2)), [[0.0, 0.0], [0.0, 0.0]], TypeError),
    (torch.nn.Parameter(torch.zeros(2, 2)), torch.zeros(2, 3), ValueError),
    (torch.nn.Parameter(torch.zeros(2, 2)), torch.zeros(2, 2, dtype=torch.float64), ValueError)])
def test_parameter_swap_refuses_as_transformer_lens_and_changes_nothing(parameter, values, error):
    from glassbox.tl.utils import temporarily_swap_parameter as ours
    from transformer_lens.utilities.parameter_swap import temporarily_swap_parameter as theirs

    before = parameter.detach().clone()
    for swap in (ours, theirs):
        with pytest.raises(error):
            with swap(parameter, values):
                raise AssertionError("the block ran")
        assert torch.equal(parameter.detach(), before)
    with pytest.raises(error, match="shape|dtype|Parameter|plain torch.Tensor"):
        with ours(parameter, values):
            pass


@pytest.mark.parametrize("value", [{"a": 1}, object(), None])
def test_to_numpy_refuses_what_transformer_lens_refuses_saying_invalid_type(value):
    from transformer_lens.utilities.tensors import to_numpy as theirs

    for to_numpy in (theirs, gb_utils.to_numpy):
        with pytest.raises(ValueError, match="invalid type"):
            to_numpy(value)
    with pytest.raises(ValueError, match=type(value).__name__):
        gb_utils.to_numpy(value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kv_heads", [None, 2])
def test_init_cache_entry_equals_transformer_lens(dtype, kv_heads):
    from glassbox.tl import HookedTransformerConfig

    cfg = HookedTransformerConfig(d_model=24, d_head=4, n_layers=1, n_ctx=16, n_heads=6, n_key_value_heads=kv_heads,
                                  d_vocab=11, act_fn="gelu", dtype=dtype)
    ours = GbEntry.init_cache_entry(cfg, "cpu", batch_size=3)
    theirs = TlEntry.init_cache_entry(cfg, "cpu", batch_size=3)
    for a, b in ((ours.past_keys, theirs.past_keys), (ours.past_values, theirs.past_values)):
        assert a.shape == b.shape == (3, 0, kv_heads or 6, 4) and a.dtype == b.dtype == dtype
    new = torch.randn(3, 2, kv_heads or 6, 4).to(dtype)
    k, v = ours.append(new, new)
    assert torch.equal(k, theirs.append(new, new)[0]) and k.dtype == dtype and ours.past_keys.shape[1] == 2
