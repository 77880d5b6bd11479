"""Training transcoder sets (glassbox.train.transcoders): the paired stream, the losses by hand, bit-for-bit
resume, the saved set, and the held-out evals (FVU, L0, dead fraction, CE loss recovered) by hand."""

import json

import pytest
import torch

from glassbox.interp.transcoders import load_circuit_tracer, seeded_set
from glassbox.interp.transcoders.evals import evaluate_transcoders
from glassbox.models import Config, HookedTransformer
from glassbox.train.data import sample_windows
from glassbox.train.transcoders import (PairedStream, TranscoderTrainConfig, fold_decoder_norms, train_transcoders,
                                        training_losses)

BOS, N, D = 49, 2, 24


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HookedTransformer(Config(n_layers=N, d_model=D, n_heads=3, d_head=8, d_mlp=40, d_vocab=50, n_ctx=16)).eval()


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, BOS, (2000,), generator=torch.Generator().manual_seed(1))


def small(**changes):
    options = dict(steps=8, batch_tokens=32, lr=1e-2, bos_id=BOS, progress=False, buffer_batches=3, model_batch=4,
                   context_size=12, seed=4)
    options.update(changes)
    return options


def test_paired_stream_serves_inputs_and_outputs_of_every_layer(model, tokens):
    s = PairedStream(model, tokens, "ln2.hook_out", "hook_mlp_out", 12, 16, 3, 2, BOS, [BOS],
                     torch.Generator().manual_seed(5))
    s.fill()
    generator = torch.Generator().manual_seed(5)
    rows = []
    while sum(len(r) for r in rows) < 48:
        windows = sample_windows(tokens, 2, 11, BOS, generator)
        # only these hooks cached: caching the attention pattern would take attention off its fused kernel
        names = [f"blocks.{l}.{h}" for h in ("ln2.hook_out", "hook_mlp_out") for l in range(N)]
        _, cache = model.run_with_cache(windows, names_filter=names)
        parts = [cache[f"blocks.{l}.ln2.hook_out"] for l in range(N)] + [cache[f"blocks.{l}.hook_mlp_out"] for l in range(N)]
        rows.append(torch.stack(parts, dim=2)[:, 1:].reshape(-1, 2 * N * D))
    oracle = torch.cat(rows)[torch.randperm(sum(len(r) for r in rows), generator=generator)[:48]]
    assert torch.equal(s.buffer, oracle)
    x, y = s.split(s.next_batch())
    assert x.shape == (N, 16, D) and torch.equal(y[1], oracle[:16, 3 * D:])
    assert torch.equal(x[0], oracle[:16, :D])


@pytest.mark.parametrize("cross_layer", [False, True])
def test_losses_by_hand(cross_layer):
    cfg = TranscoderTrainConfig(input_hook="ln2.hook_out", d_transcoder=6, context_size=8, cross_layer=cross_layer,
                                skip=True, architecture="topk", k=2)
    ts = seeded_set(N, 5, 6, seed=1, cross_layer=cross_layer, skip=True, activation="topk", k=2, bias=0.0,
                    dtype=torch.float64)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(N, 9, 5, generator=g, dtype=torch.float64), torch.randn(N, 9, 5, generator=g, dtype=torch.float64)
    out = training_losses(ts, cfg, x, y, 0.0)
    mse = 0.0
    for t in range(N):
        est = ts.decoder_bias[t].detach() + x[t] @ ts.skip_weights[t].detach().T
        for s in (range(t + 1) if cross_layer else (t,)):
            W = ts.decoders[s].detach()
            norms = W.pow(2).sum(dim=(1, 2)).sqrt()
            h = (x[s] @ ts.encoder[s].detach() + ts.encoder_bias[s].detach()) * norms
            keep = h.topk(2, dim=-1).indices
            a = torch.zeros_like(h).scatter(-1, keep, h.gather(-1, keep).relu()) / norms
            est = est + a @ W[:, t - s if cross_layer else 0]
        mse += (est - y[t]).pow(2).sum(-1).mean().item()
    # float64: measured |diff| 0.0 (and 0.0 for the L1 penalty below); bound 1e-12
    assert abs(out["mse_loss"].item() - mse) < 1e-12
    # the folded set's inference computes the trained function: unit decoder norms, the same outputs
    before = [e.detach() for e in out["estimates"]]
    fold_decoder_norms(ts)
    after = ts.reconstruct({l: x[l] for l in range(N)})
    for s in range(N):
        torch.testing.assert_close(ts.decoders[s].detach().pow(2).sum(dim=(1, 2)).sqrt(), torch.ones(6, dtype=torch.float64),
                                   rtol=0, atol=1e-12)
    for t in range(N):  # float64: measured max |diff| 1.8e-15 (values up to 4.0), norms 1 within it; bound 1e-12
        torch.testing.assert_close(after[t], before[t], rtol=0, atol=1e-12)
    # ReLU: penalty = coefficient * sum over layers of (acts * decoder norms) summed over features, mean over rows
    cfg = TranscoderTrainConfig(input_hook="ln2.hook_out", d_transcoder=6, context_size=8, cross_layer=cross_layer,
                                architecture="relu")
    relu = seeded_set(N, 5, 6, seed=3, cross_layer=cross_layer, bias=0.0, dtype=torch.float64)
    out = training_losses(relu, cfg, x, y, 0.5)
    pen = sum(((x[s] @ relu.encoder[s].detach() + relu.encoder_bias[s].detach()).relu()
               * relu.decoders[s].detach().pow(2).sum(dim=(1, 2)).sqrt()).sum(-1).mean().item() for s in range(N))
    assert abs(out["l1_loss"].item() - 0.5 * pen) < 1e-12


