"""Training a byte-level BPE tokenizer (GPT-2's scheme) on a text file.

The result is written as GPT-2's two files, ``vocab.json`` and ``merges.txt`` (plus a small
``tokenizer_config.json``), and read back with ``transformers.GPT2TokenizerFast.from_pretrained``.

Footguns:
- ``<|endoftext|>`` is the only special token and takes the LAST id (``vocab_size - 1``), as in
  GPT-2; the exported HF config uses ``d_vocab - 1`` as BOS/EOS, so the two agree.
- Load the folder with ``GPT2TokenizerFast.from_pretrained(folder)``. In transformers 5.x,
  ``GPT2TokenizerFast(vocab_file=..., merges_file=...)`` builds a tokenizer that returns no tokens
  at all, without an error.
"""

import json
import tempfile
from pathlib import Path
from typing import Union

from ..fs import write_bytes, write_text

EOT = "<|endoftext|>"
VOCAB_FILE, MERGES_FILE, CONFIG_FILE = "vocab.json", "merges.txt", "tokenizer_config.json"


def train_bpe_tokenizer(text: str, vocab_size: int, folder: Union[str, Path], min_frequency: int = 2):
    """Train on ``text``, write ``folder``/vocab.json + merges.txt, and return the loaded tokenizer."""
    from tokenizers import ByteLevelBPETokenizer

    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 257 + 1:
        raise ValueError(f"vocab_size must be an int >= 258 (256 bytes + {EOT} + merges), got {vocab_size!r}")
    if not text:
        raise ValueError("cannot train a tokenizer on empty text")
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(training_chunks(text), vocab_size=vocab_size, min_frequency=min_frequency,
                            special_tokens=[EOT], show_progress=False)
    folder = Path(folder)
    with tempfile.TemporaryDirectory() as scratch:  # the trainer writes its files itself: made beside, then copied
        bpe.save_model(scratch)
        vocab = _eot_last(Path(scratch) / VOCAB_FILE)
        merges = (Path(scratch) / MERGES_FILE).read_bytes()
    config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": 1024, "add_prefix_space": False,
              "bos_token": EOT, "eos_token": EOT, "unk_token": EOT}
    write_text(folder / VOCAB_FILE, vocab)  # each file written whole (glassbox.fs); other files kept
    write_bytes(folder / MERGES_FILE, merges)
    write_text(folder / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
    return load_tokenizer(folder)


def load_tokenizer(folder: Union[str, Path]):
    from transformers import GPT2TokenizerFast

    folder = Path(folder)
    # GPT-2's two files, or the single tokenizer.json that newer transformers versions save alone.
    if not (folder / "tokenizer.json").is_file():
        for name in (VOCAB_FILE, MERGES_FILE):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"no {name} (nor tokenizer.json) in {folder}")
    return GPT2TokenizerFast.from_pretrained(str(folder))


def text_chunks(text: str, size: int = 1 << 16):
    """Pieces of about ``size`` characters whose tokens, one piece at a time, are the whole text's.

    A piece ends only at a lone line break: a ``\\n`` with a non-space on both sides. GPT-2's
    pre-tokenizer makes such a line break a word of its own, at the end of a piece as in the whole
    text. Footgun: a blank line is not such a place: ``"\\n\\n"`` before a word is two words
    (``\\n``, ``\\n``) in running text, but one (``\\n\\n``) at the end of a piece, and so
    one token instead of two. Where no lone line break falls within ``size`` characters, the piece
    runs on to the next one (or to the end of the text), so equality never depends on ``size``.
    """
    start = 0
    while start < len(text):
        end = len(text)
        if start + size < len(text):
            cut = _lone_break_before(text, start, start + size)
            if cut < 0:
                cut = _lone_break_after(text, start + size)
            end = len(text) if cut < 0 else cut + 1
        yield text[start:end]
        start = end


def training_chunks(text: str, size: int = 1 << 16):
    """The pieces the BPE trainer reads: cut after a line break followed by a non-space.

    No word is cut in two, but unlike ``text_chunks`` a piece may end in a blank line, which the
    trainer then counts as one word ``\\n\\n`` instead of two ``\\n``: a handful of counts in
    a book. Kept as it is because every tokenizer glassbox has trained (the shipped model's too)
    was trained on these pieces, so a recipe gives the same tokenizer as before.
    """
    start = 0
    while start < len(text):
        end = len(text)
        if start + size < len(text):
            cut = text.rfind("\n", start, start + size)
            while cut > start and text[cut + 1].isspace():
                cut = text.rfind("\n", start, cut)
            end = cut + 1 if cut > start else start + size
        yield text[start:end]
        start = end


def _is_lone_break(text: str, at: int) -> bool:
    return 0 < at < len(text) - 1 and not text[at - 1].isspace() and not text[at + 1].isspace()


def _lone_break_before(text: str, start: int, stop: int) -> int:
    """The last lone line break in text[start + 1:stop], or -1."""
    cut = text.rfind("\n", start + 1, stop)
    while cut > start and not _is_lone_break(text, cut):
        cut = text.rfind("\n", start + 1, cut)
    return cut if cut > start else -1


def _lone_break_after(text: str, start: int) -> int:
    """The first lone line break at or after ``start``, or -1."""
    cut = text.find("\n", start)
    while cut >= 0 and not _is_lone_break(text, cut):
        cut = text.find("\n", cut + 1)
    return cut


def _eot_last(path: Path) -> str:
    vocab = json.loads(path.read_text(encoding="utf-8"))
    # The trainer gives special tokens the first ids; shift every other token down by one.
    if vocab.pop(EOT, None) != 0:
        raise ValueError(f"expected {EOT} at id 0 in {path} as the tokenizers trainer writes it")
    fixed = {token: i for i, (token, _) in enumerate(sorted(vocab.items(), key=lambda item: item[1]))}
    fixed[EOT] = len(fixed)
    return json.dumps(fixed, ensure_ascii=False)
