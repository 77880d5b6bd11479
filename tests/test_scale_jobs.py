"""The sweep, attribution and eval jobs over prompt pairs: split-independent, equal to the in-process calls.

Oracles: ``activation_patch`` / ``attribution_patch`` / ``eap`` called directly on the same batches (the
per-pair values concatenated, the mean taken by hand), a forward with ``torch.nn.functional.cross_entropy``
for the eval, GPT-2's tokenizer for the reading of pairs, and the batch layout worked out by hand.
"""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from glassbox import Config, HookedTransformer
from glassbox.interp.attribution import attribution_patch, eap
from glassbox.interp.cache import run_with_cache
from glassbox.interp.patching import LogitDiff, activation_patch
from glassbox.scale import load_manifest, run_job, verify
from glassbox.scale.jobs_attribution import AttributionJob, EdgeAttributionJob
from glassbox.scale.jobs_data import PromptPairs, load_pairs, prompt_pairs
from glassbox.scale.jobs_eval import EvalJob
from glassbox.scale.jobs_sweep import SweepJob

SPEC = {"factory": "glassbox.unused:model", "device": "cpu", "dtype": "float32"}  # local runs pass model=
VOCAB, N, P = 37, 7, 6


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # these models are tiny: one thread is ~9x faster than two on a busy machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return HookedTransformer(Config(d_model=20, n_layers=2, n_heads=4, d_head=5, d_vocab=VOCAB, n_ctx=16, d_mlp=36,
                                    init_range=0.3)).eval()


