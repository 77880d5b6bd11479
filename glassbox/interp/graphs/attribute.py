"""``attribute``: the attribution graph of one prompt, every edge exact, by batched backward passes.

Each target injects its direction as the gradient at its read point (a feature: its encoder column at its
input hook and position; a logit: its demeaned unembedding column at the unembedding's input, last
position), and one backward pass per batch of at most ``batch_size`` targets through the frozen
replacement (``replacement.py``), whose token embeddings and layer outputs are leaves, gives the gradient
at every leaf; contracting it with each source's vector (activation x decoder row; error; embedding) gives
the row of direct effects. The model is linear in these sources under the freezes, so the rows are exact,
not estimates.

Cost: the logit targets share one forward over the whole prompt; the features are batched per layer in
(position, feature) order, and each batch runs its own forward over only the first positions up to its
last target's and the blocks up to its layer (the model is causal: nothing after a target reaches it), so
a backward pass costs about batch x (last position + 1) x (layer + 1) blocks' value path and norms, not
batch x n_pos x n_layers. The forwards run at batch 1 and the backward is vmapped over the batch
(``is_grads_batched``); ``expand=True`` instead runs each forward at ``batch_size`` (one batch element per
target, padded with zero gradients): the same graph to rounding, slower on CPU, for an op without a vmap rule.

Memory (``estimate_bytes``): the dense adjacency, n_nodes^2 x 4 bytes (float32; 8 for a float64 model), on
the CPU; per batch, the gradients of every layer output, batch_size x n_pos x d_model x (n_layers + 1) x
itemsize x 2 (at most: a batch over a prefix needs less); the padded decoder rows of the active features,
n_positions x max features per position x d_model x itemsize for each (source, target) layer pair. A graph
over ``max_bytes`` (default 4 GiB) is refused before any work, saying how large it would be; a smaller
batch_size bounds the per-batch part.

The model's parameters have requires_grad switched off during the call and restored after it, also
when it raises.
"""

from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from .graph import AttributionGraph
from .replacement import ReplacementRun

DEFAULT_MAX_BYTES = 4 * 2 ** 30


def select_logits(logits: Tensor, max_n_logits: int, desired_logit_prob: float) -> tuple:
    """circuit-tracer's rule: the top tokens by probability, up to the first whose cumulative probability
    reaches ``desired_logit_prob``, at most ``max_n_logits``. Returns (token ids, probabilities)."""
    probs = torch.softmax(logits.double(), -1)
    top_p, top_i = probs.topk(min(max_n_logits, probs.shape[-1]))
    cutoff = int(torch.searchsorted(top_p.cumsum(0), torch.tensor(desired_logit_prob, dtype=top_p.dtype))) + 1
    return top_i[:cutoff], top_p[:cutoff].to(logits.dtype)


def _as_tokens(model, prompt) -> Tensor:
    if isinstance(prompt, str):
        return model.to_tokens(prompt)[0]
    tokens = torch.as_tensor(prompt)
    if tokens.ndim == 2 and tokens.shape[0] == 1:
        tokens = tokens[0]
    if tokens.ndim != 1 or tokens.dtype not in (torch.int64, torch.int32) or tokens.numel() == 0:
        raise ValueError(f"prompt must be a string or one sequence of token ids [pos], got shape "
                         f"{tuple(tokens.shape)} dtype {tokens.dtype}")
    return tokens.to(device=model.embed.W_E.device, dtype=torch.long)


def pad_batch(g: Tensor, B: int) -> Tensor:
    return g if g.shape[0] == B else torch.cat([g, g.new_zeros(B - g.shape[0], *g.shape[1:])])


def estimate_bytes(n_nodes: int, n_pos: int, d_model: int, n_layers: int, batch_size: int, itemsize: int,
                   decoder_rows: int) -> dict:
    adjacency = n_nodes * n_nodes * max(4, itemsize)
    per_batch = 2 * batch_size * n_pos * d_model * (n_layers + 1) * itemsize
    decoders = decoder_rows * d_model * itemsize
    return {"adjacency": adjacency, "per_batch": per_batch, "decoders": decoders,
            "total": adjacency + per_batch + decoders}


