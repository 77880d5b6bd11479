"""Training checkpoints published as hub revisions, and the revisions in the local hub cache.

Two families publish their training checkpoints as git revisions of one repo: Pythia
(``EleutherAI/pythia-*``, revision ``step{N}``) and Stanford CRFM's GPT-2s (``stanford-crfm/*``,
revision ``checkpoint-{N}``). ``checkpoint_labels`` is each family's published schedule of steps
(in the order the checkpoints were saved, so an index counts from the first), whether or not the
local cache holds them; ``checkpoint_revision`` turns an index or a step into the revision to load.
Footguns: the schedule is the published one, so an index means the same checkpoint on every machine,
and a checkpoint absent from the cache is an error at load time (naming the revision and the
revisions cached), not a different checkpoint; Pythia's ``-v0`` repos have no early log-spaced steps.
"""

import re
from pathlib import Path
from typing import List, Optional, Tuple


def _pythia_steps(v0: bool) -> List[int]:
    early = [] if v0 else [0] + [2 ** k for k in range(10)]  # step 0, then 1, 2, 4 ... 512
    return early + list(range(1000, 143001, 1000))  # then every 1000 steps to the end


def _stanford_steps() -> List[int]:
    # saved every 10 steps to 100, every 50 to 2000, every 100 to 20000, then every 1000 to 400000
    spans = [(0, 100, 10), (100, 2000, 50), (2000, 20000, 100), (20000, 400001, 1000)]
    return [step for start, stop, every in spans for step in range(start, stop, every)]


def checkpoint_family(repo_id: str) -> Optional[str]:
    """"pythia", "pythia-v0", "stanford" for a repo whose checkpoints are revisions, else None."""
    repo_id = str(repo_id)
    if repo_id.startswith("EleutherAI/pythia"):
        return "pythia-v0" if "-v0" in repo_id else "pythia"
    if repo_id.startswith("stanford-crfm/"):
        return "stanford"
    return None


def checkpoint_labels(repo_id: str) -> Tuple[List[int], str]:
    """(the steps checkpoints were saved at, in order; "step"). ValueError for a repo with none."""
    family = checkpoint_family(repo_id)
    if family is None:
        raise ValueError(f"{repo_id!r} has no training checkpoints glassbox can load: checkpoints are the "
                         "step revisions of the Pythia (EleutherAI/pythia-*) and Stanford CRFM "
                         "(stanford-crfm/*) repos")
    steps = _stanford_steps() if family == "stanford" else _pythia_steps(family == "pythia-v0")
    return steps, "step"


def revision_of_step(repo_id: str, step: int) -> str:
    return f"checkpoint-{step}" if checkpoint_family(repo_id) == "stanford" else f"step{step}"


def checkpoint_revision(repo_id: str, index: Optional[int] = None, value: Optional[int] = None) -> Tuple[str, int, int]:
    """(revision, step, index) of the checkpoint at ``index`` (negative counts from the last) or at
    step ``value``; both given must name the same checkpoint. ValueError naming the bad argument."""
    labels, _ = checkpoint_labels(repo_id)
    for name, given in (("checkpoint_index", index), ("checkpoint_value", value)):
        if given is not None and (isinstance(given, bool) or not isinstance(given, int)):
            raise TypeError(f"{name} must be an int, got {type(given).__name__} ({given!r})")
    if index is None and value is None:
        raise ValueError("give checkpoint_index or checkpoint_value")
    if index is not None:
        if not -len(labels) <= index < len(labels):
            raise ValueError(f"checkpoint_index={index} is out of range: {repo_id!r} has {len(labels)} "
                             f"checkpoints (indices {-len(labels)}..{len(labels) - 1})")
        step = labels[index]
        if value is not None and value != step:
            raise ValueError(f"checkpoint_index={index} is step {step}, but checkpoint_value={value} was given too")
    else:
        if value not in labels:
            below = [s for s in labels if s < value][-1:]
            above = [s for s in labels if s > value][:1]
            raise ValueError(f"checkpoint_value={value} is not a checkpoint of {repo_id!r}; the checkpoints either "
                             f"side are {' and '.join(map(str, below + above))} (get_checkpoint_labels lists all "
                             f"{len(labels)})")
        step, index = value, labels.index(value)
    return revision_of_step(repo_id, step), step, index


def cached_revisions(repo_id: str, cache: Path) -> List[str]:
    """The revision names (refs) of ``repo_id`` in the hub cache ``cache``, checkpoints in step order."""
    refs = Path(cache) / ("models--" + str(repo_id).replace("/", "--")) / "refs"
    try:
        names = sorted(p.relative_to(refs).as_posix() for p in refs.rglob("*") if p.is_file())
    except OSError:
        return []
    number = re.compile(r"^(?:step|checkpoint-)(\d+)$")
    return sorted(names, key=lambda n: (bool(number.match(n)), int(number.match(n).group(1)) if number.match(n)
                                        else 0, n))
