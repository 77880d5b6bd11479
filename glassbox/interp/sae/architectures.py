"""SAE architectures (SAELens's inference semantics) and the registry ``architecture name -> class``.

Each class computes what SAELens 6's inference class of the same ``architecture`` name computes on the
same weights (``format.py`` reads and writes its folders):
- ``"standard"`` (``StandardSAE``, base.py): ``relu(pre)``.
- ``"topk"`` (``TopKSAE``): ``torch.topk(pre, k, sorted=False)`` over the features of each position, the
  kept values ReLU'd (a kept negative pre-activation gives 0), the rest 0; ties are broken by
  ``torch.topk`` (which of two equal pre-activations at the k-th place is kept is torch's choice, as in
  SAELens). With ``rescale_acts_by_decoder_norm`` the selection and the activations are of
  ``pre * ||W_dec[f]||`` (``hook_sae_acts_pre`` fires before that product, as SAELens's) and ``decode``
  multiplies the activations by ``1 / ||W_dec[f]||`` first.
- ``"batchtopk"`` (``BatchTopKSAE``): the training-time activation, the ``k * positions`` largest
  ``relu(pre)`` over the whole batch (so a position's features depend on the other positions). Its
  inference form is a JumpReLU SAE with threshold ``topk_threshold`` for every feature
  (``to_jumprelu()``); SAELens saves it so, and so does ``format.save_sae``.
- ``"jumprelu"`` (``JumpReLUSAE``): ``relu(pre) * (pre > threshold)``, ``threshold`` [d_sae].
- ``"gated"`` (``GatedSAE``): no ``b_enc``; ``(sae_in @ W_enc + b_gate > 0) * relu(sae_in @ (W_enc *
  exp(r_mag)) + b_mag)``; ``hook_sae_acts_pre`` is the magnitude path's pre-activation.
- ``"transcoder"``, ``"skip_transcoder"``, ``"jumprelu_transcoder"``, ``"jumprelu_skip_transcoder"``
  read ``hook_name`` [d_in], write ``hook_name_out`` [d_out] (see ``Transcoder``).

Decoder norms: no class constrains them. ``fold_W_dec_norm()`` makes every decoder row unit norm
without changing ``decode(encode(x))``: ReLU, JumpReLU (its threshold scales too) and gated
activations commute with a positive per-feature scale; TopK only when ``rescale_acts_by_decoder_norm``
(else the selection would change: refused, as SAELens).
"""

from typing import Optional, Union

import torch
from jaxtyping import Float
from torch import Tensor, nn

from .base import SAE, StandardSAE
from .config import SAEConfig


