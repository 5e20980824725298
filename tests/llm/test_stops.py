"""StopMatcher: stop strings cut cleanly even when split across streamed pieces."""

from __future__ import annotations

import pytest

from ferry.llm.stops import StopMatcher

pytestmark = pytest.mark.unit


def feed_all(matcher: StopMatcher, pieces: list[str]) -> str:
    return "".join(matcher.feed(p) for p in pieces) + matcher.flush()


def test_no_stops_passes_text_through() -> None:
    assert feed_all(StopMatcher(()), ["ab", "c"]) == "abc"


def test_cuts_before_a_stop_inside_one_piece() -> None:
    matcher = StopMatcher(("END",))
    assert feed_all(matcher, ["abcENDxyz", "more"]) == "abc"
    assert matcher.stopped


def test_cuts_a_stop_split_across_pieces_without_leaking_its_prefix() -> None:
    matcher = StopMatcher(("END",))
    assert matcher.feed("abE") == "ab"
    assert matcher.feed("N") == ""
    assert matcher.feed("Dzz") == ""
    assert matcher.stopped


def test_held_back_prefix_is_released_when_ruled_out() -> None:
    matcher = StopMatcher(("END",))
    assert matcher.feed("abE") == "ab"
    assert matcher.feed("x") == "Ex"
    assert matcher.feed("EN") == ""
    assert matcher.flush() == "EN"
    assert not matcher.stopped


def test_earliest_of_several_stops_wins() -> None:
    assert feed_all(StopMatcher(("zz", "b")), ["abczz"]) == "a"


def test_include_stop_str_in_output_keeps_the_earliest_longest_match() -> None:
    matcher = StopMatcher(("EN", "END", "x"), include_stop=True)
    assert feed_all(matcher, ["abcE", "NDxyz"]) == "abcEND"
    assert matcher.stopped
