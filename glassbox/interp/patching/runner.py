"""Running batches of patch variants from cached points of the corrupted run.

Why it is exact: a patch in block ``L`` changes nothing before that block, and under causal
attention a patch at position ``first`` changes nothing at earlier positions, in any layer. So a
variant patching block ``L`` at positions >= ``first`` needs only ``blocks[L:]`` over positions
``first:``, fed with the corrupted run's residual stream entering ``L`` and, at every later layer,
the corrupted run's keys and values of positions < ``first`` (taken from a ``KVCache``, so after
any rotation). Only the positions the metric reads are unembedded.

Why it is fast: ``run_staggered`` makes one pass down the layers in which each variant joins the
batch at its own layer, so the batch grows with depth; every layer's weights are read once per pass
rather than once per layer of variants, and the unembedding is done once for many passes.

Rows are variant-major: row ``v * n_prompts + b`` is prompt ``b`` under variant ``v``.

The base run is a plain forward, so any user hooks on the model run in it. It keeps each block's
resid_pre as it enters the hook point (before user hooks there, which run again when a variant
joins at that block) and every other activation after all hooks (the value a plain forward of the
corrupted tokens would pass on).

Footgun: the blocks are called directly (``block(resid, positions, attn_mask, kv)``), with the
patching hooks attached through ``model.hooks`` so they are removed even when something raises.

On a model placed across devices (``glassbox.models.devices``) each block runs on its device, with
the corrupted run's keys, values and activations kept where that run made them; the residual stream
moves at stage boundaries only, and the logits are read out on the embed's device, where the
callers' masks, clean values and metric targets are. A patching hook given here, built by its caller
on the embed's device, is called there: at a block on another device its activation goes to the
embed's device and the result comes back (two copies per patched hook point and pass).
"""

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor

from ...models import KVCache, devices
from ...models.kv_cache import LayerKV
from ...models.masks import positions_for


@dataclass
class BaseRun:
    """What every chunk reuses from one plain forward pass on the corrupted tokens."""

    tokens: Tensor  # [prompt pos]
    key_mask: Optional[Tensor]  # [prompt pos] bool, None when nothing is padded
    kv: KVCache  # keys and values of every layer, after any rotation
    acts: dict = field(default_factory=dict)  # hook name -> corrupted activation [prompt ...]
    n_layers: int = 0

    @property
    def n_prompts(self) -> int:
        return self.tokens.shape[0]

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]

    def resid_pre(self, layer: int) -> Tensor:
        return self.acts[f"blocks.{layer}.hook_resid_pre"]

    @property
    def final(self) -> Tensor:
        """The residual stream leaving the last block (the final norm's input)."""
        return self.acts[final_name(self.n_layers)]


def final_name(n_layers: int) -> str:
    return f"blocks.{n_layers - 1}.hook_resid_post"


def base_run(model, tokens: Tensor, key_mask: Optional[Tensor], names: Sequence[str] = ()) -> BaseRun:
    """One forward on the corrupted tokens, keeping keys/values, every resid_pre, the final residual
    stream and the activations ``names``."""
    n_layers = model.cfg.n_layers
    acts: dict = {}
    # resid_pre is kept as it enters its hook point, before any user hook there: a variant joining
    # at that block passes the hook point again. Copied only where a user hook follows (it could
    # edit the tensor in place); otherwise nothing else sees it.
    keep_input = lambda act, hook: acts.__setitem__(hook.name, act.clone() if len(hook.fwd_hooks) > 1 else act)
    # Everything else is kept after every hook (the corrupted value the loop would see). The forward
    # builds fresh tensors after each hook point, so holding references is safe.
    hooks = [(name, lambda act, hook: acts.__setitem__(hook.name, act)) for name in dict.fromkeys(
        [final_name(n_layers), *names])]
    kv = KVCache(n_layers)
    handles = []
    try:
        for layer in range(n_layers):
            handles += model.add_hook(f"blocks.{layer}.hook_resid_pre", keep_input, prepend=True)
        with torch.no_grad():
            model.run_with_hooks(tokens, attention_mask=key_mask, past_kv_cache=kv, return_type=None,
                                 fwd_hooks=hooks)
    finally:
        for handle in reversed(handles):
            handle.remove()
    return BaseRun(tokens, key_mask, kv, acts, n_layers=n_layers)


