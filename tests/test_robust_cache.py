"""Hostile or careless uses of the cache and the plots fail clearly or do the right thing.

Each case was silently wrong before: a cache larger than memory started anyway (any filter), a
requested ``ln_final`` hook was dropped with ``return_type=None``, an integer cache dtype truncated
the activations, ``logit_attrs`` read token -1 from the end of the vocabulary, negative layer
indices were not counted from the end, and plotly parsed tokens as markup. The oracles are plain
hooks, the model's logits, /proc/meminfo read here, and the page as a real browser renders it.
"""

import html

import pytest
import torch

from glassbox import Config, HookedTransformer
from glassbox.interp import CacheMemoryError, cache
from glassbox.interp.plots import (attention_pattern, attention_viewer_html, attribution_bar, logit_lens_plot,
                                   patching_heatmap)
from glassbox.weights import hub_config

CFG = Config(d_model=15, n_layers=2, n_heads=3, d_head=5, d_mlp=23, d_vocab=29, n_ctx=17)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HookedTransformer(CFG).eval()


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, CFG.d_vocab, (3, 11), generator=torch.Generator().manual_seed(1))


def forwards_counted(model):
    """A counter of forward passes that does not attach a hook point (so the cache's copy rule holds)."""
    calls = []
    handle = model.embed.register_forward_pre_hook(lambda module, args: calls.append(1))
    return calls, handle


def captured(model, tokens, names):
    seen = {}
    with model.hooks([(n, lambda act, hook: seen.__setitem__(hook.name, act.detach().clone())) for n in names]):
        logits = model(tokens)
    return logits, seen


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


# -- 7. the memory check runs for every filter, before the forward ----------------------------------
@pytest.mark.parametrize("names_filter", [None, "hook_embed", ["blocks.1.attn.hook_pattern", "ln_final.hook_scale"],
                                          lambda name: name.endswith("hook_resid_post")])
def test_a_cache_larger_than_available_memory_is_refused_before_the_forward(model, tokens, names_filter, monkeypatch):
    size = model.cache_size(tokens.shape, names_filter)
    monkeypatch.setattr(cache, "available_bytes", lambda device: size - 1)
    calls, handle = forwards_counted(model)
    try:
        with pytest.raises(CacheMemoryError, match=rf"cache {size} bytes .* but {size - 1} bytes .* available") as err:
            model.run_with_cache(tokens, names_filter=names_filter)
        assert calls == [], "the forward ran before the refusal"
        assert isinstance(err.value, MemoryError)
        for fix in ("names_filter", "smaller batch", "dtype=torch.float16", "device=", "check_memory=False"):
            assert fix in str(err.value), fix
        # The explicit override runs, and the cache is the predicted size.
        _, forced = model.run_with_cache(tokens, names_filter=names_filter, check_memory=False)
        assert forced.nbytes == size and len(calls) == 1
        monkeypatch.setattr(cache, "available_bytes", lambda device: size)  # exactly fits
        _, fits = model.run_with_cache(tokens, names_filter=names_filter)
        assert fits.nbytes == size and len(calls) == 2
    finally:
        handle.remove()
    assert not model.has_hooks