class Stop(Exception):
    pass


@pytest.mark.parametrize("kind", [dict(architecture="topk", k=3), dict(architecture="relu", l1_coefficient=0.01,
                                                                       cross_layer=True, skip=True)], ids=str)
def test_resume_continues_bit_for_bit(model, tokens, tmp_path, kind):
    kw = small(checkpoint_every=4, **kind)
    straight = train_transcoders(model, tokens, "ln2.hook_out", 40, out=tmp_path / "a", **kw)

    def stop(record):
        if record["step"] == 6:
            raise Stop

    with pytest.raises(Stop):
        train_transcoders(model, tokens, "ln2.hook_out", 40, out=tmp_path / "b", log=stop, **kw)
    resumed = train_transcoders(model, tokens, "ln2.hook_out", 40, out=tmp_path / "b", resume=True, **kw)
    for name, value in straight.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name
    logs = [(tmp_path / run / "train_sae_log.jsonl").read_text() for run in ("a", "b")]
    assert logs[0] == logs[1]
    records = [json.loads(line) for line in logs[0].splitlines()]
    assert [r["step"] for r in records] == list(range(1, 9))
    if kind["architecture"] == "topk":
        assert all(r["l0"] == 3.0 for r in records)
    # the saved set is the returned one, in circuit-tracer's layout
    saved = load_circuit_tracer(tmp_path / "a" / "transcoders")
    for name, value in straight.state_dict().items():
        assert torch.equal(value, saved.state_dict()[name]), name
    assert saved.cross_layer == kind.get("cross_layer", False) and saved.skip == kind.get("skip", False)
    with pytest.raises(ValueError, match="resume=True with k=4, but the run .* has k=3|resume=True with l1_coefficient"):
        changed = dict(kw, k=4) if kind["architecture"] == "topk" else dict(kw, l1_coefficient=0.02)
        train_transcoders(model, tokens, "ln2.hook_out", 40, out=tmp_path / "b", resume=True, **changed)


def test_training_lowers_the_reconstruction_error(model, tokens):
    history = []
    train_transcoders(model, tokens, "ln2.hook_out", 40, cross_layer=True, architecture="topk", k=4,
                      log=history.append, **small(steps=25, batch_tokens=64))
    first, last = history[0]["mse_loss"], history[-1]["mse_loss"]
    assert last < 0.5 * first, (first, last)


def test_bad_arguments_are_refused_before_anything_is_written(model, tokens, tmp_path):
    with pytest.raises(ValueError, match="k=41 is more than d_transcoder=40"):
        train_transcoders(model, tokens, "ln2.hook_out", 40, k=41, out=tmp_path / "r", **small())
    with pytest.raises(ValueError, match="input_hook='ln2.hook_outt' is not a per-block hook"):
        train_transcoders(model, tokens, "ln2.hook_outt", 40, k=3, out=tmp_path / "r", **small())
    with pytest.raises(ValueError, match="k=3 is for architecture='topk'"):
        train_transcoders(model, tokens, "ln2.hook_out", 40, architecture="relu", k=3, out=tmp_path / "r", **small())
    assert not (tmp_path / "r").exists()


