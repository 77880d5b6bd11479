"""HookFlags: the runtime switches for hook points that cost memory or compute, with TransformerLens's names.

Four flags, all off by default, each making some hook points exist and fire:

- ``use_attn_result``: ``blocks.L.attn.hook_result`` [batch pos head d_model], each head's
  ``z[h] @ W_O[h]``; the attention output is then their sum plus b_O (a [.. head d_model] tensor
  instead of one fused GEMM).
- ``use_split_qkv_input``: ``blocks.L.hook_q_input``, ``hook_k_input``, ``hook_v_input``
  [batch pos head d_model], one copy of the residual stream per head for each of q, k and v; each
  head's q, k and v are computed from its own (normalised) copy, so editing head h's q input moves only
  head h's queries. ln1 then runs three times (q, k, v), on [batch pos head d_model].
- ``use_attn_in``: ``blocks.L.hook_attn_in`` [batch pos head d_model], one copy per head shared by
  q, k and v (ln1 runs once, on [batch pos head d_model]).
- ``use_hook_mlp_in``: ``blocks.L.hook_mlp_in`` [batch pos d_model], a copy of what the MLP's norm
  reads (resid_mid; post-norm: the MLP's input).

A flag's hook points are in ``model.hook_dict`` only while the flag is on. The flags are read by the
forward on every call, so writing a field (``model.hook_flags.use_attn_result = True``) and calling
``model.set_use_attn_result(True)`` are the same: both are checked by every model sharing the object
(``HookFlagError`` for a combination the model cannot compute, or for turning a flag off while hooks
are attached to its points) and both update the model's ``hook_dict`` before returning.

Refused combinations (``check_flags``): ``use_split_qkv_input`` with ``use_attn_in`` (the per-head
q/k/v inputs are copies of resid_pre, so an edit at hook_attn_in would be silently ignored, as it is in
TransformerLens); ``use_hook_mlp_in`` in an attention-only model (no MLP; TransformerLens refuses it
too); ``use_attn_in``, ``use_split_qkv_input`` or ``use_hook_mlp_in`` with parallel blocks of one norm
(GPT-J's: their one ln1 feeds attention and MLP alike, so a second input to it would run ln1's hooks
twice on different values; GPT-NeoX's two-norm blocks take every flag); ``use_attn_in`` with
grouped-query attention and qk_norm "full" (OLMo 2: the grouped keys are normalised together, and
each query head's own input would give it its own keys).
"""

import weakref
from dataclasses import dataclass, fields
from typing import Optional

FLAG_NAMES = ("use_attn_result", "use_split_qkv_input", "use_attn_in", "use_hook_mlp_in")

# The suffix of every hook name each flag gates.
FLAG_HOOK_SUFFIXES = {
    "use_attn_result": (".attn.hook_result",),
    "use_split_qkv_input": (".hook_q_input", ".hook_k_input", ".hook_v_input"),
    "use_attn_in": (".hook_attn_in",),
    "use_hook_mlp_in": (".hook_mlp_in",),
}


class HookFlagError(ValueError):
    """A hook flag's value or combination the model cannot compute, or a hook name whose flag is off."""


@dataclass
class HookFlags:
    use_attn_result: bool = False
    use_split_qkv_input: bool = False
    use_attn_in: bool = False
    use_hook_mlp_in: bool = False

    def __setattr__(self, name: str, value) -> None:
        if name in FLAG_NAMES:
            if not isinstance(value, bool):
                raise HookFlagError(f"HookFlags.{name} must be a bool, got {value!r}")
            owners = self._live_owners()
            for owner in owners:
                owner._check_flag_change(name, value)  # raises before anything changes
            object.__setattr__(self, name, value)
            for owner in owners:
                owner._sync_hook_dict()
            return
        object.__setattr__(self, name, value)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def _add_owner(self, owner) -> None:
        """Register a model that reads these flags (it checks and follows every change). Owners are held
        by weak reference, so a flags object the caller keeps does not keep its models alive."""
        owners = self.__dict__.setdefault("_owners", [])
        if not any(ref() is owner for ref in owners):
            owners.append(weakref.ref(owner))

    def _live_owners(self) -> list:
        owners = self.__dict__.get("_owners", [])
        owners[:] = [ref for ref in owners if ref() is not None]
        return [ref() for ref in owners]

    # A copy (shallow, deep or pickled) is a new set of flags with the same values and no owners: a
    # model that is copied registers itself with its copy of the flags (HookedTransformer.__setstate__).
    def __copy__(self) -> "HookFlags":
        return HookFlags(**self.as_dict())

    def __deepcopy__(self, memo) -> "HookFlags":
        return HookFlags(**self.as_dict())

    def __getstate__(self) -> dict:
        return self.as_dict()

    def __setstate__(self, state: dict) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)


def setter_name(flag: str) -> str:
    """The model method that sets ``flag``: 'use_attn_result' -> 'set_use_attn_result'."""
    return f"set_{flag}"


def gating_flag(name: str) -> Optional[str]:
    """The flag a concrete hook name needs ('blocks.0.attn.hook_result' -> 'use_attn_result'), or None."""
    for flag, suffixes in FLAG_HOOK_SUFFIXES.items():
        if name.endswith(suffixes):
            return flag
    return None


def check_flags(cfg, flags: "HookFlags") -> None:
    """Raise HookFlagError naming the flags and Config fields of a combination that cannot be computed."""
    if flags.use_split_qkv_input and flags.use_attn_in:
        raise HookFlagError(
            "use_split_qkv_input and use_attn_in cannot both be on: the split q/k/v inputs are copies of "
            "resid_pre, so an edit at hook_attn_in would be silently ignored; turn one off "
            "(set_use_attn_in(False) or set_use_split_qkv_input(False))")
    if flags.use_hook_mlp_in and getattr(cfg, "attn_only", False):
        raise HookFlagError("use_hook_mlp_in needs an MLP, and this model is attention-only (Config.attn_only=True)")
    if flags.use_attn_in and getattr(cfg, "qk_norm", None) == "full" and cfg.n_key_value_heads < cfg.n_heads:
        raise HookFlagError("use_attn_in gives each query head its own keys, but Config.qk_norm='full' normalises the "
                            "grouped keys together (OLMo 2); use use_split_qkv_input, whose key and value inputs are "
                            "one per kv head")
    if cfg.parallel_attn_mlp and not getattr(cfg, "parallel_ln2", False):
        for flag in ("use_attn_in", "use_split_qkv_input", "use_hook_mlp_in"):
            if getattr(flags, flag):
                raise HookFlagError(
                    f"{flag} is not supported with parallel blocks (Config.parallel_attn_mlp=True) that have "
                    "one norm (parallel_ln2=False, GPT-J's): attention "
                    "and MLP read one ln1 output, so a separate input for one of them would run ln1 (and its "
                    "hooks) twice on different values")
