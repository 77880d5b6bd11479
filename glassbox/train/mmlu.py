"""MMLU's questions (the ``cais/mmlu`` dataset), read offline: never downloaded.

``load_mmlu`` reads each subject's split from the local Hugging Face hub cache (the dataset repo's
snapshot, ``datasets--cais--mmlu/snapshots/REV/<subject>/<split>-*.parquet``, as
``huggingface_hub.snapshot_download(repo_type="dataset")`` leaves it), else from the ``datasets``
cache (``datasets.load_dataset("cais/mmlu", subject)`` run once where there is network), else raises
FileNotFoundError naming the subject, the split and the caches searched. Rows are
``{"question", "choices" (4 str), "answer" (0-3), "subject"}``, in the file's order.
Footgun: a subject that cannot be read is an error, not skipped (TransformerLens prints a warning and
returns fewer questions, which changes the accuracy's denominator silently).
"""

from typing import List, Optional, Sequence, Union

MMLU_REPO = "cais/mmlu"
MMLU_SPLITS = ("test", "validation", "dev", "auxiliary_train")
MMLU_SUBJECTS = (
    "abstract_algebra anatomy astronomy business_ethics clinical_knowledge college_biology college_chemistry "
    "college_computer_science college_mathematics college_medicine college_physics computer_security "
    "conceptual_physics econometrics electrical_engineering elementary_mathematics formal_logic global_facts "
    "high_school_biology high_school_chemistry high_school_computer_science high_school_european_history "
    "high_school_geography high_school_government_and_politics high_school_macroeconomics high_school_mathematics "
    "high_school_microeconomics high_school_physics high_school_psychology high_school_statistics "
    "high_school_us_history high_school_world_history human_aging human_sexuality international_law jurisprudence "
    "logical_fallacies machine_learning management marketing medical_genetics miscellaneous moral_disputes "
    "moral_scenarios nutrition philosophy prehistory professional_accounting professional_law professional_medicine "
    "professional_psychology public_relations security_studies sociology us_foreign_policy virology world_religions"
).split()


def subjects_of(subjects: Union[None, str, Sequence[str]]) -> List[str]:
    """None -> every subject; a name or a list of names, each checked (ValueError "Invalid subject")."""
    from ..suggest import did_you_mean

    chosen = list(MMLU_SUBJECTS) if subjects is None else [subjects] if isinstance(subjects, str) else list(subjects)
    bad = [s for s in chosen if s not in MMLU_SUBJECTS]
    if bad:
        raise ValueError(f"Invalid subject(s): {', '.join(map(repr, bad))}{did_you_mean(str(bad[0]), MMLU_SUBJECTS)}; "
                         f"MMLU's subjects are {', '.join(MMLU_SUBJECTS)}")
    if not chosen:
        raise ValueError("subjects is empty: give a subject name, a list of them, or None for all 57")
    return chosen


def _from_hub_cache(subject: str, split: str) -> Optional[list]:
    from pathlib import Path

    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(MMLU_REPO, repo_type="dataset", local_files_only=True,
                                        allow_patterns=[f"{subject}/{split}-*.parquet"]))
    except Exception:  # not in the hub cache (huggingface_hub raises several kinds)
        return None
    files = sorted(folder.glob(f"{subject}/{split}-*.parquet"))
    if not files:
        return None
    import pyarrow.parquet as pq

    rows = []
    for path in files:
        rows += pq.read_table(path, columns=["question", "choices", "answer"]).to_pylist()
    return rows


def load_mmlu(subjects=None, split: str = "test", num_samples: Optional[int] = None) -> List[dict]:
    """The first ``num_samples`` questions (all when None) of each subject's ``split``, read offline."""
    from .datasets import cached_hf_dataset

    chosen = subjects_of(subjects)
    if split not in MMLU_SPLITS:
        raise ValueError(f"split={split!r} is not one of MMLU's splits ({', '.join(MMLU_SPLITS)})")
    if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int)
                                    or num_samples < 1):
        raise ValueError(f"num_samples must be a positive int or None, got {num_samples!r}")
    out = []
    for subject in chosen:
        rows = _from_hub_cache(subject, split)
        if rows is None:
            try:
                rows = list(cached_hf_dataset(MMLU_REPO, subject, split=split))
            except (FileNotFoundError, ImportError) as err:
                raise FileNotFoundError(f"MMLU subject {subject!r} split {split!r} is neither in the local Hugging "
                                        f"Face hub cache (dataset {MMLU_REPO!r}) nor in the datasets cache: {err}") \
                    from None
        for i, row in enumerate(rows[:num_samples] if num_samples is not None else rows):
            choices, answer = list(row["choices"]), row["answer"]
            if len(choices) != 4 or isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < 4:
                raise ValueError(f"MMLU {subject!r} {split!r} row {i}: expected 4 choices and an answer in 0..3, "
                                 f"got {len(choices)} choices and answer={answer!r}")
            out.append({"question": row["question"], "choices": choices, "answer": answer, "subject": subject})
    return out
