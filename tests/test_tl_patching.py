"""TransformerLens's metric contract on the batched engine (VariantMetric), and glassbox.tl.patching's
get_act_patch_* functions, against a one-patch-per-forward loop written here (patching_oracle).

The metric of the loop is TransformerLens's kind: the patched logits [batch pos d_vocab] of one patch
to one scalar (a batch mean, or one that mixes prompts), so a result that called it on the wrong rows,
or averaged per-prompt values instead, would differ.
"""

import itertools
import random

import pytest
import torch
from torch.testing import assert_close

from glassbox.interp.patching import VariantMetric, activation_patch, patch_resid_pre
from glassbox.tl import patching as tlp
from patching_oracle import patched_logits, tiny_model

N_PROMPTS, POS = 3, 6


@pytest.fixture(scope="module")
def setup():
    model = tiny_model()
    generator = torch.Generator().manual_seed(5)
    clean = torch.randint(0, model.cfg.d_vocab, (N_PROMPTS, POS), generator=generator)
    corrupted = torch.randint(0, model.cfg.d_vocab, (N_PROMPTS, POS), generator=generator)
    _, cache = model.run_with_cache(clean, names_filter=lambda n: n.startswith("blocks.") and ".ln" not in n)
    return model, corrupted, cache


def batch_mean_diff(logits):
    return (logits[:, -1, 3] - logits[:, -1, 7]).mean()


def mixing(logits):
    """Depends on which rows are one patch's batch, and on their order: not a mean of per-prompt values."""
    return logits[0, -1, 3] - logits[1, 2, 7] + 0.5 * logits[:, -2, 11].std()


def loop(model, corrupted, cache, metric, kind, names, point):
    return float(metric(patched_logits(model, corrupted, cache, kind, dict(zip(names, point)))))


def some_points(shape: tuple, n: int, seed: int) -> list:
    """The first and last grid points and ``n - 2`` seeded random others (the loop is slow)."""
    points = list(itertools.product(*(range(k) for k in shape)))
    return [points[0], points[-1]] + random.Random(seed).sample(points[1:-1], n - 2)


@pytest.fixture(scope="module")
def mixing_resid_pre_loop(setup):
    model, corrupted, cache = setup
    points = some_points((L, POS), 6, seed=0)
    return points, [loop(model, corrupted, cache, mixing, "resid_pre", ("layer", "pos"), p) for p in points]


# -- VariantMetric: the engine calls a whole-batch metric on each variant's own rows --------------
@pytest.mark.parametrize("budget", [2**30, 40_000], ids=["one-pass", "many-passes"])
def test_variant_metric_equals_the_loop_on_each_variants_rows(setup, mixing_resid_pre_loop, budget):
    model, corrupted, cache = setup
    result = patch_resid_pre(model, corrupted, cache, VariantMetric(mixing), memory_budget=budget, bands=2)
    assert result.axes == ("layer", "pos") and result.shape == (model.cfg.n_layers, POS)
    points, expected = mixing_resid_pre_loop
    got = torch.stack([result.values[p] for p in points])
    # measured 9.5e-7 over the whole grid (values up to 5.4), bound 1e-5: 10x
    assert_close(got, torch.tensor(expected), atol=1e-5, rtol=0)


def test_variant_metric_may_return_a_number_and_its_result_has_no_prompt_axis(setup):
    model, corrupted, cache = setup
    as_number = activation_patch(model, corrupted, cache, VariantMetric(lambda lg: float(batch_mean_diff(lg))),
                                 "z", ("layer", "head"))
    as_tensor = activation_patch(model, corrupted, cache, VariantMetric(batch_mean_diff), "z", ("layer", "head"))
    assert as_number.axes == ("layer", "head") and as_number.values.dtype == torch.float64
    # a number is the float32 value read exactly into float64
    assert torch.equal(as_number.values.float(), as_tensor.values)


