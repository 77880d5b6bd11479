"""Fixtures for the circuit-tracer oracle tests: a seeded GPT-2-style model in a Hugging Face folder and
seeded transcoder sets in circuit-tracer's own on-disk layout, written by circuit-tracer's own classes.

Nothing here imports ``transformer_lens`` or ``glassbox``: the folders are written once, by
``transformers`` and circuit-tracer, and then read by both backends in their own processes (the
glassbox one registers glassbox.tl as ``transformer_lens``, which cannot share a process with the real
package).

- ``write_model(folder, seed)``: a ``GPT2LMHeadModel`` (GPT-2's vocabulary and tokenizer, distinct small
  sizes) with weights drawn at std 0.2 (GPT-2 uses 0.02) and every LayerNorm perturbed, so attention
  patterns are sharp and a wrong head, position or norm moves the graph by far more than rounding.
- ``write_transcoders(folder, model_folder, kind, seed)``: a per-layer set (``kind`` "relu" reading
  ``hook_resid_mid``, "jumprelu_skip" reading ``ln2.hook_normalized`` with skip connections) as
  ``layer_N.safetensors`` plus ``config.yaml`` (``model_kind: transcoder_set``, the hooks, the files);
  "clt" writes a cross-layer transcoder as ``W_enc_N`` / ``W_dec_N`` files (circuit-tracer's
  ``to_safetensors``) with ``model_kind: cross_layer_transcoder``. Encoder biases are chosen so that
  a fraction of the features fire on a typical input, so graphs have tens of feature nodes.
- ``load_transcoders(folder, device, dtype)``: circuit-tracer's loaders on such a folder (paths in
  ``config.yaml`` are relative to it).
"""

import os
from pathlib import Path

import torch

# GPT-2's d_mlp is 4 d_model (TransformerLens reads no n_inner for GPT-2).
D_MODEL, N_LAYERS, N_HEADS, N_CTX = 24, 3, 3, 64
D_TRANSCODER = 96
GPT2_VOCAB = 50257


def gpt2_tokenizer():
    """GPT-2's tokenizer from the files glassbox ships (no download; glassbox itself is not imported)."""
    from transformers import GPT2TokenizerFast

    root = Path(__file__).resolve().parents[1] / "glassbox" / "assets"
    candidates = [p.parent for p in root.rglob("vocab.json")]
    if not candidates:
        raise FileNotFoundError(f"no GPT-2 tokenizer files (vocab.json) under {root}")
    return GPT2TokenizerFast.from_pretrained(str(candidates[0]))


def write_model(folder, seed: int = 0) -> Path:
    """A seeded GPT-2-style model and its tokenizer in a Hugging Face folder; returns the folder."""
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = Path(folder)
    config = GPT2Config(vocab_size=GPT2_VOCAB, n_positions=N_CTX, n_embd=D_MODEL, n_layer=N_LAYERS,
                        n_head=N_HEADS, n_ctx=N_CTX, initializer_range=0.2, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new")
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".ln_" in name or name.startswith("transformer.ln_f"):
                param.add_(0.1 * torch.randn(param.shape, generator=generator))
            elif name.endswith(".bias"):
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))
    model.save_pretrained(folder, safe_serialization=True)
    gpt2_tokenizer().save_pretrained(folder)
    return folder


KINDS = {
    # kind: (feature_input_hook, activation, skip)
    "relu": ("hook_resid_mid", "relu", False),
    "jumprelu_skip": ("ln2.hook_normalized", "jumprelu", True),
}


def _encoder(generator, n_layers_in: int, d_model: int, d_transcoder: int, scale: float):
    W_enc = torch.randn(d_transcoder, d_model, generator=generator) * scale / d_model ** 0.5
    b_enc = -0.6 * scale + 0.1 * torch.randn(d_transcoder, generator=generator)
    return W_enc, b_enc


