"""The feature dashboard: one offline page describing an SAE's features on a text.

``feature_dashboard(model, sae, text_or_tokens)`` runs ``model`` over the text (or token windows),
encodes the value at the SAE's hook and, for each chosen feature, shows
- its top-activating contexts: the positions where the feature is largest, each with the tokens
  before and after it, every token's background shaded by the feature's activation there (darkest at
  the feature's largest activation on the page; the hover text gives the value);
- its logit effects: the tokens whose logits the feature's decoder direction raises and lowers most
  along the direct path (``feature_logit_effects``);
- its activation histogram over the positions where it is active.
``feature_summaries`` returns the same numbers as data (``DashboardData``), without the page.

Contract and footguns:
- A text is tokenized whole (no special tokens) and cut into windows of ``[BOS] + n_ctx - 1``
  tokens, as ``glassbox train`` builds them; the tail shorter than a window is dropped (unless the
  text is shorter than one window: then it is the one window). Token windows [batch pos] are used
  as given.
- Positions holding the BOS token are not counted: not in the frequencies, maxima, contexts or
  histograms (the residual stream there is an outlier that many features fire on).
- ``features=None`` ranks features by activation frequency (the share of counted positions where
  the activation is > 0), ties broken by the larger maximum, and shows the first ``n_features`` of
  those active at least once; a feature never active on this text is never chosen.
- The model runs as it stands: hooks or SAEs already attached to it change what the SAE reads.
- plotly.js is inlined once (~5 MB), or loaded from a shared file next to the page (``plotly_src``);
  nothing is fetched from the network.
"""

import html
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple, Union

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from ...fs import write_text
from .common import escape, go
from .html import page as html_page

LAYER_OF = re.compile(r"^blocks\.(\d+)\.")


# -- the numbers -----------------------------------------------------------------------------------

def text_windows(model, text: str) -> Int[Tensor, "batch pos"]:
    """``text`` as windows ``[BOS] + n_ctx - 1`` tokens (no BOS for a model that prepends none), on the
    model's device; the tail shorter than a window is dropped unless it is the only window."""
    if not isinstance(text, str) or not text:
        raise ValueError("the dashboard's text must be a non-empty string")
    ids = model.tokenizer.encode(text, add_special_tokens=False, verbose=False)
    if not ids:
        raise ValueError("the dashboard's text encodes to no tokens")
    bos = [model.bos_token_id] if model.cfg.default_prepend_bos and model.bos_token_id is not None else []
    body = max(1, model.cfg.n_ctx - len(bos))
    n_windows = max(1, len(ids) // body)
    body = min(body, len(ids))
    rows = [bos + ids[i * body:(i + 1) * body] for i in range(n_windows)]
    return torch.tensor(rows, dtype=torch.long, device=model.W_U.device)


def check_tokens(model, tokens) -> Tensor:
    if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.dtype not in (torch.long, torch.int):
        shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"tokens must be integer token ids [batch pos], got {shape}")
    if tokens.numel() == 0:
        raise ValueError("tokens must hold at least one token")
    if int(tokens.min()) < 0 or int(tokens.max()) >= model.cfg.d_vocab:
        raise ValueError(f"tokens must be ids in [0, {model.cfg.d_vocab}), got "
                         f"{int(tokens.min())}..{int(tokens.max())}")
    return tokens.to(model.W_U.device)


@dataclass(frozen=True)
class FeatureReader:
    """What the dashboard needs of a feature dictionary: the hook its features read (``hook_name``), how
    many there are (``d_features``), ``encode`` ([... d_in] at that hook -> [... d_features]
    activations), ``directions`` (features -> [feature d_model]: what one unit of each adds to the
    residual stream, for the logit effects) and the ``device`` its parameters are on. ``sae_reader``
    builds one for an SAE; ``glassbox.interp.graphs.details`` one for a transcoder layer."""

    hook_name: str
    d_features: int
    encode: Callable[[Tensor], Tensor]
    directions: Callable[[Sequence[int]], Tensor]
    device: torch.device


def sae_reader(model, sae) -> FeatureReader:
    return FeatureReader(sae.cfg.hook_name, sae.cfg.d_sae, sae.encode,
                         lambda features: decoder_in_resid(model, sae, features), sae.W_enc.device)


@torch.no_grad()
def sae_inputs(model, sae, tokens: Int[Tensor, "batch pos"], batch_size: int = 16) -> Tensor:
    """The model's value at the SAE's read hook (``sae.cfg.hook_name``) for every window, [batch pos ...]."""
    return hook_inputs(model, sae.cfg.hook_name, tokens, batch_size)


