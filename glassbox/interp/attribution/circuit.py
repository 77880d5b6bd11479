"""Exact circuit evaluation: run the clean input with every edge outside a circuit carrying its
sender's corrupted output, for many circuits side by side.

``evaluate_circuit(model, clean, corrupted, metric, masks)`` takes bool edge masks [n_senders,
n_receivers] (or a stack [mask n_senders n_receivers]) over the senders and receivers of
``edges.py`` (True: the edge is IN the circuit) and returns the metric of every circuit, mean over
prompts. The semantics are Hanna et al. (2024)'s and MIB's: the clean input runs, and each receiver
(each head's query/key/value input, each MLP input, the final residual stream) reads

    input_r = current input_r - sum over senders s with (s, r) outside the circuit of
              (a_s^current - a_s^corrupted)

where ``a_s^current`` is sender s's output in this (patched) run and ``a_s^corrupted`` its output
on the corrupted input. This rests on the residual identity of sequential pre-norm blocks:
resid_pre(L) = input + the heads' results + the b_O's + the MLP outputs of the layers before L, the
biases being the same on both inputs; so each receiver gets exactly its in-circuit senders' current
outputs plus its out-of-circuit senders' corrupted ones. Post-norm, sandwich and output-norm blocks
and parallel attention/MLP blocks break that identity and are refused (naming the Config field).

Consequences (the tests check them): the full mask gives the clean run's metric, the empty mask the
corrupted run's (to float rounding); an entry of a mask where no edge exists is ignored. Circuits
are independent of one another: stacking them changes nothing.

How it runs: one corrupted forward keeps every sender's output [sender prompt pos d_model]; then
passes over the clean input with ``V`` circuits stacked along the batch axis (row ``v * n_prompts +
b`` is prompt b in circuit v, ``V`` sized by ``memory_budget``), in which each sender's hook stores
its difference from the corrupted output and each receiver's hook subtracts the out-of-circuit
differences (one batched matmul per hook point). The differences are kept in float32 (float64 for a float64
model), so a half-precision model's corrections are not rounded twice.

Hooks and flags: the per-head input hooks need ``use_split_qkv_input``, ``use_hook_mlp_in`` and
``use_attn_result``; they are turned on for the call and restored, and every hook is removed, also
when something raises. A model with hooks or splices already attached is refused: they could break
the residual identity the evaluation relies on. A metric value that is NaN or inf on any circuit, or
not a floating-point tensor, is refused naming the metric (``metric_checks``), never averaged in.
"""

from typing import Callable, Optional, Union

import torch
from torch import Tensor

from ...models import devices
from ..patching.metrics import PositionMetric, VariantMetric
from . import edges
from .graph import Graph
from .metric_checks import check_values, metric_name

DEFAULT_MEMORY_BUDGET = 2**30
FLAGS = ("use_attn_result", "use_split_qkv_input", "use_hook_mlp_in")
Tokens = Union[Tensor, str, list]  # token ids [prompt pos] or text; shapes are checked by hand, with a message


def evaluate_circuit(model, clean_tokens: Tokens, corrupted_tokens: Tokens, metric: Callable, edge_masks,
                     *, attention_mask: Optional[Tensor] = None, reduce: Optional[str] = "mean",
                     memory_budget: int = DEFAULT_MEMORY_BUDGET, progress: bool = False) -> Tensor:
    """The metric of the clean run with every edge outside each circuit corrupted.

    Args:
        clean_tokens, corrupted_tokens: token ids [prompt pos] of the same shape (or text); one
            ``attention_mask`` serves both.
        metric: ``fn(logits [batch pos d_vocab]) -> [batch]`` (row r is prompt r % n_prompts), e.g. a
            ``LogitDiff``; a ``PositionMetric`` is given only its read position's logits. A
            ``VariantMetric`` gives one value per circuit (then reduce must be "mean").
        edge_masks: bool [n_senders, n_receivers] or [mask n_senders n_receivers], True for edges in
            the circuit, over ``edges.senders(model.cfg)`` x ``edges.receivers(model.cfg)``; or a
            ``Graph`` (its ``in_circuit``) or a list of Graphs.
        reduce: "mean" over prompts, or None for a trailing prompt axis.
        memory_budget: bytes one pass may use (estimated); fixes how many circuits share a pass.
        progress: a tqdm bar over circuits.

    Returns:
        [mask] (or [mask prompt]) on the model's device; a single 2-d mask gives a 0-d tensor (or
        [prompt]).
    """
    if reduce not in ("mean", None):
        raise ValueError(f"reduce must be 'mean' or None, got {reduce!r}")
    if isinstance(metric, VariantMetric) and reduce is None:
        raise ValueError("a VariantMetric gives one value per circuit; leave reduce='mean'")
    check_arguments(metric, memory_budget)
    check_model(model)
    masks, single = as_masks(model, edge_masks)
    clean, corrupted, key_mask = prepare_tokens(model, clean_tokens, corrupted_tokens, metric, attention_mask)
    with circuit_flags(model):
        run = CircuitRun(model, clean, corrupted, key_mask)
        out = run.evaluate(masks, metric, memory_budget, progress)
    values = out.mean(1) if reduce == "mean" else out
    return values[0] if single else values


