"""The demo report: parity, attention, head detection, logit lens and a patching sweep for one prompt.

``build_report(model, prompt, answer, distractor, out_dir)`` writes ``out_dir/index.html`` (one
offline page: a section per study, each a caption with its key numbers above its plotly figure) and
``out_dir/summary.json`` (every number shown, and the captions), and returns the summary. The pages
load plotly.js from ``out_dir/plotly.min.js`` (written once beside them; nothing from the network), or
inline it with ``single_file=True``. With an
SAE of the model (``sae=``) it adds a feature section (``report_features``).

The patching story is induction: the prompt repeats a phrase, the clean run saw ``answer``
after its first occurrence, the corrupted run sees ``distractor`` there instead, and the metric is
the normalised logit difference (answer - distractor) at the last position.

``answer`` and ``distractor`` must each be one token of the model's tokenizer. For a tokenizer that
cannot express the defaults (a small BPE vocabulary written by ``glassbox train``),
``single_token_words`` lists the words it can, and ``story_prompts(answer)`` the repeated-phrase
prompts built around one, longest first, for a model whose context is short.
"""

import html
import json
import re
import time
from pathlib import Path
from typing import Optional

import torch

from ..fs import write_text
from ..models import HookedTransformer
from ..weights.parity import parity_report
from .heads import detect_head, induction_score
from .patching import LogitDiff, Normalized, patch_resid_pre
from .plots import attention_selector, logit_lens_plot, patching_heatmap
from .plots.html import PLOTLY_ASSET, page as html_page, write_plotly_asset

INDUCTION_SEQ_LEN = 20
DEFAULT_ANSWER, DEFAULT_DISTRACTOR = " letter", " garden"
# The repeated-phrase prompts, longest first; {answer} follows the phrase's first occurrence.
STORY_TEMPLATES = (
    "Elizabeth read the{answer} again, and then walked to the window. When Jane came in, Elizabeth read the",
    "Elizabeth read the{answer}. Then Elizabeth read the",
    "Jane read{answer}. Jane read",
)
DEFAULT_PROMPT = STORY_TEMPLATES[0].format(answer=DEFAULT_ANSWER)
# Tried first as answer and distractor when the defaults are not single tokens.
PREFERRED_WORDS = (" letter", " garden", " book", " house", " room", " door", " hand", " day", " time", " man")


def story_prompts(answer: str) -> list:
    """The repeated-phrase prompts around ``answer``, longest first."""
    return [template.format(answer=answer) for template in STORY_TEMPLATES]


def single_token_words(model: HookedTransformer) -> list:
    """Words (a space and letters) that the model's tokenizer encodes as one token, in a fixed order:
    PREFERRED_WORDS first, then longer words before shorter ones, then by token id."""
    tokenizer = model.tokenizer
    vocab = sorted(tokenizer.get_vocab().values())
    special = set(tokenizer.all_special_ids)
    words = {}
    for token_id in vocab:
        if token_id in special:
            continue
        text = tokenizer.decode([token_id])
        if re.fullmatch(r" [A-Za-z]+", text) and tokenizer.encode(text, add_special_tokens=False) == [token_id]:
            words.setdefault(text, token_id)
    rank = {word: i for i, word in enumerate(PREFERRED_WORDS)}
    return sorted(words, key=lambda w: (rank.get(w, len(rank)), -len(w), words[w]))


def corrupt_first(model: HookedTransformer, tokens: torch.Tensor, answer: str, distractor: str) -> tuple:
    """(corrupted tokens, answer id, distractor id, position replaced): the first ``answer`` token
    of the prompt becomes ``distractor``."""
    answer_id, distractor_id = model.to_single_token(answer), model.to_single_token(distractor)
    hits = (tokens[0] == answer_id).nonzero().flatten().tolist()
    if not hits:
        raise ValueError(f"the prompt does not contain the answer token {answer!r}; the patching study corrupts "
                         "its first occurrence, so write the prompt as '... phrase answer ... phrase'")
    corrupted = tokens.clone()
    corrupted[0, hits[0]] = distractor_id
    return corrupted, answer_id, distractor_id, hits[0]


