"""Measure how far glassbox's spliced SAEs are from SAELens's HookedSAETransformer (TransformerLens 3.9
holding the same weights), over models, prompt lengths, batches and padding: the numbers the README's
SAE section and the bounds of tests_tl/test_sae_splice_saelens.py rest on.

Run from the repository root in the TransformerLens environment:
    PYTHONPATH=. .tlenv/bin/python tests_tl/measure_sae_splice.py
It prints, per model, the largest |difference| of the logits between the two clean models, between the
two with the SAEs spliced (error term off, and on), of the SAEs' feature activations, and the largest
|logit|; then the maxima over everything. Models: the shipped glassbox-austen (with its shipped SAE and
random ones), a seeded random GPT-2-shaped model and a Llama-shaped one (RMSNorm, rotary, SwiGLU, no
biases, untied unembedding). Prompts: lengths 1 to n_ctx, batches of 1 and 4 random tokens, and a batch
right-padded with an attention mask (compared at the kept positions only).
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
torch.set_num_threads(1)

from sae_lens import SAE as LensSAE  # noqa: E402
from sae_lens import HookedSAETransformer  # noqa: E402

from glassbox import HookedTransformer  # noqa: E402
from glassbox.interp.sae.format import load_sae, save_sae  # noqa: E402
from tl_oracle import max_diff, tiny_model, tl_twin  # noqa: E402

LLAMA = dict(normalization="RMS", positional="rotary", gated_mlp=True, act_fn="silu", use_bias=False,
             tied_unembed=False)


def lens_model_of(model):
    twin = tl_twin(model)
    lens = HookedSAETransformer(twin.cfg, move_to_device=False, tokenizer=twin.tokenizer)
    lens.load_state_dict(twin.state_dict(), strict=False)
    return lens.eval()


def random_saes(model, folder: Path, seed: int):
    folder = folder / f"{model.cfg.normalization}-{len(list(folder.iterdir()))}"
    """Standard SAEs at resid_pre of the last layer and at its attention hook_z, and a transcoder from
    layer 0's ln2 input to its MLP output, random weights; each as (glassbox, SAELens) via the folder."""
    from glassbox.interp.sae.architectures import make_sae
    from glassbox.interp.sae.config import SAEConfig
    cfg = model.cfg
    last = cfg.n_layers - 1
    places = [(f"blocks.{last}.hook_resid_pre", None, "none", cfg.d_model),
              (f"blocks.{last}.attn.hook_z", None, "hook_z", cfg.n_heads * cfg.d_head),
              ("blocks.0.ln2.hook_normalized", "blocks.0.hook_mlp_out", "none", cfg.d_model)]
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, (read, write, reshape, width) in enumerate(places):
        arch = "standard" if write is None else "transcoder"
        sae = make_sae(SAEConfig(arch, width, 37, read, hook_name_out=write, reshape_activations=reshape,
                                 apply_b_dec_to_input=write is None, d_out=width if write else None))
        with torch.no_grad():
            for name, p in sae.named_parameters():
                p.copy_(torch.randn(p.shape, generator=g) * (width ** -0.5 if name.startswith("W") else 0.3))
        save_sae(sae, folder / f"{seed}-{i}")
        out.append((sae, LensSAE.load_from_disk(str(folder / f"{seed}-{i}")).eval()))
    return out


def prompts(model, seed: int):
    """(tokens, attention mask or None): lengths 1 to n_ctx, batches of 1 and 4, a right-padded batch."""
    n_ctx, vocab = model.cfg.n_ctx, model.cfg.d_vocab
    g = torch.Generator().manual_seed(seed)
    lengths = sorted({1, 2, 3, 5, 8, 13, 21, n_ctx // 2, n_ctx - 1, n_ctx})
    for length in lengths:
        for batch in (1, 4):
            yield torch.randint(0, vocab, (batch, length), generator=g), None
    toks = torch.randint(0, vocab, (3, n_ctx // 2), generator=g)
    mask = torch.ones_like(toks)
    mask[1, n_ctx // 4:] = 0
    mask[2, 3:] = 0
    yield toks, mask


def measure(name, model, pairs, seed=0):
    lens_model = lens_model_of(model)
    worst = dict(clean=0.0, spliced=0.0, spliced_error_term=0.0, feature_acts=0.0, logits=0.0)
    where = {}
    ours, theirs = [p[0] for p in pairs], [p[1] for p in pairs]
    acts = [f"{s.cfg.hook_out}.hook_sae_acts_post" for s in ours]
    for toks, mask in prompts(model, seed):
        keep = (torch.ones_like(toks) if mask is None else mask).bool()
        kw = {} if mask is None else dict(attention_mask=mask)
        with torch.no_grad():
            clean, lens_clean = model(toks, **kw), lens_model(toks, **kw)
            d = max_diff(clean[keep], lens_clean[keep])
            if d > worst["clean"]:
                where["clean"] = f"{tuple(toks.shape)}{' padded' if mask is not None else ''}"
            worst["clean"] = max(worst["clean"], d)
            worst["logits"] = max(worst["logits"], float(clean[keep].abs().max()))
            for error_term, key in ((False, "spliced"), (True, "spliced_error_term")):
                got, got_cache = model.run_with_cache_with_saes(toks, saes=ours, use_error_term=error_term,
                                                                names_filter=acts, **kw)
                want, want_cache = lens_model.run_with_cache_with_saes(toks, saes=theirs, use_error_term=error_term,
                                                                       names_filter=acts, **kw)
                d = max_diff(got[keep], want[keep])
                if d > worst[key]:
                    where[key] = f"{tuple(toks.shape)}{' padded' if mask is not None else ''}"
                worst[key] = max(worst[key], d)
                for a in acts:
                    worst["feature_acts"] = max(worst["feature_acts"], max_diff(got_cache[a][keep], want_cache[a][keep]))
    print(f"{name:28s} " + "  ".join(f"{k} {v:.2e}" for k, v in worst.items()) + f"  (worst at {where})", flush=True)
    return worst


def main():
    import tempfile
    folder = Path(tempfile.mkdtemp())
    results = {}
    austen = HookedTransformer.from_pretrained("glassbox-austen").eval()
    shipped = load_sae("glassbox-austen-L1-resid-pre")
    from glassbox.interp.sae.format import shipped_folder
    shipped_pair = (shipped, LensSAE.load_from_disk(str(shipped_folder("glassbox-austen-L1-resid-pre"))).eval())
    results["glassbox-austen, shipped SAE"] = measure("glassbox-austen, shipped SAE", austen, [shipped_pair])
    results["glassbox-austen, random"] = measure("glassbox-austen, random SAEs", austen, random_saes(austen, folder, 0))
    for seed in range(3):
        model = tiny_model(seed, n_heads=3, d_head=8).eval()
        results[f"gpt2 {seed}"] = measure(f"random GPT-2 shape, seed {seed}", model, random_saes(model, folder, seed),
                                          seed)
        model = tiny_model(seed, n_heads=3, d_head=8, **LLAMA).eval()
        results[f"llama {seed}"] = measure(f"random Llama shape, seed {seed}", model, random_saes(model, folder, seed),
                                           seed)
    keys = next(iter(results.values())).keys()
    print(f"{'max over all':28s} " + "  ".join(f"{k} {max(r[k] for r in results.values()):.2e}" for k in keys))


if __name__ == "__main__":
    main()