def attribute(model, transcoders, prompt: Union[str, Tensor, Sequence[int]], *, max_n_logits: int = 10,
              desired_logit_prob: float = 0.95, logit_tokens: Optional[Sequence[int]] = None,
              batch_size: int = 64, exclude_positions: int = 1,
              max_bytes: int = DEFAULT_MAX_BYTES, expand: bool = False) -> AttributionGraph:
    """The attribution graph of ``prompt`` (a string, tokenized by the model, or token ids [pos]).

    Args:
        logit_tokens: the logit nodes' tokens, instead of ``select_logits``'s choice.
        exclude_positions: the first positions without feature or error nodes (circuit-tracer: 1).
        batch_size: targets per backward pass. max_bytes: refuse a graph needing more (``estimate_bytes``).
        expand: each forward at batch_size instead of batch 1 with the backward vmapped (module docstring).
    """
    for name, v in (("batch_size", batch_size), ("max_n_logits", max_n_logits)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if not 0 < desired_logit_prob <= 1:
        raise ValueError(f"desired_logit_prob must be in (0, 1], got {desired_logit_prob!r}")
    tokens = _as_tokens(model, prompt)
    if isinstance(exclude_positions, bool) or not isinstance(exclude_positions, int) \
            or not 0 <= exclude_positions < tokens.shape[0]:
        raise ValueError(f"exclude_positions must be an int in [0, {tokens.shape[0]}) for this "
                         f"{tokens.shape[0]}-token prompt, got {exclude_positions!r}")
    run = ReplacementRun.capture(model, transcoders, tokens, exclude_positions)
    ts, L, P, d = transcoders, model.cfg.n_layers, tokens.shape[0], model.cfg.d_model
    dtype = run.acts.dtype
    mask = run.acts != 0
    mask[:, :exclude_positions] = False
    feats = mask.nonzero()  # [n 3], sorted layer, pos, feature
    act_vals = run.acts[mask]
    if logit_tokens is None:
        logit_ids, logit_p = select_logits(run.logits[-1], max_n_logits, desired_logit_prob)
    else:
        logit_ids = torch.as_tensor(list(logit_tokens), dtype=torch.long, device=run.logits.device)
        if logit_ids.ndim != 1 or len(logit_ids) == 0 or not ((0 <= logit_ids) & (logit_ids < run.logits.shape[-1])).all():
            raise ValueError(f"logit_tokens must be token ids in [0, {run.logits.shape[-1]}), got {logit_tokens!r}")
        logit_p = torch.softmax(run.logits[-1].double(), -1)[logit_ids].to(run.logits.dtype)
    n_f, K = feats.shape[0], len(logit_ids)
    n_src = n_f + (L + 1) * P
    N = n_src + K

    layer_of = feats[:, 0]
    starts = torch.searchsorted(layer_of, torch.arange(L + 1, device=layer_of.device)).tolist()
    counts = [torch.bincount(feats[starts[s]:starts[s + 1], 1], minlength=P) for s in range(L)]
    kmax = [int(c.max()) if len(c) else 0 for c in counts]
    pairs = [(s, t) for s in range(L) for t in range(s, L) if ts.cross_layer or s == t]
    decoder_rows = sum(P * kmax[s] for s, t in pairs)
    itemsize = torch.empty((), dtype=dtype).element_size()
    need = estimate_bytes(N, P, d, L, batch_size, itemsize, decoder_rows)
    if need["total"] > max_bytes:
        raise MemoryError(f"this graph needs about {need['total'] / 2 ** 30:.2f} GiB ({n_f} active features, {N} "
                          f"nodes: adjacency {need['adjacency'] / 2 ** 30:.2f} GiB, per batch "
                          f"{need['per_batch'] / 2 ** 30:.2f} GiB, decoder rows {need['decoders'] / 2 ** 30:.2f} GiB), "
                          f"over max_bytes={max_bytes}; lower batch_size or raise max_bytes")

    # padded decoder rows: V[(s, t)] [pos kmax_s d_model] = activation x decoder row to layer t
    slots = []
    for s in range(L):
        f = feats[starts[s]:starts[s + 1]]
        first = torch.searchsorted(f[:, 1], f[:, 1], right=False) if len(f) else f[:, 1]
        slots.append(torch.arange(len(f), device=f.device) - first)
    V = {}
    for s, t in pairs:
        f = feats[starts[s]:starts[s + 1]]
        rows = act_vals[starts[s]:starts[s + 1], None] * \
            ts.decoder_weights(s).detach()[f[:, 2], t - s if ts.cross_layer else 0]
        pad = torch.zeros(P, kmax[s], d, dtype=dtype, device=rows.device)
        pad[f[:, 1], slots[s]] = rows
        V[s, t] = pad
    errors = run.errors.clone()
    errors[:, :exclude_positions] = 0

    W_U = model.unembed.W_U.detach()
    logit_vecs = (W_U[:, logit_ids] - W_U.mean(1, keepdim=True)).T.to(dtype)  # [K d_model]
    enc = [(ts.W_enc(l).detach(), ts.b_enc(l).detach()) for l in range(L)]
    pre_vals = torch.stack([run.inputs[l, p].to(dtype) @ enc[l][0][:, f] + enc[l][1][f] for l, p, f in feats.tolist()]) \
        if n_f else torch.zeros(0, dtype=dtype)
    logit_vals = run.logits[-1, logit_ids] - run.logits[-1].mean()
    store = torch.float64 if dtype == torch.float64 else torch.float32  # float32 unless computed in float64
    values = torch.zeros(N, dtype=store)
    values[:n_f] = pre_vals.to(store).cpu()
    values[n_src:] = logit_vals.to(store).cpu()
    adjacency = torch.zeros(N, N, dtype=store)

    params = [p for p in model.parameters() if p.requires_grad]
    B = batch_size if expand else 1
    try:
        for p in params:
            p.requires_grad_(False)
        with torch.enable_grad():
            def forward(n_pos: int, stop: Optional[int]) -> tuple:
                """The frozen replacement over the first n_pos positions and blocks[:stop], its leaves built."""
                sub = run if n_pos == P else run.prefix(n_pos)
                embed = sub.embed[None].repeat(B, 1, 1).requires_grad_(True)
                leaves = []
                out = sub.frozen_forward(embed=embed, leaves=leaves, stop_at_layer=stop)
                return out, leaves + [embed]

            def backward(targets_at: dict, n: int, inputs_all: list, n_pos: int) -> Tensor:
                """targets_at: {tensor in the graph: [n 1 n_pos d_model] gradient}; returns [n n_src] rows."""
                if expand:  # one batch element per target, padded with zero gradients to the forward's batch
                    grads = torch.autograd.grad(list(targets_at), inputs_all,
                                                [pad_batch(g[:, 0], B) for g in targets_at.values()],
                                                retain_graph=True, allow_unused=True)
                    grads = [g[:n] if g is not None else None for g in grads]
                else:
                    grads = torch.autograd.grad(list(targets_at), inputs_all, list(targets_at.values()),
                                                retain_graph=True, is_grads_batched=True, allow_unused=True)
                    grads = [g[:, 0] if g is not None else None for g in grads]  # [n n_pos d_model]
                G = grads[:-1] + [None] * (L + 1 - len(grads)) + grads[-1:]  # layers the forward ran, then embed
                rows = torch.zeros(n, n_src, dtype=dtype, device=run.embed.device)
                for s, t in pairs:
                    if G[t] is None or kmax[s] == 0:
                        continue
                    f = feats[starts[s]:starts[s + 1]]
                    m = int(torch.searchsorted(f[:, 1], torch.tensor(n_pos, device=f.device)))  # those before n_pos
                    if m == 0:
                        continue
                    prod = torch.bmm(G[t].to(dtype).transpose(0, 1), V[s, t][:n_pos].transpose(1, 2))  # [pos n kmax]
                    rows[:, starts[s]:starts[s] + m] += prod[f[:m, 1], :, slots[s][:m]].T
                for l in range(L):
                    if G[l] is not None:
                        rows[:, n_f + l * P:n_f + l * P + n_pos] = torch.einsum("bpd,pd->bp", G[l].to(dtype),
                                                                                 errors[l, :n_pos])
                if G[L] is not None:
                    rows[:, n_f + L * P:n_f + L * P + n_pos] = torch.einsum("bpd,pd->bp", G[L].to(dtype),
                                                                             run.embed[:n_pos].to(dtype))
                return rows

            out, inputs_all = forward(P, None)  # the logit targets read the last position after every block
            final = out["final"]
            for i in range(0, K, batch_size):
                vec = logit_vecs[i:i + batch_size]
                g = torch.zeros(len(vec), 1, *final.shape[1:], dtype=final.dtype, device=final.device)
                g[:, 0, -1] = vec.to(final.dtype)
                adjacency[n_src + i:n_src + i + len(vec), :n_src] = backward({final: g}, len(vec), inputs_all,
                                                                             P).to(store).cpu()
            del out, inputs_all, final
            # per layer, batches of features in (pos, feature) order: each needs the replacement only up to
            # its last target's position (the model is causal) and its layer's block
            for layer in range(L):
                for i in range(starts[layer], starts[layer + 1], batch_size):
                    batch = feats[i:min(i + batch_size, starts[layer + 1])]
                    n_pos = int(batch[:, 1].max()) + 1
                    out, inputs_all = forward(n_pos, layer + 1)
                    seen = out["seen"][layer]
                    g = torch.zeros(len(batch), 1, *seen.shape[1:], dtype=seen.dtype, device=seen.device)
                    g[torch.arange(len(batch)), 0, batch[:, 1]] = enc[layer][0][:, batch[:, 2]].T.to(g.dtype)
                    adjacency[i:i + len(batch), :n_src] = backward({seen: g}, len(batch), inputs_all,
                                                                   n_pos).to(store).cpu()
                    del out, inputs_all, seen
    finally:
        for p in params:
            p.requires_grad_(True)
    return AttributionGraph(tokens=tokens.cpu(), active_features=feats.cpu(), activation_values=act_vals.to(store).cpu(),
                            logit_tokens=logit_ids.cpu(), logit_probabilities=logit_p.to(store).cpu(),
                            adjacency=adjacency, values=values, n_layers=L, exclude_positions=exclude_positions,
                            meta={"bytes": need})
