"""TranscoderSet: one transcoder per layer (per-layer or skip), or one cross-layer transcoder, in one object.

What a set computes, for layer ``l`` reading ``x_l`` = the value at ``feature_input_hook(l)``:
- ``encode(l, x_l) = act_l(x_l @ W_enc(l) + b_enc(l))`` [... d_transcoder], ``W_enc(l)`` [d_model
  d_transcoder] (right-multiplied, as glassbox's SAEs);
- the estimate of the MLP output at ``feature_output_hook(t)``:
  ``out_t = sum_{s <= t} acts_s @ decoder_weights(s)[:, t - s, :] + b_dec(t) + x_t @ W_skip(t).T``.
  ``decoder_weights(s)`` is [d_transcoder n_targets d_model] with targets ``s..n_layers-1`` for a
  cross-layer set (a feature read at layer ``s`` writes every later MLP output) and ``n_targets = 1``
  for a per-layer set (only the term ``s = t``). ``W_skip(l)`` [d_model d_model] is applied transposed,
  ``x @ W_skip.T``, the orientation of SAELens's and circuit-tracer's per-layer files (None without skip).
The sum runs over ``s`` in increasing order, then ``b_dec``, then the skip term; for a per-layer set that
is the op order of glassbox's ``interp.sae`` transcoders, so ``from_saes`` gives the same numbers bit for bit.

Activations (``activation``):
- ``"relu"``: ``relu(pre)``;
- ``"jumprelu"``: ``pre * (pre > threshold(l))`` (circuit-tracer's form). SAELens's JumpReLU is
  ``relu(pre) * (pre > threshold)``, the same function once a negative threshold is raised to 0, which
  is what ``from_saes`` does; a negative threshold here passes small negative pre-activations, which
  SAELens cannot express (``to_saes`` refuses it);
- ``"topk"``: the ``k`` largest pre-activations of each position (``torch.topk``, ties torch's choice),
  through ReLU (SAELens's TopK), the rest 0.

Hooks are glassbox's names relative to the block (``input_hook="ln2.hook_out"`` is the MLP's input,
``"ln2.hook_normalized"`` the norm before its weight, ``"hook_resid_mid"``; ``output_hook="hook_mlp_out"``);
``feature_input_hook(l)`` gives the full name. circuit-tracer's ``mlp.hook_in`` / ``mlp.hook_out`` are read
as ``ln2.hook_out`` / ``hook_mlp_out`` (``circuit_tracer.py``); on a sandwich-norm model ``hook_mlp_out``
is after the post-MLP norm, so check a set against its model (``check_fits``).

The parameters are ``nn.Parameter``s (``encoder``, ``encoder_bias``, ``decoders``, ``decoder_bias``,
``skip_weights``, ``thresholds``), so ``to(device, dtype)``, ``state_dict`` and optimizers work; the accessors
above are views of them. Every parameter is checked finite when the set is built; a set changed in place
afterwards is the caller's. Inputs are cast to the set's dtype (as glassbox's SAEs).
"""

from typing import Dict, Optional, Sequence, Union

import torch
from jaxtyping import Float
from torch import Tensor, nn

from ..sae.checks import non_finite

ACTIVATIONS = ("relu", "jumprelu", "topk")


def _block_hook(suffix, what: str) -> str:
    """Refuse a hook suffix that is not a per-block hook of glassbox's shape table with a d_model value."""
    from ...models.hook_shapes import HOOK_SHAPES

    if not isinstance(suffix, str) or not suffix:
        raise ValueError(f"{what} must be a hook name relative to the block (e.g. 'hook_mlp_out'), got {suffix!r}")
    pattern = f"blocks.{{L}}.{suffix}"
    if pattern not in HOOK_SHAPES or HOOK_SHAPES[pattern][0] != "batch pos d_model":
        from ...suggest import did_you_mean

        known = sorted(p[len("blocks.{L}."):] for p, (shape, _) in HOOK_SHAPES.items()
                       if p.startswith("blocks.{L}.") and shape == "batch pos d_model")
        raise ValueError(f"{what}={suffix!r} is not a per-block hook with a [batch pos d_model] value"
                         f"{did_you_mean(suffix, known)}; known: {', '.join(known)}")
    return suffix


