"""glassbox.tl.utils and glassbox.tl.evals against TransformerLens 3.9's own functions, same inputs.

Models: a tiny GPT-2-style glassbox model and its TransformerLens twin (``tl_oracle.tl_twin``, the
same weights), so every difference is one of the utility, not of the model.
"""

import contextlib
import copy
import io
import random
import warnings

import numpy as np
import pytest
import rich
import torch

import transformer_lens.evals as tl_evals
import transformer_lens.utilities as tl_utils
from glassbox.interp.factored_matrix import FactoredMatrix
from glassbox.models import gpt2_tokenizer
from glassbox.tl import evals as gb_evals
from glassbox.tl import utils as gb_utils
from tl_oracle import max_diff, tiny_gpt2, tl_twin
from transformer_lens import FactoredMatrix as TLFactoredMatrix

datasets = pytest.importorskip("datasets")


def fresh_tokenizer(pad: bool = True):
    """A private GPT-2 tokenizer (TransformerLens adds a pad token to the one it is given)."""
    tok = copy.deepcopy(gpt2_tokenizer())
    if pad:
        tok.pad_token = tok.eos_token
    return tok


@pytest.fixture(scope="module")
def pair():
    model = tiny_gpt2(3)
    return model, tl_twin(model)


# -- Slice ---------------------------------------------------------------------------------------
SLICES = [None, 2, -1, (3,), (1, 4), (0, 5, 2), slice(1, None), slice(-3, None),
          [0, 2, 3], [4], torch.tensor([3, 1]), np.array([1, 2, 0]), np.array([True, False, True, False, True])]


@pytest.mark.parametrize("spec", SLICES, ids=repr)
def test_slice_apply_and_indices_equal_transformer_lens(spec):
    t = torch.arange(5 * 5 * 7).reshape(5, 5, 7)
    ours, theirs = gb_utils.Slice(spec), tl_utils.Slice(spec)
    assert ours.mode == theirs.mode
    for dim in (0, 1, -2):
        a, b = ours.apply(t, dim), theirs.apply(t, dim)
        assert a.shape == b.shape and torch.equal(a, b), (spec, dim)
    assert np.array_equal(ours.indices(5), theirs.indices(5))
    assert repr(ours) == repr(theirs)
    ua, ub = gb_utils.Slice.unwrap(spec), tl_utils.Slice.unwrap(spec)
    assert torch.equal(ua.apply(t, 1), ub.apply(t, 1))


def test_slice_refusals_are_clear():
    with pytest.raises(ValueError, match="bool"):
        gb_utils.Slice(True)
    with pytest.raises(ValueError, match="max_ctx"):
        gb_utils.Slice((1, 3)).indices()
    with pytest.raises(ValueError, match="str"):
        gb_utils.Slice("last")
    with pytest.raises(IndexError, match="dim=3"):
        gb_utils.Slice(1).apply(torch.zeros(2, 3), 3)


# -- get_act_name ----------------------------------------------------------------------------------
ACT_CASES = [("k", 6, "a"), ("pre", 2), ("embed",), ("pos_embed",), ("normalized", 27, "ln2"), ("k6",),
             ("scale4ln1",), ("pre5",), ("blocks.0.attn.hook_q",), ("hook_embed",), ("attn", 3),
             ("attn_logits", 1), ("key", 0), ("query", 0), ("value", 0), ("mlp_pre", 1), ("mlp_post", 1),
             ("resid_pre", 0), ("resid_post", 3, "b"), ("resid_mid", 2, "block"),
             ("attn_out", 1), ("mlp_out", 1), ("scale",), ("normalized",), ("scale", 1, "ln2"), ("rot_q", 0),
             ("rot_k", 0), ("result", 1), ("z", 2, "attention"), ("pattern", "3"), ("q_input", 2),
             ("k_input", 2), ("v_input", 2), ("attn_in", 1), ("mlp_in", 0), ("pre_linear", 1), ("v12",),
             ("post0m",), ("attn_scores", 4, "attn")]


@pytest.mark.parametrize("args", ACT_CASES, ids=repr)
def test_get_act_name_equals_transformer_lens(args):
    assert gb_utils.get_act_name(*args) == tl_utils.get_act_name(*args)


@pytest.mark.parametrize("args", [("q", 0, "mlp"), ("scale", 2), ("resid_pre5",), ("embed", 0), ("mid", 1),
                                  ("mlp_mid", 1)], ids=repr)
def test_get_act_name_refuses_names_of_no_hook(args):
    tl_utils.get_act_name(*args)  # TransformerLens builds a name no model has
    with pytest.raises(KeyError):
        gb_utils.get_act_name(*args)


