"""TranscoderSets to and from glassbox's ``interp.sae`` transcoders and SAELens's transcoder folders.

- ``from_saes([tc_0, ..., tc_{n-1}])``: a per-layer set from one ``Transcoder`` / ``SkipTranscoder`` /
  ``JumpReLUTranscoder`` / ``JumpReLUSkipTranscoder`` per layer, ``tc_l`` reading ``blocks.{l}.<in>`` and
  writing ``blocks.{l}.<out>`` (the same ``<in>`` and ``<out>`` for every layer, the same architecture and
  width). Its ``encode`` / ``reconstruct`` equal the transcoders' ``encode`` / ``forward`` bit for bit (a
  negative JumpReLU threshold is raised to 0, the same function, see ``set.py``).
- ``to_saes(ts)``: the inverse, for a per-layer ReLU or JumpReLU set (SAELens has no TopK or
  cross-layer transcoder; a negative threshold of circuit-tracer's JumpReLU is not SAELens's function:
  each is refused, naming it).
- ``load_saelens_set(folder)``: a folder of SAELens transcoder folders, one per layer (any names; the
  layer is read from each ``cfg.json``'s ``metadata.hook_name``), or a list of such folders;
  ``save_saelens_set(ts, folder)`` writes ``folder/layer_{l}/`` with ``interp.sae.save_sae`` (crash-safe,
  a user's files kept; the parent's own files are the user's).
"""

import re
from pathlib import Path
from typing import Sequence, Union

import torch

from ..sae.architectures import JumpReLUTranscoder, SkipTranscoder, Transcoder
from ..sae.config import SAEConfig
from .set import TranscoderSet

_HOOK = re.compile(r"^blocks\.(\d+)\.(.+)$")


def _split(hook: str, where: str) -> tuple:
    match = _HOOK.match(hook or "")
    if not match:
        raise ValueError(f"{where}: hook {hook!r} is not a block's hook (blocks.<layer>.<name>); a transcoder set "
                         "has one transcoder per block")
    return int(match.group(1)), match.group(2)


def from_saes(saes: Sequence, metadata=None) -> TranscoderSet:
    """A per-layer TranscoderSet of glassbox transcoders, one per layer in order (module docstring)."""
    saes = list(saes)
    if not saes:
        raise ValueError("from_saes needs one transcoder per layer, got none")
    first = saes[0]
    for l, sae in enumerate(saes):
        where = f"transcoder {l}"
        if not isinstance(sae, Transcoder):
            raise TypeError(f"{where} is a {type(sae).__name__}, not a glassbox transcoder (interp.sae.Transcoder "
                            "and its skip and JumpReLU kinds)")
        layer_in, hook_in = _split(sae.cfg.hook_name, f"{where}: hook_name")
        layer_out, hook_out = _split(sae.cfg.hook_out, f"{where}: hook_name_out")
        if layer_in != l or layer_out != l:
            raise ValueError(f"{where} reads {sae.cfg.hook_name!r} and writes {sae.cfg.hook_out!r}; the transcoder "
                             f"at position {l} of the list must read and write block {l}")
        if (hook_in, hook_out) != _split(first.cfg.hook_name, "")[1:] + _split(first.cfg.hook_out, "")[1:]:
            raise ValueError(f"{where} reads {sae.cfg.hook_name!r} and writes {sae.cfg.hook_out!r}; transcoder 0 "
                             f"reads {first.cfg.hook_name!r} and writes {first.cfg.hook_out!r}: a set reads and "
                             "writes the same hooks in every block")
        if sae.architecture != first.architecture:
            raise ValueError(f"{where} is a {sae.architecture!r}; transcoder 0 is a {first.architecture!r}")
        if (sae.cfg.d_in, sae.cfg.d_sae, sae.cfg.d_output) != (first.cfg.d_in, first.cfg.d_sae, first.cfg.d_output):
            raise ValueError(f"{where} has d_in={sae.cfg.d_in}, d_sae={sae.cfg.d_sae}, d_out={sae.cfg.d_output}; "
                             f"transcoder 0 has {first.cfg.d_in}, {first.cfg.d_sae}, {first.cfg.d_output}")
        if sae.dtype != first.dtype or sae.device != first.device:
            raise ValueError(f"{where} is {sae.dtype} on {sae.device}; transcoder 0 is {first.dtype} on {first.device}")
    if first.cfg.d_in != first.cfg.d_output:
        raise ValueError(f"the transcoders read d_in={first.cfg.d_in} and write d_out={first.cfg.d_output}; a "
                         "transcoder set reads and writes the residual width d_model")
    _, hook_in = _split(first.cfg.hook_name, "")
    _, hook_out = _split(first.cfg.hook_out, "")
    jump = isinstance(first, JumpReLUTranscoder)
    skip = hasattr(first, "W_skip")
    with torch.no_grad():
        return TranscoderSet(
            torch.stack([s.W_enc for s in saes]), torch.stack([s.b_enc for s in saes]),
            [s.W_dec[:, None, :] for s in saes], torch.stack([s.b_dec for s in saes]),
            input_hook=hook_in, output_hook=hook_out,
            W_skip=torch.stack([s.W_skip for s in saes]) if skip else None,
            activation="jumprelu" if jump else "relu",
            threshold=torch.stack([s.threshold.clamp_min(0) for s in saes]) if jump else None,
            cross_layer=False, metadata=metadata if metadata is not None else dict(first.cfg.metadata))