def test_gpt2_small_at_64x1024_is_refused_against_the_real_meminfo():
    """The issue's case, on the meta device (nothing allocated): every hook, cached to the CPU."""
    small = HookedTransformer(hub_config("gpt2"), init=False, device="meta")
    tokens = torch.zeros(64, 1024, dtype=torch.long)
    size = small.cache_size(tokens.shape, lambda name: True)
    # The oracle for the size, from the hook shapes by hand: 115 GiB as the issue measured, plus the
    # norms' hook_out and the unembedding's hook_in and hook_out (the logits), 132 GiB in all.
    B, P, D, H, M, L, V = 64, 1024, 768, 12, 3072, 12, 50257
    # 9 d_model-wide (2 normalized, 2 out, resid_pre/mid/post, attn_out, mlp_out), 2 scales, q k v z,
    # 2 patterns, 2 MLP
    per_layer = 9 * B * P * D + 2 * B * P + 4 * B * P * H * 64 + 2 * B * H * P * P + 2 * B * P * M
    # embed, pos_embed; the blocks; ln_final's scale, normalized and out; unembed's hook_in and hook_out
    by_hand = 4 * (2 * B * P * D + L * per_layer + B * P + 2 * B * P * D + B * P * D + B * P * V)
    assert size == by_hand and 132 * 2**30 < size < 133 * 2**30
    free = mem_available()
    assert size > 2 * free, "this machine has room for the cache: the test needs one that does not"
    with pytest.raises(CacheMemoryError) as err:
        small.run_with_cache(tokens, names_filter=lambda name: True, device="cpu")
    message = str(err.value)
    assert f"cache {size} bytes ({size / 2**30:.2f} GiB)" in message and "on cpu" in message
    reported = int(message.split(" bytes (")[-2].rsplit(" ", 1)[-1])  # "... but N bytes (x GiB) are available"
    assert 0.8 * free < reported < 1.25 * free, (reported, free)


def test_cache_device_memory_is_the_one_checked(model, tokens, monkeypatch):
    seen, available = [], cache.available_bytes
    monkeypatch.setattr(cache, "available_bytes", lambda device: seen.append(torch.device(device)) or 2**40)
    model.run_with_cache(tokens, names_filter="hook_embed")
    model.run_with_cache(tokens, names_filter="hook_embed", device="meta")
    assert seen == [torch.device("cpu"), torch.device("meta")]
    assert available("meta") is None  # nothing to compare against: no refusal
    assert abs(available("cpu") - mem_available()) < 0.2 * mem_available()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_free_memory_is_what_torch_reports():
    free, total = torch.cuda.mem_get_info()
    got = cache.available_bytes("cuda")
    assert free <= got <= total


# -- 8. ln_final hooks with return_type=None --------------------------------------------------------
def test_return_type_none_still_caches_requested_final_norm_hooks(model, tokens):
    names = ["blocks.0.hook_resid_pre", "ln_final.hook_scale", "ln_final.hook_normalized"]
    out, got = model.run_with_cache(tokens, names_filter=names, return_type=None)
    _, ref = captured(model, tokens, names)
    assert out is None and sorted(got) == sorted(names)
    for name in names:
        torch.testing.assert_close(got[name], ref[name], atol=0, rtol=0, msg=name)
    out, everything = model.run_with_cache(tokens, return_type=None)
    assert out is None and sorted(everything) == sorted(model.hook_dict) and len(everything) == 45
    # Without a final-norm hook the forward still stops early (nothing beyond the last block runs).
    out, early = model.run_with_cache(tokens, names_filter="blocks.0.hook_resid_pre", return_type=None)
    assert out is None and list(early) == ["blocks.0.hook_resid_pre"]
    assert not model.has_hooks


# -- 9. integer cache dtypes ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.uint8])
def test_cache_to_an_integer_dtype_is_refused(model, tokens, dtype):
    _, got = model.run_with_cache(tokens, names_filter="blocks.0.hook_resid_pre")
    with pytest.raises(ValueError, match=rf"dtype={dtype}.*floating"):
        got.to(dtype=dtype)
    half = got.to(dtype=torch.float16)["blocks.0.hook_resid_pre"]
    assert half.dtype == torch.float16
    # measured 3.0e-5 (values up to 0.11), bound 0.002: 66x
    torch.testing.assert_close(half.float(), got["blocks.0.hook_resid_pre"], atol=2e-3, rtol=1e-3)


