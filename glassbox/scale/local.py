"""The in-process backend: one model, the pending shards one after another, in plan order.

Imports neither Ray nor ``datasets`` (a job's ``run_shard`` may import what it writes with).
"""

import time
from pathlib import Path
from typing import List, Optional

from ..fs.staged import discard_tree
from .job import build_model, progress_unit, shard_weight
from .manifest import Manifest


def progress_bar(job, manifest: Manifest, enabled: bool, desc: Optional[str] = None):
    """A tqdm bar over the job's tokens (or items), with the committed shards already counted, or None.

    tqdm's rate and ETA then read tokens/s and the time left; ``postfix`` shows shards done/total.
    """
    if not enabled:
        return None
    from tqdm.auto import tqdm

    total = sum(shard_weight(job, s) for s in manifest.plan)
    done = sum(shard_weight(job, s) for s in manifest.plan if manifest.is_done(s.index))
    bar = tqdm(total=total, initial=done, unit=progress_unit(job), unit_scale=True, desc=desc or job.name,
               dynamic_ncols=True)
    bar.set_postfix_str(f"shards {len(manifest.plan) - len(manifest.pending())}/{len(manifest.plan)}")
    return bar


def run_local(job, out_dir: Path, *, resume: bool = False, progress: bool = True, model=None) -> List[dict]:
    """Compute every pending shard of ``job`` in this process and return all entries in plan order.

    ``model`` (optional) is used as is; otherwise it is built once from ``job.model_spec()``, and only
    if some shard is pending.
    """
    manifest = Manifest.open(out_dir, job, resume=resume)
    pending = manifest.pending()
    bar = progress_bar(job, manifest, progress)
    try:
        if pending and model is None:
            model = build_model(job.model_spec())
            manifest.fingerprint.check_unchanged()  # built from the bytes the manifest records
        for spec in pending:
            tmp = manifest.tmp_dir(spec)
            began = time.perf_counter()
            try:
                entry = job.run_shard(model, spec, tmp)
                manifest.commit(spec, tmp, dict(entry), wall_s=time.perf_counter() - began, worker="local")
            except BaseException:
                discard_tree(tmp)  # a shard that raised leaves nothing (a kill leaves .tmp/)
                raise
            if bar is not None:
                bar.update(shard_weight(job, spec))
                bar.set_postfix_str(f"shards {len(manifest.plan) - len(manifest.pending())}/{len(manifest.plan)}")
    except BaseException:
        manifest.discard_if_empty()
        raise
    finally:
        if bar is not None:
            bar.close()
    return manifest.entries()
