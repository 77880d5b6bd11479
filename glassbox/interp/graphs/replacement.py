"""The local replacement model of one prompt: transcoders in place of the MLPs, attention patterns and
every norm's scale frozen at the clean run's values, error nodes the transcoders' exact residuals.

``ReplacementRun.capture(model, transcoders, tokens)`` runs the model once and keeps what the frozen
model needs: each layer's transcoder input and MLP output, the feature activations, the errors
(MLP output - reconstruction - skip term, computed from the same clean values, so that with them the
frozen model reproduces the clean run), every ``hook_pattern`` and ``hook_scale``, the token
embeddings (``hook_embed``) and the logits.

``frozen_forward`` runs the model with those freezes: ``hook_embed`` takes the given embeddings, every
``attn.hook_pattern`` and ``*.hook_scale`` the clean values, and each ``feature_output_hook(l)`` is replaced
by the decoders applied to the given activations + b_dec + the skip term of the live input + the given
error. It is affine in (embeddings, activations, errors): the model the graph's edges are exact for.
With the clean values it reproduces the model's logits to float rounding (tests measure it: a hooked
pattern takes attention off its fused kernel). ``live=True`` keeps attention and norms live (the real
model with the transcoders spliced in), and ``recompute=True`` recomputes the features from the live
inputs with the transcoders' activations (an intervention's downstream response).

``prefix(n)`` is the same run cut to its first ``n`` positions: the model is causal, so the clean values and
the frozen patterns and scales of a prefix are those of the whole prompt cut to it (a frozen value is
cut to the shape the prefix's run asks for, its leading entries along every axis), and an attribution
target at position p only needs the replacement over positions <= p.

Footguns: the model's hooks are used while this runs (``model.hooks``), so other hooks attached with
``add_hook`` stay and change the run; a model with a final logit soft cap is refused (the logits are
not affine in the residual stream); the first ``exclude_positions`` positions carry no feature or error
nodes (circuit-tracer's default excludes position 0, the BOS sink): there the MLP output is a constant.
"""

from dataclasses import dataclass, replace
from typing import Optional

import torch
from torch import Tensor


def check_model(model, transcoders) -> None:
    cfg = model.cfg
    if getattr(cfg, "output_logits_soft_cap", None) is not None:
        raise ValueError(f"the model caps its logits (output_logits_soft_cap={cfg.output_logits_soft_cap}): the "
                         "logits are not affine in the residual stream, so no exact graph exists")
    if transcoders.n_layers != cfg.n_layers:
        raise ValueError(f"the transcoders cover {transcoders.n_layers} layers, the model has {cfg.n_layers}")
    if transcoders.d_model != cfg.d_model:
        raise ValueError(f"the transcoders have d_model {transcoders.d_model}, the model {cfg.d_model}")
    for l in range(cfg.n_layers):
        for name in (transcoders.feature_input_hook(l), transcoders.feature_output_hook(l)):
            if name not in model.hook_dict:
                raise ValueError(f"transcoder layer {l} uses hook {name!r}, which this model does not have")