# -- masks and BOS removal -------------------------------------------------------------------------
def padded(tok, side: str) -> torch.Tensor:
    """Three rows of different lengths, BOS first, a pad id (GPT-2's EOS) inside the middle row's text."""
    bos, pad = tok.bos_token_id, tok.pad_token_id
    rows = [[bos, 11, 12, 13, 14, 15], [bos, 21, pad, 23], [bos, 31]]
    width = 6
    out = []
    for row in rows:
        fill = [pad] * (width - len(row))
        out.append(row + fill if side == "right" else fill + row)
    return torch.tensor(out)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("prepend_bos", [True, False])
@pytest.mark.parametrize("pad_is_bos", [True, False])
def test_attention_mask_and_bos_removal_equal_transformer_lens(side, prepend_bos, pad_is_bos):
    tok = fresh_tokenizer()
    if not pad_is_bos:
        tok.pad_token = "!"
    tokens = padded(tok, side)
    for padding_side in (side, None):
        tok.padding_side = side
        ours = gb_utils.get_attention_mask(tok, tokens, prepend_bos, padding_side)
        theirs = tl_utils.get_attention_mask(tok, tokens, prepend_bos, padding_side)
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
    ours = gb_utils.get_tokens_with_bos_removed(tok, tokens, side)
    theirs = tl_utils.get_tokens_with_bos_removed(tok, tokens, side)
    assert torch.equal(ours, theirs)
    assert torch.equal(gb_utils.get_attention_mask(None, tokens, True), tl_utils.get_attention_mask(None, tokens, True))


# -- losses ----------------------------------------------------------------------------------------
def test_lm_losses_and_accuracy_equal_transformer_lens():
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(3, 7, 11, generator=g)
    tokens = torch.randint(0, 11, (3, 7), generator=g)
    tokens[0, 1:] = logits[0, :-1].argmax(-1)  # a row the argmax gets all right, so accuracy is not ~1/11
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2, :2] = 0
    for m in (None, mask, mask.bool()):
        for per_token in (False, True):
            ours = gb_utils.lm_cross_entropy_loss(logits, tokens, m, per_token)
            theirs = tl_utils.lm_cross_entropy_loss(logits, tokens, m, per_token)
            assert ours.shape == theirs.shape
            # measured 0 (same float32 log_softmax, summed in the same order; values up to 9.2), bound 1e-6
            assert max_diff(ours, theirs) < 1e-6
    for per_token in (False, True):
        ours, theirs = gb_utils.lm_accuracy(logits, tokens, per_token), tl_utils.lm_accuracy(logits, tokens, per_token)
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype and torch.equal(ours, theirs)


# -- tokenize_and_concatenate ----------------------------------------------------------------------
def documents(n: int) -> list:
    rng = random.Random(7)
    words = ["the", "letter", "garden", "Elizabeth", "walked", ",", ".", "\n", "Mr.", "Darcy", "said"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(0, 30))) for _ in range(n)]


@pytest.mark.parametrize("n_docs,max_length,add_bos,num_proc,pad", [
    (2300, 17, True, None, True),    # three map batches: each one's remainder is dropped
    (2300, 33, False, 2, False),     # two shards of 1150: batches of 1000 and 150 in each
    (2, 1024, True, 3, True),        # fewer documents than processes; each shorter than a row: padded
    (5, 1024, False, None, False),   # padded with EOS where the tokenizer has no pad token
])
def test_tokenize_and_concatenate_equals_transformer_lens(n_docs, max_length, add_bos, num_proc, pad):
    docs = documents(n_docs)
    table = {"text": docs, "other": list(range(n_docs))}
    options = dict(max_length=max_length, add_bos_token=add_bos, num_proc=num_proc)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = tl_utils.tokenize_and_concatenate(datasets.Dataset.from_dict(table), fresh_tokenizer(pad), **options)
        ours = gb_utils.tokenize_and_concatenate(datasets.Dataset.from_dict(table), fresh_tokenizer(pad), **options)
    from_list = gb_utils.tokenize_and_concatenate(docs, fresh_tokenizer(pad), **options)
    assert ours.column_names == theirs.column_names == ["tokens"]
    theirs_rows = theirs[:]["tokens"]  # datasets 5: ds["tokens"] is a lazy Column, ds[:] a dict of tensors
    assert torch.equal(ours[:]["tokens"], theirs_rows)
    assert torch.equal(from_list["tokens"], theirs_rows)
    assert len(from_list) == len(theirs) and torch.equal(from_list[-1]["tokens"], theirs_rows[-1])


