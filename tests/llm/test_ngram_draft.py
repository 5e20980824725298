"""Prompt-lookup drafts (ngram_draft.py): the longest n-gram the text ends with, at its latest
earlier occurrence, proposes what followed it there."""

from __future__ import annotations

import pytest

from ferry.llm.ngram_draft import NgramDraft

pytestmark = pytest.mark.unit


def test_the_tokens_after_the_latest_earlier_occurrence_are_proposed():
    draft = NgramDraft([1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3])
    # [1, 2, 3] occurred at the start only; [2, 3] later too, but the longest n-gram wins.
    assert draft.propose(3) == [4, 5, 9]
    draft.append(6)  # [2, 3, 6], [3, 6], [6] never occurred
    assert draft.propose(3) == []


def test_a_shorter_n_gram_stands_in_and_the_latest_occurrence_wins():
    draft = NgramDraft([5, 1, 7, 5, 2, 8, 9, 5])
    assert draft.propose(2) == [2, 8]  # [5] followed by 2 later than by 1
    draft.append(2)
    assert draft.propose(5) == [8, 9, 5, 2]  # what follows stops at the text's end


def test_count_bounds_the_draft_and_a_longest_n_can_be_chosen():
    tokens = [1, 2, 3, 4, 1, 2]
    assert NgramDraft(tokens).propose(1) == [3]
    assert NgramDraft(tokens).propose(0) == []
    assert NgramDraft([7, 1, 2, 9, 1, 2], max_n=1).propose(2) == [9, 1]  # [2] alone: after 1, 2
    assert NgramDraft([3]).propose(4) == []  # nothing before it
