#!/usr/bin/env python3
"""Export a chunkwise model profile (format "chunkwise.model_profile", version 1) from a PyTorch module.

Runs the module forward and backward once on an example batch (one training step without the update) and records,
per module that holds parameters, in execution order:
  - a forward pass and a backward pass touching the module's own parameters, plus those of its submodules that did not
    run as modules (nn.MultiheadAttention uses out_proj's weight directly); a parameter used by several modules, such as
    a tied embedding, is touched by each and marked "tied";
  - the activation bytes alive: bytes autograd saves for backward (counted once per storage through
    saved_tensors_hooks) accumulated over the forward, released module by module in backward, plus the pass's own
    saved bytes while it runs;
  - FLOPs of the forward from torch.utils.flop_counter; a backward pass counts twice its forward.
Parameters are listed in first-use order, as chunkwise requires. The passes go under "passes" (chunkwise also reads
the older key "steps").

Use as a library:   profile = export_profile(module, example_args, loss_fn); json.dump(profile, f)
or from the shell:  python tools/export_torch_profile.py --demo out.json   (a small GPT with a tied head)
"""
import argparse
import json
import sys

import torch
from torch.utils.flop_counter import FlopCounterMode

DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}


def _modules_with_parameters(module):
    return [(name or "root", m) for name, m in module.named_modules() if any(True for _ in m.parameters())]


def export_profile(module, example_args, loss_fn, name="torch-model"):
    """Profile one training step of `module(*example_args)` with loss `loss_fn(output)`; returns the JSON dict."""
    leaves = _modules_with_parameters(module)
    param_names = {}
    for pname, p in module.named_parameters(remove_duplicate=True):
        param_names[id(p)] = pname
    users = {}  # parameter id -> number of modules that own it directly
    for _, m in leaves:
        for p in m.parameters(recurse=False):
            users[id(p)] = users.get(id(p), 0) + 1
    forward_params = {}  # module label -> parameter ids its passes touch
    touched = set()

    events = []  # (kind, label, param ids, saved bytes during the pass, flops)
    saved_by_module = {}
    state = {"saved": 0, "stack": [], "seen": set()}  # stack: labels of the modules running, innermost last

    def pack(t):
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in state["seen"]:
            state["seen"].add(key)
            state["saved"] += storage.nbytes()
            owner = state["stack"][-1] if state["stack"] else "root"
            saved_by_module[owner] = saved_by_module.get(owner, 0) + storage.nbytes()
        return t

    def pre_forward(label):
        def hook(m, args):
            state["stack"].append(label)
        return hook

    def post_forward(label, m):
        def hook(mod, args, out):
            pids = [id(p) for p in m.parameters(recurse=False)]
            pids += [id(p) for p in m.parameters() if id(p) not in touched and id(p) not in pids]
            touched.update(pids)
            if pids:
                forward_params[label] = pids
                events.append(("forward", label, pids, state["saved"]))
            state["stack"].pop()
        return hook

    def post_backward(label, m):
        def hook(mod, grad_input, grad_output):
            if label in forward_params:
                events.append(("backward", label, forward_params[label], None))
        return hook

    handles = []
    # Backward hooks fire for modules whose inputs need no gradient (the embeddings) too; say nothing about it.
    import warnings
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    for label, m in leaves:
        handles.append(m.register_forward_pre_hook(pre_forward(label)))
        handles.append(m.register_forward_hook(post_forward(label, m)))
        handles.append(m.register_full_backward_hook(post_backward(label, m)))
    flop_counter = FlopCounterMode(display=False)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), flop_counter:
            loss = loss_fn(module(*example_args))
        loss.backward()
    finally:
        for h in handles:
            h.remove()

    flops_by_module = {}
    counts = flop_counter.get_flop_counts()
    root = type(module).__name__
    for label, m in leaves:
        # FlopCounterMode keys modules by the root's class name and the qualified name below it.
        key = root if label == "root" else f"{root}.{label}"
        flops_by_module[label] = int(sum(counts.get(key, {}).values()))

    # Parameters in first-use order.
    order, index = [], {}
    for kind, label, pids, _ in events:
        for pid in pids:
            if pid not in index:
                index[pid] = len(order)
                order.append(pid)
    params = {id(p): p for p in module.parameters()}
    tensors = []
    for pid in order:
        p = params[pid]
        if p.dtype not in DTYPES:
            raise ValueError(f"parameter {param_names[pid]} has dtype {p.dtype}, which chunkwise does not hold")
        tensors.append({"name": param_names[pid][:95], "elements": p.numel(), "dtype": DTYPES[p.dtype],
                        "role": "parameter", "tied": users[pid] > 1})

    passes, released = [], 0
    total_saved = state["saved"]
    for kind, label, pids, saved in events:
        own = saved_by_module.get(label, 0)
        flops = flops_by_module.get(label, 0)
        if kind == "forward":
            alive, pass_flops = saved, flops
        else:
            alive = total_saved - released + own  # what is still saved, plus the gradients of this pass's activations
            released += own
            pass_flops = 2 * flops
        unique = []
        for pid in pids:
            if index[pid] not in unique:
                unique.append(index[pid])
        passes.append({"label": label[:95], "kind": kind, "tensors": unique, "activation_bytes": int(alive),
                       "flops": int(pass_flops)})
    return {"format": "chunkwise.model_profile", "version": 1, "name": name[:95], "tensors": tensors, "passes": passes}


class TinyGPT(torch.nn.Module):
    """A small GPT: token and position embeddings, pre-norm blocks, a head tied to the token embedding."""

    def __init__(self, vocab=256, context=64, width=64, heads=4, layers=2):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, width)
        self.wpe = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied
        self.context = context

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1])
        x = self.wte(tokens) + self.wpe(positions)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.head(self.ln_f(x))


def demo_profile(batch=2, context=64):
    torch.manual_seed(0)
    model = TinyGPT(context=context)
    tokens = torch.randint(0, 256, (batch, context))
    return model, export_profile(model, (tokens,), lambda logits: logits.float().logsumexp(-1).mean(), name="tiny-gpt")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo", metavar="OUT", required=True, help="profile the built-in TinyGPT and write OUT")
    args = parser.parse_args(argv)
    _, profile = demo_profile()
    with open(args.demo, "w") as f:
        json.dump(profile, f, indent=1)
    print(f"wrote {args.demo}: {len(profile['tensors'])} tensors, {len(profile['passes'])} passes")


if __name__ == "__main__":
    main(sys.argv[1:])
