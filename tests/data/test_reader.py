import logging

import pytest

from pipeline.data import DataError, DataStats, read_conversations

OPENAI = {"messages": [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "What is 2+2?"},
                       {"role": "assistant", "content": "4."}]}
SHAREGPT = {"conversations": [{"from": "system", "value": "Be brief."},
                              {"from": "human", "value": "What is 2+2?"},
                              {"from": "gpt", "value": "4."}]}


def test_both_formats_read_as_the_same_messages(write_jsonl):
    path = write_jsonl([OPENAI, SHAREGPT])
    first, second = read_conversations(path)
    assert first.messages == second.messages == OPENAI["messages"]


def test_blank_lines_are_ignored_but_keep_line_indices(write_jsonl):
    path = write_jsonl(["", OPENAI, "   ", SHAREGPT])
    stats = DataStats()
    convs = list(read_conversations(path, stats=stats))
    assert [c.line_index for c in convs] == [1, 3]
    assert stats.lines_read == 2


@pytest.mark.parametrize("line, reason", [
    ('{"messages": [', "invalid JSON"),
    ('[1, 2]', "expected a JSON object"),
    ('{"text": "hi"}', "'messages' (OpenAI) or 'conversations' (ShareGPT)"),
    ('{"messages": [], "conversations": []}', "exactly one of"),
    ('{"messages": []}', "non-empty list under 'messages'"),
    ('{"messages": [{"role": "user"}]}', "turn 0 needs keys 'role' and 'content'"),
    ('{"messages": [{"role": "robot", "content": "x"}]}', "role='robot'"),
    ('{"messages": [{"role": "assistant", "content": 3}]}', "non-string 'content' (int)"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', "no assistant turn"),
    ('{"conversations": [{"from": "bot", "value": "x"}]}', "from='bot'"),
])
def test_malformed_line_names_file_line_and_reason(write_jsonl, line, reason):
    path = write_jsonl([OPENAI, "", line])
    with pytest.raises(DataError) as e:
        list(read_conversations(path))
    assert e.value.line_no == 3
    assert str(e.value).startswith(f"{path}:3: ")
    assert reason in str(e.value)


def test_fixed_format_rejects_the_other_one(write_jsonl):
    path = write_jsonl([SHAREGPT])
    with pytest.raises(DataError, match="format 'messages' needs a non-empty list"):
        list(read_conversations(path, fmt="messages"))


def test_invalid_utf8_is_a_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"messages": "\xff"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: not UTF-8"):
        list(read_conversations(str(path)))


def test_skip_mode_counts_keeps_reasons_and_warns(write_jsonl, caplog):
    path = write_jsonl([OPENAI, "not json", '{"messages": [{"role": "x", "content": ""}]}',
                        SHAREGPT])
    stats = DataStats()
    with caplog.at_level(logging.WARNING):
        convs = list(read_conversations(path, on_bad_line="skip", stats=stats))
    assert [c.line_index for c in convs] == [0, 3]
    assert (stats.lines_read, stats.skipped_bad) == (4, 2)
    assert stats.bad_examples[0].startswith(f"{path}:2: invalid JSON")
    assert stats.bad_examples[1].startswith(f"{path}:3: turn 0 has role='x'")
    assert "skipped 2 malformed line(s)" in caplog.text and path in caplog.text


def test_unknown_choices_are_rejected(write_jsonl):
    path = write_jsonl([OPENAI])
    with pytest.raises(ValueError, match="on_bad_line='ignore'"):
        list(read_conversations(path, on_bad_line="ignore"))
