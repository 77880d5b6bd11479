"""Writing a Hugging Face hub cache folder by hand, laid out as ``huggingface_hub`` lays it out, so that
loading by repo id can be tested with no network:

    CACHE/models--{org}--{name}/
        blobs/<hash>                      the file contents (sha256 for weights, git's blob sha1 otherwise)
        snapshots/<40-hex commit>/<file>  a relative symlink to ../../blobs/<hash> (or a copy, as
                                          huggingface_hub does where symlinks are unavailable)
        refs/main                         the commit, no newline

A bare repo id ("gpt2") is ``models--gpt2``.
"""

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict, Optional, Union

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".model")


def repo_folder(cache: Path, repo_id: str) -> Path:
    return Path(cache) / ("models--" + repo_id.replace("/", "--"))


def _blob_name(name: str, data: bytes) -> str:
    if name.endswith(WEIGHT_SUFFIXES):  # stored with git LFS: named by the content's sha256
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's own blob id


def write_hub_cache(cache: Union[str, Path], repo_id: str, files: Union[Dict[str, bytes], str, Path],
                    commit: Optional[str] = None, symlinks: bool = True, ref: str = "main") -> Path:
    """Put ``files`` (name -> bytes, or a folder whose files are taken) into ``cache`` as the snapshot of
    ``repo_id`` at ``commit`` (by default a hash of the contents), with ``refs/<ref>`` pointing at it.
    Returns the snapshot folder."""
    if not isinstance(files, dict):
        files = {p.relative_to(files).as_posix(): p.read_bytes() for p in sorted(Path(files).rglob("*")) if p.is_file()}
    if commit is None:
        digest = hashlib.sha1(repo_id.encode())
        for name in sorted(files):
            digest.update(name.encode() + b"\0" + hashlib.sha1(files[name]).digest())
        commit = digest.hexdigest()
    assert len(commit) == 40 and all(c in "0123456789abcdef" for c in commit), commit
    root = repo_folder(cache, repo_id)
    snapshot = root / "snapshots" / commit
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = root / "blobs" / _blob_name(name, data)
        if not blob.exists():
            blob.write_bytes(data)
        target = snapshot / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() or target.is_symlink():
            target.unlink()
        if symlinks:
            os.symlink(os.path.relpath(blob, target.parent), target)
        else:
            shutil.copyfile(blob, target)
    (root / "refs" / ref).write_text(commit)
    return snapshot


def cache_hf_model(cache: Union[str, Path], repo_id: str, hf_model, tokenizer=None, max_shard_size=None,
                   symlinks: bool = True, edit_config=None) -> Path:
    """``hf_model.save_pretrained`` (sharded when ``max_shard_size`` is given), then written into ``cache``
    as ``repo_id``'s snapshot; ``edit_config(dict) -> dict`` rewrites config.json first."""
    import json

    with tempfile.TemporaryDirectory() as tmp:
        kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
        hf_model.save_pretrained(tmp, **kwargs)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if edit_config is not None:
            path = Path(tmp) / "config.json"
            path.write_text(json.dumps(edit_config(json.loads(path.read_text())), indent=2))
        return write_hub_cache(cache, repo_id, tmp, symlinks=symlinks)


def cache_mmlu(cache: Union[str, Path], rows_by_subject: dict, split: str = "test") -> Path:
    """A hand-made ``cais/mmlu`` dataset snapshot in ``cache`` (``datasets--cais--mmlu``), one parquet
    file per subject laid out as the real repo lays it out: ``<subject>/<split>-00000-of-00001.parquet``."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    files = {}
    for subject, rows in rows_by_subject.items():
        table = pa.table({"question": [r["question"] for r in rows], "subject": [subject] * len(rows),
                          "choices": [list(r["choices"]) for r in rows], "answer": [r["answer"] for r in rows]})
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        files[f"{subject}/{split}-00000-of-00001.parquet"] = buffer.getvalue()
    root = write_hub_cache(cache, "cais/mmlu", files)
    # a dataset repo's folder is datasets--org--name
    datasets_root = Path(cache) / "datasets--cais--mmlu"
    if datasets_root.exists():
        shutil.rmtree(datasets_root)
    repo_folder(cache, "cais/mmlu").rename(datasets_root)
    return datasets_root / "snapshots" / root.name
