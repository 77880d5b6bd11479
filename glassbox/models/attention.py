"""Causal multi-head self-attention with TransformerLens's weights and hook points.

Weights right-multiply: W_Q/W_K/W_V [head d_model d_head], W_O [head d_head d_model]. W_Q, W_K and
W_V are stored with [d_model head d_head] memory, so ``W_Q`` is the per-head view a notebook expects
while the forward pass reads the same memory as one [d_model, head*d_head] matrix: no copy, no
re-layout, on any forward.

Per-head inputs: ``x`` may be [batch pos head d_model] (one input per head, as the block passes under
the hook flags ``use_attn_in`` and ``use_split_qkv_input``; ``k_input``/``v_input`` then give the keys'
and values' own inputs). Each head's q, k and v are then computed from its own input, one batched
product per head; with equal inputs they agree with the fused projection to float rounding.
``k_input``/``v_input`` may also be shared [batch pos d_model] inputs of their own (TransformerLens's
standalone attention takes query, key and value inputs).

With the flag ``use_attn_result``, ``hook_result`` [batch pos head d_model] holds each head's
z[h] @ W_O[h], and the output is their sum over heads plus b_O (again equal to the fused W_O product
to float rounding); without it no per-head tensor is made.

When nothing is attached to ``hook_attn_scores`` or ``hook_pattern``, and there is no score soft cap
and no float32 upcast of a half-precision model, the pattern is never materialised and the fused
``scaled_dot_product_attention`` kernel runs instead; its numbers agree
with the explicit path to float rounding, not bit for bit (max |delta logits| 3.4e-5 on the shipped
model: ``benchmarks/kernel_paths.py``, ``tests/test_kernel_path_bounds.py``).

``attn_mask`` is None for plain causal attention over a fresh sequence, else a bool tensor
broadcastable to [batch head query_pos key_pos], True where a query may attend. A local
(sliding-window) layer gets the model's windowed mask; the attention itself never builds one.

Grouped-query attention (``cfg.n_key_value_heads`` < n_heads): W_K, W_V [kv_head d_model d_head] and
b_K, b_V [kv_head d_head]; ``hook_k``/``hook_v`` (and ``hook_rot_k``) are [batch pos kv_head d_head],
and the key-value cache keeps the grouped keys. Query head h reads kv head h // n_kv_groups (the
order of ``repeat_interleave``, as in transformers). With ``cfg.ungroup_grouped_query_attention``
keys and values are repeated to [batch pos head d_head] before their hooks. The per-head key and value
inputs (``k_input``/``v_input``) are then one per kv head.

Also chosen at construction: the score scale (``cfg.layer_attn_scale``), the soft cap
cap * tanh(scores / cap) applied before the mask (``hook_attn_scores`` holds the capped, masked
scores), float32 scores and softmax for half-precision models (``cfg.upcast_attn``), and the q/k
norms (``q_norm``/``k_norm``, RMSNorm modules with their own hook points, applied to the projections
after ``hook_q``/``hook_k`` and before the rotation).
"""

from typing import Optional, Union

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from ..hooks import HookPoint
from .config import Config
from .hook_flags import HookFlags
from .kv_cache import LayerKV
from .ops import linear, per_head_linear


def per_head_weight(cfg: Config, heads: Optional[int] = None) -> nn.Parameter:
    """An empty [head d_model d_head] parameter laid out in memory as [d_model head d_head]."""
    heads = cfg.n_heads if heads is None else heads
    return nn.Parameter(torch.empty(cfg.d_model, heads, cfg.d_head).permute(1, 0, 2))


