"""Planning (server/openai/planning.py): a request checked and tokenized once, before any engine
work. The engine is the real vLLM adapter over the fake at vLLM's boundary, with the tiny model's
real tokenizer; planning reads only its limits and tokenizer, so nothing is generated here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ferry.llm.chat_tokenizer import ChatTokenizer
from ferry.llm.errors import InvalidPrompt, InvalidSampling, PromptTooLong
from ferry.llm.vllm import VLLMEngine
from ferry.server.openai.grammars import Grammars
from ferry.server.openai.planning import plan_chat, plan_completion
from ferry.server.openai.protocol import ChatCompletionRequest, CompletionRequest
from ferry.server.registry import ServedLLM
from tests.exporters.tiny_llms import TEMPLATES
from tests.llm.fake_vllm import FakeAsyncLLM, RequestOutputKind, sampling_params
from tests.llm.llm_paths import HF_DIR, MODEL_NAME

pytestmark = pytest.mark.unit

TOKENIZER = ChatTokenizer(HF_DIR)
MESSAGES = [{"role": "user", "content": "hello there"}]
GRAMMARS = Grammars()  # no request here carries a grammar


def served(
    context: int = 256, concurrency: int = 8, tokenizer: ChatTokenizer = TOKENIZER
) -> ServedLLM:
    engine = VLLMEngine(
        FakeAsyncLLM(steps=[]),
        tokenizer,
        name=MODEL_NAME,
        max_context_tokens=context,
        sampling_params_cls=sampling_params,
        delta_output_kind=RequestOutputKind.DELTA,
        max_concurrency=concurrency,
    )
    return ServedLLM(MODEL_NAME, engine, MODEL_NAME)


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": MODEL_NAME, "messages": MESSAGES, **fields}
    )


def completion(**fields: Any) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": MODEL_NAME, "prompt": "hi", **fields})


async def test_a_chat_is_rendered_once_and_its_n_choices_share_the_prompt() -> None:
    plan = await plan_chat(chat(n=3, priority=-10), served(), GRAMMARS)
    ids = TOKENIZER.encode_chat(MESSAGES)
    assert [c.index for c in plan.choices] == [0, 1, 2]
    assert all(c.prompt_ids is plan.choices[0].prompt_ids for c in plan.choices)  # one list
    assert plan.choices[0].prompt_ids == ids
    assert plan.prompt_tokens == len(ids)  # billed once, as OpenAI counts it
    assert plan.priority == -10 and plan.response_id.startswith("chatcmpl-")


async def test_max_tokens_is_fitted_to_each_prompts_room_in_the_context() -> None:
    long, short = "one two three four five six seven eight", "hi"
    request = completion(prompt=[long, short], max_tokens=200)
    plan = await plan_completion(request, served(context=64), GRAMMARS)
    rooms = [64 - len(TOKENIZER.encode(p)) for p in (long, short)]
    assert [c.sampling.max_tokens for c in plan.choices] == rooms
    # No limit asked: all the room there is.
    unlimited = await plan_chat(chat(), served(context=64), GRAMMARS)
    prompt_tokens = (await plan_chat(chat(), served(), GRAMMARS)).prompt_tokens
    assert unlimited.choices[0].sampling.max_tokens == 64 - prompt_tokens


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (completion(prompt="x " * 300), "prompt"),
        (completion(prompt=["hi", "x " * 300]), "prompt[1]"),
        (chat(messages=[{"role": "user", "content": "x " * 300}]), "messages"),
    ],
)
async def test_a_prompt_with_no_room_left_names_what_to_shorten(request_: Any, field: str) -> None:
    plan = plan_chat if isinstance(request_, ChatCompletionRequest) else plan_completion
    with pytest.raises(PromptTooLong) as err:
        await plan(request_, served(context=128), GRAMMARS)
    assert err.value.field == field


@pytest.mark.parametrize("arguments", ["[" + "1," * 100_000 + "1]", '"' + "x" * 200_000 + '"'])
async def test_a_calls_arguments_count_toward_the_bound_checked_before_rendering(
    arguments: str, tmp_path: Path
) -> None:
    """A template with its own tool format gets the arguments parsed, numbers and all, and
    writes them back as JSON: they count, or a long list of numbers would be rendered and
    tokenized on the event loop."""
    (tmp_path / "tokenizer.json").write_text((HF_DIR / "tokenizer.json").read_text())
    template = (TEMPLATES / "qwen2.5.jinja").read_text()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    native = ChatTokenizer(tmp_path)
    assert native.has_tool_format
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    history = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [call]}]
    with pytest.raises(InvalidPrompt, match="characters cannot fit") as err:
        await plan_chat(chat(messages=history), served(tokenizer=native), GRAMMARS)
    assert err.value.field == "messages"


async def test_token_ids_outside_the_vocabulary_are_an_invalid_prompt() -> None:
    vocab = TOKENIZER.vocab_size
    with pytest.raises(InvalidPrompt) as err:
        await plan_completion(completion(prompt=[[1, 2], [3, vocab]]), served(), GRAMMARS)
    assert err.value.field == "prompt[1]" and str(vocab) in str(err.value)
    ids = [1, 2, vocab - 1]
    plan = await plan_completion(completion(prompt=ids), served(), GRAMMARS)
    assert plan.choices[0].prompt_ids == ids


@pytest.mark.parametrize(
    ("prompts", "n", "field"), [(["a"], 3, "n"), (["a", "b", "c"], 1, "prompt")]
)
async def test_more_generations_than_the_engine_ever_holds_is_a_400(prompts, n, field) -> None:
    with pytest.raises(InvalidSampling) as err:
        await plan_completion(completion(prompt=prompts, n=n), served(concurrency=2), GRAMMARS)
    assert err.value.field == field


async def test_a_bias_on_a_token_the_model_lacks_is_refused() -> None:
    bias = {str(TOKENIZER.vocab_size): 5.0}
    with pytest.raises(InvalidSampling) as err:
        await plan_completion(completion(logit_bias=bias), served(), GRAMMARS)
    assert err.value.field == "logit_bias"


async def test_an_option_the_engine_cannot_honour_is_refused_not_ignored() -> None:
    engine = served()
    engine.engine.sampling_options = frozenset()  # as an engine without penalties declares
    with pytest.raises(InvalidSampling) as err:
        await plan_completion(completion(presence_penalty=0.5), engine, GRAMMARS)
    assert err.value.field == "presence_penalty"
    # The neutral value asks nothing.
    await plan_completion(completion(presence_penalty=0.0), engine, GRAMMARS)


async def test_echo_keeps_each_prompts_text_for_its_choices() -> None:
    request = completion(prompt=["ab", "cd"], n=2, echo=True)
    plan = await plan_completion(request, served(), GRAMMARS)
    assert [c.prompt_text for c in plan.choices] == ["ab", "ab", "cd", "cd"]
    assert [c.index for c in plan.choices] == [0, 1, 2, 3]
    assert plan.prompt_tokens == len(TOKENIZER.encode("ab")) + len(TOKENIZER.encode("cd"))
    ids = await plan_completion(completion(prompt=[5, 6], echo=True), served(), GRAMMARS)
    assert ids.choices[0].prompt_text == TOKENIZER.decode([5, 6])  # token ids: decoded once


@pytest.mark.parametrize(
    ("seed", "seeds"),
    [(None, [None, None, None, None]), (7, [7, 8, 7, 8]), (2**63 - 1, [2**63 - 1, -(2**63)] * 2)],
)
async def test_choice_i_of_each_prompt_samples_with_seed_plus_i(seed, seeds) -> None:
    """vLLM's parallel sampling: n seeded choices differ, and stay within int64."""
    request = completion(prompt=["a", "b"], n=2, seed=seed)
    plan = await plan_completion(request, served(), GRAMMARS)
    assert [c.sampling.seed for c in plan.choices] == seeds
