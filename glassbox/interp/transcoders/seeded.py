"""``seeded_set``: a TranscoderSet of seeded random weights, for tests and benchmarks (the same set on every
machine: drawn in float64 from a CPU generator, then cast and moved).

Scales, so that a set on a model's MLP input is sparse and its output of a plausible size: ``W_enc``
N(0, 1/d_model), ``b_enc`` ``bias`` + N(0, 0.1^2) (``bias=-2``: about 2% of the features of a unit-variance
input fire), ``W_dec`` N(0, 1/d_transcoder), ``b_dec`` N(0, 0.01^2), ``W_skip`` N(0, 0.1^2/d_model), JumpReLU
thresholds uniform in [0, 0.5). ``python -m glassbox.interp.transcoders`` writes one in circuit-tracer's layout::

    python -m glassbox.interp.transcoders OUT --n-layers 2 --d-model 64 --d-transcoder 128 \\
        [--cross-layer] [--skip] [--activation relu|jumprelu|topk] [--k K] [--seed S] [--input-hook ln2.hook_out]
"""

from typing import Optional

import torch

from .set import TranscoderSet


def seeded_set(n_layers: int, d_model: int, d_transcoder: int, seed: int = 0, *, cross_layer: bool = False,
               skip: bool = False, activation: str = "relu", k: Optional[int] = None, bias: float = -2.0,
               input_hook: str = "ln2.hook_out", output_hook: str = "hook_mlp_out", dtype: torch.dtype = torch.float32,
               device=None, metadata: Optional[dict] = None) -> TranscoderSet:
    """A TranscoderSet of seeded random weights (module docstring)."""
    g = torch.Generator().manual_seed(seed)

    def normal(*shape, std=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * std

    W_enc = normal(n_layers, d_model, d_transcoder, std=d_model ** -0.5)
    b_enc = bias + normal(n_layers, d_transcoder, std=0.1)
    W_dec = [normal(d_transcoder, n_layers - s if cross_layer else 1, d_model, std=d_transcoder ** -0.5)
             for s in range(n_layers)]
    b_dec = normal(n_layers, d_model, std=0.01)
    W_skip = normal(n_layers, d_model, d_model, std=0.1 * d_model ** -0.5) if skip else None
    threshold = torch.rand(n_layers, d_transcoder, generator=g, dtype=torch.float64) * 0.5 \
        if activation == "jumprelu" else None
    ts = TranscoderSet(W_enc.to(dtype), b_enc.to(dtype), [w.to(dtype) for w in W_dec], b_dec.to(dtype),
                       W_skip=None if W_skip is None else W_skip.to(dtype), activation=activation,
                       threshold=None if threshold is None else threshold.to(dtype), k=k, input_hook=input_hook,
                       output_hook=output_hook, cross_layer=cross_layer,
                       metadata={"seed": seed, **(metadata or {})})
    return ts.to(device) if device is not None else ts
