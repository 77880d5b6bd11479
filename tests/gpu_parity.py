"""Parity with ``transformers`` on an accelerator, in float32, bfloat16 and float16.

    GLASSBOX_TEST_DEVICE=cuda python -m pytest -q tests/gpu_parity.py      (what benchmarks/gpu_check.sh runs)
    GLASSBOX_TEST_DEVICE=cpu  python -m pytest -q tests/gpu_parity.py      (the same checks on the CPU)

Not collected by the default suite (the name does not start with ``test_``): the CPU suite never
depends on an accelerator. Every test is skipped, saying why, when the device named by
``GLASSBOX_TEST_DEVICE`` (default ``cuda``) is not available.

The oracle is ``transformers`` on the same seeded random weights, built on the CPU by the family
parity tests' own builders (tests/test_*_parity.py) and then moved:

- float32: glassbox on the device against ``transformers`` on the same device, elementwise (bound
  below), and the device's logits against the CPU's.
- bfloat16 / float16: a half-precision model is only as exact as its dtype, so the check is the one
  tests/test_qwen_parity.py uses: against ``transformers``' float64 CPU logits of the same rounded
  weights, glassbox's mean |logit error| must be at most ``HALF_RATIO`` times ``transformers``' own
  in that dtype on the device, and that error must be nonzero (else nothing was measured).
- the paths a researcher runs on the device (run_with_cache, a patching sweep, AtP) produce tensors
  on the device equal to the CPU's results in float32.

Each measured gap is printed (``-s``) so a first CUDA run records what the bounds are set against.
"""

import copy
import os

import pytest
import torch

import conftest
from glassbox.models import HookedTransformer

DEVICE = os.environ.get("GLASSBOX_TEST_DEVICE", "cuda")

# float32 logits on a device vs the same model on the same device, values up to ~10 for these tiny
# models. CPU: measured <= 4.8e-6 over the families below; the bound leaves 20x for CUDA kernels that
# sum in another order (TF32 stays off: torch's default for matmul).
F32_ATOL = 1e-4
# glassbox's half-precision error <= this x transformers' own (CPU: measured ratios 0.69..1.04).
HALF_RATIO = 1.5
HALF = [torch.bfloat16, torch.float16]
# Known: Qwen3's default tiny config (q/k norms, no sliding window) in float16 measured glassbox 1.28e-2
# vs transformers 6.03e-3 on the CPU (ratio 2.1; bfloat16 1.08, the sliding config of
# test_qwen_parity.py 0.80..0.97). Left visible as an expected failure until its cause is fixed.
KNOWN_HALF_GAPS = {("qwen3", torch.float16)}


def device_available(name: str) -> bool:
    dev = torch.device(name)
    if dev.type == "cuda":
        return torch.cuda.is_available()
    if dev.type == "mps":
        return torch.backends.mps.is_available()
    return dev.type == "cpu"


pytestmark = pytest.mark.skipif(not device_available(DEVICE),
                                reason=f"GLASSBOX_TEST_DEVICE={DEVICE!r} is not available on this machine")


def families():
    """name -> zero-argument builder of a float32 CPU transformers model (eager attention)."""
    from test_gemma_parity import make_hf_gemma, make_hf_gemma2, make_hf_gemma3_text
    from test_gptj_parity import make_hf_gptj
    from test_llama_parity import make_hf_llama
    from test_mistral_parity import make_hf_mistral
    from test_neox_parity import make_hf_gpt_neox
    from test_olmo2_parity import make_hf_olmo2
    from test_qwen_parity import make_hf_qwen2, make_hf_qwen3

    return {"gpt2": lambda: conftest.make_hf_gpt2(**conftest.TINY), "llama": make_hf_llama,
            "mistral": make_hf_mistral, "gptj": make_hf_gptj, "neox": make_hf_gpt_neox, "olmo2": make_hf_olmo2,
            "qwen2": make_hf_qwen2, "qwen3": make_hf_qwen3, "gemma": make_hf_gemma, "gemma2": make_hf_gemma2,
            "gemma3": make_hf_gemma3_text}


FAMILIES = ["gpt2", "llama", "mistral", "gptj", "neox", "olmo2", "qwen2", "qwen3", "gemma", "gemma2", "gemma3"]


