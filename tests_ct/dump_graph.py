"""Dump circuit-tracer's attribution graph for a model folder, a transcoder folder and a prompt.

    python tests_ct/dump_graph.py MODEL_DIR TRANSCODER_DIR PROMPT OUT.pt
        [--backend glassbox|transformer_lens] [--token-ids] [--prune NODE,EDGE ...]
        [--max-n-logits 10] [--desired-logit-prob 0.95] [--batch-size 256]
        [--dtype float32|float64] [--frontend DIR]

Runs circuit-tracer 0.5's own ``ReplacementModel`` (TransformerLens backend) and ``attribute``,
unmodified, on one of two backends, in the circuit-tracer environment (``.ci/ct_env``):

- ``glassbox`` (default): ``glassbox.tl.as_transformer_lens()`` first, so circuit-tracer's
  ``HookedTransformer`` subclass is glassbox.tl's; the model is loaded from MODEL_DIR by glassbox
  (``from_pretrained(MODEL_DIR, ...)``, called by circuit-tracer itself).
- ``transformer_lens``: the real TransformerLens (3.2.1 there), holding the same weights. Its
  ``HookedTransformer.from_pretrained`` refuses a folder (it looks the name up among its official
  models), so the model is built by the steps ``from_pretrained`` takes, with TransformerLens's own
  loaders (which read folders): ``get_pretrained_model_config(MODEL_DIR)``, the class's constructor,
  ``get_pretrained_state_dict`` and ``load_and_process_state_dict`` with circuit-tracer's arguments,
  then circuit-tracer's ``_configure_replacement_model``, as ``from_pretrained_and_transcoders`` does.

TRANSCODER_DIR is circuit-tracer's layout (``config.yaml`` + ``layer_N.safetensors``, or a cross-layer
``W_enc_N`` / ``W_dec_N`` folder), read by circuit-tracer's loaders (``ct_fixtures.load_transcoders``).
PROMPT is text, or with ``--token-ids`` comma-separated token ids (circuit-tracer prepends BOS unless
the first id is a special token).

OUT.pt (``torch.save`` of a dict of tensors, lists and numbers; read with ``weights_only=True``):

- ``adjacency_matrix`` [n_nodes n_nodes]: rows are targets, columns sources (circuit-tracer's).
- nodes in circuit-tracer's order: the selected features (``active_features[selected_features]``,
  sorted by (layer, pos, feature)), then error nodes layer-major (layer * n_pos + pos), then one
  token-embedding node per position, then the logit nodes. ``node_kind`` (list of "feature", "error",
  "embedding", "logit"), ``node_layer`` (n_layers for logits, -1 for embeddings), ``node_pos``
  (n_pos - 1 for logits), ``node_index`` (feature index, token id of the embedding or logit; -1 for
  errors) are tensors/lists of length n_nodes.
- ``active_features`` [n_active 3] (layer, pos, feature), ``activation_values`` [n_active],
  ``selected_features`` [n_selected] (indices into active_features), ``input_tokens`` [n_pos],
  ``logit_token_ids`` [n_logits], ``logit_probabilities`` [n_logits], ``n_layers``, ``n_pos``.
- ``pruning``: {"NODE,EDGE": {"node_mask" [n_nodes], "edge_mask" [n_nodes n_nodes],
  "cumulative_scores" [n_nodes]}} from circuit-tracer's ``prune_graph`` at each ``--prune`` pair
  (default 0.8,0.98, circuit-tracer's defaults).
- ``graph_scores``: circuit-tracer's (replacement score, completeness score).
- ``backend``, ``versions`` (circuit-tracer, transformers, torch, and transformer_lens or glassbox).

``--frontend DIR`` also writes circuit-tracer's frontend files (``create_graph_files``) there.
``last_logits`` [d_vocab] holds the replacement model's own logits at the last position (its dtype).

``dump_graph.py --cases FILE.json [options]`` runs many cases in one process (imports are most of a
run's time): FILE.json is a list of {"model_dir", "transcoder_dir", "prompt", "out"} with optional
"token_ids" (true: prompt is a list of ids), "frontend" and "dtype"; the options apply to all.
"""

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("transcoder_dir")
    parser.add_argument("prompt")
    parser.add_argument("out")
    parser.add_argument("--backend", choices=("glassbox", "transformer_lens"), default="glassbox")
    parser.add_argument("--token-ids", action="store_true", help="PROMPT is comma-separated token ids")
    parser.add_argument("--prune", action="append", default=None, metavar="NODE,EDGE",
                        help="pruning thresholds (repeatable; default 0.8,0.98)")
    parser.add_argument("--max-n-logits", type=int, default=10)
    parser.add_argument("--desired-logit-prob", type=float, default=0.95)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--frontend", default=None, help="write circuit-tracer's frontend files here")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    pairs = []
    for text in args.prune or ["0.8,0.98"]:
        try:
            node, edge = (float(part) for part in text.split(","))
        except ValueError:
            parser.error(f"--prune takes NODE,EDGE (two numbers), got {text!r}")
        pairs.append((node, edge))
    args.prune = pairs
    if args.token_ids:
        try:
            args.prompt = [int(part) for part in args.prompt.split(",")]
        except ValueError:
            parser.error(f"--token-ids: PROMPT must be comma-separated integers, got {args.prompt!r}")
    return args


