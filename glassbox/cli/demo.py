"""``glassbox demo``: the whole story on one model, written to DIR/index.html and DIR/summary.json.

The patching study needs a prompt that repeats a phrase, an answer (one token) after the phrase's
first occurrence and a distractor (one token) to put in its place. Values the user leaves out come
from the defaults (" letter", " garden", the Elizabeth prompt); where the model's tokenizer cannot
express a default as one token, or the default prompt does not fit the model's context, the command
chooses single-token words of that tokenizer and a shorter prompt instead, and prints what it chose.
A value the user gives that cannot work is an error naming it.

Where glassbox ships an SAE of the model (``glassbox/assets/saes``; glassbox-austen has one), the
report gains a feature section, and, in a source checkout (which has data/austen.txt), the feature
dashboard of its features on the held-out text, DIR/features.html; ``--no-features`` leaves it out.
"""

import functools
from pathlib import Path
from typing import NamedTuple, Optional

from .common import load_model, make_folder, output_folder, prompt_tokens, text_arg, tokenizer_of
from .errors import UsageError, device_arg
from .help_values import DEFAULT_ANSWER, DEFAULT_DISTRACTOR, DEFAULT_MODEL, DEFAULT_PROMPT

HELDOUT_FRAC = 0.05  # the share of data/austen.txt held out from the shipped model's and SAE's training


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="parity, attention, heads, logit lens, patching and features in one report")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"hub name (gpt2, ...; from the hub or the local Hugging Face cache), folder "
                        f"(save_pretrained, glassbox train) or shipped model (default {DEFAULT_MODEL})")
    p.add_argument("--prompt", type=text_arg, default=None,
                   help="a prompt that repeats a phrase: '... phrase ANSWER ... phrase' "
                        f"(default {DEFAULT_PROMPT!r}, or a shorter one around ANSWER if that does not fit)")
    p.add_argument("--answer", type=text_arg, default=None,
                   help=f"one token: the token after the phrase's first occurrence (default {DEFAULT_ANSWER!r}, or "
                        "a single-token word of the model's tokenizer if that is not one token)")
    p.add_argument("--distractor", type=text_arg, default=None,
                   help="one token: what the corrupted prompt has in the answer's place "
                        f"(default {DEFAULT_DISTRACTOR!r}, or a single-token word of the model's tokenizer if that "
                        "is not one token)")
    p.add_argument("--out", default="glassbox-report",
                   help="output folder, created if needed (default glassbox-report)")
    p.add_argument("--device", default=None, type=device_arg, help="e.g. cuda; default: cpu")
    p.add_argument("--single-file", action="store_true",
                   help="inline plotly.js into each page (~4.9 MB a page) instead of one plotly.min.js beside them")
    p.add_argument("--no-features", action="store_true",
                   help="leave out the feature section (on by default where glassbox ships an SAE of the model)")
    p.set_defaults(func=run)


class Story(NamedTuple):
    prompt: str
    answer: str
    distractor: str
    notes: list  # what was chosen instead of a default, and why


