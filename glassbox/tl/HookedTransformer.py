"""TransformerLens's HookedTransformer: glassbox's model with TransformerLens's config, constructor,
loading defaults, forward argument order and run_with_cache signature.

``HookedTransformer`` subclasses ``glassbox.HookedTransformer``: the computation, hooks and every
glassbox method are glassbox's own; only the surface differs. ``model.cfg`` is a
``HookedTransformerConfig`` (TransformerLens's fields; glassbox's delegated to ``model.cfg.glassbox``).

- ``HookedTransformer(cfg, tokenizer=None, move_to_device=True, default_padding_side="right")``:
  ``cfg`` a HookedTransformerConfig or a dict of its fields; the model is built on ``cfg.device``
  (unless ``move_to_device=False``) in ``cfg.dtype``. Weights are glassbox's initialisation (normal,
  std ``initializer_range``, residual writers scaled by 1/sqrt(2 n_layers)): the distribution family of
  TransformerLens's, not its values for a given seed.
- ``from_pretrained(name, fold_ln=True, center_writing_weights=True, center_unembed=True,
  refactor_factored_attn_matrices=False, fold_value_biases=True, ...)``: TransformerLens's processing
  defaults (glassbox's own ``from_pretrained`` processes nothing). ``from_pretrained_no_processing``
  turns every step off. ``from_glassbox(model, ...)`` does the same for an in-memory glassbox model;
  ``load_and_process_state_dict`` and ``process_weights_`` process in place, as in TransformerLens
  (a TransformerLens state dict loads too).
- ``forward`` takes TransformerLens's positional order (input, return_type, loss_per_token,
  prepend_bos, padding_side, start_at_layer, tokens, shortformer_pos_embed, attention_mask,
  stop_at_layer, past_kv_cache); ``padding_side=None`` (also in ``to_tokens``) is the model's
  ``default_padding_side``, its tokenizer's ``padding_side``: the model owns a copy of its tokenizer, with
  pad = eos where it had no pad token, as in TransformerLens (``_tokenizer``). ``run_with_cache`` takes TransformerLens's arguments (``tl_run_with_cache``).

Processing, as TransformerLens 3.9 does it: ``fold_ln`` folds each norm into its readers, and for
LayerNorm also removes the readers' d_model mean (glassbox's ``center_reader_weights``);
``cfg.normalization_type`` becomes "LNPre" / "RMSPre" (glassbox keeps the norm, with w = 1 and
b = 0). ``center_writing_weights`` applies to LayerNorm models only (RMSNorm models are left as they
are, as in TransformerLens). Post-norm models skip ``fold_ln`` and ``center_writing_weights`` with a
warning, as TransformerLens does for post-norm architectures.
"""

import warnings
from collections.abc import Mapping
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from ..hooks import HookedRootModule  # noqa: F401  (TransformerLens code imports it from here)
from ..models import HookedTransformer as _GlassboxTransformer
from ..models import PosEmbed as _GlassboxPosEmbed
from ..models import gpt2_tokenizer
from .components.norms import give_tl_classes
from .components.pos_embed import PosEmbed
from .config.fields import FLAGS
from .config.hooked_transformer_config import HookedTransformerConfig, default_device
from ._run_with_cache import tl_run_with_cache
from ._tokenizer import TokenizerConventions
from .loading_from_pretrained import (GPT2_TOKENIZER_NAMES, TOKENIZER_FILES, checkpoint_fields, get_official_model_name,
                                      tl_format_tokenizer)

Loss = Tensor  # a 0-d mean loss, or [batch pos-1] per token
Output = Union[None, Tensor, Loss, Tuple[Tensor, Loss]]

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
# TransformerLens's table of the dtype names from_pretrained takes (glassbox's DTYPES adds float64).
DTYPE_FROM_STRING = {name: DTYPES[name] for name in ("float32", "fp32", "float16", "fp16", "bfloat16", "bf16")}


def _tokenizer_named(name: str):
    if name in GPT2_TOKENIZER_NAMES:
        return gpt2_tokenizer()  # shipped with glassbox: no download
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)


