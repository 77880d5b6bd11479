"""A model's parts on several devices, and the residual stream moved between them.

A ``DevicePlan`` gives each part of a HookedTransformer a device:

- ``"embed"``: the token embedding and the position embedding, with ``hook_embed`` and ``hook_pos_embed``;
- ``"blocks.L"``: block L whole: its norms, attention and MLP, every hook point in it, and its layer of
  a ``KVCache`` (keys and values are computed, kept and read on the block's device);
- ``"ln_final"``: the final norm; ``"unembed"``: the unembedding (W_U, b_U, its hook points).

Parts are chained embed, blocks.0 .. blocks.{n-1}, ln_final, unembed. Each part belongs to a stage (one
device); where two consecutive parts are on different stages there is a boundary, and the residual
stream crosses it through ``move``, the one place it changes device: once per boundary per forward.
A forward's positions and attention masks (small) are moved once per stage. Weights never move per
forward: they stay where ``place`` put them.

``device_map`` (``plan_for``, ``place``, ``from_pretrained(device_map=...)``) is one of:

- a dict naming every part exactly once (the keys above, ``blocks.0`` .. ``blocks.{n_layers - 1}``),
  each value a device: ``"cuda:1"``, a ``torch.device``, or an int (a CUDA index, as Hugging Face
  writes it). A missing or unknown key is refused by name. Parts on the same device share a stage.
- a list of devices: the blocks in ``len(list)`` contiguous runs, as even as possible (the first
  ``n_layers % len(list)`` runs one block longer), one stage per entry; "embed" and "unembed" on the
  first device, "ln_final" on the last block's. So the logits come out where the tokens go in, and
  one more boundary carries the normalised stream back to the first device. A device listed twice
  is two stages on one device, with a boundary (a move that copies nothing) between them: how the
  CPU tests count moves.
- ``"auto"`` or ``"balanced"``: that list over every visible CUDA device (``torch.cuda.device_count()``),
  everything on the CPU where there is none (as Hugging Face does). Blocks are split by count, not by
  memory, so ``"balanced_low_0"`` and ``"sequential"`` are refused by name, as is any other string.
- ``n_devices=k`` (``from_pretrained``, TransformerLens's meaning): the list cuda:0 .. cuda:k-1, or
  from cuda:i on with ``device="cuda:i"``. TransformerLens puts ceil(n_layers / k) blocks on each
  device, which can leave the last ones empty (4 layers on 3 devices: 2, 2, 0); glassbox gives every
  device a block (2, 1, 1) and refuses k > n_layers.

Tied embeddings (``cfg.tied_unembed``: W_U is W_E's transpose, one Parameter): "unembed" must be on the
embed's device, and a plan putting it elsewhere is refused; a second copy of W_E could silently drift
from it (training, weight edits, processing). The list forms already put it there.

Footguns:
- Move a placed model with ``place``, not a submodule (``model.blocks[3].to(...)``): the plan would no
  longer say where the block is. ``model.to(...)``, ``.cuda()``, ``.half()`` are seen: a plan the
  weights no longer match is rebuilt from where they are (one device: no plan).
- Hooks run on their part's device: a hook adding a tensor of its own must put it on ``act.device``.
- ``run_with_cache(device=None)`` leaves each activation on its part's device; analysis that stacks
  layers (``accumulated_resid``, ``decompose_resid``...) needs one device: pass ``device=``.
- Weight processing (``fold_ln``...) runs before placement in ``from_pretrained``; on a model placed
  across real devices, process it first, then ``place`` it.
"""

from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor

AUTO_MAPS = ("auto", "balanced")
REFUSED_MAPS = {
    "balanced_low_0": "it fills devices by memory, leaving cuda:0 light; glassbox splits blocks by count",
    "sequential": "it fills each device's memory before the next; glassbox splits blocks by count",
}


def parts(n_layers: int) -> list:
    """Every part's name, in the order the residual stream passes them."""
    return ["embed", *(f"blocks.{layer}" for layer in range(n_layers)), "ln_final", "unembed"]