def test_variant_metric_refusals_name_the_problem(setup):
    model, corrupted, cache = setup
    with pytest.raises(ValueError, match="VariantMetric gives one value per variant"):
        patch_resid_pre(model, corrupted, cache, VariantMetric(batch_mean_diff), reduce=None)
    with pytest.raises(ValueError, match="returned shape \\(3,\\)"):
        patch_resid_pre(model, corrupted, cache, VariantMetric(lambda lg: lg[:, -1, 3]))
    with pytest.raises(TypeError, match="returned str"):
        patch_resid_pre(model, corrupted, cache, VariantMetric(lambda lg: "high"))
    with pytest.raises(TypeError, match="VariantMetric wraps a function|fn"):  # glassbox or the shape checker
        VariantMetric(3)


# -- glassbox.tl.patching against the loop --------------------------------------------------------
# (function, activation kind of the loop, the loop's point axes, the result's shape as (axis, ...))
L, H = 3, 5
CASES = [
    (tlp.get_act_patch_resid_pre, "resid_pre", ("layer", "pos"), (L, POS)),
    (tlp.get_act_patch_resid_mid, "resid_mid", ("layer", "pos"), (L, POS)),
    (tlp.get_act_patch_attn_out, "attn_out", ("layer", "pos"), (L, POS)),
    (tlp.get_act_patch_mlp_out, "mlp_out", ("layer", "pos"), (L, POS)),
    (tlp.get_act_patch_attn_head_out_by_pos, "z", ("layer", "pos", "head"), (L, POS, H)),
    (tlp.get_act_patch_attn_head_q_by_pos, "q", ("layer", "pos", "head"), (L, POS, H)),
    (tlp.get_act_patch_attn_head_k_by_pos, "k", ("layer", "pos", "head"), (L, POS, H)),
    (tlp.get_act_patch_attn_head_v_by_pos, "v", ("layer", "pos", "head"), (L, POS, H)),
    (tlp.get_act_patch_attn_head_pattern_by_pos, "pattern", ("layer", "head", "query_pos"), (L, H, POS)),
    (tlp.get_act_patch_attn_head_out_all_pos, "z", ("layer", "head"), (L, H)),
    (tlp.get_act_patch_attn_head_q_all_pos, "q", ("layer", "head"), (L, H)),
    (tlp.get_act_patch_attn_head_k_all_pos, "k", ("layer", "head"), (L, H)),
    (tlp.get_act_patch_attn_head_v_all_pos, "v", ("layer", "head"), (L, H)),
    (tlp.get_act_patch_attn_head_pattern_all_pos, "pattern", ("layer", "head"), (L, H)),
]


@pytest.mark.parametrize("fn, kind, names, shape", CASES, ids=lambda c: getattr(c, "__name__", None))
def test_get_act_patch_equals_the_loop_with_a_batch_mean_metric(setup, fn, kind, names, shape):
    model, corrupted, cache = setup
    got = fn(model, corrupted, cache, batch_mean_diff)
    assert type(got) is torch.Tensor and got.shape == shape and got.dtype == torch.float32
    for point in some_points(shape, 4, seed=len(names)):
        expected = loop(model, corrupted, cache, batch_mean_diff, kind, names, point)
        # measured 9.5e-7 over every point of every case (values up to 3.7), bound 1e-5: 10x
        assert abs(float(got[point]) - expected) < 1e-5, (fn.__name__, point)


def test_dest_src_pattern_patch_equals_the_loop(setup):
    model, corrupted, cache = setup
    got = tlp.get_act_patch_attn_head_pattern_dest_src_pos(model, corrupted, cache, mixing)
    assert got.shape == (L, H, POS, POS)
    for layer, head, dest, src in some_points((L, H, POS, POS), 5, seed=4):
        name = f"blocks.{layer}.attn.hook_pattern"

        def patch(act, hook):
            act = act.clone()
            act[:, head, dest, src] = cache[name][:, head, dest, src]
            return act

        with torch.no_grad():
            expected = float(mixing(model.run_with_hooks(corrupted, fwd_hooks=[(name, patch)])))
        # measured 9.5e-7 over a seventh of the grid (values up to 5.0), bound 1e-5: 10x
        assert abs(float(got[layer, head, dest, src]) - expected) < 1e-5, (layer, head, dest, src)


