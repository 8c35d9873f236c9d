"""Small statistics shared by the experiment reports: a mean with its 95% confidence interval, and a
trailing moving average."""

from __future__ import annotations

import math

import numpy as np

# Two-sided 95% Student-t quantiles by degrees of freedom (1..30); beyond that the normal 1.96.
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def mean_ci(values: list[float]) -> tuple[float, float | None]:
    """Mean and the half-width of its 95% confidence interval (t distribution); None for one value."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    t = _T95[n - 2] if n - 2 < len(_T95) else 1.96
    return mean, t * sd / math.sqrt(n)


def moving_average(x: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average, shorter at the start (no values are dropped)."""
    c = np.cumsum(np.insert(x, 0, 0.0))
    idx = np.arange(1, len(x) + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)
