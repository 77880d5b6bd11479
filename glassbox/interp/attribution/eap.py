"""Edge attribution patching: EAP and EAP-IG (Hanna et al. 2024, "Have faith in faithfulness").

Every edge s -> r of the graph in ``edges.py`` gets a score estimating the effect on the metric of
corrupting that one edge in the CLEAN run (the receiver r reads the sender's corrupted output, every
other path stays clean):

    score(s -> r) = sum_{batch, pos, d_model} Delta_s * g_r,     Delta_s = a_s(corrupted) - a_s(clean)

where a_s is the sender's output ([batch pos d_model]: blocks.0.hook_resid_pre for "input",
attn.hook_result[:, :, H] for a head, hook_mlp_out for an MLP) and g_r is the gradient of the
metric's mean over prompts with respect to the receiver's own input (hook_q_input / hook_k_input /
hook_v_input at its head or kv head, hook_mlp_in, or the last hook_resid_post for "logits"):

- ``"EAP"``: g_r = d M / d x_r on the clean run. Two forwards (corrupted, clean) and one backward,
  which yields the gradient at every receiver input at once.
- ``"EAP-IG-inputs"``: g_r = (1/m) sum_k d M / d x_r on the clean tokens with the embeddings
  (blocks.0.hook_resid_pre) replaced by e(t_k) = e_clean + t_k (e_corrupted - e_clean).
- ``"EAP-IG-activations"``: for each sender s separately, g_r (for the edges leaving s) is
  (1/m) sum_k d M / d x_r on the clean run with a_s alone replaced by a_s(clean) + t_k Delta_s
  (every other activation computed as the model does). This differs from the MIB reference code, which
  interpolates a whole layer's output at a time and adds every run's gradients into every sender's
  row; here a sender's row comes only from the runs that move that sender, so the completeness
  identity below holds sender by sender.

The step points. Hanna et al. write the path from the corrupted input (alpha = 0) to the clean one
(alpha = 1); here t = 1 - alpha is measured from the clean run (t = 0). Every grid weights its m
points 1/m (``points=``):
- ``"paper"`` (default): alpha_k = k/m, k = 1..m (t = 0, 1/m, .., (m-1)/m): the paper's definition. It
  holds the clean end and not the corrupted one, so m = 1 is EAP exactly.
- ``"eap-ig-code"``: alpha_k = k/m, k = 0..m-1 (t = 1/m, .., 1): the grid of ``get_scores_eap_ig`` in the
  EAP-IG code (hannamw/EAP-IG, which MIB's EAP-IG baselines run). It holds the corrupted end and not
  the clean one, so m = 1 is the gradient on the corrupted input. (That code's activation variant,
  ``get_scores_ig_activations``, steps k = 1..m, the paper's grid.)
- ``"midpoint"``: t_k = (k - 1/2)/m, the midpoint rule, whose error falls as 1/m^2 instead of 1/m.
The two one-sided grids share m - 1 points: "paper" minus "eap-ig-code" is (the EAP scores minus the
scores of the gradient at the corrupted end) / m, edge by edge, which is large at small m where the
gradient differs between the two ends. Why "paper" is the default: it is the published definition,
it reduces to EAP at m = 1, and on the induction circuit of docs/attribution.md (5 steps) its top 7 edges reach
faithfulness 0.982 where "eap-ig-code"'s reach 0.67 (``tests/test_eap_ig_grids.py`` has the
formulas, the identity and the convergence of each).

Identities (tested): summed over every receiver, the input row of EAP-IG-inputs tends to
M(corrupted) - M(clean) as m grows (integrated gradients' completeness, because the embeddings reach
the metric only through the receivers' inputs), and each sender's row of EAP-IG-activations tends to
the exact effect of patching that sender's output to its corrupted value in the clean run.

Contracts and footguns:
- The metric is a patching metric: ``metric(logits [batch pos d_vocab]) -> [batch]`` (row r is prompt
  r % n_prompts, so the m steps run as m stacked copies of the batch); the gradient is of the mean
  over prompts, so scores are batch means of per-prompt scores, as sweeps' ``reduce="mean"``.
- Scores are summed over positions. ``attention_mask`` (the same for both runs) excludes padded
  positions from the sum.
- Flags: use_attn_result, use_split_qkv_input and use_hook_mlp_in are on while it runs (use_attn_in off)
  and restored afterwards, also on error; hooks it attaches are removed. Hooks (and spliced SAEs) the
  caller left on the model run in every pass, as part of the model: the scores are the hooked model's,
  the identities above hold for it only where the hooks keep the residual stream the sum of the
  senders, and ``metadata["model_hooks"]`` names them (``evaluate_circuit`` refuses a hooked model).
- Model parameters' ``.grad`` are not touched (gradients are taken with torch.autograd.grad).
- Refused: models whose residual stream is not the sum of the senders (``eap_setup.check_edge_model``).
- Cost: EAP-IG-inputs m forwards+backwards of the batch, EAP-IG-activations n_senders * m, run as
  stacked copies of the batch, as many per pass as ``memory_budget`` (or ``steps_per_pass``) allows.
"""