EVERY = [  # (function, its components as (loop kind, the loop's point axes), shape)
    (tlp.get_act_patch_block_every, [("resid_pre", ("layer", "pos")), ("attn_out", ("layer", "pos")),
                                     ("mlp_out", ("layer", "pos"))], (3, L, POS)),
    (tlp.get_act_patch_attn_head_all_pos_every, [(k, ("layer", "head")) for k in ("z", "q", "k", "v", "pattern")],
     (5, L, H)),
    # the pattern component is patched by query row, and laid out [layer pos head] like the others
    (tlp.get_act_patch_attn_head_by_pos_every, [(k, ("layer", "pos", "head")) for k in ("z", "q", "k", "v")]
     + [("pattern", ("layer", "query_pos", "head"))], (5, L, POS, H)),
]


@pytest.mark.parametrize("fn, components, shape", EVERY, ids=lambda c: getattr(c, "__name__", None))
def test_every_sweeps_stack_components_in_transformer_lens_order(setup, fn, components, shape):
    model, corrupted, cache = setup
    got = fn(model, corrupted, cache, batch_mean_diff)
    assert type(got) is torch.Tensor and got.shape == shape and got.dtype == torch.float32
    for c, (kind, names) in enumerate(components):
        for point in random.Random(c).sample(list(itertools.product(*map(range, shape[1:]))), 2):
            expected = loop(model, corrupted, cache, batch_mean_diff, kind, names, point)
            # measured 9.5e-7 over every point (values up to 3.7), bound 1e-5: 10x
            assert abs(float(got[(c, *point)]) - expected) < 1e-5, (fn.__name__, kind, point)


def test_generic_patch_with_an_own_setter_runs_the_loop_with_the_same_values(setup):
    model, corrupted, cache = setup
    calls = []

    def own_setter(act, index, clean):  # TransformerLens's setter contract: (activation, index, clean act)
        calls.append(list(index))
        act[:, 1:] = clean[:, 1:]  # every position but the first: no named sweep does this
        return act

    got = tlp.generic_activation_patch(model, corrupted, cache, mixing, own_setter, "resid_mid", ("layer",))
    assert calls == [[0], [1], [2]] and got.shape == (L,) and got.dtype == torch.float32
    for layer in range(L):
        name = f"blocks.{layer}.hook_resid_mid"
        with torch.no_grad():
            logits = model.run_with_hooks(corrupted, fwd_hooks=[(name, lambda act, hook: torch.cat(
                [act[:, :1], cache[hook.name][:, 1:]], dim=1))])
        # measured 0 (the fallback runs this same forward; values up to 4.6), bound 1e-6 for another kernel order
        assert abs(float(got[layer]) - float(mixing(logits))) < 1e-6, layer
    with pytest.raises(ValueError, match="exactly one of index_axis_names"):
        tlp.generic_activation_patch(model, corrupted, cache, mixing, own_setter, "resid_mid")
    with pytest.raises(ValueError, match="index_axis_names \\['position'\\]"):
        tlp.generic_activation_patch(model, corrupted, cache, mixing, own_setter, "resid_mid", ("layer", "position"))


def test_generic_patch_with_a_known_setter_runs_on_the_engine(setup):
    model, corrupted, cache = setup
    got = tlp.generic_activation_patch(model, corrupted, cache, mixing, tlp.layer_pos_head_vector_patch_setter, "z",
                                       index_axis_names=("layer", "pos", "head_index"))
    engine = activation_patch(model, corrupted, cache, VariantMetric(mixing), "z", ("layer", "pos", "head"))
    assert torch.equal(got, engine.values.float())  # the engine's values, as TransformerLens's float32 tensor


class _Rows:
    """The one method of a DataFrame that index_df is read through (pandas is not a dependency)."""

    def __init__(self, rows):
        self.rows = rows

    def itertuples(self, index=False):
        return iter(self.rows)


