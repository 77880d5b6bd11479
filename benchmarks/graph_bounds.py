"""The measured gaps behind the attribution-graph tests' bounds (tests/test_graph_replacement.py,
tests/test_graph_identities.py), printed as JSON:

    PYTHONPATH=. python benchmarks/graph_bounds.py

- ``replacement``: max |frozen replacement - captured| logits, and max |live replacement - unhooked model|,
  over the five block families and four transcoder kinds, float32 and float64;
- ``edges``: max |edge - perturbation| / max |edge| over the identity tests' cases (every class of source).
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from glassbox.interp.graphs import ReplacementRun, attribute  # noqa: E402
from tests import test_graph_identities as T  # noqa: E402
from tests.graph_models import FAMILIES, family_model, family_transcoders  # noqa: E402

KINDS = [dict(), dict(cross_layer=True), dict(skip=True, activation="jumprelu"), dict(activation="topk", k=5)]


def main() -> None:
    out = {}
    for dtype in (torch.float32, torch.float64):
        frozen = live = edge = 0.0
        for family in sorted(FAMILIES):
            for kind in KINDS:
                model, _ = family_model(family, dtype=dtype)
                ts = family_transcoders(family, dtype=dtype, **kind)
                tokens = torch.randint(0, model.cfg.d_vocab, (13,), generator=torch.Generator().manual_seed(3))
                run = ReplacementRun.capture(model, ts, tokens)
                with torch.no_grad():
                    plain = model(tokens[None])[0]
                    frozen = max(frozen, (run.frozen_forward()["logits"][0] - run.logits).abs().max().item())
                    live = max(live, (run.frozen_forward(live=True, recompute=True)["logits"][0] - plain)
                               .abs().max().item())
        for family, kind, prompt in T.CASES:
            model, _ = family_model(family, dtype=dtype)
            ts = family_transcoders(family, dtype=dtype, **kind)
            tokens = T.prompt_tokens(prompt, 5, model.cfg.d_vocab)
            g = attribute(model, ts, tokens, batch_size=17)
            run = ReplacementRun.capture(model, ts, tokens)
            tgt, A = T.targets(g), g.adjacency.double()
            with torch.no_grad():
                clean = T.target_values(g, ts, run.frozen_forward())[0].double()
                srcs = T.sources(g)
                delta = clean[None] - T.target_values(g, ts, T.perturbed_runs(run, srcs)).double()
            for b, (_, i, _) in enumerate(srcs):
                edge = max(edge, (delta[b] - A[tgt, i]).abs().max().item() / A.abs().max().item())
        out[str(dtype)] = {"replacement_frozen": frozen, "replacement_live": live, "edges_relative": edge}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