def to_saes(ts: TranscoderSet) -> list:
    """One glassbox transcoder per layer of a per-layer ReLU or JumpReLU set (module docstring)."""
    from ..sae.architectures import sae_class

    if not isinstance(ts, TranscoderSet):
        raise TypeError(f"to_saes takes a TranscoderSet, got {type(ts).__name__}")
    if ts.cross_layer:
        raise ValueError("to_saes: a cross-layer set writes every later layer; SAELens's transcoders write one "
                         "layer each (save it with save_circuit_tracer)")
    if ts.activation == "topk":
        raise ValueError("to_saes: SAELens has no TopK transcoder; a TopK set is saved with save_circuit_tracer")
    if ts.activation == "jumprelu" and bool((ts.thresholds < 0).any()):
        layer, feature = (int(i) for i in (ts.thresholds < 0).nonzero()[0])
        raise ValueError(f"to_saes: threshold of layer {layer}, feature {feature} is "
                         f"{float(ts.thresholds[layer, feature].detach()):.4g} < 0: circuit-tracer's JumpReLU passes "
                         "pre-activations in (threshold, 0], SAELens's relu(pre) * (pre > threshold) does not")
    arch = {("relu", False): "transcoder", ("relu", True): "skip_transcoder",
            ("jumprelu", False): "jumprelu_transcoder", ("jumprelu", True): "jumprelu_skip_transcoder"}
    architecture = arch[(ts.activation, ts.skip)]
    out = []
    with torch.no_grad():
        for l in range(ts.n_layers):
            cfg = SAEConfig(architecture=architecture, d_in=ts.d_model, d_sae=ts.d_transcoder,
                            hook_name=ts.feature_input_hook(l), hook_name_out=ts.feature_output_hook(l),
                            apply_b_dec_to_input=False, d_out=ts.d_model, metadata=dict(ts.metadata))
            sae = sae_class(architecture)(cfg, device=ts.device, dtype=ts.dtype)
            sae.W_enc.copy_(ts.W_enc(l))
            sae.b_enc.copy_(ts.b_enc(l))
            sae.W_dec.copy_(ts.decoder_weights(l)[:, 0, :])
            sae.b_dec.copy_(ts.b_dec(l))
            if ts.skip:
                sae.W_skip.copy_(ts.W_skip(l))
            if ts.activation == "jumprelu":
                sae.threshold.copy_(ts.threshold(l))
            out.append(sae.eval())
    return out


def load_saelens_set(folder_or_folders: Union[str, Path, Sequence], device=None, dtype=None) -> TranscoderSet:
    """A per-layer set from SAELens transcoder folders (module docstring); refusals name the file."""
    from ..sae.format import CFG_FILENAME, load_sae

    if isinstance(folder_or_folders, (str, Path)):
        parent = Path(folder_or_folders)
        if not parent.is_dir():
            raise FileNotFoundError(f"{parent}: no such folder of SAELens transcoder folders")
        folders = sorted(p.parent for p in parent.glob(f"*/{CFG_FILENAME}"))
        if not folders:
            raise FileNotFoundError(f"{parent}: holds no SAELens transcoder folder (a subfolder with {CFG_FILENAME})")
    else:
        folders = [Path(f) for f in folder_or_folders]
    by_layer = {}
    for folder in folders:
        sae = load_sae(folder, device=device, dtype=dtype)
        if not isinstance(sae, Transcoder):
            raise ValueError(f"{folder / CFG_FILENAME}: architecture {sae.architecture!r} is not a transcoder")
        layer, _ = _split(sae.cfg.hook_name, str(folder / CFG_FILENAME) + ": metadata.hook_name")
        if layer in by_layer:
            raise ValueError(f"{folder / CFG_FILENAME}: a second transcoder for layer {layer} (the first is in "
                             f"{by_layer[layer][0]})")
        by_layer[layer] = (folder, sae)
    missing = [l for l in range(max(by_layer) + 1) if l not in by_layer]
    if missing:
        raise FileNotFoundError(f"no transcoder for layer {missing[0]} among {', '.join(str(f) for f in folders)}; "
                                "a set has one for every layer from 0")
    try:
        return from_saes([by_layer[l][1] for l in sorted(by_layer)])
    except (TypeError, ValueError) as e:
        raise ValueError(f"the SAELens transcoders in {', '.join(str(f) for f in folders)} do not make one set: "
                         f"{e}") from None


def save_saelens_set(ts: TranscoderSet, folder: Union[str, Path], overwrite: bool = False) -> Path:
    """Write each layer's transcoder to ``folder/layer_{l}`` in SAELens's format (module docstring).
    Everything is checked before the first file is written; each layer's folder is written crash-safe."""
    from ..sae.format import save_sae

    saes = to_saes(ts)
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{folder}: a file, not a folder; name a folder")
    existing = [folder / f"layer_{l}" for l in range(len(saes)) if (folder / f"layer_{l}").exists()]
    if existing and not overwrite:
        raise FileExistsError(f"{existing[0]} exists; pass overwrite=True to replace the set's folders")
    for l, sae in enumerate(saes):
        save_sae(sae, folder / f"layer_{l}", overwrite=overwrite)
    return folder
