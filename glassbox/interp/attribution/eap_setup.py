"""What edge attribution needs from a model: the check that its residual stream decomposes into the
edge graph's senders, the hook flags that expose every sender and receiver, and the hooks that read
them.

``check_edge_model`` refuses, by the Config field or method that is wrong, a model whose receiver
inputs are not sums of sender outputs plus unchanging biases: post-norm (norm_placement "post"),
sandwich and output norms (a head's hook_result is not what enters the residual stream), parallel
blocks (attention and MLP read the same stream, so a layer's heads do not feed its MLP), and models
without per-head q/k/v inputs. Attention-only models are fine (no MLP senders or receivers).

``edge_flags`` turns on use_attn_result, use_split_qkv_input and (with MLPs) use_hook_mlp_in, turning
use_attn_in off while it runs (the two input flags cannot both be on), and restores every flag on exit,
also when the body raises. Turning a flag off while hooks are attached to its hook points is refused by
the model (HookFlagError); ``edge_flags`` leaves no hooks of its own attached.
"""

from collections import defaultdict
from contextlib import contextmanager

from torch import Tensor
import torch

from .edges import receiver_hook, receivers, sender_hook, senders

EDGE_FLAGS = ("use_attn_result", "use_split_qkv_input", "use_hook_mlp_in")


def check_edge_model(model) -> None:
    """Raise ValueError naming what makes the edge decomposition inexact for this model."""
    cfg = model.cfg
    placement = getattr(cfg, "norm_placement", "pre")
    if placement != "pre":
        raise ValueError(
            f"edge attribution needs pre-norm blocks, where each receiver's input is the sum of its senders' "
            f"outputs plus biases; Config.norm_placement={placement!r} normalises "
            + ("the residual stream itself" if placement == "post" else "each sublayer's output (after "
               "hook_result), so the heads' results are not what enters the residual stream"))
    if getattr(cfg, "parallel_attn_mlp", False):
        raise ValueError("edge attribution needs sequential blocks: with Config.parallel_attn_mlp=True attention and "
                         "MLP read the same residual stream, so a layer's heads do not feed its MLP and the edge graph "
                         "(a{L}.h{H} -> m{L}) does not describe the model")
    for method in ("set_use_split_qkv_input", "set_use_attn_result", "set_use_hook_mlp_in"):
        if not callable(getattr(model, method, None)):
            raise ValueError(f"edge attribution needs per-head inputs and outputs; this model has no {method}()")
    if not hasattr(model, "hook_flags"):
        raise ValueError("edge attribution needs the model's hook_flags (a glassbox HookedTransformer)")


def has_mlp(cfg) -> bool:
    return not getattr(cfg, "attn_only", False)


@contextmanager
def edge_flags(model):
    """Flags on for the body (see the module docstring), every flag back as it was afterwards."""
    flags = model.hook_flags
    before = flags.as_dict()
    wanted = {"use_attn_in": False, "use_attn_result": True, "use_split_qkv_input": True}
    if has_mlp(model.cfg):
        wanted["use_hook_mlp_in"] = True
    try:
        for name, value in wanted.items():  # use_attn_in goes off before use_split_qkv_input comes on
            if getattr(flags, name) != value:
                setattr(flags, name, value)
        yield model
    finally:
        # off first, then on, so no refused pair (split q/k/v input with attn_in) is ever set
        for turn_on in (False, True):
            for name, value in before.items():
                if value == turn_on and getattr(flags, name) != value:
                    setattr(flags, name, value)


def sender_hook_names(cfg) -> list:
    """The hook names holding every sender's output, each once, in forward order."""
    names = []
    for name in senders(cfg):
        hook = sender_hook(name, cfg)[0]
        if hook not in names:
            names.append(hook)
    return names


def stack_senders(values: dict, cfg) -> Tensor:
    """[sender batch pos d_model]: each sender's output, in ``senders(cfg)`` order, from ``values``
    (hook name -> activation, as the hooks of ``sender_hook_names`` saw it)."""
    rows = []
    for name in senders(cfg):
        hook, index = sender_hook(name, cfg)
        rows.append(values[hook] if index is None else values[hook][:, :, index])
    return torch.stack(rows)


def receiver_columns(cfg) -> list:
    """[(hook name, [column in receivers(cfg) for each index of the hook's head axis, or one column])]
    for every receiver hook, in forward order."""
    columns = defaultdict(dict)
    order = []
    for column, name in enumerate(receivers(cfg)):
        hook, index = receiver_hook(name, cfg)
        if hook not in columns:
            order.append(hook)
        columns[hook][0 if index is None else index] = column
    return [(hook, [columns[hook][i] for i in sorted(columns[hook])]) for hook in order]


def saving_hook(store: dict, detach: bool = True):
    """A forward hook that saves its activation under its hook name (detached unless told otherwise)."""
    def hook(x, hook):
        store[hook.name] = x.detach() if detach else x
    return hook
