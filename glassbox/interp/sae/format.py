"""SAELens's on-disk format: ``load_sae(folder)`` and ``save_sae(sae, folder)``.

A folder holds (SAELens 6's names, ``SAE.save_model`` / ``SAE.load_from_disk``):
- ``cfg.json``: ``architecture``, ``d_in``, ``d_sae``, ``dtype`` ("float32"...), ``device``,
  ``apply_b_dec_to_input``, ``normalize_activations``, ``reshape_activations``, ``metadata`` (``hook_name``,
  ``hook_name_out`` for a transcoder, ``sae_lens_version``, model_name, context_size...), and per
  architecture ``k`` and ``rescale_acts_by_decoder_norm`` (topk), ``d_out`` (transcoders);
- ``sae_weights.safetensors``: ``W_enc`` [d_in d_sae], ``b_enc`` [d_sae] (not for gated), ``W_dec``
  [d_sae d_out], ``b_dec`` [d_out], and ``threshold`` (jumprelu), ``r_mag``/``b_gate``/``b_mag`` (gated),
  ``W_skip`` [d_out d_in] (skip transcoders);
- optionally ``sparsity.safetensors``: ``sparsity`` [d_sae], each feature's log10 firing frequency.
Safetensors only (never pickle). Configs from before SAELens 6 (``hook_point``, top-level ``hook_name``,
``activation_fn="topk"``...) are read as SAELens reads them.

``normalize_activations="expected_average_only_in"`` (``"covariance_whitening"``) means the SAE was
trained on activations scaled by a constant (whitened) that SAELens's trainer folds into the weights when
it finishes; a folder saved before that fold (a training checkpoint) keeps the statistics in
``activation_scaler.json`` (and ``activation_whitening.safetensors``: ``mean`` [d_in], ``matrix`` and
``inverse_matrix`` [d_in d_in]). ``load_sae`` folds them as SAELens's trainer does
(``SAE.fold_activation_norm_scaling_factor`` / ``fold_activation_whitening``) and loads a "none" SAE;
without those files the folder is refused (SAELens's ``load_from_disk`` would silently run the SAE on
raw inputs). A BatchTopK SAE is saved in its inference form, a JumpReLU SAE (as SAELens saves it); a
SAELens BatchTopK training checkpoint (architecture "batchtopk", with its ``topk_threshold``) loads as
glassbox's ``BatchTopKSAE``.

Writing goes through ``glassbox.fs.FolderWriter``: the files are written under temporary names in the
folder and renamed into place after a journal, so a failure or a kill leaves the old SAE or the new
one (``load_sae`` finishes an interrupted save first), never a mix. Only glassbox's own SAE files are
replaced or removed (``SAE_FILES``, or what the folder's ``.glassbox-files.json`` lists); a README,
notes or figures in the folder stay. A file where the folder goes is refused.
"""

import errno
import json
import math
from pathlib import Path
from typing import Optional, Union

import torch
from safetensors import safe_open

from ...fs import FolderWriter, recover
from ...fs.legacy import recover_sae_siblings
from .architectures import TRANSCODERS, BatchTopKSAE, sae_class
from .base import SAE
from .config import SAEConfig

CFG_FILENAME = "cfg.json"
WEIGHTS_FILENAME = "sae_weights.safetensors"
SPARSITY_FILENAME = "sparsity.safetensors"
SCALER_FILENAME = "activation_scaler.json"
WHITENING_FILENAME = "activation_whitening.safetensors"
# every file an SAE folder may hold: a folder saved without glassbox's record owns these
SAE_FILES = (CFG_FILENAME, WEIGHTS_FILENAME, SPARSITY_FILENAME, SCALER_FILENAME, WHITENING_FILENAME)
# the SAELens version whose format this writes (SAELens reads configs of versions < 6 another way)
SAELENS_FORMAT_VERSION = "6.54.12"

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
# metadata keys SAELens moves out of a pre-6 config's top level
LEGACY_METADATA_KEYS = ("model_name", "hook_name", "model_class_name", "hook_head_index",
                        "model_from_pretrained_kwargs", "prepend_bos", "exclude_special_tokens", "neuronpedia_id", "context_size", "seqpos_slice",
                        "dataset_path", "sae_lens_version", "sae_lens_training_version", "hook_name_out",
                        "hook_head_index_out", "hf_hook_name", "hf_hook_name_out")


