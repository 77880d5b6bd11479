"""SAE training (glassbox.train.sae): the activation stream, the losses, dead features, checkpoints
and bit-for-bit resume, the saved SAE. (The losses and gradients against SAELens's training SAEs are
in tests_tl/test_sae_evals_saelens.py.)"""

import json

import pytest
import torch
from safetensors.torch import load_file

from glassbox.interp.sae.architectures import TopKSAE
from glassbox.interp.sae.base import StandardSAE
from glassbox.interp.sae.config import SAEConfig
from glassbox.interp.sae.format import load_sae
from glassbox.models import Config, HookedTransformer
from glassbox.train.data import sample_windows
from glassbox.train.sae import (ActivationStream, DeadFeatures, SAETrainConfig, aux_k_acts, fold_decoder_norms,
                                resample_dead, topk_relu, train_sae, training_step_losses)

HOOK = "blocks.0.hook_resid_post"
BOS = 49


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HookedTransformer(Config(n_layers=2, d_model=24, n_heads=3, d_head=8, d_mlp=40, d_vocab=50,
                                    n_ctx=16)).eval()


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, BOS, (2000,), generator=torch.Generator().manual_seed(1))


def small(**changes):
    options = dict(steps=8, batch_tokens=32, lr=1e-2, bos_id=BOS, progress=False, buffer_batches=3, model_batch=4,
                   context_size=12, seed=4)
    options.update(changes)
    return options


def stream(model, tokens, seed=5, **changes):
    options = dict(hook_name=HOOK, d_in=24, context_size=12, batch_tokens=16, buffer_batches=3, model_batch=2,
                   bos_id=BOS, ignore_ids=[BOS], generator=torch.Generator().manual_seed(seed))
    options.update(changes)
    return ActivationStream(model, tokens, **options)


# -- the stream ------------------------------------------------------------------------------------
def test_stream_serves_the_models_activations_at_the_non_bos_tokens(model, tokens):
    s = stream(model, tokens)
    s.fill()
    generator = torch.Generator().manual_seed(5)
    rows = []
    while sum(len(r) for r in rows) < 48:  # the same windows, drawn as the stream draws them
        windows = sample_windows(tokens, 2, 11, BOS, generator)
        _, cache = model.run_with_cache(windows)  # the whole model, not stopped after block 0
        rows.append(cache[HOOK][:, 1:].reshape(-1, 24))
    oracle = torch.cat(rows)
    assert s.buffer.shape == (48, 24)
    gaps = (s.buffer[:, None, :] - oracle[None]).abs().amax(-1)  # [buffer row, oracle row]
    nearest = gaps.min(-1)
    # every row is one of the windows' non-BOS rows: measured 1.1e-8 from it (values up to 0.11; the
    # stream stops after block 0, the oracle runs the whole model), bound 2e-7: 18x; the next nearest
    # row is 1.8e-3 away
    assert nearest.values.max() < 2e-7
    assert len(set(nearest.indices.tolist())) == 48  # each at most once
    assert nearest.indices.tolist() != list(range(48))  # shuffled: not simply the first 48
    batches = [s.next_batch() for _ in range(3)]
    assert torch.equal(torch.cat(batches), s.buffer)


def test_stream_keeps_the_bos_rows_when_told(model, tokens):
    s = stream(model, tokens, ignore_ids=[])
    s.fill()
    _, cache = model.run_with_cache(torch.tensor([[BOS]]))
    bos_row = cache[HOOK][0, 0]
    # measured 3.7e-9 from the BOS row of a one-token forward (values up to 0.1), bound 1e-7: 27x; the
    # other rows are more than 0.06 away
    assert (s.buffer - bos_row).abs().amax(-1).min() < 1e-7
    t = stream(model, tokens)
    t.fill()
    assert (t.buffer - bos_row).abs().amax(-1).min() > 1e-3


def test_stream_state_rebuilds_the_same_batches(model, tokens):
    a = stream(model, tokens)
    for _ in range(4):  # into the second fill
        a.next_batch()
    state = a.state()
    expected = [a.next_batch() for _ in range(4)]
    b = stream(model, tokens, seed=99)
    b.load_state(state)
    assert all(torch.equal(x, y) for x, y in zip(expected, [b.next_batch() for _ in range(4)]))