@torch.no_grad()
def hook_inputs(model, hook: str, tokens: Int[Tensor, "batch pos"], batch_size: int = 16) -> Tensor:
    """The model's value at ``hook`` for every window, [batch pos ...] (run no further than needed)."""
    if hook not in model.hook_dict:
        raise ValueError(f"the features read at {hook!r}, which is not a hook point of this model")
    layer = LAYER_OF.match(hook)
    resid_pre = re.match(r"^blocks\.(\d+)\.hook_resid_pre$", hook)
    kept: List[Tensor] = []
    if resid_pre:  # the residual stream entering block L is what blocks[:L] return: run no further
        stop = int(resid_pre.group(1))
        for start in range(0, tokens.shape[0], batch_size):
            kept.append(model(tokens[start:start + batch_size], stop_at_layer=stop).detach())
        return torch.cat(kept)
    stop = int(layer.group(1)) + 1 if layer and int(layer.group(1)) + 1 < model.cfg.n_layers else None

    def grab(value, hook):
        kept.append(value.detach().clone())

    for start in range(0, tokens.shape[0], batch_size):
        model.run_with_hooks(tokens[start:start + batch_size], fwd_hooks=[(hook, grab)], stop_at_layer=stop,
                             return_type=None if stop is None else "logits")
    return torch.cat(kept)


@torch.no_grad()
def decoder_in_resid(model, sae, features: Sequence[int]) -> Float[Tensor, "feature d_model"]:
    """The chosen features' decoder directions (``sae.decoder_directions()``) in the residual stream, per
    unit of activation (``glassbox.interp.sae.features.residual_directions``): as they are for an SAE
    writing at a residual-stream hook (resid_pre/mid/post, attn_out, mlp_out, the embeddings); through
    W_O for one writing at ``attn.hook_z``; through W_out for one at ``mlp.hook_post``. Other hooks
    are refused (their decoder does not write into the residual stream directly)."""
    from ..sae.features import residual_directions

    return residual_directions(model, sae)[list(features)].to(model.W_U.dtype)


@torch.no_grad()
def feature_logit_effects(model, sae, features: Sequence[int]) -> Float[Tensor, "feature d_vocab"]:
    """Each feature's direct effect on the logits per unit of activation: its decoder direction in the
    residual stream (``decoder_in_resid``) through the final norm, then ``W_U``.

    The final norm is linearised with its scale frozen: a LayerNorm centres the direction and
    multiplies it by its weight, an RMSNorm multiplies by its weight (plus the model's weight offset);
    the division by the norm's scale (one positive number per position, the same for every token) and
    the biases (the norm's and ``b_U``, the same for every feature) are left out, so the values rank
    tokens but are not logit differences of any one position. Only the direct path is counted: an SAE
    before the last layer also acts through the layers after it, which this leaves out."""
    return direction_logit_effects(model, decoder_in_resid(model, sae, features))


@torch.no_grad()
def direction_logit_effects(model, direction: Float[Tensor, "feature d_model"]) -> Float[Tensor, "feature d_vocab"]:
    """Residual-stream directions through the final norm (linearised as ``feature_logit_effects`` says),
    then ``W_U``."""
    from ...models.layer_norm import LayerNorm
    from ...models.rms_norm import RMSNorm

    direction = direction.to(model.W_U.dtype)
    norm = model.ln_final
    if isinstance(norm, LayerNorm):
        direction = (direction - direction.mean(-1, keepdim=True)) * norm.w
    elif isinstance(norm, RMSNorm):
        direction = direction * (norm.w + norm.offset)
    elif not isinstance(norm, nn.Identity):
        raise ValueError(f"feature_logit_effects knows LayerNorm, RMSNorm and no final norm; this model's is "
                         f"{type(norm).__name__}")
    return direction @ model.W_U


def tokenizer_or_none(model):
    try:
        return model.tokenizer
    except ValueError:  # a model built without one
        return None


def bos_or_none(model) -> Optional[int]:
    return model.bos_token_id if tokenizer_or_none(model) is not None else None


def token_strings(model):
    """ids -> the tokens as text (``#id`` for a model without a tokenizer)."""
    tokenizer = tokenizer_or_none(model)
    if tokenizer is None:
        return lambda ids: [f"#{i}" for i in ids]
    return lambda ids: [tokenizer.decode([i]) for i in ids]


