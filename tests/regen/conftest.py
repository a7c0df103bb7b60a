"""Fixtures for the regeneration tests: a small chat file and the target's own answers to it.

The reference answers are computed the plain way, one conversation and one turn at a time,
with no padding, so comparing against them checks that batching does not change a token.
"""

import json

import pytest
import torch

MAX_NEW_TOKENS = 16


def _conversations(prompts):
    """Six conversations: plain, with a system turn, multi-turn, a trailing user turn (which
    gets answered)."""
    return [
        [{"role": "user", "content": prompts[0]}, {"role": "assistant", "content": "old"}],
        [{"role": "system", "content": "Answer about Python."},
         {"role": "user", "content": prompts[1]}, {"role": "assistant", "content": "old"}],
        [{"role": "user", "content": prompts[2][:60]}, {"role": "assistant", "content": "a"},
         {"role": "user", "content": prompts[3][:30]}, {"role": "assistant", "content": "b"}],
        [{"role": "user", "content": prompts[4][:25]}, {"role": "assistant", "content": "old"}],
        [{"role": "user", "content": prompts[5]}, {"role": "assistant", "content": "old"},
         {"role": "user", "content": "And then?"}],
        [{"role": "user", "content": prompts[6][:80]}, {"role": "assistant", "content": "x"}],
    ]


@pytest.fixture(scope="session")
def max_new_tokens():
    return MAX_NEW_TOKENS


@pytest.fixture(scope="session")
def chats(tiny_assets):
    """(conversations in OpenAI form, their 0-based line indices in :func:`chat_file`)."""
    with open(tiny_assets.heldout_path) as f:
        prompts = [json.loads(line)["messages"][0]["content"] for line in f]
    # A blank line after the third conversation: ids are line indices, blanks included.
    return _conversations(prompts), [0, 1, 2, 4, 5, 6]


def chat_lines(conversations):
    """JSONL lines for ``conversations``; the fourth in ShareGPT form, the rest OpenAI."""
    sharegpt = {"user": "human", "assistant": "gpt", "system": "system"}
    lines = [json.dumps({"messages": c}) for c in conversations]
    lines[3] = json.dumps({"conversations": [{"from": sharegpt[m["role"]],
                                              "value": m["content"]}
                                             for m in conversations[3]]})
    return lines[:3] + [""] + lines[3:]


@pytest.fixture(scope="session")
def chat_file(chats, tmp_path_factory):
    path = tmp_path_factory.mktemp("regen") / "chats.jsonl"
    path.write_text("\n".join(chat_lines(chats[0])) + "\n")
    return str(path)


def _answer_one_by_one(model, tokenizer, messages, max_new_tokens):
    eos = model.generation_config.eos_token_id
    out = [dict(m) for m in messages]
    if out[-1]["role"] == "user":  # the answer to a trailing user turn is appended
        out.append({"role": "assistant", "content": ""})
    for i, message in enumerate(out):
        if message["role"] != "assistant":
            continue
        ids = tokenizer.apply_chat_template(out[:i], add_generation_prompt=True,
                                            return_dict=True, return_tensors="pt")["input_ids"]
        row = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new_tokens)[0, ids.shape[1]:].tolist()
        row = row[:row.index(eos)] if eos in row else row
        out[i] = {"role": "assistant", "content": tokenizer.decode(row)}
    return out


@pytest.fixture(scope="session")
def reference(tiny_assets, chats):
    """Each conversation with its assistant turns answered one by one, unpadded."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_assets.target_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_assets.target_dir,
                                                 dtype=torch.float32).eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a busy 2-core machine, 2 threads are 30x slower
    try:
        with torch.no_grad():
            return [_answer_one_by_one(model, tokenizer, c, MAX_NEW_TOKENS) for c in chats[0]]
    finally:
        torch.set_num_threads(threads)