class Attention(nn.Module):
    def __init__(self, cfg: Config, flags: Optional[HookFlags] = None, layer: int = 0):
        super().__init__()
        self.cfg = cfg
        self.flags = flags if flags is not None else HookFlags()
        kv_heads = cfg.n_key_value_heads
        self.W_Q = per_head_weight(cfg)
        self.W_K, self.W_V = per_head_weight(cfg, kv_heads), per_head_weight(cfg, kv_heads)
        self.W_O = nn.Parameter(torch.empty(cfg.n_heads, cfg.d_head, cfg.d_model))
        if cfg.qkv_bias:
            self.b_Q = nn.Parameter(torch.zeros(cfg.n_heads, cfg.d_head))
            self.b_K = nn.Parameter(torch.zeros(kv_heads, cfg.d_head))
            self.b_V = nn.Parameter(torch.zeros(kv_heads, cfg.d_head))
        else:
            self.b_Q = self.b_K = self.b_V = None
        self.b_O = nn.Parameter(torch.zeros(cfg.d_model)) if cfg.attn_out_bias else None
        self.scale = cfg.layer_attn_scale(layer)
        self.attn_type = cfg.attn_types[layer] if cfg.attn_types is not None else "global"  # TransformerLens's name
        self._mask: Optional[Tensor] = None
        self.groups = cfg.n_kv_groups
        self.soft_cap = cfg.attn_scores_soft_cap
        if cfg.qk_norm is not None:
            from .rms_norm import RMSNorm  # the q/k norms: RMSNorm over d_head, or over all heads ("full")

            self.q_norm = RMSNorm(cfg, cfg.d_head if cfg.qk_norm == "head" else cfg.n_heads * cfg.d_head)
            self.k_norm = RMSNorm(cfg, cfg.d_head if cfg.qk_norm == "head" else kv_heads * cfg.d_head)
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_attn_scores = HookPoint()  # scaled and causally masked with -inf, before softmax
        self.hook_pattern = HookPoint()  # after softmax
        self.hook_z = HookPoint()  # pattern-weighted values, before W_O
        self.hook_result = HookPoint()  # each head's z @ W_O[h]; fires only with flags.use_attn_result

    @property
    def mask(self) -> Tensor:
        """TransformerLens 3.9's ``mask`` buffer: an empty [0 0] bool placeholder (both build the causal
        mask a forward needs at forward time). The forward never reads it: assigning a bool tensor (as
        code that shares TransformerLens 3.2's [n_ctx n_ctx] buffers between layers does) changes what
        reading gives, nothing else."""
        if self._mask is None:  # made on each read, so it follows the weights' device
            return torch.empty(0, 0, dtype=torch.bool, device=self.W_Q.device)
        return self._mask

    @mask.setter
    def mask(self, value: Tensor) -> None:
        if not isinstance(value, Tensor) or value.dtype != torch.bool or value.ndim != 2:
            raise ValueError("attn.mask must be a 2-D bool tensor (TransformerLens's mask buffer), got "
                             + (f"{tuple(value.shape)} {value.dtype}" if isinstance(value, Tensor) else type(value).__name__))
        self._mask = value

    def project(self, x: Tensor, W: Tensor, b: Optional[Tensor]) -> Tensor:
        """x [batch pos d_model] (or one input per head, [batch pos head d_model]) through one per-head
        weight -> [batch pos head d_head]."""
        if x.ndim == 4:
            return per_head_linear(x, W, b)
        flat_W = W.permute(1, 0, 2).reshape(self.cfg.d_model, -1)  # a view for our stored layout
        flat_b = b.reshape(-1) if b is not None else None
        return linear(x, flat_W, flat_b).view(*x.shape[:-1], W.shape[0], self.cfg.d_head)

    def ungroup(self, x: Tensor) -> Tensor:
        """[batch pos kv_head d_head] -> [batch pos head d_head], each kv head repeated for its query heads."""
        return x.repeat_interleave(self.groups, dim=2) if self.groups > 1 else x

    def normalize_qk(self, q: Tensor, k: Tensor) -> tuple:
        """q and k through q_norm and k_norm (over d_head, or over all heads for "full"); none without."""
        if self.cfg.qk_norm is None:
            return q, k
        if self.cfg.qk_norm == "head":
            return self.q_norm(q), self.k_norm(k)
        return self.q_norm(q.flatten(-2)).view(q.shape), self.k_norm(k.flatten(-2)).view(k.shape)

    def forward(
        self,
        x: Union[Float[Tensor, "batch pos d_model"], Float[Tensor, "batch pos head d_model"]],
        positions: Optional[Int[Tensor, "batch pos"]] = None,
        attn_mask: Optional[Tensor] = None,
        kv: Optional[LayerKV] = None,
        k_input: Optional[Union[Float[Tensor, "batch pos d_model"], Float[Tensor, "batch pos kv_head d_model"]]] = None,
        v_input: Optional[Union[Float[Tensor, "batch pos d_model"], Float[Tensor, "batch pos kv_head d_model"]]] = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        q = self.hook_q(self.project(x, self.W_Q, self.b_Q))
        W_K, b_K, W_V, b_V = self.kv_weights()
        k = self.project_kv(x if k_input is None else k_input, W_K, b_K)
        v = self.project_kv(x if v_input is None else v_input, W_V, b_V)
        if self.cfg.ungroup_grouped_query_attention and k.shape[2] != self.cfg.n_heads:
            k, v = self.ungroup(k), self.ungroup(v)
        k, v = self.hook_k(k), self.hook_v(v)
        q, k = self.normalize_qk(q, k)
        q, k = self.rotate(q, k, positions, kv.length if kv is not None else 0)
        if kv is not None:
            k, v = kv.append(k, v)
        z = self.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask)
        z = self.hook_z(z.transpose(1, 2))  # [batch pos head d_head]
        if self.flags.use_attn_result:
            return self.per_head_output(z)
        flat_W_O = self.W_O.reshape(-1, self.cfg.d_model)
        return linear(z.reshape(*z.shape[:2], -1), flat_W_O, self.b_O)

    def kv_weights(self) -> tuple:
        """W_K, b_K, W_V, b_V as stored: [kv_head d_model d_head] and [kv_head d_head] (a subclass that
        names them otherwise, as TransformerLens's grouped attention does, says where they are)."""
        return self.W_K, self.b_K, self.W_V, self.b_V

    def project_kv(self, x: Tensor, W: Tensor, b: Optional[Tensor]) -> Tensor:
        """Keys or values from the shared input, one input per kv head, or (ungrouped, with
        ``ungroup_grouped_query_attention``) one per query head, each through its kv head's weight."""
        if x.ndim == 4 and x.shape[2] != W.shape[0]:
            if x.shape[2] != self.cfg.n_heads:
                raise ValueError(f"a per-head key/value input has {x.shape[2]} heads; this attention has "
                                 f"{W.shape[0]} key/value heads and {self.cfg.n_heads} query heads")
            W = W.repeat_interleave(self.groups, dim=0)
            b = b.repeat_interleave(self.groups, dim=0) if b is not None else None
        return self.project(x, W, b)

    def per_head_output(self, z: Float[Tensor, "batch pos head d_head"]) -> Float[Tensor, "batch pos d_model"]:
        """Each head's write into the residual stream through ``hook_result``; their sum plus b_O."""
        result = self.hook_result(torch.einsum("bphe,hed->bphd", z, self.W_O))
        out = result.sum(-2)
        return out + self.b_O if self.b_O is not None else out

    def rotate(self, q: Tensor, k: Tensor, positions: Optional[Tensor], past: int = 0) -> tuple:
        """Position-dependent rotation of q and k; none for absolute positional embeddings."""
        return q, k

    def attend(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor]) -> Tensor:
        """q [batch head query_pos d_head], k and v [batch head|kv_head key_pos d_head] -> z, laid out as q."""
        fresh_causal = attn_mask is None and q.shape[-2] == k.shape[-2]
        grouped = k.shape[1] != q.shape[1]
        fused = self.soft_cap is None and not (self.cfg.upcast_attn and q.dtype in HALF_DTYPES)
        if fused and not (self.hook_attn_scores.has_hooks or self.hook_pattern.has_hooks):
            if attn_mask is None and not fresh_causal:
                attn_mask = causal_mask(q.shape[-2], k.shape[-2], q.device)
            if not grouped:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=fresh_causal,
                                                      scale=self.scale)
            if not SDPA_GROUPS:  # torch < 2.5: the kernel takes one key/value head per query head
                k, v = k.repeat_interleave(self.groups, dim=1), v.repeat_interleave(self.groups, dim=1)
                return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=fresh_causal,
                                                      scale=self.scale)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=fresh_causal,
                                                  scale=self.scale, enable_gqa=True)
        if attn_mask is None:
            attn_mask = causal_mask(q.shape[-2], k.shape[-2], q.device)
        if grouped:  # [batch kv_head group query_pos d_head] against each kv head's keys: no copies of k, v
            b, h, n, d = q.shape
            q = q.view(b, k.shape[1], self.groups, n, d)
            k, v = k[:, :, None], v[:, :, None]
        out_dtype = q.dtype
        if self.cfg.upcast_attn and q.dtype in HALF_DTYPES:
            q, k = q.float(), k.float()
        # Scaling q ([.. d_head]) rather than the scores ([.. key_pos]) and masking the fresh scores in
        # place saves two passes and two allocations over [batch head query_pos key_pos], the largest
        # tensors of a cached run (equal bits when d_head is a power of 4, else within rounding).
        if fresh_causal and self.soft_cap is None and q.shape[-2] >= 2 * CAUSAL_BLOCK \
                and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)):
            scores = causal_scores(q * self.scale, k, attn_mask)
            if grouped:
                scores = scores.view(b, h, n, -1)
        else:
            scores = (q * self.scale) @ k.transpose(-1, -2)
            if grouped:  # before the mask, which may be [batch 1|head query_pos key_pos]
                scores = scores.view(b, h, n, -1)
            if self.soft_cap is not None:
                scores = torch.tanh(scores / self.soft_cap) * self.soft_cap
            scores = scores.masked_fill_(~attn_mask, float("-inf"))
        scores = self.hook_attn_scores(scores)
        pattern = self.hook_pattern(scores.softmax(dim=-1).to(out_dtype))
        if grouped:
            return (pattern.view(b, k.shape[1], self.groups, n, -1) @ v).view(b, h, n, -1)
        return pattern @ v


