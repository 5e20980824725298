"""Bodies that repeat one read before but for their data's items (server/kserve/body_forms.py):
what a body of a kept form gives is what parsing it whole gives."""

from __future__ import annotations

import orjson
import pytest

from ferry.server.kserve.body_forms import body_form

pytestmark = pytest.mark.unit

FIRST = b'{"inputs":[{"name":"X","shape":[1,3],"datatype":"FP32","data":[1.5,2,3]}],"id":"a"}'


def data_of(body: bytes) -> list:
    return orjson.loads(body)["inputs"][0]["data"]


def without_data(body: bytes) -> dict:
    parsed = orjson.loads(body)
    del parsed["inputs"][0]["data"]
    return parsed


@pytest.mark.parametrize(
    "body",
    [
        FIRST,
        FIRST.replace(b"[1.5,2,3]", b"[ 4e2 , -1,0.25 ]"),
        FIRST.replace(b"[1.5,2,3]", b"[]"),
        FIRST.replace(b"[1.5,2,3]", b'[true,null,"x"]'),  # items the tensor reader then refuses
        FIRST.replace(b"[1.5,2,3]", b"[1,2,3,4,5,6]"),  # a count the shape then refuses
    ],
)
def test_a_body_of_the_form_gives_what_parsing_it_gives(body):
    form = body_form(FIRST, "reading")
    assert form is not None and form.reading == "reading"
    assert form.items_of(body) == data_of(body)
    assert without_data(body) == without_data(FIRST)


@pytest.mark.parametrize(
    "body",
    [
        FIRST.replace(b'"a"', b'"b"'),  # another id
        FIRST.replace(b'"data":', b'"data" :'),  # written otherwise
        FIRST.replace(b"[1.5,2,3]", b"[[1.5,2,3]]"),  # nested
        FIRST.replace(b"[1.5,2,3]", b"[1],[2]"),  # two values
        FIRST.replace(b"[1.5,2,3]", b"[1,2"),  # not JSON
        FIRST.replace(b"[1.5,2,3]", b'[1,"]"'),
        FIRST[:-1],
        FIRST + b" ",
        b"",
    ],
)
def test_a_body_of_another_form_is_parsed_whole(body):
    form = body_form(FIRST, "reading")
    assert form is not None and form.items_of(body) is None


@pytest.mark.parametrize(
    "body",
    [
        FIRST.replace(b'"a"', b'"data"'),  # "data" twice: which is the data's?
        FIRST.replace(b'"X"', b'"\\u0058"'),  # escapes: a key could be written so
        FIRST.replace(b"[1.5,2,3]", b"[[1.5,2,3]]"),
        FIRST.replace(b'"data":[1.5,2,3]', b'"data":1.5'),
        FIRST.replace(b'"data":[1.5,2,3]', b'"x":"data"'),
    ],
    ids=["twice", "escapes", "nested", "not a list", "a value"],
)
def test_a_body_whose_data_is_not_one_flat_list_is_not_kept(body):
    assert body_form(body, "reading") is None


def test_blanks_around_the_key_are_kept_as_they_are():
    spaced = FIRST.replace(b'"data":', b'"data" :\n ')
    form = body_form(spaced, "reading")
    assert form is not None
    other = spaced.replace(b"[1.5,2,3]", b"[7,8,9]")
    assert form.items_of(other) == [7, 8, 9] == data_of(other)
