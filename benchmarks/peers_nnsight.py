"""nnsight 0.8's ``LanguageModel`` as a benchmark peer (a worker run by ``peer_worker``).

Started by run.py as ``/opt/nnsightenv/bin/python benchmarks/peers_nnsight.py --shape small``. It
wraps the seeded random GPT-2 of ``peers.build_hf`` (a local model object: no hub). ``LanguageModel``
insists on a tokenizer, though every case passes token ids; it gets glassbox's shipped
``glassbox-austen`` tokenizer, which is never used to encode anything.

Cases (every trace under ``torch.inference_mode()``, ``use_cache=False``):
- forward: one ``trace`` saving ``model.output.logits``;
- cache: ``tracer.cache(device=None)``, every module's output (nnsight's whole-model cache: module
  outputs, not TransformerLens's finer hook points), and the logits;
- patterns: an ``eager``-attention copy (``sdpa`` returns no probabilities), saving each
  ``transformer.h[L].attn.output[1]`` under ``output_attentions=True``;
- sweep: nnsight's batched idiom, one ``trace`` with one ``tracer.invoke(corrupted)`` per
  (layer, position), each setting ``transformer.h[L].input[:, p]`` to the clean value saved by a
  clean trace in ``prepare`` and saving the logit difference: all patches in one batched forward.
"""

import os
import sys

os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from peer_worker import serve, worker_args  # noqa: E402

TOKENIZER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "glassbox", "assets", "models",
                         "glassbox-austen", "tokenizer.json")


def wrap(hf):
    import warnings

    from nnsight import LanguageModel
    from transformers import PreTrainedTokenizerFast

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "LanguageModel is deprecated": it is still 0.8's documented class
        return LanguageModel(hf, tokenizer=PreTrainedTokenizerFast(tokenizer_file=TOKENIZER))


def eager_copy(hf):
    config = type(hf.config).from_dict(hf.config.to_dict())
    config._attn_implementation = "eager"
    model = type(hf)(config).eval()
    model.load_state_dict(hf.state_dict())
    return model


def make_prepare(hf, n_layers: int):
    lm = wrap(hf)
    eager = []

    def forward(x):
        with lm.trace(x, use_cache=False):
            logits = lm.output.logits.save()
        return logits

    def cache(x):
        with lm.trace(x, use_cache=False) as tracer:
            acts = tracer.cache(device=None)
            logits = lm.output.logits.save()
        return logits, acts

    def patterns(x):
        if not eager:
            eager.append(wrap(eager_copy(hf)))
        model, saved = eager[0], []
        with model.trace(x, use_cache=False, output_attentions=True):
            for L in range(n_layers):
                saved.append(model.transformer.h[L].attn.output[1].save())
            logits = model.output.logits.save()
        return logits, saved

    def sweep(clean, corrupted, correct, wrong):
        hidden = []  # appended inside the trace: nnsight 0.8 does not push back a comprehension's names
        with lm.trace(clean, use_cache=False):
            for L in range(n_layers):
                hidden.append(lm.transformer.h[L].input.save())
        return lambda: patch_all(hidden, corrupted, correct, wrong)

    def patch_all(hidden, corrupted, correct, wrong):
        values = []
        with lm.trace(use_cache=False) as tracer:
            for L in range(n_layers):
                for p in range(corrupted.shape[1]):
                    with tracer.invoke(corrupted):
                        lm.transformer.h[L].input[:, p] = hidden[L][:, p]
                        logits = lm.output.logits
                        values.append((logits[0, -1, correct] - logits[0, -1, wrong]).save())
        return torch.stack(values).reshape(n_layers, corrupted.shape[1])

    def prepare(case: str, x=None, clean=None, corrupted=None, correct=None, wrong=None):
        with torch.inference_mode():
            if case == "forward":
                fn = lambda: forward(x)  # noqa: E731
                return inference(fn), fn()
            if case == "cache":
                fn = lambda: cache(x)  # noqa: E731
                logits, acts = fn()
                blocks = [acts[f"model.transformer.h.{L}"].output for L in range(n_layers - 1)]  # = resid_pre of L + 1
                blocks = [b[0] if isinstance(b, tuple) else b for b in blocks]
                return inference(fn), {"logits": logits, "block_outputs": torch.stack(blocks),
                                       "entries": len(acts.keys())}
            if case == "patterns":
                fn = lambda: patterns(x)  # noqa: E731
                logits, saved = fn()
                return inference(fn), {"logits": logits, "values": torch.stack(saved), "entries": len(saved)}
            if case == "sweep":
                fn = sweep(clean, corrupted, correct, wrong)
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
    serve(importlib.metadata.version("nnsight"), make_prepare(hf, hf.config.n_layer))


if __name__ == "__main__":
    main()