def test_stream_refuses_a_bad_hook_and_short_streams(model, tokens):
    with pytest.raises(KeyError, match="blocks.0.hook_resid_pst"):
        stream(model, tokens, hook_name="blocks.0.hook_resid_pst")
    with pytest.raises(ValueError, match="fewer than one window"):
        stream(model, tokens[:5])
    with pytest.raises(ValueError, match="context_size=17"):
        stream(model, tokens, context_size=17)
    with pytest.raises(ValueError, match="every token of the stream is a special token"):
        stream(model, torch.full((40,), BOS))


# -- the losses ------------------------------------------------------------------------------------
def test_topk_relu_and_aux_k_acts_keep_the_largest(model):
    x = torch.randn(7, 13, generator=torch.Generator().manual_seed(2))
    out = topk_relu(x, 3)
    for row, got in zip(x, out):
        top = row.argsort(descending=True)[:3]
        expected = torch.zeros(13)
        expected[top] = row[top].relu()
        assert torch.equal(got, expected)
    dead = torch.zeros(13, dtype=torch.bool)
    dead[[1, 4, 5, 9, 12]] = True
    aux = aux_k_acts(x, dead, 2)
    for row, got in zip(x, aux):
        idx = torch.tensor([1, 4, 5, 9, 12])
        top = idx[row[idx].argsort(descending=True)[:2]]
        expected = torch.zeros(13)
        expected[top] = row[top]  # no ReLU: SAELens keeps negative dead pre-activations
        assert torch.equal(got, expected)


def drifted(architecture, rescale=False):
    cfg = SAEConfig(architecture, 24, 31, HOOK, k=4 if architecture == "topk" else None,
                    rescale_acts_by_decoder_norm=rescale)
    sae = (TopKSAE if architecture == "topk" else StandardSAE)(cfg)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        sae.W_dec.mul_(torch.rand(31, 1, generator=generator) * 3 + 0.3)
        sae.b_enc.copy_(0.1 * torch.randn(31, generator=generator))
        sae.b_dec.copy_(0.1 * torch.randn(24, generator=generator))
    return sae


def test_topk_training_forward_is_the_rescaled_topk_sae_and_folds_to_a_plain_one():
    x = torch.randn(19, 24, generator=torch.Generator().manual_seed(4))
    ours = drifted("topk")
    rescaled = drifted("topk", rescale=True)  # the inference class with SAELens's rescale flag
    rescaled.load_state_dict(ours.state_dict())
    out = training_step_losses(ours, x, torch.zeros(31, dtype=torch.bool), 0.0, 1.0)
    with torch.no_grad():
        assert torch.equal(out["feature_acts"], rescaled.encode(x))
        # measured 2.4e-7 (values up to 4.6), bound 3e-6: 12x
        torch.testing.assert_close(out["sae_out"], rescaled.decode(rescaled.encode(x)), atol=3e-6, rtol=0)
        fold_decoder_norms(ours)
        # measured 1.2e-7, bound 2e-6: 17x
        torch.testing.assert_close(ours.decoder_norms(), torch.ones(31), atol=2e-6, rtol=0)
        assert torch.equal(ours.encode(x) != 0, out["feature_acts"] != 0)
        # measured 5.4e-7 (values up to 4.6), bound 6e-6: 11x
        torch.testing.assert_close(ours.decode(ours.encode(x)), out["sae_out"], atol=6e-6, rtol=0)


