"""The generate engine as a plain class: batched, left-padded greedy equals one-by-one greedy."""

import pytest
import torch

from pipeline.regen.greedy import cut_at_stop, ensure_pad_token
from pipeline.regen.messages import GenRequest
from pipeline.regen.generator import GeneratorWorker


@pytest.fixture(scope="module")
def worker(tiny_assets, max_new_tokens):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield GeneratorWorker(rank=0, target_path=tiny_assets.target_dir, device="cpu",
                          dtype=torch.float32, max_new_tokens=max_new_tokens,
                          engine="generate")
    torch.set_num_threads(threads)


def test_one_padded_batch_matches_one_by_one(worker, chats, reference, max_new_tokens):
    conversations, lines = chats
    requests = [GenRequest(i, tuple(c)) for i, c in zip(lines, conversations)]
    results = worker.generate(requests)
    assert [r.line_index for r in results] == lines
    assert [list(r.messages) for r in results] == reference
    # Multi-turn: both answers of the third conversation, in order; user turns untouched.
    assert len(results[2].turns) == 2 and results[2].messages[2] == conversations[2][2]
    assert results[4].messages[2] == {"role": "user", "content": "And then?"}
    assert [len(r.turns) for r in results] == [1, 1, 2, 1, 2, 1]  # the trailing turn answered
    assert all(r.on_main_thread for r in results)
    assert all(0 < t.num_tokens <= max_new_tokens for r in results for t in r.turns)


@pytest.mark.slow
def test_batches_of_one_and_three_agree(worker, chats, reference):
    conversations, lines = chats
    requests = [GenRequest(i, tuple(c)) for i, c in zip(lines, conversations)]
    singles = [worker.generate([r])[0] for r in requests[:2]]
    threes = worker.generate(requests[:3]) + worker.generate(requests[3:])
    assert [list(r.messages) for r in singles] == reference[:2]
    assert [list(r.messages) for r in threes] == reference


def test_answer_ends_at_the_first_stop_token(worker):
    tok, stops = worker.tokenizer, worker.stops
    ids = tok("def foo(): return 1", add_special_tokens=False)["input_ids"]
    pad = tok.pad_token_id
    ended = cut_at_stop(tok, ids + [stops[0], pad, pad], stops)
    assert (ended.text, ended.num_tokens, ended.finished) == ("def foo(): return 1", len(ids),
                                                             True)
    cut = cut_at_stop(tok, ids, stops)
    assert cut.num_tokens == len(ids) and not cut.finished


def test_tokenizer_without_pad_pads_with_eos(worker):
    tok = worker.tokenizer.__class__.from_pretrained(worker.tokenizer.name_or_path)
    tok.pad_token = None
    assert ensure_pad_token(tok) == tok.eos_token_id
