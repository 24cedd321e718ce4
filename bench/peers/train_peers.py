#!/usr/bin/env python3
"""train_peers.py: interleaved rounds of this project's native training step
on the CPU backend (bench/peers/trainstep, run as a subprocess) and
PyTorch's (transformers GPT2LMHeadModel, torch.optim.AdamW fused), per
preset, and the median ratio of the seconds per step with its spread.

Run by bench/peers/train_peers.sh (which makes the environment and builds
trainstep); not part of CI.

The same work on both sides: the preset's architecture (GPT2Config with
train/gpt2/config.go's sizes: tiny V 257, context 64, 128 channels, 4 layers,
4 heads; gpt2 the 124M model), tied embeddings, fp32, no dropout, the batch
bench/train uses (tiny 32 x 24 tokens, gpt2 4 x 256), random tokens with the
inputs as labels, forward, backward, gradient clipping to norm 1 and AdamW
with this project's defaults (lr 1e-4, betas (0.9, 0.95), eps 1e-8, weight
decay 0.1 on matrices only). One difference in kind: this project clips each
matrix by its own norm (optim.ClipMatrix) where PyTorch clips the global
norm; both read every gradient once more. transformers picks its default
attention (printed); threads: torch.set_num_threads(--threads) and
trainstep -threads.

Each round times ours, then PyTorch, each as: a fresh model and optimizer
(setup not timed), one warm-up step, then the best of --steps timed steps.
The ratio is formed within the round, so load that drifts over minutes on a
shared machine hits both sides of it alike; the median over rounds is
printed with its min-max and interquartile range, and the load average at
the start, after each preset and at the end.
"""
import argparse
import gc
import os
import re
import subprocess
import time
import warnings

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

from peerstats import loadavg, spread

# The presets of train/gpt2/config.go and bench/train's batch shapes.
PRESETS = {
    "tiny": dict(arch=dict(vocab_size=257, n_positions=64, n_embd=128, n_layer=4, n_head=4), B=32, T=24),
    "gpt2": dict(arch=dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12), B=4, T=256),
}


def torch_step_seconds(preset, steps):
    p = PRESETS[preset]
    # No special tokens: GPT2Config's default ids (50256) lie outside tiny's vocabulary.
    cfg = GPT2Config(**p["arch"], layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=None, eos_token_id=None)
    torch.manual_seed(1)
    model = GPT2LMHeadModel(cfg)
    model.train()
    params = [q for q in model.parameters() if q.requires_grad]
    groups = [
        {"params": [q for q in params if q.dim() >= 2], "weight_decay": 0.1},
        {"params": [q for q in params if q.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, p["arch"]["vocab_size"], (p["B"], p["T"]), generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    step()  # warm-up (and the optimizer's lazy state)
    best = float("inf")
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    attn = getattr(model.config, "_attn_implementation", "?")
    del opt, model, params, groups
    gc.collect()
    return best, attn


def ours_step_seconds(binary, preset, threads, steps):
    out = subprocess.run([binary, "-preset", preset, "-threads", str(threads), "-steps", str(steps)],
                         check=True, capture_output=True, text=True).stdout
    m = re.search(r"^trainstep .* best_s=([0-9.]+)", out, re.M)
    if not m:
        raise RuntimeError(f"trainstep printed no result line: {out!r}")
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--presets", default="tiny,gpt2")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per preset")
    ap.add_argument("--steps", default="tiny=10,gpt2=2", help="timed steps per measurement (best kept), per preset")
    ap.add_argument("--ours", required=True, help="the built bench/peers/trainstep binary")
    args = ap.parse_args()
    steps = {k: int(v) for k, v in (kv.split("=") for kv in args.steps.split(","))}
    presets = args.presets.split(",")
    for p in presets:
        if p not in PRESETS:
            ap.error(f"--presets: unknown preset {p!r} (want {', '.join(PRESETS)})")
        if steps.get(p, 1) < 1:
            ap.error(f"--steps: {p} needs at least 1")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    # This torch build probes CUDA in backward even with no visible device.
    warnings.filterwarnings("ignore", message="CUDA initialization")

    start_load = loadavg()
    print(f"train peers: torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')}, "
          f"{args.rounds} interleaved rounds per preset")
    print(f"load average at start: {start_load}")
    for preset in presets:
        n = steps.get(preset, 1)
        ours, theirs, attn = [], [], "?"
        for _ in range(args.rounds):
            ours.append(ours_step_seconds(args.ours, preset, args.threads, n))
            t, attn = torch_step_seconds(preset, n)
            theirs.append(t)
        tokens = PRESETS[preset]["B"] * PRESETS[preset]["T"]
        print(f"\n{preset}: B={PRESETS[preset]['B']} T={PRESETS[preset]['T']}, each measurement best of {n} steps "
              f"after a warm-up, PyTorch attention {attn}; load average now {loadavg()}")
        header = ["step", "median s/step", "min-max s/step", "tokens/s", "per round s/step"]
        rows = []
        for label, ts in (("lsp-offload native (CPU backend)", ours), ("PyTorch (AdamW fused)", theirs)):
            med, lo, hi, _, _ = spread(ts)
            rows.append([label, f"{med:.3f}", f"{lo:.3f}-{hi:.3f}", f"{tokens / med:.0f}", " ".join(f"{t:.3f}" for t in ts)])
        widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
        for r in [header] + rows:
            print("  ".join(c.ljust(w) if i in (0, 4) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        ratio = [o / t for o, t in zip(ours, theirs)]
        speed = [t / o for o, t in zip(ours, theirs)]
        for name, xs, meaning in (("ours/PyTorch s/step", ratio, "<1: ours faster"),
                                  ("speed (PyTorch s / ours s)", speed, ">1: ours faster")):
            med, lo, hi, q1, q3 = spread(xs)
            print(f"{preset} {name}: median {med:.2f}, min-max {lo:.2f}-{hi:.2f}, IQR {q1:.2f}-{q3:.2f} ({meaning})")
    print(f"\nload average at start: {start_load}, at end: {loadavg()}")


if __name__ == "__main__":
    main()
