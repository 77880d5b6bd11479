"""prompt_report: how a model ranks the answer to a prompt, token by token, as data and as text.

The prompt is tokenized with the model's BOS policy (``prepend_bos``), each answer without a BOS;
``prepend_space_to_answer`` puts a space before an answer that has none. One answer may be several
tokens: each is scored at the position before it, with the earlier answer tokens in the context.
Several answers are compared on their first token only. Ranks count from 0 (the top token) in the
order of a descending sort of the probabilities, as TransformerLens's ``test_prompt`` ranks them.
``format_prompt_report`` writes TransformerLens's printed report.
"""

from dataclasses import dataclass
from typing import List, Optional, Union

import torch


@dataclass(frozen=True)
class TokenScore:
    """One token's standing at one position."""

    token: str
    token_id: int
    rank: int
    logit: float
    prob: float


@dataclass(frozen=True)
class PromptReport:
    """``answers[k][i]`` is answer i's k-th token; ``top[k]`` the top tokens where it is predicted."""

    prompt_str_tokens: List[str]
    answer_str_tokens: List[List[str]]
    answers: List[List[TokenScore]]
    top: List[List[TokenScore]]

    @property
    def ranks(self) -> list:
        """Per answer position, ``[(token, rank)]`` for every answer."""
        return [[(s.token, s.rank) for s in scores] for scores in self.answers]


def prompt_report(model, prompt: str, answer: Union[str, List[str]], prepend_space_to_answer: bool = True,
                  prepend_bos: Optional[bool] = None, top_k: int = 10) -> PromptReport:
    """Rank, logit and probability of each answer token, and the ``top_k`` tokens where it is predicted."""
    answers = [answer] if isinstance(answer, str) else list(answer)
    if not answers or not all(isinstance(a, str) and a for a in answers):
        raise ValueError(f"answer must be a non-empty string or a non-empty list of them, got {answer!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0, got {top_k!r}")
    if prepend_space_to_answer:
        answers = [a if a.startswith(" ") else " " + a for a in answers]
    n = len(answers)
    prompt_tokens = model.to_tokens(prompt, prepend_bos=prepend_bos)
    answer_ids = [model.to_tokens(a, prepend_bos=False)[0] for a in answers]
    width = 1 if n > 1 else len(answer_ids[0])
    answer_ids = torch.stack([ids[:width] for ids in answer_ids]) if n > 1 else answer_ids[0][None]
    tokens = torch.cat([prompt_tokens.expand(n, -1), answer_ids.to(prompt_tokens.device)], dim=1)
    prompt_len = prompt_tokens.shape[1]
    decode = model.tokenizer.decode
    with torch.no_grad():
        logits = model(tokens)
    scores, tops = [], []
    for k in range(width):
        at = logits[:, prompt_len + k - 1]
        probs = at.softmax(dim=-1)
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        ranks = order.argsort(dim=-1)
        row = []
        for i in range(n):
            tid = int(answer_ids[i, k])
            row.append(TokenScore(decode([tid]), tid, int(ranks[i, tid]), float(at[i, tid]), float(probs[i, tid])))
        scores.append(row)
        tops.append([TokenScore(decode([int(order[0, r])]), int(order[0, r]), r, float(at[0, order[0, r]]),
                                float(sorted_probs[0, r])) for r in range(min(top_k, probs.shape[-1]))])
    answer_str = [model.to_str_tokens(a, prepend_bos=False) for a in answers]
    return PromptReport(model.to_str_tokens(prompt, prepend_bos=prepend_bos), answer_str, scores, tops)


def format_prompt_report(report: PromptReport, print_details: bool = True) -> str:
    """TransformerLens's ``test_prompt`` printout (without its bold markup); the ranks line always."""
    several = len(report.answer_str_tokens) > 1
    lines = []
    if print_details:
        lines.append(f"Tokenized prompt: {report.prompt_str_tokens}")
        lines.append(f"Tokenized answers: {report.answer_str_tokens}" if several
                     else f"Tokenized answer: {report.answer_str_tokens[0]}")
        for scores, top in zip(report.answers, report.top):
            lines.append(f"Performance on answer token{'s' if several else ''}:")
            lines.extend(f"Rank: {s.rank: <8} Logit: {s.logit:5.2f} Prob: {s.prob:6.2%} Token: |{s.token}|"
                         for s in scores)
            lines.extend(f"Top {t.rank}th token. Logit: {t.logit:5.2f} Prob: {t.prob:6.2%} Token: |{t.token}|"
                         for t in top)
    ranks = report.ranks if several else [r[0] for r in report.ranks]
    lines.append(f"Ranks of the answer tokens: {ranks}")
    return "\n".join(lines)