@dataclass(frozen=True)
class DevicePlan:
    """Where each part of a model runs: ``stage_of[part]`` indexes ``devices`` (one device per stage)."""

    devices: tuple
    stage_of: dict

    @property
    def n_layers(self) -> int:
        return len(self.stage_of) - 3

    def device(self, part: str) -> torch.device:
        return self.devices[self.stage_of[part]]

    def block_device(self, layer: int) -> torch.device:
        return self.devices[self.stage_of[f"blocks.{layer}"]]

    @property
    def home(self) -> torch.device:
        """The embed's device: where tokens enter (``model.cfg_device()``)."""
        return self.device("embed")

    @property
    def n_boundaries(self) -> int:
        """Stage changes along the chain: the residual stream's moves in one full forward."""
        chain = [self.stage_of[p] for p in parts(self.n_layers)]
        return sum(a != b for a, b in zip(chain, chain[1:]))

    def as_dict(self) -> dict:
        """{part: device string}, a dict ``device_map`` that builds an equal placement (same-device stages merge)."""
        return {part: str(self.devices[stage]) for part, stage in self.stage_of.items()}

    def __repr__(self) -> str:
        runs, chain = [], parts(self.n_layers)
        for part in chain:
            stage = self.stage_of[part]
            if runs and runs[-1][0] == stage:
                runs[-1][2] = part
            else:
                runs.append([stage, part, part])
        text = ", ".join(f"{a}{'..' + b if b != a else ''}: {self.devices[s]} (stage {s})" for s, a, b in runs)
        return f"DevicePlan({text})"


def check_device(value, where: str, allow_meta: bool = True) -> torch.device:
    """The torch.device ``value`` names (a name, a torch.device, or an int: a CUDA index), checked usable
    here before anything is built or read: its backend present in this torch build and on this
    machine, its index in range. ValueError naming ``where`` and the device otherwise. "meta" (no
    data) passes unless ``allow_meta`` is False (where weights must be held)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, torch.device)):
        raise ValueError(f"{where}: {value!r} is not a device (give a name such as 'cpu' or 'cuda:0', a "
                         "torch.device or a CUDA index)")
    try:
        device = torch.device(f"cuda:{value}" if isinstance(value, int) else value)
    except (RuntimeError, TypeError, ValueError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(f"{where}: {value!r} is not a device ({first})") from None
    kind = device.type
    if kind == "cpu" or (kind == "meta" and allow_meta):
        return device
    if kind == "meta":
        raise ValueError(f"{where}: 'meta' holds no weights; name a device that can run the model")
    if kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA (a CPU build)"
            raise ValueError(f"{where}: {device} is not there: this machine has 0 CUDA device(s) (torch "
                             f"{torch.__version__}, built with {build}); use 'cpu'")
        if device.index is not None and device.index >= count:
            raise ValueError(f"{where}: {device} is not there: this machine has {count} CUDA device(s), "
                             f"cuda:0 .. cuda:{count - 1}")
        return device
    if kind == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"{where}: {value!r} needs Apple's MPS backend, which this torch build or machine "
                             "does not have; use 'cpu'")
        return device
    try:  # any other backend (xpu, xla, hpu, vulkan, ...): can a tensor live there?
        torch.empty(0, device=device)
    except Exception as err:  # backends fail with many types (RuntimeError, NotImplementedError, ImportError...)
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise ValueError(f"{where}: {value!r}: this torch build cannot use {kind} devices here "
                         f"({type(err).__name__}: {first}); use 'cpu'") from None
    return device


def as_device(value, where: str) -> torch.device:
    """A usable device for a part of a placed model (``check_device``, meta refused), CUDA with its index."""
    device = check_device(value, where, allow_meta=False)
    if device.type == "cuda":
        device = torch.device("cuda", device.index if device.index is not None else 0)
    return device


def split_layers(n_layers: int, n_stages: int) -> list:
    """Stage of each block: contiguous runs, the first ``n_layers % n_stages`` one block longer."""
    base, extra = divmod(n_layers, n_stages)
    stages = []
    for stage in range(n_stages):
        stages += [stage] * (base + (stage < extra))
    return stages


def plan_for(cfg, device_map) -> DevicePlan:
    """The DevicePlan of ``device_map`` (any form of the module docstring) for a model of ``cfg``."""
    n = cfg.n_layers
    if isinstance(device_map, str):
        if device_map in REFUSED_MAPS:
            raise ValueError(f"device_map={device_map!r} is not supported: {REFUSED_MAPS[device_map]}; use 'auto' "
                             "or 'balanced', a list of devices or a dict of parts")
        if device_map not in AUTO_MAPS:
            raise ValueError(f"device_map={device_map!r} is not supported: give 'auto' or 'balanced', a list of "
                             "devices, or a dict {part: device}; for one device pass device= instead")
        count = torch.cuda.device_count()
        device_map = [f"cuda:{i}" for i in range(min(count, n))] or ["cpu"]
    if isinstance(device_map, (list, tuple)):
        if not device_map:
            raise ValueError("device_map is an empty list; name at least one device")
        if len(device_map) > n:
            raise ValueError(f"device_map lists {len(device_map)} devices for {n} blocks: every device needs a block")
        devices = tuple(as_device(d, f"device_map[{i}]") for i, d in enumerate(device_map))
        stage_of = {"embed": 0, **{f"blocks.{layer}": s for layer, s in enumerate(split_layers(n, len(devices)))}}
        stage_of.update(ln_final=stage_of[f"blocks.{n - 1}"], unembed=0)
        return check_tied(cfg, DevicePlan(devices, stage_of))
    if isinstance(device_map, dict):
        expected = parts(n)
        unknown = [k for k in device_map if k not in expected]
        if unknown:
            raise ValueError(f"device_map has unknown part(s) {unknown}; the parts are embed, blocks.0 .. "
                             f"blocks.{n - 1}, ln_final and unembed")
        missing = [p for p in expected if p not in device_map]
        if missing:
            raise ValueError(f"device_map does not place {missing}: name every part")
        placed = {p: as_device(device_map[p], f"device_map[{p!r}]") for p in expected}
        devices = tuple(dict.fromkeys(placed.values()))
        return check_tied(cfg, DevicePlan(devices, {p: devices.index(d) for p, d in placed.items()}))
    raise TypeError(f"device_map must be 'auto', 'balanced', a list of devices or a dict {{part: device}}, "
                    f"got {type(device_map).__name__}")


def check_tied(cfg, plan: DevicePlan) -> DevicePlan:
    if cfg.tied_unembed and plan.device("unembed") != plan.device("embed"):
        raise ValueError(f"device_map puts 'unembed' on {plan.device('unembed')} and 'embed' on "
                         f"{plan.device('embed')}, but this model's W_U is W_E (tied_unembed): put both on one "
                         "device (a copy of W_E could drift from it)")
    return plan


def n_devices_map(n_devices, device=None) -> Optional[list]:
    """``n_devices=k``'s device list (None for 1: one device, ``device``), from ``device``'s CUDA index."""
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or n_devices < 1:
        raise ValueError(f"n_devices must be an int >= 1, got {n_devices!r}")
    if n_devices == 1:
        return None
    start = 0
    if device is not None:
        first = check_device(device, "device")
        if first.type != "cuda":
            raise ValueError(f"n_devices={n_devices} spreads the blocks over CUDA devices, but device={device!r}; "
                             "for stages on other devices give device_map a list, e.g. ['cpu', 'cpu']")
        start = first.index or 0
    count = torch.cuda.device_count()
    if start + n_devices > count:
        raise ValueError(f"n_devices={n_devices} from cuda:{start} needs {start + n_devices} CUDA devices; this "
                         f"machine has {count}")
    return [f"cuda:{start + i}" for i in range(n_devices)]


def requested_map(device, device_map, n_devices):
    """The device_map that ``from_pretrained``'s arguments ask for (None: one device), refusing conflicts."""
    if device_map is not None and n_devices is not None:
        raise ValueError("pass device_map= or n_devices=, not both")
    if device_map is not None:
        if device is not None:
            raise ValueError(f"device={device!r} and device_map= both say where the model goes; pass one")
        check_form(device_map)
        return device_map
    if n_devices is not None:
        return n_devices_map(n_devices, device)
    return None


