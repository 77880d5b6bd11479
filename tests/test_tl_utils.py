"""glassbox.tl.utils and the glassbox functions under it, against hand computations.

(TransformerLens itself is the oracle in tests_tl/test_utils_evals.py.)
"""

import math
import sys

import numpy as np
import pytest
import torch

from glassbox.interp.axis_slice import Slice
from glassbox.interp.factored_matrix import FactoredMatrix
from glassbox.interp.lm_metrics import next_token_accuracy
from glassbox.models import gpt2_tokenizer
from glassbox.tl import utils
from glassbox.train import param_init
from glassbox.train.datasets import document_groups, pack_documents, read_texts, text_data_loader


# -- Slice -----------------------------------------------------------------------------------------
def test_slice_picks_what_python_indexing_picks():
    t = torch.arange(5 * 7).reshape(5, 7)
    assert torch.equal(Slice(2).apply(t, 1), torch.tensor([2, 9, 16, 23, 30]))             # the axis goes
    assert torch.equal(Slice((1, 4)).apply(t, 0), torch.stack([t[1], t[2], t[3]]))        # a tuple is a slice
    assert torch.equal(Slice((0, 7, 3)).apply(t, -1), torch.stack([t[:, 0], t[:, 3], t[:, 6]], dim=1))
    assert torch.equal(Slice((2,)).apply(t, 0), torch.stack([t[0], t[1]]))                 # (k,) is :k
    assert torch.equal(Slice([4, 0]).apply(t, -1), torch.stack([t[:, 4], t[:, 0]], dim=1))
    assert torch.equal(Slice(torch.tensor([3])).apply(t, 0), t[3:4])                       # the axis stays
    assert torch.equal(Slice(np.array([True, False, False, False, True])).apply(t, 0), torch.stack([t[0], t[4]]))
    assert torch.equal(Slice(None).apply(t, 1), t)                                         # no new axis
    assert torch.equal(Slice(slice(-2, None)).apply(t, 0), torch.stack([t[3], t[4]]))
    assert torch.equal(Slice([]).apply(t, 1), t[:, :0])


def test_slice_indices_and_unwrap():
    assert Slice((1, 6, 2)).indices(7).tolist() == [1, 3, 5]
    assert Slice(3).indices().tolist() == [3]
    assert Slice(-1).indices(4).tolist() == [-1]  # an int is returned as given, as TransformerLens does
    assert Slice(None).indices(3).tolist() == [0, 1, 2]
    assert Slice([2, 0]).indices(3).tolist() == [2, 0]
    t = torch.arange(12).reshape(3, 4)
    kept = Slice.unwrap(2).apply(t, 0)
    assert kept.shape == (1, 4) and torch.equal(kept[0], t[2])
    same = Slice((0, 2))
    assert Slice.unwrap(same) is same
    assert repr(Slice(3)) == "Slice: 3 Mode: int "
    assert utils.Slice is Slice


@pytest.mark.parametrize("bad,match", [(True, "bool"), ("last", "str"), ((1, 2, 3, 4), "1 to 3"),
                                       ([0.5, 1.5], "integers or booleans"), (2.0, "float")])
def test_slice_refuses_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        Slice(bad)


def test_slice_refusals_at_use():
    with pytest.raises(ValueError, match="max_ctx"):
        Slice([1]).indices()
    with pytest.raises(IndexError, match="dim=2"):
        Slice(0).apply(torch.zeros(3, 4), 2)


# -- get_act_name ----------------------------------------------------------------------------------
@pytest.mark.parametrize("args,name", [
    (("k", 6, "a"), "blocks.6.attn.hook_k"), (("k6",), "blocks.6.attn.hook_k"),
    (("scale4ln1",), "blocks.4.ln1.hook_scale"), (("pre5",), "blocks.5.mlp.hook_pre"),
    (("pre", 2), "blocks.2.mlp.hook_pre"), (("embed",), "hook_embed"), (("pos_embed",), "hook_pos_embed"),
    (("normalized", 27, "ln2"), "blocks.27.ln2.hook_normalized"), (("normalized",), "ln_final.hook_normalized"),
    (("attn", 3), "blocks.3.attn.hook_pattern"), (("attn_logits", 1), "blocks.1.attn.hook_attn_scores"),
    (("resid_post", 3, "b"), "blocks.3.hook_resid_post"), (("pattern", "3"), "blocks.3.attn.hook_pattern"),
    (("q_input", 2), "blocks.2.hook_q_input"),
    (("attn_in", 0), "blocks.0.hook_attn_in"), (("mlp_in", 1), "blocks.1.hook_mlp_in"),
    (("blocks.0.attn.hook_q",), "blocks.0.attn.hook_q"), (("hook_embed",), "hook_embed"),
    (("v12",), "blocks.12.attn.hook_v"), (("resid_pre_grad", 1), "blocks.1.hook_resid_pre_grad"),
])
def test_get_act_name(args, name):
    assert utils.get_act_name(*args) == name