class TranscoderSet(nn.Module):
    """Transcoders for every layer of a model (module docstring).

    Args:
        W_enc: [n_layers d_model d_transcoder]. b_enc: [n_layers d_transcoder].
        W_dec: a list of n_layers tensors, ``W_dec[s]`` [d_transcoder n_targets d_model] with n_targets 1
            (per-layer) or ``n_layers - s`` (cross-layer); or one [n_layers d_transcoder d_model] tensor
            (per-layer).
        b_dec: [n_layers d_model]. W_skip: None or [n_layers d_model d_model] (applied as ``x @ W_skip[l].T``).
        activation: "relu", "jumprelu" (with ``threshold`` [n_layers d_transcoder]) or "topk" (with ``k``).
        input_hook, output_hook: glassbox hook names relative to the block.
        cross_layer: None infers it from ``W_dec[0]`` (n_layers targets); say so for a one-layer set.
        metadata: kept with the set and written by the savers (a model name, a training summary).
    """

    def __init__(self, W_enc: Tensor, b_enc: Tensor, W_dec: Union[Tensor, Sequence[Tensor]], b_dec: Tensor, *,
                 input_hook: str, output_hook: str = "hook_mlp_out", W_skip: Optional[Tensor] = None,
                 activation: str = "relu", threshold: Optional[Tensor] = None, k: Optional[int] = None,
                 cross_layer: Optional[bool] = None, metadata: Optional[dict] = None):
        super().__init__()
        self.input_hook = _block_hook(input_hook, "input_hook")
        self.output_hook = _block_hook(output_hook, "output_hook")
        tensors = {"W_enc": W_enc, "b_enc": b_enc, "b_dec": b_dec}
        if isinstance(W_dec, Tensor):
            if W_dec.ndim != 3:
                raise ValueError(f"W_dec as one tensor is a per-layer set's [n_layers d_transcoder d_model], got "
                                 f"shape {tuple(W_dec.shape)}")
            W_dec = [w[:, None, :] for w in W_dec]
        W_dec = list(W_dec)
        for name, t in tensors.items():
            if not isinstance(t, Tensor) or not t.is_floating_point():
                raise TypeError(f"{name} must be a floating-point tensor, got {type(t).__name__}"
                                f"{'' if not isinstance(t, Tensor) else ' of ' + str(t.dtype)}")
        if W_enc.ndim != 3:
            raise ValueError(f"W_enc must be [n_layers d_model d_transcoder], got shape {tuple(W_enc.shape)}")
        n_layers, d_model, d_transcoder = W_enc.shape
        if len(W_dec) != n_layers:
            raise ValueError(f"W_dec has {len(W_dec)} layers' decoders; W_enc has n_layers={n_layers}")
        targets = [w.shape[1] if isinstance(w, Tensor) and w.ndim == 3 else None for w in W_dec]
        cross = (n_layers > 1 and targets[0] == n_layers) if cross_layer is None else bool(cross_layer)
        expected = {"b_enc": (n_layers, d_transcoder), "b_dec": (n_layers, d_model)}
        for name, shape in expected.items():
            if tuple(tensors[name].shape) != shape:
                raise ValueError(f"{name} has shape {tuple(tensors[name].shape)}; W_enc "
                                 f"[n_layers={n_layers} d_model={d_model} d_transcoder={d_transcoder}] needs {shape}")
        for s, w in enumerate(W_dec):
            shape = (d_transcoder, n_layers - s if cross else 1, d_model)
            if not isinstance(w, Tensor) or tuple(w.shape) != shape:
                kind = "a cross-layer" if cross else "a per-layer"
                raise ValueError(f"W_dec[{s}] has shape {tuple(getattr(w, 'shape', ()))}; {kind} set (W_dec[0] "
                                 f"has {targets[0]} targets) needs {shape}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
        if (activation == "jumprelu") != (threshold is not None):
            raise ValueError("threshold [n_layers d_transcoder] is for activation='jumprelu' and needed by it; got "
                             f"activation={activation!r} with threshold {'given' if threshold is not None else 'None'}")
        if activation == "topk":
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= d_transcoder:
                raise ValueError(f"activation='topk' needs an int k in [1, d_transcoder={d_transcoder}], got k={k!r}")
        elif k is not None:
            raise ValueError(f"k={k!r} is for activation='topk', not {activation!r}")
        if threshold is not None and tuple(threshold.shape) != (n_layers, d_transcoder):
            raise ValueError(f"threshold has shape {tuple(threshold.shape)}; needs {(n_layers, d_transcoder)}")
        if W_skip is not None and tuple(W_skip.shape) != (n_layers, d_model, d_model):
            raise ValueError(f"W_skip has shape {tuple(W_skip.shape)}; needs {(n_layers, d_model, d_model)}")
        named = [("W_enc", W_enc), ("b_enc", b_enc), ("b_dec", b_dec), ("W_skip", W_skip), ("threshold", threshold)]
        named += [(f"W_dec[{s}]", w) for s, w in enumerate(W_dec)]
        for name, t in named:
            problem = None if t is None else non_finite(t.detach())
            if problem is not None:
                raise ValueError(f"TranscoderSet: {name} {problem}; a transcoder with it computes NaN or silently "
                                 "drops features, so it is refused")
        dtype, device = W_enc.dtype, W_enc.device

        def param(t):
            return nn.Parameter(t.detach().to(device, dtype).clone())

        self.encoder = param(W_enc)
        self.encoder_bias = param(b_enc)
        self.decoders = nn.ParameterList([param(w) for w in W_dec])
        self.decoder_bias = param(b_dec)
        self.skip_weights = None if W_skip is None else param(W_skip)
        self.thresholds = None if threshold is None else param(threshold)
        self.activation, self.k = activation, k
        self.cross_layer = bool(cross)
        self.metadata = dict(metadata or {})

    # -- shape and hooks ---------------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return self.encoder.shape[0]

    @property
    def d_model(self) -> int:
        return self.encoder.shape[1]

    @property
    def d_transcoder(self) -> int:
        return self.encoder.shape[2]

    @property
    def skip(self) -> bool:
        """Whether the set has skip connections (``W_skip``)."""
        return self.skip_weights is not None

    skip_connection = skip  # circuit-tracer's name

    @property
    def dtype(self) -> torch.dtype:
        return self.encoder.dtype

    @property
    def device(self) -> torch.device:
        return self.encoder.device

    def _layer(self, layer) -> int:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be an int in [0, n_layers={self.n_layers}), got {layer!r}")
        return layer

    def feature_input_hook(self, layer: int) -> str:
        """The glassbox hook whose value layer ``layer``'s features read, e.g. ``blocks.3.ln2.hook_out``."""
        return f"blocks.{self._layer(layer)}.{self.input_hook}"

    def feature_output_hook(self, layer: int) -> str:
        """The glassbox hook whose value the set estimates at layer ``layer``, e.g. ``blocks.3.hook_mlp_out``."""
        return f"blocks.{self._layer(layer)}.{self.output_hook}"

    # -- parameters by layer -------------------------------------------------------------------------
    def W_enc(self, layer: int) -> Float[Tensor, "d_model d_transcoder"]:
        return self.encoder[self._layer(layer)]

    def b_enc(self, layer: int) -> Float[Tensor, " d_transcoder"]:
        return self.encoder_bias[self._layer(layer)]

    def decoder_weights(self, source_layer: int) -> Float[Tensor, "d_transcoder n_targets d_model"]:
        """What one unit of each feature read at ``source_layer`` adds to the MLP outputs of the layers
        ``source_layer..`` (n_targets = n_layers - source_layer for a cross-layer set, else 1)."""
        return self.decoders[self._layer(source_layer)]

    def targets(self, source_layer: int) -> range:
        """The layers whose MLP output the features read at ``source_layer`` write."""
        s = self._layer(source_layer)
        return range(s, self.n_layers) if self.cross_layer else range(s, s + 1)

    def b_dec(self, target_layer: int) -> Float[Tensor, " d_model"]:
        return self.decoder_bias[self._layer(target_layer)]

    def W_skip(self, layer: int) -> Optional[Float[Tensor, "d_model d_model"]]:
        """Layer ``layer``'s skip matrix, applied as ``x @ W_skip.T``; None for a set without skip."""
        layer = self._layer(layer)
        return None if self.skip_weights is None else self.skip_weights[layer]

    def threshold(self, layer: int) -> Optional[Float[Tensor, " d_transcoder"]]:
        layer = self._layer(layer)
        return None if self.thresholds is None else self.thresholds[layer]

    # -- the computation ---------------------------------------------------------------------------
    def _input(self, layer: int, x: Tensor) -> Tensor:
        if not isinstance(x, Tensor) or x.ndim < 1 or x.shape[-1] != self.d_model:
            raise ValueError(f"the transcoder of layer {layer} reads {self.feature_input_hook(layer)} with "
                             f"d_model={self.d_model} values per position, got "
                             f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
        return x.to(self.dtype)

    def encode_pre(self, layer: int, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_transcoder"]:
        """The pre-activations ``x @ W_enc(layer) + b_enc(layer)``."""
        layer = self._layer(layer)
        return self._input(layer, x) @ self.encoder[layer] + self.encoder_bias[layer]

    def activate(self, layer: int, pre: Float[Tensor, "... d_transcoder"]) -> Float[Tensor, "... d_transcoder"]:
        """Layer ``layer``'s activation function on pre-activations (module docstring)."""
        layer = self._layer(layer)
        if self.activation == "relu":
            return torch.relu(pre)
        if self.activation == "jumprelu":
            return pre * (pre > self.thresholds[layer]).to(pre.dtype)
        values, indices = torch.topk(pre, k=self.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter_(-1, indices, values.relu())

    def encode(self, layer: int, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_transcoder"]:
        """Feature activations of layer ``layer`` on ``x`` (its value at ``feature_input_hook(layer)``)."""
        return self.activate(layer, self.encode_pre(layer, x))

    def decode(self, acts: Dict[int, Tensor], layer_inputs: Optional[Dict[int, Tensor]] = None) -> Dict[int, Tensor]:
        """The MLP-output estimates of the layers ``acts`` determines: every given layer for a per-layer
        set; for a cross-layer set ``acts`` must hold the layers ``0..m`` and the estimates are of ``0..m``
        (a later target also needs later sources). ``layer_inputs`` (the encoder inputs) is needed for the
        skip term of a skip set."""
        layers = self._given(acts, "acts")
        if self.skip_weights is not None and (layer_inputs is None or any(l not in layer_inputs for l in layers)):
            missing = layers if layer_inputs is None else [l for l in layers if l not in layer_inputs]
            raise ValueError(f"this set has skip connections: decode needs layer_inputs for layers {missing}")
        out = {}
        for t in layers:
            total = None
            for s in (range(t + 1) if self.cross_layer else (t,)):
                term = acts[s].to(self.dtype) @ self.decoders[s][:, t - s if self.cross_layer else 0, :]
                total = term if total is None else total + term
            total = total + self.decoder_bias[t]
            if self.skip_weights is not None:
                total = total + self._input(t, layer_inputs[t]) @ self.skip_weights[t].T
            out[t] = total
        return out

    def reconstruct(self, layer_inputs: Dict[int, Tensor]) -> Dict[int, Tensor]:
        """Each layer's MLP-output estimate from the encoder inputs ``{layer: [... d_model]}`` (a
        cross-layer set: layers ``0..m``, see ``decode``)."""
        layers = self._given(layer_inputs, "layer_inputs")
        return self.decode({l: self.encode(l, layer_inputs[l]) for l in layers}, layer_inputs)

    def _given(self, values, what: str) -> list:
        if not isinstance(values, dict) or not values:
            raise ValueError(f"{what} must be a non-empty dict {{layer: tensor}}, got {type(values).__name__}")
        layers = sorted(self._layer(l) for l in values)
        if self.cross_layer and layers != list(range(len(layers))):
            gap = next(l for l in range(self.n_layers) if l not in values)
            raise ValueError(f"a cross-layer set's output at layer t sums the features of layers 0..t: {what} "
                             f"holds layers {layers}, without layer {gap}")
        return layers

    # -- fitting a model ---------------------------------------------------------------------------
    def check_fits(self, model) -> None:
        """Refuse, naming the hook and the sizes, a set whose layers or hooks ``model`` does not have, or
        whose d_model is not the model's."""
        cfg = model.cfg
        if cfg.n_layers != self.n_layers:
            raise ValueError(f"the transcoder set has {self.n_layers} layers; the model has n_layers={cfg.n_layers}")
        if cfg.d_model != self.d_model:
            raise ValueError(f"the transcoder set reads and writes d_model={self.d_model}; the model has "
                             f"d_model={cfg.d_model}")
        for layer in range(self.n_layers):
            for name in (self.feature_input_hook(layer), self.feature_output_hook(layer)):
                if name not in model.hook_dict:
                    from ...hooks.root import unknown_name_message

                    raise KeyError(f"the transcoder set uses {name!r}, which this model does not have: "
                                   + unknown_name_message(name, model.hook_dict))

    def extra_repr(self) -> str:
        kind = "cross-layer" if self.cross_layer else ("skip" if self.skip_weights is not None else "per-layer")
        act = self.activation + (f" k={self.k}" if self.k is not None else "")
        return (f"{kind}, {act}, n_layers={self.n_layers}, d_model={self.d_model}, d_transcoder={self.d_transcoder}, "
                f"{self.input_hook} -> {self.output_hook}")
