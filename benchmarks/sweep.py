"""The resid_pre activation-patching sweep: every layer x position, batch 1, logit difference.

Three peers compute the same [layer pos] table:
- glassbox: ``glassbox.interp.patching.activation_patch(..., "resid_pre", ("layer", "pos"))`` with a
  ``LogitDiff`` metric, given a clean cache of the resid_pre activations;
- TransformerLens: ``patching.get_act_patch_resid_pre`` given its clean cache (a plain metric on
  full logits, which is what its API takes);
- ``transformers``: a loop written here, one clean forward with ``output_hidden_states`` and then
  one forward per (layer, position), a forward pre-hook on ``transformer.h[layer]`` overwriting that
  position of the block's input: n_layers * pos + 1 plain forwards, the floor of any unbatched
  sweep and the independent oracle for the other two.
TransformerLens 4 and nnsight, when their workers run, add theirs (peers_tl4.py, peers_nnsight.py).
The clean caches of glassbox and TransformerLens are built before timing; both sweeps' own corrupted
run is inside the timing, as in the transformers loop.
"""

from typing import Optional

import torch

from cases import REF, SWEEP_ATOL, add_remote, run_case, tl_absent, tokens
from peers import Peers


def answer_ids(vocab: int) -> tuple:
    return 11, vocab // 3  # any two distinct ids: the metric is their logit difference at the last position


def hf_sweep(hf, clean: torch.Tensor, corrupted: torch.Tensor, correct: int, wrong: int) -> torch.Tensor:
    n_layers, pos = hf.config.n_layer, clean.shape[1]
    hidden = hf(clean, use_cache=False, output_hidden_states=True).hidden_states
    out = torch.empty(n_layers, pos)
    for layer in range(n_layers):
        for p in range(pos):
            def patch(module, args, layer=layer, p=p):
                resid = args[0].clone()
                resid[:, p] = hidden[layer][:, p]
                return (resid, *args[1:])

            handle = hf.transformer.h[layer].register_forward_pre_hook(patch)
            try:
                logits = hf(corrupted, use_cache=False).logits
            finally:
                handle.remove()
            out[layer, p] = logits[0, -1, correct] - logits[0, -1, wrong]
    return out


def glassbox_patching() -> Optional[str]:
    """None when glassbox's patching engine is importable, else why not."""
    try:
        from glassbox.interp.patching import LogitDiff, activation_patch  # noqa: F401
    except ImportError as err:
        return f"glassbox.interp.patching is not available ({err})"
    return None


def resid_pre_sweep(p: Peers, pos: int, rounds: int, seed: int) -> dict:
    case, shape = "resid_pre patching sweep", f"1x{pos}"
    missing = glassbox_patching()
    if missing:
        return {"case": case, "shape": shape, "skipped": missing}
    from glassbox.interp.patching import LogitDiff, activation_patch

    vocab = p.hf_config.vocab_size
    clean, corrupted = tokens(1, pos, vocab, seed + 1), tokens(1, pos, vocab, seed + 2)
    correct, wrong = answer_ids(vocab)
    n_layers = p.hf_config.n_layer
    resid_names = [f"blocks.{L}.hook_resid_pre" for L in range(n_layers)]
    with torch.inference_mode():
        _, gb_cache = p.glassbox.run_with_cache(clean, names_filter=resid_names, return_type=None)
    metric = LogitDiff(correct, wrong)
    fns = {REF: lambda: hf_sweep(p.hf, clean, corrupted, correct, wrong),
           "glassbox": lambda: activation_patch(p.glassbox, corrupted, gb_cache, metric, "resid_pre",
                                                ("layer", "pos")).values}
    if p.tl is not None:
        from transformer_lens import patching

        with torch.inference_mode():
            _, tl_cache = p.tl.run_with_cache(clean)
        fns["TransformerLens"] = lambda: patching.get_act_patch_resid_pre(
            p.tl, corrupted, tl_cache, lambda logits: logits[0, -1, correct] - logits[0, -1, wrong])
    with torch.inference_mode():
        outputs = {peer: fn().float().cpu() for peer, fn in fns.items()}
    absent = tl_absent(p)
    add_remote(p, "sweep", fns, outputs, absent, clean=clean, corrupted=corrupted, correct=correct, wrong=wrong)
    return run_case(case, shape, fns, outputs, rounds, absent=absent, atol=SWEEP_ATOL, warmup=0,
                    note=f"{n_layers} layers x {pos} positions, logit difference at the last position; "
                         f"transformers: {n_layers * pos + 1} plain forwards with a pre-hook patch")
