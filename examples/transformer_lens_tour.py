"""A TransformerLens notebook's usual steps, run unchanged on glassbox after one added line.

    python examples/transformer_lens_tour.py [--model glassbox-austen]

Everything below the ``as_transformer_lens()`` line is TransformerLens 3.x code: it imports
``transformer_lens`` and uses its names, signatures and defaults. The steps: load (with
TransformerLens's weight processing), cache, read the OV and QK circuits as factored matrices,
composition scores between heads, head detection, ``test_prompt``, and ``get_act_patch_*`` sweeps
with a metric of the patched logits. On the shipped model, layer 1 head 0 is an induction head fed by
the previous-token head layer 0 head 2; the output shows both.
"""

import argparse

import glassbox.tl

glassbox.tl.as_transformer_lens()  # the one added line: `import transformer_lens` now gives glassbox.tl

import torch  # noqa: E402
import transformer_lens.patching as patching  # noqa: E402
from transformer_lens import HookedTransformer, utils  # noqa: E402
from transformer_lens.head_detector import detect_head  # noqa: E402

PROMPT = "Elizabeth read the letter again, and then walked to the window. When Jane came in, Elizabeth read the"
CORRUPTED = "Elizabeth read the garden again, and then walked to the window. When Jane came in, Elizabeth read the"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="glassbox-austen")
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)

    # Loading: TransformerLens's defaults fold the LayerNorms and centre the weights.
    model = HookedTransformer.from_pretrained(args.model)
    print(f"{model.cfg.model_name}: {model.cfg.n_layers} layers, {model.cfg.n_heads} heads, "
          f"d_model {model.cfg.d_model}, normalization {model.cfg.normalization_type}")

    # Caching, with TransformerLens's shorthand keys.
    tokens = model.to_tokens(PROMPT)
    logits, cache = model.run_with_cache(tokens)
    print(f"cache: {len(cache)} activations; pattern of layer 1: {tuple(cache['pattern', 1].shape)}")
    print("logit lens at the last position, top token after each layer:")
    resid, labels = cache.accumulated_resid(pos_slice=-1, apply_ln=True, return_labels=True)
    for label, top in zip(labels, (resid @ model.W_U).argmax(-1)[:, 0]):
        print(f"  {label:>12}: {model.to_string(top)!r}")

    # Circuits as factored matrices: every head's OV and QK at once.
    OV, QK = model.OV, model.QK
    print(f"OV {tuple(OV.shape)} (rank {OV.mdim}); largest singular value per layer:",
          [round(float(s), 2) for s in OV.S[:, :, 0].max(-1).values])
    k_comp = model.all_composition_scores("K")
    layer, head = 1, 0
    best = k_comp[0, :, layer, head]
    print(f"K-composition into L{layer}H{head} from layer-0 heads: {[round(float(x), 3) for x in best]}")

    # Head detection with TransformerLens's scoring.
    repeated = torch.randint(1, model.cfg.d_vocab, (1, 30), generator=torch.Generator().manual_seed(0))
    repeated = torch.cat([torch.tensor([[model.tokenizer.bos_token_id]]), repeated, repeated], dim=1)
    for name in ("previous_token_head", "induction_head"):
        scores = detect_head(model, repeated, name)
        L, H = divmod(int(scores.argmax()), model.cfg.n_heads)
        print(f"{name}: best L{L}H{H} scores {float(scores[L, H]):.3f}")

    # test_prompt prints the answer's rank and the top predictions.
    utils.test_prompt(PROMPT, " letter", model, top_k=5)

    # Activation patching with a metric of the patched logits (a scalar).
    answer, distractor = model.to_single_token(" letter"), model.to_single_token(" garden")
    corrupted_tokens = model.to_tokens(CORRUPTED)

    def logit_diff(patched_logits):
        return patched_logits[0, -1, answer] - patched_logits[0, -1, distractor]

    clean_diff, corrupted_diff = float(logit_diff(logits)), float(logit_diff(model(corrupted_tokens)))
    print(f"logit difference: clean {clean_diff:.2f}, corrupted {corrupted_diff:.2f}")

    def restored(patched_logits):
        return (logit_diff(patched_logits) - corrupted_diff) / (clean_diff - corrupted_diff)

    resid_pre = patching.get_act_patch_resid_pre(model, corrupted_tokens, cache, restored)
    heads = patching.get_act_patch_attn_head_out_all_pos(model, corrupted_tokens, cache, restored)
    print(f"resid_pre sweep {tuple(resid_pre.shape)}: position restoring most at layer 1 is "
          f"{int(resid_pre[1].argmax())} ({float(resid_pre[1].max()):.2f})")
    L, H = divmod(int(heads.argmax()), model.cfg.n_heads)
    print(f"head outputs, all positions {tuple(heads.shape)}: L{L}H{H} restores {float(heads[L, H]):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