# -- 10. token ids of logit_attrs -------------------------------------------------------------------
@pytest.mark.parametrize("bad", [-1, -29, 29, 1000, torch.tensor([3, -1, 4])])
def test_logit_attrs_refuses_ids_outside_the_vocabulary(model, tokens, bad):
    _, got = model.run_with_cache(tokens)
    stack = got.decompose_resid(pos_slice=-1)
    value = int(bad.min()) if isinstance(bad, torch.Tensor) else bad
    with pytest.raises(ValueError, match=rf"token id {value} is outside \[0, d_vocab=29\)"):
        got.logit_attrs(stack, bad, pos_slice=-1)
    with pytest.raises(ValueError, match=rf"token id {value} "):
        got.logit_attrs(stack, 3, incorrect_tokens=bad, pos_slice=-1)


def test_logit_attrs_of_in_range_ids_sum_to_the_logits(model, tokens):
    logits, got = model.run_with_cache(tokens)
    stack = got.decompose_resid(pos_slice=-1)
    for token in (0, 28):
        attrs = got.logit_attrs(stack, token, pos_slice=-1)
        # measured 1.5e-8 (values up to 0.078), bound 1e-5: 671x
        torch.testing.assert_close(attrs.sum(0), logits[:, -1, token], atol=1e-5, rtol=0)
    ids = torch.tensor([28, 0, 5])
    attrs = got.logit_attrs(stack, ids, pos_slice=-1)
    # measured 7.5e-9 (values up to 0.1), bound 1e-5: 1342x
    torch.testing.assert_close(attrs.sum(0), logits[torch.arange(3), -1, ids], atol=1e-5, rtol=0)


# -- 11. negative layer indices ---------------------------------------------------------------------
def test_negative_layers_count_from_the_end(model, tokens):
    _, got = model.run_with_cache(tokens)
    assert got["resid_post", -1] is got["blocks.1.hook_resid_post"]
    assert got["resid_pre", -2] is got["blocks.0.hook_resid_pre"]
    assert got["pattern", -1] is got["blocks.1.attn.hook_pattern"]
    assert got["scale", -2, "ln2"] is got["blocks.0.ln2.hook_scale"]
    assert got["q", -1, "attn"] is got["blocks.1.attn.hook_q"]
    assert ("resid_post", -1) in got and ("resid_post", -3) not in got
    for layer in (2, -3, 100):
        with pytest.raises(KeyError, match=rf"layer {layer} of key .* outside \[-n_layers, n_layers\) = \[-2, 2\)"):
            got["resid_post", layer]


def test_negative_layer_gradients_count_from_the_end(model, tokens):
    _, got = model.run_with_cache(tokens, names_filter="blocks.1.hook_resid_post", incl_bwd=True)
    assert got["resid_post_grad", -1] is got["blocks.1.hook_resid_post_grad"]


# -- 12. tokens are text in figures and in the viewer -----------------------------------------------
MARKUP = ["<b>x</b>", "a&b", "<br>", " <i>"]
ESCAPED = ["&lt;b&gt;x&lt;/b&gt;", "a&amp;b", "&lt;br&gt;", "\u00b7&lt;i&gt;"]


def test_figure_labels_and_hover_escape_markup():
    pattern = torch.full((4, 4), 0.25)
    fig = attention_pattern(pattern, MARKUP)
    assert list(fig.layout.xaxis.ticktext) == ESCAPED and list(fig.layout.yaxis.ticktext) == ESCAPED
    hover = fig.data[0].text
    assert hover[0][1] == "query 0 '&lt;b&gt;x&lt;/b&gt;'<br>key 1 'a&amp;b'"  # the <br> between them is ours
    from glassbox.interp.patching import PatchResult

    titled = patching_heatmap(PatchResult(torch.zeros(2, 4), ("layer", "pos"), metric="LogitDiff('<b>', ' x')"))
    assert titled.layout.title.text == "patching  (LogitDiff('&lt;b&gt;', ' x'))"
    assert patching_heatmap(torch.zeros(2, 4), title="<b>mine</b>").layout.title.text == "<b>mine</b>"  # the caller's
    heat = patching_heatmap(torch.zeros(2, 4), x_labels=MARKUP, y_labels=["<b>0</b>", "1"])
    assert list(heat.layout.xaxis.ticktext) == ESCAPED
    assert list(heat.layout.yaxis.ticktext) == ["&lt;b&gt;0&lt;/b&gt;", "1"]
    assert all("<b>" not in cell for row in heat.data[0].text for cell in row)
    lens = logit_lens_plot(torch.zeros(1, 4), layer_labels=MARKUP, series_labels=["<b>answer</b>"])
    assert lens.data[0].name == "&lt;b&gt;answer&lt;/b&gt;"
    assert list(lens.data[0].text) == [html.escape(m, quote=False) for m in MARKUP]
    assert "<b>" not in lens.data[0].hovertemplate
    bars = attribution_bar(torch.tensor([1.0, -1.0, 0.5, 0.0]), MARKUP)
    assert list(bars.data[0].text) == [html.escape(m, quote=False) for m in MARKUP]
    assert list(bars.layout.xaxis.ticktext) == ESCAPED


