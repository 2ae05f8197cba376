#!/usr/bin/env python3
"""Times one peer CPU AdamW on one flat fp32 parameter: torch.optim.AdamW (foreach / fused) or DeepSpeed's
DeepSpeedCPUAdam. Prints one JSON object: {"name", "params", "threads", "params_per_second", "seconds_per_step"}
or {"name", "error"}. Run one peer per process so each gets all the memory and a clean thread setting."""
import argparse
import json
import os
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("peer", choices=["torch_foreach", "torch_fused", "deepspeed"])
    parser.add_argument("--params", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # DeepSpeed's kernel is OpenMP
    try:
        import torch

        torch.set_num_threads(args.threads)
        param = torch.nn.Parameter(torch.empty(args.params, dtype=torch.float32).uniform_(-1, 1))
        param.grad = torch.empty(args.params, dtype=torch.float32).uniform_(-1e-3, 1e-3)
        hyper = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        if args.peer == "torch_foreach":
            optimizer = torch.optim.AdamW([param], foreach=True, **hyper)
        elif args.peer == "torch_fused":
            optimizer = torch.optim.AdamW([param], fused=True, **hyper)
        else:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            optimizer = DeepSpeedCPUAdam([param], adamw_mode=True, **hyper)
        with torch.no_grad():
            for _ in range(2):  # warm up: state allocation, JIT build, first touch
                optimizer.step()
            best = float("inf")
            for _ in range(args.steps):
                start = time.perf_counter()
                optimizer.step()
                best = min(best, time.perf_counter() - start)
    except Exception as e:  # report, never hide: the caller prints what failed
        print(json.dumps({"name": args.peer, "error": f"{type(e).__name__}: {e}"}))
        return 1
    print(json.dumps({"name": args.peer, "params": args.params, "threads": args.threads,
                      "params_per_second": args.params / best, "seconds_per_step": best}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
