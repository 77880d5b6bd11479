"""TransformerLens 4's ``TransformerBridge`` as a benchmark peer (a worker run by ``peer_worker``).

Started by run.py as ``/opt/tl4env/bin/python benchmarks/peers_tl4.py --shape small --seed 0``. It
builds the seeded random GPT-2 of ``peers.build_hf`` (same torch, same seed, same weights: the parent
checks every output against ``transformers`` anyway), saves it with ``save_pretrained`` to a
temporary folder and boots the bridge from that folder offline
(``TransformerBridge.boot_transformers(folder)``, no weight processing: the bridge's default runs
the Hugging Face modules themselves, with attention forced to ``eager`` so hooks see the pattern).

Cases (every call under ``torch.inference_mode()``):
- forward: ``bridge(x)`` (logits);
- cache / patterns: ``bridge.run_with_cache(x)`` / with ``names_filter`` the ``hook_pattern``s;
- sweep: ``transformer_lens.patching.get_act_patch_resid_pre(bridge, corrupted, clean_cache, metric)``,
  the clean cache built in ``prepare``, as for TransformerLens 3.9.
"""

import os
import sys
import tempfile

os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from peer_worker import serve, worker_args  # noqa: E402


def boot(hf):
    from transformer_lens.model_bridge import TransformerBridge

    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        bridge = TransformerBridge.boot_transformers(folder, device="cpu", dtype=torch.float32)
    return bridge.eval()


def make_prepare(bridge, n_layers: int):
    def prepare(case: str, x=None, clean=None, corrupted=None, correct=None, wrong=None):
        resid = [f"blocks.{L}.hook_resid_pre" for L in range(n_layers)]
        with torch.inference_mode():
            if case == "forward":
                fn = lambda: bridge(x)  # noqa: E731
                return inference(fn), fn()
            if case in ("cache", "patterns"):
                names = (lambda name: name.endswith("hook_pattern")) if case == "patterns" else None
                fn = lambda: bridge.run_with_cache(x, names_filter=names)  # noqa: E731
                logits, cache = fn()
                wanted = [f"blocks.{L}.attn.hook_pattern" for L in range(n_layers)] if case == "patterns" else resid
                return inference(fn), {"logits": logits, "values": torch.stack([cache[n] for n in wanted]),
                                       "entries": len(cache)}
            if case == "sweep":
                from transformer_lens import patching

                _, clean_cache = bridge.run_with_cache(clean)
                metric = lambda logits: logits[0, -1, correct] - logits[0, -1, wrong]  # noqa: E731
                fn = lambda: patching.get_act_patch_resid_pre(bridge, corrupted, clean_cache, metric)  # noqa: E731
                return inference(fn), fn()
        raise ValueError(f"unknown case {case!r}")

    return prepare


def inference(fn):
    def run():
        with torch.inference_mode():
            return fn()
    return run


def main(argv=None) -> None:
    import importlib.metadata

    args = worker_args(argv)
    torch.set_num_threads(args.threads)
    from peers import build_hf

    hf = build_hf(args.shape, args.seed)
    bridge = boot(hf)
    del hf
    serve(importlib.metadata.version("transformer_lens"), make_prepare(bridge, bridge.cfg.n_layers))


if __name__ == "__main__":
    main()