@dataclass
class Context:
    """One top-activating position: window ``row``, position ``pos``, activation ``act``; the tokens shown
    (``tokens``, from ``start``) and the feature's activation at each of them (``acts``; BOS gets 0)."""

    row: int
    pos: int
    act: float
    start: int
    tokens: List[str]
    acts: List[float]


@dataclass
class FeatureSummary:
    feature: int
    frequency: float            # share of counted positions where the activation is > 0
    max_act: float
    mean_active_act: float      # mean activation over the positions where it is > 0
    contexts: List[Context]
    histogram_edges: List[float]  # bins + 1 edges from 0 to max_act
    histogram_counts: List[int]   # active positions per bin (the last bin includes max_act)
    top_logits: List[Tuple[str, float]]     # the tokens raised most, largest first
    bottom_logits: List[Tuple[str, float]]  # the tokens lowered most, most negative first


@dataclass
class DashboardData:
    n_windows: int
    n_positions: int            # counted positions (BOS left out)
    l0: float                   # mean number of active features per counted position
    dead_fraction: float        # share of features never active on the counted positions
    frequency: Tensor           # [d_sae] on the CPU
    max_act: Tensor             # [d_sae] on the CPU
    features: List[FeatureSummary] = field(default_factory=list)


def choose_features(frequency: Tensor, max_act: Tensor, n_features: int) -> List[int]:
    """The ``n_features`` most frequently active features (ties: larger maximum first), active ones only."""
    order = sorted(range(len(frequency)), key=lambda f: (-float(frequency[f]), -float(max_act[f]), f))
    return [f for f in order if float(frequency[f]) > 0][:n_features]


def check_features(features, d_sae: int) -> List[int]:
    chosen = list(features)
    if not chosen:
        raise ValueError("features must name at least one feature")
    for f in chosen:
        if isinstance(f, bool) or not isinstance(f, int) or not 0 <= f < d_sae:
            raise ValueError(f"features holds {f!r}; every feature must be an int in [0, {d_sae})")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"features lists a feature twice: {chosen}")
    return chosen


def positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


@torch.no_grad()
def feature_summaries(model, sae, text_or_tokens: Union[str, Tensor], features: Optional[Sequence] = None,
                      n_features: int = 8, n_contexts: int = 8, context: Tuple[int, int] = (12, 4),
                      n_logits: int = 10, bins: int = 30, batch_size: int = 16) -> DashboardData:
    """The dashboard's numbers (see the module docstring); ``context`` is (tokens before, tokens after)
    each top position. ``sae`` is an SAE or any ``FeatureReader`` (e.g. one transcoder layer's)."""
    for name, value in (("n_features", n_features), ("n_contexts", n_contexts), ("n_logits", n_logits),
                        ("bins", bins), ("batch_size", batch_size)):
        positive_int(name, value)
    before, after = context
    if min(before, after) < 0:
        raise ValueError(f"context must be (tokens before, tokens after), both >= 0, got {context!r}")
    reader = sae if isinstance(sae, FeatureReader) else sae_reader(model, sae)
    if reader.device != model.W_U.device:
        raise ValueError(f"the features are on {reader.device}, the model on {model.W_U.device}; move one")
    d_sae = reader.d_features
    asked = None if features is None else check_features(features, d_sae)
    tokens = text_windows(model, text_or_tokens) if isinstance(text_or_tokens, str) else \
        check_tokens(model, text_or_tokens)
    x = hook_inputs(model, reader.hook_name, tokens, batch_size)
    bos = bos_or_none(model)
    counted = tokens != bos if bos is not None else torch.ones_like(tokens, dtype=torch.bool)
    n_positions = int(counted.sum())
    if n_positions == 0:
        raise ValueError("every position holds the BOS token: nothing to count")

    active_count = torch.zeros(d_sae, dtype=torch.float64, device=reader.device)
    max_act = torch.zeros(d_sae, dtype=torch.float64, device=reader.device)
    for start in range(0, x.shape[0], batch_size):
        acts = reader.encode(x[start:start + batch_size]).double()[counted[start:start + batch_size]]
        active_count += (acts > 0).sum(0)
        max_act = torch.maximum(max_act, acts.max(0).values.clamp_min(0))
    frequency = (active_count / n_positions).cpu()
    max_act = max_act.cpu()
    chosen = choose_features(frequency, max_act, n_features) if asked is None else asked
    data = DashboardData(n_windows=tokens.shape[0], n_positions=n_positions,
                         l0=float(active_count.sum()) / n_positions,
                         dead_fraction=float((active_count == 0).double().mean()),
                         frequency=frequency, max_act=max_act)
    if not chosen:
        return data

    sel = torch.cat([reader.encode(x[s:s + batch_size])[..., chosen] for s in range(0, x.shape[0], batch_size)])
    sel = sel.double().masked_fill(~counted[..., None], 0.0)  # [batch pos feature]
    effects = direction_logit_effects(model, reader.directions(chosen)).double()
    n_logits = min(n_logits, effects.shape[-1])
    str_of = token_strings(model)
    for j, f in enumerate(chosen):
        acts = sel[..., j]
        flat = acts.flatten()
        n_top = min(n_contexts, int((flat > 0).sum()))
        contexts = []
        for index in flat.topk(n_top).indices.tolist() if n_top else []:
            row, pos = divmod(index, acts.shape[1])
            lo, hi = max(0, pos - before), min(acts.shape[1], pos + after + 1)
            contexts.append(Context(row, pos, float(acts[row, pos]), lo, str_of(tokens[row, lo:hi].tolist()),
                                    acts[row, lo:hi].tolist()))
        active = acts[counted & (acts > 0)]
        top = float(max_act[f])
        if active.numel():
            counts = torch.histc(active, bins=bins, min=0.0, max=top if top > 0 else 1.0)
            mean_active = float(active.mean())
        else:
            counts, mean_active = torch.zeros(bins, dtype=torch.float64), 0.0
        edges = torch.linspace(0.0, top if top > 0 else 1.0, bins + 1, dtype=torch.float64)
        up, down = effects[j].topk(n_logits), (-effects[j]).topk(n_logits)
        data.features.append(FeatureSummary(
            feature=f, frequency=float(frequency[f]), max_act=top, mean_active_act=mean_active, contexts=contexts,
            histogram_edges=edges.tolist(), histogram_counts=[int(c) for c in counts.tolist()],
            top_logits=list(zip(str_of(up.indices.tolist()), up.values.tolist())),
            bottom_logits=list(zip(str_of(down.indices.tolist()), (-down.values).tolist()))))
    return data


