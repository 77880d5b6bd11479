"""SAE: the base class of every sparse autoencoder and transcoder, with SAELens's hook points.

Shapes and conventions (SAELens's):
- ``W_enc`` [d_in d_sae], ``b_enc`` [d_sae], ``W_dec`` [d_sae d_in] (one row per feature: the
  feature's decoder direction), ``b_dec`` [d_in].
- ``encode(x)``: ``sae_in = x - b_dec`` when ``apply_b_dec_to_input`` (else ``x``), then
  ``acts = activation(sae_in @ W_enc + b_enc)``; ``decode(acts) = acts @ W_dec + b_dec``.
- A ``hook_z`` SAE (``reshape_activations="hook_z"``) reads [... head d_head] and flattens the heads,
  head-major (``(head d_head)``), as SAELens does; ``decode`` gives the flattened [... d_in] and the
  splice un-flattens it.
- Decoder norms are not constrained by the class: ``decoder_norms()`` reports them, and
  ``fold_W_dec_norm()`` rescales every feature to a unit decoder row without changing ``decode(encode(x))``
  (for architectures whose activation commutes with a positive scale, the base's ReLU does).

Hook points, fired in this order by ``encode``/``decode`` (their names are SAELens's):
``hook_sae_input`` [... d_in] (after flattening, before subtracting b_dec), ``hook_sae_acts_pre``
[... d_sae], ``hook_sae_acts_post`` [... d_sae], ``hook_sae_recons`` [... d_in];
``hook_sae_error`` and ``hook_sae_output`` fire only when spliced into a model (``splice.py``).

Subclasses set ``architecture`` and override ``activation`` (and ``initialize`` / extra parameters);
the SAE's dtype and device are its parameters'.
"""

from typing import Optional, Union

import torch
from jaxtyping import Float
from torch import Tensor, nn

from ...hooks import HookedRootModule, HookPoint
from .config import NORMALIZATIONS, SAEConfig

SAE_HOOKS = ("hook_sae_input", "hook_sae_acts_pre", "hook_sae_acts_post", "hook_sae_recons", "hook_sae_error",
             "hook_sae_output")


class SAE(HookedRootModule):
    architecture = "standard"

    def __init__(self, cfg: SAEConfig, device: Union[str, torch.device, None] = None,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        if not isinstance(cfg, SAEConfig):
            raise TypeError(f"an SAE needs a glassbox SAEConfig, got {type(cfg).__name__}")
        if cfg.architecture != self.architecture:
            raise ValueError(f"{type(self).__name__} is the {self.architecture!r} architecture; the config says "
                             f"{cfg.architecture!r}")
        if cfg.normalize_activations not in NORMALIZATIONS:
            raise ValueError(f"normalize_activations={cfg.normalize_activations!r} is not supported "
                             f"(supported: {', '.join(NORMALIZATIONS)})")
        self.cfg = cfg
        factory = dict(device=device, dtype=dtype)
        self.W_enc = nn.Parameter(torch.empty(cfg.d_in, cfg.d_sae, **factory))
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae, **factory))
        self.W_dec = nn.Parameter(torch.empty(cfg.d_sae, cfg.d_in, **factory))
        self.b_dec = nn.Parameter(torch.zeros(cfg.d_in, **factory))
        self.add_parameters(factory)
        for name in SAE_HOOKS:
            setattr(self, name, HookPoint())
        self.initialize()
        self.setup()

    # -- subclass points -------------------------------------------------------------------------
    def add_parameters(self, factory: dict) -> None:
        """Architecture-specific parameters (a JumpReLU threshold, a gated SAE's extra encoder...)."""

    @torch.no_grad()
    def initialize(self, generator: Optional[torch.Generator] = None) -> None:
        """W_dec rows uniform on the unit sphere's neighbourhood (Kaiming-uniform, then unit rows),
        W_enc = W_dec^T, biases zero: every feature starts with a unit decoder direction."""
        W = torch.empty_like(self.W_dec, dtype=torch.float32)
        nn.init.kaiming_uniform_(W, generator=generator)
        W = W / W.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        self.W_dec.copy_(W)
        self.W_enc.copy_(W.T)
        self.b_enc.zero_()
        self.b_dec.zero_()

    def activation(self, hidden_pre: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_sae"]:
        return torch.relu(hidden_pre)

    # -- the computation -------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return self.W_enc.dtype

    @property
    def device(self) -> torch.device:
        return self.W_enc.device

    def flatten_input(self, x: Tensor) -> Tensor:
        """[... head d_head] -> [... (head d_head)] for a hook_z SAE; else x. Checks the width."""
        if self.cfg.reshape_activations == "hook_z":
            x = x.flatten(-2)
        if x.shape[-1] != self.cfg.d_in:
            raise ValueError(f"the SAE at {self.cfg.hook_name} reads d_in={self.cfg.d_in} values per position, "
                             f"got a tensor of shape {tuple(x.shape)}")
        return x

    def sae_input(self, x: Tensor) -> Tensor:
        """What the encoder multiplies: flattened, in the SAE's dtype, through hook_sae_input, minus b_dec
        when ``apply_b_dec_to_input``."""
        x = self.hook_sae_input(self.flatten_input(x).to(self.dtype))
        return x - self.b_dec if self.cfg.apply_b_dec_to_input else x

    def encode_pre(self, x: Tensor) -> Float[Tensor, "... d_sae"]:
        """The pre-activations, through hook_sae_acts_pre."""
        return self.hook_sae_acts_pre(self.sae_input(x) @ self.W_enc + self.b_enc)

    def encode(self, x: Tensor) -> Float[Tensor, "... d_sae"]:
        """Feature activations [... d_sae] of ``x`` [... d_in] (or [... head d_head] for a hook_z SAE)."""
        return self.hook_sae_acts_post(self.activation(self.encode_pre(x)))

    def decode(self, feature_acts: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_in"]:
        """The reconstruction [... d_in], through hook_sae_recons."""
        return self.hook_sae_recons(feature_acts @ self.W_dec + self.b_dec)

    def forward(self, x: Tensor) -> Tensor:
        """decode(encode(x)), shaped like x (a hook_z SAE un-flattens its heads)."""
        out = self.decode(self.encode(x))
        return out.reshape(x.shape) if self.cfg.reshape_activations == "hook_z" else out

    # -- decoder norms ---------------------------------------------------------------------------
    @torch.no_grad()
    def decoder_norms(self) -> Float[Tensor, "d_sae"]:
        return self.W_dec.norm(dim=-1)

    @torch.no_grad()
    def fold_W_dec_norm(self) -> None:
        """Scale each feature so its decoder row has norm 1, folding the norm into W_enc and b_enc (the
        feature's activation scales by the norm; decode(encode(x)) is unchanged up to rounding)."""
        norms = self.decoder_norms().clamp_min(1e-8)
        self.W_dec.div_(norms[:, None])
        self.W_enc.mul_(norms[None, :])
        self.b_enc.mul_(norms)
        self.fold_extra(norms)

    def fold_extra(self, norms: Tensor) -> None:
        """Rescale architecture-specific per-feature parameters by ``norms`` (a JumpReLU threshold)."""

    def extra_repr(self) -> str:
        out = f" -> {self.cfg.hook_name_out}" if self.cfg.is_transcoder else ""
        return (f"{self.architecture}, d_in={self.cfg.d_in}, d_sae={self.cfg.d_sae}, "
                f"hook={self.cfg.hook_name}{out}")


class StandardSAE(SAE):
    """ReLU SAE (SAELens's "standard")."""

    architecture = "standard"
