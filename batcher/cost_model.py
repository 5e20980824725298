"""How long a batch takes, learned online from its padded shape.

BentoML fits `duration = a * n + b`; padding makes the length matter as much as the count, and
attention makes it super-linear, so Ferry fits

    seconds ~= c0 + c1 * n + c2 * n * L + c3 * n * L**2 + c4 * (n * L)**2
                                                        (n requests padded to L tokens)

by least squares over a window of recent batches (warm-up runs seed it), refitting every few
observations. Coefficients are kept non-negative so predictions stay monotone in n and L.

The last term is what a batch's size costs beyond its members: on a CPU a large padded batch
outgrows the caches and runs slower per token than a small one (MiniLM, one thread: 16 x 128
tokens take 827 ms against 16 x 45 ms alone, bench/replay_costs.json). Without it the fit is
linear in n, so every batch looks at least as cheap as its members one by one, and the cut
(policy.best_prefix) made 10-request batches of long sequences that took 0.4-0.5 s each: the
mixed-load tail (bench/replay.py: mixed p99 1.67x first come, first served, before this term).
"""

from __future__ import annotations

from collections import deque

import numpy as np

TERMS = ("fixed", "per_request", "per_token", "per_token_squared", "batch_tokens_squared")


def _features(n: int, length: int) -> np.ndarray:
    tokens = n * length
    return np.array([1.0, n, tokens, tokens * length, tokens * tokens], dtype=np.float64)


class BatchCostModel:
    def __init__(self, window: int = 512, refit_every: int = 8, min_observations: int = 6) -> None:
        self._rows: deque[np.ndarray] = deque(maxlen=window)
        self._seconds: deque[float] = deque(maxlen=window)
        self._refit_every = refit_every
        self._min_observations = min_observations
        self._since_fit = 0
        self.coefficients = np.zeros(len(TERMS))
        self._coefficient_list = [0.0] * len(TERMS)
        self.fits = 0  # how many times the coefficients changed
        # best_share by (length, most), for the current coefficients: admission prices every
        # request by it and reprices the whole queue after each refit.
        self._best_shares: dict[tuple[int, int], tuple[int, float]] = {}

    @property
    def ready(self) -> bool:
        return len(self._rows) >= self._min_observations and bool(self.coefficients.any())

    def observe(self, n: int, length: int, seconds: float) -> None:
        self._rows.append(_features(n, length))
        self._seconds.append(seconds)
        self._since_fit += 1
        if self._since_fit >= self._refit_every and len(self._rows) >= self._min_observations:
            self.refit()

    def refit(self) -> None:
        x = np.stack(self._rows)
        y = np.asarray(self._seconds)
        # Scale columns so the squared term does not dominate the solve numerically.
        scale = np.maximum(np.abs(x).max(axis=0), 1e-12)
        coefficients = _nonnegative_least_squares(x / scale, y) / scale
        self.coefficients = coefficients
        self._coefficient_list = coefficients.tolist()
        self._best_shares.clear()
        self._since_fit = 0
        self.fits += 1

    def predict(self, n: int, length: int) -> float:
        # Plain floats, not numpy: called once per request and per prefix of every batch.
        fixed, per_request, per_token, per_token_squared, batch_tokens_squared = (
            self._coefficient_list
        )
        tokens = n * length
        return (
            fixed
            + n * (per_request + length * (per_token + length * per_token_squared))
            + batch_tokens_squared * tokens * tokens
        )

    def best_share(self, length: int, most: int) -> tuple[int, float]:
        """The batch size of at most `most` at which a request of `length` tokens costs least,
        and that cost (its share of the batch): what length grouping serves it in at best."""
        known = self._best_shares.get((length, most))
        if known is not None:
            return known
        best_n, best_s = 1, self.predict(1, length)
        for n in range(2, most + 1):
            share = self.predict(n, length) / n
            if share < best_s:
                best_n, best_s = n, share
        self._best_shares[length, most] = best_n, best_s
        return best_n, best_s

    def as_dict(self) -> dict[str, float]:
        return dict(zip(TERMS, self.coefficients.tolist(), strict=True))


def _nonnegative_least_squares(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients >= 0: drop the most negative term and solve again."""
    active = list(range(x.shape[1]))
    solution = np.zeros(x.shape[1])
    while active:
        coef, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (coef >= 0).all():
            solution[active] = coef
            return solution
        active.pop(int(np.argmin(coef)))
    return solution
