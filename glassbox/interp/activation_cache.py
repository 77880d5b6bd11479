"""ActivationCache: a mapping from hook name to a cached activation.

Keys are full hook names (``"blocks.3.attn.hook_pattern"``), TransformerLens shorthand tuples
(``cache["pattern", 3]``, ``cache["scale", 1, "ln2"]``) or compact strings (``cache["k6"]``,
``cache["scale4ln1"]``), resolved by ``act_name``'s exact table. A layer may be an int or a 0-d integer
tensor; a negative one counts from the end (``cache["resid_post", -1]`` is the last layer's), as in
TransformerLens; a layer outside [-n_layers, n_layers) is a ``KeyError`` naming it and n_layers.
Gradients, when cached with ``incl_bwd=True``, sit under ``<name>_grad``.

The cache remembers the model it came from (for weights in the analysis methods), the tokens and the
attention mask of the run (for head detection and last-token reads) and whether the batch axis was
removed. The tensors are detached copies, so nothing done to the model or to later activations
changes them; they are still ordinary tensors, so editing one in place edits the cache.

The analysis methods (``glassbox.interp.resid``, ``neurons``, ``decomposition``) take layer
arguments as stream positions: None or -1 is the stream entering the unembedding (see ``slices``).

The mapping has no item assignment; ``cache_dict`` (TransformerLens's attribute) is the live dict, so
writing to it writes to the cache, and ``compute_head_results`` adds entries. ``to``,
``remove_batch_dim`` and ``apply_slice_to_batch_dim`` return new caches.

Footguns: the analysis methods read the model's *current* weights. Editing weights after caching makes
decompositions that mix old activations with new weights. ``toggle_autodiff`` changes torch's global
grad mode, for every model.
"""

import logging
from collections.abc import Mapping
from numbers import Integral
from typing import Iterator, Optional, Union

import torch
from torch import Tensor

from ..hooks import unknown_name_message
from . import decomposition, neurons, resid
from .act_names import act_name, split_compact
from .slices import as_int, index_axis

Key = Union[str, tuple]
log = logging.getLogger(__name__)