def tokens_for(hf, batch=2, pos=11, seed=3):
    vocab = hf.config.vocab_size
    return torch.randint(0, vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_logits_match_transformers_on_device(family):
    hf_cpu = families()[family]()
    tokens = tokens_for(hf_cpu)
    with torch.no_grad():
        on_cpu = hf_cpu(tokens).logits
        hf = copy.deepcopy(hf_cpu).to(DEVICE)
        model = HookedTransformer.from_hf(hf)
        assert next(model.parameters()).device.type == torch.device(DEVICE).type
        ours, theirs = model(tokens.to(DEVICE)), hf(tokens.to(DEVICE)).logits
    assert ours.device == theirs.device and ours.dtype == torch.float32
    gap = (ours - theirs).abs().max().item()
    print(f"{family} float32 on {DEVICE}: max |glassbox - transformers| {gap:.3g}, "
          f"max |logit| {theirs.abs().max().item():.3g}")
    torch.testing.assert_close(ours, theirs, atol=F32_ATOL, rtol=0)  # F32_ATOL: see its comment
    torch.testing.assert_close(ours.cpu(), on_cpu, atol=F32_ATOL, rtol=0)


@pytest.mark.parametrize("dtype", HALF, ids=["bfloat16", "float16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_half_precision_error_within_transformers_own(family, dtype, request):
    if (family, dtype) in KNOWN_HALF_GAPS:
        request.applymarker(pytest.mark.xfail(reason="see KNOWN_HALF_GAPS", strict=False))
    hf_cpu = families()[family]()
    tokens = tokens_for(hf_cpu)
    with torch.no_grad():
        half = copy.deepcopy(hf_cpu).to(device=DEVICE, dtype=dtype)
        reference = copy.deepcopy(hf_cpu).to(dtype).double()(tokens).logits
        model = HookedTransformer.from_hf(half)
        assert next(model.parameters()).dtype == dtype
        ours_logits = model(tokens.to(DEVICE))
        assert ours_logits.dtype == dtype and ours_logits.device.type == torch.device(DEVICE).type
        theirs = (half(tokens.to(DEVICE)).logits.double().cpu() - reference).abs().mean().item()
        ours = (ours_logits.double().cpu() - reference).abs().mean().item()
    print(f"{family} {dtype} on {DEVICE}: mean |error| glassbox {ours:.3g}, transformers {theirs:.3g}, "
          f"ratio {ours / theirs if theirs else float('nan'):.3f}")
    assert theirs > 0, f"{family} {dtype}: transformers' half-precision logits equal float32's: nothing measured"
    assert ours <= HALF_RATIO * theirs, f"{family} {dtype}: glassbox mean error {ours:.3g} vs transformers' {theirs:.3g}"


@pytest.fixture(scope="module")
def gpt2_pair():
    """(transformers GPT-2 on the device, glassbox twin on the device, the CPU glassbox twin), float32."""
    hf_cpu = conftest.make_hf_gpt2(**conftest.TINY)
    hf = copy.deepcopy(hf_cpu).to(DEVICE)
    return hf, HookedTransformer.from_hf(hf), HookedTransformer.from_hf(hf_cpu)


def test_cache_on_device_matches_hidden_states(gpt2_pair):
    hf, model, _ = gpt2_pair
    tokens = tokens_for(hf).to(DEVICE)
    with torch.no_grad():
        out = hf(tokens, output_hidden_states=True, output_attentions=True)
        _, cache = model.run_with_cache(tokens)
    assert {value.device.type for value in cache.values()} == {torch.device(DEVICE).type}
    for L in range(hf.config.n_layer):
        # CPU: measured 3.0e-8 (values up to 1), bound 1e-5 (test_parity.py's): 336x
        torch.testing.assert_close(cache[f"blocks.{L}.hook_resid_pre"], out.hidden_states[L], atol=1e-5, rtol=0)
        # CPU: measured 6.0e-8 (values up to 1), bound 1e-5: 166x
        torch.testing.assert_close(cache[f"blocks.{L}.attn.hook_pattern"], out.attentions[L], atol=1e-5, rtol=0)


def test_patching_sweep_and_atp_on_device_equal_cpu(gpt2_pair):
    from glassbox.interp.attribution import attribution_patch
    from glassbox.interp.patching import LogitDiff, activation_patch

    hf, model, model_cpu = gpt2_pair
    clean, corrupted = tokens_for(hf, 1, 9, 4), tokens_for(hf, 1, 9, 5)
    metric = LogitDiff(3, 7)
    results = {}
    for name, m, dev in (("device", model, DEVICE), ("cpu", model_cpu, "cpu")):
        c, k = clean.to(dev), corrupted.to(dev)
        with torch.no_grad():
            _, cache = m.run_with_cache(c, return_type=None)
        sweep = activation_patch(m, k, cache, metric, "resid_pre", ("layer", "pos")).values
        atp = attribution_patch(m, c, k, metric, "z", ("layer", "pos", "head")).values
        assert sweep.device.type == atp.device.type == torch.device(dev).type
        results[name] = (sweep.detach().cpu(), atp.detach().cpu())
    print(f"sweep on {DEVICE} vs cpu {(results['device'][0] - results['cpu'][0]).abs().max().item():.3g}, "
          f"AtP {(results['device'][1] - results['cpu'][1]).abs().max().item():.3g}")
    # CPU vs CPU is bit-equal; logit differences up to ~3: the float32 logit bound applies
    torch.testing.assert_close(results["device"][0], results["cpu"][0], atol=F32_ATOL, rtol=0)
    torch.testing.assert_close(results["device"][1], results["cpu"][1], atol=F32_ATOL, rtol=0)