HALF_DTYPES = (torch.float16, torch.bfloat16)
# scaled_dot_product_attention reads grouped keys and values itself (enable_gqa) from torch 2.5 on
SDPA_GROUPS = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


# Query rows per block of causal_scores: the products above the diagonal blocks are never computed.
CAUSAL_BLOCK = 128


def causal_scores(q: Tensor, k: Tensor, mask: Tensor) -> Tensor:
    """The causally masked scores q @ k^T of a fresh sequence (q, k [.. pos d_head], mask [pos pos]),
    computed block of query rows by block: each block multiplies only the keys up to its last row and
    the rest of its rows is filled with -inf, so the products above the diagonal blocks (most of the
    masked half) are skipped. Each score is the same d_head-long dot product as in the one full
    product: equal bits for GPT-2's d_head 64 on the CPU here, within float rounding otherwise (a
    GEMM's tail kernels may sum in another order; tested), and the masked entries are -inf as there.
    Writes through ``out=``, so it is for tensors outside autograd only."""
    n = q.shape[-2]
    scores = torch.empty(*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), n, n, dtype=q.dtype, device=q.device)
    k_t = k.transpose(-1, -2)
    for start in range(0, n, CAUSAL_BLOCK):
        stop = min(n, start + CAUSAL_BLOCK)
        torch.matmul(q[..., start:stop, :], k_t[..., :stop], out=scores[..., start:stop, :stop])
        scores[..., start:stop, stop:] = float("-inf")
        scores[..., start:stop, start:stop].masked_fill_(~mask[start:stop, start:stop], float("-inf"))
    return scores


def causal_mask(query_len: int, key_len: int, device) -> Tensor:
    """[query_pos key_pos] bool: the last query_len of key_len positions attend to themselves and before."""
    return torch.ones(query_len, key_len, dtype=torch.bool, device=device).tril(key_len - query_len)
