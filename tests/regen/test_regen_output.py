"""The output file's resume scan and the options' checks: no model, no Ray."""

import json

import pytest

from pipeline.regen.config import AUTO_COMPILE_FLOP, RegenConfig, compile_choice
from pipeline.regen.messages import GenResult, TurnResult
from pipeline.regen.output import format_record, resume_output


FINGERPRINT = {"input": "0" * 16, "target": "1" * 16, "chat_template": "2" * 16,
               "enable_thinking": True, "max_new_tokens": 8}


def _record(line, text="answer"):
    result = GenResult(line, ({"role": "user", "content": "q"},
                              {"role": "assistant", "content": text}),
                       (TurnResult(text, 3, True),), on_main_thread=True)
    return format_record(result, FINGERPRINT)


def _lines(path):
    return [d.source_line for d in resume_output(str(path))]


def test_missing_output_resumes_from_nothing(tmp_path):
    assert resume_output(str(tmp_path / "none.jsonl")) == []


def test_partial_last_line_is_cut_off(tmp_path):
    path = tmp_path / "out.jsonl"
    whole = _record(0) + _record(3)
    path.write_text(whole + _record(4)[:17], encoding="utf-8")
    assert _lines(path) == [0, 3]
    assert path.read_text(encoding="utf-8") == whole


def test_line_separators_inside_strings_are_not_line_ends(tmp_path):
    # ensure_ascii=False leaves U+2028 raw; str.splitlines would split the record there.
    path = tmp_path / "out.jsonl"
    path.write_text(_record(0, "a\u2028b\x1cc") + _record(1), encoding="utf-8")
    assert _lines(path) == [0, 1]
    assert json.loads(path.read_text(encoding="utf-8").split("\n")[0])["messages"][1][
        "content"] == "a\u2028b\x1cc"


@pytest.mark.parametrize("line", ["not json", json.dumps({"messages": []})])
def test_foreign_output_is_an_error_and_left_alone(tmp_path, line):
    path = tmp_path / "out.jsonl"
    text = _record(0) + line + "\n" + "partial"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"{path}:2: "):
        resume_output(str(path))
    assert path.read_text() == text


def test_record_is_openai_messages_plus_source_line():
    record = json.loads(_record(7))
    assert record["source_line"] == 7
    assert record["messages"][1] == {"role": "assistant", "content": "answer"}
    assert record["regen"] == {"num_tokens": [3], "finished": [True], "round_trips": [True]}
    assert record["fingerprint"] == FINGERPRINT


def test_a_record_reads_back_with_its_fingerprint_and_trains_as_a_chat(tmp_path):
    """The resume scan gives each record's fingerprint back (None for a record of an earlier
    version); the training data reader takes a record as a chat and ignores the rest."""
    from pipeline.data.reader import parse_line

    path = tmp_path / "out.jsonl"
    old = json.loads(_record(1))
    del old["fingerprint"]
    path.write_text(_record(0) + json.dumps(old) + "\n", encoding="utf-8")
    assert resume_output(str(path)) == [(0, FINGERPRINT), (1, None)]
    assert parse_line(_record(0)) == [{"role": "user", "content": "q"},
                                      {"role": "assistant", "content": "answer"}]


@pytest.mark.parametrize("override, flag", [
    ({"batch_size": 0}, "--batch-size=0"), ({"num_workers": True}, "--num-workers=True"),
    ({"device": "tpu"}, "--device='tpu'"), ({"on_bad_line": "warn"}, "--on-bad-line='warn'"),
    ({"format": "csv"}, "--format='csv'"), ({"dtype": "int8"}, "--dtype='int8'"),
    ({"static_attention": "flash"}, "--static-attention='flash'"),
    ({"static_rows": 0}, "--static-rows=0"),
    ({"static_compile": True, "static_attention": "sdpa"}, "--static-compile=True"),
    ({"static_compile": True, "engine": "cb"}, "--static-compile=True"),
    ({"static_compile_prefill": True, "engine": "cb"}, "--static-compile-prefill=True")])
def test_bad_option_names_the_flag(tmp_path, override, flag):
    src = tmp_path / "in.jsonl"
    src.write_text("")
    with pytest.raises(ValueError, match=f"{flag} is not allowed"):
        RegenConfig(input=str(src), output=str(tmp_path / "out.jsonl"), **override)


@pytest.mark.parametrize("step, prefill, said", [
    (True, True, "compiles its decode step and prefills on its first call"),
    (False, True, "compiles its prefills on its first call"),
    (True, False, "compiles its decode step on its first call"),
    (False, False, "compiles nothing")])
def test_explicit_compiles_are_kept_and_said(step, prefill, said):
    """Set both ways, the compiles are as given, whatever the run's size or device; the
    generator's line announces the minutes a worker's first call spends compiling."""
    for device, tokens in (("cuda", 10**12), ("cuda", 1), ("cpu", 10**12)):
        choice = compile_choice(step, prefill, "triton", device, 8 * 10**9, tokens)
        assert (choice.step, choice.prefill, choice.auto) == (step, prefill, "")
        assert choice.note() == said or choice.note().startswith(said + ":")


def test_an_asked_step_compile_where_auto_attention_picked_sdpa_is_refused(tmp_path):
    """``--static-compile`` with auto attention passes the options' check; the worker, which
    knows what auto picked, refuses it in one line where that is not a row-length step."""
    src = tmp_path / "in.jsonl"
    src.write_text("")
    RegenConfig(input=str(src), output=str(tmp_path / "out.jsonl"), static_compile=True)
    with pytest.raises(ValueError, match="auto picked sdpa here .*drop --static-compile"):
        compile_choice(True, None, "sdpa", "cpu", 10, 10)
    assert compile_choice(True, None, "triton", "cpu", 10, 10).step


def test_auto_compiles_a_large_run_on_cuda_only():
    """Auto (None) turns both compiles on where the worker's answers are worth
    AUTO_COMPILE_FLOP; the step only with an attention that reads each row to its length."""
    params = 8 * 10**9
    enough = int(AUTO_COMPILE_FLOP / (2 * params)) + 1
    big = compile_choice(None, None, "triton", "cuda", params, enough)
    assert big.step and big.prefill and "at or above" in big.auto
    assert "compiles its decode step and prefills" in big.note()
    small = compile_choice(None, None, "triton", "cuda", params, enough - 2)
    assert not small.step and not small.prefill and "below" in small.auto
    assert small.note().startswith("compiles nothing (auto:")
    sdpa = compile_choice(None, None, "sdpa", "cuda", params, enough)
    assert not sdpa.step and sdpa.prefill
    unknown = compile_choice(None, None, "varlen", "cuda", params, None)
    assert not unknown.step and not unknown.prefill and "answer tokens unknown" in unknown.auto
    cpu = compile_choice(None, None, "varlen", "cpu", params, 10**15)
    assert not cpu.step and not cpu.prefill and cpu.auto.startswith("auto: never on cpu;")
    # One set, the other auto: the set one as given, the other chosen.
    mixed = compile_choice(False, None, "triton", "cuda", params, enough)
    assert not mixed.step and mixed.prefill


def test_missing_input_and_output_onto_input(tmp_path):
    with pytest.raises(ValueError, match="--input="):
        RegenConfig(input=str(tmp_path / "nope.jsonl"), output=str(tmp_path / "o.jsonl"))
    src = tmp_path / "in.jsonl"
    src.write_text("")
    with pytest.raises(ValueError, match="--output="):
        RegenConfig(input=str(src), output=str(src))