def parse_dtype(value, where: str) -> torch.dtype:
    if isinstance(value, torch.dtype) and value in DTYPE_NAMES:
        return value
    name = value[len("torch."):] if isinstance(value, str) and value.startswith("torch.") else value
    if name not in DTYPES:
        raise ValueError(f"{where}: dtype {value!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[name]


def _version_tuple(version) -> tuple:
    parts = []
    for piece in str(version).split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit()) if piece else ""
        parts.append(int(digits) if digits and piece[:1].isdigit() else 0)
        if not piece[:1].isdigit():
            break
    return tuple(parts)


def _legacy_config(raw: dict) -> dict:
    """A pre-6 SAELens config in the 6 layout, as SAELens's ``handle_pre_6_0_config`` reads it."""
    renames = {"hook_point": "hook_name", "hook_point_head_index": "hook_head_index",
               "activation_fn_str": "activation_fn"}
    cfg = {renames.get(k, k): v for k, v in raw.items()}
    cfg.setdefault("apply_b_dec_to_input", True)
    cfg.setdefault("architecture", "standard")
    cfg.setdefault("reshape_activations", "hook_z" if "hook_z" in str(cfg.get("hook_name", "")) else "none")
    if cfg.get("activation_fn") == "topk" and (cfg.get("activation_fn_kwargs") or {}).get("k") is not None:
        cfg["architecture"] = "topk"
        cfg["k"] = cfg["activation_fn_kwargs"]["k"]
    if isinstance(cfg.get("normalize_activations"), bool):
        cfg["normalize_activations"] = "expected_average_only_in" if cfg["normalize_activations"] else "none"
    if cfg.get("normalize_activations") is None:
        cfg["normalize_activations"] = "none"
    cfg["metadata"] = {k: v for k, v in cfg.items() if k in LEGACY_METADATA_KEYS}
    return cfg


def read_config(folder: Union[str, Path]) -> dict:
    """``cfg.json`` of ``folder`` as a dict in SAELens 6's layout (pre-6 configs converted)."""
    path = Path(folder) / CFG_FILENAME
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no SAE config (an SAELens SAE folder has {CFG_FILENAME} and "
                                f"{WEIGHTS_FILENAME})")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a JSON config ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: the config is a JSON {type(raw).__name__}, not an object")
    meta = raw.get("metadata") if isinstance(raw.get("metadata"), dict) else {}
    version = raw.get("sae_lens_version") or meta.get("sae_lens_version")
    if not version or _version_tuple(version) < (6,):
        raw = _legacy_config(raw)
    return raw


def config_from_dict(raw: dict, where: str) -> SAEConfig:
    """The glassbox SAEConfig of a SAELens 6 config dict; ``where`` names the file in errors."""
    for key in ("architecture", "d_in", "d_sae"):
        if key not in raw:
            raise KeyError(f"{where}: missing key {key!r}")
    meta = raw.get("metadata")
    if not isinstance(meta, dict):
        raise KeyError(f"{where}: missing key 'metadata' (an object with 'hook_name')")
    if not meta.get("hook_name"):
        raise KeyError(f"{where}: missing key 'metadata.hook_name' (the hook point the SAE reads)")
    arch = raw["architecture"]
    try:
        sae_class(arch)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    extra = {}
    if arch in ("topk", "batchtopk"):
        # SAELens's defaults: k=100; rescale off for the inference TopK, on for the (training) BatchTopK
        extra = dict(k=raw.get("k", 100),
                     rescale_acts_by_decoder_norm=bool(raw.get("rescale_acts_by_decoder_norm", arch == "batchtopk")))
    if arch in TRANSCODERS:
        extra["d_out"] = raw.get("d_out", 768)  # SAELens's TranscoderConfig default
    if raw.get("finetuning_scaling_factor"):
        raise ValueError(f"{where}: finetuning_scaling_factor=True (a pre-6 SAELens fine-tuning scale) is not "
                         "supported")
    hook_out = meta.get("hook_name_out")
    try:
        return SAEConfig(architecture=arch, d_in=raw["d_in"], d_sae=raw["d_sae"], hook_name=meta["hook_name"],
                         hook_name_out=hook_out if hook_out and hook_out != meta["hook_name"] else None,
                         apply_b_dec_to_input=bool(raw.get("apply_b_dec_to_input", True)),
                         normalize_activations=raw.get("normalize_activations", "none") or "none",
                         reshape_activations=raw.get("reshape_activations", "none") or "none",
                         metadata={k: v for k, v in meta.items() if k not in ("hook_name", "hook_name_out")},
                         **extra)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def _scaler(folder: Path, cfg: SAEConfig) -> Optional[dict]:
    """``activation_scaler.json`` of ``folder`` (SAELens's trainer state), or None without the file."""
    path = folder / SCALER_FILENAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not an activation scaler config ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not an activation scaler config (a JSON {type(data).__name__})")
    return data


