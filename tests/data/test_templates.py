"""The loss mask under real chat templates (Qwen3, Llama 3), checked token by token.

Each expected segment is written out by hand as (text, supervised) pieces: the text the target
saw, and which parts of it the target generated. The expected mask marks every token whose
characters fall in a supervised piece.
"""

import re

import pytest

from pipeline.data import ChatDataset, DataConfig, encode_conversation
from pipeline.data.dataset import SEGMENT_STRIDE
from pipeline.data.encode import render_segments
from pipeline.eval.tau import heldout_prompts
from pipeline.regen.greedy import round_trips

SYS = {"role": "system", "content": "You explain Python."}
U1 = {"role": "user", "content": "What does pass do?"}
U2 = {"role": "user", "content": "And None?"}
THINK1 = "<think>\nThe user asks about pass.\n</think>\n\nIt does nothing."
THINK2 = "<think>\nNone is a singleton.\n</think>\n\nNone is the null object."
QWEN_SYS = "<|im_start|>system\nYou explain Python.<|im_end|>\n"
QWEN_U1 = "<|im_start|>user\nWhat does pass do?<|im_end|>\n"
QWEN_U2 = "<|im_start|>user\nAnd None?<|im_end|>\n"
QWEN_A = "<|im_start|>assistant\n"
EMPTY_THINK = "<think>\n\n</think>\n\n"


def expected(tokenizer, pieces):
    """(ids, mask) of the concatenated pieces: 1 for tokens inside a supervised piece."""
    text, spans, at = "", [], 0
    for piece, supervised in pieces:
        if supervised:
            spans.append((at, at + len(piece)))
        text, at = text + piece, at + len(piece)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(s < e_tok and b_tok < e for s, e in spans) and b_tok < e_tok)
            for b_tok, e_tok in enc["offset_mapping"]]
    return list(enc["input_ids"]), mask


def supervised_text(tokenizer, ids, mask):
    runs, current = [], []
    for token, m in zip(ids, mask):
        if m:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    return runs + ([tokenizer.decode(current)] if current else [])


def check(tokenizer, messages, segments, enable_thinking=True):
    got = encode_conversation(tokenizer, messages, max_length=4096,
                              enable_thinking=enable_thinking)
    assert len(got) == len(segments)
    for (ids, mask), pieces in zip(got, segments):
        want_ids, want_mask = expected(tokenizer, pieces)
        assert tokenizer.decode(ids) == "".join(p for p, _ in pieces)
        assert ids == want_ids
        assert mask == want_mask  # token by token
        assert supervised_text(tokenizer, ids, mask) == [p for p, s in pieces if s]


@pytest.mark.parametrize("as_reasoning_content", [False, True])
def test_qwen3_multi_turn_with_thinking(family_tokenizer, as_reasoning_content):
    tok = family_tokenizer("qwen3")

    def answer(text):
        if not as_reasoning_content:
            return {"role": "assistant", "content": text}
        reasoning, content = text.split("</think>\n\n")
        return {"role": "assistant", "content": content,
                "reasoning_content": reasoning.removeprefix("<think>\n").rstrip("\n")}

    messages = [SYS, U1, answer(THINK1), U2, answer(THINK2)]
    # Qwen3 drops turn 1's reasoning from the history of turn 2: two sequences, each as the
    # target saw it, each supervising the turn generated in it, reasoning included.
    check(tok, messages, [
        [(QWEN_SYS + QWEN_U1 + QWEN_A, 0), (THINK1 + "<|im_end|>", 1)],
        [(QWEN_SYS + QWEN_U1 + QWEN_A + "It does nothing.<|im_end|>\n" + QWEN_U2 + QWEN_A, 0),
         (THINK2 + "<|im_end|>", 1)],
    ])


def test_qwen3_multi_turn_without_thinking(family_tokenizer):
    tok = family_tokenizer("qwen3")
    messages = [SYS, U1, {"role": "assistant", "content": "It does nothing."}, U2,
                {"role": "assistant", "content": "None is the null object."}]
    # The empty think block belongs to the prompt (the target never wrote it); history keeps
    # no think block at all, so again two sequences.
    check(tok, messages, [
        [(QWEN_SYS + QWEN_U1 + QWEN_A + EMPTY_THINK, 0), ("It does nothing.<|im_end|>", 1)],
        [(QWEN_SYS + QWEN_U1 + QWEN_A + "It does nothing.<|im_end|>\n" + QWEN_U2 + QWEN_A
          + EMPTY_THINK, 0), ("None is the null object.<|im_end|>", 1)],
    ], enable_thinking=False)


