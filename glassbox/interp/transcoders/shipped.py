"""``load_transcoders(name_or_folder)``: a TranscoderSet from a folder in either format, or by the name of a
set shipped with glassbox (``glassbox/assets/transcoders/<name>``, each with a model card).

A folder with ``config.yaml`` is circuit-tracer's layout (``circuit_tracer.py``); a folder of SAELens
transcoder folders (subfolders with ``cfg.json``) is read by ``saelens.load_saelens_set``. A name that is
not a folder and not shipped is refused listing the shipped ones.
"""

from pathlib import Path
from typing import Union

from .circuit_tracer import CONFIG, load_circuit_tracer
from .saelens import load_saelens_set
from .set import TranscoderSet

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "assets" / "transcoders"


def shipped_transcoders() -> list:
    """The names of the transcoder sets shipped with glassbox."""
    return sorted(p.parent.name for p in SHIPPED_DIR.glob(f"*/{CONFIG}"))


def load_transcoders(name_or_folder: Union[str, Path], device=None, dtype=None, model=None) -> TranscoderSet:
    """The set in ``name_or_folder`` (module docstring); with ``model``, checked to fit it (``check_fits``)."""
    path = Path(name_or_folder)
    if not path.exists() and isinstance(name_or_folder, str) and path.name == name_or_folder:
        if name_or_folder not in shipped_transcoders():
            from ...suggest import did_you_mean

            shipped = shipped_transcoders()
            raise FileNotFoundError(f"{name_or_folder!r}: no such transcoder folder, nor a set shipped with glassbox "
                                    f"(shipped: {', '.join(shipped) or 'none'}){did_you_mean(name_or_folder, shipped)}")
        path = SHIPPED_DIR / name_or_folder
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: {'a file' if path.exists() else 'no such folder'}; a transcoder set is a "
                                f"folder ({CONFIG} and circuit-tracer's files, or SAELens transcoder folders)")
    if (path / CONFIG).is_file():
        ts = load_circuit_tracer(path, device=device, dtype=dtype)
    elif any(path.glob("*/cfg.json")):
        ts = load_saelens_set(path, device=device, dtype=dtype)
    else:
        raise FileNotFoundError(f"{path}: neither circuit-tracer's layout ({CONFIG}) nor SAELens transcoder folders "
                                "(subfolders with cfg.json)")
    if model is not None:
        ts.check_fits(model)
    return ts
