"""Fixtures for the data tests: JSONL files, and the tiny tokenizer with real chat templates
(tests/conftest.py has the tiny demo tokenizer itself)."""

import copy
import json
from pathlib import Path

import pytest


@pytest.fixture
def write_jsonl(tmp_path):
    """Write records (dicts are JSON-encoded, strings written as they are) one per line."""
    def write(records, name="data.jsonl"):
        path = tmp_path / name
        lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
        path.write_text("\n".join(lines) + "\n")
        return str(path)
    return write



TEMPLATES = Path(__file__).parent / "templates"
# The special tokens each family's template writes, and which of them ends a turn.
_FAMILIES = {
    "qwen3": {"special": ["<|im_start|>", "<|im_end|>"],
              "added": ["<think>", "</think>", "<tool_call>", "</tool_call>",
                        "<tool_response>", "</tool_response>"],
              "bos": None, "eos": "<|im_end|>"},
    "llama3": {"special": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                           "<|eot_id|>"],
               "added": [], "bos": "<|begin_of_text|>", "eos": "<|eot_id|>"},
}


@pytest.fixture(scope="session")
def family_tokenizer(tiny_tokenizer):
    """``family_tokenizer("qwen3")``: the tiny BPE with that family's special tokens and its real
    chat template (a fixture file, see templates/ORIGIN.md)."""
    cache = {}

    def make(family: str):
        if family not in cache:
            spec = _FAMILIES[family]
            tok = copy.deepcopy(tiny_tokenizer)
            tok.add_special_tokens({"additional_special_tokens": spec["special"]})
            tok.add_tokens(spec["added"])
            if spec["bos"]:
                tok.bos_token = spec["bos"]
            tok.eos_token = spec["eos"]
            tok.chat_template = (TEMPLATES / f"{family}.jinja").read_text()
            cache[family] = tok
        return cache[family]
    return make
