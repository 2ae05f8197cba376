#!/usr/bin/env python3
"""ctest: export profiles from PyTorch modules and check that chunkwise reads and plans them.

Usage: test_export_torch_profile.py PATH/TO/chunkwise-plan [--case tiny-gpt|hf-gpt2]
  tiny-gpt (the default, ctest torch_export): a small torch.nn GPT (tools/export_torch_profile.py's TinyGPT).
  hf-gpt2 (ctest torch_export_hf_gpt2): Hugging Face's GPT-2 definition, transformers.GPT2LMHeadModel(GPT2Config(...))
    at a small config with random weights (nothing is downloaded). Its exported tensors, with the Hugging Face names
    mapped to chunkwise's, must equal chunkwise's analytic GPT-2 profile of the same config (profile/gpt2.hpp, printed
    by chunkwise-plan --layers ... --json): the same names in the same order, the same element counts (and the shapes
    gpt2.hpp documents), the same parameter count, the same tied tensor; and chunkwise-plan must read the export.
Needs a Python with torch (and transformers for hf-gpt2): this interpreter, or $CHUNKWISE_TORCH_PYTHON (.ci/run and
tools/python-env.sh make one). Exits 77 (ctest: skipped) when neither has them.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings

SKIP = 77


def reexec_with(modules):
    """Continues here if this Python has `modules`, else in $CHUNKWISE_TORCH_PYTHON if that has them, else skips."""
    try:
        for module in modules:
            __import__(module)
        return
    except ImportError as missing:
        reason = str(missing)
    other = os.environ.get("CHUNKWISE_TORCH_PYTHON")
    if other and os.path.exists(other) and not os.environ.get("CHUNKWISE_TORCH_REEXEC"):
        os.environ["CHUNKWISE_TORCH_REEXEC"] = "1"  # a venv's python resolves to its base: never loop
        os.execv(other, [other] + sys.argv)
    print(f"{reason} here, and CHUNKWISE_TORCH_PYTHON names no Python with {' and '.join(modules)}: skipped")
    sys.exit(SKIP)


def run_plan(plan_binary, *args):
    out = subprocess.run([plan_binary, *args], capture_output=True, text=True)
    return out


def case_tiny_gpt(plan_binary):
    import export_torch_profile as export

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


# GPT-2's parameter shapes as chunkwise/profile/gpt2.hpp documents them (Hugging Face's Conv1D keeps [in, out]).
def gpt2_shapes(layers, width, vocab, context):
    c = width
    shapes = {"wte": (vocab, c), "wpe": (context, c)}
    for layer in range(layers):
        for name, shape in [("ln_1.weight", (c,)), ("ln_1.bias", (c,)), ("attn.c_attn.weight", (c, 3 * c)),
                            ("attn.c_attn.bias", (3 * c,)), ("attn.c_proj.weight", (c, c)), ("attn.c_proj.bias", (c,)),
                            ("ln_2.weight", (c,)), ("ln_2.bias", (c,)), ("mlp.c_fc.weight", (c, 4 * c)),
                            ("mlp.c_fc.bias", (4 * c,)), ("mlp.c_proj.weight", (4 * c, c)), ("mlp.c_proj.bias", (c,))]:
            shapes[f"h.{layer}.{name}"] = shape
    shapes["ln_f.weight"] = (c,)
    shapes["ln_f.bias"] = (c,)
    return shapes


def chunkwise_name(hf_name):
    """Hugging Face's GPT-2 parameter name -> chunkwise's (profile/gpt2.hpp): no "transformer.", bare embeddings."""
    name = hf_name.removeprefix("transformer.")
    return {"wte.weight": "wte", "wpe.weight": "wpe"}.get(name, name)


def case_hf_gpt2(plan_binary):
    import torch
    import export_torch_profile as export
    import transformers

    layers, width, heads, vocab, context = 2, 64, 4, 256, 64
    transformers.logging.set_verbosity_error()
    # The model's and its transformer's outputs are ModelOutput objects, not tensors: their backward hooks never fire,
    # and need not (their parameters' passes are their submodules').
    warnings.filterwarnings("ignore", message="For backward hooks to be called")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab, n_positions=context,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)  # random weights: nothing is downloaded
    tokens = torch.randint(0, vocab, (2, context))
    profile = export.export_profile(model, (tokens,), lambda out: out.logits.float().logsumexp(-1).mean(),
                                    name="hf-gpt2")
    n_params = sum(p.numel() for p in model.parameters())  # unique parameters: the tied head counts once
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    exported = profile["tensors"]
    assert sum(t["elements"] for t in exported) == n_params, "parameter count differs from torch"

    # chunkwise's analytic GPT-2 of the same config.
    out = run_plan(plan_binary, "--layers", str(layers), "--d-model", str(width), "--heads", str(heads), "--vocab",
                   str(vocab), "--context", str(context), "--json")
    assert out.returncode == 0, f"chunkwise-plan (analytic) failed: {out.stderr}"
    analytic = json.loads(out.stdout)
    assert analytic["params"] == n_params, f"analytic GPT-2 has {analytic['params']} parameters, torch {n_params}"
    expected = analytic["tensor_list"]
    mapped = [chunkwise_name(t["name"]) for t in exported]
    assert mapped == [t["name"] for t in expected], (
        "tensor names or order differ:\n  exported " + str(mapped) + "\n  analytic " + str([t["name"] for t in expected]))
    documented = gpt2_shapes(layers, width, vocab, context)
    for t, want in zip(exported, expected):
        name = chunkwise_name(t["name"])
        shape = shapes[t["name"]]
        assert shape == documented[name], f"{t['name']}: shape {shape}, gpt2.hpp documents {documented[name]}"
        elements = 1
        for extent in shape:
            elements *= extent
        assert t["elements"] == elements == want["elements"], (
            f"{name}: {t['elements']} elements exported, {elements} in its shape, {want['elements']} in chunkwise's")
        assert t["dtype"] == want["dtype"] == "fp32", f"{name}: dtype {t['dtype']} vs {want['dtype']}"
        assert t["tied"] == want["tied"], f"{name}: tied {t['tied']} exported, {want['tied']} in chunkwise's"
    assert [t["name"] for t in expected if t["tied"]] == ["wte"], "only the embedding (and LM head) is tied"

    # chunkwise-plan reads the export and plans it.
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "hf-gpt2.json")
        with open(path, "w") as f:
            json.dump(profile, f)
        out = run_plan(plan_binary, "--profile", path, "--json")
        assert out.returncode == 0, f"chunkwise-plan --profile failed ({out.returncode}): {out.stderr}"
        report = json.loads(out.stdout)
    assert report["model"] == "hf-gpt2" and report["params"] == n_params, (report["model"], report["params"])
    assert [(t["name"], t["elements"], t["tied"]) for t in report["tensor_list"]] == [
        (t["name"], t["elements"], t["tied"]) for t in exported], "chunkwise-plan read other tensors than exported"
    assert report["peak_activation_bytes"] == max(s["activation_bytes"] for s in profile["passes"])
    assert report["chosen"] is not None, "no plan chosen for a small GPT-2"
    print(f"Hugging Face GPT-2 export ok: {len(exported)} tensors and {n_params} parameters equal chunkwise's analytic "
          f"GPT-2 ({layers} layers, width {width}, {heads} heads, vocab {vocab}, context {context}); "
          f"{len(profile['passes'])} passes; planned as {report['chosen']}")


CASES = {"tiny-gpt": (["torch"], case_tiny_gpt), "hf-gpt2": (["torch", "transformers"], case_hf_gpt2)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("plan_binary", help="path to chunkwise-plan")
    parser.add_argument("--case", choices=sorted(CASES), default="tiny-gpt")
    args = parser.parse_args()
    modules, case = CASES[args.case]
    reexec_with(modules)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    case(args.plan_binary)


if __name__ == "__main__":
    main()
