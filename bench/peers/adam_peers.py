#!/usr/bin/env python3
"""adam_peers.py: interleaved rounds of this project's CPU Adam (bench/adam,
run as a subprocess), DeepSpeedCPUAdam and torch.optim.AdamW (fused, and
foreach) on one flat fp32 parameter of each size, same thread count, and the
median ratio of this project's params/s over each peer's with its spread.

Run by bench/peers/adam_peers.sh (which makes the environment and builds
bench/adam); not part of CI.

Why interleaved: on a shared machine the load drifts over minutes, so one
optimizer timed after another measures the load as much as the code. Each
round times every optimizer once, back to back, in the order ours,
DeepSpeedCPUAdam, torch fused, torch foreach; the ratio is formed within a
round and the median over rounds is reported with its min-max and
interquartile range, and the load average is printed at the start and end.

What each measurement is (the same for all four): fresh arrays for the size
(allocated and first touched in that measurement), one warm-up step (also
DeepSpeed's and torch's lazy state allocation), then the best of --reps
timed steps. Ours is a fresh bench/adam process per round (its "f32/norm"
row: no pre-scan, the same work as the peers), pinned to --threads workers;
the peers run in this process with torch.set_num_threads(--threads) and
OMP_NUM_THREADS set by the caller, so DeepSpeed's OpenMP kernel uses the same
count. Every optimizer does AdamW with fp32 weights, moments and gradient
(lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01); bytes per
parameter are 28 (w, m, v read and written, gradient read), no
write-allocate.
"""
import argparse
import csv
import gc
import os
import subprocess
import sys
import tempfile
import time

import torch

from peerstats import loadavg, spread


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
    opt.step()  # warm-up (and the lazy state allocation)
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


def time_peer(make, n, reps):
    p = make_param(n)
    opt = make(p)
    best = time_steps(opt, reps)
    del opt, p
    gc.collect()
    return best


def time_ours(binary, threads, size, reps):
    with tempfile.NamedTemporaryFile(suffix=".csv") as f:
        subprocess.run([binary, "-threads", str(threads), "-sizes", size, "-reps", str(reps),
                        "-combos", "f32/norm", "-yardsticks=false", "-csv", f.name],
                       check=True, stdout=subprocess.DEVNULL)
        with open(f.name) as r:
            rows = list(csv.DictReader(r))
    if len(rows) != 1:
        raise RuntimeError(f"bench/adam wrote {len(rows)} rows for {size}, want 1 (skipped for memory?)")
    return float(rows[0]["best_ms"]) / 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--sizes", default="1M,16M,128M")
    ap.add_argument("--reps", type=int, default=10, help="timed steps per measurement (best kept)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per size")
    ap.add_argument("--ours", required=True, help="the built bench/adam binary")
    ap.add_argument("--base", default="", help="optional second bench/adam binary (e.g. built from main), "
                    "timed in every round right after ours: a before/after comparison under the same load")
    args = ap.parse_args()
    if args.rounds < 1 or args.reps < 1:
        ap.error("--rounds and --reps must be >= 1")
    torch.set_num_threads(args.threads)
    hp = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)

    peers = []
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        peers.append(("DeepSpeedCPUAdam", lambda p: DeepSpeedCPUAdam([p], adamw_mode=True, **hp)))
    except Exception as e:  # report, but still time torch
        print(f"deepspeed unavailable: {e}", file=sys.stderr)
    peers.append(("torch AdamW fused", lambda p: torch.optim.AdamW([p], fused=True, **hp)))
    peers.append(("torch AdamW foreach", lambda p: torch.optim.AdamW([p], foreach=True, **hp)))
    ours_label = "lsp-offload host (norm given)"
    base_label = "lsp-offload base (--base)"

    start_load = loadavg()
    print(f"peers: torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')}, {args.rounds} interleaved rounds "
          f"per size, each measurement best of {args.reps} steps after a warm-up")
    print(f"load average at start: {start_load}")
    for s in args.sizes.split(","):
        n = parse_count(s)
        name = count_name(n)
        times = {ours_label: []}
        if args.base:
            times[base_label] = []
        times.update({label: [] for label, _ in peers})
        failed = {}
        for _ in range(args.rounds):
            times[ours_label].append(time_ours(args.ours, args.threads, name, args.reps))
            if args.base:
                times[base_label].append(time_ours(args.base, args.threads, name, args.reps))
            for label, make in peers:
                if label in failed:
                    continue
                try:
                    times[label].append(time_peer(make, n, args.reps))
                except Exception as e:
                    failed[label] = str(e).splitlines()[0][:60]
        print(f"\n{name} parameters ({n}), load average now {loadavg()}")
        header = ["optimizer", "median ms", "min-max ms", "GB/s", "ours/this", "min-max", "IQR"]
        rows = []
        ours = times[ours_label]
        for label in times:
            ts = times[label]
            if label in failed:
                rows.append([label, "n/a", failed[label], "", "", "", ""])
                continue
            med, lo, hi, _, _ = spread(ts)
            row = [label, f"{med * 1e3:.2f}", f"{lo * 1e3:.2f}-{hi * 1e3:.2f}", f"{28 * n / med / 1e9:.2f}"]
            if label == ours_label:
                row += ["", "", ""]
            else:
                # Within a round: ours params/s over the peer's = peer time / ours.
                ratios = [t / o for t, o in zip(ts, ours)]
                rm, rlo, rhi, q1, q3 = spread(ratios)
                row += [f"{rm:.2f}", f"{rlo:.2f}-{rhi:.2f}", f"{q1:.2f}-{q3:.2f}"]
            rows.append(row)
        widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
        for r in [header] + rows:
            print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if args.base:
            # The baseline against each peer, formed within each round as for ours.
            for label in times:
                if label in (ours_label, base_label) or label in failed:
                    continue
                ratios = [t / b for t, b in zip(times[label], times[base_label])]
                rm, rlo, rhi, q1, q3 = spread(ratios)
                print(f"  base/{label}: median {rm:.2f}, min-max {rlo:.2f}-{rhi:.2f}, IQR {q1:.2f}-{q3:.2f}")
    print(f"\nload average at start: {start_load}, at end: {loadavg()}")
    print("GB/s: 28 bytes per parameter over the median time. ours/this: this project's params/s over the row's,")
    print("formed within each round; the median over rounds, its min-max and interquartile range (>1: ours faster).")


if __name__ == "__main__":
    main()