def test_losses_by_hand():
    x = torch.randn(9, 24, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    sae = drifted("standard").double()
    out = training_step_losses(sae, x, torch.zeros(31, dtype=torch.bool), 0.3, 1.0)
    with torch.no_grad():
        acts = torch.relu((x - sae.b_dec) @ sae.W_enc + sae.b_enc)
        norms = torch.stack([sae.W_dec[i].pow(2).sum().sqrt() for i in range(31)])
        l1 = 0.3 * sum(float((acts[t] * norms).sum()) for t in range(9)) / 9
        mse = sum(float((acts[t] @ sae.W_dec + sae.b_dec - x[t]).pow(2).sum()) for t in range(9)) / 9
    assert out["l1_loss"].item() == pytest.approx(l1, rel=1e-12, abs=0)
    assert out["mse_loss"].item() == pytest.approx(mse, rel=1e-12, abs=0)
    assert out["loss"].item() == pytest.approx(l1 + mse, rel=1e-12, abs=0)
    # AuxK by hand: 3 dead features, k_aux = d_in // 2 = 12 > 3, so all 3 and scale 3 / 12.
    topk = drifted("topk").double()
    dead = torch.zeros(31, dtype=torch.bool)
    dead[[2, 7, 30]] = True
    out = training_step_losses(topk, x, dead, 0.0, 2.0)
    with torch.no_grad():
        norms = topk.W_dec.norm(dim=-1)
        pre = ((x - topk.b_dec) @ topk.W_enc + topk.b_enc) * norms
        residual = x - out["sae_out"]
        recon = (pre[:, [2, 7, 30]] / norms[[2, 7, 30]]) @ topk.W_dec[[2, 7, 30]]
        aux = 2.0 * 3 / 12 * (recon - residual).pow(2).sum(-1).mean()
    assert out["aux_loss"].item() == pytest.approx(aux.item(), rel=1e-12, abs=0)


def test_dead_feature_counter_and_resampling():
    dead = DeadFeatures(4, window=2, device="cpu")
    for fired in ([1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]):
        dead.update(torch.tensor([fired, [0, 0, 0, 0]], dtype=torch.float))
    assert dead.steps_since_fired.tolist() == [0, 1, 3, 3]
    assert dead.mask().tolist() == [False, False, True, True]  # more than 2 steps without firing

    sae = drifted("standard")
    optimizer = torch.optim.Adam(sae.parameters(), lr=1e-3)
    x = torch.randn(11, 24, generator=torch.Generator().manual_seed(6))
    training_step_losses(sae, x, torch.zeros(31, dtype=torch.bool), 0.1, 1.0)["loss"].backward()
    optimizer.step()
    before = {k: v.detach().clone() for k, v in sae.state_dict().items()}
    moments = {name: optimizer.state[p]["exp_avg"].clone() for name, p in sae.named_parameters()}
    mask = torch.zeros(31, dtype=torch.bool)
    mask[[3, 17]] = True
    with torch.no_grad():
        x_hat = sae.decode(sae.encode(x))
    assert resample_dead(sae, optimizer, x, x_hat, mask, torch.Generator().manual_seed(0)) == 2
    with torch.no_grad():
        directions = (x - before["b_dec"]) / (x - before["b_dec"]).norm(dim=-1, keepdim=True)
        alive_norm = before["W_enc"][:, ~mask].norm(dim=0).mean()
        for f in (3, 17):
            row = sae.W_dec[f]
            assert (directions - row).abs().max(-1).values.min() < 1e-6  # one of the inputs, at unit norm
            # measured 6e-8, bound 1e-6: 16x
            torch.testing.assert_close(sae.W_enc[:, f], row * 0.2 * alive_norm, atol=1e-6, rtol=0)
            assert sae.b_enc[f] == 0
            assert (optimizer.state[sae.W_dec]["exp_avg"][f] == 0).all()
            assert (optimizer.state[sae.W_enc]["exp_avg"][:, f] == 0).all()
        keep = [i for i in range(31) if i not in (3, 17)]
        assert torch.equal(sae.W_dec[keep], before["W_dec"][keep])
        assert torch.equal(optimizer.state[sae.W_dec]["exp_avg"][keep], moments["W_dec"][keep])


def test_b_dec_init_mean_is_the_first_buffers_mean(model, tokens):
    from glassbox.train.sae.trainer import SAETrainer

    config = SAETrainConfig(hook_name=HOOK, d_sae=40, context_size=12, architecture="topk", k=3, batch_tokens=32,
                            buffer_batches=3, model_batch=4, steps=4, b_dec_init="mean")
    trainer = SAETrainer(model, tokens, config, bos_id=BOS, progress=False)
    assert torch.equal(trainer.sae.b_dec, torch.zeros(24))
    trainer.run(until=0)
    assert torch.equal(trainer.sae.b_dec, trainer.stream.buffer.mean(0)) and trainer.sae.b_dec.abs().max() > 0
    first = trainer.stream.buffer[:32].clone()
    assert torch.equal(trainer.stream.next_batch(), first)  # the first batch comes from that buffer


def test_schedules():
    cfg = SAETrainConfig(hook_name=HOOK, d_sae=8, context_size=8, architecture="standard", steps=10, lr=1.0,
                         lr_warmup_steps=4, lr_decay_steps=2, l1_coefficient=2.0, l1_warmup_steps=4)
    assert [cfg.lr_at(s) for s in range(10)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5]
    assert [cfg.l1_at(s) for s in range(6)] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.0]