# -- init ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(13,), (7, 11), (3, 7, 5)])
def test_init_functions_equal_transformer_lens(shape):
    assert gb_utils.calc_fan_in_and_fan_out(torch.empty(shape)) == tl_utils.calc_fan_in_and_fan_out(torch.empty(shape))
    calls = [("init_xavier_uniform_", {}), ("init_xavier_normal_", {"gain": 0.7}),
             ("init_kaiming_uniform_", {}), ("init_kaiming_normal_", {"nonlinearity": "tanh", "mode": "fan_out"}),
             ("init_kaiming_uniform_", {"a": 0.1, "nonlinearity": "leaky_relu", "gain": 2.0}),
             ("init_kaiming_normal_", {"nonlinearity": "linear"})]
    for name, kwargs in calls:
        ours, theirs = torch.empty(shape), torch.empty(shape)
        torch.manual_seed(11)
        getattr(gb_utils, name)(ours, **kwargs)
        torch.manual_seed(11)
        getattr(tl_utils, name)(theirs, **kwargs)
        assert torch.equal(ours, theirs), name


# -- small tensor helpers, composition -------------------------------------------------------------
def test_tensor_helpers_equal_transformer_lens():
    t = torch.arange(4 * 5 * 6, dtype=torch.float32).reshape(4, 5, 6)
    for value in (t, t.to(torch.bfloat16), [1, 2], (3.0, 4.0), 5, 2.5, True, "x", np.ones(2)):
        a, b = gb_utils.to_numpy(value), tl_utils.to_numpy(value)
        assert a.dtype == b.dtype and np.array_equal(a, b)
    for n in (1, 3):
        assert torch.equal(gb_utils.get_corner(t, n), tl_utils.get_corner(t, n))
    for x in (t[None], t, t[:1]):
        assert torch.equal(gb_utils.remove_batch_dim(x), tl_utils.remove_batch_dim(x))
    assert torch.equal(gb_utils.transpose(t), tl_utils.transpose(t))
    square = torch.tril(torch.ones(4, 4))
    for x in (square, square.T, torch.ones(3, 4), torch.ones(2, 2, 2), torch.zeros(1, 1)):
        assert gb_utils.is_square(x) == tl_utils.is_square(x)
        assert gb_utils.is_lower_triangular(x) == tl_utils.is_lower_triangular(x)


def test_composition_scores_equal_transformer_lens():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(2, 3, 11, 4, generator=g), torch.randn(2, 3, 4, 11, generator=g)
    c, d = torch.randn(5, 11, 4, generator=g), torch.randn(5, 4, 11, generator=g)
    ours = gb_utils.composition_scores(FactoredMatrix(a, b), FactoredMatrix(c, d))
    theirs = tl_utils.composition_scores(TLFactoredMatrix(a, b), TLFactoredMatrix(c, d))
    assert ours.shape == theirs.shape == (2, 3, 5)
    # measured 1.2e-7 (scores up to 0.43), bound 2e-6: 17x
    assert max_diff(ours, theirs) < 2e-6


# -- test_prompt -----------------------------------------------------------------------------------
def printed(fn, *args, **kwargs) -> str:
    out = io.StringIO()
    rich.reconfigure(file=out, width=10_000)  # TransformerLens prints through rich, which wraps at 80 columns
    try:
        with contextlib.redirect_stdout(out):
            fn(*args, **kwargs)
    finally:
        rich.reconfigure()
    return out.getvalue()


@pytest.mark.parametrize("answer", ["letter", " garden of", ["letter", "garden", " the"]], ids=repr)
def test_test_prompt_prints_transformer_lens_report(pair, answer):
    model, twin = pair
    prompt = "Elizabeth read the letter, and then she read the"
    ours = printed(gb_utils.test_prompt, prompt, answer, model, top_k=4)
    theirs = printed(tl_utils.test_prompt, prompt, answer, twin, top_k=4)
    assert ours.splitlines() == theirs.splitlines()
    assert printed(gb_utils.test_prompt, prompt, answer, model, print_details=False).splitlines() == \
        printed(tl_utils.test_prompt, prompt, answer, twin, print_details=False).splitlines()


# -- evals -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("symmetric", [False, True])
def test_ioi_dataset_with_a_seed_gives_transformer_lens_prompts(symmetric):
    tok = fresh_tokenizer()
    custom = dict(templates=["[A] met with [B]. [B] gave the [OBJECT] to [A]"], names=["Alice", "Bob", "Charlie"],
                  nouns={"OBJECT": ["ball", "book"]})
    for options in ({}, custom):
        ours = gb_evals.IOIDataset(tok, num_samples=40, symmetric=symmetric, seed=5, **options)
        theirs = tl_evals.IOIDataset(tok, num_samples=40, symmetric=symmetric, seed=5, **options)
        assert ours.samples == theirs.samples
        assert len(ours) == len(theirs)
        for i in (0, 1, len(ours) - 1):
            a, b = ours[i], theirs[i]
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert gb_evals.IOIDataset.get_default_templates() == tl_evals.IOIDataset.get_default_templates()
    assert gb_evals.IOIDataset.get_default_names() == tl_evals.IOIDataset.get_default_names()
    assert gb_evals.IOIDataset.get_default_nouns() == tl_evals.IOIDataset.get_default_nouns()


