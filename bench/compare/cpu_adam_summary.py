#!/usr/bin/env python3
"""Reads the Google Benchmark JSON files of chunkwise_optim_bench (one per round) and the peers' JSON lines; keeps
the best result of each contender (best single step over all rounds); prints a table and the last line:
cpu_adam ratio_vs_bandwidth=B speedup_vs_deepspeed=D speedup_vs_torch=T.
B = (our AdamW params/s x 28 bytes) / in-place read-modify-write bytes/s, same size and threads.
usage: cpu_adam_summary.py PARAMS THREADS PEERS.jsonl BENCH.json..."""
import json
import sys


def main() -> int:
    params, threads, peers_file, bench_files = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    ours = {}
    for bench_file in bench_files:
        with open(bench_file) as f:
            bench = json.load(f)
        for b in bench["benchmarks"]:
            if b.get("run_type", "iteration") != "iteration" or "error_occurred" in b:
                continue
            name = b["name"].split("/")[0]
            if f"params:{params}/" in b["name"] and f"threads:{threads}/" in b["name"]:
                if name not in ours or b["items_per_second"] > ours[name]["items_per_second"]:
                    ours[name] = b
    best_peer = {}
    with open(peers_file) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            p = json.loads(line)
            old = best_peer.get(p["name"])
            if old is None or ("error" in old and "error" not in p) or \
                    ("error" not in p and p["params_per_second"] > old["params_per_second"]):
                best_peer[p["name"]] = p
    peers = list(best_peer.values())

    def rate(name):
        return ours[name]["items_per_second"] if name in ours else None

    rmw = ours.get("rmw_bandwidth", {}).get("bytes_per_second")
    triad = ours.get("triad_bandwidth", {}).get("bytes_per_second")
    fp32, bf16 = rate("adamw_fp32"), rate("adamw_bf16_copy")
    print(f"\n{params} fp32 parameters, {threads} thread(s); best single step of {len(bench_files)} round(s); "
          f"GB/s = 1e9 bytes/s")
    if triad:
        print(f"  stream triad (a = b + s*c, 12 B/elem)          {triad / 1e9:8.2f} GB/s")
    if rmw:
        print(f"  in-place read-modify-write (x += s*y, 12 B)    {rmw / 1e9:8.2f} GB/s")
    print(f"  {'optimizer':<44}{'M params/s':>12}{'GB/s @28B':>12}")
    rows = [("chunkwise AdamW fp32", fp32), ("chunkwise AdamW fp32 + bf16 copy (30 B)", bf16)]
    torch_best, deepspeed = None, None
    for p in peers:
        if "error" in p:
            print(f"  {p['name']:<44} FAILED: {p['error']}")
            continue
        rows.append((p["name"], p["params_per_second"]))
        if p["name"].startswith("torch"):
            torch_best = max(torch_best or 0.0, p["params_per_second"])
        if p["name"] == "deepspeed":
            deepspeed = p["params_per_second"]
    for name, r in rows:
        if r is not None:
            print(f"  {name:<44}{r / 1e6:12.1f}{r * 28 / 1e9:12.2f}")

    def fmt(x):
        return "n/a" if x is None else f"{x:.3f}"

    ratio = fp32 * 28 / rmw if fp32 and rmw else None
    if bf16 and rmw:
        print(f"  bf16-copy ratio vs bandwidth (30 B/param): {bf16 * 30 / rmw:.3f}")
    if triad and fp32:
        print(f"  ratio vs triad bandwidth (28 B/param): {fp32 * 28 / triad:.3f}")
    d = fp32 / deepspeed if fp32 and deepspeed else None
    t = fp32 / torch_best if fp32 and torch_best else None
    print(f"cpu_adam ratio_vs_bandwidth={fmt(ratio)} speedup_vs_deepspeed={fmt(d)} speedup_vs_torch={fmt(t)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
