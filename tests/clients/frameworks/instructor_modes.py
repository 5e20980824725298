"""instructor: the response model as a forced tool (TOOLS), as a json_schema format
(JSON_SCHEMA), and as a Responses text format (RESPONSES_TOOLS)."""

from __future__ import annotations

import instructor
import openai

from tests.clients.frameworks.shapes import MAX_TOKENS, MODEL, PERSON_PROMPT, Answer, Person


def structured(url: str, mode: str) -> Answer:
    client = instructor.from_openai(
        openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0),
        mode=instructor.Mode[mode],
    )
    limit = "max_output_tokens" if mode.startswith("RESPONSES") else "max_tokens"
    person = client.create(
        model=MODEL,
        response_model=Person,
        messages=[{"role": "user", "content": PERSON_PROMPT}],
        temperature=0,
        max_retries=0,  # instructor's retries would hide a first answer that does not parse
        **{limit: MAX_TOKENS},
    )
    return Answer(output=person)