@pytest.mark.parametrize("args,match", [(("q", 0, "mlp"), "lives in"), (("scale", 2), "needs its norm"),
                                        (("resid_pre5",), "closest: resid_pre"), (("q_input",), "per layer"),
                                        (("mid", 1), "unknown activation kind"),  # SoLU's: no glassbox model
                                        ((3,), "string")])
def test_get_act_name_refuses_names_of_no_hook(args, match):
    with pytest.raises(KeyError, match=match):
        utils.get_act_name(*args)


# -- masks, BOS removal ----------------------------------------------------------------------------
class Tok:
    """The four ids a mask reads: BOS 0, pad 9 (or 0), and a padding side."""

    def __init__(self, pad=9, side="right"):
        self.bos_token_id, self.pad_token_id, self.padding_side = 0, pad, side


def test_attention_mask_masks_only_end_padding():
    right = torch.tensor([[0, 5, 9, 6, 9, 9], [0, 5, 6, 7, 8, 4]])  # the inner 9 is text
    assert utils.get_attention_mask(Tok(), right, True).tolist() == [[1, 1, 1, 1, 0, 0], [1] * 6]
    left = torch.tensor([[9, 9, 0, 9, 5, 6], [0, 5, 6, 7, 8, 4]])
    assert utils.get_attention_mask(Tok(side="left"), left, True).tolist() == [[0, 0, 1, 1, 1, 1], [1] * 6]
    assert utils.get_attention_mask(Tok(side="left"), left, True, "right").tolist() == [[1] * 6, [1] * 6]
    # BOS == pad, left padding: the last leading "pad" is the BOS (with prepend_bos), else padding
    shared = torch.tensor([[0, 0, 0, 5, 6], [0, 4, 5, 6, 7]])
    assert utils.get_attention_mask(Tok(pad=0, side="left"), shared, True).tolist() == [[0, 0, 1, 1, 1], [1] * 5]
    assert utils.get_attention_mask(Tok(pad=0, side="left"), shared, False).tolist() == [[0, 0, 0, 1, 1], [0] + [1] * 4]
    assert utils.get_attention_mask(None, shared, True).tolist() == [[1] * 5] * 2
    with pytest.raises(ValueError, match="padding_side"):
        utils.get_attention_mask(Tok(), right, True, "middle")


def test_tokens_with_bos_removed():
    assert utils.get_tokens_with_bos_removed(Tok(), torch.tensor([[0, 5, 6, 9], [0, 7, 8, 4]])).tolist() == \
        [[5, 6, 9], [7, 8, 4]]
    left = torch.tensor([[9, 9, 0, 5], [0, 7, 8, 4]])
    assert utils.get_tokens_with_bos_removed(Tok(side="left"), left).tolist() == [[9, 9, 5], [7, 8, 4]]
    shared = torch.tensor([[0, 0, 0, 5], [0, 7, 8, 0]])  # BOS == pad: the last leading 0 is the BOS
    assert utils.get_tokens_with_bos_removed(Tok(pad=0, side="left"), shared).tolist() == [[0, 0, 5], [7, 8, 0]]
    with pytest.raises(ValueError, match="do not start with the BOS"):
        utils.get_tokens_with_bos_removed(Tok(pad=0, side="left"), torch.tensor([[3, 4]]))


# -- losses and accuracy ---------------------------------------------------------------------------
def test_cross_entropy_by_hand():
    # vocab of 2; position 0 predicts token 1 with p = 3/4, position 1 predicts token 0 with p = 2/3
    logits = torch.tensor([[[0.0, math.log(3)], [math.log(2), 0.0], [5.0, -5.0]]], dtype=torch.float64)
    tokens = torch.tensor([[0, 1, 0]])
    per = utils.lm_cross_entropy_loss(logits, tokens, per_token=True)
    expected = torch.tensor([[math.log(4 / 3), math.log(3 / 2)]], dtype=torch.float64)
    # measured 4.6e-8 against the closed form (values up to 0.41; lm_loss computes in float32), bound 1e-6: 22x
    assert per.shape == (1, 2) and float((per.double() - expected).abs().max()) < 1e-6
    assert abs(float(utils.lm_cross_entropy_loss(logits, tokens)) - math.log(2) / 2) < 1e-6  # log(4/3 * 3/2) / 2
    mask = torch.tensor([[1, 1, 0]])  # the last token is padding: only position 0's pair counts
    assert abs(float(utils.lm_cross_entropy_loss(logits, tokens, mask)) - math.log(4 / 3)) < 1e-6
    with pytest.raises(ValueError, match="same shape"):
        utils.lm_cross_entropy_loss(logits, tokens, torch.ones(1, 2))


