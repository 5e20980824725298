"""Request shapes and paths for the two protocols the benchmarks speak."""

from __future__ import annotations

import pytest

from ferry.bench.targets import Target, kserve_body

pytestmark = pytest.mark.unit


def test_kserve_body_is_one_row_of_int64_ids_and_mask_asking_for_the_embedding_only():
    body = kserve_body([101, 2000, 102])
    ids, mask = body["inputs"]
    assert ids == {
        "name": "input_ids",
        "shape": [1, 3],
        "datatype": "INT64",
        "data": [101, 2000, 102],
    }
    assert mask["name"] == "attention_mask" and mask["data"] == [1, 1, 1]
    assert body["outputs"] == [{"name": "sentence_embedding"}]


def test_paths_follow_the_protocol_unless_the_url_gives_one():
    assert Target("http://h:1").path == "/predict"
    assert Target("http://h:1", "kserve", "m").path == "/v2/models/m/infer"
    assert Target("http://h:1/embed").path == "/embed"
    assert Target("http://h:1/embed").base_url == "http://h:1"


def test_predict_bodies_name_the_model_only_when_given():
    assert Target("http://h:1").bodies([[1, 2]]) == [{"input_ids": [1, 2]}]
    assert Target("http://h:1", model="m").bodies([[1]]) == [{"input_ids": [1], "model": "m"}]


@pytest.mark.parametrize("url", ["https://h:1", "h:1", "http://"])
def test_only_plain_http_urls_are_accepted(url):
    with pytest.raises(ValueError):
        Target(url)
