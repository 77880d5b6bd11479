"""Stage-by-stage comparison of a glassbox model with its ``transformers`` twin.

Rows: each layer's residual stream entering the block (HF ``hidden_states[L]``), each layer's
attention pattern (HF ``attentions[L]``), the final norm's output after its weight and bias
(``ln_final.hook_out``, HF's last hidden state) and the logits. For each row: the largest absolute
difference and the largest reference magnitude, so a reader can judge relative error on models whose
activations are large.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from ..models import HookedTransformer
from .pretrained import to_hf


@dataclass(frozen=True)
class ParityRow:
    stage: str
    max_abs_diff: float
    max_abs_ref: float

    @property
    def rel_diff(self) -> float:
        return self.max_abs_diff / max(self.max_abs_ref, 1e-30)


@torch.no_grad()
def parity_report(model: HookedTransformer, tokens: Tensor, hf_model=None) -> list:
    """Compare ``model`` with ``hf_model`` (default: ``model.to_hf()``, eager attention) on ``tokens``."""
    # Only run, never edited: the export may share the model's memory.
    hf_model = hf_model if hf_model is not None else to_hf(model, share_memory=True)
    tokens = tokens.to(next(model.parameters()).device)
    ref = hf_model(tokens, output_hidden_states=True, output_attentions=True)
    acts = {}
    wanted = {f"blocks.{L}.hook_resid_pre" for L in range(model.cfg.n_layers)}
    wanted |= {f"blocks.{L}.attn.hook_pattern" for L in range(model.cfg.n_layers)} | {"ln_final.hook_out"}
    logits = model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n in wanted, lambda x, hook: acts.__setitem__(hook.name, x))])
    rows = []
    for L in range(model.cfg.n_layers):
        rows.append(_row(f"blocks.{L}.hook_resid_pre", acts[f"blocks.{L}.hook_resid_pre"], ref.hidden_states[L]))
        rows.append(_row(f"blocks.{L}.attn.hook_pattern", acts[f"blocks.{L}.attn.hook_pattern"], ref.attentions[L]))
    rows.append(_row("ln_final.hook_out", acts["ln_final.hook_out"], ref.hidden_states[-1]))
    rows.append(_row("logits", logits, ref.logits))
    return rows


def _row(stage: str, ours: Tensor, theirs: Tensor) -> ParityRow:
    diff = (ours.double() - theirs.double()).abs().max().item()
    return ParityRow(stage, diff, theirs.double().abs().max().item())


def format_report(rows: list) -> str:
    width = max(len(r.stage) for r in rows)
    lines = [f"{'stage':<{width}}  {'max |Δ|':>10}  {'max |ref|':>10}  {'relative':>10}"]
    lines += [f"{r.stage:<{width}}  {r.max_abs_diff:>10.2e}  {r.max_abs_ref:>10.2e}  {r.rel_diff:>10.2e}" for r in rows]
    return "\n".join(lines)