def test_accuracy_by_hand():
    logits = torch.zeros(2, 4, 5)
    for b, row in enumerate([[1, 2, 3, 0], [4, 4, 0, 1]]):  # the argmax at each position
        for p, top in enumerate(row):
            logits[b, p, top] = 1.0
    tokens = torch.tensor([[7, 1, 2, 0], [7, 4, 3, 0]])  # row 0: right, right, wrong; row 1: right, wrong, right
    per = utils.lm_accuracy(logits, tokens, per_token=True)
    assert per.dtype == torch.bool and per.tolist() == [[True, True, False], [True, False, True]]
    assert float(utils.lm_accuracy(logits, tokens)) == float(torch.tensor(4 / 6))  # a float32 fraction
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])  # row 1 keeps only its first pair: 3 right of 4
    assert float(next_token_accuracy(logits, tokens, attention_mask=mask)) == 0.75
    with pytest.raises(ValueError, match="at least 2 tokens"):
        utils.lm_accuracy(logits[:, :1], tokens[:, :1])


# -- init ------------------------------------------------------------------------------------------
def test_fans_follow_the_right_multiplying_layout():
    assert utils.calc_fan_in_and_fan_out(torch.empty(13)) == (1, 13)
    assert utils.calc_fan_in_and_fan_out(torch.empty(7, 11)) == (7, 11)        # W_in [d_model d_mlp]
    assert utils.calc_fan_in_and_fan_out(torch.empty(3, 7, 5)) == (7, 15)      # W_Q [head d_model d_head]
    with pytest.raises(ValueError, match="shape"):
        utils.calc_fan_in_and_fan_out(torch.empty(2, 2, 2, 2))


SHAPE = (3, 200, 100)  # fan_in 200, fan_out 300; 60000 draws
N = 3 * 200 * 100


@pytest.mark.parametrize("name,kwargs,kind,scale", [
    ("init_xavier_uniform_", {}, "uniform", math.sqrt(6 / 500)),
    ("init_xavier_normal_", {"gain": 0.5}, "normal", 0.5 * math.sqrt(2 / 500)),
    ("init_kaiming_uniform_", {}, "uniform", math.sqrt(2) * math.sqrt(3 / 200)),       # relu gain, fan_in
    ("init_kaiming_normal_", {"mode": "fan_out"}, "normal", math.sqrt(2) / math.sqrt(300)),
    ("init_kaiming_normal_", {"nonlinearity": "tanh", "gain": 2.0}, "normal", 2 * 5 / 3 / math.sqrt(200)),
])
def test_init_statistics(name, kwargs, kind, scale):
    torch.manual_seed(0)
    param = torch.empty(SHAPE, dtype=torch.float64)
    assert getattr(utils, name)(param, **kwargs) is param
    std = scale / math.sqrt(3) if kind == "uniform" else scale
    # Statistical bounds over N = 60000 draws. Mean: its standard error is std / sqrt(N); 6 SE.
    assert abs(float(param.mean())) < 6 * std / math.sqrt(N)
    # Std: its relative standard error is sqrt((kurtosis - 1) / (4 N)): 0.18% (uniform), 0.29% (normal);
    # the 2% bound is over 6 SE, while a wrong fan (200 vs 300 vs 500) moves it by 18% or more.
    assert abs(float(param.std()) / std - 1) < 0.02
    if kind == "uniform":
        # Every draw inside [-b, b], and the extremes near it: P(max < 0.99 b) = 0.995^N, about 1e-130.
        assert float(param.abs().max()) <= scale and float(param.abs().max()) > 0.99 * scale


def test_init_with_a_generator_is_the_global_draw():
    ours = param_init.xavier_uniform_(torch.empty(7, 11), generator=torch.Generator().manual_seed(4))
    torch.manual_seed(4)
    assert torch.equal(utils.init_xavier_uniform_(torch.empty(7, 11)), ours)
    with pytest.raises(ValueError, match="mode"):
        utils.init_kaiming_normal_(torch.empty(3, 3), mode="fan_avg")