def _tokenizer_name(official: str, tokenizer, base, hf_model) -> Optional[str]:
    """``cfg.tokenizer_name``: where ``AutoTokenizer.from_pretrained`` finds the model's tokenizer, as in
    TransformerLens (code such as circuit-tracer's frontend export reloads it from there): GPT-2's
    names; the config's tokenizer_name for a model in TransformerLens's own format; a folder holding
    tokenizer files, or a hub repo id, that the tokenizer was loaded from.
    None for a tokenizer passed in, an ``hf_model``, or a shipped model's."""
    from pathlib import Path

    from ..weights.pretrained import is_hub_repo_id

    if official in GPT2_TOKENIZER_NAMES:
        return official
    if tokenizer is not None or hf_model is not None or base._tokenizer is None:
        return None
    folder = Path(str(official)).expanduser()
    own = tl_format_tokenizer(str(official))
    if own is not None:  # TransformerLens's own-format models name their tokenizer's repo
        return own
    if folder.is_dir():
        return str(official) if any((folder / name).is_file() for name in TOKENIZER_FILES) else None
    return str(official) if is_hub_repo_id(str(official)) else None


def as_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r} is not one of {', '.join(DTYPES)}")
        return DTYPES[dtype]
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype or its name, got {dtype!r}")
    return dtype