def write_transcoders(folder, kind: str = "relu", seed: int = 10, n_layers: int = N_LAYERS,
                      d_model: int = D_MODEL, d_transcoder: int = D_TRANSCODER) -> Path:
    """A seeded transcoder set in circuit-tracer's layout, written by circuit-tracer's classes."""
    import yaml

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    if kind == "clt":
        from circuit_tracer.transcoder.cross_layer_transcoder import CrossLayerTranscoder

        clt = CrossLayerTranscoder(n_layers=n_layers, d_transcoder=d_transcoder, d_model=d_model,
                                   activation_function="relu", lazy_decoder=False, device=torch.device("cpu"),
                                   dtype=torch.float32, feature_input_hook="hook_resid_mid",
                                   feature_output_hook="hook_mlp_out")
        with torch.no_grad():
            for layer in range(n_layers):
                W_enc, b_enc = _encoder(generator, 1, d_model, d_transcoder, 3.0)
                clt.W_enc[layer].copy_(W_enc)
                clt.b_enc[layer].copy_(b_enc)
                clt.b_dec[layer].copy_(0.05 * torch.randn(d_model, generator=generator))
                clt.W_dec[layer].copy_(0.2 * torch.randn(clt.W_dec[layer].shape, generator=generator))
        clt.to_safetensors(str(folder))
        config = dict(model_kind="cross_layer_transcoder", feature_input_hook="hook_resid_mid",
                      feature_output_hook="hook_mlp_out", scan="glassbox-test-clt")
    else:
        from circuit_tracer.transcoder.activation_functions import JumpReLU
        from circuit_tracer.transcoder.single_layer_transcoder import SingleLayerTranscoder, TranscoderSet

        input_hook, activation, skip = KINDS[kind]
        scale = 1.0 if input_hook == "ln2.hook_normalized" else 3.0
        transcoders = {}
        for layer in range(n_layers):
            W_enc, b_enc = _encoder(generator, 1, d_model, d_transcoder, scale)
            if activation == "jumprelu":
                function = JumpReLU(0.05 + 0.05 * torch.rand(d_transcoder, generator=generator), 0.1)
            else:
                function = torch.nn.functional.relu
            tc = SingleLayerTranscoder(d_model, d_transcoder, function, layer, skip_connection=skip,
                                       device=torch.device("cpu"), dtype=torch.float32)
            with torch.no_grad():
                tc.W_enc.copy_(W_enc)
                tc.b_enc.copy_(b_enc)
                tc.W_dec.copy_(0.2 * torch.randn(d_transcoder, d_model, generator=generator))
                tc.b_dec.copy_(0.05 * torch.randn(d_model, generator=generator))
                if skip:
                    tc.W_skip.copy_(0.05 * torch.randn(d_model, d_model, generator=generator))
            transcoders[layer] = tc
        TranscoderSet(transcoders, feature_input_hook=input_hook, feature_output_hook="hook_mlp_out",
                      scan=f"glassbox-test-{kind}").to_safetensors(str(folder))
        config = dict(model_kind="transcoder_set", feature_input_hook=input_hook,
                      feature_output_hook="hook_mlp_out", scan=f"glassbox-test-{kind}",
                      transcoders=[f"layer_{layer}.safetensors" for layer in range(n_layers)])
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return folder


def load_transcoders(folder, device=torch.device("cpu"), dtype=torch.float32):
    """circuit-tracer's loaders on a folder of ``write_transcoders`` (or any local folder in its layout:
    ``config.yaml`` naming the files, relative to the folder)."""
    import yaml

    folder = Path(folder)
    config_path = folder / "config.yaml"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path}: a circuit-tracer transcoder folder holds config.yaml")
    config = yaml.safe_load(config_path.read_text())
    for key in ("model_kind", "feature_input_hook", "feature_output_hook"):
        if key not in config:
            raise ValueError(f"{config_path}: no {key!r}")
    config.setdefault("scan", str(folder))
    if config["model_kind"] == "transcoder_set":
        from circuit_tracer.transcoder.single_layer_transcoder import load_transcoder_set

        files = config.get("transcoders") or sorted(p.name for p in folder.glob("layer_*.safetensors"))
        paths = {layer: os.path.join(folder, name) for layer, name in enumerate(files)}
        return load_transcoder_set(paths, scan=config["scan"], feature_input_hook=config["feature_input_hook"],
                                   feature_output_hook=config["feature_output_hook"], device=device, dtype=dtype,
                                   lazy_encoder=False, lazy_decoder=False)
    if config["model_kind"] == "cross_layer_transcoder":
        from circuit_tracer.transcoder.cross_layer_transcoder import load_clt

        return load_clt(str(folder), scan=config["scan"], feature_input_hook=config["feature_input_hook"],
                        feature_output_hook=config["feature_output_hook"], lazy_decoder=False,
                        lazy_encoder=False, device=device, dtype=dtype)
    raise ValueError(f"{config_path}: model_kind {config['model_kind']!r} is neither 'transcoder_set' nor "
                     "'cross_layer_transcoder'")
