"""The export job: a model over a corpus of token windows, chosen hooks cached into SAELens's layout.

The output folder is what SAELens's ``CacheActivationsRunner`` writes, so ``datasets.load_from_disk(out)``
and SAELens training with ``cached_activations_path=out`` read it: one row per window, one column per hook
(``Array2D [context_size d_in]``, ``act_dtype``) and ``token_ids`` (int32 ``[context_size]``); the
consolidated ``data-XXXXX-of-YYYYY.arrow`` files (one per shard, in order) with ``state.json`` and
``dataset_info.json`` at the top. Beside them, glassbox's ``manifest.json`` and ``shards/shard_XXXXX/``
(each a ``datasets`` folder of its own); the top-level arrow files are hard links to the shards' files (a
copy where the filesystem cannot link), so the export takes the disk space once and resume can verify it.

A hook of shape [batch pos d] is stored as is; [batch pos head d_head] (``hook_z``, ``hook_q``...) is
flattened to ``head*d_head``, as SAELens does. Other shapes (attention patterns) are refused.

Results are independent of the split: batches are fixed runs of ``batch_size`` windows counted from the
first window, and ``shard_size`` must be a multiple of ``batch_size``, so each window is computed in the
same batch whatever the shard size or worker count, and the columns are bit-identical. Every batch is
[batch_size context_size] (the last may be shorter); nothing is padded. Footgun: bit-identical also needs
the same kernels, so the same device type, dtype and, on the CPU, torch thread count (measured: 2
threads and 1 thread differ by ~4e-7 on a tiny model, as matmul reductions split differently); each
shard's entry records its ``torch_threads`` and ``device``.

``datasets`` is needed to write Arrow and is imported by the functions that write.
"""

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import List, Optional, Sequence

import torch

from ..interp.cache import run_with_cache
from ..models.hook_shapes import hook_shape
from .corpus import ArrayWindows
from .job import SCALE_EXTRA, ShardSpec, even_plan

ACT_DTYPES = ("float16", "float32", "float64")
DATA_FILE = "data-00000-of-00001.arrow"
_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def _datasets():
    try:
        import datasets
        from datasets.arrow_writer import ArrowWriter
    except ModuleNotFoundError as error:
        raise ImportError(f"writing an export (Arrow) needs datasets: {SCALE_EXTRA}") from error
    return datasets, ArrowWriter


def stop_layer(hooks: Sequence[str]) -> Optional[int]:
    """The fewest blocks that compute every hook: ``blocks.{L}.*`` needs L + 1; any other hook, all (None)."""
    layers = []
    for name in hooks:
        match = _BLOCK.match(name)
        if match is None:
            return None
        layers.append(int(match.group(1)) + 1)
    return max(layers)