def run_blocks(model, base: BaseRun, resid: Tensor, start: int, stop: int, first: int, n_variants: int,
               hooks: Sequence = ()) -> Tensor:
    """blocks[start:stop] over positions first: of ``n_variants`` stacked copies of the prompts.

    ``resid`` [n_variants*prompt, pos-first, d_model] enters block ``start``; returns the residual
    stream leaving block ``stop - 1`` at the same positions.
    """
    span = resid.shape[1]
    key_mask = base.key_mask.repeat(n_variants, 1) if base.key_mask is not None else None
    plan = devices.plan_of(model)
    where = resid.device if plan is None else base.tokens.device  # the key mask's device
    shape_of = resid[..., 0] if plan is None else torch.empty(resid.shape[:2], dtype=torch.long, device=where)
    positions = positions_for(shape_of, key_mask, first)
    attn_masks = model.layer_masks(key_mask, span, first + span, where)
    stages = None
    if plan is not None:
        stages = devices.Stages(plan, positions, attn_masks)
        if any(d != base.tokens.device for d in plan.devices):
            hooks = [(name, at_device(fn, base.tokens.device)) for name, fn in hooks]
    with model.hooks(fwd_hooks=hooks):
        for layer in range(start, stop):
            kv = None
            if first > 0:
                # The prefix keys/values are the corrupted run's: no patch reaches positions < first.
                kv = LayerKV()
                kv.k = base.kv[layer].k[:, :first].repeat(n_variants, 1, 1, 1)
                kv.v = base.kv[layer].v[:, :first].repeat(n_variants, 1, 1, 1)
            attn_type = model.cfg.layer_attn_type(layer)
            if stages is None:
                resid = model.blocks[layer](resid, positions, attn_masks[attn_type], kv)
            else:
                resid, block_positions, mask = stages.enter_block(layer, resid, attn_type)
                resid = model.blocks[layer](resid, block_positions, mask, kv)
    return resid


def at_device(fn, device):
    """``fn`` called with its activation on ``device``, its result returned to the activation's device."""
    def hook(act: Tensor, hook):
        if act.device == device:
            return fn(act, hook)
        moved = act.to(device)
        out = fn(moved, hook)
        return (out if out is not None else moved).to(act.device)
    return hook


def run_staggered(model, base: BaseRun, first: int, joining: dict, make_hooks, stop: Optional[int] = None) -> Tensor:
    """One pass over positions first: in which ``joining[layer]`` variants join at their layer.

    ``make_hooks(layer, n_before)`` gives the hooks of that layer's block, knowing that the rows of
    the ``n_before`` variants that joined earlier come first. Returns the residual stream leaving
    block ``stop - 1`` (default: the last) [variant*prompt pos-first d_model], rows in joining order.
    """
    resid, n_variants = None, 0
    for layer in range(min(joining), model.cfg.n_layers if stop is None else stop):
        n_before = n_variants
        if resid is not None:
            resid = devices.cross(model, layer - 1, layer, resid)  # onto this block's device
        if joining.get(layer, 0):
            fresh = start_resid(base, layer, first, joining[layer])
            resid = fresh if resid is None else torch.cat([resid, fresh])
            n_variants += joining[layer]
        hooks = make_hooks(layer, n_before)
        resid = run_blocks(model, base, resid, layer, layer + 1, first, n_variants, hooks)
    return resid


def start_resid(base: BaseRun, layer: int, first: int, n_variants: int) -> Tensor:
    """The corrupted residual stream entering ``layer`` at positions first:, once per variant."""
    return base.resid_pre(layer)[:, first:].repeat(n_variants, 1, 1)


def read_resid(base: BaseRun, final: Tensor, first: int, read_pos: Tensor) -> Tensor:
    """The final residual stream [row d_model] at one absolute position per row.

    ``final`` [row pos-first d_model] leaves the last block; positions before ``first`` are read
    from the corrupted run, which no variant computed from ``first`` changed there.
    """
    rows = torch.arange(final.shape[0], device=final.device)
    read_pos = read_pos.to(final.device)
    x = final[rows, (read_pos - first).clamp(min=0)]
    prefix = base.final[rows % base.n_prompts, read_pos]
    return torch.where((read_pos >= first)[:, None], x, prefix)


def unembed(model, resid: Tensor) -> Tensor:
    """Logits from the residual stream leaving the last block (final norm, then W_U), on the embed's device."""
    return devices.to_home(model, devices.unembed(model, resid))


def full_logits(model, base: BaseRun, final: Tensor, first: int, n_variants: int) -> Tensor:
    """Logits [row pos d_vocab] at every position (for metrics that read more than one)."""
    if first > 0:
        final = torch.cat([base.final[:, :first].repeat(n_variants, 1, 1), final], dim=1)
    return unembed(model, final)
