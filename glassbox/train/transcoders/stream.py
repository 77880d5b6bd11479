"""Paired activations for transcoders: each token's value at every layer's input hook and output hook.

``PairedStream`` is the SAE trainer's ``ActivationStream`` (same windows, same special-token rule, same
shuffling buffer and the same bit-for-bit ``state``/``load_state``) whose rows are, per token,
``[inputs of layers 0..n-1, outputs of layers 0..n-1]`` flattened: [rows 2 * n_layers * d_model].
``split(batch)`` gives (inputs, targets), each [layer rows d_model]. The model runs to the last layer's
output hook only. Memory: the buffer holds ``buffer_batches * batch_tokens`` rows of
``2 * n_layers * d_model`` values (8 x 4096 rows of 768 floats for glassbox-austen: 100 MB in float32).
"""

import torch
from jaxtyping import Float
from torch import Tensor

from ..sae.stream import ActivationStream


class PairedStream(ActivationStream):
    def __init__(self, model, tokens, input_hook: str, output_hook: str, context_size: int, batch_tokens: int,
                 buffer_batches: int, model_batch: int, bos_id: int, ignore_ids, generator: torch.Generator,
                 device=None, dtype: torch.dtype = torch.float32):
        n, d = model.cfg.n_layers, model.cfg.d_model
        self.inputs = [f"blocks.{l}.{input_hook}" for l in range(n)]
        self.outputs = [f"blocks.{l}.{output_hook}" for l in range(n)]
        for name in self.inputs + self.outputs:
            if name not in model.hook_dict:
                from ...hooks.root import unknown_name_message

                raise KeyError(f"{name!r} is not a hook of this model: " + unknown_name_message(name, model.hook_dict))
        self.n_layers, self.d_model = n, d
        super().__init__(model, tokens, self.outputs[-1], 2 * n * d, context_size, batch_tokens, buffer_batches,
                         model_batch, bos_id, ignore_ids, generator, device, dtype)

    @torch.no_grad()
    def activations(self, windows) -> Float[Tensor, "rows width"]:
        model_device = next(self.model.parameters()).device
        names = self.inputs + self.outputs
        _, cache = self.model.run_with_cache(windows.to(model_device), names_filter=names, stop_at_layer=self.stop)
        acts = torch.stack([cache[name] for name in names], dim=2)  # [batch pos 2n d_model]
        acts = acts.reshape(acts.shape[0] * acts.shape[1], -1)
        keep = ~torch.isin(windows.reshape(-1), self.ignore_ids)
        return acts[keep.to(acts.device)].to(self.device, self.dtype)

    def split(self, batch: Tensor) -> tuple:
        """(inputs, targets) of a batch, each [layer rows d_model]."""
        pairs = batch.reshape(batch.shape[0], 2, self.n_layers, self.d_model)
        return pairs[:, 0].transpose(0, 1), pairs[:, 1].transpose(0, 1)
