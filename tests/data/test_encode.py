import copy

import pytest

from pipeline.data import encode_conversation

MULTI_TURN = [
    {"role": "system", "content": "You explain Python."},
    {"role": "user", "content": "What does pass do?"},
    {"role": "assistant", "content": "It does nothing."},
    {"role": "user", "content": "And None?"},
    {"role": "assistant", "content": "None is the null object."},
]


def runs(ids, mask):
    """Contiguous runs of supervised token ids."""
    out, current = [], []
    for token, m in zip(ids, mask):
        if m:
            current.append(token)
        elif current:
            out.append(current)
            current = []
    return out + ([current] if current else [])


def test_exactly_assistant_content_and_end_of_turn_are_supervised(tiny_tokenizer):
    # The tiny template is ChatML; written out here, independently of the code under test.
    segments = [
        ("<|im_start|>system\nYou explain Python.<|im_end|>\n<|im_start|>user\n"
         "What does pass do?<|im_end|>\n<|im_start|>assistant\n", 0),
        ("It does nothing.<|im_end|>", 1),
        ("\n<|im_start|>user\nAnd None?<|im_end|>\n<|im_start|>assistant\n", 0),
        ("None is the null object.<|im_end|>", 1),
    ]
    expected_ids, expected_mask = [], []
    for text, supervised in segments:
        ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
        expected_ids += ids
        expected_mask += [supervised] * len(ids)

    [(ids, mask)] = encode_conversation(tiny_tokenizer, MULTI_TURN, max_length=512)

    # The template only appends, so one sequence; it ends at the last end-of-turn token.
    assert ids == expected_ids
    assert mask == expected_mask
    assert [tiny_tokenizer.decode(r) for r in runs(ids, mask)] == [
        "It does nothing.<|im_end|>", "None is the null object.<|im_end|>"]


def test_end_of_turn_comes_from_the_template(tiny_tokenizer):
    # A template that is not ChatML: the turn ends with <|endoftext|> and no newline.
    other = copy.deepcopy(tiny_tokenizer)
    other.chat_template = (
        "{% for m in messages %}{{ '### ' + m['role'] + ': ' + m['content'] + '<|endoftext|>' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '### assistant: ' }}{% endif %}")
    [(ids, mask)] = encode_conversation(other, MULTI_TURN, max_length=512)
    # "assistant: It" tokenizes as "assistant:", " It": the token that straddles the header's
    # space and the answer is supervised, since the model has to produce it.
    assert [other.decode(r) for r in runs(ids, mask)] == [
        " It does nothing.<|endoftext|>", " None is the null object.<|endoftext|>"]


def test_short_answer_is_not_found_inside_template_markup(tiny_tokenizer):
    # "im" occurs in "<|im_end|>" of the user turn and "user" in its header; the answer's
    # real position is after the assistant header.
    messages = [{"role": "user", "content": "user"}, {"role": "assistant", "content": "im"}]
    [(ids, mask)] = encode_conversation(tiny_tokenizer, messages, max_length=512)
    [run] = runs(ids, mask)
    assert tiny_tokenizer.decode(run) == "im<|im_end|>"
    header = tiny_tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert ids[mask.index(1) - len(header):mask.index(1)] == header


def test_truncation_cuts_ids_and_mask_together(tiny_tokenizer):
    [(full_ids, full_mask)] = encode_conversation(tiny_tokenizer, MULTI_TURN, max_length=512)
    [(ids, mask)] = encode_conversation(tiny_tokenizer, MULTI_TURN, max_length=30)
    assert len(full_ids) > 30
    assert (ids, mask) == (full_ids[:30], full_mask[:30])


def test_template_that_hides_an_answer_is_an_error(tiny_tokenizer):
    other = copy.deepcopy(tiny_tokenizer)
    other.chat_template = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] | upper }}"
                           "{% endfor %}")
    with pytest.raises(ValueError, match="assistant turn 2: its content is not in the text"):
        encode_conversation(other, MULTI_TURN, max_length=512)