def training_normalization(folder: Path, cfg: SAEConfig):
    """The fold that turns an SAE trained on normalised activations into one reading raw activations
    (module docstring): a function of the SAE, or None for ``normalize_activations`` that the SAE computes
    itself. Refuses, naming the files, when the statistics are not in the folder."""
    mode, cfg_path = cfg.normalize_activations, folder / CFG_FILENAME
    if mode not in ("expected_average_only_in", "covariance_whitening"):
        return None
    if cfg.architecture in TRANSCODERS:
        raise ValueError(f"{cfg_path}: normalize_activations={mode!r} on a transcoder is not supported")
    scaler = _scaler(folder, cfg)
    where = folder / SCALER_FILENAME
    if mode == "expected_average_only_in":
        factor = None if scaler is None else scaler.get("scaling_factor")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor <= 0:
            got = " (no such file)" if scaler is None else f" (scaling_factor={factor!r})"
            raise ValueError(f"{cfg_path}: normalize_activations='expected_average_only_in' needs the scaling factor, "
                             f"which {where} does not give{got}; SAELens's load_from_disk would run the SAE on "
                             "unscaled inputs")
        return lambda sae: sae.fold_activation_norm_scaling_factor(float(factor))
    path = folder / WHITENING_FILENAME
    if scaler is None or not scaler.get("has_whitening", True) or not path.is_file():
        raise ValueError(f"{cfg_path}: normalize_activations='covariance_whitening' needs the whitening statistics "
                         f"({where} and {path}), which the folder does not have; SAELens's load_from_disk would "
                         "run the SAE on unwhitened inputs")
    shapes = {"mean": (cfg.d_in,), "matrix": (cfg.d_in, cfg.d_in), "inverse_matrix": (cfg.d_in, cfg.d_in)}
    with safe_open(str(path), framework="pt", device="cpu") as f:
        stats = {}
        for key, shape in shapes.items():
            if key not in f.keys():
                raise KeyError(f"{path}: missing key {key!r}")
            stats[key] = f.get_tensor(key)
            if tuple(stats[key].shape) != shape:
                raise ValueError(f"{path}: key {key!r} has shape {tuple(stats[key].shape)}; d_in={cfg.d_in} needs {shape}")
    return lambda sae: sae.fold_activation_whitening(stats["mean"], stats["matrix"], stats["inverse_matrix"])


SHIPPED_SAES_DIR = Path(__file__).resolve().parents[2] / "assets" / "saes"


def shipped_folder(folder: Union[str, Path]) -> Path:
    """``folder``, or the shipped SAE of that name when ``folder`` does not exist and one is shipped."""
    path = Path(folder)
    if not path.exists() and isinstance(folder, str) and path.name == folder \
            and (SHIPPED_SAES_DIR / folder / CFG_FILENAME).is_file():
        return SHIPPED_SAES_DIR / folder
    return path


