"""Models across devices (glassbox.models.devices): plans, placement, and a placed model against the
model on one device.

On the CPU every stage is "cpu": a device_map list naming "cpu" once per stage gives real stages
(boundaries whose moves copy nothing), so a placed model must equal the unplaced one bit for bit
(logits, loss, cache, a patching sweep, generate), and counting ``devices.move`` calls checks that
the residual stream moves at boundaries only. With CUDA the same checks run on cuda:0/cuda:1 (two
GPUs) and on cpu + cuda:0 (one), against an oracle composed of per-device copies of the model run
stage by stage (``forward(start_at_layer=, stop_at_layer=)``): the same kernels on the same devices,
so bit for bit too.
"""

import copy

import pytest
import torch

from glassbox import HookedTransformer
from glassbox.interp.patching import LogitDiff, activation_patch, patch_head_k_by_pos, patch_resid_pre
from glassbox.models import KVCache, devices
from glassbox.models.devices import DevicePlan, check_tied, plan_for, split_layers
from patching_oracle import tiny_model

N_LAYERS, SEQ, VOCAB = 5, 11, 31
STAGES = ["cpu", "cpu", "cpu"]  # blocks 0-1, 2-3, 4; embed and unembed with stage 0, ln_final with stage 2
BLOCK_STAGES = [0, 0, 1, 1, 2]
METRIC = LogitDiff(torch.tensor([3, 17]), torch.tensor([29, 8]))
PRESETS = ["gpt2", "modern", "classic"]  # tied + learned positions; rotary, untied, gated; post-norm, sinusoidal


def model_of(preset: str, **changes):
    return tiny_model(preset, n_layers=N_LAYERS, **changes)


def placed(model, device_map=STAGES):
    return copy.deepcopy(model).place(device_map)


def tokens(seed: int = 1, batch: int = 2):
    return torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(seed))


def left_padded():
    mask = torch.ones(2, SEQ, dtype=torch.bool)
    mask[1, :4] = False
    return tokens(3), mask


@pytest.fixture
def moves(monkeypatch):
    """Every call of devices.move, as the device it moved to."""
    calls = []
    real = devices.move
    monkeypatch.setattr(devices, "move", lambda x, device: (calls.append(device), real(x, device))[1])
    return calls


# -- plans -----------------------------------------------------------------------------------------
def test_split_layers_is_contiguous_and_even():
    assert split_layers(5, 2) == [0, 0, 0, 1, 1]
    assert split_layers(4, 3) == [0, 0, 1, 2]  # TransformerLens's ceil(4 / 3) = 2 per device leaves the third empty
    assert split_layers(6, 3) == [0, 0, 1, 1, 2, 2]
    assert split_layers(3, 1) == [0, 0, 0]


def test_list_plan_parts_and_boundaries():
    plan = plan_for(model_of("modern").cfg, STAGES)
    assert plan.devices == (torch.device("cpu"),) * 3
    assert [plan.stage_of[f"blocks.{i}"] for i in range(N_LAYERS)] == BLOCK_STAGES
    assert (plan.stage_of["embed"], plan.stage_of["ln_final"], plan.stage_of["unembed"]) == (0, 2, 0)
    assert plan.n_boundaries == 3  # blocks 1|2, blocks 3|4, ln_final|unembed
    assert plan_for(model_of("modern").cfg, ["cpu"]).n_boundaries == 0


def test_dict_plan_merges_one_device_and_round_trips():
    cfg = model_of("gpt2").cfg
    device_map = {part: "cpu" for part in devices.parts(N_LAYERS)}
    plan = plan_for(cfg, device_map)
    assert plan.devices == (torch.device("cpu"),) and plan.n_boundaries == 0
    assert plan.as_dict() == device_map
    assert plan_for(cfg, plan_for(cfg, STAGES).as_dict()).n_boundaries == 0  # same-device stages merge


def test_auto_without_cuda_is_the_cpu():
    if torch.cuda.device_count():
        pytest.skip("this machine has CUDA: 'auto' spreads over its GPUs (checked by the CUDA tests)")
    for name in ("auto", "balanced"):
        assert plan_for(model_of("gpt2").cfg, name).devices == (torch.device("cpu"),)


