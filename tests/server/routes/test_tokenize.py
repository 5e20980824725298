"""/tokenize and /detokenize (vLLM's shapes) on the encoder and the chat model, against the
models' own tokenizers as transformers loads them."""

from __future__ import annotations

import httpx
import pytest

from ferry.bench.server_process import DEFAULT_MODEL, default_model_config, ferry_server
from tests.server.conftest import IN_PROCESS
from tests.server.routes.conftest import SMOL, SMOL_DIR

pytestmark = pytest.mark.integration

TEXT = "the ferry leaves at noon, from pier four"
MESSAGES = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "When does the ferry leave?"},
]


# The tokenizers stay in the API process (server/procs/remote.py): no hop to test.
@pytest.fixture(scope="module", params=IN_PROCESS)
def server(request):
    llm = {"name": SMOL, "engine": "ortgenai", "path": str(SMOL_DIR), "max_running": 2}
    with ferry_server(
        [default_model_config()], server={"api_servers": request.param}, llm_models=[llm]
    ) as handle:
        yield handle


@pytest.fixture(scope="module")
def hf_tokenizers(default_model_dir):
    from transformers import AutoTokenizer

    return {
        DEFAULT_MODEL: AutoTokenizer.from_pretrained(str(default_model_dir)),
        SMOL: AutoTokenizer.from_pretrained(str(SMOL_DIR)),
    }


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=30)


@pytest.mark.parametrize("model", [DEFAULT_MODEL, SMOL])
@pytest.mark.parametrize("special", [True, False])
def test_a_prompt_tokenizes_as_the_model_does_and_comes_back(server, hf_tokenizers, model, special):
    body = {"model": model, "prompt": TEXT, "add_special_tokens": special}
    answer = post(server, "/tokenize", body).json()
    want = hf_tokenizers[model](TEXT, add_special_tokens=special)["input_ids"]
    assert answer["tokens"] == want and answer["count"] == len(want)
    back = post(server, "/detokenize", {"model": model, "tokens": answer["tokens"]}).json()
    assert back == {"prompt": hf_tokenizers[model].decode(want)}
    if not special:
        assert back["prompt"] == TEXT  # the round trip (the encoder lower-cases; TEXT is)


def test_limits_and_token_strings(server, hf_tokenizers):
    encoder = post(server, "/tokenize", {"prompt": TEXT, "return_token_strs": True}).json()
    assert encoder["max_model_len"] == 256  # the default model: its manifest's, not positions
    strs = hf_tokenizers[DEFAULT_MODEL].convert_ids_to_tokens(encoder["tokens"])
    assert encoder["token_strs"] == strs
    chat = post(server, "/tokenize", {"model": SMOL, "prompt": TEXT}).json()
    assert chat["max_model_len"] == 8192 and "token_strs" not in chat


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_messages_tokenize_as_transformers_chat_template(server, hf_tokenizers, generation_prompt):
    body = {"model": SMOL, "messages": MESSAGES, "add_generation_prompt": generation_prompt}
    answer = post(server, "/tokenize", body).json()
    want = hf_tokenizers[SMOL].apply_chat_template(
        MESSAGES, add_generation_prompt=generation_prompt, tokenize=True, return_dict=True
    )["input_ids"]
    assert answer["tokens"] == list(want)


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/tokenize", {"prompt": "a", "messages": MESSAGES}, 422, None),
        ("/tokenize", {}, 422, None),
        ("/tokenize", {"messages": MESSAGES}, 422, "messages"),  # the encoder has no template
        ("/tokenize", {"model": SMOL, "messages": MESSAGES, "add_special_tokens": True}, 422, None),
        ("/tokenize", {"prompt": "a", "add_special_tokens": 1}, 422, "add_special_tokens"),
        ("/tokenize", {"prompt": "a", "truncate_prompt_tokens": 3}, 422, None),
        ("/tokenize", {"model": "nope", "prompt": "a"}, 404, "model"),
        ("/detokenize", {"tokens": [101, 30522]}, 422, "tokens[1]"),
        ("/detokenize", {"model": SMOL, "tokens": [-1]}, 422, "tokens[0]"),
        ("/detokenize", {"tokens": [101, 1.5]}, 422, "tokens[1]"),
        ("/detokenize", {"tokens": "101"}, 422, "tokens"),
    ],
)
def test_wrong_fields_are_refused_naming_them(server, path, body, status, field):
    response = post(server, path, body)
    assert response.status_code == status, response.text
    if field is not None:
        assert response.json()["error"]["param"] == field, response.json()