def load_sae(folder: Union[str, Path], device: Union[str, torch.device, None] = None,
             dtype: Union[torch.dtype, str, None] = None, model=None) -> SAE:
    """The SAE saved in ``folder`` (SAELens's format, module docstring).

    ``device``: None is the model's device when ``model`` is given, else "cpu" (as SAELens's
    ``load_from_disk``); ``dtype``: None is the config's ``dtype``. With ``model``, the SAE's hooks and
    widths are checked against the model's (``SAE.check_fits``). Every refusal names the file and key.
    ``folder`` may also name an SAE shipped with glassbox (``"glassbox-austen-L1-resid-pre"``: a folder of
    ``glassbox/assets/saes``) when no folder of that name exists."""
    folder = shipped_folder(folder)
    recover_sae_siblings(folder)
    recover(folder)  # an interrupted save_sae finished first: never a mix of two SAEs
    cfg_path = folder / CFG_FILENAME
    raw = read_config(folder)
    cfg = config_from_dict(raw, str(cfg_path))
    dtype = parse_dtype(raw.get("dtype", "float32"), str(cfg_path)) if dtype is None else parse_dtype(dtype, "load_sae")
    if device is None:
        device = next(model.parameters()).device if model is not None else "cpu"
    fold = training_normalization(folder, cfg)
    if fold is not None:
        cfg.normalize_activations = "none"
    try:
        sae = sae_class(cfg.architecture)(cfg, device=device, dtype=dtype)
    except ValueError as e:
        raise ValueError(f"{cfg_path}: {e}") from None
    tensors = read_weights(folder / WEIGHTS_FILENAME, sae)
    with torch.no_grad():
        for name, target in sae.state_dict().items():
            target.copy_(tensors[name])
        if fold is not None:
            fold(sae)
    if model is not None:
        try:
            sae.check_fits(model)
        except KeyError as e:
            raise KeyError(f"{cfg_path}: {e.args[0]}") from None
        except ValueError as e:
            raise ValueError(f"{cfg_path}: {e}") from None
    return sae


def read_weights(path: Path, sae: SAE) -> dict:
    """The tensors of ``path``, checked against ``sae``'s state (parameter and buffer names and shapes),
    each in the dtype of its parameter or buffer."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no SAE weights")
    state = sae.state_dict()
    expected = {name: tuple(t.shape) for name, t in state.items()}
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            keys = list(f.keys())
            for name in expected:
                if name not in keys:
                    raise KeyError(f"{path}: missing key {name!r} ({sae.architecture} SAEs have "
                                   f"{', '.join(expected)})")
            unexpected = [k for k in keys if k not in expected and k != "scaling_factor"]
            if unexpected:
                raise ValueError(f"{path}: unexpected key(s) {', '.join(map(repr, unexpected))} for a "
                                 f"{sae.architecture} SAE (it has {', '.join(expected)})")
            out = {}
            for name, shape in expected.items():
                t = f.get_tensor(name)
                if tuple(t.shape) != shape:
                    raise ValueError(f"{path}: key {name!r} has shape {tuple(t.shape)}; a {sae.architecture} SAE "
                                     f"with d_in={sae.cfg.d_in}, d_sae={sae.cfg.d_sae}"
                                     f"{f', d_out={sae.cfg.d_output}' if sae.cfg.d_out else ''} needs {shape}")
                out[name] = t.to(state[name].dtype)
            if "scaling_factor" in keys and not torch.all(f.get_tensor("scaling_factor") == 1):
                raise ValueError(f"{path}: key 'scaling_factor' is not all ones (a pre-6 SAELens fine-tuning "
                                 "scale), not supported")
    except (KeyError, ValueError, FileNotFoundError):
        raise
    except Exception as e:  # safetensors' own parse errors
        raise ValueError(f"{path}: not a safetensors file ({type(e).__name__}: {e})") from None
    return out


def load_sparsity(folder: Union[str, Path], device: Union[str, torch.device, None] = None) -> Optional[torch.Tensor]:
    """``sparsity.safetensors``'s ``sparsity`` [d_sae] (log10 feature firing frequency), or None."""
    recover(folder)
    path = Path(folder) / SPARSITY_FILENAME
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt", device="cpu") as f:
        if "sparsity" not in f.keys():
            raise KeyError(f"{path}: missing key 'sparsity'")
        t = f.get_tensor("sparsity")
    return t.to(device) if device is not None else t


