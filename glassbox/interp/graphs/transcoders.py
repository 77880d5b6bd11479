"""The transcoder interface the attribution graph reads, and a small set that implements it.

The graph code is duck-typed on this interface (the one ``glassbox.interp.transcoders.TranscoderSet``
implements), plus ``encoder(layer)``, the affine map to the pre-activations that a feature target's
edges are measured on:

- ``n_layers, d_model, d_transcoder, cross_layer, skip``;
- ``feature_input_hook(layer)`` / ``feature_output_hook(layer)``: the glassbox hook names read and
  written (e.g. ``blocks.{l}.ln2.hook_normalized`` and ``blocks.{l}.hook_mlp_out``);
- ``encoder(layer) -> (W_enc [d_model d_transcoder], b_enc [d_transcoder])``: pre = x @ W_enc + b_enc;
- ``activation(layer, pre) -> acts`` and ``encode(layer, x) = activation(layer, x @ W_enc + b_enc)``;
- ``decoder_weights(source_layer) -> [d_transcoder n_targets d_model]``, targets source_layer..n_layers-1
  (n_targets 1 for a per-layer set); ``b_dec(target_layer) -> [d_model]``;
  ``W_skip(layer) -> [d_model d_model] or None`` (skip term x @ W_skip, x the layer's input).

``StackedTranscoders`` holds these tensors directly: built from glassbox's SAELens-format transcoders
(``from_saes``) or from tensors (tests, benchmarks). Activations: "relu", "jumprelu" (threshold
[d_transcoder] per layer: pre kept where pre > threshold) and "topk" (the k largest pre-activations per
position, then ReLU). Footgun: TopK's kept set is a function of the whole pre-activation row, so a
perturbation can change which features are kept; the graph treats the kept set as fixed (as the
frozen-replacement literature does).
"""

from typing import Optional, Sequence

import torch
from torch import Tensor

ACTIVATIONS = ("relu", "jumprelu", "topk")