class ActivationCache(Mapping):
    def __init__(self, cache_dict: dict, model, has_batch_dim: bool = True, tokens: Optional[Tensor] = None,
                 attention_mask: Optional[Tensor] = None):
        self._data = dict(cache_dict)
        self.model = model
        self.has_batch_dim = has_batch_dim
        self.tokens = tokens
        self.attention_mask = attention_mask

    # -- mapping ------------------------------------------------------------------------------
    def __getitem__(self, key: Key) -> Tensor:
        name = self.resolve(key)
        if name not in self._data and isinstance(key, str):
            name = _shorthand(key) or name
        if name in self._data:
            return self._data[name]
        hook_names = getattr(self.model, "hook_dict", {})
        base = name[: -len("_grad")] if name.endswith("_grad") else name
        if base in hook_names or base in self._data:
            raise KeyError(f"{name!r} was not cached by this run ({len(self._data)} entries); include it "
                           "in names_filter" + (" and pass incl_bwd=True" if name.endswith("_grad") else ""))
        raise KeyError(unknown_name_message(name, self._data) + " (not in this cache)")

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    @property
    def cache_dict(self) -> dict:
        """The live dict from hook name to tensor (TransformerLens's attribute): writes go into the cache."""
        return self._data

    @cache_dict.setter
    def cache_dict(self, value: dict) -> None:
        if not isinstance(value, dict):
            raise TypeError(f"cache_dict must be a dict of hook name to tensor, got {type(value).__name__}")
        self._data = value

    def keys(self):
        return self._data.keys()

    def values(self):
        return self._data.values()

    def items(self):
        return self._data.items()

    def __contains__(self, key) -> bool:
        try:
            self[key]
        except KeyError:
            return False
        return True

    def __repr__(self) -> str:
        from .reprs import cache_repr

        return cache_repr(self)

    def _repr_html_(self) -> str:  # the notebook view: keys grouped by layer, with shapes and sizes
        from .reprs import cache_html

        return cache_html(self)

    def resolve(self, key: Key) -> str:
        """The full hook name of a key: a name stays as it is, a tuple goes through ``act_name``
        (a negative layer counting from the end, a 0-d integer tensor read as its int)."""
        if isinstance(key, str):
            return key
        if isinstance(key, tuple) and 1 <= len(key) <= 3:
            if len(key) >= 2 and key[1] is not None:
                try:
                    layer = as_int(key[1], "layer")
                except TypeError as error:
                    raise KeyError(f"{error} (in key {key!r})") from None
                key = (key[0], self._layer_index(layer, key), *key[2:])
            return act_name(*key)
        raise KeyError(f"a cache key is a hook name or a (kind, layer[, layer_type]) tuple, got {key!r}")

    def _layer_index(self, layer: int, key: tuple) -> int:
        cfg = getattr(self.model, "cfg", None)
        if cfg is None:  # a cache without its model: only non-negative layers can be resolved
            if layer < 0:
                raise KeyError(f"layer {layer} of key {key!r} counts from the end, but this cache has no model "
                               "to give n_layers")
            return layer
        n_layers = cfg.n_layers
        if not -n_layers <= layer < n_layers:
            try:
                missing = f": this model has no {act_name(*key)}" if layer >= 0 else ""
            except KeyError:
                missing = ""
            raise KeyError(f"layer {layer} of key {key!r} is outside [-n_layers, n_layers) = [-{n_layers}, "
                           f"{n_layers}){missing}")
        return layer + n_layers if layer < 0 else layer

    # -- whole-cache operations ---------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes held by the cached tensors."""
        return sum(t.numel() * t.element_size() for t in self._data.values())

    def to(self, device=None, dtype: Optional[torch.dtype] = None) -> "ActivationCache":
        """A new cache with every tensor moved (and floating tensors cast, if ``dtype``, which must be a
        floating dtype: casting activations to an integer type would truncate them)."""
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise ValueError(f"cache.to(dtype={dtype!r}): activations are cast only to a floating dtype "
                             "(an integer or bool dtype would truncate them)")
        moved = {name: _convert(t, device, dtype) for name, t in self._data.items()}
        return self._like(moved, self.has_batch_dim, self.tokens, self.attention_mask, device)

    def remove_batch_dim(self) -> "ActivationCache":
        """A new cache with the batch axis (which must have size 1) dropped from every tensor."""
        if not self.has_batch_dim:
            return self
        for name, t in self._data.items():
            if t.shape[0] != 1:
                raise ValueError(f"remove_batch_dim needs batch size 1, {name} has shape {tuple(t.shape)}")
        return self._like({n: t[0] for n, t in self._data.items()}, False, self.tokens, self.attention_mask)

    def toggle_autodiff(self, mode: bool = False) -> None:
        """``torch.set_grad_enabled(mode)``: torch's *global* grad mode, for every model and tensor (a
        warning is logged). ``torch.no_grad()`` or ``torch.inference_mode()`` scope it instead."""
        log.warning("Changed the global state, set autodiff to %s", mode)
        torch.set_grad_enabled(mode)

    def apply_slice_to_batch_dim(self, batch_slice) -> "ActivationCache":
        """A new cache of the sequences ``batch_slice`` picks (an int, slice, indices or bool mask; see
        ``slices``) from every tensor, the tokens and the attention mask; an int drops the batch axis."""
        if not self.has_batch_dim:
            if batch_slice is None:
                return self
            raise ValueError("apply_slice_to_batch_dim: this cache has no batch axis (remove_batch_dim was applied)")
        data = {name: index_axis(t, batch_slice, 0, "batch_slice") for name, t in self._data.items()}
        tokens, mask = (index_axis(t, batch_slice, 0, "batch_slice") if t is not None else None
                        for t in (self.tokens, self.attention_mask))
        keeps_axis = not (isinstance(batch_slice, Integral)
                          or (isinstance(batch_slice, Tensor) and batch_slice.ndim == 0))
        return self._like(data, keeps_axis, tokens, mask)

    # -- analysis (see glassbox.interp.resid for the maths and the exact-LayerNorm contract) -----
    def stack_activation(self, activation_name: str, layer=-1, sublayer_type: Optional[str] = None) -> Tensor:
        """``cache[activation_name, l, sublayer_type]`` stacked for the blocks l before stream position
        ``layer`` (-1 or None: every block): [layer *shape]."""
        n = resid.stream_layer(self.model.cfg, layer)
        if n == 0:
            raise ValueError(f"stack_activation({activation_name!r}, layer=0) has no blocks to stack")
        return torch.stack([self[(activation_name, l, sublayer_type)] for l in range(n)])

    def accumulated_resid(self, layer=None, incl_mid: bool = False, apply_ln: bool = False,
                          pos_slice=None, mlp_input: bool = False, return_labels: bool = False):
        """The residual stream at each layer (logit lens with ``apply_ln``); see ``resid.accumulated_resid``."""
        return resid.accumulated_resid(self, layer, incl_mid, apply_ln, pos_slice, mlp_input, return_labels)

    def decompose_resid(self, layer=None, mlp_input: bool = False, mode: str = "all",
                        apply_ln: bool = False, pos_slice=None, incl_embeds: bool = True,
                        return_labels: bool = False, affine: bool = True):
        """The residual stream as the outputs that wrote it; see ``resid.decompose_resid``."""
        return resid.decompose_resid(self, layer, mlp_input, mode, apply_ln, pos_slice, incl_embeds, return_labels,
                                     affine)

    def compute_head_results(self) -> None:
        """Add every layer's ``attn.hook_result`` (z @ W_O per head) to the cache; see ``resid``."""
        resid.compute_head_results(self)

    def stack_head_results(self, layer=-1, return_labels: bool = False, incl_remainder: bool = False,
                           pos_slice=None, apply_ln: bool = False, incl_b_O: bool = False, affine: bool = True):
        """Each head's z @ W_O (b_O as its own rows with ``incl_b_O``); see ``resid.stack_head_results``."""
        return resid.stack_head_results(self, layer, return_labels, incl_remainder, pos_slice, apply_ln, incl_b_O,
                                        affine)

    def get_neuron_results(self, layer, neuron_slice=None, pos_slice=None, project_output_onto=None) -> Tensor:
        """Each neuron's write, hook_post[..., n] * W_out[n]; see ``neurons.get_neuron_results``."""
        return neurons.get_neuron_results(self, layer, neuron_slice, pos_slice, project_output_onto)

    def stack_neuron_results(self, layer, pos_slice=None, neuron_slice=None, return_labels: bool = False,
                             incl_remainder: bool = False, apply_ln: bool = False, project_output_onto=None,
                             affine: bool = True, mlp_input: bool = False):
        """Every neuron's write before ``layer``, labels "L{l}N{n}"; see ``neurons.stack_neuron_results``."""
        return neurons.stack_neuron_results(self, layer, pos_slice, neuron_slice, return_labels, incl_remainder,
                                            apply_ln, project_output_onto, affine, mlp_input)

    def get_full_resid_decomposition(self, layer=None, mlp_input: bool = False, expand_neurons: bool = True,
                                     apply_ln: bool = False, pos_slice=None, return_labels: bool = False,
                                     project_output_onto=None, affine: bool = True):
        """Heads, neurons (or MLPs), embeddings and biases; see ``decomposition``."""
        return decomposition.get_full_resid_decomposition(self, layer, mlp_input, expand_neurons, apply_ln, pos_slice,
                                                          return_labels, project_output_onto, affine)

    def apply_ln_to_stack(self, residual_stack: Tensor, layer=None, mlp_input: bool = False, pos_slice=None,
                          batch_slice=None, has_batch_dim: bool = True, recompute_ln: bool = False,
                          incl_bias: bool = False, affine: bool = True) -> Tensor:
        """Apply a norm exactly to a stack of components; see ``resid.apply_ln_to_stack``."""
        return resid.apply_ln_to_stack(self, residual_stack, layer, mlp_input, pos_slice, batch_slice, has_batch_dim,
                                       recompute_ln, incl_bias, affine)

    def logit_attrs(self, residual_stack: Tensor, tokens, incorrect_tokens=None, pos_slice=None, batch_slice=None,
                    has_batch_dim: bool = True, incl_bias: bool = True, affine: bool = True,
                    pre_cap: bool = False) -> Tensor:
        """Direct logit attribution, the final norm's bias as the last row; see ``resid.logit_attrs``
        (``pre_cap``: attribute a soft-capped model's uncapped logits)."""
        return resid.logit_attrs(self, residual_stack, tokens, incorrect_tokens, pos_slice, batch_slice, has_batch_dim,
                                 incl_bias, affine, pre_cap)

    def _like(self, data: dict, has_batch_dim: bool, tokens, mask, device=None) -> "ActivationCache":
        if device is not None:
            tokens = tokens.to(device) if tokens is not None else None
            mask = mask.to(device) if mask is not None else None
        return type(self)(data, self.model, has_batch_dim, tokens, mask)


def _shorthand(key: str) -> Optional[str]:
    """``cache["embed"]``, ``cache["scale"]``, ``cache["k6"]``: a shorthand, or None if it is not one."""
    try:
        compact = split_compact(key)
        return act_name(*compact) if compact is not None else act_name(key)
    except KeyError:
        return None


def _convert(t: Tensor, device, dtype: Optional[torch.dtype]) -> Tensor:
    return t.to(device=device, dtype=dtype if dtype is not None and t.is_floating_point() else None)
