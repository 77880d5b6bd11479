"""The tutorials under docs/tutorials/ run top to bottom in a Jupyter kernel, and the numbers they
print are the numbers an independent computation gives.

Each notebook is executed by nbclient (an ipykernel kernel, cwd a temporary folder, this process's
environment, so the glassbox imported is this checkout's) and its printed lines are parsed. The
oracle is the shipped model run by ``transformers`` alone, with patches and ablations redone as plain
PyTorch hooks (``tests/hf_oracle.py``), and the SAE's encoder written out from its safetensors file.
Printed values have 3 to 4 decimals, so each bound is the rounding (half the last digit) plus the
float error measured between the two computations, with headroom (written beside it).

The notebooks are stored without outputs: outputs would hold numbers that go stale silently and
bloat every diff; this test recomputes and checks them on every run, and the documentation site
shows the code and prose (docs/index.md says how to run them).
"""

import ast
import os
import re
from pathlib import Path

import pytest
import torch

from hf_oracle import (BOS, head_slice, hf_model, hf_tokenizer, logit_diff, recorded_input, replaced_input,
                       sae_weights, token_id, tokens_of, topk_encode)

TUTORIALS = Path(__file__).resolve().parent.parent / "docs" / "tutorials"
PROMPT = "Elizabeth read the letter, and Elizabeth read the"
CORRUPTED = "Elizabeth read the garden, and Elizabeth read the"
NUMBER = r"([-+]?\d+\.\d+(?:e[-+]?\d+)?)"


def run_notebook(name: str, folder: Path) -> str:
    """Execute ``name`` and return everything its code cells printed (stdout), in order."""
    try:
        import nbformat
        from nbclient import NotebookClient
    except ImportError as err:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI is set but the docs extra is missing ({err}): install with pip install -e '.[docs]'")
        pytest.skip(f"the tutorials need the docs extra (pip install -e '.[docs]'): {err}")
    nb = nbformat.read(TUTORIALS / name, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{name} is stored with outputs"
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                   if o.output_type == "stream" and o.name == "stdout")


def numbers(pattern: str, text: str) -> list:
    """Every match of ``pattern`` (its NUMBER groups as floats, one tuple per match)."""
    found = re.findall(pattern, text)
    assert found, f"no line matches {pattern!r} in:\n{text}"
    return [tuple(float(g) for g in (m if isinstance(m, tuple) else (m,))) for m in found]


def row_of(pattern: str, text: str) -> list:
    """The floats of the one line that starts with ``pattern``."""
    line = re.search(pattern + r"(.*)", text)
    assert line, f"no line matches {pattern!r} in:\n{text}"
    return [float(v) for v in line.group(1).split()]


@pytest.fixture(scope="module")
def hf():
    return hf_model(), hf_tokenizer()


def test_the_list_of_tutorials():
    assert sorted(p.name for p in TUTORIALS.glob("*.ipynb")) == [
        "01_parity_and_attention.ipynb", "02_activation_patching.ipynb", "03_sae_features.ipynb",
        "04_circuits_attribution.ipynb"]


def previous_scores(pattern: torch.Tensor) -> torch.Tensor:
    """[head]: mean over queries 1.. of the attention on the key just before (a hand computation)."""
    pos = pattern.shape[-1]
    return torch.stack([pattern[:, q, q - 1] for q in range(1, pos)]).mean(0)


