"""PyTorch's training step at the example trainer's comparison shape, for bench/compare/trainer.sh.

Hugging Face's GPT2LMHeadModel (random weights, no download) with dropout off, fused AdamW, the same batch and
context, on THREADS CPU threads. Prints one line: `torch median_step_s=S steps=N threads=T`.
"""
import argparse
import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--channels", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(1337)
    torch.set_num_threads(args.threads)
    config = GPT2Config(vocab_size=args.vocab, n_positions=args.context, n_embd=args.channels, n_layer=args.layers,
                        n_head=args.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    model.train()
    try:
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    except (RuntimeError, TypeError):
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=True)
    tokens = torch.randint(0, args.vocab, (args.batch, args.context + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    seconds = []
    for step in range(args.steps + 1):  # the first step (allocations, warm-up) is left out
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        logits = model(inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        if step > 0:
            seconds.append(time.perf_counter() - start)
    print(f"torch median_step_s={statistics.median(seconds):.6f} steps={args.steps} threads={args.threads}")


if __name__ == "__main__":
    main()
