"""The models being compared, all holding the same seeded random GPT-2 weights.

- ``transformers``: ``GPT2LMHeadModel`` with its default attention implementation (``sdpa``), the
  reference every ratio is taken against; an ``eager`` copy is built only where attention
  probabilities must be returned (the "only patterns" cache case).
- glassbox: ``glassbox.weights.from_hf`` of that model (no weight processing).
- TransformerLens: ``HookedTransformer`` with ``convert_gpt2_weights`` and
  ``load_and_process_state_dict`` with every processing step off, so its numbers match too. It is an
  optional benchmark dependency: when it does not import, its columns are reported as absent.
- TransformerLens 4 (``TransformerBridge``) and nnsight 0.8: workers in their own virtual
  environments (``REMOTE``; peer_worker.py, peers_tl4.py, peers_nnsight.py), in ``Peers.remote``.

Every model is in eval mode, float32, on the CPU, and shares no memory with the others.
"""

import dataclasses
from typing import Optional

import torch

SHAPES = {
    # n_layer, n_embd, n_head, vocab, n_ctx
    "small": (12, 768, 12, 50257, 1024),
    "tiny": (4, 256, 8, 50257, 1024),
    "medium": (24, 1024, 16, 50257, 1024),
}
# Peers run as workers in their own virtual environments (benchmarks/peer_envs.sh builds them):
# name -> (interpreter, worker script in this folder).
REMOTE = {"TL4 bridge": ("/opt/tl4env/bin/python", "peers_tl4.py"),
          "nnsight": ("/opt/nnsightenv/bin/python", "peers_nnsight.py")}


@dataclasses.dataclass
class Peers:
    hf: torch.nn.Module
    glassbox: torch.nn.Module
    tl: Optional[torch.nn.Module]
    tl_version: Optional[str]
    tl_error: Optional[str]
    hf_config: object
    remote: dict = dataclasses.field(default_factory=dict)  # name -> peer_worker.Remote
    remote_absent: dict = dataclasses.field(default_factory=dict)  # name -> why it is not compared

    def hf_eager(self) -> torch.nn.Module:
        """A copy of the reference with eager attention, for attention probabilities."""
        from transformers import GPT2LMHeadModel

        config = type(self.hf_config).from_dict(self.hf_config.to_dict())
        config._attn_implementation = "eager"
        model = GPT2LMHeadModel(config).eval()
        model.load_state_dict(self.hf.state_dict())
        return model


def hf_config(shape: str):
    from transformers import GPT2Config

    n_layer, n_embd, n_head, vocab, n_ctx = SHAPES[shape]
    return GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab, n_positions=n_ctx)


def build_hf(shape: str, seed: int):
    from transformers import GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(hf_config(shape)).eval()


def build_glassbox(hf):
    from glassbox.weights import from_hf

    return from_hf(hf).eval()


def tl_config(hf_config):
    from transformer_lens import HookedTransformerConfig

    return HookedTransformerConfig(
        n_layers=hf_config.n_layer, d_model=hf_config.n_embd, n_heads=hf_config.n_head,
        d_head=hf_config.n_embd // hf_config.n_head, d_mlp=4 * hf_config.n_embd, d_vocab=hf_config.vocab_size,
        n_ctx=hf_config.n_positions, act_fn="gelu_new", normalization_type="LN", eps=hf_config.layer_norm_epsilon,
        positional_embedding_type="standard", original_architecture="GPT2LMHeadModel", device="cpu",
    )


def build_tl(hf):
    """TransformerLens's model on the reference's weights, unprocessed (as its from_pretrained_no_processing)."""
    from transformer_lens import HookedTransformer
    from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights

    cfg = tl_config(hf.config)
    model = HookedTransformer(cfg, tokenizer=None, move_to_device=False)
    with torch.no_grad():
        state = {k: v.detach().clone() for k, v in convert_gpt2_weights(hf, cfg).items()}
    model.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                      fold_value_biases=False)
    return model.eval()


def tl_available() -> tuple:
    """(version or None, reason it is unavailable or None)."""
    try:
        import importlib.metadata

        import transformer_lens  # noqa: F401

        return importlib.metadata.version("transformer_lens"), None
    except Exception as err:  # an optional dependency: any import failure means "not compared"
        return None, f"{type(err).__name__}: {err}"


def build_peers(shape: str = "small", seed: int = 0, with_tl: bool = True) -> Peers:
    hf = build_hf(shape, seed)
    glassbox = build_glassbox(hf)
    tl_version, tl_error = tl_available() if with_tl else (None, "disabled with --no-tl")
    tl = build_tl(hf) if tl_version is not None else None
    return Peers(hf=hf, glassbox=glassbox, tl=tl, tl_version=tl_version, tl_error=tl_error, hf_config=hf.config)


def start_remote(p: Peers, shape: str, seed: int, threads: int, pythons: Optional[dict] = None) -> None:
    """Start every ``REMOTE`` peer (``pythons`` overrides an interpreter; None there leaves it out)."""
    import os

    from peer_worker import start

    here = os.path.dirname(os.path.abspath(__file__))
    for name, (python, script) in REMOTE.items():
        python = (pythons or {}).get(name, python)
        if python is None:
            p.remote_absent[name] = "left out on the command line"
            continue
        remote, why = start(name, python, os.path.join(here, script), shape, seed, threads)
        if remote is None:
            p.remote_absent[name] = why
        else:
            p.remote[name] = remote
