"""Every entry point that takes a device checks it before anything is built, read or moved: a backend
this torch build or machine lacks ("mps", "xla", "xpu", "hpu", "vulkan"), a name torch does not know
("gpu"), a CUDA index past the last one ("cuda:7", 7), and "meta" where weights must be held, are a
ValueError naming the argument and the device, not a raw torch error after every weight is read.
The CUDA cases pick an index this machine lacks, so they hold on a CUDA build too; "cuda" itself is
refused only where there is no CUDA device."""

import pytest
import torch

import glassbox.weights.pretrained as pretrained
from glassbox import HookedTransformer
from glassbox.models import Config

CFG = Config(d_model=12, n_layers=2, n_heads=3, d_vocab=29, n_ctx=17, d_mlp=20)
MISSING_INDEX = torch.cuda.device_count()  # one past the last CUDA device (cuda:0 on a CPU build)
BAD = ["gpu", "npu", f"cuda:{MISSING_INDEX}", MISSING_INDEX + 7, "xla", "vulkan", "xpu", "hpu", "cuda:-1", "",
       "mps"]
BAD = [d for d in BAD if not (d == "mps" and torch.backends.mps.is_available())]
BAD = [d for d in BAD if not (d == "xpu" and hasattr(torch, "xpu") and torch.xpu.is_available())]
if not torch.cuda.is_available():
    BAD.append("cuda")


@pytest.fixture
def no_weights_read(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("weights were read before the device was checked")
    monkeypatch.setattr(pretrained, "read_state_dict", refuse)
    monkeypatch.setattr(pretrained, "weight_shapes", refuse)


def named(device) -> str:
    return repr(device) if not isinstance(device, str) or device else "''"


@pytest.mark.parametrize("device", BAD, ids=str)
def test_from_pretrained_checks_the_device_before_reading_weights(device, no_weights_read):
    with pytest.raises(ValueError, match="from_pretrained\\(device=\\.\\.\\.\\)"):
        pretrained.from_pretrained("glassbox-austen", device=device)


@pytest.mark.parametrize("device", BAD + ["meta"], ids=str)
def test_a_device_map_entry_names_its_part(device, no_weights_read):
    parts = {"embed": "cpu", "blocks.0": "cpu", "blocks.1": device, "ln_final": "cpu", "unembed": "cpu"}
    with pytest.raises(ValueError, match=r"device_map\['blocks\.1'\]"):
        pretrained.from_pretrained("glassbox-austen", device_map=parts)
    with pytest.raises(ValueError, match=r"device_map\[1\]"):
        pretrained.from_pretrained("glassbox-austen", device_map=["cpu", device])
    model = HookedTransformer(CFG)
    before = {k: v.device for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"device_map\['blocks\.1'\]"):
        model.place(parts)
    assert {k: v.device for k, v in model.state_dict().items()} == before and model.device_plan is None


@pytest.mark.parametrize("device", BAD, ids=str)
def test_construction_and_to_check_the_device(device):
    if isinstance(device, str):  # the constructor's annotation takes names and torch.devices
        with pytest.raises(ValueError, match=r"HookedTransformer\(device=\.\.\.\)"):
            HookedTransformer(CFG, device=device)
    model = HookedTransformer(CFG)
    with pytest.raises(ValueError, match=r"HookedTransformer\.to"):
        model.to(device)
    with pytest.raises(ValueError, match=r"HookedTransformer\.to"):
        model.to(device=device)
    assert all(p.device.type == "cpu" for p in model.parameters())


@pytest.mark.parametrize("device", BAD, ids=str)
def test_from_hf_checks_the_device(device):
    import transformers

    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=12, n_head=3, vocab_size=29,
                                                              n_positions=17))
    with pytest.raises(ValueError, match=r"from_hf\(device=\.\.\.\)"):
        HookedTransformer.from_hf(hf, device=device)


def test_meta_is_refused_where_weights_must_be_held_and_allowed_for_shapes(no_weights_read):
    with pytest.raises(ValueError, match="'meta' holds no weights"):
        pretrained.from_pretrained("glassbox-austen", device="meta")
    assert next(HookedTransformer(CFG, device="meta").parameters()).is_meta  # shape bookkeeping still works


@pytest.mark.parametrize("device", [d for d in BAD if isinstance(d, str) and d.startswith("cuda") or d == "gpu"],
                         ids=str)
def test_n_devices_checks_its_starting_device(device, no_weights_read):
    with pytest.raises(ValueError, match=r"device"):
        pretrained.from_pretrained("glassbox-austen", device=device, n_devices=2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_still_loads_where_there_is_one():
    model = pretrained.from_pretrained("glassbox-austen", device="cuda")
    assert next(model.parameters()).is_cuda
    assert next(HookedTransformer(CFG).to("cuda:0").parameters()).is_cuda
