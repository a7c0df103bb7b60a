"""Bad input, nothing lost: every kind of damaged line names its file:line and reason, and with
``on_bad_line=skip`` is counted under its kind, so the counts add up to the lines read.

Each case is one line in a file of good lines. The template case needs the encoder (the reader
cannot know a template refuses a turn); the others are caught while reading.
"""

from __future__ import annotations

import json

import pytest

from pipeline.data import ChatDataset, DataConfig, DataError, DataStats, read_conversations
from pipeline.data.errors import KINDS

GOOD = {"messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "What does pass do?"},
                     {"role": "assistant", "content": "It does nothing at all, on purpose."}]}
TEN_MB = json.dumps({"messages": [{"role": "user", "content": "hi"},
                                  {"role": "assistant", "content": "x" * 10_000_000}]})


def _turns(*turns) -> str:
    return json.dumps({"messages": [{"role": r, "content": c} for r, c in turns]})


# (name, the bad line as bytes, its kind, what the reason says)
CASES = [
    ("truncated", json.dumps(GOOD)[:40].encode(), "invalid_json",
     "invalid JSON (Unterminated string"),
    ("10 MB", TEN_MB.encode(), "too_long",
     f"line of {len(TEN_MB)} bytes, over data.max_line_bytes=4194304"),
    ("not UTF-8", b'{"messages": [{"role": "user", "content": "caf\xe9 \xff"}]}', "not_utf8",
     "not UTF-8 (invalid continuation byte at byte 46)"),
    ("a list", b"[1, 2, 3]", "not_object", "expected a JSON object, got list"),
    ("messages a string", b'{"messages": "hello"}', "wrong_type",
     "'messages' is a str, expected a list of turns"),
    ("content a number", _turns(("user", "hi"), ("assistant", 42)).encode(), "wrong_type",
     "turn 1 has a non-string 'content' (int)"),
    ("role a number", b'{"messages": [{"role": 1, "content": "x"}]}', "wrong_type",
     "turn 0 has a non-string 'role' (int)"),
    ("tool_calls a string", json.dumps({"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": "f()"}]}).encode(), "wrong_type",
     "turn 1 has a str 'tool_calls', expected a list"),
    ("turn a string", b'{"messages": ["user: hi"]}', "bad_turn",
     "turn 0 is a str, expected an object"),
    ("unknown role", _turns(("user", "hi"), ("bot", "x")).encode(), "bad_role",
     "turn 1 has role='bot'"),
    ("empty messages", b'{"messages": []}', "no_turns",
     "needs a non-empty list under 'messages'"),
    ("no assistant turn", _turns(("system", "s"), ("user", "hi")).encode(), "no_assistant",
     "no assistant turn: nothing to supervise"),
    ("system late", _turns(("user", "hi"), ("system", "s"), ("assistant", "x")).encode(),
     "role_order", "turn 1 is a system turn after turn 0"),
    ("assistant first", _turns(("assistant", "x"), ("user", "hi")).encode(), "role_order",
     "turn 0 is an assistant turn before any user turn"),
    ("tool after user", _turns(("user", "hi"), ("tool", "42"), ("assistant", "x")).encode(),
     "role_order", "turn 1 is a tool result that follows user"),
    ("template raises", _turns(("user", "say FORBIDDEN"), ("assistant", "no")).encode(),
     "template", "assistant turn 1: the chat template fails on it (TemplateError: forbidden "
     "word)"),
]
# Prepended to a real template: a template that raises on some conversations, as Llama's and
# Mistral's do on roles that do not alternate.
RAISES = ("{%- for m in messages %}{%- if 'FORBIDDEN' in m.content %}"
          "{{ raise_exception('forbidden word') }}{%- endif %}{%- endfor %}")


@pytest.fixture(scope="module")
def tokenizer(family_tokenizer):
    import copy

    tok = copy.deepcopy(family_tokenizer("qwen3"))
    tok.chat_template = RAISES + tok.chat_template
    return tok


def _write(tmp_path, lines: list[bytes], name="data.jsonl", newline_at_end=True) -> str:
    path = tmp_path / name
    path.write_bytes(b"\n".join(lines) + (b"\n" if newline_at_end else b""))
    return str(path)