def choose_story(model, prompt: Optional[str], answer: Optional[str], distractor: Optional[str]) -> Story:
    """The prompt, answer and distractor of the patching study: the user's values, checked, and for
    those left out the defaults, or values this model's tokenizer can express."""
    from ..interp.report import DEFAULT_ANSWER, DEFAULT_DISTRACTOR, single_token_words

    notes = []

    @functools.lru_cache(maxsize=1)
    def words() -> list:  # only when a default fails or a message needs examples: it reads the whole vocabulary
        return single_token_words(model)

    def such_as(exclude=()) -> str:
        some = [w for w in words() if w not in exclude][:3]
        return "such as " + ", ".join(repr(w) for w in some) if some else "(this tokenizer has none)"

    for flag, value in (("--answer", answer), ("--distractor", distractor)):
        if value is not None and not_one_token(model, value):
            raise UsageError(f"{flag} {value!r} {not_one_token(model, value)}; give a single-token word {such_as()}")

    if answer is None and not not_one_token(model, DEFAULT_ANSWER):
        answer = DEFAULT_ANSWER
    if answer is None and prompt is not None:
        raise UsageError(f"--answer not given, and the default {DEFAULT_ANSWER!r} "
                         f"{not_one_token(model, DEFAULT_ANSWER)}; give --answer, the single token that follows "
                         f"the first occurrence of your prompt's repeated phrase, {such_as()}")

    if prompt is None and answer is not None and not answer[:1].isspace():
        # the default prompts put the answer straight after a word ("read the{answer}")
        spaced = " " + answer
        better = (f"; give --answer {spaced!r} (one token)" if not not_one_token(model, spaced) else
                  "; give an answer with a leading space")
        raise UsageError(f"--answer {answer!r} has no leading space, so the default prompts would read "
                         f"{story_prompts_of(answer)!r}{better}, or give --prompt with it")
    if prompt is not None:
        tokens = prompt_tokens(model, prompt)[0].tolist()
        if token_id(model, answer) not in tokens:
            raise UsageError(f"--prompt does not contain the answer {answer!r} as a token; write it as "
                             f"'... phrase{answer} ... phrase', or give --answer, a token of the prompt")
    else:
        prompt, tokens, chosen = story_prompt(model, answer, words, notes)
        if answer is None:
            why = not_one_token(model, DEFAULT_ANSWER)
            notes.insert(0, f"answer {chosen!r} (the default {DEFAULT_ANSWER!r} {why})")
        answer = chosen

    answer_id = token_id(model, answer)
    if distractor is None:
        if not not_one_token(model, DEFAULT_DISTRACTOR) and token_id(model, DEFAULT_DISTRACTOR) != answer_id:
            distractor = DEFAULT_DISTRACTOR
        else:
            others = [w for w in words() if token_id(model, w) != answer_id and token_id(model, w) not in tokens]
            if not others:
                raise UsageError(f"--distractor not given, and this model's tokenizer has no single-token word "
                                 f"besides the answer {answer!r} that the prompt lacks; give --distractor")
            distractor = others[0]
            reason = not_one_token(model, DEFAULT_DISTRACTOR) or "is the answer's token"
            notes.append(f"distractor {distractor!r} (the default {DEFAULT_DISTRACTOR!r} {reason})")
    elif token_id(model, distractor) == answer_id:
        raise UsageError(f"--distractor {distractor!r} is the answer's token; the corrupted prompt must differ from "
                         f"the clean one, so give another single-token word {such_as(exclude=(answer,))}")
    return Story(prompt, answer, distractor, notes)


def story_prompts_of(answer: str) -> str:
    """The start of the shortest default prompt around ``answer``, as a reader would see it."""
    from ..interp.report import story_prompts

    return story_prompts(answer)[-1]


def not_one_token(model, text: str) -> Optional[str]:
    """Why ``text`` cannot be an answer or distractor for this model's tokenizer, or None if it can."""
    from ..models.tokenize import encode_text

    ids = encode_text(model.tokenizer, text)
    if len(ids) != 1:
        pieces = " ".join(repr(model.tokenizer.decode([i])) for i in ids)
        return f"is {len(ids)} tokens for this model's tokenizer" + (f" ({pieces})" if ids else "")
    if ids[0] in model.tokenizer.all_special_ids:
        return "is the tokenizer's special token, not a word"
    return None


def token_id(model, text: str) -> int:
    return model.tokenizer.encode(text, add_special_tokens=False)[0]