# -- tensor helpers --------------------------------------------------------------------------------
def test_tensor_helpers():
    t = torch.arange(24.0).reshape(2, 3, 4)
    assert utils.to_numpy(t.to(torch.bfloat16)).dtype == np.float32
    assert utils.to_numpy(t.requires_grad_()).tolist() == t.tolist()
    assert utils.to_numpy([1, 2]).tolist() == [1, 2] and utils.to_numpy(3).item() == 3
    with pytest.raises(ValueError, match="dict"):
        utils.to_numpy({})
    assert utils.get_corner(t.detach(), 2).tolist() == [[[0, 1], [4, 5]], [[12, 13], [16, 17]]]
    assert utils.remove_batch_dim(t[:1]).shape == (3, 4) and utils.remove_batch_dim(t).shape == (2, 3, 4)
    assert utils.transpose(t).shape == (2, 4, 3)
    assert utils.is_square(torch.zeros(3, 3)) and not utils.is_square(torch.zeros(3, 4))
    assert not utils.is_square(torch.zeros(2, 2, 2))
    lower = torch.tensor([[1.0, 0.0], [2.0, 3.0]])
    assert utils.is_lower_triangular(lower) and not utils.is_lower_triangular(lower.T)
    assert utils.get_device() == ("cuda" if torch.cuda.is_available() else "cpu")
    assert utils.override_or_use_default_value(True, None) is True
    assert utils.override_or_use_default_value(True, False) is False


def test_composition_scores_by_hand():
    g = torch.Generator().manual_seed(1)
    a, b, c, d = (torch.randn(s, generator=g, dtype=torch.float64) for s in [(6, 2), (2, 6), (6, 3), (3, 6)])
    left, right = a @ b, c @ d
    expected = (left @ right).norm() / left.norm() / right.norm()
    score = utils.composition_scores(FactoredMatrix(a, b), FactoredMatrix(c, d))
    # measured 5.6e-17 (score 0.27, float64), bound 1e-15: 18x
    assert abs(float(score) - float(expected)) < 1e-15


