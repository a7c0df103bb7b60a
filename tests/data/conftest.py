"""Fixtures for the data tests: the tiny demo tokenizer, built in about a second."""

import json

import pytest


@pytest.fixture(scope="session")
def tiny_tokenizer():
    # Only the tokenizer of the tiny assets (same recipe, so the same vocabulary): the data
    # tests need no model.
    from pipeline.assets.corpus import pydoc_topics
    from pipeline.assets.recipe import TinyRecipe
    from pipeline.assets.tokenizer import build_tokenizer

    return build_tokenizer([text for _, text in pydoc_topics()], TinyRecipe().vocab_size)


@pytest.fixture
def write_jsonl(tmp_path):
    """Write records (dicts are JSON-encoded, strings written as they are) one per line."""
    def write(records, name="data.jsonl"):
        path = tmp_path / name
        lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
        path.write_text("\n".join(lines) + "\n")
        return str(path)
    return write