def test_evals_by_hand(model, tokens):
    ts = seeded_set(N, D, 30, seed=2, cross_layer=True, bias=-0.5)
    windows = torch.cat([torch.full((6, 1), BOS), tokens[:66].reshape(6, 11)], dim=1)
    windows[2, 5] = BOS  # a special token inside a window: left out, and its output keeps the model's value
    ev = evaluate_transcoders(model, ts, windows, batch_size=4, exclude_special_tokens=[BOS])
    names = [f"blocks.{l}.{h}" for h in ("ln2.hook_out", "hook_mlp_out") for l in range(N)]
    _, cache = model.run_with_cache(windows, names_filter=names)  # as the evals: attention on its fused kernel
    keep = (windows != BOS).reshape(-1)
    x = {l: cache[f"blocks.{l}.ln2.hook_out"] for l in range(N)}
    recon = ts.reconstruct(x)
    for l in range(N):
        y = cache[f"blocks.{l}.hook_mlp_out"].reshape(-1, D)[keep].double()
        r = recon[l].detach().reshape(-1, D)[keep].double()
        fvu = ((y - r) ** 2).sum() / ((y - y.mean(0)) ** 2).sum()
        # float64 sums: measured relative |diff| 2.2e-16 and 6.7e-16; bound 1e-9 (the variance's float64 cancellation)
        assert abs(ev["fvu"][l] / fvu.item() - 1) < 1e-9, l
        acts = ts.encode(l, x[l]).detach().reshape(-1, 30)[keep]
        assert ev["l0"][l] == (acts != 0).sum().item() / keep.sum().item()
        assert ev["dead_fraction"][l] == ((acts != 0).sum(0) == 0).sum().item() / 30
    assert ev["n_tokens"] == int(keep.sum())
    # CE with the replacement: an independent loop, layer by layer, each run splicing the estimates of the
    # layers before it as fixed tensors computed from the previous run's inputs
    fixed = {}
    for layer in range(N):
        hooks = [(f"blocks.{l}.hook_mlp_out", lambda v, hook, l=l: fixed[l]) for l in fixed]
        _, c = _cache_with(model, windows, hooks)
        inputs = {l: c[f"blocks.{l}.ln2.hook_out"] for l in range(layer + 1)}
        est = ts.reconstruct(inputs)[layer].detach()
        mask = (windows != BOS)[..., None]
        fixed[layer] = torch.where(mask, est, c[f"blocks.{layer}.hook_mlp_out"])
    hooks = [(f"blocks.{l}.hook_mlp_out", lambda v, hook, l=l: fixed[l]) for l in fixed]
    _, loss = model.run_with_hooks(windows, return_type="both", loss_per_token=True, fwd_hooks=hooks)
    targets = (windows != BOS)[:, :-1]
    # measured |diff| 0.0 for all three (losses ~ 3.9, float32, batches of 4 there and 6 here); bound 2e-6
    assert abs(ev["ce_loss_with_replacement"] - loss[targets].mean().item()) < 2e-6
    _, clean = model(windows, return_type="both", loss_per_token=True)
    assert abs(ev["ce_loss_without_replacement"] - clean[targets].mean().item()) < 2e-6
    zero = [(f"blocks.{l}.hook_mlp_out", lambda v, hook: torch.zeros_like(v)) for l in range(N)]
    _, abl = model.run_with_hooks(windows, return_type="both", loss_per_token=True, fwd_hooks=zero)
    assert abs(ev["ce_loss_with_ablation"] - abl[targets].mean().item()) < 2e-6
    a, r, c = ev["ce_loss_with_ablation"], ev["ce_loss_with_replacement"], ev["ce_loss_without_replacement"]
    assert ev["ce_loss_score"] == (a - r) / (a - c)


def _cache_with(model, tokens, hooks):
    cache = {}

    def save(v, hook):
        cache[hook.name] = v.detach()
        return v

    names = [f"blocks.{l}.{h}" for l in range(N) for h in ("ln2.hook_out", "hook_mlp_out")]
    # the fixed replacements first, then the saving hooks (which then see the replaced values)
    model.run_with_hooks(tokens, fwd_hooks=hooks + [(name, save) for name in names])
    return None, cache
