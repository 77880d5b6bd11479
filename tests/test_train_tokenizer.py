"""BPE tokenizer training: the files GPT-2's tokenizer reads, loaded by ``transformers`` with the
ids that the ``tokenizers`` library itself assigns, and an exact round trip."""

import json
from pathlib import Path

import pytest

from glassbox.train import encode_text, train_bpe_tokenizer
from glassbox.train.tokenizer import EOT, text_chunks

AUSTEN = Path(__file__).resolve().parent.parent / "data" / "austen.txt"
SAMPLE = "He was a gentleman; she was a gentleman's daughter.\n\n\"Mr. Darcy!\"  said she,  ça va?  1815\n"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    text = AUSTEN.read_text(encoding="utf-8")[:200_000]
    return folder, train_bpe_tokenizer(text, 331, folder), text


def test_files_have_gpt2_layout(trained):
    folder, tok, _ = trained
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    merges = [line for line in (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
              if line and not line.startswith("#version")]
    assert len(vocab) == len(tok) == 331
    assert sorted(vocab.values()) == list(range(331))
    assert vocab[EOT] == 330 and tok.eos_token_id == tok.bos_token_id == 330
    assert len(merges) == 331 - 256 - 1  # every id beyond the 256 bytes and EOT is one merge
    assert all(len(m.split(" ")) == 2 for m in merges)


def test_transformers_ids_equal_the_tokenizers_library_ids(trained):
    # Oracle: the ``tokenizers`` library reading the same two files directly.
    from tokenizers import ByteLevelBPETokenizer

    folder, tok, _ = trained
    raw = ByteLevelBPETokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    ids = tok.encode(SAMPLE, add_special_tokens=False)
    assert len(ids) > 10, "transformers returned (almost) no tokens: was the tokenizer built from files?"
    assert ids == raw.encode(SAMPLE).ids
    assert tok.decode(ids) == SAMPLE


def test_frequent_words_become_single_tokens(trained):
    _, tok, _ = trained
    for word in (" the", " and", " of"):
        assert len(tok.encode(word, add_special_tokens=False)) == 1, word


def test_encode_text_round_trips_a_long_text(trained):
    _, tok, text = trained
    ids = encode_text(text, tok)
    assert tok.decode(ids.tolist()) == text
    assert ids.max().item() < 330 and ids.min().item() >= 0  # no EOT inside the text


def test_text_chunks_tokenize_like_the_whole_text(trained):
    _, tok, text = trained
    piece = text[:30_000]
    chunks = list(text_chunks(piece, size=997))
    assert "".join(chunks) == piece and len(chunks) > 20
    assert [i for c in chunks for i in tok.encode(c, add_special_tokens=False)] == \
        tok.encode(piece, add_special_tokens=False, verbose=False)


def test_same_text_same_tokenizer(tmp_path, trained):
    folder, _, text = trained
    train_bpe_tokenizer(text, 331, tmp_path)
    assert (tmp_path / "vocab.json").read_bytes() == (folder / "vocab.json").read_bytes()
    assert (tmp_path / "merges.txt").read_bytes() == (folder / "merges.txt").read_bytes()


@pytest.mark.parametrize("size", [100, 257])
def test_bad_vocab_size_is_named(tmp_path, size):
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe_tokenizer("some text\n", size, tmp_path)
