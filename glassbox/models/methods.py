"""Convenience methods researchers call on the model: embedding inputs, losses, token directions.

They compute nothing the forward pass does not; each is a short composition of the model's own
modules, kept out of ``transformer.py`` so that file stays the computation alone. Names, arguments and
return shapes are TransformerLens's (``HookedTransformer.input_to_embed``, ``loss_fn``,
``tokens_to_residual_directions``, ``accumulated_bias``, ``all_head_labels``).

Footguns:
- ``tokens_to_residual_directions`` reads ``W_U`` as it is: without LayerNorm folding, the direction
  that reaches a logit is also scaled by ``ln_final`` (its weight, and the position's scale).
- ``input_to_embed`` runs the embedding hook points (``hook_embed``, ``hook_pos_embed``), so hooks
  attached there act on what it returns, as they would in a forward.
"""

from typing import Optional

import numpy as np
import torch
from torch import Tensor

from . import inputs
from .loss import lm_loss


class ModelMethods:
    """Mixed into ``HookedTransformer``."""

    def tokens_to_residual_directions(self, tokens) -> Tensor:
        """The unembedding column(s) of ``tokens``: the residual-stream direction each token's logit
        reads (``W_U[:, token]``).

        A string (one token), an int, or a tensor/array with one element gives [d_model]; a tensor of
        ids of any other shape gives [*shape d_model] (TransformerLens's rule: a one-element tensor of
        any shape gives [d_model]). An int or one-element input returns a view of ``W_U``.
        """
        W_U = self.W_U
        if isinstance(tokens, str):
            return W_U[:, self.to_single_token(tokens)]
        if isinstance(tokens, (int, np.integer)) and not isinstance(tokens, (bool, np.bool_)):
            return W_U[:, self._checked_token(int(tokens))]
        if isinstance(tokens, (Tensor, np.ndarray, list, tuple)):
            ids = inputs.as_array_tensor(tokens, "tokens")
            if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
                raise ValueError(f"tokens must be integer token ids, got dtype {ids.dtype}")
            if ids.numel() == 0:
                raise ValueError(f"tokens is empty (shape {tuple(ids.shape)})")
            if ids.numel() == 1:
                return W_U[:, self._checked_token(int(ids.reshape(()).item()))]
            ids = inputs.ids_as_integers(ids).to(W_U.device)
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high >= W_U.shape[1]:
                self._checked_token(low if low < 0 else high)
            return W_U.T[ids]
        raise ValueError(f"tokens must be a string, an int or a tensor of ids, got {type(tokens).__name__}")

    def _checked_token(self, token: int) -> int:
        d_vocab = self.W_U.shape[1]
        if not 0 <= token < d_vocab:
            raise ValueError(f"token id {token} is outside [0, d_vocab={d_vocab})")
        return token

    def input_to_embed(self, input, prepend_bos: Optional[bool] = None, padding_side: Optional[str] = "right",
                       attention_mask=None, past_kv_cache=None) -> tuple:
        """The residual stream entering block 0, as TransformerLens returns it:
        ``(residual [batch pos d_model], tokens [batch pos], shortformer_pos_embed, attention_mask)``.

        Computed by the model's own forward stopped before block 0 (embedding modules and hook points
        included). ``shortformer_pos_embed`` is always None (glassbox has no shortformer positions).
        ``attention_mask`` is glassbox's: None when nothing is padded, else bool [batch pos]; with a
        ``past_kv_cache`` it covers the cached and the new positions [batch past+pos] (None while
        every one is real). The cache is not changed. So, without a cache,
        ``model(residual, start_at_layer=0, attention_mask=attention_mask)`` equals ``model(input)``.

        Unlike TransformerLens, a padded list of strings always gets its mask (TransformerLens
        returns None for right padding, and its forward then lets the real tokens' logits stand
        while pads attend to earlier pads).
        """
        padding_side = self.resolve_padding_side(padding_side)
        tokens, mask = self.input_to_tokens(input, attention_mask, prepend_bos, padding_side)
        if past_kv_cache is None:
            residual = self(tokens, attention_mask=mask, stop_at_layer=0)
            return residual, tokens, None, mask
        saved = past_kv_cache.snapshot()
        try:
            residual = self(tokens, attention_mask=mask, past_kv_cache=past_kv_cache, stop_at_layer=0)
            full_mask = past_kv_cache.extend_mask(mask, tokens.shape)  # the forward left the cache as it was
        finally:
            past_kv_cache.restore(saved)
        return residual, tokens, None, full_mask

    def loss_fn(self, logits: Tensor, tokens, attention_mask=None, per_token: bool = False) -> Tensor:
        """Next-token cross-entropy of ``logits`` [batch pos d_vocab] on ``tokens`` [batch pos]
        (TransformerLens's ``loss_fn``): the mean over (input, target) pairs where both are real
        tokens of ``attention_mask`` (1/True real, 0/False padding), or with ``per_token`` the
        [batch pos-1] losses, 0 where masked. The same function as ``forward``'s loss
        (``glassbox.models.loss.lm_loss``)."""
        inputs.check_flag("per_token", per_token)
        if not isinstance(logits, Tensor) or logits.ndim != 3:
            raise ValueError(f"logits must be [batch pos d_vocab], got "
                             f"{tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__}")
        ids = inputs.as_tokens(inputs.as_array_tensor(tokens, "tokens"), logits.device)
        if tuple(ids.shape) != tuple(logits.shape[:2]):
            raise ValueError(f"tokens have shape {tuple(ids.shape)}, logits {tuple(logits.shape[:2])} (batch pos)")
        inputs.check_tokens(ids, ids.shape[1], logits.shape[-1])
        mask = inputs.optional_mask(attention_mask, tuple(ids.shape), logits.device)
        return lm_loss(logits, ids, mask, per_token)

    def accumulated_bias(self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True) -> Tensor:
        """[d_model]: the sum of the output biases (attention ``b_O``, MLP ``b_out``) written into the
        residual stream before block ``layer`` (0..n_layers); with ``mlp_input``, also block ``layer``'s
        attention ``b_O`` (the bias present at its MLP's input). Absent biases count as zero."""
        n = self.cfg.n_layers
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer <= n:
            raise ValueError(f"layer={layer!r} must be an int in [0, n_layers={n}]")
        inputs.check_flag("mlp_input", mlp_input)
        inputs.check_flag("include_mlp_biases", include_mlp_biases)
        if mlp_input and layer == n:
            raise ValueError(f"mlp_input=True needs a block's MLP input: layer must be < n_layers={n}")
        if self.cfg.norm_placement in ("sandwich", "output"):
            raise ValueError(f"norm_placement={self.cfg.norm_placement!r}: each block's output biases pass through a "
                             "norm at a per-position scale before they reach the residual stream, so their sum is not "
                             "what the stream holds")
        W_E = self.W_E
        total = torch.zeros(self.cfg.d_model, device=W_E.device, dtype=W_E.dtype)
        parts = [(block, include_mlp_biases) for block in self.blocks[:layer]]
        if mlp_input:
            parts.append((self.blocks[layer], False))
        for block, with_mlp in parts:
            for module, name in (("attn", "b_O"), ("mlp", "b_out"))[: 2 if with_mlp else 1]:
                bias = getattr(getattr(block, module, None), name, None)
                if bias is not None:
                    total = total + bias.to(total.device)  # a placed model keeps biases on their stages
        return total

    def all_head_labels(self) -> list:
        """["L0H0", "L0H1", ...]: every attention head, layer-major."""
        return [f"L{layer}H{head}" for layer in range(self.cfg.n_layers) for head in range(self.cfg.n_heads)]

    def _repr_html_(self) -> str:
        """The notebook view: name, family, sizes, dtype, device, hook flags and the hooks attached
        (``print(model)`` keeps torch's module tree)."""
        from ..interp.reprs import model_html

        return model_html(self)