def check_arguments(metric, memory_budget) -> None:
    if not callable(metric):
        raise TypeError(f"metric must be callable: fn(logits) -> one value per row, got {type(metric).__name__}")
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget <= 0:
        raise ValueError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}")


def prepare_tokens(model, clean_tokens, corrupted_tokens, metric, attention_mask) -> tuple:
    """(clean, corrupted, key mask or None), checked to share one shape and one padding layout."""
    clean, key_mask = model.input_to_tokens(clean_tokens, attention_mask, None, "right")
    corrupted, corrupted_mask = model.input_to_tokens(corrupted_tokens, attention_mask, None, "right")
    if clean.shape != corrupted.shape:
        raise ValueError(f"clean tokens have shape {tuple(clean.shape)} and corrupted {tuple(corrupted.shape)}; "
                         "they must match (pad them to one length)")
    if (key_mask is None) != (corrupted_mask is None) or (key_mask is not None
                                                          and not torch.equal(key_mask, corrupted_mask)):
        raise ValueError("clean and corrupted prompts are padded differently; give token ids of one layout and "
                         "one attention_mask")
    model.check_tokens(clean)
    model.check_tokens(corrupted)
    if isinstance(metric, PositionMetric):
        metric.check_vocab(model.cfg.d_vocab)
        metric.positions(clean.shape[0], clean.shape[1], clean.device)  # refuses a position out of range
    return clean, corrupted, key_mask


def check_model(model) -> None:
    """Refuse a model whose residual stream is not the sum of the senders' outputs (plus constants)."""
    cfg = model.cfg
    if cfg.norm_placement != "pre":
        raise ValueError(f"exact circuit evaluation needs pre-norm blocks (resid = input + head results + MLP "
                         f"outputs); this model has Config.norm_placement={cfg.norm_placement!r}")
    if cfg.parallel_attn_mlp:
        raise ValueError("exact circuit evaluation needs sequential blocks: with Config.parallel_attn_mlp=True the "
                         "MLP reads the block's input, not the sum edges.py assigns to it")
    if model.hook_flags.use_attn_in:
        raise ValueError("use_attn_in is on, and the per-head q/k/v inputs the circuit patches cannot be on with "
                         "it; turn it off (model.set_use_attn_in(False))")
    hooked = [name for name, point in model.hook_dict.items() if point.has_hooks]
    if hooked:
        raise ValueError(f"the model has hooks or splices attached at {', '.join(hooked[:5])}"
                         f"{' ...' if len(hooked) > 5 else ''}; remove them first (model.reset_hooks()): "
                         "exact circuit evaluation relies on the unhooked residual stream")


class circuit_flags:
    """Turn on the hook flags edge patching reads; restore each one's value on exit, even on error."""

    def __init__(self, model):
        self.model = model
        self.names = [f for f in FLAGS if not (f == "use_hook_mlp_in" and model.cfg.attn_only)]

    def __enter__(self):
        flags = self.model.hook_flags
        self.saved = {name: getattr(flags, name) for name in self.names}
        try:
            for name in self.names:
                setattr(flags, name, True)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        flags = self.model.hook_flags
        for name in reversed(self.names):
            if getattr(flags, name) != self.saved[name]:
                setattr(flags, name, self.saved[name])