def test_viewer_shows_markup_tokens_as_written_in_chromium(tmp_path):
    from test_viewer_browser import CAPTURE, find_browser, probe, run_in_browser

    browser = find_browser()
    patterns = torch.full((1, 2, 4, 4), 0.25)
    page = attention_viewer_html(patterns, MARKUP)
    script = probe("""  try {
    var gd = document.getElementById("attention");
    out.xticks = Array.prototype.map.call(gd.querySelectorAll(".xtick text"), function (n) { return n.textContent; });
    out.bold = gd.querySelectorAll(".xtick tspan[style*='bold'], .ytick tspan[style*='bold']").length;
    out.tspans = gd.querySelectorAll(".xtick tspan, .ytick tspan").length;
    Plotly.Fx.hover(gd, {xval: 1, yval: 0}, "xy");
    out.hover = Array.prototype.map.call(gd.querySelectorAll(".hoverlayer .hovertext"), function (n) { return n.textContent; });
    out.tokens = document.getElementById("tokens").textContent;
    out.bold_in_page = document.querySelectorAll("body b, body i").length;
  } catch (e) { out.exception = String(e && e.stack || e); }
""")
    path = tmp_path / "probe.html"
    path.write_text(page.replace("<head>", "<head>" + CAPTURE, 1).replace("</body>", script + "</body>", 1),
                    encoding="utf-8")
    seen, _ = run_in_browser(browser, str(path))
    assert "exception" not in seen, seen["exception"]
    assert seen["errors"] == []
    assert seen["xticks"] == ["<b>x</b>", "a&b", "<br>", "\u00b7<i>"], seen["xticks"]
    assert seen["bold"] == 0 and seen["tspans"] == 0, "a tick label was parsed as markup"
    assert len(seen["hover"]) == 1 and "query 0 '<b>x</b>'" in seen["hover"][0], seen["hover"]
    assert "key 1 'a&b'" in seen["hover"][0], seen["hover"]
    assert seen["tokens"] == " | ".join(MARKUP) and seen["bold_in_page"] == 0


def test_a_hook_point_added_after_construction_is_cached_though_not_sized():
    from glassbox.hooks import HookPoint

    torch.manual_seed(0)
    model = HookedTransformer(Config(d_model=16, n_layers=1, n_heads=2, d_vocab=37, n_ctx=8))
    model.blocks[0].hook_extra = HookPoint()  # as a library splicing its own module in would
    original = model.blocks[0].forward
    model.blocks[0].forward = lambda resid, *a, **k: model.blocks[0].hook_extra(original(resid, *a, **k))
    model.setup()
    toks = torch.randint(0, 37, (2, 5), generator=torch.Generator().manual_seed(1))
    logits, cache = model.run_with_cache(toks)
    assert torch.equal(cache["blocks.0.hook_extra"], cache["blocks.0.hook_resid_post"])
    with pytest.raises(KeyError, match="blocks.0.hook_extra.*no entry in HOOK_SHAPES"):
        model.cache_size(toks.shape, "blocks.0.hook_extra")