class HookedTransformer(TokenizerConventions, _GlassboxTransformer):
    """glassbox's HookedTransformer with TransformerLens's surface (see the module docstring)."""

    def __init__(self, cfg, tokenizer=None, move_to_device: bool = True,
                 default_padding_side: Optional[str] = "right"):
        if isinstance(cfg, str):
            raise ValueError("HookedTransformer(cfg) takes a HookedTransformerConfig or a dict; to load a pretrained "
                             f"model use HookedTransformer.from_pretrained({cfg!r})")
        tl_cfg = HookedTransformerConfig.unwrap(cfg)
        if tl_cfg._model is not None:  # a config belongs to one model; this one gets a copy
            import copy

            tl_cfg = copy.deepcopy(tl_cfg)
        if tokenizer is None and tl_cfg.tokenizer_name is not None:
            tokenizer = _tokenizer_named(tl_cfg.tokenizer_name)
        if tokenizer is not None and tl_cfg._glassbox is not None:
            from ..weights.pretrained import check_tokenizer

            check_tokenizer(tokenizer, tl_cfg.glassbox, "the tokenizer given" if tl_cfg.tokenizer_name is None
                            else f"tokenizer_name={tl_cfg.tokenizer_name!r}")
        if tl_cfg._glassbox is None:
            if tokenizer is None:
                raise ValueError("HookedTransformerConfig has d_vocab=-1: give d_vocab, or a tokenizer (or "
                                 "tokenizer_name) to take it from")
            tl_cfg._complete(max(tokenizer.get_vocab().values()) + 1)
        if default_padding_side not in ("left", "right", None):
            raise ValueError(f"default_padding_side must be 'left' or 'right', got {default_padding_side!r}")
        values = tl_cfg._values
        flags = {name: values[name] for name in FLAGS}
        device = values["device"] if move_to_device else None
        super().__init__(tl_cfg.glassbox, tokenizer=tokenizer, init=bool(values["init_weights"]), device=device,
                         dtype=as_dtype(values["dtype"]), **self._flag_kwargs(flags))
        self.default_padding_side = default_padding_side  # None keeps the tokenizer's own side (TransformerLens)
        if type(self.pos_embed) is _GlassboxPosEmbed:  # the same module and parameter, TransformerLens's forward
            self.pos_embed.__class__ = PosEmbed
        folded = values["normalization_type"] in ("LNPre", "RMSPre")
        if folded and not values["init_weights"]:
            self._reset_norms()
        give_tl_classes(self, folded)  # TransformerLens's norm classes, the same modules
        self.cfg = tl_cfg
        tl_cfg._bind(self)

    @staticmethod
    def _flag_kwargs(flags: dict) -> dict:
        from ..models.hook_flags import HookFlags

        return {"hook_flags": HookFlags(**flags)}

    @torch.no_grad()
    def _reset_norms(self) -> None:
        """LNPre / RMSPre: every norm at w = 1, b = 0 (the identity affine map)."""
        for name, param in self.named_parameters():
            if name.startswith("ln_final.") or ".ln1." in name or ".ln2." in name or ".mlp.ln." in name:
                param.fill_(1.0 if name.endswith(".w") else 0.0)

    # -- loading -------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, model_name: str, fold_ln: bool = True, center_writing_weights: bool = True,
                        center_unembed: bool = True, refactor_factored_attn_matrices: bool = False,
                        checkpoint_index: Optional[int] = None, checkpoint_value: Optional[int] = None,
                        checkpoint_label: Optional[int] = None, hf_model=None, device=None, n_devices: int = 1,
                        tokenizer=None, move_to_device: bool = True, fold_value_biases: bool = True,
                        default_prepend_bos: Optional[bool] = None, default_padding_side: Optional[str] = "right",
                        dtype=torch.float32, first_n_layers: Optional[int] = None, n_ctx: Optional[int] = None,
                        **from_pretrained_kwargs) -> "HookedTransformer":
        """Load a model glassbox can load (``loading_from_pretrained.OFFICIAL_MODEL_NAMES``, a local
        folder, or ``hf_model``) and process its weights with TransformerLens's defaults."""
        from ..weights import from_hf
        from ..weights import from_pretrained as load
        from ..weights.architectures import architecture_of_type
        from ..weights.pretrained import architecture_of

        if "torch_dtype" in from_pretrained_kwargs:  # TransformerLens's older name wins, as there
            dtype = from_pretrained_kwargs.pop("torch_dtype")
        if checkpoint_label is not None:  # TransformerLens's older name of checkpoint_value
            if checkpoint_value is not None:
                raise ValueError("give checkpoint_value or checkpoint_label, not both: they are the same argument")
            checkpoint_value = checkpoint_label
        revision = from_pretrained_kwargs.pop("revision", None)
        refused = dict(first_n_layers=first_n_layers, n_ctx=n_ctx)
        for name, value in refused.items():
            if value is not None:
                raise ValueError(f"from_pretrained({name}={value!r}) is not supported by glassbox: it loads the "
                                 "weights of a model as they are")
        if n_devices != 1:
            raise ValueError(f"from_pretrained(n_devices={n_devices}) is not supported: glassbox puts a model on one device")
        if from_pretrained_kwargs:
            raise TypeError(f"from_pretrained got options glassbox does not support: {', '.join(from_pretrained_kwargs)}")
        dtype = "auto" if isinstance(dtype, str) and dtype == "auto" else as_dtype(dtype)  # "auto": glassbox's loader
        where = (device if device is not None else default_device()) if move_to_device else "cpu"
        checkpoint = dict(from_checkpoint=False)
        if hf_model is not None:
            if revision is not None or checkpoint_index is not None or checkpoint_value is not None:
                raise ValueError("from_pretrained(hf_model=...) takes the given model's weights: a revision or "
                                 "checkpoint would not be loaded, so give one or the other")
            base = from_hf(hf_model, tokenizer=tokenizer, device=where, dtype=dtype)
            official = model_name
            architecture = architecture_of_type(getattr(hf_model.config, "model_type", None),
                                                hf_architectures=[type(hf_model).__name__]).hf_model_class
        else:
            official = get_official_model_name(model_name)
            revision, checkpoint = checkpoint_fields(official, checkpoint_index, checkpoint_value, revision)
            base = load(official, device=where, dtype=dtype, tokenizer=tokenizer, revision=revision)
            arch = architecture_of(official, revision=revision)  # None: TransformerLens's own format
            architecture = arch.hf_model_class if arch is not None else None
        return cls.from_glassbox(base, fold_ln=fold_ln, center_writing_weights=center_writing_weights,
                                 center_unembed=center_unembed, fold_value_biases=fold_value_biases,
                                 refactor_factored_attn_matrices=refactor_factored_attn_matrices,
                                 default_prepend_bos=default_prepend_bos, default_padding_side=default_padding_side,
                                 move_to_device=move_to_device, model_name=str(official),
                                 tokenizer_name=_tokenizer_name(official, tokenizer, base, hf_model),
                                 checkpoint=checkpoint, original_architecture=architecture)

    @classmethod
    def from_glassbox(cls, model: _GlassboxTransformer, fold_ln: bool = True, center_writing_weights: bool = True,
                      center_unembed: bool = True, refactor_factored_attn_matrices: bool = False,
                      fold_value_biases: bool = True, default_prepend_bos: Optional[bool] = None,
                      default_padding_side: Optional[str] = "right", move_to_device: bool = True,
                      model_name: Optional[str] = None, tokenizer_name: Optional[str] = None,
                      checkpoint: Optional[dict] = None,
                      original_architecture: Optional[str] = None) -> "HookedTransformer":
        """This class's model of a glassbox model's weights, processed as ``from_pretrained`` processes
        them (same defaults); on the glassbox model's device and dtype, with its hook flags. The model
        passed in is unchanged. ``original_architecture``: the Hugging Face class the weights came from
        (default: the first that can represent the config, GPT-2's for a pre-LN OPT model)."""
        from ..weights.architectures import architecture_of_config
        from ..weights.processing import process_state_dict

        gcfg = model.cfg.glassbox if isinstance(model.cfg, HookedTransformerConfig) else model.cfg
        if model.processing:
            raise ValueError(f"the model's weights are processed already ({', '.join(model.processing)}); "
                             "pass a model with its original weights")
        steps = tl_steps(gcfg, fold_ln, center_writing_weights, center_unembed, fold_value_biases,
                         refactor_factored_attn_matrices)
        fold_ln = "fold_ln" in steps
        architecture = original_architecture
        if architecture is None:
            try:
                architecture = architecture_of_config(gcfg).hf_model_class
            except ValueError:
                architecture = None  # a glassbox-only combination: no Hugging Face class
        state, gcfg = process_state_dict({k: v.detach() for k, v in model.state_dict().items()}, gcfg, steps)
        if model_name is not None:
            gcfg = gcfg.replace(model_name=model_name)
        first = next(model.parameters())
        tl_fields = dict(normalization_type=gcfg.normalization + ("Pre" if fold_ln else ""), dtype=first.dtype,
                         device=str(first.device), original_architecture=architecture, tokenizer_name=tokenizer_name,
                         init_weights=False, layer_norm_folding=fold_ln, **model.hook_flags.as_dict(),
                         **(checkpoint or {}))
        if default_prepend_bos is not None:
            tl_fields["default_prepend_bos"] = default_prepend_bos
        tl_cfg = HookedTransformerConfig.from_glassbox(gcfg, **tl_fields)
        out = cls(tl_cfg, tokenizer=model._tokenizer, move_to_device=move_to_device,
                  default_padding_side=default_padding_side)
        out.load_state_dict(state, strict=True)
        out.cfg._values["init_weights"] = True
        out.processing = tuple(steps)
        return out.eval()

    @classmethod
    def from_pretrained_no_processing(cls, model_name: str, fold_ln: bool = False, center_writing_weights: bool = False,
                                      center_unembed: bool = False, refactor_factored_attn_matrices: bool = False,
                                      fold_value_biases: bool = False, dtype=torch.float32,
                                      default_prepend_bos: Optional[bool] = None,
                                      default_padding_side: Optional[str] = "right", **from_pretrained_kwargs):
        """``from_pretrained`` with every processing step off: logits equal Hugging Face's."""
        return cls.from_pretrained(model_name, fold_ln=fold_ln, center_writing_weights=center_writing_weights,
                                   center_unembed=center_unembed, fold_value_biases=fold_value_biases,
                                   refactor_factored_attn_matrices=refactor_factored_attn_matrices, dtype=dtype,
                                   default_prepend_bos=default_prepend_bos, default_padding_side=default_padding_side,
                                   **from_pretrained_kwargs)

    def load_and_process_state_dict(self, state_dict, fold_ln: bool = True, center_writing_weights: bool = True,
                                    center_unembed: bool = True, fold_value_biases: bool = True,
                                    refactor_factored_attn_matrices: bool = False) -> None:
        """Load a state dict (TransformerLens's names and layout, or glassbox's) into this model and process
        it as ``from_pretrained`` does, in place; ``cfg.normalization_type`` becomes "LNPre"/"RMSPre" after
        fold_ln. TransformerLens's ``unembed.W_U`` [d_model d_vocab] is glassbox's ``unembed.W_U_T``
        transposed; norm weights an LNPre state dict leaves out are the identity (w = 1, b = 0), and a
        missing bias (TransformerLens's gated MLP has no b_gate) is zero, as TransformerLens fills them. Every
        requested step is applied to the state dict given (as TransformerLens does: what this model's own
        weights went through says nothing about it), and ``model.processing`` becomes those steps. Refused,
        before anything changes, naming the key: a missing or unexpected key (``KeysError``, a KeyError and
        ValueError; TransformerLens ignores unexpected ones), a shape this model does not have, a value that
        is not a finite floating tensor (``glassbox.weights.checks.check_state_dict``); and when the
        processed weights would need a different model (a tied unembedding)."""
        steps = tl_steps(self.cfg.glassbox, fold_ln, center_writing_weights, center_unembed, fold_value_biases,
                         refactor_factored_attn_matrices)
        self._load_processed(state_dict, steps)
        self.processing = tuple(steps)

    def _load_processed(self, state_dict, steps: list) -> None:
        from ..weights.checks import check_state_dict
        from ..weights.processing import process_state_dict

        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a mapping of parameter name to tensor, got {type(state_dict).__name__}")
        sd = {k: v for k, v in state_dict.items() if not k.endswith((".mask", ".IGNORE")) and "rotary_" not in k}
        renamed = {}
        if "unembed.W_U" in sd:
            W_U = sd.pop("unembed.W_U")
            sd["unembed.W_U_T"] = W_U.transpose(0, 1) if isinstance(W_U, Tensor) and W_U.ndim == 2 else W_U
            renamed["unembed.W_U_T"] = "unembed.W_U"
        for key in [k for k in sd if ".attn._" in k]:  # TransformerLens's grouped _W_K, _W_V, _b_K, _b_V
            sd[key.replace(".attn._", ".attn.")] = sd.pop(key)
        own = self.state_dict()
        for key, value in own.items():
            if key not in sd and (".ln" in key or key.startswith("ln_final.")):
                sd[key] = torch.ones_like(value) if key.endswith(".w") else torch.zeros_like(value)
            elif key not in sd and key.rsplit(".", 1)[-1].startswith("b_"):
                sd[key] = torch.zeros_like(value)
        own_shapes = {k: tuple(v.shape) for k, v in own.items()}
        check_state_dict(sd, own_shapes, "state_dict", renamed, exempt=("unembed.W_U_T",))  # before any change
        processed, gcfg = process_state_dict(sd, self.cfg.glassbox, steps)
        if gcfg != self.cfg.glassbox:
            raise ValueError(f"the processed weights need a different model ({gcfg} instead of {self.cfg.glassbox}); "
                             "use HookedTransformer.from_glassbox or from_pretrained")
        self.load_state_dict(processed, strict=True)
        if "fold_ln" in steps:
            self.cfg._values["normalization_type"] = gcfg.normalization + "Pre"
            self.cfg._values["layer_norm_folding"] = True
            give_tl_classes(self, True)

    def process_weights_(self, fold_ln: bool = True, center_writing_weights: bool = True, center_unembed: bool = True,
                         refactor_factored_attn_matrices: bool = False) -> None:
        """Process this model's own weights in place; steps already applied (``model.processing``) are skipped."""
        steps = [step for step in tl_steps(self.cfg.glassbox, fold_ln, center_writing_weights, center_unembed, True,
                                           refactor_factored_attn_matrices) if step not in self.processing]
        self._load_processed(self.state_dict(), steps)
        self.processing = tuple(self.processing) + tuple(steps)

    def move_model_modules_to_device(self) -> "HookedTransformer":
        return self.to(self.cfg._values["device"])

    def set_tokenizer(self, tokenizer, default_padding_side: Optional[str] = None) -> None:
        """Use ``tokenizer``; ``default_padding_side`` (None: the tokenizer's) becomes the model's default.
        A tokenizer with fewer tokens than ``cfg.d_vocab`` is fine (Pythia pads its embedding to 50304);
        one with more is a ValueError naming both sizes, since its extra ids have no embedding."""
        from ..weights.pretrained import check_tokenizer

        if default_padding_side not in ("left", "right", None):
            raise ValueError(f"default_padding_side must be 'left', 'right' or None, got {default_padding_side!r}")
        if self.cfg.d_vocab != -1:
            check_tokenizer(tokenizer, self.cfg, "set_tokenizer")
        self.tokenizer = tokenizer  # the model's own copy, pad = eos (see _tokenizer)
        self.default_padding_side = default_padding_side

    def cfg_device(self) -> torch.device:
        """The device tokens go to: the parameters', or ``cfg.device`` for an object whose nn.Module was never
        initialised (a subclass that only sets ``cfg`` and a tokenizer, as TransformerLens allows)."""
        if "_parameters" not in self.__dict__:
            return torch.device(self.cfg.device if self.cfg.device is not None else "cpu")
        return super().cfg_device()

    def init_weights(self) -> None:
        """Initialise every weight again (glassbox's scheme; see the module docstring)."""
        from ..models.init import init_weights

        with torch.no_grad():
            init_weights(self, self.cfg.glassbox)

    def set_ungroup_grouped_query_attention(self, ungroup_grouped_query_attention: bool) -> None:
        """Recorded only: glassbox's attention has a key and value per head, so there is nothing to ungroup."""
        self.cfg._values["ungroup_grouped_query_attention"] = bool(ungroup_grouped_query_attention)

    # -- TransformerLens's weight views: [layer ...] copies; a bias the model does not have reads as zeros,
    # which is what TransformerLens holds for it and what it computes.
    def _bias(self, module: str, name: str, shape: tuple) -> Tensor:
        rows = []
        for block in self.blocks:
            part = getattr(block, module, None)
            if part is None:
                raise AttributeError(f"{name}: block {block.layer} has no {module} (an attention-only model)")
            value = getattr(part, name, None)
            rows.append(value if value is not None else self.W_E.new_zeros(shape))
        return torch.stack(rows)

    b_Q = property(lambda self: self._bias("attn", "b_Q", (self.cfg.n_heads, self.cfg.d_head)),
                   doc="[layer head d_head]")
    b_K = property(lambda self: self._bias("attn", "b_K", (self.cfg.n_heads, self.cfg.d_head)),
                   doc="[layer head d_head]")
    b_V = property(lambda self: self._bias("attn", "b_V", (self.cfg.n_heads, self.cfg.d_head)),
                   doc="[layer head d_head]")
    b_O = property(lambda self: self._bias("attn", "b_O", (self.cfg.d_model,)), doc="[layer d_model]")
    b_in = property(lambda self: self._bias("mlp", "b_in", (self.cfg.d_mlp,)), doc="[layer d_mlp]")
    b_out = property(lambda self: self._bias("mlp", "b_out", (self.cfg.d_model,)), doc="[layer d_model]")

    @property
    def b_U(self) -> Tensor:
        """[d_vocab]; zeros where the model has no unembedding bias."""
        value = getattr(self.unembed, "b_U", None)
        return value if value is not None else self.W_E.new_zeros(self.cfg.d_vocab)

    @property
    def W_gate(self) -> Optional[Tensor]:
        """[layer d_model d_mlp] of a gated MLP, else None (as in TransformerLens)."""
        return self._stacked("mlp", "W_gate") if self.cfg.gated_mlp else None

    @property
    def W_E_pos(self) -> Tensor:
        """[d_vocab+n_ctx d_model]: the token and position embeddings, stacked."""
        return torch.cat([self.W_E, self.W_pos], dim=0)

    @property
    def n_params_total(self) -> int:
        """Every parameter's element count (``cfg.n_params`` counts the attention and MLP matrices only)."""
        return sum(p.numel() for p in self.parameters())

    def all_composition_scores(self, mode: str) -> Tensor:
        """[layer head layer head] Q, K or V composition scores; see ``glassbox.interp.composition``."""
        from ..interp.composition import all_composition_scores

        return all_composition_scores(self, mode)

    # -- running -------------------------------------------------------------------------------
    def forward(self, input, return_type: Optional[str] = "logits", loss_per_token: bool = False,
                prepend_bos: Optional[bool] = None, padding_side: Optional[str] = None,
                start_at_layer: Optional[int] = None, tokens: Optional[Tensor] = None,
                shortformer_pos_embed: Optional[Tensor] = None, attention_mask: Optional[Tensor] = None,
                stop_at_layer: Optional[int] = None, past_kv_cache=None):
        """TransformerLens's forward; see ``glassbox.HookedTransformer.forward`` for each argument."""
        if shortformer_pos_embed is not None:
            raise ValueError("shortformer_pos_embed is not supported: glassbox has no shortformer positions")
        if isinstance(start_at_layer, int) and -self.cfg.n_layers <= start_at_layer < 0:
            start_at_layer += self.cfg.n_layers  # TransformerLens slices the blocks: -1 is the last block
        if attention_mask is None and start_at_layer is None:
            attention_mask = self._pads_of_ids(input, prepend_bos, padding_side, past_kv_cache)
        return super().forward(input, return_type=return_type, loss_per_token=loss_per_token,
                               attention_mask=attention_mask, prepend_bos=prepend_bos,
                               padding_side=padding_side, stop_at_layer=stop_at_layer,
                               past_kv_cache=past_kv_cache, start_at_layer=start_at_layer, tokens=tokens)

    def to_tokens(self, input, prepend_bos: Optional[bool] = None, padding_side: Optional[str] = None,
                  move_to_device: bool = True, truncate: bool = True) -> Tensor:
        """TransformerLens's to_tokens: ``truncate=True`` (TransformerLens's default) keeps each row's first n_ctx
        tokens, ``truncate=False`` every token; ``padding_side=None`` is the model's ``default_padding_side``."""
        return super().to_tokens(input, prepend_bos, padding_side, move_to_device, truncate)

    def generate(self, *args, **kwargs):
        """TransformerLens's generate (its argument names, defaults and return types); see
        ``glassbox.models.generate.generate_tl_style``."""
        from ..models.generate import generate_tl_style

        return generate_tl_style(self, *args, **kwargs)

    def get_caching_hooks(self, names_filter=None, incl_bwd: bool = False, device=None,
                          remove_batch_dim: bool = False, cache: Optional[dict] = None, pos_slice=None) -> tuple:
        """TransformerLens's (cache, fwd_hooks, bwd_hooks); see ``glassbox.tl._caching_hooks``."""
        from ._caching_hooks import get_caching_hooks

        return get_caching_hooks(self, names_filter, incl_bwd, device, remove_batch_dim, cache, pos_slice)

    def run_with_cache(self, *model_args, names_filter=None, device=None, remove_batch_dim: bool = False,
                       incl_bwd: bool = False, reset_hooks_end: bool = True, clear_contexts: bool = False,
                       pos_slice=None, return_cache_object: bool = True, **model_kwargs):
        """TransformerLens's run_with_cache; see ``tl_run_with_cache``."""
        return tl_run_with_cache(self, model_args, names_filter=names_filter, device=device,
                              remove_batch_dim=remove_batch_dim, incl_bwd=incl_bwd, reset_hooks_end=reset_hooks_end,
                              clear_contexts=clear_contexts, pos_slice=pos_slice,
                              return_cache_object=return_cache_object, **model_kwargs)