from typing import Optional

import torch
from torch import Tensor

from .eap_setup import (check_edge_model, edge_flags, receiver_columns, saving_hook, sender_hook_names,
                        stack_senders)
from .edges import edge_mask_for, receivers, sender_hook, senders
from .graph import Graph
from .metric_checks import check_has_grad, check_reads_logits, check_scores, check_values, metric_name

METHODS = ("EAP", "EAP-IG-inputs", "EAP-IG-activations")
POINTS = ("paper", "eap-ig-code", "midpoint")
RENAMED_POINTS = {"endpoint": "paper"}  # the earlier name of the default grid
DEFAULT_IG_STEPS = 5
DEFAULT_MEMORY_BUDGET = 2**30
EMBED_HOOK = "blocks.0.hook_resid_pre"


def interpolation_points(steps: int, points: str = "paper") -> list:
    """The t_k of the module docstring (t = 1 - alpha: fractions of the way from the clean run to the
    corrupted one), ascending."""
    check_points(points)
    if points == "paper":
        return [k / steps for k in range(steps)]
    if points == "eap-ig-code":
        return [k / steps for k in range(1, steps + 1)]
    return [(k + 0.5) / steps for k in range(steps)]


def check_points(points) -> None:
    if points in RENAMED_POINTS:
        raise ValueError(f"points={points!r} is now called {RENAMED_POINTS[points]!r} (alpha = k/m, k = 1..m, the "
                         "paper's grid); the EAP-IG code's grid (alpha = k/m, k = 0..m-1) is 'eap-ig-code'. Both "
                         "include an endpoint, so the old name did not say which")
    if points not in POINTS:
        raise ValueError(f"points must be one of {POINTS}, got {points!r}")


