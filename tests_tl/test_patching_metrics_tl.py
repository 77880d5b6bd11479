"""glassbox.tl's get_act_patch_* against TransformerLens 3.9 under metrics of the whole batch.

glassbox hands the metric ``LazyLogits`` (unembedded where it looks); TransformerLens hands it full
logits. Each metric here must give TransformerLens's numbers: the Activation Patching demo's
(a logit difference at the last position, averaged over the batch, then normalised), ones that are
not separable over the batch (a spread across prompts, a nonlinearity of a batch sum), one whose
read position depends on the patched values, and one reading every position. Two models: a GPT-2
style one (tl_oracle.tiny_gpt2) and a rotary, RMSNorm, grouped-query one (TransformerLens's own
weights loaded into glassbox.tl, as in test_families_tl.py).
"""

import warnings

import pytest
import torch
import transformer_lens as TL
import transformer_lens.patching as tl_patching

import glassbox.tl as gtl
from glassbox.models.tokenize import gpt2_tokenizer
from glassbox.tl import patching
from tl_oracle import max_diff, tiny_gpt2, tl_twin

warnings.filterwarnings("ignore", message="HookedTransformer is deprecated")
N_PROMPTS, POS, VOCAB = 4, 5, 97
ANSWERS = torch.tensor([[5, 11], [7, 2], [5, 40], [13, 11]])


def logit_diff(logits):
    if len(logits.shape) == 3:
        logits = logits[:, -1, :]
    return (logits.gather(1, ANSWERS[:, :1]) - logits.gather(1, ANSWERS[:, 1:])).mean()


def demo_metric(clean_ld, corrupted_ld):
    def ioi_metric(logits):
        return (logit_diff(logits) - corrupted_ld) / (clean_ld - corrupted_ld)
    return ioi_metric


def batch_std(logits):
    return logits[:, -1, 5].std()


def tanh_of_sum(logits):
    return torch.tanh(logits[:, -1, 5].sum() / 3)


def branching(logits):
    return logits[:, 1, 7].mean() if bool(logits[:, -1, 5].mean() > 0) else logits[:, 2, 11].mean()


def every_position(logits):
    return logits.log_softmax(-1)[:, :, 5].mean()


def rotary_gqa_pair():
    cfg = dict(d_model=24, d_head=6, n_heads=4, n_key_value_heads=2, n_layers=2, n_ctx=16, d_vocab=VOCAB, d_mlp=20,
               act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary", rotary_dim=4,
               gated_mlp=True, dtype=torch.float32, device="cpu", seed=0)
    theirs = TL.HookedTransformer(TL.HookedTransformerConfig(**cfg))
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in theirs.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith(".w"):
                param.add_(0.3 * noise)
            elif name.split(".")[-1].startswith(("b", "_b")):
                if not name.endswith("mlp.b_in"):  # TransformerLens adds a gated b_in after the product
                    param.copy_(0.2 * noise)
            else:
                param.copy_(0.35 * noise)
    ours = gtl.HookedTransformer(gtl.HookedTransformerConfig(**cfg))
    ours.load_and_process_state_dict({k.replace(".attn._", ".attn."): v for k, v in theirs.state_dict().items()},
                                     fold_ln=False, center_writing_weights=False, center_unembed=False,
                                     fold_value_biases=False)
    return ours.eval(), theirs.eval()


@pytest.fixture(scope="module", params=["gpt2", "rotary_gqa"])
def runs(request):
    if request.param == "gpt2":
        model = tiny_gpt2(2, d_vocab=VOCAB, n_ctx=16)
        ours, theirs = model, tl_twin(model, tokenizer=gpt2_tokenizer())
    else:
        ours, theirs = rotary_gqa_pair()
    generator = torch.Generator().manual_seed(8)
    clean = torch.randint(0, VOCAB, (N_PROMPTS, POS), generator=generator)
    corrupted = torch.randint(0, VOCAB, (N_PROMPTS, POS), generator=generator)
    with torch.no_grad():
        clean_ld, corrupted_ld = float(logit_diff(theirs(clean))), float(logit_diff(theirs(corrupted)))
    _, cache_ours = ours.run_with_cache(clean)
    _, cache_theirs = theirs.run_with_cache(clean)
    return request.param, ours, theirs, corrupted, cache_ours, cache_theirs, (clean_ld, corrupted_ld)


METRICS = ["demo", "batch_std", "tanh_of_sum", "branching", "every_position"]
# keys and values of a grouped-query model: glassbox sweeps kv heads, TransformerLens does not (see
# glassbox.tl.patching); they are compared on the GPT-2 model only
GROUPED = ("_k_", "_v_", "_every")
FUNCTIONS = [n for n in dir(tl_patching) if n.startswith("get_act_patch_") and "dest_src" not in n]


@pytest.mark.parametrize("metric_name", METRICS)
@pytest.mark.parametrize("name", FUNCTIONS)
def test_get_act_patch_equals_transformer_lens_under_whole_batch_metrics(runs, name, metric_name):
    kind, ours, theirs, corrupted, cache_ours, cache_theirs, baselines = runs
    if kind == "rotary_gqa" and any(g in name for g in GROUPED) and "block" not in name:
        pytest.skip("grouped keys and values: glassbox sweeps kv heads")
    metric = demo_metric(*baselines) if metric_name == "demo" else globals()[metric_name]
    expected = getattr(tl_patching, name)(theirs, corrupted, cache_theirs, metric)
    got = getattr(patching, name)(ours, corrupted, cache_ours, metric)
    assert type(got) is torch.Tensor and got.shape == expected.shape and got.dtype == expected.dtype
    assert float(expected.abs().max()) > 0.05  # not a degenerate case
    # every case passed under 2e-5 (values up to about 7; per-case maxima not recorded); the same
    # functions under a batch-mean metric measured 7.2e-7 in test_patching_heads.py
    assert max_diff(got, expected) < 2e-5, (name, metric_name)


def test_dest_src_pattern_patch_equals_transformer_lens_under_a_batch_spread(runs):
    kind, ours, theirs, corrupted, cache_ours, cache_theirs, _ = runs
    name = "get_act_patch_attn_head_pattern_dest_src_pos"
    expected = getattr(tl_patching, name)(theirs, corrupted, cache_theirs, batch_std)
    got = getattr(patching, name)(ours, corrupted, cache_ours, batch_std)
    assert got.shape == expected.shape
    # passed under 2e-5 on both models (maximum not recorded); see the bound above
    assert max_diff(got, expected) < 2e-5