def as_masks(model, edge_masks) -> tuple:
    """(bool [mask n_senders n_receivers] on the model's device, whether one mask was given)."""
    senders, receivers = edges.senders(model.cfg), edges.receivers(model.cfg)
    shape = (len(senders), len(receivers))
    graphs = list(edge_masks) if isinstance(edge_masks, (list, tuple)) else None
    single = isinstance(edge_masks, Graph)
    if single:
        graphs = [edge_masks]
    if graphs is not None:
        if not graphs:
            raise ValueError("edge_masks is an empty list")
        stacked = []
        for i, graph in enumerate(graphs):
            if not isinstance(graph, Graph):
                raise TypeError(f"edge_masks[{i}] is a {type(graph).__name__}; a list holds Graphs")
            if list(graph.senders) != senders or list(graph.receivers) != receivers:
                raise ValueError(f"edge_masks[{i}]: the graph's senders/receivers are not this model's "
                                 f"({len(senders)} senders, {len(receivers)} receivers, in edges.py's order)")
            if graph.in_circuit is None:
                raise ValueError(f"edge_masks[{i}]: the graph has no circuit (in_circuit is None); choose one "
                                 "with top_k or threshold")
            stacked.append(graph.in_circuit)
        masks = torch.stack([m.to(model.cfg_device()) for m in stacked])
        return masks, single
    if not isinstance(edge_masks, Tensor) or edge_masks.dtype != torch.bool:
        got = edge_masks.dtype if isinstance(edge_masks, Tensor) else type(edge_masks).__name__
        raise TypeError(f"edge_masks must be a bool tensor [n_senders, n_receivers] = {list(shape)} (or a stack of "
                        f"them, or Graphs), got {got}")
    given = tuple(edge_masks.shape)
    if edge_masks.ndim == 2:
        edge_masks, single = edge_masks[None], True
    if edge_masks.ndim != 3 or tuple(edge_masks.shape[1:]) != shape or edge_masks.shape[0] == 0:
        raise ValueError(f"edge_masks has shape {given}; expected [n_senders, n_receivers] = "
                         f"{list(shape)} or [mask, {shape[0]}, {shape[1]}] with at least one mask")
    return edge_masks.to(model.cfg_device()), single