def eap(model, clean_tokens: Tensor, corrupted_tokens: Tensor, metric, *, method: str = "EAP",
        steps: Optional[int] = None, attention_mask: Optional[Tensor] = None, progress: bool = False,
        points: str = "paper", steps_per_pass: Optional[int] = None,
        memory_budget: int = DEFAULT_MEMORY_BUDGET) -> Graph:
    """Score every edge of ``model``'s graph (see the module docstring for the formulas).

    Args:
        clean_tokens, corrupted_tokens: [batch pos] token ids of the same shape.
        metric: ``fn(logits [batch pos d_vocab]) -> [batch]``, e.g. ``LogitDiff``.
        method: "EAP", "EAP-IG-inputs" or "EAP-IG-activations".
        steps: m for the IG methods (default 5); EAP takes None or 1.
        attention_mask: [batch pos], 1 for real tokens, shared by both runs.
        progress: a tqdm bar over the passes.
        points: the IG grid: "paper" (alpha = k/m, k = 1..m), "eap-ig-code" (k = 0..m-1) or "midpoint".
        steps_per_pass: at most this many copies of the batch (interpolation points) per forward; by
            default as many as ``memory_budget`` allows (at least one).
        memory_budget: bytes a gradient pass may use, estimated from the model's shape (``pass_copies``).

    Returns:
        A ``Graph`` with float32 scores (NaN where no edge exists) and metadata: method, steps, points,
        the metric's mean on the clean and the corrupted run, the model's name and shape.
    """
    steps = _check_method(method, steps)
    check_points(points)
    if steps_per_pass is not None and (isinstance(steps_per_pass, bool) or not isinstance(steps_per_pass, int)
                                       or steps_per_pass < 1):
        raise ValueError(f"steps_per_pass must be a positive int or None, got {steps_per_pass!r}")
    check_edge_model(model)
    if torch.is_inference_mode_enabled():
        raise RuntimeError("eap needs gradients, which torch.inference_mode() forbids; call it outside that block "
                           "(torch.no_grad() around it is fine: eap turns gradients on where it needs them)")
    clean, corrupted, mask = _check_inputs(model, clean_tokens, corrupted_tokens, attention_mask)
    cfg = model.cfg
    sender_names, receiver_names = senders(cfg), receivers(cfg)
    device = clean.device
    exists = edge_mask_for(sender_names, receiver_names, device=device)
    upstream = exists.sum(0).tolist()  # senders are in forward order, so a receiver's senders are a prefix
    ts = interpolation_points(steps, points)
    chunk = steps_per_pass or pass_copies(cfg, tuple(clean.shape), memory_budget, model.embed.W_E.element_size())
    run = _Run(model, metric, mask, clean.shape[0], steps, receiver_columns(cfg), upstream)
    with edge_flags(model):
        corrupted_values, corrupted_metric = run.sender_values(corrupted, "on the corrupted run")
        if method == "EAP":
            clean_values, grads, clean_metric = run.gradients(clean, 1, save_senders=True)
            clean_metric = float(clean_metric)
            acc = run.accumulate_all(corrupted_values - clean_values, grads)
        else:
            clean_values, clean_metric = run.sender_values(clean, "on the clean run")
            delta = corrupted_values - clean_values
            acc = run.zeros(len(sender_names), len(receiver_names))
            if method == "EAP-IG-inputs":
                jobs = [(0, t) for t in ts]
            else:
                jobs = [(i, t) for i in range(len(sender_names)) for t in ts]
            hooks_at = [sender_hook(name, cfg) for name in sender_names]
            for start in _bar(list(range(0, len(jobs), chunk)), progress, method):
                part = jobs[start:start + chunk]
                hooks = dict(_interpolation_hooks(part, hooks_at, clean_values, delta, clean.shape[0]))
                embed_hook = hooks.pop(EMBED_HOOK, None)
                labels = [f"at t = {t:.6g} (the embeddings that far from the clean run towards the corrupted one)"
                          if method == "EAP-IG-inputs" else f"with {sender_names[i]} at t = {t:.6g} of the way to "
                          "its corrupted output" for i, t in part]
                _, grads, _ = run.gradients(clean, len(part), embed_hook=embed_hook, extra_hooks=list(hooks.items()),
                                            sum_copies=method == "EAP-IG-inputs", copy_labels=labels)
                if method == "EAP-IG-inputs":
                    run.accumulate_all(delta, grads, acc)
                else:
                    run.accumulate_blocks(acc, [i for i, _ in part], delta, grads)
    n_r = len(receiver_names)
    check_scores(metric, acc, exists, lambda i: f"the edge {sender_names[i // n_r]!r} -> {receiver_names[i % n_r]!r}")
    scores = torch.where(exists, acc, torch.full_like(acc, float("nan"))).float()
    # Hooks and splices on the model ran in every pass: the scores are those of the hooked model, and the
    # identities of the docstring (completeness, the sum of senders) hold for it only when none is there.
    hooked = sorted(set(getattr(model, "splices", {})) | {n for n, p in model.hook_dict.items()
                                                          if p.fwd_hooks or p.bwd_hooks})
    metadata = {"method": method, "model_hooks": hooked, "steps": steps if method != "EAP" else None,
                "points": points if method != "EAP" else None,
                "metric": getattr(metric, "name", type(metric).__name__), "metric_repr": repr(metric),
                "metric_clean": clean_metric, "metric_corrupted": corrupted_metric,
                "n_prompts": int(clean.shape[0]), "n_positions": int(clean.shape[1]),
                "model": getattr(cfg, "model_name", "custom"),
                "cfg": {"n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "d_model": cfg.d_model,
                        "n_key_value_heads": getattr(cfg, "n_key_value_heads", None) or cfg.n_heads,
                        "attn_only": bool(getattr(cfg, "attn_only", False))},
                "score": "(a_corrupted - a_clean) . dM/d(receiver input), summed over positions, mean over prompts"}
    return Graph(sender_names, receiver_names, scores, metadata)


