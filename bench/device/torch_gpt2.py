"""PyTorch beside train_gpt2 --backend cuda on the same GPU and GPT-2 shape: Hugging Face's GPT2LMHeadModel with
AdamW, plain (everything on the GPU) and under FSDP with CPU offload (parameters, gradients and optimizer states in
host memory, as ZeRO-Offload keeps them). Prints one line per mode: `torch MODE tokens_per_s=T step_ms=S loss=L`.

Usage: python3 torch_gpt2.py --layers 12 --channels 768 --heads 12 --vocab 50257 --context 256 --batch 4
       --steps 8 [--modes plain,fsdp_offload] [--dtype fp32|bf16]
"""
import argparse
import os
import statistics
import time

import torch


def model_of(args):
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(vocab_size=args.vocab, n_positions=args.context, n_embd=args.channels, n_layer=args.layers,
                        n_head=args.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def train(model, optimizer, args, autocast):
    generator = torch.Generator(device="cpu").manual_seed(0)
    times, loss = [], None
    for step in range(args.steps + 2):  # two warm-up steps, not timed
        tokens = torch.randint(0, args.vocab, (args.batch, args.context + 1), generator=generator).cuda()
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            out = model(input_ids=tokens[:, :-1], labels=tokens[:, 1:])
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= 2:
            times.append(time.perf_counter() - start)
        loss = out.loss.item()
    step = statistics.median(times)
    return args.batch * args.context / step, step, loss


def main():
    parser = argparse.ArgumentParser()
    for name, default in (("layers", 12), ("channels", 768), ("heads", 12), ("vocab", 50257), ("context", 256),
                          ("batch", 4), ("steps", 8)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--modes", default="plain,fsdp_offload")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 products, as train_gpt2's cuBLAS calls
    torch.manual_seed(0)
    autocast = args.dtype == "bf16"
    for mode in args.modes.split(","):
        if mode == "plain":
            model = model_of(args).cuda()
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.0, fused=True)
        elif mode == "fsdp_offload":
            import torch.distributed as dist
            from torch.distributed.fsdp import CPUOffload, FullyShardedDataParallel
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29533")
            if not dist.is_initialized():
                dist.init_process_group("nccl", rank=0, world_size=1)
            torch.cuda.set_device(0)
            model = FullyShardedDataParallel(model_of(args), cpu_offload=CPUOffload(offload_params=True),
                                             device_id=torch.cuda.current_device())
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.0)
        else:
            raise SystemExit(f"unknown mode {mode}")
        tokens_per_s, step, loss = train(model, optimizer, args, autocast)
        print(f"torch {mode} tokens_per_s={tokens_per_s:.1f} step_ms={step * 1e3:.2f} loss={loss:.4f}", flush=True)
        del model, optimizer
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
