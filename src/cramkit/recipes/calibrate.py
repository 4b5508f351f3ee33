"""Calibrated probabilities from logits: temperature scaling (self-training's teachers and the label words' prior)."""

from __future__ import annotations

import math

import numpy as np


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The temperature that minimises the negative log-likelihood of ``labels`` (temperature scaling, Guo et al.
    2017), between 0.001 (cosines: the label words' prior) and 100. The likelihood is convex in 1/T, so a
    golden-section search over log T finds its minimum."""
    z = logits.astype(np.float64)
    idx = np.arange(len(labels))

    def nll(log_t: float) -> float:
        s = z / math.exp(log_t)
        s = s - s.max(1, keepdims=True)
        return float(-(s[idx, labels] - np.log(np.exp(s).sum(1))).mean())

    lo, hi = math.log(0.001), math.log(100.0)
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = nll(a), nll(b)
    for _ in range(80):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = nll(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = nll(b)
    return math.exp((lo + hi) / 2)


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    s = logits.astype(np.float64) / temperature
    s = s - s.max(1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(1, keepdims=True)


def fit_platt(scores: np.ndarray, labels: np.ndarray, l2: float = 1e-3) -> tuple[float, float]:
    """The slope and offset of P(label 1 | score) = sigmoid(slope * score + offset) that minimise the mean negative
    log-likelihood of the 0/1 ``labels`` plus ``l2 * slope**2 / 2`` (Platt scaling; the penalty keeps the slope
    finite when the rows are separable): Newton's method, which a two-parameter convex problem needs a few steps of."""
    x = np.stack([scores.astype(np.float64).ravel(), np.ones(len(labels))], 1)
    y = labels.astype(np.float64)
    theta = np.zeros(2)
    ridge = np.diag([l2, 1e-9])
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ theta, -60, 60)))
        grad = x.T @ (p - y) / len(y) + ridge @ theta
        hess = (x * (p * (1 - p))[:, None]).T @ x / len(y) + ridge
        step = np.linalg.solve(hess, grad)
        theta -= step
        if float(np.abs(step).max()) < 1e-10:
            break
    return float(theta[0]), float(theta[1])
