"""TransformerLens's ``evals`` (3.x), mapped onto ``glassbox.interp.evals``, ``glassbox.interp.ioi_data``
and ``glassbox.train.datasets``.

Offline only: ``make_wiki/owt/pile/code_data_loader`` read their dataset from the local Hugging Face
datasets cache (through the optional ``datasets`` package) and otherwise raise one error naming the
dataset and how to give local text instead: ``make_text_data_loader(texts_or_file, tokenizer)``.
``make_mmlu_data_loader`` reads ``cais/mmlu`` from the local hub cache or datasets cache
(``glassbox.train.mmlu``); a subject it cannot read is a FileNotFoundError naming it (TransformerLens
prints a warning and leaves the subject out). ``mmlu_eval`` scores each question's letters
(``glassbox.interp.multiple_choice``) as TransformerLens does: with the model's tokenizer, BOS first
(TransformerLens's model tokenizer adds it in ``encode``); a ``tokenizer=`` given is used as it is.

Deliberate differences: ``device`` defaults to the model's (TransformerLens's is "cuda");
``induction_loss`` refuses a ``subseq_len`` whose repeat does not fit the model's context and, for a
vocabulary under 20000 ids, asks for ``token_range`` (TransformerLens draws ids in [100, 20000));
``ioi_eval`` visits the prompts in order (TransformerLens shuffles them, which changes only the
float summation order) and masks the padding; ``IOIDataset(seed=...)`` does not reseed Python's
global ``random``; ``evaluate_on_dataset`` and ``evaluate`` print nothing but the losses.
"""

from typing import Optional, Tuple

from torch.utils.data import DataLoader

from ..interp.evals import ioi_logit_diffs, mean_loss_over_batches, repeated_tokens_loss
from ..interp.ioi_data import IOIDataset
from ..interp.multiple_choice import LETTERS as MMLU_ANSWER_LETTERS
from ..interp.multiple_choice import multiple_choice_accuracy
from ..train.mmlu import MMLU_SUBJECTS, load_mmlu
from ..train.datasets import cached_hf_dataset, pack_hf_dataset, text_data_loader

__all__ = ["IOIDataset", "evaluate", "evaluate_on_dataset", "induction_loss", "ioi_eval", "make_code_data_loader",
           "make_mmlu_data_loader", "make_owt_data_loader", "make_pile_data_loader", "make_text_data_loader",
           "make_wiki_data_loader", "mmlu_eval", "MMLU_ANSWER_LETTERS", "MMLU_SUBJECTS", "sanity_check"]

SANITY_TEXT = ("Many important transition points in the history of science have been moments when science "
               "'zoomed in.' At these points, we develop a visualization or tool that allows us to see the world "
               "in a new level of detail, and a new field of science develops to study the world through this lens.")


def sanity_check(model):
    """The model's mean loss on one fixed paragraph (under 5 nats: probably fine; over 7: broken)."""
    return model(SANITY_TEXT, return_type="loss")


def _cached_loader(name: str, config: Optional[str], column: str, tokenizer, batch_size: int) -> DataLoader:
    rows = pack_hf_dataset(cached_hf_dataset(name, config), tokenizer, column_name=column, num_proc=10)
    return DataLoader(rows, batch_size=batch_size, shuffle=True, drop_last=True)


def make_wiki_data_loader(tokenizer, batch_size: int = 8) -> DataLoader:
    return _cached_loader("wikitext", "wikitext-2-v1", "text", tokenizer, batch_size)


def make_owt_data_loader(tokenizer, batch_size: int = 8) -> DataLoader:
    return _cached_loader("stas/openwebtext-10k", None, "text", tokenizer, batch_size)


def make_pile_data_loader(tokenizer, batch_size: int = 8) -> DataLoader:
    return _cached_loader("NeelNanda/pile-10k", None, "text", tokenizer, batch_size)


def make_code_data_loader(tokenizer, batch_size: int = 8) -> DataLoader:
    return _cached_loader("codeparrot/codeparrot-valid-v2-near-dedup", None, "content", tokenizer, batch_size)