# -- the page ----------------------------------------------------------------------------------------

STYLE = """<style>
.feature { border-top: 1px solid #ccc; padding-top: 0.5em; margin-top: 1.5em; }
.context { font-family: monospace; white-space: pre-wrap; margin: 0.15em 0; }
.context .value { display: inline-block; min-width: 5.5em; color: #555; }
.tok { border-radius: 2px; }
.tok.top { outline: 1px solid #000; }
.figures { display: flex; flex-wrap: wrap; gap: 1em; }
.figures > div { flex: 1 1 420px; min-width: 0; }  /* min-width 0: a cell may shrink below its drawing */
</style>"""


def shown_token(token: str) -> str:
    return token.replace("\n", "\u21b5")


def context_html(c: Context, top: float) -> str:
    spans = []
    for i, (token, act) in enumerate(zip(c.tokens, c.acts)):
        alpha = 0.0 if top <= 0 else max(0.0, min(1.0, act / top))
        mark = " top" if c.start + i == c.pos else ""
        spans.append(f'<span class="tok{mark}" style="background-color: rgba(255, 120, 0, {alpha:.3f})" '
                     f'title="{act:.4g}" data-act="{act:.6g}">{html.escape(shown_token(token))}</span>')
    return (f'<div class="context" data-row="{c.row}" data-pos="{c.pos}" data-act="{c.act:.6g}">'
            f'<span class="value">{c.act:.3f}</span>{"".join(spans)}</div>')


def histogram_figure(s: FeatureSummary):
    edges = s.histogram_edges
    centres = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
    fig = go().Figure(go().Bar(x=centres, y=s.histogram_counts, width=edges[1] - edges[0], marker_color="#e07800",
                               hovertemplate="activation %{x:.3g}: %{y} positions<extra></extra>",
                               meta=dict(kind="histogram", feature=s.feature)))
    fig.update_layout(title=f"feature {s.feature}: activations where active", height=300, bargap=0.02,
                      xaxis=dict(title="activation"), yaxis=dict(title="positions"), margin=dict(t=40, b=40))
    return fig