@dataclass
class ReplacementRun:
    model: object
    transcoders: object
    tokens: Tensor  # [pos]
    inputs: Tensor  # [layer pos d_model], each transcoder's input
    mlp_out: Tensor  # [layer pos d_model]
    acts: Tensor  # [layer pos d_transcoder], clean activations (all positions)
    errors: Tensor  # [layer pos d_model], exact residuals (all positions)
    embed: Tensor  # [pos d_model], hook_embed
    frozen: dict  # hook name -> clean value (patterns, scales)
    logits: Tensor  # [pos d_vocab]
    exclude_positions: int

    @classmethod
    @torch.no_grad()
    def capture(cls, model, transcoders, tokens: Tensor, exclude_positions: int = 1) -> "ReplacementRun":
        check_model(model, transcoders)
        tokens = tokens.reshape(-1)
        L = model.cfg.n_layers
        store = {}

        def keep(value, hook):
            store[hook.name] = value.detach()

        names = [transcoders.feature_input_hook(l) for l in range(L)] + \
                [transcoders.feature_output_hook(l) for l in range(L)] + ["hook_embed"]
        frozen_names = frozen_hook_names(model)
        with model.hooks(fwd_hooks=[(n, keep) for n in names + frozen_names]):
            logits = model(tokens[None])
        inputs = torch.stack([store[transcoders.feature_input_hook(l)][0] for l in range(L)])
        mlp_out = torch.stack([store[transcoders.feature_output_hook(l)][0] for l in range(L)])
        acts = torch.stack([transcoders.encode(l, inputs[l]).detach() for l in range(L)])
        recon = decode(transcoders, acts, inputs)
        errors = mlp_out.to(recon.dtype) - recon
        return cls(model, transcoders, tokens, inputs, mlp_out, acts, errors, store["hook_embed"][0],
                   {n: store[n] for n in frozen_names}, logits[0], exclude_positions)

    def prefix(self, n_pos: int) -> "ReplacementRun":
        """This run cut to its first ``n_pos`` positions (module docstring); the frozen values are shared."""
        if isinstance(n_pos, bool) or not isinstance(n_pos, int) or not 1 <= n_pos <= self.tokens.shape[0]:
            raise ValueError(f"n_pos must be an int in [1, {self.tokens.shape[0]}], got {n_pos!r}")
        return replace(self, tokens=self.tokens[:n_pos], inputs=self.inputs[:, :n_pos], mlp_out=self.mlp_out[:, :n_pos],
                       acts=self.acts[:, :n_pos], errors=self.errors[:, :n_pos], embed=self.embed[:n_pos],
                       logits=self.logits[:n_pos])

    def frozen_forward(self, embed: Optional[Tensor] = None, acts: Optional[Tensor] = None,
                       errors: Optional[Tensor] = None, *, live: bool = False, recompute: bool = False,
                       overrides: Optional[dict] = None, leaves: Optional[list] = None,
                       stop_at_layer: Optional[int] = None) -> dict:
        """Run the replacement with the given embeddings [batch pos d_model], activations [batch layer pos
        d_transcoder] and errors [batch layer pos d_model] (each defaults to the clean values). Returns
        {"inputs": [batch layer pos d_model], "final": [batch pos d_model] (the unembedding's input),
        "logits": [batch pos d_vocab], "acts": [batch layer pos d_transcoder] (those used)}.
        ``overrides`` {(layer, pos, feature): value} fixes features after any recomputation. ``leaves`` (a
        list, for the attribution's backward passes): each layer's output is built as a leaf tensor
        holding everything but the skip term (appended to the list) plus the skip term, so that the
        gradient at that leaf is the gradient at the layer's output; "seen" then holds the live inputs.
        ``stop_at_layer``: run only the first that many blocks (the model's ``stop_at_layer``); "inputs" and
        "acts" then hold those layers, and there are no "final" and no "logits" (None)."""
        model, ts = self.model, self.transcoders
        batch = max([t.shape[0] for t in (embed, acts, errors) if t is not None] + [1])
        embed = self.embed.expand(batch, -1, -1) if embed is None else embed
        acts = self.acts.expand(batch, -1, -1, -1) if acts is None else acts
        errors = self.errors.expand(batch, -1, -1, -1) if errors is None else errors
        L = model.cfg.n_layers
        seen, used, out = [None] * L, [None] * L, {}

        def embed_hook(value, hook):
            return embed.to(value.dtype)

        def freeze(value, hook):
            clean = self.frozen[hook.name]
            if clean.shape[1:] != value.shape[1:]:  # a prefix's run: the clean value's leading entries
                clean = clean[tuple(slice(0, n) for n in value.shape)]
            return clean.expand(value.shape)

        def read_input(value, hook, layer):
            seen[layer] = value

        def write_output(value, hook, layer):
            x = seen[layer].to(acts.dtype)
            a = acts[:, layer]
            if recompute:
                a = ts.encode(layer, x)
            if overrides:
                a = a.clone()
                for (l, p, f), v in overrides.items():
                    if l == layer:
                        a[:, p, f] = v
            used[layer] = a
            total = errors[:, layer] + ts.b_dec(layer).detach()
            for s in range(layer + 1):
                if ts.cross_layer or s == layer:
                    src = a if s == layer else used[s]
                    total = total + src @ ts.decoder_weights(s).detach()[:, layer - s if ts.cross_layer else 0]
            if leaves is not None:
                total = total.detach().requires_grad_(True)
                leaves.append(total)
            skip = ts.W_skip(layer)
            if skip is not None:
                total = total + x @ skip.detach().T
            return total.to(value.dtype)

        def final_hook(value, hook):
            out["final"] = value

        hooks = [("hook_embed", embed_hook), ("unembed.hook_in", final_hook)]
        if not live:
            hooks += [(n, freeze) for n in self.frozen]
        for l in range(L):
            hooks.append((ts.feature_input_hook(l), _bind(read_input, l)))
            hooks.append((ts.feature_output_hook(l), _bind(write_output, l)))
        ran = L if stop_at_layer is None else model.check_stop(stop_at_layer, 0)
        if ran == 0:
            raise ValueError(f"stop_at_layer={stop_at_layer!r} runs no block; the replacement needs at least one")
        with model.hooks(fwd_hooks=hooks):
            logits = model(self.tokens[None].expand(batch, -1), stop_at_layer=stop_at_layer)
        if stop_at_layer is not None:
            logits = None
        out.update(inputs=torch.stack(seen[:ran], 1), logits=logits, acts=torch.stack(used[:ran], 1), seen=seen)
        return out


def _bind(fn, layer):
    def hook(value, hook):
        return fn(value, hook, layer)
    return hook


def frozen_hook_names(model) -> list:
    """Every attention pattern and norm scale of the model: the values the replacement freezes."""
    return [n for n in model.hook_dict if n.endswith("attn.hook_pattern") or n.endswith("hook_scale")]


def decode(transcoders, acts: Tensor, inputs: Tensor) -> Tensor:
    """Each layer's reconstruction + skip term from activations [layer pos d_transcoder] and inputs [layer pos d_model]."""
    L = transcoders.n_layers
    out = transcoders.decode({l: acts[l] for l in range(L)}, {l: inputs[l] for l in range(L)})
    return torch.stack([out[l].detach() for l in range(L)])
