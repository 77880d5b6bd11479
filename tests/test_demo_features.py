"""The demo report's feature section (glassbox.interp.report_features), with a random SAE on a tiny
GPT-2-vocabulary model: its caption's and summary's numbers against `transformers`' GPT-2 on the same
weights with the SAE's reconstruction computed by hand, ReLU((x - b_dec) W_enc + b_enc) W_dec + b_dec,
put into the residual stream entering block 1 by a forward pre-hook."""

import json
import re

import pytest
import torch

from glassbox.interp.report import build_report
from glassbox.interp.sae.base import StandardSAE
from glassbox.interp.sae.config import SAEConfig
from glassbox.models import HookedTransformer
from glassbox.weights import hub_config
from test_demo import captions_of, hf_run, hf_twin, number_after, story_tokens

PROMPT = "Elizabeth read the letter again, and then walked to the window. When Jane came in, Elizabeth read the"
HOOK = "blocks.1.hook_resid_pre"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch.manual_seed(3)
    model = HookedTransformer(hub_config("gpt2").replace(n_layers=2, d_model=24, n_heads=3, n_ctx=64))
    path = tmp_path_factory.mktemp("model")
    model.save_pretrained(path)
    return path


def random_sae():
    torch.manual_seed(5)
    sae = StandardSAE(SAEConfig("standard", 24, 37, HOOK))
    with torch.no_grad():
        sae.b_enc.normal_(-0.2, 0.2)
        sae.b_dec.normal_(0.0, 0.05)
    return sae


@pytest.fixture(scope="module")
def report(folder, tmp_path_factory):
    model = HookedTransformer.from_pretrained(str(folder))
    out = tmp_path_factory.mktemp("report")
    text = "Emma sat by the fire. Mr. Knightley came in and sat down. " * 12
    summary = build_report(model, PROMPT, " letter", " garden", out, sae=random_sae(), feature_text=text)
    return summary, out


def test_feature_caption_against_a_hand_reconstruction(report, folder):
    summary, out = report
    caption = captions_of((out / "index.html").read_text())["features"]
    assert summary["captions"]["features"] == caption
    assert json.loads((out / "summary.json").read_text())["features"] == summary["features"]
    features = summary["features"]

    sae = random_sae()
    W_enc, b_enc, W_dec, b_dec = (p.detach().double() for p in (sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec))
    hf = hf_twin(folder).double()
    _, tokens, _, answer, distractor, _ = story_tokens(folder)
    clean = hf_run(hf, tokens)
    x = clean.hidden_states[1][0]  # the residual stream entering block 1 [pos d_model]
    acts = torch.relu((x - b_dec) @ W_enc + b_enc)
    recons = acts @ W_dec + b_dec
    keep = slice(1, None)  # every position but the BOS
    l0 = float((acts[keep] > 0).double().sum(-1).mean())
    xs = x[keep]
    explained = 1 - float((xs - recons[keep]).square().sum() / (xs - xs.mean(0)).square().sum())
    diff = lambda out: float(out.logits[0, -1, answer] - out.logits[0, -1, distractor])
    clean_diff = diff(clean)
    spliced = diff(hf_run(hf, tokens, 1, lambda h: recons[None].to(h.dtype)))

    assert abs(features["l0"] - l0) < 1e-9  # counts of active features: measured 0
    # float32 SAE and model against float64 here: measured 1.4e-7 (value -4.9), bound 2e-6: 14x
    assert abs(features["explained_variance"] - explained) < 2e-6
    # measured 5e-9 and 9e-9 (logit differences ~0.07), bound 2e-7: 22x
    assert abs(features["clean_logit_diff"] - clean_diff) < 2e-7
    assert abs(features["spliced_logit_diff"] - spliced) < 2e-7
    assert features["error_term_max_abs_logit_change"] == 0.0, "the error term leaves the logits exact"
    assert features["error_term_logit_diff"] == features["clean_logit_diff"]
    assert f"L0 {l0:.1f}, explained variance {explained:.3f}" in caption
    assert abs(number_after(caption, "clean") - clean_diff) < 6e-4  # the caption rounds to 3 decimals
    assert abs(number_after(caption, "with the SAE's reconstruction spliced in") - spliced) < 6e-4
    assert "(largest |logit change| 0.0e+00)" in caption

    # the features most active at the last token; each zeroed there alone, the error term keeping the rest
    top = acts[-1].topk(5)
    rows = features["top_features"]
    assert [r["feature"] for r in rows] == top.indices.tolist()
    for r, f, a in zip(rows, top.indices.tolist(), top.values.tolist()):
        assert abs(r["activation"] - a) < 2e-7  # measured 1.1e-8 (values up to 0.15), bound 2e-7: 18x

        def ablate(h, f=f, a=a):
            h = h.clone()
            h[0, -1] -= a * W_dec[f].to(h.dtype)
            return h

        by_hand = diff(hf_run(hf, tokens, 1, ablate))
        # measured 2.8e-8 (logit differences up to 0.13), bound 5e-7: 18x
        assert abs(r["ablated_logit_diff"] - by_hand) < 5e-7, (f, r, by_hand)
        shown = re.search(rf"\b{f} \(activation {a:.2f}\): ([-+]\d+\.\d+)", caption)
        assert shown and abs(float(shown.group(1)) - (by_hand - clean_diff)) < 6e-4, (f, caption)


def test_feature_figure_and_dashboard(report):
    summary, out = report
    page = (out / "index.html").read_text()
    assert 'id="figure-features"' in page and page.count('class="plotly-graph-div"') == 8
    dashboard = (out / "features.html").read_text()
    assert summary["features"]["dashboard"] == str(out / "features.html")
    shown = [int(f) for f in re.findall(r'<section class="feature" id="feature-(\d+)"', dashboard)]
    assert shown == [r["feature"] for r in summary["features"]["top_features"]]
    assert "features.html" in summary["captions"]["features"]


def test_no_sae_no_feature_section(folder, tmp_path):
    model = HookedTransformer.from_pretrained(str(folder))
    summary = build_report(model, PROMPT, " letter", " garden", tmp_path)
    assert summary["features"] is None and "features" not in summary["captions"]
    assert not (tmp_path / "features.html").exists()
