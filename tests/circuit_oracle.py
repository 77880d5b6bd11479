"""The circuit oracle shared by the circuit tests: one circuit per forward, every receiver input
rebuilt by hand.

Written from the definition, sharing no code with glassbox.interp.attribution: the senders'
corrupted outputs are cached explicitly; in the clean forward every receiver's input (each head's
q/k/v input, each MLP input, the final residual stream) is REBUILT from scratch as the sum over its
upstream senders of (the sender's current output if the edge is in the circuit, else its corrupted
output) plus the b_O of every upstream attention layer. That is a different formula from the
evaluator's (current input minus the out-of-circuit differences), so it also checks the residual
identity both rest on.
"""

import torch

from conftest import perturb_vectors
from glassbox.models import HookedTransformer
from glassbox.models.presets import preset_config

FLAGS = ("use_attn_result", "use_split_qkv_input", "use_hook_mlp_in")


def node_tables(cfg):
    """(senders, receivers): rows (name, hook, head index or None, forward key), by hand."""
    n_kv = cfg.n_heads if cfg.ungroup_grouped_query_attention else cfg.n_key_value_heads
    grouped = n_kv != cfg.n_heads
    senders = [("input", "blocks.0.hook_resid_pre", None, (-1, 0))]
    receivers = []
    for L in range(cfg.n_layers):
        senders += [(f"a{L}.h{h}", f"blocks.{L}.attn.hook_result", h, (L, 0)) for h in range(cfg.n_heads)]
        receivers += [(f"a{L}.h{h}.q", f"blocks.{L}.hook_q_input", h, (L, 0)) for h in range(cfg.n_heads)]
        for part in "kv":
            receivers += [(f"a{L}.kv{g}.{part}" if grouped else f"a{L}.h{g}.{part}", f"blocks.{L}.hook_{part}_input",
                           g, (L, 0)) for g in range(n_kv)]
        if not cfg.attn_only:
            senders.append((f"m{L}", f"blocks.{L}.hook_mlp_out", None, (L, 1)))
            receivers.append((f"m{L}", f"blocks.{L}.hook_mlp_in", None, (L, 1)))
    receivers.append(("logits", f"blocks.{cfg.n_layers - 1}.hook_resid_post", None, (cfg.n_layers, 0)))
    return senders, receivers


def set_flags(model, value):
    for flag in FLAGS:
        if not (flag == "use_hook_mlp_in" and model.cfg.attn_only):
            setattr(model.hook_flags, flag, value)


def oracle(model, clean, corrupted, metric, mask, attention_mask=None):
    """The metric's mean over prompts of one circuit, rebuilding every receiver input by hand."""
    senders, receivers = node_tables(model.cfg)
    set_flags(model, True)
    try:
        cache = {}

        def keep(act, hook):
            cache[hook.name] = act.clone()

        hooks = sorted({hook for _, hook, _, _ in senders})
        with torch.no_grad():
            model.run_with_hooks(corrupted, attention_mask=attention_mask, return_type=None,
                                 fwd_hooks=[(h, keep) for h in hooks])
        corr = {name: cache[hook][:, :, head] if head is not None else cache[hook] for name, hook, head, _ in senders}
        current = {}

        def on_sender(act, hook):
            for name, h, head, _ in senders:
                if h == hook.name:
                    current[name] = (act[:, :, head] if head is not None else act).clone()

        def on_receiver(act, hook):
            act = act.clone()
            for j, (name, h, head, key) in enumerate(receivers):
                if h != hook.name:
                    continue
                total = torch.zeros_like(act[:, :, 0] if head is not None else act)
                for i, (s, _, _, s_key) in enumerate(senders):
                    if s_key < key:
                        total = total + (current[s] if mask[i, j] else corr[s])
                for L in range(model.cfg.n_layers):
                    if (L, 0) < key and model.blocks[L].attn.b_O is not None:
                        total = total + model.blocks[L].attn.b_O
                if head is None:
                    act = total
                else:
                    act[:, :, head] = total
            return act

        fwd = [(h, on_sender) for h in hooks] + [(h, on_receiver) for h in sorted({h for _, h, _, _ in receivers})]
        with torch.no_grad():
            logits = model.run_with_hooks(clean, attention_mask=attention_mask, fwd_hooks=fwd)
        return metric(logits).mean()
    finally:
        set_flags(model, False)


SIZES = dict(d_model=22, n_layers=3, n_heads=4, d_head=5, d_mlp=19, d_vocab=31, n_ctx=13, init_range=0.25)
N_PROMPTS, SEQ = 3, 9


def tiny(preset="gpt2", dtype=torch.float32, **changes):
    cfg = preset_config(preset, **{**SIZES, **changes})
    torch.manual_seed(0)
    model = HookedTransformer(cfg, dtype=dtype).eval()
    perturb_vectors(model)
    return model


ARCHS = {"gpt2": {}, "modern-gqa": {"n_key_value_heads": 2, "d_head": 6},
         "modern-gqa-ungrouped": {"n_key_value_heads": 2, "d_head": 6, "ungroup_grouped_query_attention": True},
         "attn-only": {"attn_only": True}}


def model_for(arch, dtype=torch.float32):
    preset = "modern" if arch.startswith("modern") else "gpt2"
    return tiny(preset, dtype, **ARCHS[arch])


def prompts(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, SIZES["d_vocab"], (N_PROMPTS, SEQ), generator=g)
    corrupted = torch.randint(0, SIZES["d_vocab"], (N_PROMPTS, SEQ), generator=g)
    return clean, corrupted


def plain(model, tokens, metric, attention_mask=None):
    with torch.no_grad():
        return metric(model(tokens, attention_mask=attention_mask)).mean()


def random_masks(model, n, seed=0, p=0.5):
    senders, receivers = node_tables(model.cfg)
    g = torch.Generator().manual_seed(seed)
    return torch.rand((n, len(senders), len(receivers)), generator=g) < p
