"""The demo report's feature section: an SAE of the model, read on the story's prompt.

``feature_section(model, sae, tokens, ...)`` measures, on the prompt (BOS positions left out):
- the SAE's L0 and the share of the variance of the hook's value its reconstruction explains
  (``1 - sum |x - recons|^2 / sum |x - mean(x)|^2`` over positions, the mean per dimension);
- the logit difference (answer - distractor) at the last token clean, with the SAE spliced without
  its error term (the reconstruction replaces the value) and with it (must equal clean exactly:
  the largest |logit change| is reported);
- the features most active at the last token, and for each the logit difference when that one
  feature is zeroed at the last token with the error term on (so everything else is exactly the
  clean model's): all in one batched run, a row per feature.
Its figure is those features' activations at every position of the prompt. With ``feature_text``, the
feature dashboard of those features on that text is written beside the report (``features.html``).

``shipped_sae(model)`` finds the SAE shipped with glassbox for a model (``glassbox/assets/saes/*``, by
the model name and width in its ``cfg.json`` and the SHA-256 of the weights it was trained on), or None.
"""

import hashlib
import json
from pathlib import Path
from typing import Optional

import torch

SAES_DIR = Path(__file__).resolve().parents[1] / "assets" / "saes"
N_TOP = 5


def shipped_saes() -> list:
    """The folders of the shipped SAEs (each with a cfg.json)."""
    return sorted(p.parent for p in SAES_DIR.glob("*/cfg.json")) if SAES_DIR.is_dir() else []


def weights_digest(model) -> str:
    """SHA-256 of the model's state dict (sorted by name, raw bytes): what ``glassbox train-sae``
    records as ``model_sha256`` in train_sae_settings.json."""
    h = hashlib.sha256()
    for _, tensor in sorted(model.state_dict().items()):
        h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def shipped_sae_folder(model) -> Optional[Path]:
    """The shipped SAE folder whose cfg.json names this model (``metadata.model_name``), its width and a
    hook it has, and whose train_sae_settings.json records exactly these weights (a model of the same
    name with other weights, or in another dtype, gets none); or None."""
    digest = None
    for folder in shipped_saes():
        cfg = json.loads((folder / "cfg.json").read_text(encoding="utf-8"))
        meta = cfg.get("metadata", {})
        if meta.get("model_name") != model.cfg.model_name or cfg.get("d_in") != model.cfg.d_model \
                or meta.get("hook_name") not in model.hook_dict:
            continue
        settings = folder / "train_sae_settings.json"
        recorded = json.loads(settings.read_text(encoding="utf-8")).get("model_sha256") if settings.is_file() else None
        digest = digest or weights_digest(model)
        if recorded == digest:
            return folder
    return None


def shipped_sae(model):
    """The shipped SAE for ``model`` on the model's device, or None when there is none."""
    folder = shipped_sae_folder(model)
    if folder is None:
        return None
    from .sae.format import load_sae

    return load_sae(folder, device=model.W_U.device)


def logit_diff(logits: torch.Tensor, answer_id: int, distractor_id: int) -> torch.Tensor:
    """[batch] logit difference at the last token."""
    return logits[:, -1, answer_id] - logits[:, -1, distractor_id]