def story_prompt(model, answer: Optional[str], words, notes: list) -> tuple:
    """(prompt, its token ids, answer) when the user gave no prompt: the default prompt if it fits the
    model's context and holds the answer, else the longest repeated-phrase prompt around the answer
    that fits. With ``answer`` None the answer is chosen too: the first single-token word that the
    prompt built around it holds exactly once (``words()`` lists the candidates)."""
    from ..interp.report import DEFAULT_PROMPT, story_prompts

    bos = [model.bos_token_id] if model.cfg.default_prepend_bos else []
    n_ctx = model.cfg.n_ctx

    def ids(text: str) -> list:
        return bos + model.tokenizer.encode(text, add_special_tokens=False)

    def chosen(prompt: str, tokens: list, answer: str) -> tuple:
        if prompt != DEFAULT_PROMPT:
            default_length = len(ids(DEFAULT_PROMPT))
            why = (f"the default prompt is {default_length} tokens, more than this model's n_ctx={n_ctx}"
                   if default_length > n_ctx else f"the default prompt does not hold {answer!r}")
            notes.append(f"prompt {prompt!r} ({why})")
        return prompt, tokens, answer

    if answer is not None:
        candidates = [DEFAULT_PROMPT] + story_prompts(answer)
        for prompt in candidates:
            tokens = ids(prompt)
            if len(tokens) <= n_ctx and token_id(model, answer) in tokens:
                return chosen(prompt, tokens, answer)
        shortest = min(len(ids(p)) for p in candidates)
        raise UsageError(f"the default prompts around the answer {answer!r} are {shortest} or more tokens, more "
                         f"than this model's n_ctx={n_ctx}; give a shorter --prompt")
    for template in range(len(story_prompts(""))):
        for word in words():
            prompt = story_prompts(word)[template]
            tokens = ids(prompt)
            if len(tokens) > n_ctx:
                break  # every word is one token, so this template is too long for all of them
            if tokens.count(token_id(model, word)) == 1:
                return chosen(prompt, tokens, word)
    shortest = min(len(ids(p)) for p in story_prompts(" x"))
    raise UsageError(f"the default prompts are {shortest} or more tokens, more than this model's n_ctx={n_ctx} "
                     "(or its tokenizer has no single-token words); give --prompt and --answer")


def feature_inputs(model) -> tuple:
    """(the SAE glassbox ships for this model or None, the held-out text for its dashboard or None).

    The text is the held-out last 5% of data/austen.txt (the text the shipped model and SAE were not
    trained on), found beside the package in a source checkout; an installed wheel has no data/, and
    the report then has the feature section without its dashboard."""
    from ..interp.report_features import shipped_sae, shipped_sae_folder
    from ..train.data import split_text

    if shipped_sae_folder(model) is None:
        return None, None
    sae = shipped_sae(model)
    text_path = Path(__file__).resolve().parents[2] / "data" / "austen.txt"
    if not text_path.is_file():
        print(f"features: no {text_path} (a source checkout has it), so no dashboard")
        return sae, None
    return sae, split_text(text_path.read_text(encoding="utf-8"), HELDOUT_FRAC)[1]


def run(args) -> int:
    import torch

    from ..interp.report import build_report

    out = output_folder(args.out)
    for name in ("index.html", "summary.json", "plotly.min.js", "features.html"):
        if (out / name).is_dir():
            raise UsageError(f"--out {args.out!r} holds a folder named {name}, where the report writes a file; "
                             "give another folder")
    torch.manual_seed(0)
    model = load_model(args.model, device=args.device)
    tokenizer_of(model, args.model)
    story = choose_story(model, args.prompt, args.answer, args.distractor)
    for note in story.notes:
        print(f"chose {note}")
    sae, feature_text = (None, None) if args.no_features else feature_inputs(model)
    make_folder(out, args.out)
    summary = build_report(model, story.prompt, story.answer, story.distractor, out, sae=sae,
                           feature_text=feature_text, single_file=args.single_file)
    print(f"model {summary['model']['name']}: {summary['model']['n_layers']} layers, "
          f"{summary['model']['parameters']:,} parameters")
    print(f"parity with transformers: worst relative difference {summary['parity_worst_relative']:.1e}")
    best = lambda rows: ", ".join(f"L{r['layer']}H{r['head']} {r['score']:.2f}" for r in rows[:3])
    print(f"previous-token heads: {best(summary['previous_token_heads'])}")
    print(f"induction heads: {best(summary['induction_heads'])}")
    patch = summary["patching"]
    print(f"logit difference {story.answer!r} - {story.distractor!r}: clean {patch['clean_logit_diff']:.2f}, "
          f"corrupted {patch['corrupted_logit_diff']:.2f}")
    features = summary["features"]
    if features is not None:
        print(f"features ({features['sae']['architecture']} SAE at {features['sae']['hook_name']}): L0 "
              f"{features['l0']:.1f}, explained variance {features['explained_variance']:.3f} on the prompt; "
              f"logit difference with its reconstruction {features['spliced_logit_diff']:.2f}"
              + (f"; dashboard {features['dashboard']}" if features["dashboard"] else ""))
    print(f"report: {summary['report']} (and summary.json beside it) in {summary['seconds']:.1f} s")
    return 0
