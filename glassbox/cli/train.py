"""``glassbox train``: train a small GPT-2 (and its BPE tokenizer) on a text file.

DIR ends up a normal Hugging Face GPT-2 folder (config.json, model.safetensors, vocab.json,
merges.txt) that ``transformers`` and ``HookedTransformer.from_pretrained(DIR)`` both load, plus
``checkpoint/`` (to resume with ``--resume``), ``train_log.jsonl`` (one line per step) and
``train_summary.json`` (final held-out loss next to the unigram baseline).

``--arch`` picks a preset of ``glassbox.models.presets``; only ``gpt2`` exports to a Hugging Face
folder, the others keep their weights in ``checkpoint/``. The tokenizer is trained on the training
part of the text only; the last ``--heldout-frac`` of the text is held out for evaluation.
Runs are bit-for-bit repeatable on the CPU for a given seed and ``--threads``.
"""

import dataclasses
import json
import time
from pathlib import Path

import torch

from ..models.presets import PRESETS, preset_config

CHECKPOINT, LOG, SUMMARY = "checkpoint", "train_log.jsonl", "train_summary.json"


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train a small GPT-2 and its tokenizer on a text file")
    p.add_argument("--text", required=True, help="a UTF-8 text file")
    p.add_argument("--out", required=True, help="output folder (a Hugging Face GPT-2 folder at the end)")
    p.add_argument("--arch", choices=sorted(PRESETS), default="gpt2",
                   help="architecture preset (glassbox.models.presets); only gpt2 exports to a Hugging Face folder")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--n-ctx", type=int, default=128)
    p.add_argument("--init-range", type=float, default=None,
                   help="std of the initial weight matrices (default: the preset's; GPT-2 uses 0.02)")
    p.add_argument("--untied", action="store_true", help="a separate unembedding matrix instead of W_E's transpose")
    p.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary, <|endoftext|> included")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-steps", type=int, default=None, help="default: min(100, steps // 10)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--repeat-frac", type=float, default=0.0,
                   help="share of training windows that repeat a span (teaches induction; see glassbox.train.data)")
    p.add_argument("--random-repeat-frac", type=float, default=0.5,
                   help="share of repeated spans made of uniformly random tokens")
    p.add_argument("--min-repeat", type=int, default=4, help="shortest repeated span, in tokens")
    p.add_argument("--max-copies", type=int, default=2, help="most copies of a repeated span in one window")
    p.add_argument("--heldout-frac", type=float, default=0.05)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--checkpoint-every", type=int, default=500)
    p.add_argument("--resume", action="store_true", help="continue from DIR/checkpoint")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--device", default=None, help="e.g. cuda; default: cpu")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..train import (TrainConfig, Trainer, encode_text, init_model, load_tokenizer, split_text,
                         train_bpe_tokenizer, unigram_loss)
    from ..weights import save_pretrained

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    out = Path(args.out)
    text = Path(args.text).read_text(encoding="utf-8")
    train_text, heldout_text = split_text(text, args.heldout_frac)
    if args.resume:
        tokenizer = load_tokenizer(out)
    else:
        tokenizer = train_bpe_tokenizer(train_text, args.vocab_size, out)
        print(f"tokenizer: {len(tokenizer)} tokens, written to {out} [{time.perf_counter() - start:.0f} s]")
    train_stream, heldout_stream = encode_text(train_text, tokenizer), encode_text(heldout_text, tokenizer)
    bos_id = tokenizer.eos_token_id
    print(f"data: {len(train_stream):,} training tokens, {len(heldout_stream):,} held-out tokens")

    log_file = open(out / LOG, "a" if args.resume else "w")

    def log(record: dict) -> None:
        log_file.write(json.dumps(record) + "\n")
        log_file.flush()

    common = dict(checkpoint_dir=out / CHECKPOINT, log=log, progress=not args.no_progress)
    if args.resume:
        trainer = Trainer.resume(out / CHECKPOINT, train_stream, heldout_stream, bos_id, tokenizer=tokenizer,
                                 device=args.device, **common)
        print(f"resuming at step {trainer.step} of {trainer.config.steps}")
    else:
        overrides = {} if args.init_range is None else {"init_range": args.init_range}
        if args.untied:
            overrides["tied_unembed"] = False
        cfg = preset_config(args.arch, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                            d_vocab=len(tokenizer), n_ctx=args.n_ctx, model_name=out.name, **overrides)
        warmup = min(100, args.steps // 10) if args.warmup_steps is None else args.warmup_steps
        config = TrainConfig(
            steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup_steps=warmup,
            weight_decay=args.weight_decay, grad_clip=args.grad_clip, eval_every=args.eval_every,
            checkpoint_every=args.checkpoint_every, seed=args.seed, repeat_frac=args.repeat_frac,
            random_repeat_frac=args.random_repeat_frac, min_repeat=args.min_repeat,
            max_copies=args.max_copies)
        model = init_model(cfg, args.seed, tokenizer=tokenizer, device=args.device)
        trainer = Trainer(model, train_stream, heldout_stream, bos_id, config, **common)
    trainer.run()
    log_file.close()
    if _gpt2_like(trainer.model.cfg):
        save_pretrained(trainer.model, out)
        where = f"model saved to {out}"
    else:
        where = f"weights in {out / CHECKPOINT} (glassbox.train.load_checkpoint; only gpt2 exports to transformers)"
    tokens_seen = trainer.step * trainer.config.batch_size * trainer.model.cfg.n_ctx
    summary = {"steps": trainer.step, "tokens_seen": tokens_seen,
               "heldout_loss": trainer.history["eval"][-1][1],
               "unigram_heldout_loss": unigram_loss(train_stream, heldout_stream, len(tokenizer)),
               "train_config": dataclasses.asdict(trainer.config), "model_config": trainer.model.cfg.to_dict()}
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    print(f"held-out loss {summary['heldout_loss']:.4f} nats/token (unigram baseline "
          f"{summary['unigram_heldout_loss']:.4f}); {where} [{time.perf_counter() - start:.0f} s]")
    return 0


def _gpt2_like(cfg) -> bool:
    return cfg == preset_config("gpt2", d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                                d_vocab=cfg.d_vocab, n_ctx=cfg.n_ctx, model_name=cfg.model_name,
                                init_range=cfg.init_range, tied_unembed=cfg.tied_unembed)