@pytest.mark.parametrize("device_map, match", [
    ("sequential", "'sequential' is not supported: it fills"),
    ("balanced_low_0", "'balanced_low_0' is not supported"),
    ("cuda", "device_map='cuda' is not supported.*pass device= instead"),
    ([], "empty list"),
    (["cpu"] * 6, "lists 6 devices for 5 blocks"),
    (["cpu", "meta"], r"device_map\[1\]: 'meta' holds no weights"),
    (["cpu", "nonsense"], r"device_map\[1\]: 'nonsense' is not a device"),
    ({"embed": "cpu"}, r"does not place \['blocks.0'"),
    ({**{p: "cpu" for p in devices.parts(N_LAYERS)}, "blocks.5": "cpu"}, r"unknown part\(s\) \['blocks.5'\]"),
    ({**{p: "cpu" for p in devices.parts(N_LAYERS)}, "model.layers.0": "cpu"}, "unknown part"),
])
def test_refused_maps_name_the_problem(device_map, match):
    with pytest.raises(ValueError, match=match):
        plan_for(model_of("gpt2").cfg, device_map)


def test_refused_types_and_absent_gpus():
    with pytest.raises(TypeError, match="device_map must be"):
        plan_for(model_of("gpt2").cfg, 3)
    count = torch.cuda.device_count()
    with pytest.raises(ValueError, match=rf"cuda:{count} is not there: this machine has {count} CUDA device"):
        plan_for(model_of("gpt2").cfg, ["cpu", f"cuda:{count}"])
    with pytest.raises(ValueError, match=rf"n_devices={count + 2} from cuda:0 needs {count + 2} CUDA devices"):
        devices.n_devices_map(count + 2)
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="n_devices must be an int >= 1"):
            devices.n_devices_map(bad)
    with pytest.raises(ValueError, match="spreads the blocks over CUDA devices, but device='cpu'"):
        devices.n_devices_map(2, "cpu")
    assert devices.n_devices_map(1) is None


def test_tied_unembed_elsewhere_is_refused():
    # Two distinct devices without CUDA: the plan is built by hand (as_device refuses meta for real maps).
    cfg = model_of("gpt2").cfg
    assert cfg.tied_unembed
    stage_of = {**{p: 0 for p in devices.parts(N_LAYERS)}, "unembed": 1}
    plan = DevicePlan((torch.device("cpu"), torch.device("meta")), stage_of)
    with pytest.raises(ValueError, match="W_U is W_E \\(tied_unembed\\)"):
        check_tied(cfg, plan)
    assert check_tied(model_of("modern").cfg, plan) is plan  # untied: allowed


def test_from_pretrained_arguments_conflict_before_loading():
    with pytest.raises(ValueError, match="device_map= or n_devices=, not both"):
        HookedTransformer.from_pretrained("no-such/model", device_map=STAGES, n_devices=2)
    with pytest.raises(ValueError, match="device='cpu' and device_map= both"):
        HookedTransformer.from_pretrained("no-such/model", device="cpu", device_map=STAGES)
    with pytest.raises(ValueError, match="'sequential' is not supported"):  # before the name is resolved
        HookedTransformer.from_pretrained("no-such/model", device_map="sequential")


# -- placing ---------------------------------------------------------------------------------------
def test_place_keeps_parameters_and_the_tie():
    model = model_of("gpt2")
    ids = [id(p) for p in model.parameters()]
    model.place(STAGES)
    assert [id(p) for p in model.parameters()] == ids
    assert model.unembed.W_U.data_ptr() == model.embed.W_E.data_ptr()
    assert model.device_plan.n_boundaries == 3


def test_dtype_cast_keeps_the_plan_and_a_moved_block_rebuilds_it():
    model = model_of("modern").place(STAGES)
    plan = model.device_plan
    model.to(torch.float64)
    assert model.device_plan is plan and model.W_E.dtype == torch.float64
    model.blocks[3].to("meta")  # moved behind the plan's back; the next model-level .to sees it
    model.float()
    assert model.device_plan.block_device(3) == torch.device("meta")
    # Rebuilt from where the tensors are: the three cpu stages merge, the meta block is its own stage.
    assert model.device_plan.block_device(2) == torch.device("cpu") and model.device_plan.n_boundaries == 2
    assert copy.deepcopy(model_of("gpt2")).device_plan is None


def test_failed_place_changes_nothing(monkeypatch):
    model = model_of("gpt2")
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def fail(*args, **kwargs):
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(model.ln_final, "to", fail)
    with pytest.raises(RuntimeError, match="simulated"):
        model.place(STAGES)
    assert model.device_plan is None
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# -- a placed model equals the model on one device, bit for bit -------------------------------------
@pytest.mark.parametrize("preset", PRESETS)
def test_forward_loss_and_partial_runs_equal(preset):
    model = model_of(preset)
    other = placed(model)
    t, mask = left_padded()
    for kwargs in ({}, {"attention_mask": mask}):
        assert torch.equal(model(t, **kwargs), other(t, **kwargs))
        assert torch.equal(model(t, return_type="loss", **kwargs), other(t, return_type="loss", **kwargs))
        assert torch.equal(model(t, return_type="loss", loss_per_token=True, **kwargs),
                           other(t, return_type="loss", loss_per_token=True, **kwargs))
    resid = model(t, stop_at_layer=3)
    assert torch.equal(resid, other(t, stop_at_layer=3))
    assert torch.equal(model(resid, start_at_layer=3), other(resid, start_at_layer=3))
    assert torch.equal(model.W_Q, other.W_Q)


