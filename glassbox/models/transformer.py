"""HookedTransformer: the residual-stream model, and only the computation.

``forward`` takes token ids [batch pos] (or text, tokenized with the BOS policy of
``tokenize.py``) and returns logits, the loss, both, or nothing. Loading, generating and analysis
live in ``glassbox.weights`` and ``glassbox.interp``; the methods at the bottom of this class are thin
entry points into those layers, kept here because notebooks call them on the model.

Footgun: hooks are state on the model. ``run_with_hooks`` and ``with model.hooks(...)`` clean up;
``add_hook`` does not. They are the model's, not the thread's: while a ``hooks(...)`` block,
``run_with_hooks`` or ``generate`` holds them, a forward from another thread raises RuntimeError
(``glassbox.hooks.threads``); use one model per thread (``copy.deepcopy``) or serialise the calls.

Hook flags (``hook_flags.py``, TransformerLens's names): ``model.hook_flags`` is a HookFlags shared by
the blocks and attention layers; ``set_use_attn_result``, ``set_use_split_qkv_input``,
``set_use_attn_in`` and ``set_use_hook_mlp_in`` (or writing a field) turn their hook points on and
put them into ``hook_dict``. A gated name asked for while its flag is off raises KeyError naming the
flag and its setter; a refused combination or turning a flag off under attached hooks raises
HookFlagError, changing nothing. With every flag off the forward is the unflagged one.

Devices: ``place(device_map)`` (or ``from_pretrained(device_map=..., n_devices=...)``) puts each block,
the embeddings, the final norm and the unembedding on its own device; ``run_blocks`` then moves the
residual stream at stage boundaries only (``devices.py`` has the plan forms and the footguns).
"""

from typing import Optional, Union

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor, nn

from ..hooks import HookedRootModule, HookPoint
from . import components, devices, inputs
from .block_variants import block
from .config import Config
from .embed import Embed, Unembed
from .hook_flags import HookFlagError, HookFlags, check_flags, gating_flag, setter_name
from .init import init_weights
from .kv_cache import KVCache
from .loss import lm_loss
from .masks import attention_mask_for, positions_for
from .methods import ModelMethods
from .sae_methods import SAEMethods
from .tokenize import TokenizerMixin

RETURN_TYPES = ("logits", "loss", "both", None)