def induction_seq_len(model: HookedTransformer) -> int:
    """INDUCTION_SEQ_LEN random tokens, fewer if BOS and two copies would not fit the model's context."""
    return max(1, min(INDUCTION_SEQ_LEN, (model.cfg.n_ctx - 1) // 2))


def head_table(scores: torch.Tensor, top: int = 5) -> list:
    flat = scores.flatten()
    order = flat.argsort(descending=True)[:top].tolist()
    n_heads = scores.shape[1]
    return [{"layer": i // n_heads, "head": i % n_heads, "score": round(float(flat[i]), 4)} for i in order]


def scores_figure(scores: torch.Tensor, title: str):
    from .plots.common import go

    fig = go().Figure(go().Heatmap(z=scores.tolist(), zmin=0.0, zmax=1.0, colorscale="Blues",
                                   hovertemplate="layer %{y}, head %{x}: %{z:.3f}<extra></extra>"))
    fig.update_layout(title=title, xaxis=dict(title="head", dtick=1), yaxis=dict(title="layer", dtick=1, autorange="reversed"),
                      height=260 + 30 * scores.shape[0])
    return fig


def table_figure(header: list, rows: list, title: str):
    from .plots.common import go

    columns = [list(col) for col in zip(*rows)] if rows else [[] for _ in header]
    fig = go().Figure(go().Table(header=dict(values=header, align="left"), cells=dict(values=columns, align="left")))
    fig.update_layout(title=title, height=120 + 24 * len(rows), margin=dict(t=50, b=10))
    return fig


# The tolerance on the worst relative difference, as ``glassbox parity`` judges it (a test keeps them equal).
PARITY_TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10}

LINKED = ("features.html",)  # files beside the report that a caption names: shown as links

SECTION = """<section class="report-section" id="{id}">
<p class="caption" id="caption-{id}">{caption}</p>
{figure}
</section>"""


def heads_text(rows: list, n: int = 3) -> str:
    return ", ".join(f"L{r['layer']}H{r['head']} {r['score']:.2f}" for r in rows[:n])


def parity_caption(parity: list, n_tokens: int, dtype: torch.dtype) -> tuple:
    """(caption, verdict) of the parity rows: the worst relative difference and whether it is within
    PARITY_TOLERANCE for the model's dtype (None when there is no tolerance for that dtype)."""
    worst = max(parity, key=lambda r: r.rel_diff)
    tolerance = PARITY_TOLERANCE.get(dtype)
    verdict = None if tolerance is None else worst.rel_diff <= tolerance
    judged = (f"no tolerance for {dtype}, not judged" if tolerance is None else
              f"tolerance {tolerance:.0e}: parity {'holds' if verdict else 'FAILS'}")
    text = (f"glassbox against its transformers twin (the same weights, eager attention) on the prompt's "
            f"{n_tokens} tokens, {str(dtype).replace('torch.', '')}: worst relative difference "
            f"{worst.rel_diff:.1e} at {worst.stage} (max |diff| {worst.max_abs_diff:.1e}, max |value| "
            f"{worst.max_abs_ref:.3g}); {judged}.")
    return text, verdict


def lens_lead(lens_series: torch.Tensor, labels: list) -> Optional[str]:
    """The first label from which the answer's log probability stays above the distractor's."""
    ahead = (lens_series[0] > lens_series[1]).tolist()
    for i in range(len(ahead)):
        if all(ahead[i:]):
            return labels[i]
    return None


def linked(caption_html: str) -> str:
    """An escaped caption with each name in LINKED made a link to that file beside the report."""
    for name in LINKED:
        caption_html = caption_html.replace(name, f'<a href="{name}">{name}</a>')
    return caption_html


def page_html(sections: list, title: str, plotly_src: Optional[str] = None) -> str:
    """The report page: one section per (id, caption, figure), plotly.js inlined once (or, with
    ``plotly_src``, loaded from that file next to the page)."""
    body = "\n".join(SECTION.format(id=sid, caption=linked(html.escape(caption)),
                                     figure=fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False,
                                                        div_id=f"figure-{sid}"))
                      for sid, caption, fig in sections)
    return html_page(title, body, plotly_src)


@torch.no_grad()
def build_report(model: HookedTransformer, prompt: str, answer: str, distractor: str, out_dir,
                 progress: bool = False, sae=None, feature_text: Optional[str] = None, single_file: bool = False) -> dict:
    """Write the report (see the module docstring); with ``sae`` (an SAE of this model) a feature
    section too, and with ``feature_text`` beside it the feature dashboard (features.html) on that text.
    Every section has a caption holding its key numbers; ``summary["captions"]`` has them by section id.
    The pages load plotly.js from ``out_dir/plotly.min.js``, written once beside them (still offline);
    ``single_file=True`` inlines it into each page instead (~4.9 MB a page) and writes no plotly.min.js."""
    start = time.perf_counter()
    out_dir = Path(out_dir)
    plotly_src = None if single_file else PLOTLY_ASSET
    if plotly_src is not None:
        write_plotly_asset(out_dir)  # before the pages: a page never names a file that is not there yet
    tokens = model.to_tokens(prompt)
    str_tokens = model.to_str_tokens(tokens[0])
    n_tokens = len(str_tokens)
    corrupted, answer_id, distractor_id, replaced = corrupt_first(model, tokens, answer, distractor)

    parity = parity_report(model, tokens)
    logits, cache = model.run_with_cache(tokens)
    patterns = torch.stack([cache["pattern", layer][0] for layer in range(model.cfg.n_layers)])

    previous = detect_head(model, cache, "previous_token")
    seq_len = induction_seq_len(model)
    induction = induction_score(model, seq_len, n_repeats=2, batch=8, seed=0, bos_token_id=model.bos_token_id)

    lens, labels = cache.accumulated_resid(apply_ln=True, pos_slice=-1, return_labels=True)
    lens_log_probs = model.unembed(lens).log_softmax(-1)[:, 0]  # [layer d_vocab] at the last position
    lens_series = torch.stack([lens_log_probs[:, answer_id], lens_log_probs[:, distractor_id]])

    diff = LogitDiff(answer_id, distractor_id, pos=-1)
    corrupted_logits = model(corrupted)
    metric = Normalized.from_logits(diff, logits, corrupted_logits)
    sweep = patch_resid_pre(model, corrupted, cache, metric, progress=progress)
    values = sweep.values.detach().cpu()
    clean, dirty = float(metric.clean), float(metric.corrupted)

    # the captions' numbers
    dtype = next(model.parameters()).dtype
    previous_rows, induction_rows = head_table(previous), head_table(induction)
    to_answer = patterns[:, :, -1, replaced]  # [layer head]: attention from the last token to the answer
    best = int(to_answer.flatten().argmax())
    attn_layer, attn_head = divmod(best, model.cfg.n_heads)
    peak = int(values.flatten().argmax())
    peak_layer, peak_pos = divmod(peak, values.shape[1])
    parity_text, verdict = parity_caption(parity, n_tokens, dtype)
    lead = lens_lead(lens_series, labels)
    per_layer = lambda col: ", ".join(f"{v:.3f}" for v in values[:, col].tolist())
    # the position axis names the clean prompt's tokens; at the corrupted position both tokens, as the caption does
    position_labels = list(str_tokens)
    position_labels[replaced] = f"{answer}\u2192{distractor}"
    token_at = lambda pos: (f"{answer!r} clean, {distractor!r} corrupted" if pos == replaced else repr(str_tokens[pos]))
    captions = {
        "model": (f"{model.cfg.model_name}: {model.cfg.n_layers} layers, d_model {model.cfg.d_model}, "
                  f"{model.cfg.n_heads} heads, vocabulary {model.cfg.d_vocab:,}, "
                  f"{sum(p.numel() for p in model.parameters()):,} parameters. Prompt ({n_tokens} tokens with "
                  f"BOS): {prompt!r}. The corrupted prompt has {distractor!r} in place of {answer!r} at token "
                  f"{replaced}; the metric is the logit difference {answer!r} - {distractor!r} at the last token: "
                  f"clean {clean:.3f}, corrupted {dirty:.3f}."),
        "parity": parity_text,
        "attention": (f"Attention patterns of the prompt's {n_tokens} tokens, every layer and head. From the last "
                      f"token, the head attending most to {answer!r} (token {replaced}, after the phrase's first "
                      f"occurrence) is L{attn_layer}H{attn_head}, with {float(to_answer.max()):.3f} of its "
                      f"attention."),
        "previous-token": (f"Previous-token score of each head on the prompt (its mean attention to the token "
                           f"just before): highest {heads_text(previous_rows)}."),
        "induction": (f"Induction score of each head on BOS + {seq_len} random tokens repeated twice (batch 8, seed "
                      f"0): highest {heads_text(induction_rows)}."),
        "logit-lens": (f"Logit lens at the last token: log probability of {answer!r} and {distractor!r} reading the "
                       f"residual stream through the final norm after each layer. At the output: "
                       f"log p({answer!r}) {float(lens_series[0, -1]):.3f}, log p({distractor!r}) "
                       f"{float(lens_series[1, -1]):.3f}; {answer!r} "
                       + (f"leads from {lead} on." if lead is not None else "does not stay ahead.")),
        "patching": (f"Patching each layer's resid_pre at each position from the clean run into the corrupted one; "
                     f"{metric.name} = (patched - corrupted) / (clean - corrupted) of the logit difference (clean "
                     f"{clean:.3f}, corrupted {dirty:.3f}). Largest {float(values.max()):.3f} at layer {peak_layer}, "
                     f"token {peak_pos} ({token_at(peak_pos)}). By layer at the corrupted token {replaced}: "
                     f"{per_layer(replaced)}; at the last token: {per_layer(values.shape[1] - 1)}."),
    }
    sections = [
        ("model", captions["model"],
         table_figure(["", "value"], [["model", model.cfg.model_name], ["prompt", prompt], ["answer", repr(answer)],
                                 ["distractor", repr(distractor)],
                                 ["logit difference clean / corrupted", f"{clean:.3f} / {dirty:.3f}"]],
                      "the story")),
        ("parity", captions["parity"],
         table_figure(["stage", "max |Δ|", "max |ref|"],
                      [[r.stage, f"{r.max_abs_diff:.2e}", f"{r.max_abs_ref:.2e}"] for r in parity],
                      "parity with transformers (same weights, eager attention)")),
        ("attention", captions["attention"],
         attention_selector(patterns, str_tokens, title="attention patterns of the prompt",
                            initial=(attn_layer, attn_head))),  # opens on the head the caption names
        ("previous-token", captions["previous-token"],
         scores_figure(previous, "previous-token score of each head (on the prompt)")),
        ("induction", captions["induction"],
         scores_figure(induction, f"induction score of each head (BOS + random tokens, {seq_len} x 2)")),
        ("logit-lens", captions["logit-lens"],
         logit_lens_plot(lens_series, labels, [f"log p({answer!r})", f"log p({distractor!r})"],
                         title="logit lens at the last position", y_title="log probability")),
        ("patching", captions["patching"],
         patching_heatmap(sweep, title=f"patching resid_pre from clean into corrupted ({metric.name}; token "
                                       f"{replaced}: {answer!r} clean, {distractor!r} corrupted)",
                          x_labels=position_labels)),
    ]
    features = None
    if sae is not None:
        from .report_features import feature_section

        features, caption, figure = feature_section(model, sae, tokens, answer_id, distractor_id, answer, distractor,
                                                    out_dir, feature_text, plotly_src=plotly_src)
        captions["features"] = caption
        sections.append(("features", caption, figure))
    page = write_text(out_dir / "index.html", page_html(sections, f"glassbox report: {model.cfg.model_name}",
                                                        plotly_src))
    summary = {
        "model": {"name": model.cfg.model_name, "n_layers": model.cfg.n_layers, "d_model": model.cfg.d_model,
                  "n_heads": model.cfg.n_heads, "d_vocab": model.cfg.d_vocab,
                  "parameters": sum(p.numel() for p in model.parameters())},
        "prompt": prompt, "tokens": str_tokens,
        "parity": [{"stage": r.stage, "max_abs_diff": r.max_abs_diff, "max_abs_ref": r.max_abs_ref} for r in parity],
        "parity_worst_relative": max(r.rel_diff for r in parity),
        "parity_tolerance": PARITY_TOLERANCE.get(dtype), "parity_holds": verdict,
        "previous_token_heads": previous_rows,
        "induction_heads": induction_rows, "induction_seq_len": seq_len,
        "logit_lens": {"labels": labels, "answer": answer, "distractor": distractor,
                       "answer_log_prob": lens_series[0].tolist(), "distractor_log_prob": lens_series[1].tolist()},
        "patching": {"activation": "resid_pre", "axes": list(sweep.axes), "corrupted_position": replaced,
                     "clean_logit_diff": clean, "corrupted_logit_diff": dirty,
                     "values": values.tolist()},
        "features": features,
        "captions": captions,
        "report": str(page), "seconds": round(time.perf_counter() - start, 2),
    }
    write_text(out_dir / "summary.json", json.dumps(summary, indent=2))
    return summary
