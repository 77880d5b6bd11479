"""The eval job: loss, logit difference and accuracy of a model over a dataset of prompts, sharded.

One forward per batch of prompts (the ``clean`` field, or ``corrupted`` with ``prompt="corrupted"``;
batches grouped by token length as ``jobs_data`` says, never padded). Per prompt it keeps:

- ``lm_loss_sum`` / ``lm_tokens``: the summed next-token cross-entropy over the prompt's own tokens
  (``glassbox.models.lm_loss`` per token: position p predicts token p+1) and their count (length - 1);
- with an ``answer``: ``answer_loss`` (-log p(answer) at the last position) and ``answer_top1`` (the
  answer is the argmax there; ties go to the lowest id);
- with a ``distractor`` too: ``logit_diff`` (logit[answer] - logit[distractor] at the last position)
  and ``logit_diff_correct`` (logit_diff > 0).

Each shard writes these per-prompt values and records its sums and counts in its manifest entry;
``finalize`` returns (and writes to ``out_dir/eval.json``) the dataset's means: ``lm_loss`` (per token,
token-weighted), ``answer_loss``, ``logit_diff`` (per prompt), ``accuracy_top1`` and
``accuracy_logit_diff``. The sums are exact: ``math.fsum`` (the correctly rounded sum of the stored
float values) and integer counts, so they do not depend on the shards or their order; per-prompt values
depend only on each prompt's batch (bit-identical across shard and worker counts).
"""

import json
import math
from pathlib import Path
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from ..models.loss import lm_loss
from .jobs_data import PairJob, PromptPairs

PROMPTS = ("clean", "corrupted")


class EvalJob(PairJob):
    """Loss, logit difference and accuracy over ``pairs`` (see the module docstring)."""

    name = "eval"

    def __init__(self, model_spec: dict, pairs: PromptPairs, batch_size: int = 8, shard_size: Optional[int] = None,
                 prompt: str = "clean"):
        if prompt not in PROMPTS:
            raise ValueError(f"prompt must be one of {PROMPTS}, got {prompt!r}")
        pairs.require(prompt, what=f"evaluating the {prompt} prompts")
        if pairs.distractor is not None and pairs.answer is None:
            raise ValueError(f"{pairs.source}: pairs with a 'distractor' need an 'answer'")
        self.prompt = prompt
        super().__init__(model_spec, pairs, batch_size, shard_size)

    def job_params(self) -> dict:
        return {"prompt": self.prompt}

    def compute(self, model, start: int, stop: int) -> Dict[str, torch.Tensor]:
        device = next(model.parameters()).device
        tokens = self.pairs.rows(self.prompt, start, stop, device)
        with torch.no_grad():
            logits = model(tokens)
        out = {}
        if tokens.shape[1] >= 2:
            out["lm_loss_sum"] = lm_loss(logits, tokens, per_token=True).double().sum(1)
        else:
            out["lm_loss_sum"] = torch.zeros(tokens.shape[0], dtype=torch.float64, device=device)
        out["lm_tokens"] = torch.full((tokens.shape[0],), tokens.shape[1] - 1, dtype=torch.long)
        last = logits[:, -1]
        if self.pairs.answer is not None:
            answer = self.pairs.rows("answer", start, stop, device)
            log_probs = F.log_softmax(last.to(torch.promote_types(last.dtype, torch.float32)), dim=-1)
            out["answer_loss"] = -log_probs.gather(-1, answer[:, None])[:, 0].double()
            out["answer_top1"] = last.argmax(-1) == answer
            if self.pairs.distractor is not None:
                distractor = self.pairs.rows("distractor", start, stop, device)
                diff = (last.gather(-1, answer[:, None]) - last.gather(-1, distractor[:, None]))[:, 0].double()
                out["logit_diff"] = diff
                out["logit_diff_correct"] = diff > 0
        return out

    def run_shard(self, model, spec, tmp_dir: Path) -> dict:
        entry = super().run_shard(model, spec, tmp_dir)
        from safetensors.torch import load_file

        values = load_file(str(Path(tmp_dir) / "values.safetensors"))
        entry["sums"] = summed(values)
        return entry

    def finalize(self, out_dir: Path, entries: List[dict]) -> dict:
        values = self.gather(out_dir, entries)
        sums = summed(values)
        result = {"n_prompts": len(self.pairs), "prompt": self.prompt, "lm_tokens": sums["lm_tokens"],
                  "lm_loss": sums["lm_loss_sum"] / sums["lm_tokens"] if sums["lm_tokens"] else None}
        n = len(self.pairs)
        if "answer_loss" in sums:
            result["answer_loss"] = sums["answer_loss"] / n
            result["accuracy_top1"] = sums["answer_top1"] / n
        if "logit_diff" in sums:
            result["logit_diff"] = sums["logit_diff"] / n
            result["accuracy_logit_diff"] = sums["logit_diff_correct"] / n
        from .manifest import outputs

        with outputs(out_dir, self.name) as writer:
            writer.write_text("eval.json", json.dumps(result, indent=1))
        return result


def summed(values: Dict[str, torch.Tensor]) -> dict:
    """Exact sums: ``math.fsum`` of float columns, integer sums of counts and bools."""
    out = {}
    for key, value in values.items():
        if key == "pair_index":
            continue
        if value.dtype.is_floating_point:
            out[key] = math.fsum(value.double().tolist())
        else:
            out[key] = int(value.long().sum())
    return out


def evaluate(model: str, pairs_path, out_dir, *, prompt: str = "clean", batch_size: int = 8,
             shard_size: Optional[int] = None, device=None, dtype: str = "float32", prepend_bos: bool = True,
             backend: str = "local", ray_address: Optional[str] = None, n_workers: Optional[int] = None,
             resume: bool = False, progress: bool = True, retries: int = 3) -> dict:
    """Evaluate the model ``model`` over the prompts in ``pairs_path`` into ``out_dir``; returns the means."""
    from .job import run_job
    from .jobs_sweep import model_and_pairs

    spec, pairs = model_and_pairs(model, pairs_path, device, dtype, prepend_bos)
    job = EvalJob(spec, pairs, batch_size, shard_size, prompt)
    return run_job(job, out_dir, backend=backend, ray_address=ray_address, n_workers=n_workers, resume=resume,
                   progress=progress, retries=retries)


__all__ = ["EvalJob", "PROMPTS", "evaluate", "summed"]
