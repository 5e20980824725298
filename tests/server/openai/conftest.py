from tests.llm.fixtures import engine, reference  # noqa: F401 - pytest finds fixtures by name