def logits_figure(s: FeatureSummary):
    rows = list(reversed(s.bottom_logits)) + list(reversed(s.top_logits))  # most negative at the bottom
    labels = [escape(shown_token(t).replace(" ", "\u00b7")) for t, _ in rows]
    values = [v for _, v in rows]
    fig = go().Figure(go().Bar(
        x=values, y=list(range(len(rows))), orientation="h", customdata=labels,
        marker_color=["#2166ac" if v > 0 else "#b2182b" for v in values],
        hovertemplate="%{customdata}: %{x:.4f}<extra></extra>", meta=dict(kind="logits", feature=s.feature)))
    fig.update_layout(title=f"feature {s.feature}: logit effects (direct path)", height=max(300, 22 * len(rows) + 80),
                      xaxis=dict(title="logit per unit activation (final-norm scale left out)", zeroline=True),
                      yaxis=dict(tickmode="array", tickvals=list(range(len(rows))), ticktext=labels),
                      margin=dict(t=40, b=40))
    return fig


def header_caption(model, sae, data: DashboardData, ranked: bool) -> str:
    cfg = sae.cfg
    k = f", k={cfg.k}" if cfg.k is not None else ""
    how = "the most frequently active" if ranked else "the features asked for"
    return (f"{cfg.architecture} SAE at {cfg.hook_name} ({cfg.d_sae:,} features{k}) on {model.cfg.model_name}: "
            f"{data.n_positions:,} positions in {data.n_windows:,} windows (BOS positions not counted); "
            f"L0 {data.l0:.2f} active features per position; {data.dead_fraction:.1%} of features never active "
            f"here. Shown: {len(data.features)} features, {how}.")


def feature_caption(s: FeatureSummary, n_positions: int) -> str:
    up = ", ".join(repr(t) for t, _ in s.top_logits[:5])
    down = ", ".join(repr(t) for t, _ in s.bottom_logits[:5])
    return (f"active on {s.frequency:.2%} of {n_positions:,} positions; max activation {s.max_act:.3f}, mean where "
            f"active {s.mean_active_act:.3f}; raises {up}; lowers {down}")


def feature_dashboard(model, sae, text_or_tokens: Union[str, Tensor], features: Optional[Sequence] = None,
                      n_features: int = 8, path: Optional[Union[str, Path]] = None, title: Optional[str] = None,
                      plotly_src: Optional[str] = None, **options) -> str:
    """The dashboard page (see the module docstring); ``options`` go to ``feature_summaries``
    (n_contexts, context, n_logits, bins, batch_size). One ``<section class="feature">`` per feature
    (id ``feature-F``) holding its caption, its contexts (``div.context``, largest first) and two figures
    (div ids ``feature-F-histogram`` and ``feature-F-logits``). Writes to ``path`` when given; returns the page.
    plotly.js is inlined, or with ``plotly_src`` (e.g. ``"plotly.min.js"``) loaded from that file next to the
    page (``glassbox.interp.plots.html.write_plotly_asset`` writes it)."""
    data = feature_summaries(model, sae, text_or_tokens, features=features, n_features=n_features, **options)
    return dashboard_page(model, sae, data, ranked=features is None, path=path, title=title, plotly_src=plotly_src)


def dashboard_page(model, sae, data: DashboardData, ranked: bool = True, path: Optional[Union[str, Path]] = None,
                   title: Optional[str] = None, plotly_src: Optional[str] = None) -> str:
    """The page of ``data`` (from ``feature_summaries``)."""
    title = title or f"features of the SAE at {sae.cfg.hook_name}"
    to_div = lambda fig, div_id: fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False,
                                             div_id=div_id, config={"displayModeBar": False, "responsive": True})
    parts = [STYLE, f'<p class="caption" id="caption">{html.escape(header_caption(model, sae, data, ranked))}</p>']
    for s in data.features:
        contexts = "\n".join(context_html(c, s.max_act) for c in s.contexts) or "<p>never active on this text</p>"
        parts.append(
            f'<section class="feature" id="feature-{s.feature}" data-feature="{s.feature}">\n'
            f'<h2>feature {s.feature}</h2>\n'
            f'<p class="caption">{html.escape(feature_caption(s, data.n_positions))}</p>\n'
            f'<h3>top-activating contexts</h3>\n<div class="contexts">{contexts}</div>\n'
            f'<div class="figures">{to_div(histogram_figure(s), f"feature-{s.feature}-histogram")}\n'
            f'{to_div(logits_figure(s), f"feature-{s.feature}-logits")}</div>\n</section>')
    page = html_page(title, "\n".join(parts), plotly_src)
    if path is not None:
        write_text(path, page)  # whole or not at all (glassbox.fs): a killed write leaves no half page
    return page
