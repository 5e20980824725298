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

import math
from typing import NamedTuple

import numpy as np

# Batch sizes whose shares differ by less than this (relative) are a tie, won by the smaller.
TIE_TOLERANCE = 1e-9
# The fastest batches: this quantile of their times against the fit's predictions.
FASTEST_QUANTILE = 0.05
# The least that share may be: over a young window's few batches the fit's fixed cost is
# overestimated and a tiny batch takes a sliver of its prediction (a share of ~0.02), which put
# the deadline floor for a 256-token MiniLM row under 1 ms (a 504 after queueing, not a 422).
FASTEST_SHARE_MIN = 0.25
TERMS = ("fixed", "per_request", "per_token", "per_token_squared", "batch_tokens_squared")


class RowTime(NamedTuple):
    """One row's time as a quadratic in its length: the cost line at n = 1 in three numbers,
    so another process (an API process, from the engine's reports) prices a row alone."""

    constant: float
    per_token: float
    per_token_squared: float

    def seconds(self, length: int) -> float:
        return self.constant + length * (self.per_token + length * self.per_token_squared)


def _features(n: int, length: int) -> tuple[float, ...]:
    tokens = n * length
    return (1.0, n, tokens, tokens * length, tokens * tokens)


class BatchCostModel:
    def __init__(
        self,
        window: int = 512,
        refit_every: int = 8,
        min_observations: int = 6,
        settled_after: int = 64,
        settled_refit_every: int = 64,
    ) -> None:
        # The last `window` observations, in a ring: a refit reads them without copying rows.
        self._rows = np.zeros((window, len(TERMS)))
        self._seconds = np.zeros(window)
        self._observed = 0
        self._refit_every = refit_every
        # A refit (least squares over the window, ~160 us) and the queue's repricing after it
        # (~3 us a queued request) run in the event loop: every 8 batches that was ~5 % of its
        # time per request under mixed load (bench.peers). Once `settled_after` batches are in
        # the window, one more barely moves the fit, so refit less often.
        self._settled_after = settled_after
        self._settled_refit_every = max(refit_every, settled_refit_every)
        self._min_observations = min_observations
        self._since_fit = 0
        self.coefficients = np.zeros(len(TERMS))
        self._coefficient_list = [0.0] * len(TERMS)
        self._fitted = False  # some coefficient above zero
        # The share of its prediction the fastest batches in the window took (their twentieth:
        # one timing glitch does not set it): on a shared machine the fit follows the load,
        # the fastest batches what the model needs when idle. Found when first asked after a
        # fit: only requests with a deadline read it, and refits run on the event loop.
        self._fastest_share: float | None = None
        self.fits = 0  # how many times the coefficients changed

    @property
    def ready(self) -> bool:
        return self._fitted and self._observed >= self._min_observations

    def observe(self, n: int, length: int, seconds: float) -> None:
        slot = self._observed % len(self._seconds)
        self._rows[slot] = _features(n, length)
        self._seconds[slot] = seconds
        self._observed += 1
        self._since_fit += 1
        every = self._refit_every
        if self._observed > self._settled_after:
            every = self._settled_refit_every
        if self._since_fit >= every and self._observed >= self._min_observations:
            self.refit()

    def refit(self) -> None:
        count = min(self._observed, len(self._seconds))
        x, y = self._rows[:count], self._seconds[:count]
        # Scale columns so the squared term does not dominate the solve numerically.
        scale = np.maximum(np.abs(x).max(axis=0), 1e-12)
        coefficients = _nonnegative_least_squares(x / scale, y) / scale
        self.coefficients = coefficients
        self._coefficient_list = coefficients.tolist()
        self._fitted = bool(coefficients.any())
        self._fastest_share = None
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

    def fastest(self, n: int, length: int) -> float:
        """`predict` scaled to the fastest batch seen against its prediction: about what the
        batch takes on an idle machine (the deadline floor's estimate)."""
        return self.predict(n, length) * self._fastest()

    def fastest_row(self) -> RowTime:
        """`fastest(1, L)` for every L."""
        fixed, per_request, per_token, per_token_squared, batch_tokens_squared = (
            self._coefficient_list
        )
        share = self._fastest()
        return RowTime(
            (fixed + per_request) * share,
            per_token * share,
            (per_token_squared + batch_tokens_squared) * share,
        )

    def _fastest(self) -> float:
        if self._fastest_share is None:
            count = min(self._observed, len(self._seconds))
            predicted = self._rows[:count] @ self.coefficients
            positive = predicted > 0
            shares = self._seconds[:count][positive] / predicted[positive]
            fastest = np.quantile(shares, FASTEST_QUANTILE) if shares.size else 1.0
            self._fastest_share = float(np.clip(fastest, FASTEST_SHARE_MIN, 1.0))
        return self._fastest_share

    def best_share(self, length: int, most: int) -> tuple[int, float]:
        """The batch size of at most `most` at which a request of `length` tokens costs least,
        and that cost (its share of the batch): what length grouping serves it in at best.

        A share is `c0 / n + (c1 + c2 L + c3 L^2) + c4 n L^2`, convex in n, least at
        `n = sqrt(c0 / c4) / L`: one of the two whole sizes around it, or a smaller one whose share
        is within a relative TIE_TOLERANCE of it.
        Closed form because admission prices every request by it.
        """
        fixed, batch_tokens_squared = self._coefficient_list[0], self._coefficient_list[4]
        if batch_tokens_squared > 0:
            best = math.sqrt(fixed / batch_tokens_squared) / max(length, 1)
            around = (math.floor(best), math.ceil(best))
            sizes = sorted({min(most, max(1, whole)) for whole in around})
        else:  # nothing grows with the batch: the largest if a fixed cost is shared, else one
            sizes = [most if fixed > 0 else 1]
        share, n = min((self.predict(n, length) / n, n) for n in sizes)
        # Float noise in the fit must not pick a larger batch: the smallest size whose share is
        # within TIE_TOLERANCE of the least. Shares fall up to n (convex), so bisect below it.
        limit = share + abs(share) * TIE_TOLERANCE
        low, high = 1, n
        while low < high:
            middle = (low + high) // 2
            if self.predict(middle, length) / middle <= limit:
                high = middle
            else:
                low = middle + 1
        return low, self.predict(low, length) / low

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