def test_ioi_eval_equals_transformer_lens(pair):
    model, twin = pair
    tok = fresh_tokenizer()
    names = ["Elizabeth", "Jane", "Mary", "John", "Charlotte"]
    ours = gb_evals.ioi_eval(model, gb_evals.IOIDataset(tok, names=names, num_samples=12, seed=1), batch_size=5)
    theirs = tl_evals.ioi_eval(twin, tl_evals.IOIDataset(tok, names=names, num_samples=12, seed=1), batch_size=5)
    assert ours.keys() == theirs.keys()
    assert ours["Accuracy"] == theirs["Accuracy"]
    # measured 1.9e-7 (mean logit difference -0.46; no prompt's within 0.26 of 0), bound 5e-6: 26x
    assert abs(ours["Logit Difference"] - theirs["Logit Difference"]) < 5e-6


@pytest.mark.parametrize("prepend_bos", [None, False])
def test_induction_loss_equals_transformer_lens(pair, prepend_bos):
    model, twin = pair
    torch.manual_seed(9)
    ours = gb_evals.induction_loss(model, batch_size=3, subseq_len=20, prepend_bos=prepend_bos)
    torch.manual_seed(9)
    theirs = tl_evals.induction_loss(twin, batch_size=3, subseq_len=20, prepend_bos=prepend_bos, device="cpu")
    # measured 9.5e-7 (loss 11.4; 0 with the BOS), bound 1e-5: 10x
    assert abs(float(ours) - float(theirs)) < 1e-5


def test_evaluate_on_dataset_equals_transformer_lens(pair):
    model, twin = pair
    rows = gb_utils.tokenize_and_concatenate(documents(400), fresh_tokenizer(), max_length=24, num_proc=None)
    loader = torch.utils.data.DataLoader(rows, batch_size=4, shuffle=False)
    ours = gb_evals.evaluate_on_dataset(model, loader, truncate=2)
    theirs = tl_evals.evaluate_on_dataset(twin, loader, truncate=2, device="cpu")
    # measured 0 (loss 11.2: the same per-batch means), bound 1e-5
    assert abs(ours - theirs) < 1e-5


def test_hub_loader_reads_the_cache_only_and_says_how_to_give_local_text(monkeypatch, tmp_path):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path))  # an empty cache
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path))
    before = datasets.config.HF_HUB_OFFLINE
    with pytest.raises(FileNotFoundError, match=r"'NeelNanda/pile-10k'.*does not download.*make_text_data_loader"):
        gb_evals.make_pile_data_loader(fresh_tokenizer())
    assert datasets.config.HF_HUB_OFFLINE == before  # the offline switch is put back


def test_manually_prepended_bos_equals_transformer_lens():
    for bos, text in (("<|endoftext|>", "Hi"), ("<s>", ["a", "b c"]), (None, "x"), (None, ["y"])):
        assert gb_utils.get_input_with_manually_prepended_bos(bos, text) == \
            tl_utils.get_input_with_manually_prepended_bos(bos, text)


def test_streamed_tokenize_and_concatenate_equals_transformer_lens():
    docs = documents(1500)  # two map batches of the stream

    def stream():
        return datasets.Dataset.from_dict({"text": docs, "other": list(range(1500))}).to_iterable_dataset()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = list(tl_utils.tokenize_and_concatenate(stream(), fresh_tokenizer(), streaming=True, max_length=9,
                                                         set_format=False))
        ours = list(gb_utils.tokenize_and_concatenate(stream(), fresh_tokenizer(), streaming=True, max_length=9,
                                                      set_format=False))
    assert len(ours) == len(theirs) and all(a.keys() == b.keys() == {"tokens"} for a, b in zip(ours, theirs))
    assert [list(a["tokens"]) for a in ours] == [list(b["tokens"]) for b in theirs]


def test_keep_single_column_equals_transformer_lens():
    table = datasets.Dataset.from_dict({"text": ["a", "b"], "meta": [1, 2], "more": ["x", "y"]})
    ours, theirs = gb_utils.keep_single_column(table, "text"), tl_utils.keep_single_column(table, "text")
    assert ours.column_names == theirs.column_names == ["text"] and ours["text"][:] == theirs["text"][:]
    with pytest.raises(KeyError, match="no column 'body'"):
        gb_utils.keep_single_column(table, "body")
