"""Jobs over datasets and workers: a job's plan of shards, run in-process or on Ray, committed atomically.

``run_job`` (job.py) runs any ``Job``; ``ExportJob`` (export.py) caches hooks over a corpus into
SAELens's cached-activations layout; ``SweepJob``, ``AttributionJob``, ``EdgeAttributionJob`` and
``EvalJob`` (jobs_*.py) run patching sweeps, AtP/EAP and evaluations over a dataset of prompt pairs. Ray and ``datasets`` are optional extras (``pip install -e
'.[scale]'``), imported only by the functions that need them.
"""

from .corpus import ArrayWindows, DatasetWindows, dataset_windows, text_windows
from .export import ExportJob, export
from .job import BACKENDS, Job, ShardSpec, build_model, even_plan, run_job
from .jobs_attribution import AttributionJob, EdgeAttributionJob, attribute
from .jobs_data import PromptPairs, load_pairs, prompt_pairs
from .jobs_eval import EvalJob, evaluate
from .jobs_sweep import NodeResult, SweepJob, sweep
from .manifest import Manifest, load_manifest, verify

__all__ = ["ArrayWindows", "AttributionJob", "BACKENDS", "DatasetWindows", "EdgeAttributionJob", "EvalJob", "ExportJob",
           "Job", "Manifest", "NodeResult", "PromptPairs", "ShardSpec", "SweepJob", "attribute", "build_model",
           "dataset_windows", "evaluate", "even_plan", "export", "load_manifest", "load_pairs", "prompt_pairs",
           "run_job", "sweep", "text_windows", "verify"]
