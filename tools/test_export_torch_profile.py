#!/usr/bin/env python3
"""ctest: export a profile from a small torch.nn GPT and check that chunkwise reads it and plans it.

Usage: test_export_torch_profile.py PATH/TO/chunkwise-plan
Needs a Python with torch: this interpreter, or $CHUNKWISE_TORCH_PYTHON (.ci/run makes one in a virtual environment).
Exits 77 (ctest: skipped) when neither has torch.
"""
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77


def reexec_with_torch():
    try:
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    other = os.environ.get("CHUNKWISE_TORCH_PYTHON")
    if other and os.path.exists(other) and not os.environ.get("CHUNKWISE_TORCH_REEXEC"):
        os.environ["CHUNKWISE_TORCH_REEXEC"] = "1"  # a venv's python resolves to its base: never loop
        os.execv(other, [other] + sys.argv)
    print("torch is not installed here and CHUNKWISE_TORCH_PYTHON names no Python with it: skipped")
    sys.exit(SKIP)


def main():
    reexec_with_torch()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import export_torch_profile as export

    plan_binary = sys.argv[1]
    model, profile = export.demo_profile()
    # What the export must say about the model.
    n_params = sum(p.numel() for p in model.parameters())
    assert sum(t["elements"] for t in profile["tensors"]) == n_params, "parameter count differs from torch"
    assert [t["name"] for t in profile["tensors"]][:2] == ["wte.weight", "wpe.weight"], "not in first-use order"
    assert [t["tied"] for t in profile["tensors"]].count(True) == 1, "the tied head/embedding is not marked tied"
    kinds = [s["kind"] for s in profile["passes"]]
    assert kinds.count("forward") == kinds.count("backward"), "every forward pass needs its backward"
    head = [s for s in profile["passes"] if s["label"] == "head" and s["kind"] == "forward"][0]
    assert head["tensors"] == [0], "the head must touch the tied embedding"
    assert head["flops"] == 2 * 2 * 64 * 64 * 256, f"head FLOPs {head['flops']}"
    peak = max(s["activation_bytes"] for s in profile["passes"])
    assert peak > 0, "no activation bytes recorded"

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tiny.json")
        with open(path, "w") as f:
            json.dump(profile, f)
        out = subprocess.run([plan_binary, "--profile", path, "--json"], capture_output=True, text=True)
        assert out.returncode == 0, f"chunkwise-plan failed: {out.stderr}"
        report = json.loads(out.stdout)
        assert report["params"] == n_params, report["params"]
        assert report["peak_activation_bytes"] == peak
        assert report["chosen"] is not None, "no plan chosen for a tiny model"
        # A profile with a broken field is rejected with its path.
        profile["tensors"][3]["elements"] = "many"
        with open(path, "w") as f:
            json.dump(profile, f)
        out = subprocess.run([plan_binary, "--profile", path], capture_output=True, text=True)
        assert out.returncode == 2 and "tensors[3].elements: expected an unsigned integer" in out.stderr, out.stderr
    print(f"torch export ok: {len(profile['tensors'])} tensors, {len(profile['passes'])} passes, {n_params} parameters")


if __name__ == "__main__":
    main()
