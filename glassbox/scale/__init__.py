"""Jobs over datasets and workers: a job's plan of shards, run in-process or on Ray, committed atomically.

``run_job`` (job.py) runs any ``Job``; ``ExportJob`` (export.py) caches hooks over a corpus into
SAELens's cached-activations layout. Ray and ``datasets`` are optional extras (``pip install -e
'.[scale]'``), imported only by the functions that need them.
"""

from .corpus import ArrayWindows, DatasetWindows, dataset_windows, text_windows
from .export import ExportJob, export
from .job import BACKENDS, Job, ShardSpec, build_model, even_plan, run_job
from .manifest import Manifest, load_manifest, verify

__all__ = ["ArrayWindows", "BACKENDS", "DatasetWindows", "ExportJob", "Job", "Manifest", "ShardSpec", "build_model",
           "dataset_windows", "even_plan", "export", "load_manifest", "run_job", "text_windows", "verify"]
