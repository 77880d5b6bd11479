"""The graph page's per-feature details (glassbox.interp.graphs.details): the dashboard's numbers over one
transcoder layer, checked against hand computations: activations relu(x W_enc + b_enc) at the input hook
and, for a cross-layer feature, the sum of its decoder rows over its target layers through the final norm
and W_U."""

import pytest
import torch

from glassbox.interp.graphs.details import feature_details, graph_features, transcoder_reader
from tests.graph_models import family_model, family_transcoders

TEXT = torch.randint(0, 53, (6, 37), generator=torch.Generator().manual_seed(7))


def nodes(*features):
    """frontend_json-like data with feature nodes (layer, feature, pos) and one token node."""
    return {"nodes": [{"node_id": f"{l}_{f}_{p}", "feature_type": "cross layer transcoder"} for l, f, p in features]
            + [{"node_id": "E_3_0", "feature_type": "embedding"}]}


@torch.no_grad()
def hand_acts(model, ts, layer, f, text):
    _, cache = model.run_with_cache(text, names_filter=[ts.feature_input_hook(layer)])
    x = cache[ts.feature_input_hook(layer)].double()
    return torch.relu(x @ ts.W_enc(layer)[:, f].double() + ts.b_enc(layer)[f].double())


def hand_effect(model, direction):
    d = direction.double()
    return ((d - d.mean()) * model.ln_final.w.double()) @ model.W_U.double()


def test_graph_features_groups_by_layer_once_per_feature():
    assert graph_features(nodes((1, 5, 2), (0, 9, 1), (1, 5, 3), (1, 2, 1))) == {0: [9], 1: [2, 5]}


def test_cross_layer_logit_effects_sum_the_decoder_over_targets():
    model, _ = family_model("gpt2")
    ts = family_transcoders("gpt2", cross_layer=True)
    hand = hand_acts(model, ts, 0, 0, TEXT)
    f = int(max(range(ts.d_transcoder), key=lambda j: float((hand_acts(model, ts, 0, j, TEXT) > 0).sum())))
    rec = feature_details(model, ts, nodes((0, f, 1)), TEXT, n_logits=6)[f"0_{f}"]
    assert rec["decoder"] == "the sum of its decoder rows into layers 0..2"
    assert feature_details(model, family_transcoders("gpt2"), nodes((1, f, 1)), TEXT)[f"1_{f}"]["decoder"] == \
        "its decoder row into layer 1"
    summed = hand_effect(model, ts.decoder_weights(0)[f].sum(0))  # [n_targets d_model] summed over 3 targets
    first = hand_effect(model, ts.decoder_weights(0)[f, 0])
    up = summed.topk(6)
    assert [t for t, _ in rec["top_logits"]] == [f"#{i}" for i in up.indices.tolist()]
    got = torch.tensor([v for _, v in rec["top_logits"]], dtype=torch.float64)
    assert torch.allclose(got, up.values, atol=2e-6, rtol=0)  # float32 vs float64: measured 8.0e-8
    assert not torch.allclose(got, first[up.indices], atol=1e-2, rtol=0)  # the first target alone differs
    acts = hand_acts(model, ts, 0, f, TEXT)
    assert rec["frequency"] == pytest.approx(float((acts > 0).double().mean()), abs=1e-12)
    assert rec["max_act"] == pytest.approx(float(acts.max()), abs=1e-5)  # float32 encode: measured 6.3e-7
    assert [(c["row"], c["pos"]) for c in rec["contexts"]] == \
        [divmod(i, TEXT.shape[1]) for i in acts.flatten().topk(len(rec["contexts"])).indices.tolist()]


def test_max_tokens_keeps_the_first_windows():
    model, _ = family_model("gpt2")
    ts = family_transcoders("gpt2")
    features = [(1, f, 1) for f in range(ts.d_transcoder)]
    recs = feature_details(model, ts, nodes(*features), TEXT, max_tokens=40)  # 40 tokens: 2 windows of 37
    rows = {c["row"] for r in recs.values() for c in r["contexts"]}
    assert rows == {0, 1}
    f = next(int(k.split("_")[1]) for k, r in recs.items() if r["frequency"] > 0)
    acts = hand_acts(model, ts, 1, f, TEXT[:2])
    assert recs[f"1_{f}"]["frequency"] == pytest.approx(float((acts > 0).double().mean()), abs=1e-12)
    for bad in (0, -3, True):
        with pytest.raises(ValueError, match="max_tokens must be a positive int"):
            feature_details(model, ts, nodes((1, 0, 1)), TEXT, max_tokens=bad)


def test_refuses_what_has_no_linear_path_to_the_logits():
    model, _ = family_model("postnorm")
    with pytest.raises(ValueError, match="post-norm"):
        transcoder_reader(model, family_transcoders("postnorm"), 0)
    model, _ = family_model("gpt2")
    with pytest.raises(ValueError, match="writes at 'hook_resid_post'"):
        transcoder_reader(model, family_transcoders("gpt2", output_hook="hook_resid_post"), 0)
