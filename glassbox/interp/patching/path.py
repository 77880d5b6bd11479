"""Path patching: a set of sender heads' effect, patched only along its paths into chosen receivers.

The procedure of the IOI circuit work (Wang et al. 2022), with this package's direction: the base
run is on the corrupted tokens and the sender heads' outputs come from the clean cache (swap the
two for the noising direction, as the IOI paper runs it).

1. Run the corrupted tokens with each sender head's output z replaced by its clean value and every
   other head frozen at its corrupted z, so the senders' change reaches later layers only through
   the residual stream and the MLPs (frozen too with ``freeze_mlps=True``).
2. ``receivers="logits"``: the metric is read from that run. Otherwise ``receivers`` is a list of
   ``(layer, head, "q"|"k"|"v")``: their inputs from run 1 are patched into a fresh corrupted run,
   in which everything downstream is recomputed, and the metric is read from that.

Under grouped-query attention a "k" or "v" receiver's head is a key/value head (the hook's kv_head
axis, read by all its query heads); "q" receivers and senders are query heads.

Every sender must sit in a layer before every receiver. Sender sets run side by side along the
batch axis, in passes bounded by the memory budget; in run 1 each joins the batch at its first
sender layer from the cached corrupted residual stream. Hooks are removed however a run ends.

Under user hooks (on the model, or ``fwd_hooks=``) the result is that of the two plain forwards
above run under the same hooks, the user's hooks running before the freezing, capturing and
patching hooks at each hook point: frozen values are the corrupted run's after the user's hooks,
run 1's receiver inputs are captured after them, and run 2 applies them again before patching.
``user_hooks.py`` states what a user hook must be.
"""

from collections.abc import Mapping
from typing import Callable, Optional, Sequence, Union

import torch
from jaxtyping import Int
from torch import Tensor

from ...models.hook_shapes import hook_shape
from .engine import DEFAULT_MEMORY_BUDGET, Sweep, check_clean, progress_bar
from .readout import Readout
from .result import PatchResult
from .runner import run_blocks, run_staggered, start_resid
from .user_hooks import user_hooks

Receivers = Union[str, Sequence[tuple]]
KINDS = ("q", "k", "v")


def path_patch(model, corrupted_tokens: Union[Int[Tensor, "batch pos"], str, list], clean_cache: Mapping,
               metric: Callable, senders: Sequence[tuple], receivers: Receivers = "logits", *,
               attention_mask: Optional[Tensor] = None, freeze_mlps: bool = False, reduce: Optional[str] = "mean",
               memory_budget: int = DEFAULT_MEMORY_BUDGET, fwd_hooks: Sequence = ()) -> Tensor:
    """The metric with the heads ``senders`` [(layer, head), ...] path-patched into ``receivers``.

    ``fwd_hooks`` are attached for the whole call, like hooks already on the model (``user_hooks.py``).
    Returns a 0-d tensor (the mean over prompts), or [batch] with ``reduce=None``.
    """
    sweep = Sweep(model, corrupted_tokens, attention_mask, metric, reduce, memory_budget, False, False, 1)
    senders = [check_head(model, s, "sender") for s in senders]
    if not senders:
        raise ValueError("senders is empty: give at least one (layer, head)")
    parsed = parse_receivers(model, receivers, senders)
    with user_hooks(model, fwd_hooks, sweep.n_prompts) as hooked:
        sweep.honour_user_hooks(hooked)
        out = run_paths(sweep, clean_cache, [senders], parsed, freeze_mlps)[0]
    return out.mean() if reduce == "mean" else out


