"""``python -m glassbox.interp.transcoders OUT --n-layers N --d-model D --d-transcoder F [...]``: write a seeded
random transcoder set (``seeded.seeded_set``) in circuit-tracer's layout, for tests and benchmarks in other
environments."""

import torch


def main(argv=None) -> None:
    import argparse

    from .circuit_tracer import save_circuit_tracer
    from .seeded import seeded_set

    parser = argparse.ArgumentParser(prog="python -m glassbox.interp.transcoders",
                                     description="Write a seeded random transcoder set in circuit-tracer's layout.")
    parser.add_argument("out")
    parser.add_argument("--n-layers", type=int, required=True)
    parser.add_argument("--d-model", type=int, required=True)
    parser.add_argument("--d-transcoder", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cross-layer", action="store_true")
    parser.add_argument("--skip", action="store_true")
    parser.add_argument("--activation", default="relu", choices=("relu", "jumprelu", "topk"))
    parser.add_argument("--k", type=int, default=None)
    parser.add_argument("--bias", type=float, default=-2.0)
    parser.add_argument("--input-hook", default="ln2.hook_out")
    parser.add_argument("--output-hook", default="hook_mlp_out")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64", "bfloat16", "float16"))
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    ts = seeded_set(args.n_layers, args.d_model, args.d_transcoder, args.seed, cross_layer=args.cross_layer,
                    skip=args.skip, activation=args.activation, k=args.k, bias=args.bias, input_hook=args.input_hook,
                    output_hook=args.output_hook, dtype=getattr(torch, args.dtype))
    print(save_circuit_tracer(ts, args.out, overwrite=args.overwrite))


if __name__ == "__main__":
    main()