# -- whole runs ------------------------------------------------------------------------------------
class Stop(Exception):
    pass


@pytest.mark.parametrize("architecture", ["topk", "standard"])
def test_resume_continues_bit_for_bit(model, tokens, tmp_path, architecture):
    """8 steps straight == stopped at step 6 (checkpoint at 4) + resume; dead-feature handling active."""
    kw = small(checkpoint_every=4, dead_feature_window=1)
    if architecture == "topk":
        kw.update(architecture="topk", k=3, b_dec_init="mean")
    else:
        kw.update(architecture="standard", l1_coefficient=0.05, feature_sampling_window=3)
    straight = train_sae(model, tokens, HOOK, 40, out=tmp_path / "a", **kw)

    def stop(record):
        if record["step"] == 6:
            raise Stop

    with pytest.raises(Stop):
        train_sae(model, tokens, HOOK, 40, out=tmp_path / "b", log=stop, **kw)
    resumed = train_sae(model, tokens, HOOK, 40, out=tmp_path / "b", resume=True, **kw)
    for name, value in straight.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name
    logs = [(tmp_path / run / "train_sae_log.jsonl").read_text() for run in ("a", "b")]
    assert logs[0] == logs[1]
    sparsity = [(tmp_path / run / "sae" / "sparsity.safetensors").read_bytes() for run in ("a", "b")]
    assert sparsity[0] == sparsity[1]
    records = [json.loads(line) for line in logs[0].splitlines()]
    assert [r["step"] for r in records] == list(range(1, 9))
    log10_freq = load_file(str(tmp_path / "a" / "sae" / "sparsity.safetensors"))["sparsity"]
    window = torch.load(tmp_path / "a" / "checkpoint" / "trainer_state.pt", weights_only=True)["sparsity_window"]
    if architecture == "topk":
        assert any(r["aux_loss"] > 0 for r in records)  # AuxK ran on dead features
        assert all(r["l0"] == 3.0 for r in records)
        # the whole run is the window (feature_sampling_window 2000 > 8 steps): the frequencies sum to
        # L0 = k; measured 3.9e-8 after float32 log10 and back, bound 5e-7: 13x
        assert window["tokens"] == 8 * 32
        assert abs((10.0 ** log10_freq.double() - 1e-10).sum().item() - 3.0) < 5e-7
    else:
        assert sum(r.get("resampled", 0) for r in records) > 0  # resampling ran
        assert window["tokens"] == 2 * 32  # windows of 3 steps, reset before steps 4 and 7: steps 7-8
    # a finished run resumed trains nothing and keeps the SAE
    again = train_sae(model, tokens, HOOK, 40, out=tmp_path / "a", resume=True, **kw)
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in straight.state_dict().items())


def test_saved_sae_is_the_trained_one_with_unit_decoder_rows(model, tokens, tmp_path):
    sae = train_sae(model, tokens, HOOK, 40, architecture="topk", k=3, out=tmp_path / "run", **small())
    loaded = load_sae(tmp_path / "run" / "sae")
    assert isinstance(loaded, TopKSAE) and loaded.cfg.k == 3 and loaded.cfg.hook_name == HOOK
    assert not loaded.cfg.rescale_acts_by_decoder_norm
    assert loaded.cfg.metadata["context_size"] == 12 and loaded.cfg.metadata["prepend_bos"] is True
    for name, value in sae.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[name]), name
    # measured 1.2e-7, bound 2e-6: 17x
    torch.testing.assert_close(loaded.decoder_norms(), torch.ones(40), atol=2e-6, rtol=0)


