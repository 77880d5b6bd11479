"""Datasets of prompt pairs for the sweep, attribution and eval jobs, and the batches those jobs run.

A dataset is a list of records, read by ``read_records`` from a JSONL file (one JSON object a line), a
JSON file holding a list of objects, or a Hugging Face ``datasets`` folder (``save_to_disk``). Fields:

- ``clean``: the clean prompt, a string or a list of token ids;
- ``corrupted``: the corrupted prompt, same form (sweep and attribution; optional for eval);
- ``answer``: the token the clean prompt should predict next, a one-token string or a token id;
- ``distractor``: the competing token (for logit differences), same form.

Strings are tokenized by ``prompt_pairs`` with the model's tokenizer: a prompt with the BOS in front
when ``prepend_bos`` (the default, glassbox's and TransformerLens's rule for GPT-2), an answer with no
BOS and exactly one token (a string that is not one token is refused, naming the pair: put its leading
space in, e.g. ``" Mary"``). Token ids are used as given (no BOS added). A pair's clean and corrupted
prompts must have the same number of tokens (the patched activations are compared position by
position); a pair that does not is refused, naming it.

Pairs of different lengths are GROUPED BY LENGTH, never padded: the jobs see the pairs in "job order",
a stable sort by token length (pairs of one length keep their input order), and a batch never mixes
lengths. Results are returned in input order. A sweep or attribution over a position axis needs one
length for every pair (the result has one value per position); it is refused otherwise, naming the
first pair whose length differs (``PromptPairs.check_one_length``).

Batches and shards (``PairJob``): batches are consecutive runs of at most ``batch_size`` pairs of one
length in job order, fixed by the data and ``batch_size`` alone; a shard is ``shard_size //
batch_size`` consecutive batches. So each pair is computed in the same batch whatever the shard size or
worker count, and results are bit-identical across splits; a different ``batch_size`` changes them only
by float rounding.
"""

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ..models.tokenize import encode_text
from .job import SCALE_EXTRA, ShardSpec

FIELDS = ("clean", "corrupted", "answer", "distractor")


def read_records(path: Union[str, Path]) -> Tuple[List[dict], List[str]]:
    """(records, a name for each: ``"pairs.jsonl line 4"`` / ``"pairs row 3"``) from a JSONL or JSON
    file or a ``datasets`` folder."""
    path = Path(path)
    if path.is_dir():
        try:
            import datasets
        except ModuleNotFoundError as error:
            raise ImportError(f"reading a datasets folder ({path}) needs datasets: {SCALE_EXTRA}") from error
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            raise ValueError(f"{path} holds several splits ({', '.join(ds)}); give the folder of one split")
        return [dict(row) for row in ds], [f"{path.name} row {i}" for i in range(len(ds))]
    if not path.is_file():
        raise FileNotFoundError(f"prompt pairs {path} do not exist (give a .jsonl or .json file or a datasets folder)")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            records = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from None
        if not isinstance(records, list):
            raise ValueError(f"{path} must hold a JSON list of pair objects, got a {type(records).__name__}")
        names = [f"{path.name} item {i}" for i in range(len(records))]
    else:
        records, names = [], []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path} line {number} is not valid JSON: {error}") from None
            names.append(f"{path.name} line {number}")
    for record, name in zip(records, names):
        if not isinstance(record, dict):
            raise ValueError(f"{name}: a pair must be a JSON object with fields {', '.join(FIELDS)}, "
                             f"got a {type(record).__name__}")
    if not records:
        raise ValueError(f"{path} holds no prompt pairs")
    return records, names