def check_form(device_map) -> None:
    """Refuse, before any weights are read, a device_map no model could take (its parts are checked
    against the model's config by ``plan_for``)."""
    if isinstance(device_map, str):
        if device_map in AUTO_MAPS:
            return
        plan_for(_NoLayers, device_map)  # raises, naming the string
    elif isinstance(device_map, (list, tuple)):
        for i, d in enumerate(device_map):
            as_device(d, f"device_map[{i}]")
    elif isinstance(device_map, dict):
        for part, d in device_map.items():
            as_device(d, f"device_map[{part!r}]")
    else:
        raise TypeError(f"device_map must be 'auto', 'balanced', a list of devices or a dict {{part: device}}, "
                        f"got {type(device_map).__name__}")


class _NoLayers:
    n_layers = 0


# -- the modules of each part ------------------------------------------------------------------
def part_modules(model, part: str) -> list:
    if part == "embed":
        return [m for m in (model.embed, model.pos_embed) if m is not None]
    if part.startswith("blocks."):
        return [model.blocks[int(part.split(".")[1])]]
    return [getattr(model, part)]


def actual_device(model, part: str) -> Optional[torch.device]:
    """Where a part's tensors are; None for a part with none (an identity ln_final, a tied unembed
    without bias, whose W_U is the embed's)."""
    for module in part_modules(model, part):
        for tensor in (*module.parameters(), *module.buffers()):
            return tensor.device
    return None


def place(model, device_map) -> None:
    """Move every part of ``model`` to its device of ``device_map`` and record the plan on the model.

    Checked whole before anything moves; if a move fails (out of memory), the parts already moved go
    back and the model keeps its previous plan. Parameters stay the same objects (their data moves),
    so a tied W_U stays W_E and an optimizer's references stay valid.
    """
    plan = plan_for(model.cfg, device_map)
    moved = []  # (module, the device it was on)
    try:
        for part in parts(model.cfg.n_layers):
            for module in part_modules(model, part):
                before = next((t.device for t in (*module.parameters(), *module.buffers())), None)
                if before is not None:  # listed first: a move failing half-way is undone too
                    moved.append((module, before))
                module.to(plan.device(part))
    except BaseException:
        for module, before in reversed(moved):
            module.to(before)
        raise
    model._device_plan = plan


