"""SAE: the base class of every sparse autoencoder and transcoder, with SAELens's hook points.

Shapes and conventions (SAELens's):
- ``W_enc`` [d_in d_sae], ``b_enc`` [d_sae], ``W_dec`` [d_sae d_out] (one row per feature: the
  feature's decoder direction), ``b_dec`` [d_out]; ``d_out`` is ``d_in`` except for a transcoder
  (``cfg.d_output``). A gated SAE has no ``b_enc`` (it is None).
- ``encode(x)``: ``sae_in = x - b_dec`` when ``apply_b_dec_to_input`` (else ``x``), then
  ``acts = activation(sae_in @ W_enc + b_enc)``; ``decode(acts) = acts @ W_dec + b_dec``.
- ``normalize_activations`` (``config.py``): the input is normalised after ``hook_sae_input`` and
  before ``b_dec`` is subtracted; ``decode`` un-normalises after ``hook_sae_recons`` with the
  coefficient the last ``encode`` kept (so ``decode`` must follow the ``encode`` of the same input).
- ``forward(x)`` is ``decode(encode(x))`` plus ``skip(x)`` (a skip transcoder's ``x @ W_skip.T``; none
  for the others): a splice writes ``forward``, not ``decode(encode(x))``.
- A ``hook_z`` SAE (``reshape_activations="hook_z"``) reads [... head d_head] and flattens the heads,
  head-major (``(head d_head)``), as SAELens does; ``hook_sae_input`` and ``hook_sae_recons`` fire on
  flattened values, and ``decode`` (so ``forward``) gives [... head d_head] back, as SAELens's, with the
  ``d_head`` of the last input encoded (``self.d_head``; SAELens keeps its first one's): a ``decode``
  before any ``encode`` is refused (SAELens fails inside einops). A flattened [... d_in] input is refused.
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
from ...models.hook_shapes import axis_sizes, hook_shape
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
        if cfg.apply_b_dec_to_input and cfg.d_output != cfg.d_in:
            raise ValueError(f"apply_b_dec_to_input subtracts b_dec [d_out={cfg.d_output}] from the input "
                             f"[d_in={cfg.d_in}]; it needs d_out == d_in")
        self.cfg = cfg
        self._norm_state: Optional[tuple] = None
        self.d_head: Optional[int] = None  # a hook_z SAE's, from the last input encoded (SAELens's name)
        self.use_error_term = False  # SAELens's attribute: forward adds x - recons; add_sae's default
        factory = dict(device=device, dtype=dtype)
        self.W_enc = nn.Parameter(torch.empty(cfg.d_in, cfg.d_sae, **factory))
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae, **factory))
        self.W_dec = nn.Parameter(torch.empty(cfg.d_sae, cfg.d_output, **factory))
        self.b_dec = nn.Parameter(torch.zeros(cfg.d_output, **factory))
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
        W_enc = W_dec^T (a transcoder with d_out != d_in: its own Kaiming-uniform W_enc), biases zero:
        every feature starts with a unit decoder direction."""
        W = torch.empty_like(self.W_dec, dtype=torch.float32)
        nn.init.kaiming_uniform_(W, generator=generator)
        W = W / W.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        self.W_dec.copy_(W)
        if self.W_enc.shape == W.T.shape:
            self.W_enc.copy_(W.T)
        else:
            W_enc = torch.empty_like(self.W_enc, dtype=torch.float32)
            nn.init.kaiming_uniform_(W_enc, generator=generator)
            self.W_enc.copy_(W_enc)
        if self.b_enc is not None:
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
            if x.ndim >= 2 and x.shape[-2] * x.shape[-1] == self.cfg.d_in:
                self.d_head = x.shape[-1]
            x = x.flatten(-2)
        if x.shape[-1] != self.cfg.d_in:
            raise ValueError(f"the SAE at {self.cfg.hook_name} reads d_in={self.cfg.d_in} values per position, "
                             f"got a tensor of shape {tuple(x.shape)}")
        return x

    def sae_input(self, x: Tensor) -> Tensor:
        """What the encoder multiplies: flattened, in the SAE's dtype, through hook_sae_input, minus b_dec
        when ``apply_b_dec_to_input``."""
        x = self.normalize_in(self.hook_sae_input(self.flatten_input(x).to(self.dtype)))
        return x - self.b_dec if self.cfg.apply_b_dec_to_input else x

    def normalize_in(self, x: Tensor) -> Tensor:
        """``normalize_activations`` on the input (config.py); keeps the coefficient for ``decode``. A row of
        zeros gets an infinite coefficient under constant_norm_rescale and NaN out, as in SAELens (checking
        for it would wait on the device every forward)."""
        mode = self.cfg.normalize_activations
        if mode == "none":
            return x
        if mode == "constant_norm_rescale":
            coeff = (self.cfg.d_in ** 0.5) / x.norm(dim=-1, keepdim=True)
            self._norm_state = (coeff,)
            return x * coeff
        if mode == "layer_norm":
            mu = x.mean(dim=-1, keepdim=True)
            x = x - mu
            std = x.std(dim=-1, keepdim=True)
            self._norm_state = (mu, std)
            return x / (std + 1e-5)
        raise ValueError(f"normalize_activations={mode!r} is not supported")

    def normalize_out(self, out: Tensor) -> Tensor:
        """Undo ``normalize_in`` on a reconstruction with the coefficient of the last ``encode``."""
        mode = self.cfg.normalize_activations
        if mode == "none":
            return out
        state, self._norm_state = self._norm_state, None
        if state is None or state[0].shape[:-1] != out.shape[:-1]:
            got = "no encode" if state is None else f"an encode of {tuple(state[0].shape[:-1])} positions"
            raise RuntimeError(f"the SAE at {self.cfg.hook_name} normalises its input "
                               f"(normalize_activations={mode!r}): decode of {tuple(out.shape[:-1])} positions "
                               f"needs the encode of the same input just before it, and found {got}")
        if mode == "constant_norm_rescale":
            return out / state[0]
        mu, std = state
        return out * std + mu

    def encode_pre(self, x: Tensor) -> Float[Tensor, "... d_sae"]:
        """The pre-activations, through hook_sae_acts_pre."""
        return self.hook_sae_acts_pre(self.sae_input(x) @ self.W_enc + self.b_enc)

    def encode(self, x: Tensor) -> Float[Tensor, "... d_sae"]:
        """Feature activations [... d_sae] of ``x`` [... d_in] (or [... head d_head] for a hook_z SAE)."""
        return self.hook_sae_acts_post(self.activation(self.encode_pre(x)))

    # Architectures whose activations may be in units of pre-activation x decoder norm (TopK, BatchTopK).
    can_rescale = False

    @property
    def rescaled(self) -> bool:
        """Whether decode divides the activations by the decoder norms (``rescale_acts_by_decoder_norm``)."""
        return self.can_rescale and self.cfg.rescale_acts_by_decoder_norm

    def decode_linear(self, feature_acts: Tensor) -> Tensor:
        """``feature_acts @ W_dec + b_dec``, the activations first divided by the decoder norms when ``rescaled``."""
        if self.rescaled:
            feature_acts = feature_acts * (1 / self.W_dec.norm(dim=-1))
        return feature_acts @ self.W_dec + self.b_dec

    def decode(self, feature_acts: Float[Tensor, "... d_sae"]) -> Tensor:
        """The reconstruction [... d_out] through hook_sae_recons, then un-normalised
        (``normalize_activations``); for a hook_z SAE then un-flattened to [... head d_head], as SAELens."""
        hook_z = self.cfg.reshape_activations == "hook_z"
        if hook_z and self.d_head is None:
            raise ValueError(f"decode of the hook_z SAE at {self.cfg.hook_name} gives [... head d_head] and does "
                             "not know d_head until it has encoded an input [... head d_head] (as SAELens); encode "
                             "first, or set sae.d_head")
        out = self.normalize_out(self.hook_sae_recons(self.decode_linear(feature_acts)))
        return out.unflatten(-1, (-1, self.d_head)) if hook_z else out

    def decoder_directions(self) -> Float[Tensor, "d_sae d_out"]:
        """What one unit of each feature's activation adds to the reconstruction before any
        un-normalisation: ``W_dec``, or ``W_dec`` rows over their norms when ``rescaled``."""
        if self.rescaled:
            return self.W_dec / self.W_dec.norm(dim=-1, keepdim=True)
        return self.W_dec

    def skip(self, x: Tensor) -> Optional[Tensor]:
        """A skip connection's term added by ``forward`` (a skip transcoder's); None here."""
        return None

    def forward(self, x: Tensor) -> Tensor:
        """decode(encode(x)) + skip(x); a hook_z SAE's output is shaped like x (heads un-flattened). With
        ``use_error_term`` (SAELens's attribute) plus ``x - clean``, ``clean`` the reconstruction with no
        hooks firing (as SAELens's forward; refused for a transcoder, whose error needs the value at its
        write hook: splice it)."""
        out = self.decode(self.encode(x))
        extra = self.skip(x)
        out = out if extra is None else out + extra
        if not self.use_error_term:
            return out
        if self.cfg.is_transcoder:
            raise ValueError(f"the {self.architecture} at {self.cfg.hook_name} has use_error_term=True: its error is "
                             f"the value at {self.cfg.hook_out} minus its output, which forward(x) does not see; "
                             "splice it (model.add_sae) instead")
        from .splice import hooks_off

        hooked = [p for p in self.hook_dict.values() if p.fwd_hooks or p.bwd_hooks]
        clean = out
        if hooked:
            with torch.no_grad(), hooks_off(hooked):
                clean = self.decode(self.encode(x))
        return out + (x.to(self.dtype) - clean.detach())

    # -- fitting a model ---------------------------------------------------------------------------
    def check_fits(self, model) -> None:
        """Refuse, naming the hook and the widths, an SAE whose hooks ``model`` lacks or whose ``d_in``
        (``d_out``) is not the width of the value at ``hook_name`` (``hook_name_out``): the last axis, or the
        heads times d_head for a hook_z SAE. Hooks missing from glassbox's shape table are not checked."""
        cfg = self.cfg
        hooks = getattr(model, "hook_dict", {})
        for role, name, width in (("reads", cfg.hook_name, cfg.d_in), ("writes", cfg.hook_out, cfg.d_output)):
            if name not in hooks:
                raise KeyError(f"the SAE {role} at {name!r}, which this model does not have")
            if getattr(model, "cfg", None) is None:
                continue  # a hooked module without a glassbox config: widths are checked at run time
            try:
                axes = hook_shape(name, getattr(model, "hook_flags", None), model.cfg).split()
            except KeyError:
                continue
            sizes = axis_sizes(model.cfg, 1, 1)
            sizes.update({a: int(a) for a in axes if a.isdigit()})  # a literal axis ("batch pos 1")
            if axes[:2] != ["batch", "pos"] or len(axes) < 3 or any(a not in sizes for a in axes):
                continue
            flat = cfg.reshape_activations == "hook_z" and len(axes) >= 4
            have = sizes[axes[-1]] * (sizes[axes[-2]] if flat else 1)
            if have != width:
                what = f"{axes[-2]} x {axes[-1]} = {have}" if flat else \
                    f"{axes[-1]} = {have}" if not axes[-1].isdigit() else str(have)
                raise ValueError(f"the SAE {role} {'d_in' if role == 'reads' else 'd_out'}={width} values per "
                                 f"position at {name}, where the model has {what}")

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
        if self.b_enc is not None:
            self.b_enc.mul_(norms)
        self.fold_extra(norms)

    # -- folding a training-time input normalisation (SAELens's trainer does so when it finishes) ---
    @torch.no_grad()
    def fold_activation_norm_scaling_factor(self, scaling_factor: float) -> None:
        """The SAE trained on ``scaling_factor * x`` made to read ``x`` (and reconstruct ``x``): W_enc times
        the factor, W_dec and b_dec divided by it, as SAELens's method of this name."""
        self.W_enc.mul_(scaling_factor)
        self.W_dec.div_(scaling_factor)
        self.b_dec.div_(scaling_factor)

    @torch.no_grad()
    def fold_activation_whitening(self, mean: Tensor, whitening_matrix: Tensor, unwhitening_matrix: Tensor) -> None:
        """The SAE trained on ``z = (x - mean) @ M`` (reconstructing ``z``, mapped back by ``@ M^-1 + mean``)
        made to read and reconstruct ``x``, as SAELens's method of this name: ``W_enc <- M @ W_enc``,
        ``W_dec <- W_dec @ M^-1``, ``b_dec <- b_dec @ M^-1 + mean``, and without ``apply_b_dec_to_input``
        ``b_enc <- b_enc - mean @ W_enc``; computed in the wider of the two dtypes."""
        dtype = torch.promote_types(self.W_enc.dtype, whitening_matrix.dtype)
        mean = mean.to(self.device, dtype)
        M = whitening_matrix.to(self.device, dtype)
        M_inv = unwhitening_matrix.to(self.device, dtype)
        self.W_enc.copy_(M @ self.W_enc.to(dtype))
        if not self.cfg.apply_b_dec_to_input and self.b_enc is not None:
            self.b_enc.sub_(mean @ self.W_enc.to(dtype))
        self.W_dec.copy_(self.W_dec.to(dtype) @ M_inv)
        self.b_dec.copy_(self.b_dec.to(dtype) @ M_inv + mean)
        self.fold_whitening_extra(mean)

    def fold_whitening_extra(self, mean: Tensor) -> None:
        """Shift architecture-specific encoder biases as ``fold_activation_whitening`` shifts b_enc."""

    def fold_extra(self, norms: Tensor) -> None:
        """Rescale architecture-specific per-feature parameters by ``norms`` (a JumpReLU threshold)."""

    def __repr__(self) -> str:  # one line: the module tree is only hook points
        from ..reprs import sae_repr

        return sae_repr(self)

    def _repr_html_(self) -> str:
        from ..reprs import sae_html

        return sae_html(self)

    def extra_repr(self) -> str:
        out = f" -> {self.cfg.hook_name_out}" if self.cfg.is_transcoder else ""
        return (f"{self.architecture}, d_in={self.cfg.d_in}, d_sae={self.cfg.d_sae}, "
                f"hook={self.cfg.hook_name}{out}")


class StandardSAE(SAE):
    """ReLU SAE (SAELens's "standard")."""

    architecture = "standard"
