"""circuit-tracer's on-disk layout (0.5): ``load_circuit_tracer(folder)`` and ``save_circuit_tracer(ts, folder)``.

The folder (circuit-tracer's local cache layout, ``load_transcoders_from_cache``):
- ``config.yaml``: ``model_kind`` (``transcoder_set`` or ``cross_layer_transcoder``),
  ``feature_input_hook`` and ``feature_output_hook`` (TransformerLens names relative to the block),
  optionally ``transcoders`` (a per-layer set's files, layer by layer) and ``scan``. glassbox also
  writes ``n_layers``, ``d_model``, ``d_transcoder`` (circuit-tracer ignores them; a file that has them
  is checked against its tensors) and ``model_name`` when the set's metadata has one.
- per-layer (``transcoder_set``): ``layer_{l}.safetensors`` with ``W_enc`` [d_transcoder d_model],
  ``W_dec`` [d_transcoder d_model], ``b_enc`` [d_transcoder], ``b_dec`` [d_model], and optionally
  ``activation_function.threshold`` [d_transcoder] (JumpReLU; else ReLU) and ``W_skip`` [d_model
  d_model] (applied ``x @ W_skip.T``). circuit-tracer loads them with a strict ``load_state_dict``, so
  another key is refused here too.
- cross-layer (``cross_layer_transcoder``): ``W_enc_{l}.safetensors`` with ``W_enc_{l}`` [d_transcoder
  d_model], ``b_enc_{l}`` [d_transcoder], ``b_dec_{l}`` [d_model] (the bias of target layer l) and
  optionally ``threshold_{l}`` [d_transcoder]; ``W_dec_{l}.safetensors`` with ``W_dec_{l}``
  [d_transcoder n_layers-l d_model]. circuit-tracer counts the ``W_enc_*`` files for n_layers and reads
  the thresholds only if ``threshold_0`` exists, so a gap or a threshold missing in one layer is refused.
circuit-tracer's JumpReLU is ``pre * (pre > threshold)``, the set's own (``set.py``).

What circuit-tracer's layout cannot hold (a TopK set, a cross-layer set with skip connections: its
cross-layer files have no ``W_skip``) glassbox writes with ``model_kind`` ``glassbox_transcoder_set`` /
``glassbox_cross_layer_transcoder`` and ``activation_function: topk`` with ``k``, ``skip: true``
(``W_skip_{l}`` in ``W_enc_{l}.safetensors``): circuit-tracer refuses the unknown kind instead of
silently computing something else.

Hook names: circuit-tracer's ``mlp.hook_in`` (the wrapped MLP's input) is glassbox's ``ln2.hook_out``,
its ``mlp.hook_out`` glassbox's ``hook_mlp_out`` (but see ``set.py`` on sandwich norms); the others
(``hook_resid_mid``, ``ln2.hook_normalized``, ``hook_mlp_out``) are the same names. Saving writes
``ln2.hook_out`` as ``mlp.hook_in``, which every TransformerLens model has under circuit-tracer.

Refused on load, naming the file and key: a missing file or key, an unexpected key, a wrong shape (both
shapes given), a NaN or inf (also one that overflows the dtype asked for), ``hf://`` paths (no
downloads), a config field of the wrong type or contradicting the tensors. Writing goes through
``glassbox.fs.FolderWriter``: crash-safe, the folder's other files (a user's README) kept; files of
circuit-tracer's patterns in a folder without glassbox's record are the set's (replaced or removed, so
that a smaller set saved over a larger one leaves no stray ``layer_5.safetensors`` for circuit-tracer's glob).
"""

import errno
import re
from pathlib import Path
from typing import Optional, Union

import torch
from safetensors import safe_open

from ...fs import FolderWriter, recover
from ..sae.checks import non_finite
from ..sae.format import DTYPE_NAMES, parse_dtype
from .set import TranscoderSet, _block_hook

CONFIG = "config.yaml"
KINDS = ("transcoder_set", "cross_layer_transcoder", "glassbox_transcoder_set", "glassbox_cross_layer_transcoder")
CT_TO_GLASSBOX = {"mlp.hook_in": "ln2.hook_out", "mlp.hook_out": "hook_mlp_out"}
GLASSBOX_TO_CT = {"ln2.hook_out": "mlp.hook_in"}
FILE_PATTERN = re.compile(r"^(layer|W_enc|W_dec)_(\d+)\.safetensors$")
OWNER = "transcoders"