class _Run:
    """The passes of one attribution: sender values, gradients at the receivers, and their products."""

    def __init__(self, model, metric, mask, n_prompts, steps, columns, upstream):
        self.model, self.metric, self.mask, self.n = model, metric, mask, n_prompts
        self.steps, self.columns, self.upstream = steps, columns, upstream
        weight = model.embed.W_E
        self.acc_dtype = torch.promote_types(weight.dtype, torch.float32)
        self.device = weight.device

    def zeros(self, *shape) -> Tensor:
        return torch.zeros(*shape, dtype=self.acc_dtype, device=self.device)

    def _metric(self, logits: Tensor, rows: int, copy_labels: list, need_grad: bool) -> Tensor:
        """The metric's values [rows], checked (``metric_checks``); copy c of the batch is ``copy_labels[c]``."""
        values = self.metric(logits)
        where = copy_labels[0] if len(copy_labels) == 1 else "in a gradient pass"
        check_values(self.metric, values, where, False, row_label=lambda i: f"prompt {i % self.n}"
                     + ("" if len(copy_labels) == 1 else f", {copy_labels[i // self.n]}"))
        if tuple(values.shape) != (rows,):
            raise ValueError(f"the metric {metric_name(self.metric)} must return one value per batch row, shape "
                             f"({rows},); got {tuple(values.shape)} (a VariantMetric or a scalar metric cannot be "
                             "used for edge attribution)")
        if need_grad:
            check_has_grad(self.metric, values, where)
            check_reads_logits(self.metric, values.sum(), logits, where)
        return values

    def sender_values(self, tokens: Tensor, label: str) -> tuple:
        """([sender batch pos d_model] outputs, the metric's mean) of a forward without gradients."""
        store = {}
        hooks = [(name, saving_hook(store)) for name in sender_hook_names(self.model.cfg)]
        with torch.no_grad(), self.model.hooks(fwd_hooks=hooks):
            logits = self.model(tokens, attention_mask=self.mask)
        metric = float(self._metric(logits, tokens.shape[0], [label], need_grad=False).mean())
        return stack_senders(store, self.model.cfg), metric

    def gradients(self, tokens: Tensor, copies: int, embed_hook=None, extra_hooks=(), save_senders=False,
                  sum_copies=True, copy_labels=("on the clean run",)):
        """One pass over ``copies`` stacked copies of the batch. Returns (the senders' values if asked, the
        gradient at every receiver hook [batch pos (head) d_model], summed over the copies unless
        ``sum_copies`` is False ([copy batch ...] then), the metric's mean on the first copy). The loss is
        the metric's sum over rows / (n_prompts * steps): summed over the passes of one attribution, the
        gradients are the mean over the m steps of the gradient of the mean over prompts."""
        rows = copies * self.n
        stacked = tokens.repeat(copies, 1)
        mask = None if self.mask is None else self.mask.repeat(copies, 1)
        captured, saved = {}, {}

        def capture(x, hook):
            captured[hook.name] = x

        def leaf(x, hook):
            # a leaf that needs grad: receivers get gradients even if every parameter is frozen
            return x.detach().requires_grad_(True)

        hooks = [(EMBED_HOOK, embed_hook if embed_hook is not None else leaf)] + list(extra_hooks)
        if save_senders:
            hooks += [(name, saving_hook(saved)) for name in sender_hook_names(self.model.cfg)]
        hooks += [(name, capture) for name, _ in self.columns]
        with torch.enable_grad():
            with self.model.hooks(fwd_hooks=hooks):
                logits = self.model(stacked, attention_mask=mask)
            values = self._metric(logits, rows, list(copy_labels), need_grad=True)
            loss = values.sum() / (self.n * self.steps)
            names = [name for name, _ in self.columns]
            grads = torch.autograd.grad(loss, [captured[name] for name in names], allow_unused=True)
        out = {}
        for name, grad in zip(names, grads):
            if grad is None:
                grad = torch.zeros_like(captured[name])
            grad = grad.reshape(copies, self.n, *grad.shape[1:])
            out[name] = grad.sum(0) if sum_copies else grad
        senders_values = stack_senders(saved, self.model.cfg) if save_senders else None
        return senders_values, out, values.detach().reshape(copies, self.n)[0].mean()

    def _flat_grad(self, grad: Tensor) -> Tensor:
        """[batch pos (head) d_model] -> [(batch pos d_model), head] in the accumulation dtype, padding zeroed."""
        if grad.ndim == 3:
            grad = grad.unsqueeze(2)
        grad = grad.to(self.acc_dtype)
        if self.mask is not None:
            keep = self.mask.to(torch.bool)[:, :, None, None]
            grad = torch.where(keep, grad, torch.zeros((), dtype=grad.dtype, device=grad.device))
        return grad.permute(0, 1, 3, 2).reshape(-1, grad.shape[2])

    def _flat_delta(self, delta: Tensor) -> Tensor:
        """[sender batch pos d_model] -> [sender (batch pos d_model)] in the accumulation dtype."""
        delta = delta.to(self.acc_dtype)
        if self.mask is not None:
            delta = delta * self.mask.to(delta.dtype)[None, :, :, None]
        return delta.reshape(delta.shape[0], -1)

    def accumulate_all(self, delta: Tensor, grads: dict, acc: Optional[Tensor] = None) -> Tensor:
        """acc[s, r] += Delta_s . g_r for every edge (each receiver's upstream senders are a prefix)."""
        flat = self._flat_delta(delta)
        if acc is None:
            acc = self.zeros(flat.shape[0], sum(len(cols) for _, cols in self.columns))
        for name, cols in self.columns:
            n_up = self.upstream[cols[0]]
            acc[:n_up, cols] += flat[:n_up] @ self._flat_grad(grads[name])
        return acc

    def accumulate_blocks(self, acc: Tensor, rows: list, delta: Tensor, grads: dict) -> None:
        """acc[rows[c], r] += Delta_{rows[c]} . g_r(copy c) for every copy c of the pass and receiver r
        (the products at receivers upstream of a copy's sender are discarded later, as non-edges)."""
        flat = self._flat_delta(delta)
        index = torch.tensor(rows, device=acc.device)
        mine = flat[index]  # [copy (batch pos d_model)]
        for name, cols in self.columns:
            per_copy = torch.stack([self._flat_grad(g) for g in grads[name]])  # [copy (batch pos d_model) head]
            block = self.zeros(acc.shape[0], len(cols))
            block.index_add_(0, index, torch.einsum("cx,cxk->ck", mine, per_copy))
            acc[:, cols] += block


