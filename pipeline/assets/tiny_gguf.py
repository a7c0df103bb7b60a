"""A tiny Llama written as a GGUF file, the way llama.cpp's converter lays one out.

A stand-in for a downloaded GGUF (SmolLM2-135M-Instruct's is a Llama with a byte-level BPE and
ChatML), small enough for CPU tests and the bench's tiny scale: float32 tensors under GGUF's
names, query and key rows interleaved for llama.cpp's rope (transformers undoes this on
load), and the tokenizer as GGUF metadata (``gpt2``-type: tokens, token types, merges, special
ids, chat template). Needs the ``gguf`` package (``pip install -e .[gguf]``).
"""

from __future__ import annotations

import json
from typing import Optional

import numpy as np

ARCH = "llama"
# llama.cpp's token types: what transformers reads to mark special tokens.
_NORMAL, _CONTROL = 1, 3
# Shared small dims: 6 layers (taps fit below the last), 4 heads of 16, 2 KV heads, tied
# embeddings like SmolLM2.
SMALL = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
             tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-5)

_LAYER_TENSORS = {  # HF name in a decoder layer -> GGUF name in blk.N
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def tiny_llama(tokenizer, seed: int = 0, **dims):
    """A random-weight LlamaForCausalLM at the small size for ``tokenizer``'s vocabulary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sizes = {**SMALL, **dims}
    theta = sizes.pop("rope_theta")
    config = LlamaConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id,
                         rope_parameters={"rope_type": "default", "rope_theta": theta}, **sizes)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def rope_interleave(weight: np.ndarray, heads: int) -> np.ndarray:
    """Rows of each head reordered from HF's rotate-half layout to llama.cpp's adjacent
    pairs: row (h, half, i) moves to (h, i, half)."""
    rows = weight.shape[0] // heads // 2
    return (weight.reshape(heads, 2, rows, *weight.shape[1:]).swapaxes(1, 2)
            .reshape(weight.shape))


def write_gguf(model, tokenizer, path: str, name: str = "tiny-llama") -> str:
    """``model`` (an HF Llama) and ``tokenizer`` (a byte-level BPE fast tokenizer with a chat
    template) as one GGUF file at ``path``."""
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(path, ARCH)
    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)
    _add_tokenizer(writer, tokenizer)
    for gguf_name, array in _tensors(model):
        writer.add_tensor(gguf_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _tensors(model) -> list[tuple[str, np.ndarray]]:
    config = model.config
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out = [("token_embd.weight", state["model.embed_tokens.weight"]),
           ("output_norm.weight", state["model.norm.weight"])]
    if not config.tie_word_embeddings:
        out.append(("output.weight", state["lm_head.weight"]))
    for i in range(config.num_hidden_layers):
        for hf, gg in _LAYER_TENSORS.items():
            array = state[f"model.layers.{i}.{hf}"]
            if hf == "self_attn.q_proj.weight":
                array = rope_interleave(array, config.num_attention_heads)
            elif hf == "self_attn.k_proj.weight":
                array = rope_interleave(array, config.num_key_value_heads)
            out.append((f"blk.{i}.{gg}", np.ascontiguousarray(array)))
    return out


def _add_tokenizer(writer, tokenizer) -> None:
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    tokens = [None] * len(vocab)
    for token, index in vocab.items():
        tokens[index] = token
    special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([_CONTROL if i in special else _NORMAL for i in range(len(tokens))])
    writer.add_token_merges(merges)
    # transformers 5.17 reads a gpt2-type GGUF tokenizer only when the file names a BOS
    # token (SmolLM2's does); a tokenizer without one gets its pad token there, as GPT-2's
    # <|endoftext|> is both. A gpt2-type tokenizer never adds it to the text.
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.pad_token_id
    for add, token_id in ((writer.add_bos_token_id, bos),
                          (writer.add_eos_token_id, tokenizer.eos_token_id),
                          (writer.add_pad_token_id, tokenizer.pad_token_id)):
        if token_id is not None:
            add(int(token_id))
    template: Optional[str] = tokenizer.chat_template
    if template:
        writer.add_chat_template(template)


def write_tiny_gguf(path: str, seed: int = 0, **dims) -> str:
    """A tiny Llama with the demo's tokenizer (byte-level BPE, ChatML, ``<|mask|>`` at id 3)
    written to ``path``."""
    from pipeline.assets.family_targets import tiny_base_tokenizer

    tokenizer = tiny_base_tokenizer()
    return write_gguf(tiny_llama(tokenizer, seed, **dims), tokenizer, path)
