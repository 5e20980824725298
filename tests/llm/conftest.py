from tests.llm.fixtures import engine, kv_model, prompts, reference  # noqa: F401 - by name
