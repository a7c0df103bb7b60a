"""The loss mask under each supported family's chat format (pipeline/assets/templates.py):
what the target generated, written out by hand per family, and checked by perturbation
(changing the context moves no supervised text; changing an answer moves no context)."""

import pytest

from pipeline.assets.templates import CHAT_FORMATS, family_tokenizer
from pipeline.data import encode_conversation

SYS = {"role": "system", "content": "You explain Python."}
U1 = {"role": "user", "content": "What does pass do?"}
U2 = {"role": "user", "content": "And None?"}
A1 = {"role": "assistant", "content": "It does nothing."}
A2 = {"role": "assistant", "content": "None is the null object."}
CONVERSATION = [SYS, U1, A1, U2, A2]

# Per family: the supervised runs of each segment of CONVERSATION (thinking off), as text.
EXPECTED = {
    # Qwen drops history's think blocks, so turn 2's prompt rewrites turn 1: two sequences.
    "qwen3": [["It does nothing.<|im_end|>"], ["None is the null object.<|im_end|>"]],
    "qwen3_moe": [["It does nothing.<|im_end|>"], ["None is the null object.<|im_end|>"]],
    "qwen3_5_text": [["It does nothing.<|im_end|>"], ["None is the null object.<|im_end|>"]],
    # Llama 3: the header is the prompt's; the answer and <|eot_id|> are generated.
    "llama": [["It does nothing.<|eot_id|>", "None is the null object.<|eot_id|>"]],
    "mistral": [["It does nothing.</s>", "None is the null object.</s>"]],
    "gemma3_text": [["It does nothing.<end_of_turn>", "None is the null object.<end_of_turn>"]],
    # gpt-oss: the target writes the channel and <|return|>, which history turns into <|end|>.
    "gpt_oss": [["<|channel|>final<|message|>It does nothing.<|return|>"],
                ["<|channel|>final<|message|>None is the null object.<|return|>"]],
    "deepseek_v3": [["It does nothing.<｜end▁of▁sentence｜>",
                     "None is the null object.<｜end▁of▁sentence｜>"]],
}


@pytest.fixture(scope="module")
def chat_tokenizer(tiny_tokenizer):
    cache = {}

    def get(model_type):
        if model_type not in cache:
            cache[model_type] = family_tokenizer(tiny_tokenizer, model_type)
        return cache[model_type]
    return get


def runs(tokenizer, ids, mask, value=1):
    """The decoded runs of tokens whose mask is ``value``."""
    out, current = [], []
    for token, m in zip(ids + [None], mask + [1 - value]):
        if m == value:
            current.append(token)
        elif current:
            out.append(tokenizer.decode(current))
            current = []
    return out


def segments(tokenizer, messages, thinking=False):
    return encode_conversation(tokenizer, messages, max_length=4096, enable_thinking=thinking)


def test_every_family_has_a_chat_format():
    assert set(EXPECTED) == set(CHAT_FORMATS)


@pytest.mark.parametrize("model_type", sorted(EXPECTED))
def test_supervised_text_is_what_the_target_wrote(chat_tokenizer, model_type):
    tok = chat_tokenizer(model_type)
    got = [runs(tok, ids, mask) for ids, mask in segments(tok, CONVERSATION)]
    assert got == EXPECTED[model_type]
    for ids, mask in segments(tok, CONVERSATION):
        assert ids[-1] == tok.eos_token_id and mask[-1] == 1  # the turn's end is supervised
        assert "What does pass do?" in runs(tok, ids, mask, value=0)[0]  # context


@pytest.mark.parametrize("model_type", sorted(EXPECTED))
def test_mask_moves_with_the_turns_not_the_words(chat_tokenizer, model_type):
    tok = chat_tokenizer(model_type)
    base = segments(tok, CONVERSATION)
    # Another question and system text: the same supervised text.
    asked = segments(tok, [{"role": "system", "content": "Be brief."}, U1, A1,
                           {"role": "user", "content": "What is the value of None here?"}, A2])
    assert [runs(tok, i, m) for i, m in asked] == [runs(tok, i, m) for i, m in base]
    # Another answer: the same context, and the new words supervised.
    other = dict(A2, content="It is the object that means no value.")
    answered = segments(tok, [SYS, U1, A1, U2, other])
    assert [runs(tok, i, m, 0) for i, m in answered] == [runs(tok, i, m, 0) for i, m in base]
    assert "It is the object that means no value." in runs(tok, *answered[-1])[-1]


def test_qwen35_thinking_is_generated_after_the_opened_block(chat_tokenizer):
    """Qwen3.5's generation prompt opens <think> itself: the target writes the reasoning from
    its first line, closes the block and answers."""
    tok = chat_tokenizer("qwen3_5_text")
    answer = {"role": "assistant", "content": "<think>\nThe user asks.\n</think>\n\nIt does."}
    [(ids, mask)] = segments(tok, [U1, answer], thinking=True)
    assert runs(tok, ids, mask) == ["The user asks.\n</think>\n\nIt does.<|im_end|>"]
    assert tok.decode(ids).count("<think>") == 1
    [(ids, mask)] = segments(tok, [U1, A1], thinking=False)  # the prompt holds an empty block
    assert runs(tok, ids, mask) == ["It does nothing.<|im_end|>"]
    assert runs(tok, ids, mask, 0)[-1].endswith("<think>\n\n</think>\n\n")


def test_gpt_oss_reasoning_channel_is_generated_too(chat_tokenizer):
    tok = chat_tokenizer("gpt_oss")
    answer = dict(A1, thinking="Pass is a no-op.")
    [(ids, mask)] = segments(tok, [U1, answer])
    assert runs(tok, ids, mask) == [
        "<|channel|>analysis<|message|>Pass is a no-op.<|end|><|start|>assistant"
        "<|channel|>final<|message|>It does nothing.<|return|>"]
    assert runs(tok, ids, mask, 0) == ["<|start|>user<|message|>What does pass do?<|end|>"
                                       "<|start|>assistant"]