def _read_config(folder: Path) -> dict:
    import yaml

    path = folder / CONFIG
    if not path.is_file():
        raise FileNotFoundError(errno.ENOENT, f"no {CONFIG} (circuit-tracer's transcoder folder has one, naming "
                                "model_kind and the hooks)", str(path))
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: not a YAML config ({type(e).__name__}: {e})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: the config is a YAML {type(config).__name__}, not a mapping")
    for key in ("model_kind", "feature_input_hook", "feature_output_hook"):
        if key not in config:
            raise KeyError(f"{path}: missing key {key!r}")
        if not isinstance(config[key], str):
            raise ValueError(f"{path}: key {key!r} must be a string, got {config[key]!r}")
    if config["model_kind"] not in KINDS:
        raise ValueError(f"{path}: model_kind {config['model_kind']!r} is not one of {', '.join(KINDS)}")
    for key in ("n_layers", "d_model", "d_transcoder", "k"):
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{path}: key {key!r} must be a positive int, got {value!r}")
    return config


def _hook(config: dict, key: str, path: Path) -> str:
    name = config[key]
    try:
        return _block_hook(CT_TO_GLASSBOX.get(name, name), key)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


class _Reader:
    """Tensors of one safetensors file, each checked for its key, shape and finiteness."""

    def __init__(self, path: Path, dtype: Optional[torch.dtype]):
        if not path.is_file():
            raise FileNotFoundError(errno.ENOENT, "no such transcoder file", str(path))
        self.path, self.dtype = path, dtype
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                self.keys = list(f.keys())
                self.tensors = {k: f.get_tensor(k) for k in self.keys}
        except Exception as e:  # safetensors' own parse errors
            raise ValueError(f"{path}: not a safetensors file ({type(e).__name__}: {e})") from None

    def allow(self, required, optional=()) -> None:
        for key in required:
            if key not in self.tensors:
                raise KeyError(f"{self.path}: missing key {key!r} (the file has {', '.join(self.keys) or 'no keys'})")
        extra = [k for k in self.keys if k not in required and k not in optional]
        if extra:
            raise ValueError(f"{self.path}: unexpected key(s) {', '.join(map(repr, extra))} (the layout has "
                             f"{', '.join(list(required) + list(optional))}; circuit-tracer would refuse or ignore it)")

    def get(self, key: str, shape: tuple) -> torch.Tensor:
        t = self.tensors[key]
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{self.path}: key {key!r} has shape {tuple(t.shape)}; expected {tuple(shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{self.path}: key {key!r} has dtype {t.dtype}; transcoder weights are floats")
        problem = non_finite(t)
        if problem is not None:
            raise ValueError(f"{self.path}: key {key!r} {problem}; a transcoder with it computes NaN or silently "
                             "drops features, so it is refused")
        out = t.to(self.dtype or t.dtype)
        if non_finite(out) is not None:
            raise ValueError(f"{self.path}: key {key!r} is finite in the file ({t.dtype}) but {non_finite(out)} in "
                             f"{self.dtype}, the dtype asked for; load it in a wider dtype")
        return out


def _layer_files(folder: Path, config: dict, prefix: str) -> list:
    """The per-layer files ``prefix_{l}.safetensors`` for l = 0..n-1 (or a per-layer config's ``transcoders``)."""
    path = folder / CONFIG
    if prefix == "layer" and config.get("transcoders") is not None:
        paths = config["transcoders"]
        if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and p for p in paths):
            raise ValueError(f"{path}: key 'transcoders' must be a list of file names, got {paths!r}")
        for p in paths:
            if p.startswith("hf://"):
                raise ValueError(f"{path}: key 'transcoders' names {p!r}, a Hugging Face file; glassbox reads local "
                                 "folders only (download it with circuit-tracer's save_transcoders_to_cache first)")
        files = [Path(p) if Path(p).is_absolute() else folder / p for p in paths]
        stray = sorted(e.name for e in folder.iterdir() if (m := FILE_PATTERN.match(e.name)) and m.group(1) == "layer"
                       and e not in files)
        if stray:
            raise ValueError(f"{folder / stray[0]}: a layer file that {path}'s 'transcoders' does not list; "
                             "circuit-tracer's loader of a local folder reads every layer_*.safetensors")
        return files
    found = {}
    for entry in folder.iterdir():
        match = FILE_PATTERN.match(entry.name)
        if match and match.group(1) == prefix:
            found[int(match.group(2))] = entry
    if not found:
        raise FileNotFoundError(errno.ENOENT, f"{CONFIG} says model_kind {config['model_kind']!r}, and the folder "
                                f"has no {prefix}_0.safetensors", str(folder / f"{prefix}_0.safetensors"))
    n = max(found) + 1
    missing = [l for l in range(n) if l not in found]
    if missing:
        raise FileNotFoundError(errno.ENOENT, f"the folder has {prefix} files up to layer {n - 1} and not layer "
                                f"{missing[0]}", str(folder / f"{prefix}_{missing[0]}.safetensors"))
    return [found[l] for l in range(n)]


def _check_config_sizes(config: dict, path: Path, sizes: dict) -> None:
    for key, value in sizes.items():
        if config.get(key) is not None and config[key] != value:
            raise ValueError(f"{path}: key {key!r} is {config[key]}, but the tensors have {key}={value}")


def load_circuit_tracer(folder: Union[str, Path], device=None, dtype=None) -> TranscoderSet:
    """The TranscoderSet saved in circuit-tracer's layout in ``folder`` (module docstring). ``dtype`` None
    keeps the files' (layer 0's ``W_enc``); ``device`` None is the CPU."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(errno.ENOENT, "no such transcoder folder", str(folder))
    recover(folder)  # an interrupted save_circuit_tracer finished first
    dtype = None if dtype is None else parse_dtype(dtype, "load_circuit_tracer")
    config = _read_config(folder)
    path = folder / CONFIG
    kind = config["model_kind"]
    glassbox_kind = kind.startswith("glassbox_")
    activation = config.get("activation_function")
    if activation is not None and (not glassbox_kind or activation not in ("relu", "jumprelu", "topk")):
        raise ValueError(f"{path}: activation_function={activation!r} with model_kind {kind!r}: circuit-tracer "
                         "reads the activation from the files (a threshold: JumpReLU, else ReLU); only the glassbox "
                         "kinds name one (relu, jumprelu, topk)")
    skip_field = config.get("skip")
    if skip_field is not None and (not glassbox_kind or not isinstance(skip_field, bool)):
        raise ValueError(f"{path}: key 'skip' must be true or false, and only with a glassbox model_kind; got "
                         f"{skip_field!r} with {kind!r}")
    k = config.get("k")
    if (activation == "topk") != (k is not None):
        raise ValueError(f"{path}: key 'k' is for activation_function 'topk' and needed by it; got k={k!r} with "
                         f"activation_function={activation!r}")
    hooks = dict(input_hook=_hook(config, "feature_input_hook", path),
                 output_hook=_hook(config, "feature_output_hook", path))
    metadata = {key: config[key] for key in ("model_name", "scan") if config.get(key) is not None}
    if kind.endswith("cross_layer_transcoder"):
        parts = _load_cross_layer(folder, config, dtype, bool(skip_field))
    else:
        parts = _load_per_layer(folder, config, dtype)
    W_enc = parts["W_enc"]
    if activation == "jumprelu" and parts.get("threshold") is None:
        raise KeyError(f"{path}: activation_function 'jumprelu', and the files hold no threshold")
    if activation in ("relu", "topk") and parts.get("threshold") is not None:
        raise ValueError(f"{path}: activation_function {activation!r}, and the files hold thresholds")
    act = activation or ("jumprelu" if parts.get("threshold") is not None else "relu")
    _check_config_sizes(config, path, {"n_layers": W_enc.shape[0], "d_model": W_enc.shape[1],
                                       "d_transcoder": W_enc.shape[2]})
    try:
        ts = TranscoderSet(W_enc, parts["b_enc"], parts["W_dec"], parts["b_dec"], W_skip=parts.get("W_skip"),
                           activation=act, threshold=parts.get("threshold"), k=k,
                           cross_layer=kind.endswith("cross_layer_transcoder"), metadata=metadata, **hooks)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return ts.to(device) if device is not None else ts


def _load_per_layer(folder: Path, config: dict, dtype) -> dict:
    files = _layer_files(folder, config, "layer")
    out = {name: [] for name in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold", "W_skip")}
    first = None
    for l, file in enumerate(files):
        r = _Reader(file, dtype)
        r.allow(("W_enc", "W_dec", "b_enc", "b_dec"), ("activation_function.threshold", "W_skip"))
        if first is None:
            for key in ("b_enc", "b_dec"):
                if r.tensors[key].ndim != 1:
                    raise ValueError(f"{file}: key {key!r} has shape {tuple(r.tensors[key].shape)}; expected a vector")
            first = (r.tensors["b_enc"].shape[0], r.tensors["b_dec"].shape[0], set(r.keys), file)
            r.dtype = dtype = dtype or r.tensors["W_enc"].dtype
        d_t, d_m, keys0, file0 = first
        for key in ("activation_function.threshold", "W_skip"):
            if (key in r.keys) != (key in keys0):
                raise ValueError(f"{file}: key {key!r} is {'present' if key in r.keys else 'missing'}, and "
                                 f"{'missing' if key in r.keys else 'present'} in {file0}; circuit-tracer reads "
                                 "layer 0's kind for every layer")
        out["W_enc"].append(r.get("W_enc", (d_t, d_m)).T)
        out["W_dec"].append(r.get("W_dec", (d_t, d_m))[:, None, :])
        out["b_enc"].append(r.get("b_enc", (d_t,)))
        out["b_dec"].append(r.get("b_dec", (d_m,)))
        if "activation_function.threshold" in keys0:
            out["threshold"].append(r.get("activation_function.threshold", (d_t,)))
        if "W_skip" in keys0:
            out["W_skip"].append(r.get("W_skip", (d_m, d_m)))
    parts = {name: torch.stack(v) for name, v in out.items() if v and name != "W_dec"}
    parts["W_dec"] = out["W_dec"]
    return parts


def _load_cross_layer(folder: Path, config: dict, dtype, skip: bool) -> dict:
    enc_files = _layer_files(folder, config, "W_enc")
    n = len(enc_files)
    out = {name: [] for name in ("W_enc", "b_enc", "b_dec", "threshold", "W_skip")}
    W_dec, sizes, has_threshold = [], None, None
    for l, file in enumerate(enc_files):
        r = _Reader(file, dtype)
        optional = (f"threshold_{l}",) + ((f"W_skip_{l}",) if skip else ())
        r.allow((f"W_enc_{l}", f"b_enc_{l}", f"b_dec_{l}") + ((f"W_skip_{l}",) if skip else ()), optional)
        if sizes is None:
            if r.tensors["W_enc_0"].ndim != 2:
                raise ValueError(f"{file}: key 'W_enc_0' has shape {tuple(r.tensors['W_enc_0'].shape)}; expected "
                                 "[d_transcoder d_model]")
            sizes = tuple(r.tensors["W_enc_0"].shape)
            has_threshold = "threshold_0" in r.keys
            r.dtype = dtype = dtype or r.tensors["W_enc_0"].dtype
        elif (f"threshold_{l}" in r.keys) != has_threshold:
            raise ValueError(f"{file}: key 'threshold_{l}' is {'present' if not has_threshold else 'missing'}, and "
                             f"threshold_0 is {'present' if has_threshold else 'missing'} in {enc_files[0]}; "
                             "circuit-tracer reads thresholds only if layer 0 has one")
        d_t, d_m = sizes
        out["W_enc"].append(r.get(f"W_enc_{l}", (d_t, d_m)).T)
        out["b_enc"].append(r.get(f"b_enc_{l}", (d_t,)))
        out["b_dec"].append(r.get(f"b_dec_{l}", (d_m,)))
        if has_threshold:
            out["threshold"].append(r.get(f"threshold_{l}", (d_t,)))
        if skip:
            out["W_skip"].append(r.get(f"W_skip_{l}", (d_m, d_m)))
        dec = _Reader(folder / f"W_dec_{l}.safetensors", dtype)
        dec.allow((f"W_dec_{l}",))
        W_dec.append(dec.get(f"W_dec_{l}", (d_t, n - l, d_m)))
    stray = [e.name for e in folder.iterdir() if (m := FILE_PATTERN.match(e.name)) and m.group(1) == "W_dec"
             and int(m.group(2)) >= n]
    if stray:
        raise ValueError(f"{folder / stray[0]}: a decoder file for a layer past the last encoder file "
                         f"(W_enc_{n - 1}); circuit-tracer counts the W_enc files for n_layers")
    parts = {name: torch.stack(v) for name, v in out.items() if v}
    parts["W_dec"] = W_dec
    return parts


def _config_text(ts: TranscoderSet, files: Optional[list]) -> str:
    import yaml

    kind = "cross_layer_transcoder" if ts.cross_layer else "transcoder_set"
    native = ts.activation != "topk" and not (ts.cross_layer and ts.skip)
    config = {"model_kind": kind if native else f"glassbox_{kind}",
              "feature_input_hook": GLASSBOX_TO_CT.get(ts.input_hook, ts.input_hook),
              "feature_output_hook": ts.output_hook,
              "n_layers": ts.n_layers, "d_model": ts.d_model, "d_transcoder": ts.d_transcoder}
    if not native:
        config.update(activation_function=ts.activation, skip=ts.skip)
        if ts.k is not None:
            config["k"] = ts.k
    if files is not None:
        config["transcoders"] = files
    for key in ("model_name", "scan"):
        if isinstance(ts.metadata.get(key), str):
            config[key] = ts.metadata[key]
    return yaml.safe_dump(config, sort_keys=False)


def save_circuit_tracer(ts: TranscoderSet, folder: Union[str, Path], overwrite: bool = False) -> Path:
    """Write ``ts`` to ``folder`` in circuit-tracer's layout (module docstring), in the set's dtype. An
    existing folder is refused unless ``overwrite``. Returns the folder."""
    if not isinstance(ts, TranscoderSet):
        raise TypeError(f"save_circuit_tracer takes a TranscoderSet, got {type(ts).__name__}")
    if ts.dtype not in DTYPE_NAMES:
        raise ValueError(f"save_circuit_tracer: safetensors has no dtype {ts.dtype}")
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "save_circuit_tracer: a file, not a folder; name a folder", str(folder))
    if folder.exists() and not overwrite:
        raise FileExistsError(errno.EEXIST, "exists; pass overwrite=True to replace the set in it", str(folder))

    def cpu(t):
        return t.detach().to("cpu").contiguous().clone()

    files = {}
    for l in range(ts.n_layers):
        if ts.cross_layer:
            enc = {f"W_enc_{l}": cpu(ts.W_enc(l).T), f"b_enc_{l}": cpu(ts.b_enc(l)), f"b_dec_{l}": cpu(ts.b_dec(l))}
            if ts.activation == "jumprelu":
                enc[f"threshold_{l}"] = cpu(ts.threshold(l))
            if ts.skip:
                enc[f"W_skip_{l}"] = cpu(ts.W_skip(l))
            files[f"W_enc_{l}.safetensors"] = enc
            files[f"W_dec_{l}.safetensors"] = {f"W_dec_{l}": cpu(ts.decoder_weights(l))}
        else:
            tensors = {"W_enc": cpu(ts.W_enc(l).T), "W_dec": cpu(ts.decoder_weights(l)[:, 0, :]),
                       "b_enc": cpu(ts.b_enc(l)), "b_dec": cpu(ts.b_dec(l))}
            if ts.activation == "jumprelu":
                tensors["activation_function.threshold"] = cpu(ts.threshold(l))
            if ts.skip:
                tensors["W_skip"] = cpu(ts.W_skip(l))
            files[f"layer_{l}.safetensors"] = tensors
    text = _config_text(ts, None if ts.cross_layer else list(files))
    adopt = [CONFIG] + sorted(e.name for e in folder.iterdir() if FILE_PATTERN.match(e.name)) if folder.is_dir() else []
    with FolderWriter(folder, OWNER, adopt=adopt) as writer:
        for name, tensors in files.items():
            writer.save_safetensors(name, tensors)
        writer.write_text(CONFIG, text)
    return folder