class HookedTransformer(ModelMethods, SAEMethods, TokenizerMixin, HookedRootModule):
    def __init__(self, cfg: Config, tokenizer=None, init: bool = True,
                 device: Union[str, torch.device, None] = None, dtype: torch.dtype = torch.float32,
                 hook_flags: Optional[HookFlags] = None):
        super().__init__()
        self._device_plan = None  # a devices.DevicePlan once placed across devices (see place)
        if not isinstance(cfg, Config):
            raise TypeError(f"HookedTransformer needs a glassbox Config, got {type(cfg).__name__}")
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r} (names and 'auto' are for "
                            "from_pretrained and from_hf)")
        if hook_flags is None:
            hook_flags = HookFlags()
        elif not isinstance(hook_flags, HookFlags):
            raise TypeError(f"hook_flags must be a glassbox HookFlags, got {type(hook_flags).__name__}")
        check_flags(cfg, hook_flags)
        self.cfg = cfg
        # Shared (the same object) with every block and attention layer, which read it per forward.
        self._hook_flags = hook_flags
        self._tokenizer = tokenizer
        if device is not None:
            devices.check_device(device, "HookedTransformer(device=...)")
        with torch.device(device if device is not None else "cpu"):
            self.embed = Embed(cfg)
            self.hook_embed = HookPoint()
            # None with rotary positions: they enter through the attention, not the residual stream.
            self.pos_embed = components.positional_embedding(cfg)
            if self.pos_embed is not None:
                self.hook_pos_embed = HookPoint()
            self.blocks = nn.ModuleList(block(cfg, layer, hook_flags) for layer in range(cfg.n_layers))
            components.share_rotary_tables(self.blocks)
            self.ln_final = components.final_norm(cfg)
            self.unembed = Unembed(cfg, self.embed)
        # Weight processing applied to this model's weights (see glassbox.weights.processing).
        self.processing: tuple = ()
        if init:
            init_weights(self, cfg)
        self.to(dtype)
        self.setup()
        hook_flags._add_owner(self)

    def __setstate__(self, state: dict) -> None:
        """A copied or unpickled model registers with its own copy of the flags (a copy has no owners)."""
        super().__setstate__(state)
        self.__dict__.setdefault("_device_plan", None)
        self._hook_flags._add_owner(self)

    # -- devices -----------------------------------------------------------------------------
    def place(self, device_map) -> "HookedTransformer":
        """Put the blocks (and embed, ln_final, unembed) on devices per ``device_map``: a dict of parts,
        a list of devices to split the blocks over, or "auto"/"balanced" (``glassbox.models.devices``).
        The residual stream then moves at stage boundaries only. Returns the model."""
        devices.place(self, device_map)
        return self

    @property
    def device_plan(self) -> Optional[devices.DevicePlan]:
        """Where each part runs (a ``DevicePlan``), or None for a model on one device."""
        return self._device_plan

    def to(self, *args, **kwargs):
        """``nn.Module.to``, its device checked first (``devices.check_device``): a backend this build lacks
        or a CUDA index past the last is a ValueError naming it, and nothing moves."""
        try:
            device = torch._C._nn._parse_to(*args, **kwargs)[0]
        except (RuntimeError, TypeError, ValueError):  # torch's parse fails first on "gpu" or an int index
            named = kwargs.get("device", args[0] if args else None)
            if isinstance(named, (str, int)) and not isinstance(named, bool):
                devices.check_device(named, "HookedTransformer.to")
            raise
        if device is not None:
            devices.check_device(device, "HookedTransformer.to")
        return super().to(*args, **kwargs)

    def _apply(self, fn, *args, **kwargs):
        # .to / .cuda / .half go through here: a plan the weights no longer match is rebuilt from them.
        out = super()._apply(fn, *args, **kwargs)
        devices.refresh(self)
        return out

    # -- hook flags --------------------------------------------------------------------------
    @property
    def hook_flags(self) -> HookFlags:
        """The model's HookFlags, shared by its blocks and attention layers: change its fields (or call the
        set_use_* methods); it cannot be replaced, since the components hold this object."""
        return self._hook_flags

    @hook_flags.setter
    def hook_flags(self, value) -> None:
        raise AttributeError("model.hook_flags cannot be replaced (the blocks share it); set its fields, e.g. "
                             "model.hook_flags.use_attn_result = True, or call model.set_use_attn_result(True)")

    def setup(self) -> None:
        """Name every hook point; ``hook_dict`` then holds those whose flag (if any) is on."""
        super().setup()
        self._all_hook_points = dict(self.hook_dict)
        self._sync_hook_dict()

    def _sync_hook_dict(self) -> None:
        # In place, in forward-construction order, so references to hook_dict stay current.
        flags = self.hook_flags
        self.hook_dict.clear()
        self.hook_dict.update((name, point) for name, point in self._all_hook_points.items()
                              if (flag := gating_flag(name)) is None or getattr(flags, flag))

    def _check_flag_change(self, flag: str, value: bool) -> None:
        """Raise (changing nothing) if ``flag`` may not become ``value`` on this model."""
        self.hook_guard.check_change(setter_name(flag))
        if getattr(self.hook_flags, flag) == value:
            return
        check_flags(self.cfg, HookFlags(**{**self.hook_flags.as_dict(), flag: value}))
        if not value:
            hooked = [name for name, point in self._all_hook_points.items()
                      if gating_flag(name) == flag and point.has_hooks]
            if hooked:
                raise HookFlagError(f"cannot turn {flag} off while hooks are attached to {', '.join(hooked)}; "
                                    "remove them first (reset_hooks(), or leave the hooks() block)")

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Compute each head's output separately at ``blocks.L.attn.hook_result`` [batch pos head d_model]."""
        self.hook_flags.use_attn_result = use_attn_result

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """Give each head its own q, k and v inputs at ``blocks.L.hook_q_input`` / ``hook_k_input`` /
        ``hook_v_input`` [batch pos head d_model]."""
        self.hook_flags.use_split_qkv_input = use_split_qkv_input

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """Give each head its own input (shared by its q, k, v) at ``blocks.L.hook_attn_in`` [batch pos head d_model]."""
        self.hook_flags.use_attn_in = use_attn_in

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """Expose the MLP's input (a copy of resid_mid) at ``blocks.L.hook_mlp_in`` [batch pos d_model]."""
        self.hook_flags.use_hook_mlp_in = use_hook_mlp_in

    def resolve_hook_names(self, name_or_filter):
        """As HookedRootModule's; a flag-gated name whose flag is off names the flag and its setter."""
        if isinstance(name_or_filter, str) and name_or_filter not in self.hook_dict \
                and name_or_filter in self._all_hook_points:
            flag = gating_flag(name_or_filter)
            raise KeyError(f"hook {name_or_filter!r} exists only while {flag} is on; turn it on with "
                           f"model.{setter_name(flag)}(True) (or hook_flags=HookFlags({flag}=True))")
        return super().resolve_hook_names(name_or_filter)

    # -- the computation ---------------------------------------------------------------------
    def forward(
        self,
        input: Union[str, list, Tensor, np.ndarray],
        return_type: Optional[str] = "logits",
        loss_per_token: bool = False,
        attention_mask: Union[Tensor, np.ndarray, list, None] = None,
        prepend_bos: Optional[bool] = None,
        padding_side: Optional[str] = "right",
        stop_at_layer: Optional[int] = None,
        past_kv_cache: Optional[KVCache] = None,
        start_at_layer: Optional[int] = None,
        tokens: Optional[Tensor] = None,
    ):
        """Run the model.

        Args:
            input: token ids [batch pos] (a tensor or numpy array), a string, or a list of strings
                (padded, with a mask).
            return_type: "logits" [batch pos d_vocab], "loss" (mean next-token cross-entropy over
                real tokens), "both" (logits, loss), or None (runs the blocks, skips the unembedding).
            loss_per_token: loss as [batch pos-1] instead of the mean (pads contribute 0).
            attention_mask: [batch pos], 1 for real tokens, 0 for padding (left or right).
            stop_at_layer: run only blocks[:stop_at_layer] and return the residual stream there.
            past_kv_cache: a KVCache from earlier calls; input then holds only the new tokens. If
                anything raises during the call, or with stop_at_layer (only some layers run), the cache
                is left exactly as it was.
            start_at_layer: input is the residual stream [batch pos d_model] entering this block;
                the earlier blocks and the embeddings are skipped. Pass ``tokens`` (of the residual
                stream's [batch pos]) for a loss.
        """
        guard = self.hook_guard
        me = guard.enter_forward()  # refuses a forward while another thread holds the hooks
        try:
            return self._forward(input, return_type, loss_per_token, attention_mask, prepend_bos, padding_side,
                                 stop_at_layer, past_kv_cache, start_at_layer, tokens)
        finally:
            guard.exit_forward(me)

    def _forward(self, input, return_type, loss_per_token, attention_mask, prepend_bos, padding_side,
                 stop_at_layer, past_kv_cache, start_at_layer, tokens):
        if return_type not in RETURN_TYPES:
            raise ValueError(f"return_type must be one of {RETURN_TYPES}, got {return_type!r}")
        inputs.check_flag("loss_per_token", loss_per_token)
        if past_kv_cache is not None and not isinstance(past_kv_cache, KVCache):
            raise TypeError(f"past_kv_cache must be a KVCache, got {type(past_kv_cache).__name__}")
        if start_at_layer is not None:
            return self.forward_from(input, start_at_layer, return_type, loss_per_token, attention_mask,
                                     stop_at_layer, tokens, past_kv_cache)
        if tokens is not None:
            raise ValueError("tokens= gives the loss's targets with start_at_layer only; without "
                             "start_at_layer the input is the tokens")
        tokens, attention_mask = self.input_to_tokens(input, attention_mask, prepend_bos, padding_side)
        past = len(past_kv_cache) if past_kv_cache is not None else 0
        self.check_tokens(tokens, past)
        if past_kv_cache is None:
            return self._run_tokens(tokens, attention_mask, None, 0, stop_at_layer, return_type, loss_per_token)
        past_kv_cache.check_fits(self.cfg.n_layers, tokens.shape[0])
        return self._with_cache(past_kv_cache, stop_at_layer, self._run_tokens, tokens, attention_mask,
                                past_kv_cache, past, stop_at_layer, return_type, loss_per_token)

    @staticmethod
    def _with_cache(past_kv_cache, stop_at_layer, run, *args):
        """``run(*args)``, leaving the cache as it was if it raises or only some layers ran."""
        saved = past_kv_cache.snapshot()
        try:
            out = run(*args)
        except BaseException:
            past_kv_cache.restore(saved)  # a half-extended cache would misplace every later token
            raise
        if stop_at_layer is not None:
            past_kv_cache.restore(saved)  # only the first layers ran: the cache is read, not extended
        return out

    def _run_tokens(self, tokens, attention_mask, past_kv_cache, past, stop_at_layer, return_type, loss_per_token):
        key_mask = attention_mask
        if past_kv_cache is not None:
            key_mask = past_kv_cache.extend_mask(attention_mask, tokens.shape)
        positions = positions_for(tokens, key_mask, past)
        attn_mask = self.layer_masks(key_mask, tokens.shape[1], past + tokens.shape[1], tokens.device)

        resid = self.hook_embed(self.embed(tokens))
        if self.pos_embed is not None:
            resid = resid + self.hook_pos_embed(self.pos_embed.lookup(positions))
        return self.run_blocks(resid, 0, stop_at_layer, positions, attn_mask, past_kv_cache, return_type,
                               tokens, attention_mask, loss_per_token)

    def forward_from(self, resid: Float[Tensor, "batch pos d_model"], start_at_layer: int, return_type,
                     loss_per_token: bool = False, attention_mask=None,
                     stop_at_layer: Optional[int] = None, tokens=None, past_kv_cache: Optional[KVCache] = None):
        """Continue a forward pass from the residual stream entering block ``start_at_layer``.

        With a ``past_kv_cache`` (which must be frozen: the blocks before ``start_at_layer`` do not run,
        so their layers could not grow with the others) the residual stream holds the new positions
        only; ``attention_mask`` is the new positions' [batch pos] or, as ``input_to_embed`` returns
        it, the cached and new positions' [batch past+pos], whose cached part must be the cache's."""
        if isinstance(start_at_layer, bool) or not isinstance(start_at_layer, int) \
                or not 0 <= start_at_layer <= self.cfg.n_layers:
            raise ValueError(f"start_at_layer={start_at_layer!r} is outside [0, n_layers={self.cfg.n_layers}]")
        if not isinstance(resid, Tensor) or resid.ndim != 3 or resid.shape[-1] != self.cfg.d_model:
            raise ValueError(f"with start_at_layer, input is the residual stream [batch pos d_model="
                             f"{self.cfg.d_model}], got {tuple(resid.shape) if isinstance(resid, Tensor) else resid!r}")
        if resid.dtype != self.embed.W_E.dtype:
            raise ValueError(f"the residual stream has dtype {resid.dtype}, the model {self.embed.W_E.dtype}")
        if resid.shape[1] > self.cfg.n_ctx:
            raise ValueError(f"residual stream of {resid.shape[1]} positions is longer than n_ctx={self.cfg.n_ctx}")
        if return_type in ("loss", "both") and tokens is None:
            raise ValueError("a loss from start_at_layer needs tokens=")
        batch_pos = tuple(resid.shape[:2])
        if tokens is not None:
            tokens = inputs.as_tokens(inputs.as_array_tensor(tokens, "tokens"), resid.device)
            if tuple(tokens.shape) != batch_pos:
                raise ValueError(f"tokens have shape {tuple(tokens.shape)}, the residual stream {batch_pos} "
                                 "(batch pos); the loss needs one target per position")
            self.check_tokens(tokens)
        if past_kv_cache is not None:
            return self._from_with_cache(resid, start_at_layer, return_type, loss_per_token, attention_mask,
                                         stop_at_layer, tokens, past_kv_cache)
        attention_mask = inputs.optional_mask(attention_mask, batch_pos, resid.device,
                                                "the residual stream has batch pos")
        positions = positions_for(resid[..., 0], attention_mask, 0)
        attn_mask = self.layer_masks(attention_mask, resid.shape[1], resid.shape[1], resid.device)
        return self.run_blocks(resid, start_at_layer, stop_at_layer, positions, attn_mask, None, return_type,
                               tokens, attention_mask, loss_per_token)

    def _from_with_cache(self, resid, start_at_layer, return_type, loss_per_token, attention_mask, stop_at_layer,
                         tokens, past_kv_cache):
        if not past_kv_cache.frozen:
            raise ValueError("start_at_layer with a past_kv_cache needs a frozen cache (past_kv_cache.freeze()): "
                             f"the blocks before {start_at_layer} do not run, so their cached keys could not grow")
        batch, pos = resid.shape[:2]
        past = len(past_kv_cache)
        if past + pos > self.cfg.n_ctx:
            raise ValueError(f"{past} cached and {pos} new positions exceed n_ctx={self.cfg.n_ctx}")
        past_kv_cache.check_fits(self.cfg.n_layers, batch)
        new_mask = attention_mask
        if attention_mask is not None:
            full = inputs.as_array_tensor(attention_mask, "attention_mask")
            if full.ndim == 2 and past and full.shape == (batch, past + pos):
                cached = past_kv_cache.key_mask
                head = inputs.as_mask(full[:, :past], (batch, past), resid.device, "the cached positions have")
                if cached is None and not bool(head.all()) or cached is not None and not torch.equal(head, cached):
                    raise ValueError("attention_mask's first past positions differ from the key-value cache's mask; "
                                     "give the new positions' mask [batch pos], or the one input_to_embed returns")
                full = full[:, past:]
            new_mask = inputs.as_mask(full, (batch, pos), resid.device,
                                      f"the residual stream's new positions (after {past} cached ones) have")
        key_mask = past_kv_cache.extend_mask(new_mask, (batch, pos))  # the cache is frozen: nothing is stored
        positions = positions_for(resid[..., 0], key_mask, past)
        attn_mask = self.layer_masks(key_mask, pos, past + pos, resid.device)
        return self._with_cache(past_kv_cache, stop_at_layer, self.run_blocks, resid, start_at_layer, stop_at_layer,
                                positions, attn_mask, past_kv_cache, return_type, tokens, new_mask, loss_per_token)

    def layer_masks(self, key_mask, query_len: int, key_len: int, device) -> dict:
        """{"global": mask, "local": mask} (``masks.attention_mask_for``), the local one only with local layers."""
        masks = {"global": attention_mask_for(key_mask, query_len, key_len, device)}
        if self.cfg.attn_types is not None and "local" in self.cfg.attn_types:
            masks["local"] = attention_mask_for(key_mask, query_len, key_len, device, window=self.cfg.window_size)
        return masks

    def run_blocks(self, resid, start, stop, positions, attn_masks, past_kv_cache, return_type, tokens,
                   attention_mask, loss_per_token):
        end = self.cfg.n_layers if stop is None else self.check_stop(stop, start)
        plan = self._device_plan
        if plan is None:
            for block in self.blocks[start:end]:
                kv = past_kv_cache[block.layer] if past_kv_cache is not None else None
                resid = block(resid, positions, attn_masks[self.cfg.layer_attn_type(block.layer)], kv)
        else:  # each block on its device; the stream moves where the stage changes
            stages = devices.Stages(plan, positions, attn_masks)
            for block in self.blocks[start:end]:
                kv = past_kv_cache[block.layer] if past_kv_cache is not None else None
                resid, block_positions, mask = stages.enter_block(block.layer, resid,
                                                                  self.cfg.layer_attn_type(block.layer))
                resid = block(resid, block_positions, mask, kv)
        if stop is not None:
            return resid
        if return_type is None:
            return None
        logits = self.unembed(self.ln_final(resid)) if plan is None else devices.unembed(self, resid, stages)
        if return_type == "logits":
            return logits
        if plan is not None and tokens is not None:
            tokens = tokens.to(logits.device)
            attention_mask = attention_mask.to(logits.device) if attention_mask is not None else None
        loss = lm_loss(logits, tokens, attention_mask, loss_per_token)
        return loss if return_type == "loss" else (logits, loss)

    def check_stop(self, stop, start: int) -> int:
        """stop_at_layer as a block index in [start, n_layers]; negative counts from the end."""
        n = self.cfg.n_layers
        if isinstance(stop, bool) or not isinstance(stop, int) or not -n <= stop <= n:
            raise ValueError(f"stop_at_layer={stop!r} must be an int in [-n_layers, n_layers] = [-{n}, {n}]")
        end = stop if stop >= 0 else n + stop
        if end < start:
            raise ValueError(f"stop_at_layer={stop} ends before start_at_layer={start}")
        return end

    def input_to_tokens(self, input, attention_mask, prepend_bos, padding_side) -> tuple:
        """(tokens [batch pos] on the model's device, bool mask or None), every argument checked."""
        inputs.check_flag("prepend_bos", prepend_bos, optional=True)
        padding_side = self.resolve_padding_side(padding_side)  # None: the tokenizer's side
        if isinstance(input, (str, list, tuple)):
            if attention_mask is not None:
                raise ValueError("attention_mask is derived from text input; pass it only with token ids")
            return self.tokenize(input, prepend_bos, padding_side)
        if not isinstance(input, (Tensor, np.ndarray)):
            raise ValueError(f"input must be token ids [batch pos], a string or a list of strings, "
                             f"got {type(input).__name__}")
        tokens = inputs.as_tokens(input, self.cfg_device())
        return tokens, inputs.optional_mask(attention_mask, tuple(tokens.shape), tokens.device)

    def check_tokens(self, tokens: Tensor, past: int = 0) -> None:
        inputs.check_tokens(tokens, self.cfg.n_ctx, self.cfg.d_vocab, past)

    # -- TransformerLens-style views ---------------------------------------------------------
    @property
    def W_E(self) -> Tensor:
        return self.embed.W_E

    @property
    def W_pos(self) -> Tensor:
        if self.pos_embed is None:
            raise AttributeError(f"a model with positional={self.cfg.positional!r} has no W_pos")
        return self.pos_embed.W_pos

    @property
    def W_U(self) -> Tensor:
        return self.unembed.W_U

    def _stacked(self, module: str, name: str) -> Tensor:
        if module == "mlp" and self.cfg.attn_only:
            raise AttributeError(f"an attention-only model (Config.attn_only=True) has no MLP, so no {name}")
        tensors = [getattr(getattr(block, module), name) for block in self.blocks]
        if self._device_plan is not None:  # blocks on several devices: the copy is gathered on the embed's
            tensors = [t.to(self._device_plan.home) for t in tensors]
        return torch.stack(tensors)

    def _stacked_kv(self, name: str) -> Tensor:
        """Keys' or values' weights per query head: grouped-query kv heads repeated (as TransformerLens)."""
        stacked = self._stacked("attn", name)
        groups = self.cfg.n_kv_groups
        return stacked.repeat_interleave(groups, dim=1) if groups > 1 else stacked

    W_Q = property(lambda self: self._stacked("attn", "W_Q"), doc="[layer head d_model d_head] (a copy)")
    W_K = property(lambda self: self._stacked_kv("W_K"),
                   doc="[layer head d_model d_head] (a copy; grouped-query kv heads repeated per query head)")
    W_V = property(lambda self: self._stacked_kv("W_V"),
                   doc="[layer head d_model d_head] (a copy; grouped-query kv heads repeated per query head)")
    W_O = property(lambda self: self._stacked("attn", "W_O"), doc="[layer head d_head d_model] (a copy)")
    W_in = property(lambda self: self._stacked("mlp", "W_in"), doc="[layer d_model d_mlp] (a copy)")
    W_out = property(lambda self: self._stacked("mlp", "W_out"), doc="[layer d_mlp d_model] (a copy)")

    @property
    def OV(self):
        """Every head's OV circuit, ``FactoredMatrix(W_V, W_O)`` [layer head d_model d_model] with hidden dim
        d_head: a residual-stream row vector x at a source position moves x @ OV[layer, head] into the
        destination, times its attention weight (biases left out). Factors are copies of the weights."""
        from ..interp.factored_matrix import FactoredMatrix

        return FactoredMatrix(self.W_V, self.W_O)

    @property
    def QK(self):
        """Every head's QK circuit, ``FactoredMatrix(W_Q, W_K^T)`` [layer head d_model d_model] with hidden dim
        d_head: the attention score of query x_q on key x_k is x_q @ QK[layer, head] @ x_k^T, before the
        1/sqrt(d_head) scale, without biases and, with rotary positions, without the rotation. With
        ``qk_norm`` the scores are not x_q QK x_k^T at all (the norms act between), and with
        ``attn_scores_soft_cap`` they are capped afterwards."""
        from ..interp.factored_matrix import FactoredMatrix

        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    # -- entry points into the later layers --------------------------------------------------
    @classmethod
    def from_pretrained(cls, name_or_path: str, device=None, dtype: Union[torch.dtype, str] = torch.float32, **kwargs):
        """Load a local folder, a shipped model, or a Hugging Face repo id (cached or fetched); ``dtype``
        may be a name ("bfloat16") or "auto"; ``device_map=`` / ``n_devices=`` place it across devices
        (see ``glassbox.weights.pretrained``)."""
        from ..weights import from_pretrained

        return from_pretrained(name_or_path, device=device, dtype=dtype, **kwargs)

    @classmethod
    def from_hf(cls, hf_model, tokenizer=None, device=None, dtype: Union[torch.dtype, str, None] = None,
                device_map=None, n_devices: Optional[int] = None):
        """Build from an in-memory ``transformers`` model of a family glassbox converts (same weights, no
        processing); ``dtype`` may be a name or "auto" (the model's own); ``device_map``/``n_devices``
        place the blocks across devices (``glassbox.models.devices``)."""
        from ..weights import from_hf

        return from_hf(hf_model, tokenizer=tokenizer, device=device, dtype=dtype, device_map=device_map,
                       n_devices=n_devices)

    def run_with_cache(self, *args, **kwargs):
        """Run and cache activations; see ``glassbox.interp.cache.run_with_cache``."""
        from ..interp.cache import run_with_cache

        return run_with_cache(self, *args, **kwargs)

    def cache_size(self, *args, **kwargs) -> int:
        """Bytes a cache would take, before running; see ``glassbox.interp.cache.cache_size``."""
        from ..interp.cache import cache_size

        return cache_size(self, *args, **kwargs)

    def generate(self, *args, **kwargs):
        """Decode with a key-value cache; see ``glassbox.models.generate.generate``."""
        from .generate import generate

        return generate(self, *args, **kwargs)

    def to_hf(self, share_memory: bool = False):
        """Export as the matching ``transformers`` model (GPT2LMHeadModel, LlamaForCausalLM...) with the same
        weights, in tensors of its own unless ``share_memory`` (see ``glassbox.weights.export``)."""
        from ..weights import to_hf

        return to_hf(self, share_memory=share_memory)

    def save_pretrained(self, folder) -> None:
        """Write a Hugging Face model folder (config.json, model.safetensors, tokenizer files)."""
        from ..weights import save_pretrained

        save_pretrained(self, folder)