def pass_copies(cfg, shape: tuple, memory_budget: int, itemsize: int) -> int:
    """How many copies of a [batch pos] batch one gradient pass may stack within ``memory_budget`` bytes
    (at least 1), from a rough count of what a pass with per-head inputs keeps for the backward: per
    token and layer, the q/k/v inputs and their normalised copies, the heads' results, the MLP's hidden
    activations and the attention pattern, doubled for the gradients."""
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget < 1:
        raise ValueError(f"memory_budget must be a positive int (bytes), got {memory_budget!r}")
    n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    d_mlp = 0 if getattr(cfg, "attn_only", False) else (cfg.d_mlp or 4 * cfg.d_model)
    batch, pos = shape
    per_token = cfg.n_layers * (2 * (cfg.n_heads + 2 * n_kv) * cfg.d_model + cfg.n_heads * cfg.d_model
                                + 4 * d_mlp + cfg.n_heads * pos)
    per_copy = 2 * per_token * batch * pos * itemsize
    return max(1, memory_budget // max(per_copy, 1))


def _interpolation_hooks(jobs: list, hooks_at: list, clean: Tensor, delta: Tensor, n: int) -> list:
    """Forward hooks for one pass: copy c (rows c*n .. (c+1)*n - 1) gets sender jobs[c][0]'s output
    replaced by clean + t * delta, t = jobs[c][1]. One hook per hook name involved."""
    by_hook = {}
    for copy, (sender, t) in enumerate(jobs):
        name, index = hooks_at[sender]
        by_hook.setdefault(name, []).append((copy, index, sender, t))

    def make(name, edits):
        def hook(x, hook):
            x = x.detach().clone() if name == EMBED_HOOK else x.clone()
            for copy, index, sender, t in edits:
                value = (clean[sender] + t * delta[sender]).to(x.dtype)
                rows = slice(copy * n, (copy + 1) * n)
                if index is None:
                    x[rows] = value
                else:
                    x[rows, :, index] = value
            # the embeddings become a leaf that needs grad, so receivers get gradients with frozen weights
            return x.requires_grad_(True) if name == EMBED_HOOK else x
        return hook

    return [(name, make(name, edits)) for name, edits in by_hook.items()]


def _bar(items: list, progress: bool, desc: str):
    if not progress:
        return items
    from tqdm.auto import tqdm
    return tqdm(items, desc=desc)


def _check_method(method: str, steps: Optional[int]) -> int:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if method == "EAP":
        if steps not in (None, 1):
            raise ValueError(f"EAP takes one gradient (steps=None or 1), got steps={steps}; use method="
                             "'EAP-IG-inputs' or 'EAP-IG-activations' for integrated gradients")
        return 1
    return DEFAULT_IG_STEPS if steps is None else steps


def _check_inputs(model, clean, corrupted, attention_mask) -> tuple:
    device = model.embed.W_E.device
    for what, tokens in (("clean_tokens", clean), ("corrupted_tokens", corrupted)):
        if not isinstance(tokens, Tensor) or tokens.dtype.is_floating_point or tokens.dtype == torch.bool \
                or tokens.ndim != 2:
            got = f"{tokens.dtype} shape {tuple(tokens.shape)}" if isinstance(tokens, Tensor) else type(tokens).__name__
            raise ValueError(f"{what} must be a [batch pos] tensor of token ids, got {got}")
    if clean.shape != corrupted.shape:
        raise ValueError(f"clean_tokens {tuple(clean.shape)} and corrupted_tokens {tuple(corrupted.shape)} must have "
                         "the same shape (the senders' differences are taken position by position)")
    for what, tokens in (("clean_tokens", clean), ("corrupted_tokens", corrupted)):
        try:
            model.check_tokens(tokens)
        except ValueError as error:
            raise ValueError(f"{what}: {error}") from None
    if attention_mask is not None:
        if not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != tuple(clean.shape):
            got = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
            raise ValueError(f"attention_mask must be a [batch pos] tensor of the tokens' shape "
                             f"{tuple(clean.shape)}, got {got}")
        attention_mask = attention_mask.to(device)
    return clean.to(device), corrupted.to(device), attention_mask
