import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferry.batcher.cost_model import FASTEST_SHARE_MIN, TERMS, BatchCostModel

pytestmark = pytest.mark.unit


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


def linear_cost(n: int, length: int) -> float:
    """A cost in padded tokens alone, which the fit puts in its per-token term."""
    return 0.001 + 1e-5 * n * length


@pytest.mark.parametrize("cost", [true_cost, linear_cost])
def test_fastest_follows_the_idle_batches_where_predict_follows_the_load(cost):
    # A shared machine: most batches run at twice their cost, a tenth at their own.
    model = BatchCostModel(refit_every=1)
    shapes = [(n, length) for n in (1, 4, 16, 32) for length in (16, 64, 128)]
    for index in range(200):
        n, length = shapes[index % len(shapes)]
        model.observe(n, length, cost(n, length) * (1 if index % 10 == 0 else 2))
    for n, length in [(1, 256), (8, 100)]:
        assert model.predict(n, length) > 1.5 * cost(n, length)
        assert model.fastest(n, length) == pytest.approx(cost(n, length), rel=0.2)
    # What an API process is sent prices a row alone as the engine's own model does.
    for length in (1, 37, 256, 4000):
        assert model.fastest_row().seconds(length) == pytest.approx(model.fastest(1, length))


def test_fastest_is_never_a_sliver_of_the_prediction():
    # A young window: a few batches took a fiftieth of what the others did for the same shape.
    model = BatchCostModel(refit_every=1)
    for index in range(10):
        model.observe(1, 8, 0.0006 if index < 3 else 0.03)
    assert model.fastest(1, 256) >= FASTEST_SHARE_MIN * model.predict(1, 256) > 0


def test_fastest_is_never_slower_than_the_prediction():
    # A few timing glitches far under the rest: the fit's mean sits below nearly every batch,
    # but the idle estimate must not exceed what the fit predicts.
    model = BatchCostModel(refit_every=1)
    for index in range(100):
        model.observe(4, 8, 1e-6 if index % 40 == 0 else 0.01)
    assert model.fastest(4, 8) <= model.predict(4, 8)


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
    for n, length in [(2, 16), (4, 32), (8, 64), (1, 128)]:
        model.observe(n, length, true_cost(n, length))
    model.refit()  # fitted, but on 5 of the 6 observations it needs
    assert not model.ready
    model.observe(2, 64, true_cost(2, 64))
    assert model.ready


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


def test_refits_less_often_once_settled():
    model = BatchCostModel(
        refit_every=2, min_observations=2, settled_after=6, settled_refit_every=5
    )
    fits_after = []
    for _ in range(16):
        model.observe(2, 16, true_cost(2, 16))
        fits_after.append(model.fits)
    # Every 2 observations up to the 6th; then every 5 since the last fit (the 11th, the 16th).
    assert fits_after == [0, 1, 1, 2, 2, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 5]


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
    # ... and one 511 observations ago still counts.
    model.observe(1, 8, 100.0)
    for n, length in shapes[:511]:
        model.observe(n, length, true_cost(n, length))
    model.refit()
    assert model.predict(3, 24) != pytest.approx(true_cost(3, 24), rel=1e-3)


def test_with_nothing_shared_by_a_batch_one_request_alone_is_cheapest():
    # No fixed cost, no batch term: every size costs the same per request; the smaller wins.
    model = BatchCostModel(refit_every=1)
    for n in (1, 2, 4, 8):
        for width in (8, 32, 128):
            model.observe(n, width, 1e-4 * n * width)
    assert model.best_share(32, 16) == (1, pytest.approx(32e-4))


@pytest.mark.parametrize(
    "noise",
    [
        {"fixed": 1e-21},  # a shared cost of nothing: the largest batch would look cheapest
        {"fixed": 1e-21, "batch_tokens_squared": 1e-27},  # an optimum near 5, by rounding
    ],
)
def test_float_noise_in_the_fit_does_not_pick_a_larger_batch(noise):
    # What numpy's least squares leaves of zero terms differs from one build to the next.
    model = BatchCostModel(refit_every=1)
    coefficients = {"per_token": 1e-4, **noise}
    model._coefficient_list = [coefficients.get(term, 0.0) for term in TERMS]
    n, share = model.best_share(32, 16)
    assert n == 1 and share == pytest.approx(32e-4)


def test_a_batch_can_cost_more_than_its_members_one_by_one():
    # Large padded batches run slower per token (caches): the fit must be able to say so, or
    # the cut takes batches of long sequences that cost more than running them apart.
    model = BatchCostModel(refit_every=1)
    for n in (1, 4, 16, 32):
        for length in (16, 64, 128):
            model.observe(n, length, true_cost(n, length))
    assert model.predict(32, 128) > 32 * model.predict(1, 128)
    assert model.predict(4, 16) < 4 * model.predict(1, 16)


@pytest.mark.parametrize(("length", "most"), [(16, 32), (128, 32), (128, 1), (64, 7), (1, 1000)])
def test_best_share_is_the_cheapest_batch_size_up_to_the_limit(length, most):
    model = BatchCostModel(refit_every=1)
    for n in (1, 4, 16, 32):
        for width in (16, 64, 128):
            model.observe(n, width, true_cost(n, width))
    shares = {n: model.predict(n, length) / n for n in range(1, most + 1)}
    best = min(shares, key=shares.__getitem__)
    assert model.best_share(length, most) == (best, pytest.approx(shares[best]))
    assert 1 < model.best_share(128, 32)[0] < 32  # an interior optimum: the test can fail


@settings(max_examples=200, deadline=None)
@given(
    costs=st.lists(st.floats(0, 1e-2), min_size=5, max_size=5),
    length=st.integers(1, 512),
    most=st.integers(1, 64),
)
def test_best_share_is_the_brute_force_minimum(costs, length, most):
    # The closed form (the convex share's real minimum, rounded both ways) against every size.
    model = BatchCostModel(refit_every=1)
    c0, c1, c2, c3, c4 = costs
    for n in (1, 2, 4, 8, 16, 32):
        for width in (8, 32, 64, 128, 256):
            tokens = n * width
            seconds = c0 + c1 * n + c2 * tokens + c3 * tokens * width + c4 * tokens**2
            model.observe(n, width, seconds)
    shares = [model.predict(n, length) / n for n in range(1, most + 1)]
    n, share = model.best_share(length, most)
    assert 1 <= n <= most and share == pytest.approx(model.predict(n, length) / n)
    assert share <= min(shares) * (1 + 1e-9) + 1e-15