def sae_config_dict(sae: SAE) -> dict:
    """``cfg.json`` of ``sae`` in SAELens 6's keys."""
    cfg = sae.cfg
    meta = {"sae_lens_version": SAELENS_FORMAT_VERSION, "sae_lens_training_version": SAELENS_FORMAT_VERSION,
            **cfg.metadata, "hook_name": cfg.hook_name}
    if not meta.get("sae_lens_version") or _version_tuple(meta["sae_lens_version"]) < (6,):
        meta["sae_lens_version"] = SAELENS_FORMAT_VERSION  # SAELens reads the layout of older versions otherwise
    if cfg.hook_name_out is not None:
        meta["hook_name_out"] = cfg.hook_name_out
    else:
        meta.pop("hook_name_out", None)
    out = {"d_in": cfg.d_in, "d_sae": cfg.d_sae, "dtype": DTYPE_NAMES[sae.dtype], "device": str(sae.device),
           "apply_b_dec_to_input": cfg.apply_b_dec_to_input, "normalize_activations": cfg.normalize_activations,
           "reshape_activations": cfg.reshape_activations, "metadata": meta}
    if sae.architecture == "topk":
        out.update(k=cfg.k, rescale_acts_by_decoder_norm=cfg.rescale_acts_by_decoder_norm)
    if sae.architecture in TRANSCODERS:
        out["d_out"] = cfg.d_output
    out["architecture"] = sae.architecture
    return out


def save_sae(sae: SAE, folder: Union[str, Path], sparsity: Optional[torch.Tensor] = None,
             overwrite: bool = False) -> Path:
    """Write ``sae`` to ``folder`` in SAELens's format (module docstring); ``sparsity`` [d_sae] (log10
    firing frequencies) goes to ``sparsity.safetensors``. An existing ``folder`` is refused unless
    ``overwrite``; then the SAE's files are replaced in place and the folder's other files (a README,
    notes, figures) are kept (``glassbox.fs.FolderWriter``; a file where the folder goes is refused).
    Returns the folder."""
    if not isinstance(sae, SAE):
        raise TypeError(f"save_sae takes a glassbox SAE, got {type(sae).__name__}")
    if isinstance(sae, BatchTopKSAE):
        sae = sae.to_jumprelu()
    if sae.cfg.is_transcoder and sae.architecture not in TRANSCODERS:
        raise ValueError(f"save_sae: this {sae.architecture!r} SAE writes at {sae.cfg.hook_name_out!r}, not where "
                         f"it reads; SAELens would load it as a plain SAE at {sae.cfg.hook_name!r}. Save it as one of "
                         f"the transcoder architectures ({', '.join(TRANSCODERS)})")
    if sae.dtype not in DTYPE_NAMES:
        raise ValueError(f"save_sae: SAELens's format has no dtype {sae.dtype}")
    folder = Path(folder)
    recover_sae_siblings(folder)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "save_sae: this is a file, not a folder; name a folder", str(folder))
    if folder.exists() and not overwrite:
        raise FileExistsError(f"{folder} exists; pass overwrite=True to replace it")
    if sparsity is not None and (not isinstance(sparsity, torch.Tensor) or tuple(sparsity.shape) != (sae.cfg.d_sae,)):
        raise ValueError(f"save_sae: sparsity must be a tensor of shape ({sae.cfg.d_sae},), got "
                         f"{getattr(sparsity, 'shape', type(sparsity).__name__)}")
    config = sae_config_dict(sae)
    tensors = {name: p.detach().to("cpu").contiguous().clone() for name, p in sae.named_parameters()}
    with FolderWriter(folder, "sae", adopt=SAE_FILES) as writer:
        writer.save_safetensors(WEIGHTS_FILENAME, tensors)
        writer.write_text(CFG_FILENAME, json.dumps(config))
        if sparsity is not None:
            writer.save_safetensors(SPARSITY_FILENAME, {"sparsity": sparsity.detach().to("cpu").contiguous().clone()})
    return folder
