"""Per-feature details for the graph page: each pruned graph feature's top-activating contexts on a text and
its logit effects, computed by the feature dashboard's ``feature_summaries`` over one transcoder layer.

``feature_details(model, ts, data, text_or_tokens)`` -> {"{layer}_{feature}": record} for every feature node
in ``data`` (``frontend_json``'s pruned graph); a feature at several positions has one record. A record holds
``frequency`` and ``max_act`` on the text, ``decoder`` (which decoder the logit effects use, in words), ``contexts`` (largest activation first: window ``row``, position
``pos``, activation ``act``, the shown tokens from ``start`` and the activation at each) and ``top_logits`` /
``bottom_logits`` ([token, value] pairs).

Contract and footguns:
- Activations are ``ts.encode(layer, x)`` of the model's value at ``ts.feature_input_hook(layer)`` on the
  text, run as the model stands (no transcoder spliced in): the features of the prompt's graph are read on
  another text, each layer on the real model's stream.
- Logit effects are the direct path (``feature_logit_effects``'s linearised final norm, then ``W_U``) of the
  feature's whole residual-stream write: for a cross-layer feature the SUM of its decoder rows over all its
  target layers (``decoder_weights(layer).sum(1)``), which is what it adds to the residual stream through
  every MLP output it writes; for a per-layer feature its one decoder row. A skip term is the layer's, not a
  feature's, and is left out.
- Refused: a set whose output hook is not ``hook_mlp_out`` or a post-norm model (neither has a linear path
  from the decoder to the logits).
- The text is windowed as the dashboard does (``text_windows``); ``max_tokens`` keeps the first windows
  holding at least that many tokens (default 4096), so a long text stays fast.
"""

from typing import Dict, Union

import torch
from torch import Tensor

from ..plots.features import FeatureReader, check_tokens, feature_summaries, text_windows


def transcoder_reader(model, ts, layer: int) -> FeatureReader:
    """Layer ``layer`` of the transcoder set as the dashboard's ``FeatureReader`` (module docstring)."""
    if ts.output_hook != "hook_mlp_out":
        raise ValueError(f"the transcoder set writes at {ts.output_hook!r}; logit effects are defined for sets "
                         "writing hook_mlp_out")
    if model.cfg.norm_placement == "post":
        raise ValueError("post-norm blocks normalise the stream after each MLP: a transcoder's decoder has no "
                         "linear path to the logits")

    def directions(features):
        return ts.decoder_weights(layer).detach()[list(features)].sum(1)  # [feature d_model], summed over targets

    return FeatureReader(ts.feature_input_hook(layer), ts.d_transcoder, lambda x: ts.encode(layer, x), directions,
                         ts.device)


def graph_features(data: dict) -> Dict[int, list]:
    """{layer: sorted features} of the feature nodes in ``frontend_json``'s ``data``."""
    out: Dict[int, set] = {}
    for n in data["nodes"]:
        if n["feature_type"] == "cross layer transcoder":
            layer, feature, _ = n["node_id"].split("_")
            out.setdefault(int(layer), set()).add(int(feature))
    return {layer: sorted(fs) for layer, fs in sorted(out.items())}


@torch.no_grad()
def feature_details(model, ts, data: dict, text_or_tokens: Union[str, Tensor], n_contexts: int = 5,
                    n_logits: int = 8, context=(10, 3), max_tokens: int = 4096, batch_size: int = 16) -> dict:
    """The details of every feature node of ``data`` (module docstring)."""
    tokens = text_windows(model, text_or_tokens) if isinstance(text_or_tokens, str) else \
        check_tokens(model, text_or_tokens)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
    tokens = tokens[:max(1, -(-max_tokens // tokens.shape[1]))]
    details = {}
    for layer, features in graph_features(data).items():
        targets = ts.targets(layer)
        decoder = (f"the sum of its decoder rows into layers {targets[0]}..{targets[-1]}" if len(targets) > 1
                   else f"its decoder row into layer {targets[0]}")
        summary = feature_summaries(model, transcoder_reader(model, ts, layer), tokens, features=features,
                                    n_contexts=n_contexts, context=context, n_logits=n_logits, batch_size=batch_size)
        for s in summary.features:
            details[f"{layer}_{s.feature}"] = dict(
                layer=layer, feature=s.feature, frequency=s.frequency, max_act=s.max_act, decoder=decoder,
                contexts=[dict(row=c.row, pos=c.pos, act=c.act, start=c.start, tokens=c.tokens, acts=c.acts)
                          for c in s.contexts],
                top_logits=[[t, v] for t, v in s.top_logits], bottom_logits=[[t, v] for t, v in s.bottom_logits])
    return details
