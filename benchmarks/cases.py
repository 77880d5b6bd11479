"""The benchmark cases. Each checks that the peers agree numerically, then times them interleaved.

A case returns a dict: ``case``, ``shape``, ``peers`` (per-peer median seconds and the median of
paired ratios to ``transformers``), ``max_abs_diff`` (each peer against the reference), and a
``note`` saying exactly what each peer runs. A peer whose feature is missing is left out and named
in ``absent``; a numerical disagreement raises ``AssertionError`` naming the case and the peer, so a
table is never printed for models that compute different things.

Every model call runs under ``torch.inference_mode()``; ``transformers`` runs with
``use_cache=False`` (a plain forward has no use for a key-value cache).
"""

import tempfile
from typing import Optional

import torch

from peers import Peers, build_tl
from timing import interleaved

REF = "transformers"
LOGIT_ATOL = 1e-4  # float32 logits of a 12-layer model: observed gaps ~3e-6, a wrong model is off by ~1
SWEEP_ATOL = 1e-5  # the bound for patching results


def tokens(batch: int, pos: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def max_diff(case: str, peer: str, got: torch.Tensor, want: torch.Tensor, atol: float) -> float:
    """The largest absolute gap; AssertionError naming the case and the peer when it exceeds atol."""
    both_inf = torch.isinf(got) & torch.isinf(want) & (got.sign() == want.sign())
    gap = (got.double() - want.double()).abs().masked_fill(both_inf, 0.0)
    worst = float(gap.max())
    if not worst <= atol:  # also catches NaN
        raise AssertionError(f"{case}: {peer} differs from the reference by {worst:.3g} > {atol}")
    return worst


def run_case(case: str, shape: str, fns: dict, outputs: dict, rounds: int, note: str, absent: dict,
             atol: float = LOGIT_ATOL, warmup: int = 1) -> dict:
    diffs = {peer: max_diff(case, peer, out, outputs[REF], atol) for peer, out in outputs.items() if peer != REF}
    with torch.inference_mode():
        timed = interleaved(fns, REF, rounds, warmup)
    return {"case": case, "shape": shape, "peers": timed, "max_abs_diff": diffs, "note": note, "absent": absent}


def forward(p: Peers, batch: int, pos: int, rounds: int, seed: int) -> dict:
    x = tokens(batch, pos, p.hf_config.vocab_size, seed)
    fns = {REF: lambda: p.hf(x, use_cache=False).logits, "glassbox": lambda: p.glassbox(x)}
    if p.tl is not None:
        fns["TransformerLens"] = lambda: p.tl(x)
    with torch.inference_mode():
        outputs = {peer: fn() for peer, fn in fns.items()}
    absent = tl_absent(p)
    add_remote(p, "forward", fns, outputs, absent, x=x)
    return run_case("forward", f"{batch}x{pos}", fns, outputs, rounds, absent=absent,
                    note="logits of a plain forward, no hook attached; transformers with sdpa attention")


def glassbox_cache_api() -> Optional[str]:
    """None when glassbox has run_with_cache, else why not."""
    try:
        import glassbox.interp.cache  # noqa: F401
    except ImportError as err:
        return f"glassbox.interp.cache is not available ({err})"
    return None


def run_with_cache(p: Peers, batch: int, pos: int, rounds: int, seed: int, only_patterns: bool) -> dict:
    case = "run_with_cache, only patterns" if only_patterns else "run_with_cache, every hook"
    missing = glassbox_cache_api()
    if missing:
        return {"case": case, "shape": f"{batch}x{pos}", "skipped": missing}
    x = tokens(batch, pos, p.hf_config.vocab_size, seed)
    names = (lambda name: name.endswith("hook_pattern")) if only_patterns else None
    fns = {REF: lambda: p.hf(x, use_cache=False).logits,
           "glassbox": lambda: p.glassbox.run_with_cache(x, names_filter=names)}
    if p.tl is not None:
        fns["TransformerLens"] = lambda: p.tl.run_with_cache(x, names_filter=names)
    with torch.inference_mode():
        results = {peer: fn() for peer, fn in fns.items()}
        outputs = {REF: results[REF], **{peer: results[peer][0] for peer in fns if peer != REF}}
        gb_cache = results["glassbox"][1]
        # Oracles for the cached values: transformers' own hidden states (and, for patterns, its
        # attention probabilities from an eager copy), and TransformerLens's cache where present.
        cache_diffs = check_cache_against_hf(case, p, x, gb_cache, only_patterns)
        if p.tl is not None:
            cache_diffs["vs TransformerLens"] = check_cache_against_tl(case, gb_cache, results["TransformerLens"][1])
    del results
    absent = tl_absent(p)
    remote = add_remote(p, "patterns" if only_patterns else "cache", fns, outputs, absent, x=x)
    for name, got in remote.items():
        outputs[name] = got["logits"]
        cache_diffs[f"{name} vs transformers"] = check_remote_cache(case, p, x, name, got, only_patterns)
    out = run_case(case, f"{batch}x{pos}", fns, outputs, rounds, absent=absent,
                   note="glassbox and TransformerLens run_with_cache "
                        + ("with names_filter=hook_pattern" if only_patterns else "caching every hook")
                        + " vs a plain transformers forward (sdpa)")
    out["cache_max_abs_diff"] = cache_diffs
    return out


def check_cache_against_hf(case: str, p: Peers, x, cache, only_patterns: bool) -> dict:
    n_layers = p.hf_config.n_layer
    if only_patterns:
        got = torch.stack([cache[f"blocks.{L}.attn.hook_pattern"] for L in range(n_layers)])
        want = torch.stack(p.hf_eager()(x, use_cache=False, output_attentions=True).attentions)
        return {"patterns vs transformers eager attentions": max_diff(case, "glassbox patterns", got, want, 1e-5)}
    hidden = p.hf(x, use_cache=False, output_hidden_states=True).hidden_states
    worst = 0.0
    for L in range(n_layers):
        worst = max(worst, max_diff(case, f"glassbox blocks.{L}.hook_resid_pre", cache[f"blocks.{L}.hook_resid_pre"],
                                    hidden[L], LOGIT_ATOL))
    worst = max(worst, max_diff(case, "glassbox ln_final.hook_out", cache["ln_final.hook_out"],
                                hidden[-1], LOGIT_ATOL))
    return {"resid_pre and ln_final vs transformers hidden states": worst}


def check_cache_against_tl(case: str, gb_cache, tl_cache) -> float:
    """Every entry both cache is equal; glassbox alone has each norm's output (``ln*.hook_out``, after w
    and b), and nothing else TransformerLens lacks."""
    gb_names, tl_names = set(gb_cache.keys()), set(tl_cache.keys())
    extra = {name for name in gb_names - tl_names if not name.endswith("hook_out") or name.startswith("unembed.")}
    if extra or tl_names - gb_names:
        raise AssertionError(f"{case}: cache keys differ: glassbox only {sorted(extra)[:5]}, "
                             f"TransformerLens only {sorted(tl_names - gb_names)[:5]}")
    return max(max_diff(case, f"glassbox {name} vs TransformerLens", gb_cache[name], tl_cache[name], LOGIT_ATOL)
               for name in sorted(gb_names & tl_names))


def run_with_noop_hooks(p: Peers, batch: int, pos: int, rounds: int, seed: int) -> dict:
    x = tokens(batch, pos, p.hf_config.vocab_size, seed)
    every = [(lambda name: True, lambda act, hook: None)]
    fns = {REF: lambda: p.hf(x, use_cache=False).logits,
           "glassbox": lambda: p.glassbox.run_with_hooks(x, fwd_hooks=every)}
    if p.tl is not None:
        fns["TransformerLens"] = lambda: p.tl.run_with_hooks(x, fwd_hooks=every)
    with torch.inference_mode():
        outputs = {peer: fn() for peer, fn in fns.items()}
    return run_case("run_with_hooks, no-op hook everywhere", f"{batch}x{pos}", fns, outputs, rounds,
                    absent=tl_absent(p), note="a hook that returns None on every hook point (so attention "
                    "materialises its pattern) vs a plain transformers forward (sdpa)")


def load_time(p: Peers, rounds: int) -> dict:
    """Seconds from a saved Hugging Face folder (config.json + model.safetensors) to a ready model."""
    from transformers import GPT2LMHeadModel

    from glassbox.weights import from_pretrained

    with tempfile.TemporaryDirectory() as folder:
        p.hf.save_pretrained(folder)
        fns = {REF: lambda: GPT2LMHeadModel.from_pretrained(folder).eval(),
               "glassbox": lambda: from_pretrained(folder)}
        if p.tl is not None:
            # TransformerLens's from_pretrained resolves configs on the hub; this is what it does
            # after the download: load the transformers model, convert, build and load its own.
            fns["TransformerLens"] = lambda: build_tl(GPT2LMHeadModel.from_pretrained(folder).eval())
        x = tokens(1, 16, p.hf_config.vocab_size, 1)
        with torch.inference_mode():
            outputs = {peer: fn()(x) for peer, fn in fns.items()}
        outputs[REF] = outputs[REF].logits
        out = run_case("load from a safetensors folder", "model", fns, outputs, rounds, absent=tl_absent(p),
                       warmup=1, note="transformers GPT2LMHeadModel.from_pretrained(folder); glassbox "
                       "from_pretrained(folder); TransformerLens: transformers load + convert_gpt2_weights "
                       "+ load_and_process_state_dict (no processing)")
    return out


def add_remote(p: Peers, case: str, fns: dict, outputs: dict, absent: dict, **args) -> dict:
    """Prepare ``case`` in every worker peer (peer_worker.py): its output goes into ``outputs`` (for the
    checks; returned too), its timed run into ``fns``; the peers not running are added to ``absent``."""
    got = {}
    for name, remote in p.remote.items():
        got[name] = outputs[name] = remote.prepare(case=case, **args)
        fns[name] = remote.run
    absent.update(p.remote_absent)
    return got


def check_remote_cache(case: str, p: Peers, x, name: str, got: dict, only_patterns: bool) -> float:
    """A worker's cached values against transformers: its patterns against the eager attention
    probabilities; its resid_pre (TransformerLens 4) or block outputs (nnsight) against the hidden states."""
    with torch.inference_mode():
        if only_patterns:
            want = torch.stack(p.hf_eager()(x, use_cache=False, output_attentions=True).attentions)
            return max_diff(case, f"{name} patterns", got["values"], want, 1e-5)
        hidden = torch.stack(p.hf(x, use_cache=False, output_hidden_states=True).hidden_states)
    if "block_outputs" in got:
        return max_diff(case, f"{name} block outputs", got["block_outputs"], hidden[1:-1], LOGIT_ATOL)
    return max_diff(case, f"{name} resid_pre", got["values"], hidden[:-1], LOGIT_ATOL)


def tl_absent(p: Peers) -> dict:
    return {} if p.tl is not None else {"TransformerLens": p.tl_error}