def path_patch_heads(model, corrupted_tokens: Union[Int[Tensor, "batch pos"], str, list], clean_cache: Mapping,
                     metric: Callable, receivers: Receivers = "logits", *, attention_mask: Optional[Tensor] = None,
                     freeze_mlps: bool = False, reduce: Optional[str] = "mean",
                     memory_budget: int = DEFAULT_MEMORY_BUDGET, progress: bool = False,
                     fwd_hooks: Sequence = ()) -> PatchResult:
    """Each head alone as the sender: a PatchResult [layer head]; heads not before every receiver are NaN.

    ``fwd_hooks`` are attached for the whole sweep, like hooks already on the model (``user_hooks.py``).
    """
    sweep = Sweep(model, corrupted_tokens, attention_mask, metric, reduce, memory_budget, progress, False, 1)
    cfg = model.cfg
    parsed = parse_receivers(model, receivers, [])
    limit = cfg.n_layers if parsed == "logits" else min(layer for layer, _, _ in parsed)
    if limit == 0:
        receiver = min(parsed)
        raise ValueError(f"receiver {receiver} is in layer 0: no sender head can precede it, so every head "
                         "would be NaN; choose receivers in layer 1 or later")
    heads = [(layer, head) for layer in range(limit) for head in range(cfg.n_heads)]
    with user_hooks(model, fwd_hooks, sweep.n_prompts) as hooked:
        sweep.honour_user_hooks(hooked)
        values = run_paths(sweep, clean_cache, [[h] for h in heads], parsed, freeze_mlps)
    out = torch.full((cfg.n_layers * cfg.n_heads, sweep.n_prompts), float("nan"), dtype=values.dtype,
                     device=values.device)
    out[: len(heads)] = values
    out = out.view(cfg.n_layers, cfg.n_heads, sweep.n_prompts)
    if reduce == "mean":
        out = out.mean(-1)
    axes = ("layer", "head") + (() if reduce == "mean" else ("batch",))
    name = "path to logits" if parsed == "logits" else "path to " + ", ".join(f"{l}.{h}.{k}" for l, h, k in parsed)
    return PatchResult(out, axes, {"layer": sweep.labels("layer"), "head": sweep.labels("head")}, name,
                       getattr(metric, "name", getattr(metric, "__name__", "")))