def tl_steps(gcfg, fold_ln: bool, center_writing_weights: bool, center_unembed: bool, fold_value_biases: bool,
             refactor_factored_attn_matrices: bool) -> list:
    """glassbox's processing steps for TransformerLens's flags: fold_ln of a LayerNorm also centres its
    readers; center_writing_weights only for pre-norm LayerNorm models; post-norm models skip both, and
    sandwich / output-norm models the centring, and a logit soft cap skips center_unembed, with a warning
    (as TransformerLens does)."""
    if gcfg.norm_placement == "post" and (fold_ln or center_writing_weights):
        warnings.warn(f"{gcfg.model_name} is a post-norm model: fold_ln and center_writing_weights do not apply to "
                      "it and are skipped (as TransformerLens does for post-norm architectures)", stacklevel=4)
        fold_ln = center_writing_weights = False
    if gcfg.norm_placement in ("sandwich", "output") and center_writing_weights and gcfg.normalization == "LN":
        warnings.warn(f"{gcfg.model_name} writes into the residual stream through norms (norm_placement="
                      f"{gcfg.norm_placement!r}): center_writing_weights does not apply and is skipped", stacklevel=4)
    if gcfg.norm_placement != "pre":
        center_writing_weights = False
    if center_unembed and gcfg.output_logits_soft_cap is not None:
        warnings.warn(f"{gcfg.model_name} soft-caps its logits: center_unembed would change its predictions and is "
                      "skipped (as TransformerLens does)", stacklevel=4)
        center_unembed = False
    layer_norm = gcfg.normalization == "LN"
    steps = []
    if fold_ln:
        steps += ["fold_ln"] + (["center_reader_weights"] if layer_norm else [])
    if center_writing_weights and layer_norm:  # TransformerLens centres for LayerNorm only
        steps.append("center_writing_weights")
    for name, chosen in (("center_unembed", center_unembed), ("fold_value_biases", fold_value_biases),
                         ("refactor_factored_attn_matrices", refactor_factored_attn_matrices)):
        if chosen:
            steps.append(name)
    return steps
