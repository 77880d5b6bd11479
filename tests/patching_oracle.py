"""The plain patching oracle shared by the patching tests: one patch, one full forward.

No start-from-cache, no batching of variants, no prefix reuse, no partial unembedding: a hook on the
full forward of the corrupted tokens overwrites the indexed slice with the clean value.
"""

import torch

from conftest import perturb_vectors
from glassbox.models import HookedTransformer
from glassbox.models.presets import preset_config

# Distinct sizes, so a swapped axis fails; a large init, so patches move metrics far beyond tolerances.
SIZES = dict(d_model=21, n_layers=3, n_heads=5, d_head=6, d_mlp=17, d_vocab=31, n_ctx=13, init_range=0.25)

TEMPLATES = {"resid_pre": "blocks.{L}.hook_resid_pre", "resid_mid": "blocks.{L}.hook_resid_mid",
             "resid_post": "blocks.{L}.hook_resid_post", "attn_out": "blocks.{L}.hook_attn_out",
             "mlp_out": "blocks.{L}.hook_mlp_out", "z": "blocks.{L}.attn.hook_z", "q": "blocks.{L}.attn.hook_q",
             "k": "blocks.{L}.attn.hook_k", "v": "blocks.{L}.attn.hook_v",
             "pattern": "blocks.{L}.attn.hook_pattern"}


def patched_logits(model, corrupted, clean_cache, kind: str, point: dict, attention_mask=None):
    """Logits of the corrupted tokens with one slice of one activation taken from the clean cache.

    ``point`` holds the layer and any of pos / head / query_pos; an axis left out is patched whole.
    """
    name = TEMPLATES[kind].format(L=point["layer"])
    if kind == "pattern":
        index = (slice(None), point.get("head", slice(None)), point.get("query_pos", slice(None)))
    else:
        index = (slice(None), point.get("pos", slice(None)), point.get("head", slice(None)))
    source = clean_cache[name]

    def patch(act, hook):
        act = act.clone()
        act[index] = source[index]
        return act

    with torch.no_grad():
        return model.run_with_hooks(corrupted, attention_mask=attention_mask, fwd_hooks=[(name, patch)])


def loop_value(model, corrupted, clean_cache, metric, kind: str, point: dict, attention_mask=None) -> float:
    """The metric's mean over prompts for one patch."""
    return metric(patched_logits(model, corrupted, clean_cache, kind, point, attention_mask)).mean().item()


def sample_points(shape: tuple, n: int, seed: int) -> list:
    """Grid points of a result: all corners plus ``n`` seeded random ones (all points if fewer)."""
    import itertools
    import random

    points = list(itertools.product(*(range(s) for s in shape)))
    if n >= len(points):
        return points
    corners = set(itertools.product(*[(0, s - 1) for s in shape]))
    return sorted(corners | set(random.Random(seed).sample(points, n)))


def tiny_model(preset: str = "gpt2", dtype=torch.float32, device=None, **changes) -> HookedTransformer:
    """A seeded tiny model of a preset architecture with norms and biases moved away from 1 and 0."""
    cfg = preset_config(preset, **{**SIZES, **changes})
    torch.manual_seed(0)
    model = HookedTransformer(cfg, dtype=dtype, device=device).eval()
    perturb_vectors(model)
    return model


def path_patch_by_forwards(model, corrupted, clean_cache, metric, senders, receivers, hooks=(), freeze_mlps=False):
    """Path patching by the IOI procedure with plain full forwards, all under ``hooks``: the corrupted
    run's values, run 1 (senders clean, other heads and optionally MLPs frozen) capturing receiver
    inputs, run 2. ``receivers`` is a list of (layer, head, kind); empty: read the metric from run 1."""
    corrupted_acts, captured = {}, {}

    def keep(store):
        def hook(act, hook):
            store[hook.name] = act.clone()
        return hook

    def freeze(layer):
        def hook(z, hook):
            z = corrupted_acts[hook.name].clone()
            for l, h in senders:
                if l == layer:
                    z[:, :, h] = clean_cache[hook.name][:, :, h]
            return z
        return hook

    def patch(act, hook):
        act = act.clone()
        for l, h, k in receivers:
            if hook.name == f"blocks.{l}.attn.hook_{k}":
                act[:, :, h] = captured[hook.name][:, :, h]
        return act

    n = model.cfg.n_layers
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        names = [f"blocks.{L}.attn.hook_z" for L in range(n)] + [f"blocks.{L}.hook_mlp_out" for L in range(n)]
        model.run_with_hooks(corrupted, fwd_hooks=[(name, keep(corrupted_acts)) for name in names])
        run1 = [(f"blocks.{L}.attn.hook_z", freeze(L)) for L in range(n)]
        if freeze_mlps:
            run1 += [(f"blocks.{L}.hook_mlp_out", lambda act, hook: corrupted_acts[hook.name]) for L in range(n)]
        receiver_names = sorted({f"blocks.{l}.attn.hook_{k}" for l, _, k in receivers})
        logits = model.run_with_hooks(corrupted, fwd_hooks=run1 + [(name, keep(captured)) for name in receiver_names])
        if receivers:
            logits = model.run_with_hooks(corrupted, fwd_hooks=[(name, patch) for name in receiver_names])
    return metric(logits).mean()
