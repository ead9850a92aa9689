#!/usr/bin/env python3
"""One Llama-family training step in transformers, timed: bench/compare_decoder.py's peer.

    decoder_torch.py --model '{"vocab_size": ..., "d_model": ..., ...}' --context T --batch B
                     [--steps S] [--warmup W] [--threads N] [--layers L] [--bf16]

--model holds a lockstep config's model keys (vocab_size, n_layer, n_head, n_kv_head, d_model,
intermediate_size, norm_eps, rope_theta, tie_embeddings, qkv_bias); the model is
LlamaForCausalLM of that shape (Qwen2's q/k/v biases as `attention_bias`), random-initialised,
trained with torch.optim.AdamW (lr 5e-5, betas (0.9, 0.95), weight decay 0.1) on random
tokens, the loss transformers' own (labels = inputs, shifted inside). --bf16 runs forward and
loss under torch.autocast(bfloat16) with fp32 master weights. Prints one JSON line: the median
step time of the timed steps and tokens/s.
"""

import argparse
import json
import statistics
import time

import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--context", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--bf16", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    m = json.loads(args.model)
    config = transformers.LlamaConfig(
        vocab_size=m["vocab_size"], hidden_size=m["d_model"],
        intermediate_size=m["intermediate_size"],
        num_hidden_layers=args.layers or m["n_layer"], num_attention_heads=m["n_head"],
        num_key_value_heads=m.get("n_kv_head", m["n_head"]), rms_norm_eps=m.get("norm_eps", 1e-5),
        rope_theta=m.get("rope_theta", 10000.0), max_position_embeddings=args.context,
        tie_word_embeddings=m.get("tie_embeddings", False),
        attention_bias=m.get("qkv_bias", False))
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(0)
    times = []
    for step in range(args.warmup + args.steps):
        x = torch.randint(0, m["vocab_size"], (args.batch, args.context), generator=gen)
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times[args.warmup:])
    print(json.dumps({"framework": f"transformers {transformers.__version__}",
                      "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "params": sum(p.numel() for p in model.parameters()),
                      "step_ms": 1e3 * step_s,
                      "tokens_per_s": args.batch * args.context / step_s}))


if __name__ == "__main__":
    main()