class StackedTranscoders:
    def __init__(self, W_enc: Sequence[Tensor], b_enc: Sequence[Tensor], W_dec: Sequence[Tensor],
                 b_dec: Sequence[Tensor], *, activation: str = "relu", threshold: Optional[Sequence[Tensor]] = None,
                 k: Optional[int] = None, W_skip: Optional[Sequence[Tensor]] = None,
                 input_hook: str = "blocks.{layer}.ln2.hook_normalized",
                 output_hook: str = "blocks.{layer}.hook_mlp_out"):
        """W_enc[l] [d_model d_transcoder], b_enc[l] [d_transcoder], W_dec[l] [d_transcoder n_targets d_model]
        (n_targets = 1 for every layer: per-layer; n_layers - l: cross-layer), b_dec[l] [d_model]."""
        n = len(W_enc)
        if n == 0 or not (len(b_enc) == len(W_dec) == len(b_dec) == n):
            raise ValueError(f"W_enc, b_enc, W_dec and b_dec need one entry per layer, got {len(W_enc)}, "
                             f"{len(b_enc)}, {len(W_dec)}, {len(b_dec)}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        d_model, d_tc = W_enc[0].shape
        targets = [w.shape[1] if w.ndim == 3 else -1 for w in W_dec]
        cross = targets == [n - l for l in range(n)] and n > 1
        if not cross and targets != [1] * n:
            raise ValueError(f"W_dec[l] must be [d_transcoder n_targets d_model] with n_targets 1 (per layer) or "
                             f"n_layers - l (cross-layer); got n_targets {targets}")
        for l in range(n):
            for name, t, shape in (("W_enc", W_enc[l], (d_model, d_tc)), ("b_enc", b_enc[l], (d_tc,)),
                                   ("W_dec", W_dec[l], (d_tc, targets[l], d_model)), ("b_dec", b_dec[l], (d_model,))):
                if tuple(t.shape) != shape:
                    raise ValueError(f"{name}[{l}] has shape {tuple(t.shape)}, expected {shape}")
                if not torch.isfinite(t).all():
                    raise ValueError(f"{name}[{l}] holds a NaN or inf")
        if activation == "jumprelu":
            if threshold is None or len(threshold) != n:
                raise ValueError("a jumprelu set needs threshold= with one [d_transcoder] tensor per layer")
            for l, t in enumerate(threshold):
                if tuple(t.shape) != (d_tc,) or not torch.isfinite(t).all():
                    raise ValueError(f"threshold[{l}] must be a finite [{d_tc}] tensor, got shape {tuple(t.shape)}")
        if activation == "topk" and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= d_tc):
            raise ValueError(f"a topk set needs an int k in [1, d_transcoder={d_tc}], got k={k!r}")
        if W_skip is not None:
            for l, w in enumerate(W_skip):
                if w is not None and (tuple(w.shape) != (d_model, d_model) or not torch.isfinite(w).all()):
                    raise ValueError(f"W_skip[{l}] must be a finite [{d_model} {d_model}] tensor")
        self.n_layers, self.d_model, self.d_transcoder = n, d_model, d_tc
        self.cross_layer = cross
        self.skip = W_skip is not None and any(w is not None for w in W_skip)
        self._W_enc, self._b_enc, self._W_dec, self._b_dec = list(W_enc), list(b_enc), list(W_dec), list(b_dec)
        self._threshold = list(threshold) if threshold is not None else None
        self._W_skip = list(W_skip) if W_skip is not None else [None] * n
        self.activation_name, self.k = activation, k
        self._input_hook, self._output_hook = input_hook, output_hook

    @classmethod
    def from_saes(cls, transcoders: Sequence) -> "StackedTranscoders":
        """One glassbox ``interp.sae`` transcoder per layer, in layer order (ReLU or JumpReLU, with or without
        W_skip; no input normalisation). Each must read ``blocks.{l}.…`` and write ``blocks.{l}.…``."""
        from ..sae import JumpReLUTranscoder, Transcoder

        W_enc, b_enc, W_dec, b_dec, thr, skips, hooks = [], [], [], [], [], [], set()
        jump = None
        for l, tc in enumerate(transcoders):
            if not isinstance(tc, Transcoder):
                raise TypeError(f"transcoders[{l}] is a {type(tc).__name__}, not a glassbox Transcoder")
            if tc.cfg.normalize_activations != "none":
                raise ValueError(f"transcoders[{l}] normalises its input ({tc.cfg.normalize_activations!r}): not "
                                 "affine, so the graph cannot be exact")
            is_jump = isinstance(tc, JumpReLUTranscoder)
            if jump is not None and is_jump != jump:
                raise ValueError("transcoders mix ReLU and JumpReLU layers")
            jump = is_jump
            for hook in (tc.cfg.hook_name, tc.cfg.hook_name_out):
                if not hook.startswith(f"blocks.{l}."):
                    raise ValueError(f"transcoders[{l}] reads or writes {hook!r}, not a hook of block {l}")
            hooks.add((tc.cfg.hook_name[len(f"blocks.{l}."):], tc.cfg.hook_name_out[len(f"blocks.{l}."):]))
            W_enc.append(tc.W_enc.detach())
            b_enc.append(tc.b_enc.detach())
            W_dec.append(tc.W_dec.detach()[:, None, :])
            b_dec.append(tc.b_dec.detach())
            thr.append(tc.threshold.detach() if is_jump else None)
            skips.append(tc.W_skip.detach().T if hasattr(tc, "W_skip") else None)
        if len(hooks) != 1:
            raise ValueError(f"transcoders read or write different hooks across layers: {sorted(hooks)}")
        (i, o), = hooks
        return cls(W_enc, b_enc, W_dec, b_dec, activation="jumprelu" if jump else "relu",
                   threshold=thr if jump else None, W_skip=skips if any(s is not None for s in skips) else None,
                   input_hook="blocks.{layer}." + i, output_hook="blocks.{layer}." + o)

    def feature_input_hook(self, layer: int) -> str:
        return self._input_hook.format(layer=layer)

    def feature_output_hook(self, layer: int) -> str:
        return self._output_hook.format(layer=layer)

    def encoder(self, layer: int) -> tuple:
        return self._W_enc[layer], self._b_enc[layer]

    def activation(self, layer: int, pre: Tensor) -> Tensor:
        if self.activation_name == "relu":
            return pre.relu()
        if self.activation_name == "jumprelu":
            return pre * (pre > self._threshold[layer])
        values, indices = pre.topk(self.k, dim=-1)
        return torch.zeros_like(pre).scatter_(-1, indices, values.relu())

    def encode(self, layer: int, x: Tensor) -> Tensor:
        W, b = self.encoder(layer)
        return self.activation(layer, x.to(W.dtype) @ W + b)

    def decoder_weights(self, source_layer: int) -> Tensor:
        return self._W_dec[source_layer]

    def b_dec(self, target_layer: int) -> Tensor:
        return self._b_dec[target_layer]

    def W_skip(self, layer: int) -> Optional[Tensor]:
        return self._W_skip[layer]

    def reconstruct(self, acts: dict) -> dict:
        """Each layer's output estimate from the feature activations of every layer (``acts[l]`` [... d_transcoder]),
        summing the cross-layer contributions; the skip terms are not included (they read the inputs)."""
        out = {}
        for t in range(self.n_layers):
            total = self._b_dec[t]
            for s in range(t + 1):
                if s in acts and (self.cross_layer or s == t):
                    total = total + acts[s] @ self._W_dec[s][:, t - s if self.cross_layer else 0]
            out[t] = total
        return out

    def to(self, device=None, dtype=None) -> "StackedTranscoders":
        def move(ts):
            return [t.to(device=device, dtype=dtype) if t is not None else None for t in ts]

        self._W_enc, self._b_enc, self._W_dec, self._b_dec = (move(self._W_enc), move(self._b_enc),
                                                              move(self._W_dec), move(self._b_dec))
        self._W_skip = move(self._W_skip)
        if self._threshold is not None:
            self._threshold = move(self._threshold)
        return self


def random_transcoders(d_model: int, d_transcoder: int, n_layers: int, *, cross_layer: bool = False,
                       activation: str = "relu", k: Optional[int] = None, skip: bool = False, seed: int = 0,
                       bias: float = -0.5, device=None, dtype=torch.float32, **hooks) -> StackedTranscoders:
    """A seeded random set (tests and benchmarks): encoder columns of norm ~1 and a negative bias so that
    a fraction of the features fire; thresholds for jumprelu at 0.1."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    W_enc = [rnd(d_model, d_transcoder, scale=d_model ** -0.5 * 2) for _ in range(n_layers)]
    b_enc = [rnd(d_transcoder, scale=0.1) + bias for _ in range(n_layers)]
    W_dec = [rnd(d_transcoder, (n_layers - l) if cross_layer else 1, d_model, scale=d_transcoder ** -0.5)
             for l in range(n_layers)]
    b_dec = [rnd(d_model, scale=0.1) for _ in range(n_layers)]
    thr = [torch.full((d_transcoder,), 0.1, device=device, dtype=dtype) for _ in range(n_layers)] \
        if activation == "jumprelu" else None
    W_skip = [rnd(d_model, d_model, scale=0.1 * d_model ** -0.5) for _ in range(n_layers)] if skip else None
    return StackedTranscoders(W_enc, b_enc, W_dec, b_dec, activation=activation, threshold=thr, k=k, W_skip=W_skip,
                              **hooks)