class TopKSAE(SAE):
    """TopK SAE (SAELens's "topk"): ``cfg.k`` features kept per position (see the module docstring)."""

    architecture = "topk"
    can_rescale = True

    def __init__(self, cfg: SAEConfig, device=None, dtype: torch.dtype = torch.float32):
        if isinstance(cfg, SAEConfig) and (isinstance(cfg.k, bool) or not isinstance(cfg.k, int)
                                           or not 1 <= cfg.k <= cfg.d_sae):
            raise ValueError(f"a topk SAE needs an int k in [1, d_sae={cfg.d_sae}], got k={cfg.k!r}")
        super().__init__(cfg, device, dtype)

    def activation(self, hidden_pre: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_sae"]:
        if self.cfg.rescale_acts_by_decoder_norm:
            hidden_pre = hidden_pre * self.W_dec.norm(dim=-1)
        values, indices = torch.topk(hidden_pre, k=self.cfg.k, dim=-1, sorted=False)
        return torch.zeros_like(hidden_pre).scatter_(-1, indices, values.relu())

    @torch.no_grad()
    def fold_W_dec_norm(self) -> None:
        """Unit decoder rows; only with ``rescale_acts_by_decoder_norm`` (else the top k would change)."""
        if not self.cfg.rescale_acts_by_decoder_norm:
            raise ValueError("fold_W_dec_norm on a topk SAE without rescale_acts_by_decoder_norm would change "
                             "which features are in the top k; refused (as SAELens)")
        super().fold_W_dec_norm()

    @torch.no_grad()
    def fold_activation_whitening(self, mean: Tensor, whitening_matrix: Tensor, unwhitening_matrix: Tensor) -> None:
        """With ``rescale_acts_by_decoder_norm`` the decoder norms are folded first (the un-whitening changes
        them, which would change the selection) and the rescale turned off, as SAELens."""
        if self.cfg.rescale_acts_by_decoder_norm:
            self.fold_W_dec_norm()
            self.cfg.rescale_acts_by_decoder_norm = False
        super().fold_activation_whitening(mean, whitening_matrix, unwhitening_matrix)


def batch_topk(acts: Tensor, k: float) -> Tensor:
    """The ``int(k * positions)`` largest of ``acts`` over every position and feature, the rest 0."""
    flat = acts.flatten()
    n = int(k * acts.shape[:-1].numel())
    top = torch.topk(flat, n, dim=-1)
    return torch.zeros_like(flat).scatter(-1, top.indices, top.values).reshape(acts.shape)


class BatchTopKSAE(SAE):
    """BatchTopK SAE (SAELens's "batchtopk" training SAE): ``cfg.k`` features per position on average
    over the batch that ``encode`` sees. ``topk_threshold`` (a float64 scalar buffer, 0 at first) is
    SAELens's running estimate of the smallest kept activation, read from a SAELens checkpoint
    (glassbox's trainer does not train this architecture); ``to_jumprelu()`` is the SAE to run at
    inference (and the one ``format.save_sae`` writes). Not spliceable: a position's features depend
    on the rest of the batch (``batch_dependent``)."""

    architecture = "batchtopk"
    can_rescale = True
    batch_dependent = True

    def __init__(self, cfg: SAEConfig, device=None, dtype: torch.dtype = torch.float32):
        if isinstance(cfg, SAEConfig) and (isinstance(cfg.k, bool) or not isinstance(cfg.k, (int, float))
                                           or not 0 < cfg.k <= cfg.d_sae):
            raise ValueError(f"a batchtopk SAE needs k in (0, d_sae={cfg.d_sae}], got k={cfg.k!r}")
        super().__init__(cfg, device, dtype)

    def add_parameters(self, factory: dict) -> None:
        self.register_buffer("topk_threshold", torch.zeros((), dtype=torch.float64, device=factory["device"]))

    def activation(self, hidden_pre: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_sae"]:
        if self.cfg.rescale_acts_by_decoder_norm:
            hidden_pre = hidden_pre * self.W_dec.norm(dim=-1)
        return batch_topk(hidden_pre.relu(), self.cfg.k)

    @torch.no_grad()
    def fold_W_dec_norm(self) -> None:
        if not self.cfg.rescale_acts_by_decoder_norm:
            raise ValueError("fold_W_dec_norm on a batchtopk SAE without rescale_acts_by_decoder_norm would "
                             "change which features are kept; refused")
        super().fold_W_dec_norm()

    @torch.no_grad()
    def fold_activation_norm_scaling_factor(self, scaling_factor: float) -> None:
        """As the base; with ``rescale_acts_by_decoder_norm`` the threshold (in units of pre times the
        decoder norm, which the fold divides) is divided too, as SAELens."""
        super().fold_activation_norm_scaling_factor(scaling_factor)
        if self.cfg.rescale_acts_by_decoder_norm:
            self.topk_threshold.div_(scaling_factor)

    @torch.no_grad()
    def fold_activation_whitening(self, mean: Tensor, whitening_matrix: Tensor, unwhitening_matrix: Tensor) -> None:
        """As TopKSAE's: decoder norms folded first (and the rescale turned off) when rescaling, as SAELens."""
        if self.cfg.rescale_acts_by_decoder_norm:
            self.fold_W_dec_norm()
            self.cfg.rescale_acts_by_decoder_norm = False
        super().fold_activation_whitening(mean, whitening_matrix, unwhitening_matrix)

    @torch.no_grad()
    def to_jumprelu(self) -> "JumpReLUSAE":
        """The inference SAE, as SAELens saves a BatchTopK SAE: a JumpReLU SAE with the same weights (decoder
        norms folded in first when ``rescale_acts_by_decoder_norm``) and ``threshold`` = ``topk_threshold``
        for every feature. It equals this SAE's top-k only where the batch's k-th largest activation is the
        threshold; it is the per-position rule the batch rule was trained to approximate."""
        cfg = SAEConfig(**{**self.cfg.to_dict(), "architecture": "jumprelu", "k": None,
                           "rescale_acts_by_decoder_norm": False,
                           "metadata": dict(self.cfg.metadata)})
        out = JumpReLUSAE(cfg, device=self.device, dtype=self.dtype)
        W_enc, b_enc, W_dec = self.W_enc.detach().clone(), self.b_enc.detach().clone(), self.W_dec.detach().clone()
        if self.cfg.rescale_acts_by_decoder_norm:
            norms = W_dec.norm(dim=-1).clamp(min=1e-8)
            b_enc, W_dec, W_enc = b_enc * norms, W_dec / norms[:, None], W_enc * norms[None, :]
        out.W_enc.copy_(W_enc)
        out.b_enc.copy_(b_enc)
        out.W_dec.copy_(W_dec)
        out.b_dec.copy_(self.b_dec)
        out.threshold.copy_(torch.ones_like(out.threshold) * self.topk_threshold.item())
        return out


class JumpReLUSAE(SAE):
    """JumpReLU SAE (SAELens's "jumprelu"): ``relu(pre) * (pre > threshold)``, ``threshold`` [d_sae]
    (SAELens's name; the threshold itself, not its log)."""

    architecture = "jumprelu"

    def add_parameters(self, factory: dict) -> None:
        self.threshold = nn.Parameter(torch.zeros(self.cfg.d_sae, **factory))

    def activation(self, hidden_pre: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_sae"]:
        return hidden_pre.relu() * (hidden_pre > self.threshold).to(hidden_pre.dtype)

    def fold_extra(self, norms: Tensor) -> None:
        self.threshold.mul_(norms)


class GatedSAE(SAE):
    """Gated SAE (SAELens's "gated"): a gate ``sae_in @ W_enc + b_gate > 0`` and a magnitude
    ``relu(sae_in @ (W_enc * exp(r_mag)) + b_mag)`` sharing ``W_enc``; ``b_enc`` is None. ``r_mag``,
    ``b_gate``, ``b_mag`` are [d_sae]."""

    architecture = "gated"

    def add_parameters(self, factory: dict) -> None:
        self.b_enc = None
        self.r_mag = nn.Parameter(torch.zeros(self.cfg.d_sae, **factory))
        self.b_gate = nn.Parameter(torch.zeros(self.cfg.d_sae, **factory))
        self.b_mag = nn.Parameter(torch.zeros(self.cfg.d_sae, **factory))

    def encode_pre(self, x: Tensor) -> Float[Tensor, "... d_sae"]:
        """The magnitude path's pre-activations, through hook_sae_acts_pre."""
        return self.hook_sae_acts_pre(self.sae_input(x) @ (self.W_enc * self.r_mag.exp()) + self.b_mag)

    def encode(self, x: Tensor) -> Float[Tensor, "... d_sae"]:
        sae_in = self.sae_input(x)
        gate = ((sae_in @ self.W_enc + self.b_gate) > 0).to(self.dtype)
        magnitude = self.hook_sae_acts_pre(sae_in @ (self.W_enc * self.r_mag.exp()) + self.b_mag)
        return self.hook_sae_acts_post(gate * magnitude.relu())

    def fold_extra(self, norms: Tensor) -> None:
        self.b_gate.mul_(norms)
        self.b_mag.mul_(norms)

    def fold_whitening_extra(self, mean: Tensor) -> None:
        if not self.cfg.apply_b_dec_to_input:
            shift = mean.to(self.W_enc) @ self.W_enc
            self.b_gate.sub_(shift)
            self.b_mag.sub_(shift * self.r_mag.exp())


class Transcoder(SAE):
    """ReLU transcoder (SAELens's "transcoder"): encodes the value at ``cfg.hook_name`` [d_in], decodes to
    ``cfg.d_out`` values written at ``cfg.hook_name_out``. As SAELens: ``apply_b_dec_to_input`` must be
    False (b_dec is an output bias), and a transcoder neither flattens hook_z heads nor normalises
    (SAELens normalises a transcoder's input and never un-normalises its output: refused here)."""

    architecture = "transcoder"

    def __init__(self, cfg: SAEConfig, device=None, dtype: torch.dtype = torch.float32):
        if isinstance(cfg, SAEConfig):
            name = f"a {self.architecture} (at {cfg.hook_name})"
            if cfg.apply_b_dec_to_input:
                raise ValueError(f"{name} has apply_b_dec_to_input=False (b_dec is the output's bias); got True")
            if cfg.normalize_activations != "none":
                raise ValueError(f"{name} supports normalize_activations='none' only, got "
                                 f"{cfg.normalize_activations!r}")
            if cfg.reshape_activations != "none":
                raise ValueError(f"{name} supports reshape_activations='none' only, got "
                                 f"{cfg.reshape_activations!r}")
        super().__init__(cfg, device, dtype)

    def fold_activation_norm_scaling_factor(self, scaling_factor: float) -> None:
        raise ValueError(f"folding an input normalisation into a {self.architecture} (input and output at "
                         "different hooks) is not supported")

    def fold_activation_whitening(self, mean: Tensor, whitening_matrix: Tensor, unwhitening_matrix: Tensor) -> None:
        raise ValueError(f"folding an input whitening into a {self.architecture} (input and output at "
                         "different hooks) is not supported")


class SkipTranscoder(Transcoder):
    """ReLU transcoder with a linear skip (SAELens's "skip_transcoder"): ``forward(x) =
    decode(encode(x)) + x @ W_skip.T``, ``W_skip`` [d_out d_in] (zeros at first). ``decode`` alone has no
    skip term (SAELens's ``decode``); a splice writes ``forward``."""

    architecture = "skip_transcoder"

    def add_parameters(self, factory: dict) -> None:
        self.W_skip = nn.Parameter(torch.zeros(self.cfg.d_output, self.cfg.d_in, **factory))

    def skip(self, x: Tensor) -> Optional[Tensor]:
        return x.to(self.dtype) @ self.W_skip.T


class JumpReLUTranscoder(Transcoder):
    """JumpReLU transcoder (SAELens's "jumprelu_transcoder"): ``relu(pre) * (pre > threshold)``."""

    architecture = "jumprelu_transcoder"

    def add_parameters(self, factory: dict) -> None:
        self.threshold = nn.Parameter(torch.zeros(self.cfg.d_sae, **factory))

    def activation(self, hidden_pre: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_sae"]:
        return hidden_pre.relu() * (hidden_pre > self.threshold).to(hidden_pre.dtype)

    def fold_extra(self, norms: Tensor) -> None:
        self.threshold.mul_(norms)


class JumpReLUSkipTranscoder(JumpReLUTranscoder):
    """JumpReLU transcoder with ``W_skip`` (SAELens's "jumprelu_skip_transcoder")."""

    architecture = "jumprelu_skip_transcoder"

    def add_parameters(self, factory: dict) -> None:
        super().add_parameters(factory)
        self.W_skip = nn.Parameter(torch.zeros(self.cfg.d_output, self.cfg.d_in, **factory))

    def skip(self, x: Tensor) -> Optional[Tensor]:
        return x.to(self.dtype) @ self.W_skip.T


TRANSCODERS = ("transcoder", "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder")

ARCHITECTURES: dict = {}


def register_architecture(cls: type) -> type:
    """Add an SAE class to the registry under its ``architecture`` name (refuses a second one)."""
    if not (isinstance(cls, type) and issubclass(cls, SAE)):
        raise TypeError(f"register_architecture takes an SAE subclass, got {cls!r}")
    if cls.architecture in ARCHITECTURES and ARCHITECTURES[cls.architecture] is not cls:
        raise ValueError(f"architecture {cls.architecture!r} is already {ARCHITECTURES[cls.architecture].__name__}")
    ARCHITECTURES[cls.architecture] = cls
    return cls


for _cls in (StandardSAE, TopKSAE, BatchTopKSAE, JumpReLUSAE, GatedSAE, Transcoder, SkipTranscoder,
             JumpReLUTranscoder, JumpReLUSkipTranscoder):
    register_architecture(_cls)


def sae_class(architecture: str) -> type:
    """The class registered for ``architecture``; an unknown name is refused with the known ones."""
    if architecture not in ARCHITECTURES:
        from ...suggest import did_you_mean

        raise ValueError(f"unknown SAE architecture {architecture!r}{did_you_mean(architecture, ARCHITECTURES)}; "
                         f"known: {', '.join(sorted(ARCHITECTURES))}")
    return ARCHITECTURES[architecture]


def make_sae(cfg: SAEConfig, device: Union[str, torch.device, None] = None,
             dtype: Optional[torch.dtype] = torch.float32) -> SAE:
    """A freshly initialised SAE of ``cfg.architecture`` on ``device`` in ``dtype``."""
    if not isinstance(cfg, SAEConfig):
        raise TypeError(f"make_sae needs a glassbox SAEConfig, got {type(cfg).__name__}")
    return sae_class(cfg.architecture)(cfg, device=device, dtype=torch.float32 if dtype is None else dtype)