@pytest.mark.parametrize("preset", PRESETS)
def test_cache_equals_in_place_and_gathered(preset):
    model = model_of(preset)
    other = placed(model)
    t, mask = left_padded()
    logits, cache = model.run_with_cache(t, attention_mask=mask)
    for device in (None, "cpu"):
        placed_logits, placed_cache = other.run_with_cache(t, attention_mask=mask, device=device)
        assert torch.equal(logits, placed_logits)
        assert sorted(cache.keys()) == sorted(placed_cache.keys())
        unequal = [name for name in cache.keys() if not torch.equal(cache[name], placed_cache[name])]
        assert not unequal, f"cached values differ at {unequal}"


def test_gradients_through_the_boundaries_equal():
    model = model_of("modern")
    other = placed(model)
    names = lambda name: name.endswith(("hook_resid_pre", "hook_attn_out"))
    _, cache = model.run_with_cache(tokens(), names_filter=names, incl_bwd=True)
    _, placed_cache = other.run_with_cache(tokens(), names_filter=names, incl_bwd=True)
    assert sorted(cache.keys()) == sorted(placed_cache.keys()) and len(cache.keys()) == 4 * N_LAYERS
    assert all(torch.equal(cache[name], placed_cache[name]) for name in cache.keys())


@pytest.mark.parametrize("preset", PRESETS)
def test_patching_sweeps_equal(preset):
    model = model_of(preset)
    other = placed(model)
    clean, corrupted = tokens(1), tokens(2)
    _, cache = model.run_with_cache(clean)
    # resid_pre at every layer x position, and (rotary) keys by head and position in 3 bands: the banded
    # passes start mid-sequence from the corrupted run's keys and values, kept on each block's device.
    sweeps = [(patch_resid_pre, {})] + ([(patch_head_k_by_pos, {"bands": 3})] if preset == "modern" else [])
    for sweep, kwargs in sweeps:
        expected = sweep(model, corrupted, cache, METRIC, **kwargs).values
        got = sweep(other, corrupted, cache, METRIC, **kwargs).values
        assert expected.max() - expected.min() > 0.01, "the sweep is nearly constant: it would prove nothing"
        assert torch.equal(expected, got), f"{sweep.__name__}: the placed model's sweep differs"


@pytest.mark.parametrize("preset", PRESETS)
def test_generate_equals(preset):
    model = model_of(preset)
    other = placed(model)
    t, mask = left_padded()
    t, mask = t[:, :6], mask[:, :6]
    modes = [{}, {"do_sample": True, "seed": 5, "top_k": 7}]
    modes += [{"use_past_kv_cache": False}] if preset == "modern" else []
    for kwargs in modes:
        expected, expected_logits = model.generate(t, 4, attention_mask=mask, eos_token_id=None,
                                                   output_logits=True, **kwargs)
        got, got_logits = other.generate(t, 4, attention_mask=mask, eos_token_id=None, output_logits=True, **kwargs)
        assert torch.equal(expected, got) and torch.equal(expected_logits, got_logits), kwargs


def test_from_pretrained_and_from_hf_place_the_model():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_embd=21, n_layer=3, n_head=3, vocab_size=VOCAB, n_positions=13)).eval()
    one = HookedTransformer.from_hf(hf)
    other = HookedTransformer.from_hf(hf, device_map=["cpu", "cpu"])
    assert one.device_plan is None and other.device_plan.n_boundaries == 2
    assert torch.equal(one(tokens()), other(tokens()))
    shipped = HookedTransformer.from_pretrained("glassbox-austen")
    staged = HookedTransformer.from_pretrained("glassbox-austen", device_map=["cpu", "cpu"], fold_ln=True)
    folded = HookedTransformer.from_pretrained("glassbox-austen", fold_ln=True)
    assert staged.device_plan.n_boundaries == 2 and staged.processing == folded.processing
    text = "Elizabeth read the letter"
    assert torch.equal(folded(text), staged(text))
    assert not torch.equal(shipped(text), staged(text))  # the folding ran: the logits move by rounding
    assert HookedTransformer.from_pretrained("glassbox-austen", n_devices=1).device_plan is None