# -- tokenize_and_concatenate ----------------------------------------------------------------------
def test_packing_by_hand():
    tok = gpt2_tokenizer()
    docs = ["Elizabeth read the letter", "and the garden", "."]
    ids = [tok.encode(d) for d in docs]
    eos, bos = tok.eos_token_id, tok.bos_token_id
    stream = ids[0] + [eos] + ids[1] + [eos] + ids[2]
    rows = utils.tokenize_and_concatenate(docs, tok, max_length=4, num_proc=None)  # BOS + 3 stream tokens a row
    whole = len(stream) // 3 * 3
    expected = [[bos] + stream[i:i + 3] for i in range(0, whole, 3)]
    assert rows["tokens"].tolist() == expected and len(rows) == len(expected)
    assert rows[0]["tokens"].tolist() == expected[0]
    no_bos = utils.tokenize_and_concatenate(docs, tok, max_length=5, add_bos_token=False, num_proc=None)
    assert no_bos["tokens"].tolist() == [stream[i:i + 5] for i in range(0, len(stream) // 5 * 5, 5)]
    # num_proc=10 (the default) makes each of the 3 documents its own shard, packed alone, as datasets.map does
    alone = utils.tokenize_and_concatenate(docs, tok, max_length=4)
    assert alone["tokens"].tolist() == sum((pack_documents([d], tok, 4).tolist() for d in docs), [])
    assert alone["tokens"].tolist() != rows["tokens"].tolist()
    short = pack_documents(["Hi"], tok, max_length=6)  # shorter than a row: padded with EOS (no pad token)
    assert short.tolist() == [[bos] + tok.encode("Hi") + [eos] * (5 - len(tok.encode("Hi")))]


def test_document_groups_are_map_batches_of_shards():
    assert document_groups(2300) == [range(0, 1000), range(1000, 2000), range(2000, 2300)]
    assert document_groups(10, 3) == [range(0, 4), range(4, 7), range(7, 10)]
    assert document_groups(3, 10) == [range(0, 1), range(1, 2), range(2, 3)]
    assert document_groups(2500, 2) == [range(0, 1000), range(1000, 1250), range(1250, 2250), range(2250, 2500)]
    with pytest.raises(ValueError, match="num_proc"):
        document_groups(5, -1)


def test_packing_refusals():
    tok = gpt2_tokenizer()
    with pytest.raises(ValueError, match="max_length"):
        utils.tokenize_and_concatenate(["a"], tok, max_length=1)
    with pytest.raises(ValueError, match="strings"):
        utils.tokenize_and_concatenate(["a", 3], tok, max_length=4)


def test_text_file_loader(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("First paragraph, one line.\n\nSecond paragraph\nover two lines.\n\n\n")
    assert read_texts(path) == ["First paragraph, one line.", "Second paragraph\nover two lines."]
    loader = text_data_loader(path, gpt2_tokenizer(), batch_size=2, max_length=4, shuffle=False)
    batch = next(iter(loader))
    assert batch["tokens"].shape == (2, 4) and (batch["tokens"][:, 0] == gpt2_tokenizer().bos_token_id).all()
    with pytest.raises(ValueError, match="fewer than one batch"):
        text_data_loader(path, gpt2_tokenizer(), batch_size=100, max_length=4)
    with pytest.raises(FileNotFoundError, match="no text file"):
        read_texts(tmp_path / "missing.txt")


def test_hf_datasets_paths_without_datasets_say_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as where the optional extra is not installed
    from glassbox.tl import evals

    with pytest.raises(ImportError, match="'wikitext'.*pip install datasets.*make_text_data_loader"):
        evals.make_wiki_data_loader(gpt2_tokenizer())
    with pytest.raises(ImportError, match="'NeelNanda/pile-10k'"):
        utils.get_dataset("pile")
    with pytest.raises(ValueError, match="not supported.*openwebtext"):
        utils.get_dataset("books")


def test_manually_prepended_bos():
    assert utils.get_input_with_manually_prepended_bos("<s>", "Hi") == "<s>Hi"
    assert utils.get_input_with_manually_prepended_bos("<s>", ["a", "b"]) == ["<s>a", "<s>b"]
    assert utils.get_input_with_manually_prepended_bos(None, "Hi") == "Hi"


def test_download_file_from_hf_reads_the_cache_only(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache"):
        utils.download_file_from_hf("nobody/no-such-repo", "cfg.json", cache_dir=str(tmp_path))


class _Payload:
    """Anything torch.load would have to unpickle as code, not data."""


def test_download_file_from_hf_loads_tensors_and_refuses_pickled_objects(monkeypatch, tmp_path):
    """A .pth of tensors loads (weights_only); one holding an arbitrary object is refused naming the file,
    where TransformerLens unpickles it."""
    import huggingface_hub

    data = {"W": torch.arange(6.0).reshape(2, 3), "n": 3}
    torch.save(data, tmp_path / "good.pth")
    torch.save({"obj": _Payload()}, tmp_path / "bad.pth")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo_id, filename, **kw: str(tmp_path / filename))
    loaded = utils.download_file_from_hf("someone/repo", "good.pth")
    assert torch.equal(loaded["W"], data["W"]) and loaded["n"] == 3
    with pytest.raises(ValueError, match=r"bad\.pth: holds objects other than tensors"):
        utils.download_file_from_hf("someone/repo", "bad.pth")


@pytest.mark.parametrize("fn", ["lm_cross_entropy_loss", "lm_accuracy"])
def test_loss_and_accuracy_refuse_bad_shapes_and_ids_naming_them(fn):
    call = getattr(utils, fn)
    logits = torch.randn(2, 7, 53)
    good = torch.randint(0, 53, (2, 7), generator=torch.Generator().manual_seed(0))
    cases = [
        (torch.zeros(2, 6, dtype=torch.long), r"logits \(2, 7, 53\) and tokens \(2, 6\) differ in \[batch pos\]"),
        (torch.zeros(3, 7, dtype=torch.long), r"logits \(2, 7, 53\) and tokens \(3, 7\) differ"),
        (good.index_put((torch.tensor([1]), torch.tensor([3])), torch.tensor(99)),
         r"token id 99 \(a target.*\[0, d_vocab=53\)"),
        (good.index_put((torch.tensor([0]), torch.tensor([6])), torch.tensor(-1)), r"token id -1 \(a target"),
        (good.float(), r"tokens must be an integer tensor.*torch.float32"),
    ]
    for tokens, message in cases:
        with pytest.raises(ValueError, match=message):
            call(logits, tokens)
    with pytest.raises(ValueError, match=r"logits must be \[batch pos d_vocab\], got \(7, 53\)"):
        call(logits[0], good[0])
    # the first token is never a target: an id outside the vocabulary there is not read
    first = good.clone()
    first[:, 0] = 99
    assert torch.equal(call(logits, first), call(logits, good))


def test_loss_mask_of_the_wrong_shape_is_transformer_lens_assertion():
    with pytest.raises(AssertionError, match="attention_mask must have the same shape as tokens") as error:
        utils.lm_cross_entropy_loss(torch.randn(1, 3, 5), torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 2))
    assert isinstance(error.value, ValueError)