def load_replacement_model(backend: str, model_dir: str, transcoders, dtype):
    """circuit-tracer's ReplacementModel on ``backend``, holding MODEL_DIR's weights."""
    import torch
    from circuit_tracer import ReplacementModel

    device = torch.device("cpu")
    if backend == "glassbox":
        return ReplacementModel.from_pretrained_and_transcoders(model_dir, transcoders, backend="transformerlens",
                                                                device=device, dtype=dtype)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformer_lens import loading_from_pretrained as loading
    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel

    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # TransformerLens 3.2.1's HookedTransformer.from_pretrained looks every name up among its official
    # models first, so a folder is refused there, though its loaders read folders. These are the steps
    # from_pretrained takes, with TransformerLens's own loaders and circuit-tracer's own arguments
    # (fold_ln, center_writing_weights, center_unembed off; fold_value_biases at its default, on),
    # then what circuit-tracer's from_pretrained_and_transcoders does after from_pretrained.
    cfg = loading.get_pretrained_model_config(model_dir, hf_cfg=hf_model.config.to_dict(), fold_ln=False,
                                              device=device, dtype=dtype)
    state_dict = loading.get_pretrained_state_dict(model_dir, cfg, hf_model, dtype=dtype)
    model = TransformerLensReplacementModel(cfg, tokenizer, move_to_device=False)
    model.load_and_process_state_dict(state_dict, fold_ln=False, center_writing_weights=False,
                                      center_unembed=False, fold_value_biases=True)
    model.move_model_modules_to_device()
    model._configure_replacement_model(transcoders)
    return model


def node_table(graph):
    """(kind, layer, pos, index) lists for circuit-tracer's node order (see the module docstring)."""
    n_layers, n_pos = graph.cfg.n_layers, graph.n_pos
    kinds, layers, positions, indices = [], [], [], []
    for layer, pos, feature in graph.active_features[graph.selected_features].tolist():
        kinds.append("feature"), layers.append(layer), positions.append(pos), indices.append(feature)
    for layer in range(n_layers):
        for pos in range(n_pos):
            kinds.append("error"), layers.append(layer), positions.append(pos), indices.append(-1)
    for pos, token in enumerate(graph.input_tokens.tolist()):
        kinds.append("embedding"), layers.append(-1), positions.append(pos), indices.append(token)
    for token in graph.logit_token_ids.tolist():
        kinds.append("logit"), layers.append(n_layers), positions.append(n_pos - 1), indices.append(token)
    return kinds, layers, positions, indices