class CircuitRun:
    """The corrupted senders' outputs of one batch of prompts, and passes of circuits over it."""

    def __init__(self, model, clean: Tensor, corrupted: Tensor, key_mask: Optional[Tensor]):
        cfg = model.cfg
        self.model, self.clean, self.key_mask = model, clean, key_mask
        self.senders, self.receivers = edges.senders(cfg), edges.receivers(cfg)
        self.n_prompts, self.seq_len = clean.shape
        self.device = clean.device
        dtype = model.embed.W_E.dtype
        self.dtype = dtype
        self.store = torch.promote_types(dtype, torch.float32)
        self.exists = edges.edge_mask_for(self.senders, self.receivers, device=self.device)
        self.layout()
        self.corrupted = self.sender_outputs(corrupted)

    def layout(self) -> None:
        """Which sender rows each sender hook fills and which receiver columns each receiver hook reads."""
        cfg = self.model.cfg
        self.sender_slots = {}  # hook name -> (first sender index, n heads or None)
        for i, name in enumerate(self.senders):
            hook, head = edges.sender_hook(name, cfg)
            start, count = self.sender_slots.get(hook, (i, 0 if head is not None else None))
            if head is not None:
                if start + head != i or head != count:
                    raise AssertionError(f"sender {name} is out of head order")  # edges.py's contract
                count += 1
            self.sender_slots[hook] = (start, count)
        self.receiver_slots = {}  # hook name -> (column indices [k], n upstream senders, has a head axis)
        for j, name in enumerate(self.receivers):
            hook, head = edges.receiver_hook(name, cfg)
            upstream = [edges.edge_exists(s, name) for s in self.senders]
            n_up = sum(upstream)
            if upstream != [True] * n_up + [False] * (len(self.senders) - n_up):
                raise AssertionError(f"the senders of {name} are not a prefix of the sender order")
            cols, _, _ = self.receiver_slots.get(hook, ([], n_up, head is not None))
            if head is not None and head != len(cols):
                raise AssertionError(f"receiver {name} is out of head order")
            self.receiver_slots[hook] = (cols + [j], n_up, head is not None)

    def sender_outputs(self, tokens: Tensor) -> Tensor:
        """Every sender's output on ``tokens``: [sender prompt pos d_model] in the store dtype."""
        S, P, T, d = len(self.senders), self.n_prompts, self.seq_len, self.model.cfg.d_model
        out = torch.empty((S, P, T, d), dtype=self.store, device=self.device)

        def keep(act: Tensor, hook) -> None:
            start, count = self.sender_slots[hook.name]
            if count is None:
                out[start] = act
            else:
                out[start: start + count] = act.permute(2, 0, 1, 3)

        hooks = [(name, keep) for name in self.sender_slots]
        with torch.no_grad():
            self.model.run_with_hooks(tokens, attention_mask=self.key_mask, return_type=None, fwd_hooks=hooks)
        return out

    def row_bytes(self, full_logits: bool) -> int:
        """Estimated peak bytes of one batch row (one prompt in one circuit) in a pass."""
        cfg = self.model.cfg
        elt = torch.finfo(self.dtype).bits // 8
        store = torch.finfo(self.store).bits // 8
        per_pos = (8 * cfg.d_model + 2 * cfg.d_mlp + 7 * cfg.n_heads * cfg.d_model + 4 * cfg.n_heads * cfg.d_head
                   + 2 * cfg.n_heads * self.seq_len) * elt
        per_pos += (len(self.senders) + 2 * cfg.n_heads) * cfg.d_model * store  # differences and one correction
        if full_logits:
            per_pos += 2 * 4 * cfg.d_vocab
        return self.seq_len * per_pos + 4 * len(self.senders) * len(self.receivers) // max(1, self.n_prompts)

    def evaluate(self, masks: Tensor, metric: Callable, memory_budget: int, progress: bool) -> Tensor:
        """[mask prompt] metric values ([mask 1] for a VariantMetric)."""
        from tqdm.auto import tqdm

        full = not isinstance(metric, PositionMetric)
        per_pass = max(1, memory_budget // (self.row_bytes(full) * self.n_prompts))
        results = []
        bar = tqdm(total=masks.shape[0], desc="evaluating circuits", disable=not progress, leave=False)
        try:
            with torch.no_grad():
                for lo in range(0, masks.shape[0], per_pass):
                    w = (~masks[lo: lo + per_pass] & self.exists).to(self.store)  # 1 where the edge is corrupted
                    results.append(self.run_pass(w, metric))
                    bar.update(w.shape[0])
        finally:
            bar.close()
        return torch.cat(results)

    def run_pass(self, weights: Tensor, metric: Callable) -> Tensor:
        """One clean forward of ``V = weights.shape[0]`` circuits: [V prompt] (or [V 1]) metric values."""
        V, P, T = weights.shape[0], self.n_prompts, self.seq_len
        S, d = len(self.senders), self.model.cfg.d_model
        # Circuit-major, so that a receiver's upstream senders are one contiguous [n_up, P*T*d] block
        # per circuit and its correction is one batched matmul, with no copy of the differences.
        diffs = torch.empty((V, S, P, T, d), dtype=self.store, device=self.device)
        corrupted = self.corrupted

        def sender(act: Tensor, hook) -> None:
            start, count = self.sender_slots[hook.name]
            if count is None:
                diffs[:, start] = act.view(V, P, T, d) - corrupted[start]
            else:
                current = act.view(V, P, T, count, d).permute(0, 3, 1, 2, 4)
                diffs[:, start: start + count] = current - corrupted[start: start + count]

        # Each receiver hook's weights [V k n_up] (1 where the edge is corrupted), sliced once per pass.
        sliced = {hook: (weights[:, :n_up][:, :, cols].transpose(1, 2), n_up, per_head)
                  for hook, (cols, n_up, per_head) in self.receiver_slots.items()}

        def receiver(act: Tensor, hook) -> Tensor:
            w, n_up, per_head = sliced[hook.name]
            delta = torch.bmm(w, diffs[:, :n_up].view(V, n_up, P * T * d))  # [V k P*T*d]
            if per_head:
                delta = delta.view(V, -1, P, T, d).permute(0, 2, 3, 1, 4)  # [V P T k d]
            return act - delta.reshape(act.shape).to(act.dtype)

        final = {}
        final_hook = f"blocks.{self.model.cfg.n_layers - 1}.hook_resid_post"

        def keep_final(act: Tensor, hook) -> None:
            final["resid"] = act

        hooks = [(name, sender) for name in self.sender_slots] + [(name, receiver) for name in self.receiver_slots]
        hooks.append((final_hook, keep_final))  # after the logits receiver's patch
        tokens = self.clean.repeat(V, 1)
        key_mask = self.key_mask.repeat(V, 1) if self.key_mask is not None else None
        self.model.run_with_hooks(tokens, attention_mask=key_mask, return_type=None, fwd_hooks=hooks)
        return self.read(final["resid"], metric, V)

    def read(self, resid: Tensor, metric: Callable, V: int) -> Tensor:
        """The metric of the final residual stream [V*prompt pos d_model]: [V prompt] (or [V 1])."""
        model, P = self.model, self.n_prompts
        if isinstance(metric, PositionMetric):
            rows = torch.arange(resid.shape[0], device=self.device)
            pos = metric.positions(resid.shape[0], self.seq_len, self.device)
            logits = devices.unembed(model, resid[rows, pos][:, None])[:, 0]
            values = metric.read(logits)
        else:
            logits = devices.unembed(model, resid)
            if isinstance(metric, VariantMetric):
                values = metric.values(logits, P)
                check_values(metric, values, "in an exact circuit evaluation", False,
                             row_label=lambda i: f"circuit {i} of a pass")
                return values[:, None]
            values = metric(logits)
        check_values(metric, values, "in an exact circuit evaluation", False,
                     row_label=lambda i: f"prompt {i % P} of circuit {i // P} of a pass of {V}")
        if tuple(values.shape) != (V * P,):
            raise ValueError(f"the metric {metric_name(metric)} returned {tuple(values.shape)} for {V * P} rows; it "
                             f"must return one value per row [batch] (row r is prompt r % {P}), not a batch mean")
        return values.view(V, P)