def make_text_data_loader(texts_or_file, tokenizer, batch_size: int = 8, max_length: int = 1024) -> DataLoader:
    """Local text (a list of documents or a text file) packed like the loaders above, shuffled."""
    return text_data_loader(texts_or_file, tokenizer, batch_size=batch_size, max_length=max_length)


DATASET_NAMES = ["wiki", "owt", "pile", "code"]
DATASET_LOADERS = [make_wiki_data_loader, make_owt_data_loader, make_pile_data_loader, make_code_data_loader]


def evaluate_on_dataset(model, data_loader, truncate: int = 100, device=None) -> float:
    """Mean loss over the first ``truncate + 1`` batches (TransformerLens's count)."""
    return mean_loss_over_batches(model, data_loader, max_batches=truncate + 1, device=device)


def evaluate(model, truncate: int = 100, batch_size: int = 8, tokenizer=None) -> dict:
    """``{"wiki_loss", "owt_loss", "pile_loss", "code_loss"}``; each dataset must be in the local cache."""
    tokenizer = model.tokenizer if tokenizer is None else tokenizer
    losses = {}
    for name, make_loader in zip(DATASET_NAMES, DATASET_LOADERS):
        losses[f"{name}_loss"] = evaluate_on_dataset(model, make_loader(tokenizer, batch_size), truncate)
        print(f"{name}: {losses[f'{name}_loss']}")
    return losses


def induction_loss(model, tokenizer=None, batch_size: int = 4, subseq_len: int = 384,
                   prepend_bos: Optional[bool] = None, device=None,
                   token_range: Optional[Tuple[int, int]] = None):
    """Loss on the second half of repeated random tokens (torch's global generator draws them)."""
    if token_range is None:
        if model.cfg.d_vocab < 20000:
            raise ValueError(f"induction_loss draws ids in [100, 20000), past this model's d_vocab="
                             f"{model.cfg.d_vocab}; pass token_range=(low, high) with high <= {model.cfg.d_vocab}")
        token_range = (100, 20000)
    bos = None
    if tokenizer is not None:
        bos = tokenizer.bos_token_id
    return repeated_tokens_loss(model, batch_size, subseq_len, prepend_bos, token_range, bos, device=device)


def ioi_eval(model, dataset=None, batch_size: int = 8, num_samples: int = 1000, tokenizer=None,
             symmetric: bool = False) -> dict:
    """``{"Logit Difference": mean logit(IO) - logit(S), "Accuracy": fraction with it > 0}``."""
    if dataset is None:
        dataset = IOIDataset(model.tokenizer if tokenizer is None else tokenizer, num_samples=num_samples,
                             symmetric=symmetric)
    scores = ioi_logit_diffs(model, dataset, batch_size)
    return {"Logit Difference": scores.mean_logit_diff, "Accuracy": scores.accuracy}


def make_mmlu_data_loader(subjects=None, split: str = "test", num_samples: Optional[int] = None) -> list:
    """MMLU's questions as ``[{"question", "choices", "answer", "subject"}]``, the first ``num_samples`` of
    each subject (all 57 when ``subjects`` is None); read offline (module docstring)."""
    return load_mmlu(subjects, split=split, num_samples=num_samples)


def mmlu_eval(model, tokenizer=None, subjects=None, split: str = "test", num_samples: Optional[int] = None) -> dict:
    """Zero-shot MMLU: ``{"accuracy", "num_correct", "num_total", "subject_scores"}``."""
    examples = make_mmlu_data_loader(subjects=subjects, split=split, num_samples=num_samples)
    if tokenizer is not None:
        return multiple_choice_accuracy(model, examples, tokenizer)
    # TransformerLens's model tokenizer puts BOS first in encode (glassbox.tl's copy does not): as there
    return multiple_choice_accuracy(model, examples, model.tokenizer, bos_id=getattr(model.tokenizer, "bos_token_id", None))