class ExportJob:
    """Cache ``hooks`` over ``windows`` (``corpus.ArrayWindows`` / ``DatasetWindows``) with the model of
    ``model_spec`` (see ``glassbox.scale.job.build_model``)."""

    name = "export"

    def __init__(self, model_spec: dict, windows, hooks: Sequence[str], batch_size: int = 8,
                 shard_size: Optional[int] = None, act_dtype: str = "float32"):
        hooks = list(hooks)
        if not hooks or not all(isinstance(h, str) and h for h in hooks):
            raise ValueError(f"hooks must be a non-empty list of hook names, got {hooks!r}")
        if len(set(hooks)) != len(hooks) or "token_ids" in hooks:
            raise ValueError(f"hooks must be distinct hook names (not 'token_ids'), got {hooks!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        shard_size = batch_size * max(1, 256 // batch_size) if shard_size is None else shard_size
        if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1 or shard_size % batch_size:
            raise ValueError(f"shard_size (windows per shard) must be a positive multiple of batch_size="
                             f"{batch_size}, so batches never straddle shards; got {shard_size!r}")
        if act_dtype not in ACT_DTYPES:
            raise ValueError(f"act_dtype must be one of {ACT_DTYPES} (Arrow has no bfloat16), got {act_dtype!r}")
        self.spec, self.windows, self.hooks = dict(model_spec), windows, hooks
        self.batch_size, self.shard_size, self.act_dtype = batch_size, shard_size, act_dtype

    @property
    def context_size(self) -> int:
        return self.windows.context_size

    def plan(self) -> List[ShardSpec]:
        return even_plan(len(self.windows), self.shard_size)

    def model_spec(self) -> dict:
        return dict(self.spec)

    def params(self) -> dict:
        return {"hooks": self.hooks, "batch_size": self.batch_size, "shard_size": self.shard_size,
                "context_size": self.context_size, "act_dtype": self.act_dtype, "corpus": self.windows.describe()}

    def shard_tokens(self, spec: ShardSpec) -> int:
        return spec.n_items * self.context_size

    def check_model(self, model) -> None:
        """Refuse hooks the model lacks, naming them, before anything runs."""
        missing = [h for h in self.hooks if h not in model.hook_dict]
        if missing:
            raise KeyError(f"the model has no hook {missing[0]!r} (hooks: {', '.join(self.hooks)}); e.g. "
                           f"{', '.join(list(model.hook_dict)[:4])}")
        for hook in self.hooks:
            try:
                shape = hook_shape(hook, cfg=model.cfg)
            except KeyError:
                continue  # not in the table (an added hook point): its shape is checked on the first batch
            if not shape.startswith("batch pos ") or len(shape.split()) > 4:
                raise ValueError(f"hook {hook!r} has shape [{shape}]; an export stores [batch pos d] or "
                                 "[batch pos head d_head] hooks")

    def check(self, model) -> None:
        """What ``run_job`` checks before anything runs: the hooks, and the token ids of windows held in memory."""
        self.check_model(model)
        if self.context_size > model.cfg.n_ctx:
            raise ValueError(f"windows of {self.context_size} tokens are longer than the model's context, n_ctx="
                             f"{model.cfg.n_ctx}; use a context size of at most {model.cfg.n_ctx}")
        if isinstance(self.windows, ArrayWindows):
            check_ids(self.windows.windows, model.cfg.d_vocab, 0, self.windows.source)

    def activations(self, model, tokens: torch.Tensor) -> dict:
        """``{hook: float [batch pos d_in]}`` on the CPU in ``act_dtype``, for one batch of windows."""
        device = next(model.parameters()).device
        _, cache = run_with_cache(model, tokens.to(device), names_filter=self.hooks, device="cpu",
                                  dtype=getattr(torch, self.act_dtype), stop_at_layer=stop_layer(self.hooks),
                                  return_type=None, check_memory=False)
        out = {}
        for hook in self.hooks:
            act = cache[hook]
            if act.ndim in (3, 4) and tuple(act.shape[:2]) == tuple(tokens.shape):
                act = act.reshape(*act.shape[:2], -1)
            else:
                raise ValueError(f"hook {hook!r} has shape {tuple(act.shape)}; an export stores [batch pos d] "
                                 "or [batch pos head d_head] hooks")
            out[hook] = act
        return out

    def run_shard(self, model, spec: ShardSpec, tmp_dir: Path) -> dict:
        """Windows ``spec.start:spec.stop`` -> a ``datasets`` folder in ``tmp_dir`` (one arrow file)."""
        datasets, ArrowWriter = _datasets()
        self.check_model(model)
        writer, features = None, None
        with torch.no_grad():
            for start in range(spec.start, spec.stop, self.batch_size):
                tokens = self.windows.rows(start, min(start + self.batch_size, spec.stop))
                check_ids(tokens, model.cfg.d_vocab, start, getattr(self.windows, "path", "the corpus"))
                acts = self.activations(model, tokens)
                if writer is None:
                    features = export_features(self.hooks, {h: a.shape[-1] for h, a in acts.items()},
                                               self.context_size, self.act_dtype)
                    writer = ArrowWriter(features=features, path=str(Path(tmp_dir) / DATA_FILE))
                batch = {h: a.numpy() for h, a in acts.items()}
                batch["token_ids"] = tokens.to(torch.int32).numpy()
                writer.write_batch(batch)
        rows, _ = writer.finalize()
        writer.close()
        file_sha = _sha256(Path(tmp_dir) / DATA_FILE)
        _write_dataset_json(Path(tmp_dir), features, [DATA_FILE], fingerprint=file_sha[:16])
        return {"rows": rows, "torch_threads": torch.get_num_threads(), "device": str(next(model.parameters()).device),
                "token_start": spec.start * self.context_size,
                "token_stop": spec.stop * self.context_size, "d_in": {h: features[h].shape[1] for h in self.hooks}}

    def finalize(self, out_dir: Path, entries: List[dict]) -> Path:
        return consolidate(Path(out_dir), entries)


def check_ids(windows, d_vocab: int, first: int, source: str) -> None:
    """Refuse, naming the window, a token id outside [0, d_vocab) in ``windows`` (window ``first`` first)."""
    windows = torch.as_tensor(windows)
    bad = (windows < 0) | (windows >= d_vocab)
    if bool(bad.any()):
        row, col = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{source}: window {first + row} holds token id {int(windows[row, col])} at position {col}, "
                         f"outside the model's vocabulary [0, d_vocab={d_vocab})")


def export_features(hooks: Sequence[str], d_in: dict, context_size: int, act_dtype: str):
    """SAELens's cached-activation features: ``Array2D`` per hook, then ``token_ids``."""
    datasets, _ = _datasets()
    features = {h: datasets.Array2D(shape=(context_size, d_in[h]), dtype=act_dtype) for h in hooks}
    features["token_ids"] = datasets.Sequence(datasets.Value("int32"), length=context_size)
    return datasets.Features(features)


