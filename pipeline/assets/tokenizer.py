"""A small byte-level BPE tokenizer with a ChatML chat template, trained locally.

Special tokens follow Qwen3's names: ``<|endoftext|>`` pads, ``<|im_end|>`` ends a turn (the
eos), ``<|im_start|>`` opens one, and ``<|mask|>`` is the mask token DFlash blocks are filled
with; it has a real row in the target's embedding because the vocabulary includes it.
"""

from __future__ import annotations

from typing import Iterable

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MASK_TOKEN = "<|mask|>"
# Order fixes their ids: 0, 1, 2, 3.
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END, MASK_TOKEN)
ROLES = ("system", "user", "assistant")

# ChatML. Jinja reads the "\n" escapes, so this is a raw string.
CHAT_TEMPLATE = (
    r"{%- for message in messages -%}"
    r"{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    r"{{- raise_exception('unknown role: ' + message['role']) -}}"
    r"{%- endif -%}"
    r"{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}"
    r"{%- endfor -%}"
    r"{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)


def build_tokenizer(texts: Iterable[str], vocab_size: int):
    """Train a byte-level BPE on ``texts`` and wrap it as a transformers fast tokenizer.

    Training is deterministic for the same texts. The role names are added to the training
    text so that each chat header is a few whole tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    headers = [f"{role}\n" for role in ROLES] * 64
    core.train_from_iterator([*texts, *headers], trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD_TOKEN, eos_token=IM_END, mask_token=MASK_TOKEN,
        additional_special_tokens=[IM_START], chat_template=CHAT_TEMPLATE)