def induction_scores(pattern: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[head] from [batch head q k] on BOS + a segment of distinct tokens twice: the attention of each
    query of the second half on the key after its first occurrence (q - seq_len + 1), averaged."""
    queries = range(1 + seq_len, 1 + 2 * seq_len)
    return torch.stack([pattern[:, :, q, q - seq_len + 1] for q in queries]).mean((0, 1))


def repeated_tokens() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    segments = torch.stack([torch.randperm(4000, generator=generator)[:20] + 50 for _ in range(4)])
    return torch.cat([torch.full((4, 1), BOS), segments, segments], dim=1)


def test_parity_and_attention_tour(tmp_path, hf):
    model, tok = hf
    out = run_notebook("01_parity_and_attention.ipynb", tmp_path)
    assert "2 layers, 3 heads, d_model 192, vocabulary 4096, context 128" in out
    (worst,), = numbers(r"largest \|difference\| over all stages: " + NUMBER, out)
    assert 0.0 <= worst < 5e-5, worst  # measured 5.7e-6 (logits up to 13)
    tokens = tokens_of(tok, PROMPT)
    with torch.no_grad():
        ref = model(tokens, output_attentions=True)
    printed = re.findall(r"next token (.+?): log-probability " + NUMBER, out)
    top = ref.logits[0, -1].log_softmax(-1).topk(5)
    assert [ast.literal_eval(t) for t, _ in printed] == [tok.decode([i]) for i in top.indices.tolist()]
    for (_, value), expected in zip(printed, top.values.tolist()):
        # rounding 5e-5; logits agree within 5.7e-6 (parity report)
        assert abs(float(value) - expected) <= 1e-4, (value, expected)
    pattern = ref.attentions[1][0]  # [head q k]
    for head, key, weight in numbers(r"layer 1 head (\d) at the last position attends most to position (\d+) "
                                     r"\(.*?, weight " + NUMBER + r"\)", out):
        assert int(key) == pattern[int(head), -1].argmax().item()
        # rounding 5e-5; patterns agree within 2.8e-7
        assert abs(weight - pattern[int(head), -1, int(key)].item()) <= 1e-4
    for layer in range(2):
        scores = previous_scores(ref.attentions[layer][0])
        assert row_of(f"previous-token scores, layer {layer}: ", out) == pytest.approx(scores.tolist(), abs=1e-4)
    repeated = repeated_tokens()
    with torch.no_grad():
        rep = model(repeated, output_attentions=True, labels=repeated)
    for layer in range(2):
        scores = induction_scores(rep.attentions[layer], 20)
        assert row_of(f"induction scores, layer {layer}: ", out) == pytest.approx(scores.tolist(), abs=1e-4)
    assert induction_scores(rep.attentions[1], 20)[0] > 0.7  # head 1.0 is the induction head (card: 0.82)
    losses = torch.nn.functional.cross_entropy(rep.logits[:, :-1].transpose(1, 2), repeated[:, 1:], reduction="none")
    first, second = numbers(r"loss on the first half " + NUMBER + r", on the repeat " + NUMBER, out)[0]
    assert abs(first - losses[:, :20].mean().item()) <= 1e-3 and abs(second - losses[:, 20:].mean().item()) <= 1e-3

    def zero_head_2(z):
        z = z.clone()
        z[..., head_slice(model, 2)] = 0.0
        return z

    with replaced_input(model.transformer.h[0].attn.c_proj, zero_head_2), torch.no_grad():
        knocked = model(repeated, output_attentions=True)
    (score,), = numbers(r"induction score of head 1.0 with head 0.2 zeroed: " + NUMBER, out)
    assert abs(score - induction_scores(knocked.attentions[1], 20)[0].item()) <= 1e-4
    assert score < 0.1  # measured 0.009: the induction head reads from head 0.2
    knocked_loss = torch.nn.functional.cross_entropy(knocked.logits[:, :-1].transpose(1, 2), repeated[:, 1:],
                                                     reduction="none")[:, 20:].mean().item()
    (printed_loss,), = numbers(r"loss on the repeat with head 0.2 zeroed: " + NUMBER, out)
    assert abs(printed_loss - knocked_loss) <= 1e-3
    page = (tmp_path / "attention.html").read_text()
    assert "<script src=" not in page and "Plotly" in page  # one offline page, plotly.js inlined


def test_activation_patching_study(tmp_path, hf):
    model, tok = hf
    out = run_notebook("02_activation_patching.ipynb", tmp_path)
    clean, corrupted = tokens_of(tok, PROMPT), tokens_of(tok, CORRUPTED)
    answer, distractor = token_id(tok, " letter"), token_id(tok, " garden")
    with torch.no_grad():
        clean_out = model(clean, output_hidden_states=True)
        clean_ld = logit_diff(clean_out.logits, answer, distractor).item()
        corrupted_ld = logit_diff(model(corrupted).logits, answer, distractor).item()
    (printed_clean,), = numbers(r"logit difference, clean: " + NUMBER, out)
    (printed_corrupted,), = numbers(r"logit difference, corrupted: " + NUMBER, out)
    # measured 8.2392, -0.3449
    assert abs(printed_clean - clean_ld) <= 1e-4 and abs(printed_corrupted - corrupted_ld) <= 1e-4

    def normalized(logits):
        return (logit_diff(logits, answer, distractor).item() - corrupted_ld) / (clean_ld - corrupted_ld)

    pos = clean.shape[1]
    for layer in range(2):
        expected = []
        for p in range(pos):
            def put(x, p=p):
                x = x.clone()
                x[:, p] = clean_out.hidden_states[layer][:, p]
                return x

            with replaced_input(model.transformer.h[layer], put), torch.no_grad():
                expected.append(normalized(model(corrupted).logits))
        # rounding 5e-5; logits agree within 5.7e-6, normalised by a gap of 8.6
        assert row_of(f"resid_pre layer {layer}: ", out) == pytest.approx(expected, abs=1e-4), layer
    for layer in range(2):
        c_proj = model.transformer.h[layer].attn.c_proj
        clean_z = recorded_input(model, c_proj, clean)
        expected = []
        for head in range(3):
            def put_head(z, s=head_slice(model, head)):
                z = z.clone()
                z[..., s] = clean_z[..., s]
                return z

            with replaced_input(c_proj, put_head), torch.no_grad():
                expected.append(normalized(model(corrupted).logits))
        assert row_of(f"head_z layer {layer}: ", out) == pytest.approx(expected, abs=1e-4), layer
    by_hand, sweep = numbers(r"by hand " + NUMBER + r", from the sweep " + NUMBER, out)[0]
    assert abs(by_hand - sweep) <= 2e-6  # one patch per forward = the batched engine (measured equal)
    last = row_of("resid_pre layer 1: ", out)[-1]
    assert abs(by_hand - last) <= 1e-4 and 0.1 < last < 0.4  # measured 0.2038


def test_sae_features(tmp_path, hf):
    model, tok = hf
    out = run_notebook("03_sae_features.ipynb", tmp_path)
    assert "spliced logits equal the clean model's, bit for bit: True" in out
    w = sae_weights()
    tokens = tokens_of(tok, PROMPT)
    answer, distractor = token_id(tok, " letter"), token_id(tok, " garden")
    with torch.no_grad():
        ref = model(tokens, output_hidden_states=True)
    x = ref.hidden_states[1][0]  # the residual stream entering block 1, [pos d_model]
    acts = topk_encode(x, w)
    assert row_of("features active per position: ", out.replace("[", "").replace("]", "").replace(",", "")) == \
        (acts > 0).sum(-1).tolist()
    printed = numbers(r"feature (\d+): activation " + NUMBER, out)
    top = acts[-1].topk(5)
    assert [int(f) for f, _ in printed] == top.indices.tolist()
    for (_, value), expected in zip(printed, top.values.tolist()):
        # rounding 5e-5; block 1's input agrees within 2.4e-7 (parity report)
        assert abs(value - expected) <= 1e-4, (value, expected)
    (rebuilt,), = numbers(r"max \|value - \(features \+ b_dec \+ error\)\|: " + NUMBER, out)
    assert rebuilt <= 1e-5  # measured 1.2e-7 on values up to 20
    recons = acts @ w["W_dec"] + w["b_dec"]
    xs, rs = x[1:], recons[1:]
    explained = 1 - ((xs - rs) ** 2).sum() / ((xs - xs.mean(0)) ** 2).sum()
    (printed_ev,), = numbers(r"explained variance on this prompt's 9 tokens after BOS: " + NUMBER, out)
    assert abs(printed_ev - explained.item()) <= 1e-3  # rounding 5e-4
    clean_ld = logit_diff(ref.logits, answer, distractor).item()
    effects = numbers(r"zeroing feature (\d+) everywhere changes the logit difference by " + NUMBER, out)
    assert [int(f) for f, _ in effects] == top.indices.tolist()
    for feature, effect in effects:
        f = int(feature)
        with replaced_input(model.transformer.h[1], lambda h: h - acts[:, f, None] * w["W_dec"][f]), torch.no_grad():
            expected = logit_diff(model(tokens).logits, answer, distractor).item() - clean_ld
        # rounding 5e-5; logits agree within 5.7e-6 (parity report)
        assert abs(effect - expected) <= 2e-4, (f, effect, expected)


def test_circuits_with_attribution(tmp_path, hf):
    model, _ = hf
    out = run_notebook("04_circuits_attribution.ipynb", tmp_path)
    generator = torch.Generator().manual_seed(0)
    clean, corrupted, b, c = [], [], [], []
    for _ in range(16):
        t = (torch.randperm(3900, generator=generator)[:19] + 100).tolist()
        clean.append([BOS, *t[4:9], t[0], t[1], *t[9:14], t[2], t[3], *t[14:19], t[0]])
        corrupted.append([BOS, *t[4:9], t[2], t[1], *t[9:14], t[0], t[3], *t[14:19], t[0]])
        b.append(t[1])
        c.append(t[3])
    clean, corrupted, b, c = torch.tensor(clean), torch.tensor(corrupted), torch.tensor(b), torch.tensor(c)
    with torch.no_grad():
        clean_m = logit_diff(model(clean).logits, b, c).mean().item()
        corrupted_m = logit_diff(model(corrupted).logits, b, c).mean().item()
    printed = numbers(r"mean logit difference, clean: " + NUMBER + r", corrupted: " + NUMBER, out)[0]
    assert printed == pytest.approx((clean_m, corrupted_m), abs=1e-4)  # measured 5.0874, -1.8226
    for layer in range(2):
        c_proj = model.transformer.h[layer].attn.c_proj
        clean_z = recorded_input(model, c_proj, clean)
        corrupted_z = recorded_input(model, c_proj, corrupted).requires_grad_(True)
        with replaced_input(c_proj, lambda z: corrupted_z):
            logit_diff(model(corrupted).logits, b, c).sum().backward()
        for head in range(3):
            s = head_slice(model, head)

            def put_head(z, s=s):
                z = z.clone()
                z[..., s] = clean_z[..., s]
                return z

            with replaced_input(c_proj, put_head), torch.no_grad():
                exact = logit_diff(model(corrupted).logits, b, c).mean().item()
            # AtP written out: metric(corrupted) + (clean - corrupted) . gradient, per prompt, averaged
            atp = corrupted_m + ((clean_z - corrupted_z.detach())[..., s] * corrupted_z.grad[..., s]).sum((1, 2)).mean()
            line = numbers(rf"head {layer}\.{head}: AtP " + NUMBER + r", exact " + NUMBER, out)[0]
            # rounding 5e-4; the two models' logits agree within 5.7e-6 (notebook 1's parity report)
            assert line == pytest.approx((atp.item(), exact), abs=1e-3), (layer, head, line, atp.item(), exact)
    curve = [(int(k), float(f)) for k, f in re.findall(r"top (\d+) edges: faithfulness " + NUMBER, out)]
    assert [k for k, _ in curve] == list(range(11)), out
    assert abs(curve[0][1]) <= 1e-3  # no edge = the corrupted run, by definition
    k = int(re.search(r"smallest circuit with faithfulness >= 0.9: (\d+) edges", out).group(1))
    assert k == 7 and 0.9 <= curve[7][1] <= 1.1, curve  # measured 0.981 (tests/test_induction_circuit.py: 0.982)
    nodes = re.search(r"its nodes: (.*)", out).group(1).split(", ")
    assert "a0.h2" in nodes and "a1.h0" in nodes  # the previous-token and induction heads (the model card)
    full, empty, circuit = numbers(r"full graph " + NUMBER + r", empty " + NUMBER + r", the 7-edge circuit " + NUMBER,
                                   out)[0]
    assert (full, empty) == pytest.approx((clean_m, corrupted_m), abs=1e-4)
    assert abs((circuit - empty) / (full - empty) - curve[7][1]) <= 2e-3
