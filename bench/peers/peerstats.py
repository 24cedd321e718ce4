"""Shared by adam_peers.py and train_peers.py: the spread of a ratio over
interleaved rounds and the machine's load, reported with every table."""

import statistics


def spread(xs):
    """median, min, max, first and third quartile."""
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return statistics.median(xs), min(xs), max(xs), q[0], q[2]


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"