def test_qwen3_tool_call_and_tool_result(family_tokenizer):
    tok = family_tokenizer("qwen3")
    call = ('<think>\nLook it up.\n</think>\n\n<tool_call>\n{"name": "docs", '
            '"arguments": {"q": "pass"}}\n</tool_call>')
    messages = [SYS, U1, {"role": "assistant", "content": call},
                {"role": "tool", "content": "pass: a null operation"},
                {"role": "assistant", "content": THINK1}]
    # After the last user query Qwen3 keeps reasoning, so the tool round trip is one sequence;
    # the tool result is context.
    check(tok, messages, [[
        (QWEN_SYS + QWEN_U1 + QWEN_A, 0), (call + "<|im_end|>", 1),
        ("\n<|im_start|>user\n<tool_response>\npass: a null operation\n</tool_response>"
         "<|im_end|>\n" + QWEN_A, 0), (THINK1 + "<|im_end|>", 1)]])


LLAMA_H = "<|start_header_id|>{}<|end_header_id|>\n\n"


def test_llama3_system_multi_turn_and_tool(family_tokenizer):
    tok = family_tokenizer("llama3")
    messages = [SYS, U1, {"role": "assistant", "content": "It does nothing."},
                {"role": "tool", "content": "42"}, U2,
                {"role": "assistant", "content": "None is the null object."}]
    check(tok, messages, [[
        ("<|begin_of_text|>" + LLAMA_H.format("system") + "You explain Python.<|eot_id|>"
         + LLAMA_H.format("user") + "What does pass do?<|eot_id|>" + LLAMA_H.format("assistant"),
         0),
        ("It does nothing.<|eot_id|>", 1),
        (LLAMA_H.format("tool") + "42<|eot_id|>" + LLAMA_H.format("user") + "And None?<|eot_id|>"
         + LLAMA_H.format("assistant"), 0),
        ("None is the null object.<|eot_id|>", 1)]])


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_conversation_ending_on_a_user_turn(family_tokenizer, family):
    tok = family_tokenizer(family)
    messages = [U1, {"role": "assistant", "content": "It does nothing."}, U2]
    [(ids, mask)] = encode_conversation(tok, messages, max_length=4096, enable_thinking=False)
    # The sequence ends with the answer's end-of-turn token: the trailing user turn is dropped
    # (it cannot change what a causal target computed before it).
    assert mask[-1] == 1 and ids[-1] == tok.eos_token_id
    assert supervised_text(tok, ids, mask) == ["It does nothing." + tok.eos_token]


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_real_templates_have_no_generation_markers(family_tokenizer, family):
    # What makes rendering each turn against its own prompt necessary.
    assert not re.search(r"{%-?\s*generation\s*-?%}", family_tokenizer(family).chat_template)


def test_segments_become_samples_with_stable_ids(family_tokenizer, write_jsonl):
    tok = family_tokenizer("qwen3")
    long1 = THINK1 + " pass" * 20
    long2 = THINK2 + " None" * 20
    two_turns = {"messages": [U1, {"role": "assistant", "content": long1}, U2,
                              {"role": "assistant", "content": long2}]}
    one_turn = {"messages": [U1, {"role": "assistant", "content": long1}]}
    ds = ChatDataset(write_jsonl([one_turn, two_turns]), tok, DataConfig(), block_size=4)
    assert ds.sample_ids == [0, 1, SEGMENT_STRIDE + 1]
    assert ds.stats.kept == 3 and ds.stats.split_segments == 1
    # The first segment of line 1 is line 0's sample: the same turn after the same prompt.
    assert ds[0].input_ids.tolist() == ds[1].input_ids.tolist()


def test_enable_thinking_reaches_the_eval_prompts(family_tokenizer, write_jsonl):
    tok = family_tokenizer("qwen3")
    path = write_jsonl([{"messages": [U1, {"role": "assistant", "content": "x"}]}])
    on, = heldout_prompts(path, tok, 1, enable_thinking=True)
    off, = heldout_prompts(path, tok, 1, enable_thinking=False)
    assert tok.decode(on).endswith(QWEN_A)
    assert tok.decode(off) == tok.decode(on) + EMPTY_THINK
    # Training renders the same prompt before the supervised answer.
    [segment] = render_segments(tok, [U1, {"role": "assistant", "content": "x"}], False)
    assert segment.text[:segment.spans[0][0]] == tok.decode(off)


@pytest.mark.parametrize("text,thinking,ok", [
    (THINK1, True, True),  # as Qwen3 writes it
    ("It does nothing.", False, True),  # the prompt held the empty think block
    # With thinking on, the template would add an empty think block the target never wrote.
    ("It does nothing.", True, False),
    ("<think>\n\nThe user asks.\n\n</think>\n\nIt does.", True, False),  # re-spaced
])
def test_regenerated_turns_round_trip_through_the_template(family_tokenizer, text, thinking,
                                                           ok):
    tok = family_tokenizer("qwen3")
    messages = [U1, {"role": "assistant", "content": text}]
    assert round_trips(tok, messages, 1, text, [tok.eos_token_id], thinking) is ok