def refresh(model) -> None:
    """After ``model.to(...)`` and the like: keep the plan if every part is still where it says, else
    rebuild it from where the parts are (None when they are all on one device)."""
    plan = model.__dict__.get("_device_plan")
    if plan is None:
        return
    chain = parts(model.cfg.n_layers)
    actual = {p: actual_device(model, p) for p in chain}
    if all(d is None or d == plan.device(p) for p, d in actual.items()):
        return
    where, placed = actual["embed"], {}
    for part in chain:  # a part without tensors runs where the stream already is
        where = actual[part] if actual[part] is not None else where
        placed[part] = where
    if model.cfg.tied_unembed:
        placed["unembed"] = placed["embed"]
    devices = tuple(dict.fromkeys(placed.values()))
    stage_of = {p: devices.index(d) for p, d in placed.items()}
    model._device_plan = None if len(devices) == 1 else DevicePlan(devices, stage_of)


def hook_device(model, name: str) -> torch.device:
    """The device a hook point's activations are on (the part that owns it)."""
    plan = model.__dict__.get("_device_plan")
    if plan is None:
        return model.cfg_device()
    head = name.split(".")
    if head[0] == "blocks" and len(head) > 1 and head[1].isdigit() and int(head[1]) < plan.n_layers:
        return plan.block_device(int(head[1]))
    if head[0] in ("ln_final", "unembed"):
        return plan.device(head[0])
    return plan.home


# -- moving the residual stream ----------------------------------------------------------------
def move(x: Tensor, device: torch.device) -> Tensor:
    """The residual stream crossing a boundary; every such crossing calls this (tests count them)."""
    return x.to(device)


def _to(x, device):
    return x if x is None else x.to(device)


class Stages:
    """One forward's walk through a plan: the stage the stream is on, and the forward's positions and
    masks on each stage's device (moved once per stage)."""

    __slots__ = ("plan", "stage", "positions", "masks", "inputs")

    def __init__(self, plan: DevicePlan, positions: Optional[Tensor], masks: Optional[dict]):
        self.plan, self.stage = plan, None
        self.positions, self.masks = positions, masks
        self.inputs: dict = {}

    def enter(self, part: str, x: Tensor) -> Tensor:
        """``x`` on ``part``'s device: moved at a stage change, or where it arrives from elsewhere
        (at the start, the stream is on its stage if it is on that device)."""
        stage = self.plan.stage_of[part]
        device = self.plan.devices[stage]
        if (self.stage is not None and stage != self.stage) or x.device != device:
            x = move(x, device)
        self.stage = stage
        return x

    def enter_block(self, layer: int, resid: Tensor, attn_type: str) -> tuple:
        """(resid, positions, attention mask) on block ``layer``'s device."""
        resid = self.enter(f"blocks.{layer}", resid)
        stage = self.stage
        if stage not in self.inputs:
            device = self.plan.devices[stage]
            self.inputs[stage] = (_to(self.positions, device),
                                  {k: _to(v, device) for k, v in self.masks.items()})
        positions, masks = self.inputs[stage]
        return resid, positions, masks[attn_type]


def unembed(model, resid: Tensor, stages: Optional[Stages] = None) -> Tensor:
    """Logits from the stream leaving the last block (final norm, then W_U), each on its device."""
    plan = model.__dict__.get("_device_plan")
    if plan is None:
        return model.unembed(model.ln_final(resid))
    stages = stages if stages is not None else Stages(plan, None, None)
    normed = model.ln_final(stages.enter("ln_final", resid))
    return model.unembed(stages.enter("unembed", normed))


def cross(model, from_layer: int, to_layer: int, resid: Tensor) -> Tensor:
    """``resid``, leaving block ``from_layer``, on block ``to_layer``'s device: through ``move`` at a
    stage change (or where it is on another device)."""
    plan = model.__dict__.get("_device_plan")
    if plan is None:
        return resid
    stage = plan.stage_of[f"blocks.{to_layer}"]
    device = plan.devices[stage]
    if stage != plan.stage_of[f"blocks.{from_layer}"] or resid.device != device:
        return move(resid, device)
    return resid


def plan_of(model) -> Optional[DevicePlan]:
    """The model's DevicePlan, or None on one device."""
    return model.__dict__.get("_device_plan")


def to_home(model, x: Tensor) -> Tensor:
    """``x`` (logits, token ids...) on the embed's device, where tokens and the caller's tensors are."""
    plan = model.__dict__.get("_device_plan")
    return x if plan is None or x.device == plan.home else x.to(plan.home)
