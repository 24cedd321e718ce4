#!/usr/bin/env python3
"""adam_peers.py: times DeepSpeedCPUAdam and torch.optim.AdamW (foreach, and
fused where this torch has it on CPU) on one flat fp32 parameter of each size,
with the same thread count as this project's bench/adam, and prints one table
beside this project's figures (read from the CSV that `bench/adam -csv` wrote).

Run by bench/peers/adam_peers.sh (which makes the throwaway environment);
not part of CI. Every optimizer does AdamW with fp32 weights, moments and
gradient (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01); bytes
per parameter are counted as for this project's "f32/norm" row: 28 (w, m, v
read and written, gradient read), no write-allocate. Best of --reps timed
steps after one warm-up, as bench/adam does.
"""
import argparse
import csv
import os
import sys
import time

import torch


def parse_count(s):
    s = s.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "B": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if mult > 1 else s) * mult


def count_name(n):
    for suffix, m in (("B", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n % m == 0:
            return f"{n // m}{suffix}"
    return str(n)


def time_steps(opt, reps):
    opt.step()  # warm-up (and DeepSpeed's lazy state allocation)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - t0)
    return best


def make_param(n):
    g = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.rand(n, generator=g) * 2 - 1)
    p.grad = (torch.rand(n, generator=g) - 0.5) * 2e-3
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--sizes", default="1M,16M,128M")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--ours", help="CSV written by bench/adam -csv")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    hp = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)

    impls = []
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        impls.append(("DeepSpeedCPUAdam", lambda p: DeepSpeedCPUAdam([p], adamw_mode=True, **hp)))
    except Exception as e:  # report, but still time torch
        print(f"deepspeed unavailable: {e}", file=sys.stderr)
    impls.append(("torch AdamW foreach", lambda p: torch.optim.AdamW([p], foreach=True, **hp)))
    impls.append(("torch AdamW fused", lambda p: torch.optim.AdamW([p], fused=True, **hp)))

    ours = {}
    if args.ours:
        with open(args.ours) as f:
            for row in csv.DictReader(f):
                ours[(row["params"], row["combo"])] = float(row["mparams_per_s"])

    print(f"peers: torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')}, best of {args.reps}")
    header = ["params", "optimizer", "best ms", "Mparams/s", "GB/s", "ours/this"]
    rows = []
    for s in args.sizes.split(","):
        n = parse_count(s)
        name = count_name(n)
        ref = ours.get((name, "f32/norm"))
        for label, key in (("lsp-offload host (pre-scan)", "f32"), ("lsp-offload host (norm given)", "f32/norm")):
            if (name, key) in ours:
                mp = ours[(name, key)]
                rows.append([name, label, f"{n / mp / 1e3:.2f}", f"{mp:.0f}", f"{28e-3 * mp if key.endswith('norm') else 32e-3 * mp:.2f}", ""])
        for label, make in impls:
            p = make_param(n)
            try:
                opt = make(p)
                best = time_steps(opt, args.reps)
            except Exception as e:
                rows.append([name, label, "n/a", "", "", str(e).splitlines()[0][:40]])
                continue
            mp = n / best / 1e6
            ratio = f"{ref / mp:.2f}" if ref else ""
            rows.append([name, label, f"{best * 1e3:.2f}", f"{mp:.0f}", f"{28 * n / best / 1e9:.2f}", ratio])
            del opt, p
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for r in [header] + rows:
        print("  ".join(str(c).rjust(w) if i != 1 else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
    print("GB/s: 28 bytes per parameter (32 for the pre-scan row, which reads the gradient twice).")
    print("ours/this: this project's f32/norm row (the same work: no pre-scan) in params/s over the row's.")


if __name__ == "__main__":
    main()
