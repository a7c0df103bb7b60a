"""Bad input, nothing lost: every kind of damaged line names its file:line and reason, and with
``on_bad_line=skip`` is counted under its kind and reported once, so the counts (blank lines
included) add up to the file's lines.

Each case is one line in a file of good lines. The template case needs the encoder (the reader
cannot know a template refuses a turn); the others are caught while reading.
"""

from __future__ import annotations

import json
import logging
import pickle

import pytest

from pipeline.data import ChatDataset, DataConfig, DataError, DataStats, read_conversations
from pipeline.data.errors import KINDS
from pipeline.data.stats import MAX_BAD_EXAMPLES

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
    # Every line is accounted for: blank, skipped, or read and rendered into samples that were
    # kept or counted as too short; the summary spells the sum out.
    assert st.lines_read == len(lines) - 1 == st.conversations + st.skipped_bad
    assert st.lines == len(lines) == st.conversations + st.skipped_bad + st.blank
    assert st.blank == 1
    assert st.summary().startswith(f"lines={len(lines)} = conversations={st.conversations} + "
                                   f"skipped_bad={len(CASES)} + blank=1; samples kept=")
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


def test_blank_lines_are_counted_and_keep_ids(tmp_path, tokenizer):
    good = json.dumps(GOOD).encode()
    path = _write(tmp_path, [b"", good, b"  \t", b"", good, b""])
    ds = _dataset(path, tokenizer, "error")
    assert ds.sample_ids == [1, 4]  # line indices, blank lines counted
    assert (ds.stats.lines, ds.stats.blank, ds.stats.conversations) == (6, 4, 2)
    assert ds.stats.summary().startswith("lines=6 = conversations=2 + skipped_bad=0 + blank=4;")


def test_skipped_lines_are_reported_once_then_counted(tmp_path, tokenizer, caplog):
    """A few skipped lines verbatim, each once (not again in the summary or by the reader),
    then how many more; the summary counts them all by kind."""
    good = json.dumps(GOOD).encode()
    bad_lines = [line for name, line, _, _ in CASES if name != "truncated"]
    path = _write(tmp_path, [good, *bad_lines])
    with caplog.at_level(logging.INFO):
        ds = _dataset(path, tokenizer, "skip")
    text = caplog.text
    shown = [n for n in range(2, len(bad_lines) + 2) if f"{path}:{n}: " in text]
    assert shown == list(range(2, MAX_BAD_EXAMPLES + 2))
    assert all(text.count(f"{path}:{n}: ") == 1 for n in shown), text
    more = len(bad_lines) - MAX_BAD_EXAMPLES
    assert text.count(f"{more} more skipped line(s) not shown") == 1
    assert text.count(ds.stats.summary()) == 1 and ds.stats.skipped_bad == len(bad_lines)


def test_the_first_bad_line_stops_whatever_its_kind(tmp_path, tokenizer):
    """A template error early in the file is found before a JSON error later in it."""
    good = json.dumps(GOOD).encode()
    refused = _turns(("user", "FORBIDDEN"), ("assistant", "x")).encode()
    path = _write(tmp_path, [good, refused, good, b"{cut"])
    with pytest.raises(DataError) as e:
        _dataset(path, tokenizer, "error")
    assert (e.value.line_no, e.value.kind) == (2, "template")


def test_an_encoded_set_crosses_a_process_boundary_without_its_file(tmp_path, tokenizer):
    """How the driver hands its encoded set to the prefetcher: pickled, the file not read again
    (here it is gone), every sample the same."""
    good = json.dumps(GOOD).encode()
    path = _write(tmp_path, [good, b"", b"{cut", good])
    ds = _dataset(path, tokenizer, "skip")
    blob = pickle.dumps(ds)
    (tmp_path / "data.jsonl").unlink()
    copy = pickle.loads(blob)
    assert copy.sample_ids == ds.sample_ids == [0, 3] and copy.stats == ds.stats
    for a, b in zip(ds, copy):
        assert a.sample_id == b.sample_id
        assert a.input_ids.tolist() == b.input_ids.tolist()
        assert a.loss_mask.tolist() == b.loss_mask.tolist()
    # Tokens and mask as flat arrays, not a tensor per sample (pickling 50k tensors took 8 s).
    assert len(blob) < 5 * sum(len(s.input_ids) for s in ds) + 2000


def test_heldout_prompts_skip_and_count_bad_lines(tmp_path, tokenizer, caplog):
    from pipeline.eval.tau import heldout_prompts

    good = json.dumps(GOOD).encode()
    refused = _turns(("user", "FORBIDDEN"), ("assistant", "x")).encode()
    path = _write(tmp_path, [b"{cut", good, b"", refused, good, good])
    stats = DataStats()
    with caplog.at_level(logging.WARNING):
        prompts = heldout_prompts(path, tokenizer, limit=2, on_bad_line="skip", stats=stats)
    assert len(prompts) == 2
    # Read as far as two prompts: lines 1-5, the sixth is never read.
    assert (stats.lines, stats.blank, stats.bad_by_kind) == (5, 1, {"invalid_json": 1,
                                                                     "template": 1})
    assert caplog.text.count(f"{path}:1: ") == 1 and caplog.text.count(f"{path}:4: ") == 1