def test_training_reconstructs_better(model, tokens):
    history = []
    train_sae(model, tokens, HOOK, 48, architecture="topk", k=6, log=history.append,
              **small(steps=12, lr=3e-2, batch_tokens=64))
    first, last = history[0]["explained_variance"], history[-1]["explained_variance"]
    assert first < 0.2 and last > first + 0.3, (first, last)


def test_two_runs_are_identical(model, tokens):
    a = train_sae(model, tokens, HOOK, 40, architecture="topk", k=3, **small(steps=3))
    b = train_sae(model, tokens, HOOK, 40, architecture="topk", k=3, **small(steps=3))
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    c = train_sae(model, tokens, HOOK, 40, architecture="topk", k=3, **small(steps=3, seed=5))
    assert not torch.equal(a.W_dec, c.W_dec)


# -- refusals --------------------------------------------------------------------------------------
@pytest.mark.parametrize("changes,match", [
    (dict(architecture="topk"), "k .features kept per token. is needed"),
    (dict(architecture="topk", k=41), "k=41 is more than d_sae=40"),
    (dict(architecture="standard", k=3), "k=3 is for architecture='topk'"),
    (dict(architecture="relu"), "architecture must be one of"),
    (dict(architecture="standard", lr=float("nan")), "lr must be a finite number"),
    (dict(architecture="standard", batch_tokens=0), "batch_tokens must be a whole number >= 1"),
    (dict(architecture="standard", steps=4, lr_warmup_steps=3, lr_decay_steps=2), "lr_warmup_steps"),
    (dict(architecture="standard", context_size=17), "context_size=17 is more than the model's n_ctx=16"),
    (dict(architecture="standard", hook_name_typo=1), "unknown options hook_name_typo"),
])
def test_bad_arguments_are_refused_and_nothing_is_written(model, tokens, tmp_path, changes, match):
    with pytest.raises((ValueError, TypeError), match=match):
        train_sae(model, tokens, HOOK, 40, out=tmp_path / "run", **small(**changes))
    assert not (tmp_path / "run").exists()


def test_bad_hook_is_refused_and_nothing_is_written(model, tokens, tmp_path):
    with pytest.raises(KeyError, match="blocks.0.hook_resid_pst"):
        train_sae(model, tokens, "blocks.0.hook_resid_pst", 40, architecture="topk", k=3, out=tmp_path / "run",
                  **small())
    assert not (tmp_path / "run").exists()


def test_a_damaged_checkpoint_is_refused_naming_the_file(model, tokens, tmp_path):
    from glassbox.train import CheckpointError

    kw = small(steps=2, architecture="topk", k=3)
    train_sae(model, tokens, HOOK, 40, out=tmp_path / "run", **kw)
    state = tmp_path / "run" / "checkpoint" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="trainer_state.pt"):
        train_sae(model, tokens, HOOK, 40, out=tmp_path / "run", resume=True, **kw)


def test_run_folder_refusals(model, tokens, tmp_path):
    kw = small(steps=2, architecture="topk", k=3)
    train_sae(model, tokens, HOOK, 40, out=tmp_path / "run", **kw)
    with pytest.raises(ValueError, match="is not empty; pass resume=True"):
        train_sae(model, tokens, HOOK, 40, out=tmp_path / "run", **kw)
    with pytest.raises(ValueError, match="resume=True with seed=5, but the run .* has seed=4"):
        train_sae(model, tokens, HOOK, 40, out=tmp_path / "run", resume=True, **{**kw, "seed": 5})
    with pytest.raises(ValueError, match="other training data"):
        train_sae(model, tokens[:1500], HOOK, 40, out=tmp_path / "run", resume=True, **kw)
    with pytest.raises(ValueError, match="holds no SAE training run"):
        train_sae(model, tokens, HOOK, 40, out=tmp_path / "other", resume=True, **kw)
    with pytest.raises(ValueError, match="no out was given"):
        train_sae(model, tokens, HOOK, 40, resume=True, **kw)
    with pytest.raises(ValueError, match="has no tokenizer"):
        train_sae(model, "some text", HOOK, 40, **kw)
