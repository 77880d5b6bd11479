"""TransformerLens 3.x's ActivationCache: glassbox's cache with TransformerLens's signatures and defaults.

Every method maps onto ``glassbox.interp.ActivationCache`` (whose analysis lives in
``glassbox.interp.resid``, ``neurons`` and ``decomposition``); what changes here:

- norms follow TransformerLens's contract: ``apply_ln`` and ``apply_ln_to_stack`` centre and divide by
  the cached scale without the norm's w and b (``affine=False`` below), except ``recompute_ln`` at the
  unembedding (and ``accumulated_resid(apply_ln=True)`` at the last layer), which applies ln_final
  whole. On a model whose norms are folded (``fold_ln``) the two agree; on an unfolded one glassbox's
  own cache gives the exact share (w applied, b as a row of its own);
- ``logit_attrs`` has no bias row (TransformerLens's shape: one row per component);
- ``pos_slice``, ``neuron_slice`` and ``batch_slice`` also take TransformerLens's forms: a tuple is
  ``slice(*tuple)``, and a ``utils.Slice`` (or any object with ``mode`` and ``slice``) is read as the
  index it holds;
- ``to`` and ``remove_batch_dim`` change this cache in place and return it, as TransformerLens's do
  (glassbox's return a new cache); ``__repr__`` lists the keys.

Deliberate differences from TransformerLens 3.9 (glassbox's meaning kept): per-head results are
computed from hook_z and W_O and not added to the cache by ``stack_head_results`` (call
``compute_head_results`` for the ``hook_result`` entries); an int ``neuron_slice`` in
``stack_neuron_results`` keeps one row per layer (TransformerLens fails on it); a remainder at
``layer=0`` is the stream entering block 0 (TransformerLens reads the last block's resid_post); a
negative ``layer`` other than -1 counts from the end instead of failing; ``remove_batch_dim`` on a
batch of several raises a ValueError (not an AssertionError); the fused ``project_output_onto`` with
``apply_ln`` and ``mlp_input`` reads ln2's scale (TransformerLens reads ln1's); an attention-only
model's ``get_full_resid_decomposition`` works (TransformerLens reads a missing MLP bias);
``apply_slice_to_batch_dim`` slices every entry (glassbox's caches have no unbatched entries) and the
tokens and mask with them.

Footgun (as in glassbox): with use_attn_result and a hook that edits ``hook_result``, the cached
``hook_result`` holds the edited writes while ``stack_head_results`` gives z @ W_O.
"""

import logging

import numpy as np
from torch import Tensor

from ..interp import activation_cache
from ..interp.slices import stream_layer

log = logging.getLogger(__name__)


def as_index(index):
    """A TransformerLens slice input (None, int, tuple, slice, list, array, tensor, Slice) as glassbox's."""
    if isinstance(index, tuple):
        return slice(*index)
    if not isinstance(index, (Tensor, np.ndarray)) and hasattr(index, "mode") and hasattr(index, "slice"):
        # utils.Slice (glassbox's or TransformerLens's): the index it holds; its identity mode is None
        return None if index.mode == "identity" else index.slice
    return index


class BatchSizeError(ValueError, AssertionError):
    """remove_batch_dim on a cache whose batch is not 1 (an AssertionError in TransformerLens)."""


class ActivationCache(activation_cache.ActivationCache):
    """``ActivationCache(cache_dict, model, has_batch_dim=True)``, as in TransformerLens."""

    @property
    def has_embed(self) -> bool:
        return "hook_embed" in self.cache_dict

    @property
    def has_pos_embed(self) -> bool:
        return "hook_pos_embed" in self.cache_dict

    def __repr__(self) -> str:
        return f"ActivationCache with keys {list(self.cache_dict)}"

    def to(self, device) -> "ActivationCache":
        moved = super().to(device)
        self._data, self.tokens, self.attention_mask = moved._data, moved.tokens, moved.attention_mask
        return self

    def remove_batch_dim(self) -> "ActivationCache":
        if not self.has_batch_dim:
            log.warning("Tried removing batch dimension after already having removed it.")
            return self
        try:
            self._data, self.has_batch_dim = super().remove_batch_dim()._data, False
        except ValueError as err:  # TransformerLens asserts batch size 1: callers catch AssertionError
            raise BatchSizeError(str(err)) from None
        return self

    def apply_slice_to_batch_dim(self, batch_slice) -> "ActivationCache":
        return super().apply_slice_to_batch_dim(as_index(batch_slice))

    def accumulated_resid(self, layer=None, incl_mid=False, apply_ln=False, pos_slice=None, mlp_input=False,
                          return_labels=False):
        layer, pos_slice = stream_layer(self.model.cfg, layer), as_index(pos_slice)
        stack, labels = super().accumulated_resid(layer, incl_mid, False, pos_slice, mlp_input, True)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice, has_batch_dim=self.has_batch_dim,
                                           recompute_ln=layer == self.model.cfg.n_layers)
        return (stack, labels) if return_labels else stack

    def decompose_resid(self, layer=None, mlp_input=False, mode="all", apply_ln=False, pos_slice=None,
                        incl_embeds=True, return_labels=False):
        return super().decompose_resid(layer, mlp_input, mode, apply_ln, as_index(pos_slice), incl_embeds,
                                       return_labels, affine=False)

    def stack_head_results(self, layer=-1, return_labels=False, incl_remainder=False, pos_slice=None,
                           apply_ln=False):
        return super().stack_head_results(layer, return_labels, incl_remainder, as_index(pos_slice), apply_ln,
                                          affine=False)

    def get_neuron_results(self, layer, neuron_slice=None, pos_slice=None, project_output_onto=None):
        return super().get_neuron_results(layer, as_index(neuron_slice), as_index(pos_slice), project_output_onto)

    def stack_neuron_results(self, layer, pos_slice=None, neuron_slice=None, return_labels=False,
                             incl_remainder=False, apply_ln=False, project_output_onto=None):
        return super().stack_neuron_results(layer, as_index(pos_slice), as_index(neuron_slice), return_labels,
                                            incl_remainder, apply_ln, project_output_onto, affine=False)

    def get_full_resid_decomposition(self, layer=None, mlp_input=False, expand_neurons=True, apply_ln=False,
                                     pos_slice=None, return_labels=False, project_output_onto=None):
        return super().get_full_resid_decomposition(layer, mlp_input, expand_neurons, apply_ln, as_index(pos_slice),
                                                    return_labels, project_output_onto, affine=False)

    def apply_ln_to_stack(self, residual_stack, layer=None, mlp_input=False, pos_slice=None, batch_slice=None,
                          has_batch_dim=True, recompute_ln=False):
        whole = recompute_ln and stream_layer(self.model.cfg, layer) == self.model.cfg.n_layers
        return super().apply_ln_to_stack(residual_stack, layer, mlp_input, as_index(pos_slice), as_index(batch_slice),
                                         has_batch_dim, recompute_ln=whole, affine=whole)

    def logit_attrs(self, residual_stack, tokens, incorrect_tokens=None, pos_slice=None, batch_slice=None,
                    has_batch_dim=True):
        return super().logit_attrs(residual_stack, tokens, incorrect_tokens, as_index(pos_slice),
                                   as_index(batch_slice), has_batch_dim, incl_bias=False, affine=False)
