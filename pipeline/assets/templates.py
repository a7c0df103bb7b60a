"""Chat formats of the target families, for the tiny targets' tokenizers.

Each renders its family's real turn format (special tokens, headers, where the end-of-turn
token goes, what the generation prompt holds), written here for the tiny tokenizers: no
checkpoint is downloaded. The loss mask is found from the rendered text alone
(pipeline/data/encode.py), so each format only has to be the family's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class ChatFormat:
    special: tuple[str, ...]   # special tokens the template writes
    eos: str                   # ends an assistant turn (generation stops there)
    template: str              # Jinja
    bos: Optional[str] = None  # written by the template itself, never by the tokenizer


_REJECT = (r"{{- raise_exception('unknown role: ' + m['role']) -}}")

# Qwen3 and Qwen3-MoE: ChatML; an assistant turn after the last user message keeps its
# reasoning in a <think> block (an empty one when there was none), earlier ones lose it.
# Without thinking the generation prompt holds an empty think block.
_QWEN = (
    r"{%- set ns = namespace(last_user=-1) -%}"
    r"{%- for m in messages -%}{%- if m['role'] == 'user' -%}"
    r"{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    r"{%- for m in messages -%}"
    r"{%- if m['role'] in ['system', 'user'] -%}"
    r"{{- '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' -}}"
    r"{%- elif m['role'] == 'assistant' -%}"
    r"{%- set content = m['content'] -%}{%- set reasoning = m.get('reasoning_content') or '' -%}"
    r"{%- if '</think>' in content -%}"
    r"{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}"
    r"{%- set content = content.split('</think>')[-1] -%}{%- endif -%}"
    r"{%- set reasoning = reasoning.strip('\n') -%}{%- set content = content.lstrip('\n') -%}"
    r"{{- '<|im_start|>assistant\n' -}}"
    r"{%- if loop.index0 > ns.last_user -%}"
    r"{{- '<think>\n' + reasoning + '\n</think>\n\n' -}}"
    r"{%- endif -%}"
    r"{{- content + '<|im_end|>\n' -}}"
    r"{%- else -%}" + _REJECT + r"{%- endif -%}"
    r"{%- endfor -%}"
    r"{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}"
    r"{%- if enable_thinking is defined and not enable_thinking -%}"
    r"{{- '<think>\n\n</think>\n\n' -}}{%- else -%}{{- GEN_OPEN -}}{%- endif -%}"
    r"{%- endif -%}"
)
# Qwen3 leaves <think> for the model to write; Qwen3.5's prompt opens the block itself.
QWEN3_TEMPLATE = _QWEN.replace("{{- GEN_OPEN -}}", "")
QWEN35_TEMPLATE = _QWEN.replace("{{- GEN_OPEN -}}", r"{{- '<think>\n' -}}")
_QWEN_SPECIAL = ("<|im_start|>", "<|im_end|>", "<think>", "</think>")

# Llama 3: BOS, role headers, <|eot_id|> after every turn.
LLAMA3_TEMPLATE = (
    r"{{- bos_token -}}"
    r"{%- for m in messages -%}"
    r"{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + (m['content'] | trim)"
    r" + '<|eot_id|>' -}}"
    r"{%- endfor -%}"
    r"{%- if add_generation_prompt -%}"
    r"{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}"
)

# Mistral: [INST] ... [/INST], the answer right after it and </s>; a system message goes
# into the first user turn.
MISTRAL_TEMPLATE = (
    r"{{- bos_token -}}{%- set ns = namespace(system='') -%}"
    r"{%- for m in messages -%}"
    r"{%- if m['role'] == 'system' -%}{%- set ns.system = m['content'] + '\n\n' -%}"
    r"{%- elif m['role'] == 'user' -%}"
    r"{{- '[INST] ' + ns.system + m['content'] + ' [/INST]' -}}{%- set ns.system = '' -%}"
    r"{%- elif m['role'] == 'assistant' -%}{{- m['content'] + '</s>' -}}"
    r"{%- else -%}" + _REJECT + r"{%- endif -%}"
    r"{%- endfor -%}"
)

# Gemma 3: user/model turns, <end_of_turn>; a system message opens the first user turn.
GEMMA3_TEMPLATE = (
    r"{{- bos_token -}}{%- set ns = namespace(system='') -%}"
    r"{%- for m in messages -%}"
    r"{%- if m['role'] == 'system' -%}{%- set ns.system = m['content'] + '\n\n' -%}"
    r"{%- elif m['role'] in ['user', 'assistant'] -%}"
    r"{%- set role = 'model' if m['role'] == 'assistant' else 'user' -%}"
    r"{{- '<start_of_turn>' + role + '\n' + ns.system + (m['content'] | trim)"
    r" + '<end_of_turn>\n' -}}{%- set ns.system = '' -%}"
    r"{%- else -%}" + _REJECT + r"{%- endif -%}"
    r"{%- endfor -%}"
    r"{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}"
)

# gpt-oss (harmony): messages on channels; the last answer ends with <|return|>, which
# history rewrites to <|end|>; reasoning (``thinking``) goes on the analysis channel and is
# kept only for the last turn.
GPT_OSS_TEMPLATE = (
    r"{%- for m in messages -%}"
    r"{%- if m['role'] in ['system', 'user'] -%}"
    r"{{- '<|start|>' + m['role'] + '<|message|>' + m['content'] + '<|end|>' -}}"
    r"{%- elif m['role'] == 'assistant' -%}"
    r"{%- if loop.last and m.get('thinking') -%}"
    r"{{- '<|start|>assistant<|channel|>analysis<|message|>' + m['thinking'] + '<|end|>' -}}"
    r"{%- endif -%}"
    r"{{- '<|start|>assistant<|channel|>final<|message|>' + m['content'] -}}"
    r"{{- '<|return|>' if loop.last else '<|end|>' -}}"
    r"{%- else -%}" + _REJECT + r"{%- endif -%}"
    r"{%- endfor -%}"
    r"{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}"
)

# DeepSeek-V3: BOS and the system text, then <｜User｜> / <｜Assistant｜> turns, each answer
# ending with <｜end▁of▁sentence｜>.
DEEPSEEK_V3_TEMPLATE = (
    r"{{- bos_token -}}"
    r"{%- for m in messages -%}{%- if m['role'] == 'system' -%}{{- m['content'] -}}"
    r"{%- endif -%}{%- endfor -%}"
    r"{%- for m in messages -%}"
    r"{%- if m['role'] == 'user' -%}{{- '<｜User｜>' + m['content'] -}}"
    r"{%- elif m['role'] == 'assistant' -%}"
    r"{{- '<｜Assistant｜>' + m['content'] + '<｜end▁of▁sentence｜>' -}}"
    r"{%- elif m['role'] != 'system' -%}" + _REJECT + r"{%- endif -%}"
    r"{%- endfor -%}"
    r"{%- if add_generation_prompt -%}{{- '<｜Assistant｜>' -}}{%- endif -%}"
)

# Keyed by target model_type (pipeline/model/families.py).
CHAT_FORMATS: dict[str, ChatFormat] = {
    "qwen3": ChatFormat(_QWEN_SPECIAL, "<|im_end|>", QWEN3_TEMPLATE),
    "qwen3_moe": ChatFormat(_QWEN_SPECIAL, "<|im_end|>", QWEN3_TEMPLATE),
    "qwen3_5_text": ChatFormat(_QWEN_SPECIAL, "<|im_end|>", QWEN35_TEMPLATE),
    "llama": ChatFormat(("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                         "<|eot_id|>"), "<|eot_id|>", LLAMA3_TEMPLATE, "<|begin_of_text|>"),
    "mistral": ChatFormat(("<s>", "</s>", "[INST]", "[/INST]"), "</s>", MISTRAL_TEMPLATE, "<s>"),
    "gemma3_text": ChatFormat(("<bos>", "<start_of_turn>", "<end_of_turn>"), "<end_of_turn>",
                              GEMMA3_TEMPLATE, "<bos>"),
    "gpt_oss": ChatFormat(("<|start|>", "<|message|>", "<|channel|>", "<|end|>", "<|return|>"),
                          "<|return|>", GPT_OSS_TEMPLATE),
    "deepseek_v3": ChatFormat(("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>",
                               "<｜Assistant｜>"), "<｜end▁of▁sentence｜>", DEEPSEEK_V3_TEMPLATE,
                              "<｜begin▁of▁sentence｜>"),
}


def family_tokenizer(base, model_type: str):
    """A copy of the tiny BPE ``base`` carrying ``model_type``'s special tokens and template."""
    import copy

    fmt = CHAT_FORMATS[model_type]
    tok = copy.deepcopy(base)
    tok.add_special_tokens({"additional_special_tokens": list(fmt.special)})
    if fmt.bos:
        tok.bos_token = fmt.bos
    tok.eos_token = fmt.eos
    tok.chat_template = fmt.template
    return tok