@torch.no_grad()
def feature_section(model, sae, tokens, answer_id: int, distractor_id: int, answer: str, distractor: str,
                    out_dir, feature_text: Optional[str] = None, plotly_src: Optional[str] = None) -> tuple:
    """(summary, caption, figure) of the feature section (see the module docstring)."""
    from .plots.common import escape, go, index_axis
    from .plots.features import feature_dashboard
    from .sae.splice import with_saes

    hook = sae.cfg.hook_name
    _, cache = model.run_with_cache(tokens, names_filter=[hook])
    x = cache[hook][0].to(sae.dtype)  # [pos d_in]
    acts = sae.encode(x)
    recons = sae.decode(acts)
    keep = tokens[0] != model.bos_token_id
    kept_x, kept_r, kept_a = x[keep].double(), recons[keep].double(), acts[keep]
    l0 = float((kept_a > 0).double().sum(-1).mean())
    explained = 1.0 - float((kept_x - kept_r).square().sum() / (kept_x - kept_x.mean(0)).square().sum())

    logits = model(tokens)  # a plain run: the cached one may take other kernels (float rounding apart)
    clean = float(logit_diff(logits, answer_id, distractor_id)[0])
    with with_saes(model, [sae], use_error_term=False):
        spliced = float(logit_diff(model(tokens), answer_id, distractor_id)[0])
    with with_saes(model, [sae], use_error_term=True):
        exact_logits = model(tokens)
    exact_gap = float((exact_logits - logits).abs().max())
    exact = float(logit_diff(exact_logits, answer_id, distractor_id)[0])

    last = acts[-1]
    n_top = min(N_TOP, int((last > 0).sum()))
    top = last.topk(n_top)
    features = top.indices.tolist()
    ablated = []
    if features:
        def zero_one_each(value, hook):  # row i loses feature features[i] at the last token
            value = value.clone()
            rows = torch.arange(len(features), device=value.device)
            value[rows, -1, torch.tensor(features, device=value.device)] = 0.0
            return value

        batch = tokens.expand(len(features), -1)
        with with_saes(model, [sae], use_error_term=True):
            out = model.run_with_hooks(batch, fwd_hooks=[(f"{hook}.hook_sae_acts_post", zero_one_each)])
        ablated = logit_diff(out, answer_id, distractor_id).tolist()
    rows = [{"feature": f, "activation": float(a), "ablated_logit_diff": d, "change": d - clean}
            for f, a, d in zip(features, top.values.tolist(), ablated)]

    dashboard = None
    if feature_text is not None and features:
        dashboard = str(Path(out_dir) / "features.html")
        feature_dashboard(model, sae, feature_text, features=features, path=dashboard, plotly_src=plotly_src,
                          title=f"features of the SAE at {hook} on held-out text")
    k = f", k={sae.cfg.k}" if sae.cfg.k is not None else ""
    changes = "; ".join(f"{r['feature']} (activation {r['activation']:.2f}): {r['change']:+.3f}" for r in rows)
    caption = (f"{sae.cfg.architecture} SAE at {hook} ({sae.cfg.d_sae:,} features{k}). On the prompt: L0 {l0:.1f}, "
               f"explained variance {explained:.3f}. Logit difference {answer!r} - {distractor!r}: clean "
               f"{clean:.3f}, with the SAE's reconstruction spliced in {spliced:.3f}, with the error term too "
               f"{exact:.3f} (largest "
               f"|logit change| {exact_gap:.1e}). Most active features at the last token, and the change in the "
               f"logit difference when each alone is zeroed there: {changes or 'none active'}."
               + (" Their top-activating contexts on held-out text: features.html." if dashboard else ""))
    str_tokens = model.to_str_tokens(tokens[0])
    z = acts[:, features].T.double().cpu().tolist() if features else [[0.0] * len(str_tokens)]
    fig = go().Figure(go().Heatmap(z=z, colorscale="Oranges", zmin=0.0,
                                   hovertemplate="feature %{y}, token %{x}: %{z:.3f}<extra></extra>"))
    fig.update_layout(title=f"activations of the features most active at the last token ({escape(hook)})",
                      xaxis=index_axis(str_tokens, "token"),
                      yaxis=dict(tickmode="array", tickvals=list(range(len(features))),
                                 ticktext=[str(f) for f in features], title="feature", autorange="reversed"),
                      height=200 + 30 * max(1, len(features)))
    summary = {"sae": {"hook_name": hook, "architecture": sae.cfg.architecture, "d_sae": sae.cfg.d_sae,
                       "k": sae.cfg.k},
               "l0": l0, "explained_variance": explained, "clean_logit_diff": clean,
               "spliced_logit_diff": spliced, "error_term_logit_diff": exact,
               "error_term_max_abs_logit_change": exact_gap,
               "top_features": rows, "dashboard": dashboard}
    return summary, caption, fig