def test_index_df_rows_are_checked_before_the_sweep_and_empty_gives_empty():
    import glassbox.tl.patching as P
    from glassbox import tl

    model = tl.HookedTransformer.from_pretrained_no_processing("glassbox-austen")
    corrupted = model.to_tokens("Elizabeth read the garden")
    _, cache = model.run_with_cache(model.to_tokens("Elizabeth read the letter"))
    calls = []

    def metric(logits):
        calls.append(1)
        return logits[:, -1, 5].mean()

    def rows(index_df):
        return P.generic_activation_patch(model, corrupted, cache, metric, P.layer_pos_patch_setter, "resid_pre",
                                          index_df=_Rows(index_df))

    for bad in ([(5, 1)], [(0, 6)], [(0, -7)]):
        with pytest.raises(ValueError, match=r"index_df row .* is outside"):
            rows(bad)
    assert not calls  # refused before any patched run
    assert rows([]).numel() == 0
    assert not calls
    picked = rows([(1, -1), (0, 2)])
    grid = P.get_act_patch_resid_pre(model, corrupted, cache, metric)
    assert torch.equal(picked, torch.stack([grid[1, -1], grid[0, 2]]))


def test_a_metric_may_return_numpy_scalars_as_transformer_lens_allows():
    import numpy as np

    import glassbox.tl.patching as P
    from glassbox import tl

    model = tl.HookedTransformer.from_pretrained_no_processing("glassbox-austen")
    corrupted = model.to_tokens("Elizabeth read the garden")
    _, cache = model.run_with_cache(model.to_tokens("Elizabeth read the letter"))
    as_tensor = P.get_act_patch_resid_pre(model, corrupted, cache, lambda l: l[:, -1, 5].mean())
    as_numpy = P.get_act_patch_resid_pre(model, corrupted, cache, lambda l: np.float32(l[:, -1, 5].mean().item()))
    assert torch.equal(as_tensor, as_numpy)
    with pytest.raises(TypeError, match="returned a torch.bool tensor"):
        P.get_act_patch_resid_pre(model, corrupted, cache, lambda l: l[:, -1, 5].mean() > 0)


def test_key_and_value_sweeps_of_a_grouped_query_model_patch_each_kv_head():
    """With grouped-query attention get_act_patch_attn_head_k/v_* sweep the kv heads (TransformerLens
    indexes past them there), each entry equal to one hooked forward patching that kv head."""
    from glassbox.models import preset_config
    from glassbox.tl import HookedTransformer

    torch.manual_seed(3)
    model = HookedTransformer(preset_config("modern", d_model=24, n_layers=2, n_heads=6, n_key_value_heads=2, d_head=4,
                                            d_vocab=29, n_ctx=16, d_mlp=37))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    generator = torch.Generator().manual_seed(6)
    clean = torch.randint(0, 29, (2, 7), generator=generator)
    corrupted = torch.randint(0, 29, (2, 7), generator=generator)
    _, cache = model.run_with_cache(clean)
    for kind, sweep in (("k", tlp.get_act_patch_attn_head_k_all_pos), ("v", tlp.get_act_patch_attn_head_v_by_pos)):
        got = sweep(model, corrupted, cache, batch_mean_diff)
        by_pos = got.ndim == 3
        assert got.shape == ((2, 7, 2) if by_pos else (2, 2)), kind
        for index in itertools.product(*(range(n) for n in got.shape)):
            layer, head = index[0], index[-1]
            name = f"blocks.{layer}.attn.hook_{kind}"

            def patch(act, hook, pos=index[1] if by_pos else slice(None), head=head):
                act = act.clone()
                act[:, pos, head] = cache[name][:, pos, head]
                return act

            with torch.no_grad():
                expected = batch_mean_diff(model.run_with_hooks(corrupted, fwd_hooks=[(name, patch)]))
            # measured <= 2.4e-7 (values up to 2.9), bound 3e-6: 12x
            assert_close(got[index], expected, atol=3e-6, rtol=0, msg=lambda m, i=index: f"{kind} {i}: {m}")