def setup_backend(backend: str, threads: int) -> dict:
    """Import what ``backend`` needs, glassbox.tl registered as ``transformer_lens`` first for
    "glassbox"; returns the versions in use."""
    versions = {}
    if backend == "glassbox":
        import glassbox.tl

        glassbox.tl.as_transformer_lens()  # before circuit_tracer imports transformer_lens
        versions["glassbox"] = str(Path(glassbox.tl.__file__).parents[1])
    import torch

    torch.set_num_threads(threads)
    from importlib.metadata import version

    for name in ("circuit-tracer", "transformers", "torch") + (("transformer-lens",) if backend != "glassbox" else ()):
        versions[name] = version(name)
    return versions


def dump(args, versions: dict) -> dict:
    """circuit-tracer's graph for one (model, transcoders, prompt), as the dict OUT.pt holds."""
    import torch
    from circuit_tracer import attribute
    from circuit_tracer.graph import compute_graph_scores, prune_graph

    sys.path.insert(0, str(HERE))
    from ct_fixtures import load_transcoders

    dtype = getattr(torch, args.dtype)
    transcoders = load_transcoders(args.transcoder_dir, dtype=dtype)
    model = load_replacement_model(args.backend, args.model_dir, transcoders, dtype)
    graph = attribute(args.prompt, model, max_n_logits=args.max_n_logits,
                      desired_logit_prob=args.desired_logit_prob, batch_size=args.batch_size)
    kinds, layers, positions, indices = node_table(graph)
    pruning = {}
    for node_threshold, edge_threshold in args.prune:
        node_mask, edge_mask, scores = prune_graph(graph, node_threshold, edge_threshold)
        pruning[f"{node_threshold},{edge_threshold}"] = dict(node_mask=node_mask, edge_mask=edge_mask,
                                                             cumulative_scores=scores)
    with torch.no_grad():
        logits = model(graph.input_tokens.unsqueeze(0))[0, -1].cpu()
    out = dict(
        backend=args.backend, versions=versions, adjacency_matrix=graph.adjacency_matrix,
        node_kind=kinds, node_layer=torch.tensor(layers), node_pos=torch.tensor(positions),
        node_index=torch.tensor(indices), active_features=graph.active_features,
        activation_values=graph.activation_values, selected_features=graph.selected_features,
        input_tokens=graph.input_tokens.cpu(), logit_token_ids=graph.logit_token_ids.cpu(),
        logit_probabilities=graph.logit_probabilities.cpu(), n_layers=graph.cfg.n_layers, n_pos=graph.n_pos,
        pruning=pruning, graph_scores=tuple(float(s) for s in compute_graph_scores(graph)),
        last_logits=logits,
    )
    if args.frontend is not None:
        from circuit_tracer.utils import create_graph_files

        create_graph_files(graph, slug="graph", output_path=args.frontend, scan=graph.scan or "local")
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--cases"]:
        # --cases FILE.json [options]: one process for many cases (imports take most of a run's time);
        # FILE.json is a list of {"model_dir", "transcoder_dir", "prompt", "out", optional "token_ids",
        # "frontend", "dtype"}; the options apply to every case.
        import json

        cases = json.loads(Path(argv[1]).read_text())
        runs = []
        for case in cases:
            prompt = ",".join(str(t) for t in case["prompt"]) if case.get("token_ids") else case["prompt"]
            extra = ["--token-ids"] if case.get("token_ids") else []
            extra += ["--frontend", case["frontend"]] if case.get("frontend") else []
            extra += ["--dtype", case["dtype"]] if case.get("dtype") else []
            runs.append(parse_args([case["model_dir"], case["transcoder_dir"], prompt, case["out"], *extra, *argv[2:]]))
    else:
        runs = [parse_args(argv)]
    versions = setup_backend(runs[0].backend, runs[0].threads)
    import torch

    for args in runs:
        torch.save(dump(args, versions), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