def make_pairs(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    clean, corrupted = [], []
    for length in lengths:
        row = torch.randint(0, VOCAB, (length,), generator=g)
        other = row.clone()
        other[1] = (row[1] + 1 + torch.randint(0, VOCAB - 1, (1,), generator=g)) % VOCAB
        clean.append(row.tolist())
        corrupted.append(other.tolist())
    answer = torch.randint(0, VOCAB, (len(lengths),), generator=g).tolist()
    distractor = torch.randint(0, VOCAB, (len(lengths),), generator=g).tolist()
    return PromptPairs(clean, corrupted, answer, distractor)


@pytest.fixture(scope="module")
def pairs():
    return make_pairs([P] * N)


def tensors(pairs, field, idx):
    return torch.tensor([getattr(pairs, field)[i] for i in idx])


def run(job, folder, model, **kw):
    return run_job(job, folder, model=model, progress=False, **kw)


def sweep_oracle(model, pairs, batches, activation="resid_pre", axes=("layer", "pos")):
    """Per-pair values [*grid pair] of activation_patch run batch by batch (batches of input indices)."""
    per_pair, clean_m, corr_m = {}, {}, {}
    for idx in batches:
        clean, corrupted = tensors(pairs, "clean", idx), tensors(pairs, "corrupted", idx)
        metric = LogitDiff(tensors(pairs, "answer", idx), tensors(pairs, "distractor", idx))
        names = [f"blocks.{L}.hook_{activation}" if activation != "z" else f"blocks.{L}.attn.hook_z" for L in range(2)]
        _, cache = run_with_cache(model, clean, names_filter=names)
        values = activation_patch(model, corrupted, cache, metric, activation, axes, reduce=None).values
        with torch.no_grad():
            cm, km = metric(model(clean)), metric(model(corrupted))
        for k, i in enumerate(idx):
            per_pair[i], clean_m[i], corr_m[i] = values[..., k], cm[k], km[k]
    order = sorted(per_pair)
    return torch.stack([per_pair[i] for i in order], -1), torch.stack([clean_m[i] for i in order]), \
        torch.stack([corr_m[i] for i in order])


# --- reading pairs --------------------------------------------------------------------------------------
def test_pairs_from_jsonl_with_gpt2_tokenizer(tmp_path):
    from transformers import GPT2TokenizerFast

    from glassbox.models.tokenize import GPT2_TOKENIZER_DIR

    tok = GPT2TokenizerFast.from_pretrained(str(GPT2_TOKENIZER_DIR))
    rows = [{"clean": "When Mary and John went out, John gave it to", "corrupted": "When Mary and John went out, "
             "Mary gave it to", "answer": " Mary", "distractor": " John"},
            {"clean": [5, 6, 7], "corrupted": [5, 8, 7], "answer": 9, "distractor": 10}]
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    got = load_pairs(path, tok)
    assert got.clean[0] == [50256] + tok("When Mary and John went out, John gave it to")["input_ids"]
    assert got.corrupted[1] == [5, 8, 7] and got.answer == [5335, 9] and got.distractor == [1757, 10]
    assert got.names == ["pairs.jsonl line 1", "pairs.jsonl line 2"]
    assert load_pairs(path, tok, prepend_bos=False).clean[0] == tok("When Mary and John went out, John gave it to")[
        "input_ids"]

    bad = dict(rows[0], answer=" Marianne")  # two GPT-2 tokens
    (tmp_path / "b.jsonl").write_text(json.dumps(rows[1]) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"b.jsonl line 2: answer ' Marianne' is 2 tokens"):
        load_pairs(tmp_path / "b.jsonl", tok)
    uneven = dict(rows[0], corrupted="When Mary and John went out, Marianne gave it to")
    (tmp_path / "c.jsonl").write_text(json.dumps(uneven) + "\n")
    with pytest.raises(ValueError, match=r"c.jsonl line 1: the clean prompt is 12 tokens, the corrupted 13"):
        load_pairs(tmp_path / "c.jsonl", tok)
    with pytest.raises(ValueError, match=r"pair 1 has no 'distractor' field"):
        prompt_pairs([rows[1], {k: v for k, v in rows[1].items() if k != "distractor"}])
    with pytest.raises(ValueError, match=r"unknown field\(s\) 'label'"):
        prompt_pairs([dict(rows[1], label=1)])
    with pytest.raises(ValueError, match="clean is text, but no tokenizer was given"):
        prompt_pairs([rows[0]])
    (tmp_path / "list.json").write_text(json.dumps([rows[1], rows[1]]))
    assert load_pairs(tmp_path / "list.json").names == ["list.json item 0", "list.json item 1"]


def test_pairs_from_a_datasets_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list([{"clean": [1, 2, 3], "corrupted": [1, 4, 3], "answer": 5, "distractor": 6}] * 2) \
        .save_to_disk(str(tmp_path / "ds"))
    got = load_pairs(tmp_path / "ds")
    assert got.clean == [[1, 2, 3]] * 2 and got.answer == [5, 5] and got.names == ["ds row 0", "ds row 1"]


def test_batches_group_by_length_and_shards_hold_whole_batches():
    pairs = make_pairs([5, 6, 5, 6, 5, 5, 5])
    # job order: the length-5 pairs 0 2 4 5 6, then the length-6 pairs 1 3
    assert pairs.order == [0, 2, 4, 5, 6, 1, 3]
    assert pairs.batches(2) == [(0, 2), (2, 4), (4, 5), (5, 7)]
    job = SweepJob(SPEC, pairs, "resid_pre", ("layer",), batch_size=2, shard_size=4)
    assert [(s.start, s.stop) for s in job.plan()] == [(0, 4), (4, 7)]
    assert [(s.start, s.stop) for s in SweepJob(SPEC, pairs, "resid_pre", ("layer",), batch_size=2,
                                                shard_size=2).plan()] == [(0, 2), (2, 4), (4, 5), (5, 7)]
    with pytest.raises(ValueError, match="pair 1 is 6 tokens and pair 0 is 5"):
        SweepJob(SPEC, pairs, "resid_pre", ("layer", "pos"))
    with pytest.raises(ValueError, match="multiple of batch_size=2"):
        SweepJob(SPEC, pairs, "resid_pre", ("layer",), batch_size=2, shard_size=3)
    with pytest.raises(ValueError, match="needs every pair to have a 'distractor'"):
        SweepJob(SPEC, PromptPairs(pairs.clean, pairs.corrupted, pairs.answer), "resid_pre", ("layer",))


# --- sweep ----------------------------------------------------------------------------------------------
def test_sweep_is_split_independent_and_equals_the_batched_calls(model, pairs, tmp_path):
    results = [run(SweepJob(SPEC, pairs, "resid_pre", ("layer", "pos"), batch_size=2, shard_size=s),
                   tmp_path / f"s{s}", model) for s in (2, 4, 8)]
    assert [len(load_manifest(tmp_path / f"s{s}")["plan"]) for s in (2, 4, 8)] == [4, 2, 1]
    per_pair, clean_m, corr_m = sweep_oracle(model, pairs, [[0, 1], [2, 3], [4, 5], [6]])
    for r in results:
        assert r.per_prompt.axes == ("layer", "pos", "batch") and r.mean.axes == ("layer", "pos")
        assert torch.equal(r.per_prompt.values, per_pair)
        assert torch.equal(r.mean.values, per_pair.mean(-1))
        assert torch.equal(r.clean, clean_m) and torch.equal(r.corrupted, corr_m)
    from safetensors.torch import load_file

    on_disk = load_file(str(tmp_path / "s4" / "result.safetensors"))
    assert torch.equal(on_disk["mean"], per_pair.mean(-1)) and torch.equal(on_disk["per_prompt"], per_pair)

    # one batch of every pair: the engine's own mean, bit for bit; batches of 2: float rounding only
    whole = run(SweepJob(SPEC, pairs, "resid_pre", ("layer", "pos"), batch_size=N), tmp_path / "whole", model)
    _, cache = run_with_cache(model, torch.tensor(pairs.clean), names_filter=lambda n: n.endswith("hook_resid_pre"))
    ref = activation_patch(model, torch.tensor(pairs.corrupted), cache,
                           LogitDiff(torch.tensor(pairs.answer), torch.tensor(pairs.distractor)), "resid_pre",
                           ("layer", "pos"))
    assert torch.equal(whole.mean.values, ref.values)
    # measured 6.0e-8 (values up to 0.41), bound 1e-6: 17x
    torch.testing.assert_close(results[0].mean.values, ref.values, rtol=0, atol=1e-6)


def test_sweep_of_pairs_of_several_lengths_returns_input_order(model, tmp_path):
    pairs = make_pairs([5, 6, 5, 6, 5], seed=4)
    result = run(SweepJob(SPEC, pairs, "z", ("layer", "head"), batch_size=2, shard_size=2), tmp_path / "z", model)
    per_pair, clean_m, _ = sweep_oracle(model, pairs, [[0, 2], [4], [1, 3]], "z", ("layer", "head"))
    assert torch.equal(result.per_prompt.values, per_pair) and torch.equal(result.clean, clean_m)


def test_resume_skips_verified_shards_and_recomputes_a_damaged_one(model, pairs, tmp_path):
    calls = []

    class Counting(SweepJob):
        fail_at = None

        def run_shard(self, model, spec, tmp_dir):
            calls.append(spec.index)
            if spec.index == self.fail_at:
                raise RuntimeError("stopped on purpose")
            return super().run_shard(model, spec, tmp_dir)

    def job(fail_at=None):
        j = Counting(SPEC, pairs, "resid_pre", ("layer", "pos"), batch_size=2, shard_size=2)
        j.fail_at = fail_at
        return j

    with pytest.raises(RuntimeError, match="stopped on purpose"):
        run(job(fail_at=2), tmp_path / "r", model)
    assert calls == [0, 1, 2] and verify(tmp_path / "r") == {2: "not committed", 3: "not committed"}
    calls.clear()
    resumed = run(job(), tmp_path / "r", model, resume=True)
    assert calls == [2, 3]
    fresh = run(job(), tmp_path / "fresh", model)
    assert torch.equal(resumed.per_prompt.values, fresh.per_prompt.values)
    values = tmp_path / "r" / "shards" / "shard_00001" / "values.safetensors"
    raw = bytearray(values.read_bytes())
    raw[-1] ^= 1
    values.write_bytes(bytes(raw))
    calls.clear()
    again = run(job(), tmp_path / "r", model, resume=True)
    assert calls == [1] and torch.equal(again.per_prompt.values, fresh.per_prompt.values)
    with pytest.raises(ValueError, match=r"cannot resume .*params\.shard_size was 2, now 4"):
        run(SweepJob(SPEC, pairs, "resid_pre", ("layer", "pos"), batch_size=2, shard_size=4), tmp_path / "r", model,
            resume=True)


# --- attribution ----------------------------------------------------------------------------------------
def test_atp_is_split_independent_and_equals_the_batched_calls(model, pairs, tmp_path):
    results = [run(AttributionJob(SPEC, pairs, "z", ("layer", "head"), batch_size=3, shard_size=s),
                   tmp_path / f"a{s}", model) for s in (3, 6, 9)]
    parts = []
    for idx in ([0, 1, 2], [3, 4, 5], [6]):
        metric = LogitDiff(tensors(pairs, "answer", idx), tensors(pairs, "distractor", idx))
        parts.append(attribution_patch(model, tensors(pairs, "clean", idx), tensors(pairs, "corrupted", idx), metric,
                                       "z", ("layer", "head"), reduce=None).values)
    per_pair = torch.cat(parts, -1)
    for r in results:
        assert torch.equal(r.per_prompt.values, per_pair) and torch.equal(r.mean.values, per_pair.mean(-1))
    whole = run(AttributionJob(SPEC, pairs, "z", ("layer", "head"), batch_size=N), tmp_path / "whole", model)
    ref = attribution_patch(model, torch.tensor(pairs.clean), torch.tensor(pairs.corrupted),
                            LogitDiff(torch.tensor(pairs.answer), torch.tensor(pairs.distractor)), "z",
                            ("layer", "head"))
    assert torch.equal(whole.mean.values, ref.values)
    # measured 1.5e-7 (values up to 0.47), bound 2e-6: 13x
    torch.testing.assert_close(results[0].mean.values, ref.values, rtol=0, atol=2e-6)


def test_eap_graph_is_the_pair_weighted_mean_of_the_batches(model, pairs, tmp_path):
    graphs = [run(EdgeAttributionJob(SPEC, pairs, batch_size=3, shard_size=s), tmp_path / f"e{s}", model)
              for s in (3, 9)]
    acc, clean = torch.zeros_like(graphs[0].scores, dtype=torch.float64), 0.0
    for idx in ([0, 1, 2], [3, 4, 5], [6]):
        metric = LogitDiff(tensors(pairs, "answer", idx), tensors(pairs, "distractor", idx))
        g = eap(model, tensors(pairs, "clean", idx), tensors(pairs, "corrupted", idx), metric)
        acc += g.scores.double() * len(idx)
        clean += g.metadata["metric_clean"] * len(idx)
    expected = (acc / N).float()
    for g in graphs:
        assert torch.equal(g.scores.isnan(), expected.isnan())
        assert torch.equal(g.scores.nan_to_num(), expected.nan_to_num())
        assert g.metadata["n_prompts"] == N and g.metadata["metric_clean"] == clean / N
    assert (tmp_path / "e3" / "graph.json").is_file()
    whole = run(EdgeAttributionJob(SPEC, pairs, batch_size=N), tmp_path / "whole", model)
    ref = eap(model, torch.tensor(pairs.clean), torch.tensor(pairs.corrupted),
              LogitDiff(torch.tensor(pairs.answer), torch.tensor(pairs.distractor)))
    assert torch.equal(whole.scores.nan_to_num(), ref.scores.nan_to_num())
    # measured 1.8e-7 (scores up to 0.23), bound 2e-6: 11x
    torch.testing.assert_close(graphs[0].scores, ref.scores, rtol=0, atol=2e-6, equal_nan=True)


# --- eval -----------------------------------------------------------------------------------------------
def test_eval_is_exact_and_split_independent(model, tmp_path):
    pairs = make_pairs([5, 6, 5, 6, 5, 5, 5], seed=7)
    results = [run(EvalJob(SPEC, pairs, batch_size=2, shard_size=s), tmp_path / f"v{s}", model) for s in (2, 4, 8)]
    assert results[0] == results[1] == results[2]
    assert json.loads((tmp_path / "v2" / "eval.json").read_text()) == results[0]
    nll, tokens, answer_nll, diffs, top1 = [], 0, [], [], 0
    with torch.no_grad():
        for i in range(len(pairs)):  # one prompt at a time: an independent batching
            row = torch.tensor([pairs.clean[i]])
            logits = model(row)
            nll.append(F.cross_entropy(logits[0, :-1].double(), row[0, 1:], reduction="sum").item())
            tokens += row.shape[1] - 1
            answer_nll.append(F.cross_entropy(logits[0, -1:].double(), torch.tensor([pairs.answer[i]])).item())
            diffs.append((logits[0, -1, pairs.answer[i]] - logits[0, -1, pairs.distractor[i]]).item())
            top1 += int(logits[0, -1].argmax()) == pairs.answer[i]
    r = results[0]
    assert r["n_prompts"] == 7 and r["lm_tokens"] == tokens == 5 * 4 + 2 * 5
    # measured 1.6e-8 (lm_loss 4.56) and 1.8e-8 (answer_loss 4.64): float32 log-softmax in batches of 2 vs a
    # float64 cross-entropy one prompt at a time; bound 2e-7: 11x
    assert abs(r["lm_loss"] - math.fsum(nll) / tokens) < 2e-7
    assert abs(r["answer_loss"] - sum(answer_nll) / 7) < 2e-7
    # measured 1.9e-7 (logit diffs up to 4.3), bound 2e-6: 11x
    assert abs(r["logit_diff"] - sum(diffs) / 7) < 2e-6
    assert r["accuracy_top1"] == top1 / 7 and r["accuracy_logit_diff"] == sum(d > 0 for d in diffs) / 7

    texts_only = PromptPairs(pairs.clean)  # no answers: the language-model loss alone
    loss_only = run(EvalJob(SPEC, texts_only, batch_size=2), tmp_path / "texts", model)
    assert loss_only == {"n_prompts": 7, "prompt": "clean", "lm_tokens": tokens, "lm_loss": r["lm_loss"]}
    big = PromptPairs([[1, 2, VOCAB]], [[1, 3, 4]], [5], [6])
    with pytest.raises(ValueError, match=r"pair 0: clean token id 37 is outside \[0, d_vocab=37\)"):
        run(EvalJob(SPEC, big), tmp_path / "big", model)


# --- the command line, on the shipped model ---------------------------------------------------------------
AUSTEN_PAIRS = [("Elizabeth and Darcy walked to the house, and Darcy spoke to", " Elizabeth", " Darcy"),
                ("Jane and Bingley sat by the fire, and Bingley smiled at", " Jane", " Bingley"),
                ("Emma and Harriet went into the garden, and Harriet looked at", " Emma", " Harriet"),
                ("Anne and Wickham stood at the door, and Wickham spoke to", " Anne", " Wickham")]


def austen_pairs(path: Path, answer_override=None) -> Path:
    with open(path, "w") as f:
        for clean, answer, distractor in AUSTEN_PAIRS:
            corrupted = clean[::-1].replace(distractor[::-1], answer[::-1], 1)[::-1]  # the last mention swapped
            f.write(json.dumps({"clean": clean, "corrupted": corrupted, "answer": answer_override or answer,
                                "distractor": distractor}) + "\n")
    return path


def test_cli_sweep_attribute_evaluate_on_glassbox_austen(tmp_path, capsys):
    from safetensors.torch import load_file

    from glassbox.cli import main
    from glassbox.weights import from_pretrained

    pairs_file = austen_pairs(tmp_path / "pairs.jsonl")
    assert main(["sweep", "--model", "glassbox-austen", "--pairs", str(pairs_file), "--activation", "resid_pre",
                 "--axes", "layer,pos", "--out", str(tmp_path / "sweep"), "--batch-size", "2",
                 "--shard-size", "2"]) == 0
    out, err = capsys.readouterr()
    assert "resid_pre over 4 pairs, metric logit diff" in out
    assert "shards 2/2" in err and "tok/s" in err  # the progress bar: tokens/s and shards done
    model = from_pretrained("glassbox-austen")
    tokens = model.tokenizer
    pairs = load_pairs(pairs_file, tokens)
    assert len(set(pairs.lengths())) == 1  # one length: a position axis is allowed
    assert [sum(a != b for a, b in zip(c, k)) for c, k in zip(pairs.clean, pairs.corrupted)] == [1, 1, 1, 1]
    per_pair, clean_m, _ = sweep_oracle(model, pairs, [[0, 1], [2, 3]])
    saved = load_file(str(tmp_path / "sweep" / "result.safetensors"))
    assert torch.equal(saved["per_prompt"], per_pair) and torch.equal(saved["mean"], per_pair.mean(-1))
    assert torch.equal(saved["clean"], clean_m)
    summary = json.loads((tmp_path / "sweep" / "result.json").read_text())
    assert summary["labels"]["pos"] == [str(t) for t in model.to_str_tokens(torch.tensor(pairs.corrupted[0]))]
    assert summary["n_prompts"] == 4 and summary["axes"] == ["layer", "pos"]

    assert main(["attribute", "--model", "glassbox-austen", "--pairs", str(pairs_file), "--method", "EAP",
                 "--out", str(tmp_path / "eap"), "--batch-size", "4", "--no-progress"]) == 0
    ref = eap(model, torch.tensor(pairs.clean), torch.tensor(pairs.corrupted),
              LogitDiff(torch.tensor(pairs.answer), torch.tensor(pairs.distractor)))
    from glassbox.interp.attribution import Graph

    graph = Graph.load_json(tmp_path / "eap" / "graph.json")
    assert torch.equal(graph.scores.nan_to_num(), ref.scores.nan_to_num())
    assert "EAP over 4 pairs" in capsys.readouterr().out

    assert main(["evaluate", "--model", "glassbox-austen", "--pairs", str(pairs_file), "--out",
                 str(tmp_path / "eval"), "--no-progress"]) == 0
    result = json.loads((tmp_path / "eval" / "eval.json").read_text())
    with torch.no_grad():
        last = model(torch.tensor(pairs.clean))[:, -1]
    answer, distractor = torch.tensor(pairs.answer)[:, None], torch.tensor(pairs.distractor)[:, None]
    diffs = last.gather(-1, answer) - last.gather(-1, distractor)
    # the same batch of 4 in both: only the float64 summation order may differ; measured 0 (diffs up to 3.7),
    # bound 1e-12
    assert abs(result["logit_diff"] - diffs.double().mean().item()) < 1e-12
    assert result["accuracy_logit_diff"] == (diffs > 0).double().mean().item()

    # resume of a finished job computes nothing and gives the same result
    assert main(["sweep", "--model", "glassbox-austen", "--pairs", str(pairs_file), "--activation", "resid_pre",
                 "--out", str(tmp_path / "sweep"), "--batch-size", "2", "--shard-size", "2", "--resume",
                 "--no-progress"]) == 0
    assert torch.equal(load_file(str(tmp_path / "sweep" / "result.safetensors"))["mean"], saved["mean"])
    capsys.readouterr()


def test_cli_refusals_name_the_pair_and_the_flag(tmp_path, capsys):
    from glassbox.cli import main

    bad = austen_pairs(tmp_path / "bad.jsonl", answer_override=" Elizabethan")
    code = main(["sweep", "--model", "glassbox-austen", "--pairs", str(bad), "--activation", "resid_pre",
                 "--out", str(tmp_path / "x"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "bad.jsonl line 1: answer ' Elizabethan' is" in err and "not one" in err
    good = austen_pairs(tmp_path / "good.jsonl")
    assert main(["sweep", "--model", "glassbox-austen", "--pairs", str(good), "--activation", "resid_pre",
                 "--out", str(tmp_path / "y"), "--workers", "2"]) == 2
    assert "--workers needs --ray" in capsys.readouterr().err
    assert main(["attribute", "--model", "glassbox-austen", "--pairs", str(good), "--method", "atp",
                 "--out", str(tmp_path / "z")]) == 2
    assert "give --activation" in capsys.readouterr().err


# --- Ray ------------------------------------------------------------------------------------------------------
def test_two_ray_workers_equal_in_process(model, pairs, tmp_path):
    pytest.importorskip("ray")
    pytest.importorskip("glassbox.scale.ray_backend")
    from glassbox.weights import save_pretrained

    save_pretrained(model, tmp_path / "model")
    spec = {"name_or_path": str(tmp_path / "model"), "device": "cpu", "dtype": "float32"}
    job = SweepJob(spec, pairs, "resid_pre", ("layer", "pos"), batch_size=2, shard_size=2)
    local = run_job(job, tmp_path / "local", progress=False)  # builds its model from the spec, like the workers
    on_ray = run_job(job, tmp_path / "ray", backend="ray", n_workers=2, progress=False)
    assert torch.equal(on_ray.per_prompt.values, local.per_prompt.values)
    assert torch.equal(on_ray.mean.values, local.mean.values) and torch.equal(on_ray.clean, local.clean)
    entries = load_manifest(tmp_path / "ray")["shards"].values()
    assert len(entries) == 4 and all(e["worker"].startswith("ray:") for e in entries)  # computed by Ray actors
    assert {e["worker"] for e in load_manifest(tmp_path / "local")["shards"].values()} == {"local"}
