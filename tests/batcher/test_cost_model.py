import numpy as np
import pytest

from ferry.batcher.cost_model import BatchCostModel


def true_cost(n: int, length: int) -> float:
    tokens = n * length
    return 0.002 + 0.0005 * n + 2e-6 * tokens + 1e-8 * tokens * length + 1e-8 * tokens * tokens


def test_fits_a_known_cost_surface_from_a_few_shapes():
    model = BatchCostModel(refit_every=1)
    for n in (1, 4, 16, 32):
        for length in (16, 64, 128):
            model.observe(n, length, true_cost(n, length))
    assert model.ready
    for n, length in [(8, 100), (2, 20), (32, 256)]:
        assert abs(model.predict(n, length) - true_cost(n, length)) < 1e-4


def test_coefficients_stay_non_negative_on_noisy_data():
    rng = np.random.default_rng(0)
    model = BatchCostModel(refit_every=1)
    for _ in range(200):
        n, length = int(rng.integers(1, 33)), int(rng.integers(8, 129))
        model.observe(n, length, max(1e-4, true_cost(n, length) * rng.normal(1, 0.2)))
    assert (model.coefficients >= 0).all()
    assert model.predict(32, 128) > model.predict(1, 128) > model.predict(1, 8)


def test_not_ready_until_enough_observations():
    model = BatchCostModel(min_observations=6)
    model.observe(1, 8, 0.01)
    assert not model.ready


def test_refits_every_n_observations_and_counts_each_fit_once():
    model = BatchCostModel(refit_every=4, min_observations=2)
    shapes = [(1, 8), (2, 16), (4, 32), (8, 64)]
    for n, length in shapes:
        model.observe(n, length, true_cost(n, length))
    assert model.fits == 1
    for n, length in shapes[:3]:
        model.observe(n, length, true_cost(n, length))
    assert model.fits == 1  # three since the last fit: not yet
    model.observe(8, 64, true_cost(8, 64))
    assert model.fits == 2
    assert set(model.as_dict()) == {
        "fixed",
        "per_request",
        "per_token",
        "per_token_squared",
        "batch_tokens_squared",
    }


def test_predicts_nothing_before_any_fit():
    assert BatchCostModel().predict(4, 32) == 0.0


def test_refits_once_exactly_the_minimum_is_observed():
    model = BatchCostModel(refit_every=3, min_observations=3)
    for n, length in [(1, 8), (2, 16), (4, 32)]:
        model.observe(n, length, true_cost(n, length))
    assert model.fits == 1


def test_only_the_last_512_observations_are_fitted():
    model = BatchCostModel(refit_every=10_000)
    model.observe(1, 8, 100.0)  # a stall 512 observations ago: it must age out
    shapes = [(1, 8), (2, 16), (4, 32), (8, 64), (16, 128), (32, 16), (3, 100), (1, 128)] * 64
    for n, length in shapes:
        model.observe(n, length, true_cost(n, length))
    model.refit()
    assert model.predict(3, 24) == pytest.approx(true_cost(3, 24), rel=1e-6)


def test_a_batch_can_cost_more_than_its_members_one_by_one():
    # Large padded batches run slower per token (caches): the fit must be able to say so, or
    # the cut takes batches of long sequences that cost more than running them apart.
    model = BatchCostModel(refit_every=1)
    for n in (1, 4, 16, 32):
        for length in (16, 64, 128):
            model.observe(n, length, true_cost(n, length))
    assert model.predict(32, 128) > 32 * model.predict(1, 128)
    assert model.predict(4, 16) < 4 * model.predict(1, 16)


@pytest.mark.parametrize(("length", "most"), [(16, 32), (128, 32), (128, 1), (64, 7)])
def test_best_share_is_the_cheapest_batch_size_up_to_the_limit(length, most):
    model = BatchCostModel(refit_every=1)
    for n in (1, 4, 16, 32):
        for width in (16, 64, 128):
            model.observe(n, width, true_cost(n, width))
    shares = {n: model.predict(n, length) / n for n in range(1, most + 1)}
    best = min(shares, key=shares.__getitem__)
    assert model.best_share(length, most) == (best, pytest.approx(shares[best]))
    assert 1 < model.best_share(128, 32)[0] < 32  # an interior optimum: the test can fail


def test_best_share_follows_each_refit():
    # Remembered per fit (admission reads it for every request): a refit must not leave the
    # share of the old coefficients behind.
    model = BatchCostModel(refit_every=1)
    for n in (1, 4, 16, 32):
        for width in (16, 64, 128):
            model.observe(n, width, true_cost(n, width))
    before = model.best_share(64, 32)
    for n in (1, 4, 16, 32):
        for width in (16, 64, 128):
            model.observe(n, width, 3 * true_cost(n, width))
    model.refit()
    after = model.best_share(64, 32)
    assert after == (before[0], pytest.approx(model.predict(before[0], 64) / before[0]))
    assert after[1] > before[1]
