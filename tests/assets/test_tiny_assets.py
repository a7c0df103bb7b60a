"""The built tiny assets: a loadable Qwen3 target, its tokenizer, and chat data it wrote."""

import json
import os
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.assets.generate import stop_token_ids
from pipeline.data import ChatDataset, DataConfig, read_conversations


@pytest.fixture(scope="module")
def target(tiny_assets):
    model = AutoModelForCausalLM.from_pretrained(tiny_assets.target_dir)
    return model.eval(), AutoTokenizer.from_pretrained(tiny_assets.target_dir)


def test_target_is_a_real_qwen3(tiny_assets, target):
    model, tokenizer = target
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert os.path.exists(os.path.join(tiny_assets.target_dir, "model.safetensors"))
    cfg = model.config
    assert cfg.num_hidden_layers == 8 and not cfg.tie_word_embeddings
    assert cfg.vocab_size == len(tokenizer) == tiny_assets.manifest()["vocab_size"]
    assert model.get_output_embeddings().weight.data_ptr() != (
        model.get_input_embeddings().weight.data_ptr())


def test_special_tokens(target):
    model, tokenizer = target
    assert tokenizer.is_fast
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.mask_token == "<|mask|>"
    # DFlash fills blocks with the mask token through the target's own embedding.
    assert 0 <= tokenizer.mask_token_id < model.get_input_embeddings().weight.shape[0]
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    ids = tokenizer("<|im_start|>user\n<|mask|><|im_end|>", add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids[0]) == "<|im_start|>"
    assert tokenizer.mask_token_id in ids and tokenizer.eos_token_id in ids


def test_chat_template(target):
    _, tokenizer = target
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
                    "<|im_start|>assistant\n")


@pytest.mark.parametrize("text", [
    'The "if" statement ::= "if" assignment_expression ":" suite',
    "Unicode: “quotes” — dashes … and ß\n\n    indented\tcode()",
])
def test_tokenizer_round_trips(target, text):
    _, tokenizer = target
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text


def test_data_files_parse_and_every_sample_is_kept(tiny_assets):
    manifest = tiny_assets.manifest()
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets.target_dir)
    for split, path in (("train", tiny_assets.train_path), ("heldout", tiny_assets.heldout_path)):
        stats = manifest["data"][split]
        conversations = list(read_conversations(path, fmt="messages"))
        # The build generates until it has its planned count, whatever the float results of
        # this machine made of the target: the count is the recipe's, everywhere.
        assert len(conversations) == stats["kept"] == manifest["recipe"][f"num_{split}"]
        assert stats["prompts"] - stats["too_short"] >= stats["kept"]
        assert all([m["role"] for m in c.messages] == ["user", "assistant"]
                   for c in conversations)
        # Block size 16 needs 32 supervised tokens: every answer has them.
        ds = ChatDataset(path, tokenizer, DataConfig(format="messages"), block_size=16)
        assert len(ds) == stats["kept"] and ds.stats.dropped_too_short == 0


def test_prompts_of_the_two_splits_differ(tiny_assets):
    def prompts(path):
        return {c.messages[0]["content"] for c in read_conversations(path)}
    assert not prompts(tiny_assets.train_path) & prompts(tiny_assets.heldout_path)


@pytest.mark.slow
def test_answers_are_the_targets_greedy_continuations(tiny_assets, target):
    # Regenerated one prompt at a time with plain HF generate: independent of the batched,
    # left-padded generation the build used.
    model, tokenizer = target
    max_new = tiny_assets.manifest()["recipe"]["max_new_tokens"]
    stops = stop_token_ids(tokenizer)
    for path in (tiny_assets.train_path, tiny_assets.heldout_path):
        for conv in list(read_conversations(path))[:2]:
            user, answer = conv.messages
            prompt = tokenizer.apply_chat_template([user], tokenize=False,
                                                   add_generation_prompt=True)
            ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                out = model.generate(ids, do_sample=False, max_new_tokens=max_new,
                                     eos_token_id=stops, pad_token_id=tokenizer.pad_token_id)
            new = out[0, ids.shape[1]:].tolist()
            new = new[:next((i for i, t in enumerate(new) if t in stops), len(new))]
            assert len(new) >= 32
            assert tokenizer.decode(new) == answer["content"]


def test_answers_are_varied_text(tiny_assets):
    # Guards the recipe: an undertrained target answers with one phrase repeated forever.
    for split in ("train", "heldout"):
        assert tiny_assets.manifest()["data"][split]["distinct_4grams"] > 0.5
    with open(tiny_assets.train_path) as f:
        answers = {json.loads(line)["messages"][1]["content"] for line in f}
    assert len(answers) > 0.5 * tiny_assets.manifest()["data"]["train"]["kept"]


def test_second_call_uses_the_cache(tiny_assets, monkeypatch):
    from pipeline.assets import cache, ensure_tiny_assets

    def no_rebuild(out_dir):
        raise AssertionError("rebuilt a finished build")

    monkeypatch.setattr(cache, "build_tiny_assets", no_rebuild)
    manifest = os.path.join(tiny_assets.root, "manifest.json")
    before = os.stat(manifest).st_mtime_ns
    start = time.perf_counter()
    assert ensure_tiny_assets(tiny_assets.root) == tiny_assets
    assert time.perf_counter() - start < 1.0
    assert os.stat(manifest).st_mtime_ns == before