def consolidate(out_dir: Path, entries: List[dict]) -> Path:
    """Link the shards' arrow files into ``out_dir`` in shard order with its ``state.json`` and
    ``dataset_info.json`` (SAELens's consolidated layout), as one ``glassbox.fs`` folder transaction: a
    glassbox reader sees the old set or the new one, an earlier consolidation's files are replaced and a
    user's other files kept. Safe to run again (resume)."""
    from .manifest import outputs

    datasets, _ = _datasets()
    sources, features = [], None
    for entry in entries:
        shard = out_dir / "shards" / f"shard_{entry['index']:05d}"
        info = json.loads((shard / "dataset_info.json").read_text())
        if features is None:
            features = info["features"]
        elif info["features"] != features:
            raise ValueError(f"{shard}: its features differ from shard 0's ({info['features']} vs {features})")
        sources.append(shard / DATA_FILE)
    names = [f"data-{i:05d}-of-{len(entries):05d}.arrow" for i in range(len(entries))]
    fingerprint = hashlib.sha256("".join(e["sha256"] for e in entries).encode()).hexdigest()[:16]
    info, state = _dataset_json(datasets.Features.from_dict(features), names, fingerprint)
    with outputs(out_dir, "export") as writer:
        for name, source in zip(names, sources):
            writer.write_file(name, lambda tmp, source=source: _link_or_copy(source, tmp))
        writer.write_text("dataset_info.json", json.dumps(info, indent=2, sort_keys=True))
        writer.write_text("state.json", json.dumps(state, indent=2, sort_keys=True))
    return out_dir


def _dataset_json(features, data_files: List[str], fingerprint: str) -> tuple:
    """(dataset_info.json, state.json): the two files ``datasets.load_from_disk`` reads, as
    ``Dataset.save_to_disk`` writes them."""
    state = {"_data_files": [{"filename": f} for f in data_files], "_fingerprint": fingerprint,
             "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
             "_split": None}
    info = {"citation": "", "description": "", "features": features.to_dict(), "homepage": "", "license": ""}
    return info, state


def _write_dataset_json(folder: Path, features, data_files: List[str], fingerprint: str) -> None:
    from .manifest import write_json

    info, state = _dataset_json(features, data_files, fingerprint)
    write_json(folder / "dataset_info.json", info)
    write_json(folder / "state.json", state)  # last: a folder without it does not load, never half-loads


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _sha256(path: Path) -> str:
    from .manifest import sha256_file

    return sha256_file(path)


def model_tokenizer(name_or_path):
    """The tokenizer saved with a model (a folder, shipped model or cached hub repo), without its weights."""
    from ..weights.pretrained import TOKENIZER_FILES, load_tokenizer, resolve

    folder = resolve(name_or_path)
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise ValueError(f"{name_or_path} has no saved tokenizer to encode --text with; pretokenize the corpus "
                         "into a datasets folder and pass --dataset")
    return load_tokenizer(folder)


def export(model: str, out_dir, hooks: Sequence[str], *, text=None, dataset=None, context_size: Optional[int] = None,
           batch_size: int = 8, shard_size: Optional[int] = None, act_dtype: str = "float32", device=None,
           dtype: str = "float32", backend: str = "local", ray_address: Optional[str] = None,
           n_workers: Optional[int] = None, resume: bool = False, progress: bool = True, retries: int = 3) -> Path:
    """Export ``hooks`` of the model ``model`` (a name or folder) over ``text`` (a file) or ``dataset`` (a
    pretokenized folder) into ``out_dir``; returns ``out_dir``. ``context_size`` defaults to 128 for text
    and to the rows' length for a dataset. See ``ExportJob`` and ``glassbox.scale.run_job``."""
    from .corpus import dataset_windows, text_windows
    from .job import run_job

    if (text is None) == (dataset is None):
        raise ValueError("give exactly one of text= (a text file) and dataset= (a pretokenized datasets folder)")
    if text is not None:
        windows = text_windows(text, model_tokenizer(model), 128 if context_size is None else context_size)
    else:
        windows = dataset_windows(dataset, context_size)
    spec = {"name_or_path": str(Path(model).resolve()) if Path(model).is_dir() else str(model),
            "device": None if device is None else str(device), "dtype": str(dtype)}
    job = ExportJob(spec, windows, hooks, batch_size=batch_size, shard_size=shard_size, act_dtype=act_dtype)
    return run_job(job, out_dir, backend=backend, ray_address=ray_address, n_workers=n_workers, resume=resume,
                   progress=progress, retries=retries)
