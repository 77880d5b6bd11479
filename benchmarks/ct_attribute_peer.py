"""circuit-tracer's ``attribute``, timed: the peer of glassbox's attribution-graph benchmark.

    .ctenv/bin/python benchmarks/ct_attribute_peer.py [--backend transformer_lens|glassbox]
        [--pos 64] [--d-transcoder 4096] [--active-per-token 8] [--max-feature-nodes N]
        [--batch-size 256] [--threads 1] [--rounds 3] [--shape small|tiny] [--device cpu]

Run in the circuit-tracer environment (``bash .ci/ct_env .ctenv``), one fresh process per
measurement; prints one JSON object. The model is a seeded random ``GPT2LMHeadModel`` of GPT-2 small's
shape (12 layers, d_model 768, 12 heads, GPT-2's vocabulary; ``--shape tiny`` for a quick check), given
to circuit-tracer's TransformerLens backend on real TransformerLens 3.2.1 (built as ``dump_graph.py``
builds it) or, with ``--backend glassbox``, on glassbox.tl. The transcoders are 12 seeded random
per-layer ReLU transcoders of ``--d-transcoder`` features reading ``hook_resid_mid``; each encoder
bias is set from a calibration forward on the prompt so that on average ``--active-per-token``
features fire per layer and position, making the number of active features a knob (the graph's size
and attribution's cost follow it). The prompt is ``--pos`` seeded random tokens (circuit-tracer adds
BOS). ``--max-feature-nodes`` passes circuit-tracer's own cap on the features it attributes (default:
all active features).

Reported: ``seconds`` (each round's ``attribute`` wall time and their median), ``peak_rss_bytes``
(the process's peak resident memory during the timed calls only: ``VmHWM`` after resetting it through
``/proc/self/clear_refs`` once the model and transcoders are built), ``rss_before_bytes`` (resident
memory before them), on CUDA ``peak_cuda_bytes`` (``max_memory_allocated`` during them), the graph's
sizes (active features, selected features, logit nodes, nodes) and the versions. Threads:
``torch.set_num_threads(--threads)``, so peers compare on the same count.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {"small": (12, 768, 12), "tiny": (2, 64, 4)}  # n_layer, d_model, n_head
VOCAB = 50257


def vm_hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def vm_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("transformer_lens", "glassbox"), default="transformer_lens")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="small")
    parser.add_argument("--pos", type=int, default=64)
    parser.add_argument("--d-transcoder", type=int, default=4096)
    parser.add_argument("--active-per-token", type=float, default=8.0)
    parser.add_argument("--max-feature-nodes", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("pos", "d_transcoder", "batch_size", "threads", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0 < args.active_per_token <= args.d_transcoder:
        parser.error(f"--active-per-token must be in (0, d_transcoder], got {args.active_per_token}")
    return args


def build_hf(shape: str, seed: int, folder: Path, device):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    n_layer, d_model, n_head = SHAPES[shape]
    config = GPT2Config(vocab_size=VOCAB, n_positions=1024, n_ctx=1024, n_embd=d_model, n_layer=n_layer,
                        n_head=n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    config.architectures = ["GPT2LMHeadModel"]
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).eval().to(device)
    config.save_pretrained(folder)  # TransformerLens reads the architecture from the folder's config
    return model


def build_model(args, hf_model, folder: Path, transcoders):
    import torch

    device = torch.device(args.device)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests_ct"))
    if args.backend == "glassbox":
        from circuit_tracer import ReplacementModel

        from ct_fixtures import gpt2_tokenizer

        return ReplacementModel.from_pretrained_and_transcoders("gpt2", transcoders, backend="transformerlens",
                                                                device=device, dtype=torch.float32,
                                                                hf_model=hf_model, tokenizer=gpt2_tokenizer())
    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
    from transformer_lens import loading_from_pretrained as loading

    from ct_fixtures import gpt2_tokenizer

    cfg = loading.get_pretrained_model_config(str(folder), hf_cfg=hf_model.config.to_dict(), fold_ln=False,
                                              device=device, dtype=torch.float32)
    state_dict = loading.get_pretrained_state_dict(str(folder), cfg, hf_model, dtype=torch.float32)
    model = TransformerLensReplacementModel(cfg, gpt2_tokenizer(), move_to_device=False)
    model.load_and_process_state_dict(state_dict, fold_ln=False, center_writing_weights=False,
                                      center_unembed=False, fold_value_biases=True)
    model.move_model_modules_to_device()
    model._configure_replacement_model(transcoders)
    return model


def build_transcoders(args, hf_model, tokens):
    """Seeded random per-layer transcoders whose encoder biases make about ``active_per_token``
    features fire per layer and position on ``tokens`` (each layer's threshold from its own inputs)."""
    import torch
    from circuit_tracer.transcoder.single_layer_transcoder import SingleLayerTranscoder, TranscoderSet

    n_layer, d_model, _ = SHAPES[args.shape]
    with torch.no_grad():
        hidden = hf_model(tokens[None], output_hidden_states=True)
    generator = torch.Generator().manual_seed(args.seed + 1)
    transcoders = {}
    for layer in range(n_layer):
        # resid_mid = resid_pre + attn_out: recomputed from transformers' block, the calibration input
        block = hf_model.transformer.h[layer]
        with torch.no_grad():
            resid_pre = hidden.hidden_states[layer][0]
            resid_mid = resid_pre + block.attn(block.ln_1(resid_pre)[None])[0][0]
        W_enc = torch.randn(args.d_transcoder, d_model, generator=generator) / d_model ** 0.5
        pre = resid_mid[1:].cpu() @ W_enc.T  # circuit-tracer zeroes position 0
        fraction = args.active_per_token / args.d_transcoder
        threshold = torch.quantile(pre.flatten().double(), 1 - fraction).float()
        tc = SingleLayerTranscoder(d_model, args.d_transcoder, torch.nn.functional.relu, layer,
                                   device=torch.device("cpu"), dtype=torch.float32)
        with torch.no_grad():
            tc.W_enc.copy_(W_enc)
            tc.b_enc.fill_(-float(threshold))
            tc.W_dec.copy_(torch.randn(args.d_transcoder, d_model, generator=generator) * 0.02)
            tc.b_dec.zero_()
        transcoders[layer] = tc
    return TranscoderSet(transcoders, feature_input_hook="hook_resid_mid", feature_output_hook="hook_mlp_out",
                         scan="benchmark-random")


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.backend == "glassbox":
        import glassbox.tl

        glassbox.tl.as_transformer_lens()
    import torch

    torch.set_num_threads(args.threads)
    from importlib.metadata import version

    from circuit_tracer import attribute

    device = torch.device(args.device)
    rss_start = vm_rss()
    tokens = torch.randint(0, VOCAB - 1, (args.pos,), generator=torch.Generator().manual_seed(args.seed + 2))
    with tempfile.TemporaryDirectory() as folder:
        hf_model = build_hf(args.shape, args.seed, Path(folder), device)
        transcoders = build_transcoders(args, hf_model, tokens.to(device))
        model = build_model(args, hf_model, Path(folder), transcoders)
    del hf_model
    import gc

    gc.collect()
    rss_before = vm_rss()
    peak_reset = reset_peak()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times, graph = [], None
    for _ in range(args.rounds):
        graph = None
        gc.collect()
        start = time.perf_counter()
        graph = attribute(tokens, model, batch_size=args.batch_size, max_feature_nodes=args.max_feature_nodes)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    out = dict(
        peer=f"circuit-tracer on {args.backend}", backend=args.backend, shape=args.shape, pos=args.pos,
        prompt_tokens=int(graph.n_pos), d_transcoder=args.d_transcoder, active_per_token=args.active_per_token,
        batch_size=args.batch_size, threads=args.threads, device=str(device), rounds=args.rounds,
        seconds=times, median_seconds=statistics.median(times),
        n_active_features=int(graph.active_features.shape[0]), n_selected_features=int(len(graph.selected_features)),
        n_logits=len(graph.logit_targets), n_nodes=int(graph.adjacency_matrix.shape[0]),
        rss_start_bytes=rss_start, rss_before_bytes=rss_before,
        peak_rss_bytes=vm_hwm() if peak_reset else None, peak_rss_note=None if peak_reset else
        "the kernel refused to reset VmHWM: peak over the whole process",
        versions={m: version(m) for m in ("circuit-tracer", "torch", "transformers")
                  + (("transformer-lens",) if args.backend == "transformer_lens" else ())},
        cpu=os.cpu_count(),
    )
    if not peak_reset:
        out["peak_rss_bytes"] = vm_hwm()
    if device.type == "cuda":
        out["peak_cuda_bytes"] = torch.cuda.max_memory_allocated()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