def _dataset(path: str, tokenizer, on_bad_line: str) -> ChatDataset:
    return ChatDataset(path, tokenizer, DataConfig(on_bad_line=on_bad_line), block_size=2)


def test_every_kind_is_tried():
    assert {kind for _, _, kind, _ in CASES} == set(KINDS)


@pytest.mark.parametrize("name, line, kind, reason", CASES, ids=[c[0] for c in CASES])
def test_a_bad_line_names_file_line_and_reason(tmp_path, tokenizer, name, line, kind, reason):
    good = json.dumps(GOOD).encode()
    # The truncated line is the file's last, cut off mid-line: no newline after it.
    path = _write(tmp_path, [good, b"", line], newline_at_end=name != "truncated")
    with pytest.raises(DataError) as e:
        _dataset(path, tokenizer, "error")
    assert str(e.value).startswith(f"{path}:3: ") and reason in str(e.value), str(e.value)[:300]
    assert (e.value.line_no, e.value.kind) == (3, kind)
    if name == "truncated":
        assert str(e.value).endswith("the line has no newline: is the file cut off?")


def test_skip_counts_every_bad_line_by_kind_and_loses_none(tmp_path, tokenizer):
    good = json.dumps(GOOD).encode()
    empty_answer = _turns(("user", "hi"), ("assistant", "")).encode()  # kept or too short
    lines = [good]
    for _, line, _, _ in CASES:
        lines += [line, good]
    lines += [empty_answer, b"   "]
    path = _write(tmp_path, lines)
    ds = _dataset(path, tokenizer, "skip")
    st = ds.stats

    want: dict[str, int] = {}
    for _, _, kind, _ in CASES:
        want[kind] = want.get(kind, 0) + 1
    assert st.bad_by_kind == want
    assert st.skipped_bad == sum(st.bad_by_kind.values()) == len(CASES)
    # Every non-blank line is accounted for: skipped, or read and rendered into samples that
    # were kept or counted as too short.
    assert st.lines_read == len(lines) - 1 == st.conversations + st.skipped_bad
    assert st.kept + st.dropped_too_short == st.conversations + st.split_segments
    assert st.conversations == len(CASES) + 2  # the good lines and the empty answer
    good_ids = [2 * i for i in range(len(CASES) + 1)]  # their line indices, unchanged
    assert set(good_ids) <= set(ds.sample_ids) <= set(good_ids) | {len(lines) - 2}


def test_reader_alone_counts_add_up(tmp_path):
    """Without the encoder: read + skipped = non-blank lines, kinds sum to skipped."""
    lines = [line for name, line, _, _ in CASES if name not in ("template raises", "truncated")]
    lines += [json.dumps(GOOD).encode()] * 3
    stats = DataStats()
    convs = list(read_conversations(_write(tmp_path, lines), on_bad_line="skip", stats=stats))
    assert len(convs) == 3
    assert stats.lines_read == len(lines) == len(convs) + sum(stats.bad_by_kind.values())


def test_a_long_line_within_the_limit_reads(tmp_path):
    path = _write(tmp_path, [TEN_MB.encode()])
    (conv,) = read_conversations(path, max_line_bytes=16 << 20)
    assert len(conv.messages[1]["content"]) == 10_000_000


def test_limit_edges(tmp_path):
    line = json.dumps(GOOD).encode()
    path = _write(tmp_path, [line, line])
    assert len(list(read_conversations(path, max_line_bytes=len(line)))) == 2
    stats = DataStats()
    assert list(read_conversations(path, "auto", "skip", stats, len(line) - 1)) == []
    assert stats.bad_by_kind == {"too_long": 2}


def test_a_template_error_on_a_heldout_prompt_names_file_and_line(tmp_path, tokenizer):
    from pipeline.eval.tau import heldout_prompts

    path = _write(tmp_path, [json.dumps(GOOD).encode(),
                             _turns(("user", "FORBIDDEN"), ("assistant", "x")).encode()])
    with pytest.raises(DataError, match=rf"^{path}:2: the chat template fails on the prompt "
                                        r"\(TemplateError: forbidden word\)"):
        heldout_prompts(path, tokenizer, limit=5)