def run_paths(sweep: Sweep, clean_cache: Mapping, variants: list, receivers, freeze_mlps: bool) -> Tensor:
    """The metric [variant prompt] of each sender set in ``variants``."""
    model, cfg = sweep.model, sweep.model.cfg
    z_shape = (sweep.n_prompts, sweep.seq_len, cfg.n_heads, cfg.d_head)
    sender_layers = sorted({layer for senders in variants for layer, _ in senders})
    for layer in sender_layers:
        check_clean(clean_cache, z_name(layer), z_shape)
    frozen = [z_name(L) for L in range(cfg.n_layers)]
    frozen += [mlp_name(L) for L in range(cfg.n_layers)] if freeze_mlps else []
    sweep.ensure_base(frozen)
    dtype = sweep.base.resid_pre(0).dtype
    clean_z = {L: clean_cache[z_name(L)].to(sweep.device, dtype) for L in sender_layers}
    readout = Readout(model, sweep.base, sweep.metric, sweep.read_pos, len(variants), sweep.memory_budget,
                      sweep.full_readout)
    per_pass = sweep.variants_per_pass(sweep.seq_len, False)
    order = sorted(range(len(variants)), key=lambda i: min(layer for layer, _ in variants[i]))
    n_passes = -(-len(order) // per_pass)
    bar = progress_bar(len(variants), "paths", sweep.progress)
    try:
        with torch.no_grad():
            for k in range(n_passes):
                members = order[k::n_passes]
                ids = torch.tensor(members, dtype=torch.long, device=sweep.device)
                final = run_pass(sweep, [variants[i] for i in members], clean_z, receivers, freeze_mlps)
                readout.add(final, 0, ids)
                bar.update(len(members))
            return readout.result()
    finally:
        bar.close()


def run_pass(sweep: Sweep, chunk: list, clean_z: dict, receivers, freeze_mlps: bool) -> Tensor:
    """The final residual stream of one pass of sender sets (sorted by their first layer)."""
    model, base, cfg = sweep.model, sweep.base, sweep.model.cfg
    starts = [min(layer for layer, _ in senders) for senders in chunk]
    joining = {}
    for layer in starts:
        joining[layer] = joining.get(layer, 0) + 1
    is_sender = torch.zeros(cfg.n_layers, len(chunk), 1, 1, cfg.n_heads, 1, dtype=torch.bool)
    for v, senders in enumerate(chunk):
        for layer, head in senders:
            is_sender[layer, v, 0, 0, head] = True
    is_sender = is_sender.to(sweep.device)  # one copy per pass
    captured: dict = {}

    def run1_hooks(layer: int, n_before: int) -> list:
        # Run 1: senders clean, every other head frozen at its corrupted output, in every row in flight.
        n = n_before + joining.get(layer, 0)
        corrupted_z = base.acts[z_name(layer)]
        z = torch.where(is_sender[layer, :n], clean_z.get(layer, corrupted_z), corrupted_z)
        hooks = [(z_name(layer), replace_with(z))]
        if freeze_mlps:
            hooks.append((mlp_name(layer), replace_with(base.acts[mlp_name(layer)][None])))
        if receivers != "logits":
            hooks += [(kind_name(layer, k), capture) for l, _, k in set(receivers) if l == layer]
        return hooks

    def capture(act: Tensor, hook) -> None:
        captured[hook.name] = act

    stop = None if receivers == "logits" else max(layer for layer, _, _ in receivers) + 1
    final = run_staggered(model, base, 0, joining, run1_hooks, stop)
    if receivers == "logits":
        return final
    # Run 2: a fresh corrupted run whose receivers read run 1's inputs; everything after recomputes.
    hooks = []
    for name in captured:
        heads = torch.zeros(1, 1, captured[name].shape[2], 1, dtype=torch.bool)  # kv heads for grouped k, v
        for l, h, k in receivers:
            if kind_name(l, k) == name:
                heads[0, 0, h] = True
        hooks.append((name, patch_heads(heads.to(sweep.device), captured[name])))
    first_receiver = min(layer for layer, _, _ in receivers)
    return run_blocks(model, base, start_resid(base, first_receiver, 0, len(chunk)), first_receiver,
                      cfg.n_layers, 0, len(chunk), hooks)


def replace_with(value: Tensor) -> Callable:
    """A hook returning ``value`` [variant-or-1 prompt ...] broadcast to the activation's rows."""
    def hook(act: Tensor, hook) -> Tensor:
        return value.expand(act.shape[0] // value.shape[1], *value.shape[1:]).reshape(act.shape)
    return hook


def patch_heads(heads: Tensor, values: Tensor) -> Callable:
    def hook(act: Tensor, hook) -> Tensor:
        return torch.where(heads, values, act)
    return hook


def mlp_name(layer: int) -> str:
    return f"blocks.{layer}.hook_mlp_out"


def z_name(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_z"


def kind_name(layer: int, kind: str) -> str:
    return f"blocks.{layer}.attn.hook_{kind}"


def grouped_kv(model, kind: str) -> bool:
    """Whether a receiver of ``kind`` indexes key/value heads (k, v under grouped-query attention)."""
    if kind not in ("k", "v"):
        return False
    return "kv_head" in hook_shape(kind_name(0, kind), model.hook_flags, model.cfg).split()


def check_head(model, head, what: str, kv: bool = False) -> tuple:
    cfg = model.cfg
    if not (isinstance(head, (tuple, list)) and len(head) == 2 and all(isinstance(i, int) for i in head)):
        raise ValueError(f"{what} must be a (layer, head) pair of ints, got {head!r}")
    layer, index = head
    n_heads = cfg.n_key_value_heads if kv else cfg.n_heads
    if not (0 <= layer < cfg.n_layers and 0 <= index < n_heads):
        kind = (f" key/value heads (grouped-query attention, n_key_value_heads={n_heads}: a k or v receiver "
                "names a kv head, read by all its query heads)") if kv else " heads"
        raise ValueError(f"{what} {tuple(head)} is outside {cfg.n_layers} layers x {n_heads}{kind}")
    return (layer, index)


def parse_receivers(model, receivers: Receivers, senders: list):
    if isinstance(receivers, str):
        if receivers != "logits":
            raise ValueError(f"receivers is 'logits' or a list of (layer, head, 'q'|'k'|'v'), got {receivers!r}")
        return "logits"
    parsed = []
    for receiver in receivers:
        if not (isinstance(receiver, (tuple, list)) and len(receiver) == 3 and receiver[2] in KINDS):
            raise ValueError(f"a receiver is (layer, head, 'q'|'k'|'v'), got {receiver!r}")
        layer, head = check_head(model, tuple(receiver[:2]), "receiver", kv=grouped_kv(model, receiver[2]))
        parsed.append((layer, head, receiver[2]))
    if not parsed:
        raise ValueError("receivers is empty")
    first = min(layer for layer, _, _ in parsed)
    late = [s for s in senders if s[0] >= first]
    if late:
        raise ValueError(f"sender {late[0]} is not in a layer before receiver layer {first}: it has no path there")
    return parsed