class PromptPairs:
    """Tokenized pairs: per pair, clean and corrupted token ids (lists of one length), answer and
    distractor ids (or None), and a name for error messages. Plain lists, so a job travels to workers."""

    def __init__(self, clean: List[List[int]], corrupted: Optional[List[List[int]]] = None,
                 answer: Optional[List[int]] = None, distractor: Optional[List[int]] = None,
                 names: Optional[List[str]] = None, source: str = "pairs"):
        n = len(clean)
        if n < 1:
            raise ValueError("no prompt pairs")
        self.names = list(names) if names is not None else [f"pair {i}" for i in range(n)]
        self.clean = [list(map(int, row)) for row in clean]
        self.corrupted = None if corrupted is None else [list(map(int, row)) for row in corrupted]
        self.answer = None if answer is None else [int(a) for a in answer]
        self.distractor = None if distractor is None else [int(d) for d in distractor]
        self.source = source
        for field in ("corrupted", "answer", "distractor", "names"):
            value = getattr(self, field)
            if value is not None and len(value) != n:
                raise ValueError(f"{field} has {len(value)} entries for {n} clean prompts")
        for i in range(n):
            if not self.clean[i]:
                raise ValueError(f"{self.names[i]}: the clean prompt has no tokens")
            if self.corrupted is not None and len(self.corrupted[i]) != len(self.clean[i]):
                raise ValueError(f"{self.names[i]}: the clean prompt is {len(self.clean[i])} tokens, the corrupted "
                                 f"{len(self.corrupted[i])}; a pair's prompts must have the same token length")
        # job order: a stable sort by length
        self.order = sorted(range(n), key=lambda i: len(self.clean[i]))

    def __len__(self) -> int:
        return len(self.clean)

    def lengths(self) -> List[int]:
        return [len(row) for row in self.clean]

    def require(self, *fields: str, what: str) -> None:
        """Refuse, naming ``what`` needs it, a field these pairs do not have."""
        for field in fields:
            if getattr(self, field) is None:
                raise ValueError(f"{what} needs every pair to have a {field!r} field; {self.source} has none")

    def check_one_length(self, what: str) -> None:
        lengths = self.lengths()
        for i, length in enumerate(lengths):
            if length != lengths[0]:
                raise ValueError(f"{what} needs every pair to have one token length (one result per position), "
                                 f"but {self.names[i]} is {length} tokens and {self.names[0]} is {lengths[0]}; "
                                 "sweep without a position axis, or split the pairs by length")

    def check_vocab(self, d_vocab: int, start: int = 0, stop: Optional[int] = None) -> None:
        """Refuse, naming the pair and field, a token id outside [0, d_vocab) in items ``start:stop`` (job order)."""
        for field in ("clean", "corrupted", "answer", "distractor"):
            values = getattr(self, field)
            if values is None:
                continue
            for i in self.order[start:stop]:
                value = values[i]
                ids = value if isinstance(value, list) else [value]
                bad = [t for t in ids if not 0 <= t < d_vocab]
                if bad:
                    raise ValueError(f"{self.names[i]}: {field} token id {bad[0]} is outside [0, d_vocab={d_vocab})")

    def check_context(self, n_ctx: int) -> None:
        """Refuse, naming it, a pair longer than the model's context."""
        for i, length in enumerate(self.lengths()):
            if length > n_ctx:
                raise ValueError(f"{self.names[i]}: the prompt is {length} tokens, longer than the model's context "
                                 f"n_ctx={n_ctx}")

    def batches(self, batch_size: int) -> List[Tuple[int, int]]:
        """Item ranges (in job order) of the batches: at most ``batch_size`` pairs, one length each."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        lengths = [len(self.clean[i]) for i in self.order]
        out, start = [], 0
        for stop in range(1, len(lengths) + 1):
            if stop == len(lengths) or lengths[stop] != lengths[start] or stop - start == batch_size:
                out.append((start, stop))
                start = stop
        return out

    def rows(self, field: str, start: int, stop: int, device=None) -> torch.Tensor:
        """Items ``start:stop`` (job order) of a field: [n pos] int64 for prompts, [n] for answers."""
        values = [getattr(self, field)[i] for i in self.order[start:stop]]
        return torch.tensor(values, dtype=torch.long, device=device)

    def indices(self, start: int, stop: int) -> torch.Tensor:
        """Input-order index of items ``start:stop`` of the job order (int64 [n])."""
        return torch.tensor(self.order[start:stop], dtype=torch.long)

    def describe(self) -> dict:
        """What the manifest records to recognise the same pairs on resume: counts and a checksum."""
        digest = hashlib.sha256()
        for field in FIELDS:
            digest.update(json.dumps(getattr(self, field)).encode())
        return {"source": self.source, "n_pairs": len(self), "sha256": digest.hexdigest(),
                "lengths": sorted(set(self.lengths()))}


def _ids(tokenizer, value, name: str, field: str, prepend_bos: bool, prompt: bool) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"{name}: {field} must be text or token ids, got {value!r}")
    if prompt:
        if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            return value
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name}: {field} must be a non-empty string or a list of token ids, got {value!r}")
        if tokenizer is None:
            raise ValueError(f"{name}: {field} is text, but no tokenizer was given; give token ids or the model's "
                             "tokenizer")
        ids = encode_text(tokenizer, value, f"{name}: {field}")
        if prepend_bos:
            bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
            ids = [bos] + ids
        return ids
    if isinstance(value, int):
        return value
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name}: {field} must be a one-token string or a token id, got {value!r}")
    if tokenizer is None:
        raise ValueError(f"{name}: {field} is text, but no tokenizer was given; give a token id or the tokenizer")
    ids = encode_text(tokenizer, value, f"{name}: {field}")
    if len(ids) != 1:
        pieces = [tokenizer.decode([t]) for t in ids]
        raise ValueError(f"{name}: {field} {value!r} is {len(ids)} tokens {pieces}, not one; answers must be single "
                         "tokens (mind the leading space, e.g. ' Mary')")
    return ids[0]


def prompt_pairs(records: Sequence[dict], tokenizer=None, *, names: Optional[Sequence[str]] = None,
                 prepend_bos: bool = True, source: str = "pairs",
                 required: Sequence[str] = ("clean",)) -> PromptPairs:
    """Tokenize records (dicts with the fields of the module docstring) into ``PromptPairs``.

    A field is kept when every record has it and dropped when none has it; a field that only some
    records have is refused, naming the first record without it. ``required`` fields must be present.
    """
    records = list(records)
    names = list(names) if names is not None else [f"pair {i}" for i in range(len(records))]
    if not records:
        raise ValueError("no prompt pairs")
    columns: Dict[str, Optional[list]] = {}
    for field in FIELDS:
        has = [field in r and r[field] is not None for r in records]
        if not any(has):
            if field in required:
                raise ValueError(f"{source}: no pair has a {field!r} field (fields: {', '.join(FIELDS)})")
            columns[field] = None
            continue
        if not all(has):
            i = has.index(False)
            raise ValueError(f"{names[i]} has no {field!r} field, which other pairs have")
        columns[field] = [_ids(tokenizer, r[field], n, field, prepend_bos, field in ("clean", "corrupted"))
                          for r, n in zip(records, names)]
    unknown = sorted(set().union(*records) - set(FIELDS))
    if unknown:
        raise ValueError(f"{source}: unknown field(s) {', '.join(map(repr, unknown))}; a pair has {', '.join(FIELDS)}")
    return PromptPairs(columns["clean"], columns["corrupted"], columns["answer"], columns["distractor"], names,
                       source)


def load_pairs(path: Union[str, Path], tokenizer=None, *, prepend_bos: bool = True,
               required: Sequence[str] = ("clean",)) -> PromptPairs:
    """``prompt_pairs`` of the records in ``path`` (see ``read_records``)."""
    records, names = read_records(path)
    return prompt_pairs(records, tokenizer, names=names, prepend_bos=prepend_bos, source=Path(path).name,
                        required=required)


class PairJob:
    """What the pair jobs share: the plan (whole batches per shard), parameters, per-pair outputs.

    A subclass sets ``name`` and implements ``compute(model, start, stop) -> {key: tensor [n ...]}``
    for the batch of items ``start:stop`` (job order): one row per pair, or, for keys starting with
    ``batch_``, one row per batch. ``run_shard`` writes every batch's rows plus ``pair_index`` (input
    order) to ``values.safetensors``; ``gather`` reads them back, per-pair rows in input order and
    per-batch rows in batch order.
    """

    name = "pairs"
    unit = "pair"

    def __init__(self, model_spec: dict, pairs: PromptPairs, batch_size: int = 8, shard_size: Optional[int] = None):
        if not isinstance(pairs, PromptPairs):
            raise TypeError(f"pairs must be PromptPairs (glassbox.scale.jobs_data), got {type(pairs).__name__}")
        self.spec, self.pairs = dict(model_spec), pairs
        self._batches = pairs.batches(batch_size)
        shard_size = batch_size * max(1, 64 // batch_size) if shard_size is None else shard_size
        if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1 or shard_size % batch_size:
            raise ValueError(f"shard_size (pairs per shard) must be a positive multiple of batch_size={batch_size}, "
                             f"so batches never straddle shards; got {shard_size!r}")
        self.batch_size, self.shard_size = batch_size, shard_size

    def plan(self) -> List[ShardSpec]:
        per = self.shard_size // self.batch_size
        groups = [self._batches[k:k + per] for k in range(0, len(self._batches), per)]
        return [ShardSpec(i, g[0][0], g[-1][1]) for i, g in enumerate(groups)]

    def batches_of(self, spec: ShardSpec) -> List[Tuple[int, int]]:
        return [b for b in self._batches if spec.start <= b[0] and b[1] <= spec.stop]

    def model_spec(self) -> dict:
        return dict(self.spec)

    def job_params(self) -> dict:
        return {}

    def check(self, model) -> None:
        """Every pair's token ids against the model's vocabulary and context (before anything runs)."""
        self.pairs.check_vocab(model.cfg.d_vocab)
        self.pairs.check_context(model.cfg.n_ctx)

    def params(self) -> dict:
        return {"batch_size": self.batch_size, "shard_size": self.shard_size, "pairs": self.pairs.describe(),
                **self.job_params()}

    def shard_tokens(self, spec: ShardSpec) -> int:
        return sum(len(self.pairs.clean[i]) for i in self.pairs.order[spec.start:spec.stop])

    def compute(self, model, start: int, stop: int) -> Dict[str, torch.Tensor]:
        raise NotImplementedError

    def run_shard(self, model, spec: ShardSpec, tmp_dir: Path) -> dict:
        from ..fs import save_safetensors

        self.pairs.check_vocab(model.cfg.d_vocab, spec.start, spec.stop)
        parts: Dict[str, list] = {}
        for start, stop in self.batches_of(spec):
            for key, value in self.compute(model, start, stop).items():
                parts.setdefault(key, []).append(value.detach().cpu())
        out = {key: torch.cat(values).contiguous() for key, values in parts.items()}
        out["pair_index"] = self.pairs.indices(spec.start, spec.stop)
        save_safetensors(Path(tmp_dir) / "values.safetensors", out)
        return {"rows": spec.n_items, "batches": len(self.batches_of(spec))}

    def gather(self, out_dir: Path, entries: List[dict]) -> Dict[str, torch.Tensor]:
        """Every shard's rows, concatenated and put in input order."""
        from safetensors.torch import load_file

        parts: Dict[str, list] = {}
        for entry in entries:
            values = load_file(str(Path(out_dir) / "shards" / f"shard_{entry['index']:05d}" / "values.safetensors"))
            for key, value in values.items():
                parts.setdefault(key, []).append(value)
        cat = {key: torch.cat(values) for key, values in parts.items()}
        index = cat.pop("pair_index")
        if sorted(index.tolist()) != list(range(len(self.pairs))):
            raise ValueError(f"the shards of {out_dir} do not hold each of the {len(self.pairs)} pairs once")
        inverse = torch.empty_like(index)
        inverse[index] = torch.arange(len(index))
        return {key: value if key.startswith("batch_") else value[inverse] for key, value in cat.items()}
