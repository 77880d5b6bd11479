"""The trainer's library API on hostile inputs: chunked tokenization equal to whole-text
tokenization, non-finite hyperparameters, interrupted checkpoint saves, damaged checkpoints.
(The command line's refusals are in ``test_train_cli_errors.py``.)"""

import random
from pathlib import Path

import pytest

from glassbox.train import encode_text, train_bpe_tokenizer
from glassbox.train.tokenizer import text_chunks

AUSTEN = Path(__file__).resolve().parent.parent / "data" / "austen.txt"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_bpe_tokenizer(AUSTEN.read_text(encoding="utf-8")[:50_000], 300,
                               tmp_path_factory.mktemp("tok"))


def whole(tokenizer, text):  # the oracle: the tokenizer on the whole text at once
    return tokenizer.encode(text, add_special_tokens=False, verbose=False)


def chunked(tokenizer, text, size):
    chunks = list(text_chunks(text, size))
    assert "".join(chunks) == text
    return [i for c in chunks for i in tokenizer.encode(c, add_special_tokens=False)], len(chunks)


def test_blank_lines_at_chunk_ends_tokenize_like_the_whole_text(tokenizer):
    # Every paragraph ends in a blank line, so the last line break within a chunk is often in one.
    text = "".join(f"Para {i} was short.\n\n{'  ' * (i % 3)}Then a line.\nAnd another\n\n\n" for i in range(200))
    for size in (23, 40, 61, 97):
        ids, n = chunked(tokenizer, text, size)
        assert n > 20 and ids == whole(tokenizer, text), size


def test_random_whitespace_texts_tokenize_like_the_whole_text(tokenizer):
    rng = random.Random(0)
    alphabet = ["a", "b", "é", " ", "\n", "\n\n", "\t", "\u00a0", ".", "7", "'s", "\r\n"]
    for trial in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 120)))
        size = rng.randint(1, 30)
        assert chunked(tokenizer, text, size)[0] == whole(tokenizer, text), (trial, text, size)


def test_text_without_a_lone_line_break_is_one_chunk(tokenizer):
    text = "one long line " * 50 + "\n\n\n" + "x" * 100
    assert list(text_chunks(text, 16)) == [text]


def test_encode_text_equals_whole_text_on_austen(tokenizer):
    text = AUSTEN.read_text(encoding="utf-8")[:300_000]
    assert encode_text(text, tokenizer).tolist() == whole(tokenizer, text)
