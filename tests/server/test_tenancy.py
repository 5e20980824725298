"""Tenants on a real server (server/tenancy.py): the prefix cache leaks nothing across API keys
or cache salts, and a priority more urgent than the default is a privilege."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from ferry.bench.server_process import DEFAULT_MODEL, TINY_LLM, default_model_config, ferry_server
from tests.server.conftest import API_SERVERS
from tests.support.llm_configs import tiny_llm_config
from tests.support.metrics import metric_value

pytestmark = pytest.mark.integration

KEYS = {"victim": "key-of-the-victim", "attacker": "key-of-the-attacker", "ops": "key-of-ops"}
PIN = "4821"
# The attacker knows the sentence and tries PINs; distinct first digits, so that no two guesses
# share more than the sentence before the PIN.
CANDIDATES = ("1357", "2468", PIN, "5790", "8642", "9013")
URGENT = -(2**31)
WAIT = "ferry_queue_wait_seconds_count"


def server_with(**server: object):
    return ferry_server(
        [default_model_config(batching={"max_queue_delay_s": 0.005})],
        llm_models=[tiny_llm_config(max_running=2)],
        server=server,
    )


@pytest.fixture(scope="module", params=API_SERVERS)
def keyless(request):
    with server_with(api_servers=request.param) as handle:
        yield handle


@pytest.fixture(scope="module")
def keyed():
    with server_with(api_keys=KEYS, priority_keys=["ops"]) as handle:
        yield handle


@pytest.fixture(scope="module")
def clamping():
    with server_with(priority_below_default="clamp") as handle:
        yield handle


def bearer(tenant: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}"} if tenant else {}


def cached_tokens(url: str, prompt: str, tenant: str | None = None, salt: str | None = None) -> int:
    """One completion; what it reports in usage.prompt_tokens_details.cached_tokens."""
    body: dict[str, object] = {"model": TINY_LLM, "prompt": prompt, "max_tokens": 1}
    if salt is not None:
        body["cache_salt"] = salt
    answer = httpx.post(f"{url}/v1/completions", json=body, headers=bearer(tenant), timeout=60)
    assert answer.status_code == 200, answer.text[:300]
    return answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def secret(pin: str, ticket: str) -> str:
    return f"Support ticket {ticket}: the account PIN of Alice Smith is {pin}, keep it safe."


def attack(send: Callable[[str], int], ticket: str) -> dict[str, int]:
    """The issue's attack: every candidate PIN in the victim's sentence, reading cached_tokens.
    A first guess with a PIN of its own puts the attacker's own sentence in the cache, so that
    every candidate starts alike; the victim's PIN would read more than the others."""
    send(secret("0000", ticket))
    return {pin: send(secret(pin, ticket)) for pin in CANDIDATES}


def test_a_prompt_under_one_key_is_invisible_under_another(keyed):
    ticket = uuid.uuid4().hex
    cached_tokens(keyed.url, secret(PIN, ticket), "victim")
    read = attack(lambda p: cached_tokens(keyed.url, p, "attacker"), ticket)
    assert len(set(read.values())) == 1, read  # no candidate stands out: nothing recovered
    salted = attack(lambda p: cached_tokens(keyed.url, p, "attacker", "victim"), ticket)
    assert len(set(salted.values())) == 1, salted  # a salt does not cross keys either
    assert cached_tokens(keyed.url, secret(PIN, ticket), "victim") > read[PIN]  # its own


def test_cache_salt_keeps_keyless_clients_apart(keyless):
    ticket = uuid.uuid4().hex
    salt = f"victim-{uuid.uuid4().hex}"
    cached_tokens(keyless.url, secret(PIN, ticket), salt=salt)
    for other in (None, "another-salt"):
        read = attack(lambda p, s=other: cached_tokens(keyless.url, p, salt=s), ticket)
        assert len(set(read.values())) == 1, read
    assert cached_tokens(keyless.url, secret(PIN, ticket), salt=salt) > read[PIN]


def test_without_keys_and_salts_clients_share_the_cache_as_vllm_does(keyless):
    """The documented limit: one anonymous scope (the attack's own check, so it can fail)."""
    ticket = uuid.uuid4().hex
    cached_tokens(keyless.url, secret(PIN, ticket))
    read = attack(lambda p: cached_tokens(keyless.url, p), ticket)
    assert max(read, key=read.__getitem__) == PIN


def predict(url: str, priority: int, tenant: str | None = None) -> httpx.Response:
    body = {"input_ids": [101, 7592, 2088, 102], "priority": priority}
    return httpx.post(f"{url}/predict", json=body, headers=bearer(tenant), timeout=60)


def flood(url: str) -> tuple[list[httpx.Response], list[httpx.Response]]:
    """The issue's flood in small: 16 keyless requests at the most urgent priority beside 4
    at the default, all at once. Returns (urgent answers, default answers)."""
    priorities = [URGENT] * 16 + [0] * 4
    with ThreadPoolExecutor(len(priorities)) as pool:
        answers = list(pool.map(lambda p: predict(url, p), priorities))
    return answers[:16], answers[16:]


def waits(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {p: metric_value(text, WAIT, model=DEFAULT_MODEL, priority=p) for p in ("0", "other")}


def test_a_keyless_flood_at_the_top_priority_is_refused_and_the_others_served(keyless):
    before = waits(keyless.url)
    urgent, default = flood(keyless.url)
    assert [a.status_code for a in default] == [200] * 4
    assert {a.status_code for a in urgent} == {403}
    assert {a.json()["error"]["param"] for a in urgent} == {"priority"}
    after = waits(keyless.url)
    assert after["other"] == before["other"]  # nothing queued ahead of the default
    assert after["0"] == before["0"] + 4


def test_clamped_the_flood_runs_at_the_default_and_is_told_so(clamping):
    before = waits(clamping.url)
    urgent, default = flood(clamping.url)
    assert [a.status_code for a in urgent + default] == [200] * 20
    assert {a.headers.get("ferry-priority-clamped") for a in urgent} == {str(URGENT)}
    assert {a.headers.get("ferry-priority-clamped") for a in default} == {None}
    after = waits(clamping.url)
    assert after["other"] == before["other"]  # all 20 queued side by side at 0
    assert after["0"] == before["0"] + 20


def test_only_the_keys_named_in_priority_keys_go_below_the_default(keyed):
    assert predict(keyed.url, -10, "ops").status_code == 200
    refused = predict(keyed.url, -10, "attacker")
    assert refused.status_code == 403 and "API key 'attacker'" in refused.json()["error"]["message"]
    assert predict(keyed.url, 10, "attacker").status_code == 200  # less urgent: anyone
    assert predict(keyed.url, 0).status_code == 401