# -- the residual stream moves at boundaries only ---------------------------------------------------
def test_forward_moves_once_per_boundary(moves):
    model = model_of("modern").place(STAGES)
    seen = []  # moves made before each block starts
    hooks = [(f"blocks.{i}.hook_resid_pre", lambda act, hook: seen.append(len(moves))) for i in range(N_LAYERS)]
    model.run_with_hooks(tokens(), fwd_hooks=hooks)
    assert seen == BLOCK_STAGES  # one move entering block 2, one entering block 4
    assert len(moves) == 3  # and one from ln_final (stage 2) to the unembed (stage 0)
    moves.clear()
    model(tokens(), return_type=None)
    assert len(moves) == 2
    moves.clear()
    model(model(tokens(), stop_at_layer=2), start_at_layer=2)  # entering at stage 1: blocks 3|4, ln_final|unembed
    assert len(moves) == 2


def test_one_device_moves_nothing(moves):
    model = model_of("gpt2").place({part: "cpu" for part in devices.parts(N_LAYERS)})
    model(tokens())
    model.generate(tokens()[:, :5], 3, eos_token_id=None)
    assert moves == []


def test_generate_and_cache_move_once_per_boundary_per_forward(moves):
    model = model_of("gpt2").place(STAGES)
    model.generate(tokens()[:, :5], 4, eos_token_id=None)  # the prompt pass, then 3 one-token passes
    assert len(moves) == 4 * 3
    moves.clear()
    model.run_with_cache(tokens())
    assert len(moves) == 3


def test_sweep_moves_at_boundaries_only(moves):
    model = model_of("gpt2")
    _, cache = model.run_with_cache(tokens(1))
    model.place(STAGES)
    moves.clear()
    # One band, one pass (the budget holds every variant): the corrupted base run (blocks only: 2
    # moves), one pass down the layers (2), one readout of every variant's read position (1).
    activation_patch(model, tokens(2), cache, METRIC, "resid_pre", ("layer", "pos"), bands=1, reuse_prefix=False)
    assert len(moves) == 2 + 2 + 1


# -- CUDA ----------------------------------------------------------------------------------------
def staged_oracle(model, plan, t):
    """The logits of ``model`` under ``plan`` composed by hand: a copy of the model per device, each
    running its stage's blocks (start/stop_at_layer), the stream moved between them."""
    copies = {device: copy.deepcopy(model).to(device) for device in plan.devices}
    resid = copies[plan.home](t.to(plan.home), stop_at_layer=0)
    layer = 0
    while layer < plan.n_layers:
        device = plan.block_device(layer)
        end = layer
        while end < plan.n_layers and plan.block_device(end) == device:
            end += 1
        resid = copies[device](resid.to(device), start_at_layer=layer, stop_at_layer=end)
        layer = end
    normed = copies[plan.device("ln_final")].ln_final(resid.to(plan.device("ln_final")))
    return copies[plan.device("unembed")].unembed(normed.to(plan.device("unembed")))


def cuda_maps():
    count = torch.cuda.device_count()
    maps = []
    if count >= 1:
        maps.append(["cpu", "cuda:0"])
    if count >= 2:
        maps.append(["cuda:0", "cuda:1", "cuda:0"])
    return maps


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the cross-device checks need one "
                    "(cpu + cuda:0) or two (cuda:0 + cuda:1)")
@pytest.mark.parametrize("preset", PRESETS)
def test_cuda_placements_equal_the_staged_oracle(preset):
    for device_map in cuda_maps():
        model = model_of(preset, dtype=torch.float32)
        other = placed(model, device_map)
        plan = other.device_plan
        t = tokens()
        with torch.no_grad():
            expected = staged_oracle(model, plan, t)
            assert torch.equal(other(t), expected), device_map
            _, cache = other.run_with_cache(t)
            wrong = [name for name in cache.keys() if cache[name].device != devices.hook_device(other, name)]
            assert not wrong, f"{device_map}: left in place, yet on another device: {wrong}"
            _, gathered = other.run_with_cache(t, device="cpu")
            assert {gathered[name].device.type for name in gathered.keys()} == {"cpu"}
            assert all(torch.equal(cache[name].cpu(), gathered[name]) for name in cache.keys())
            # Keys and values stay on their block's device while generating.
            kv = KVCache(N_LAYERS)
            other(t.to(plan.home), past_kv_cache=kv)
            assert [kv[i].k.device for i in range(N_LAYERS)] == [plan.block_device(i) for i in range(N_LAYERS)]
            new = other.generate(t[:, :5], 4, eos_token_id=None)
            assert new.device == plan.home and new.shape == (2, 9)
            _, clean = other.run_with_cache(tokens(1), device=plan.home)
            sweep = patch_resid_pre(other, tokens(2), clean, METRIC).values
            assert sweep.device == plan.home and sweep.isfinite().all()
