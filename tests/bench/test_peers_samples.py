"""The peers train on the pipeline's own sample set (bench/peers_steps/samples.py): the same
samples as ChatDataset keeps, whatever sequence length a peer cuts them to."""

import json

from bench.peers_steps.samples import SampleSet, encoded_samples
from pipeline.data import ChatDataset, DataConfig, encode_conversation


def chat(user, answer):
    return {"messages": [{"role": "user", "content": user},
                         {"role": "assistant", "content": answer}]}


LONG = chat("Tell me about lists.",
            "Lists are mutable sequences, typically used to store collections of homogeneous "
            "items. They may be constructed in several ways: a pair of square brackets denotes "
            "the empty list, and a list comprehension builds one from an iterable.")
SHORT = chat("Hi", "Hello there.")
# A long question: its answer starts late, so a short cut keeps little of the answer.
LATE = chat("Explain, at length, how the garbage collector finds reference cycles among "
            "container objects, and when it runs. " * 3, LONG["messages"][1]["content"])


def write(tmp_path, records):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def supervised(tok, record, max_length):
    [(_, mask)] = encode_conversation(tok, record["messages"], max_length)
    return sum(mask)


def pipeline_rows(tok, path, kept):
    data = ChatDataset(path, tok, DataConfig(train_path=path, max_length=kept.max_length),
                       kept.block_size)
    return [{"input_ids": s.input_ids.tolist(), "loss_mask": s.loss_mask.tolist()} for s in data]


def test_at_the_pipelines_length_the_peers_get_exactly_its_samples(tiny_tokenizer, tmp_path):
    short = supervised(tiny_tokenizer, SHORT, 512)
    assert 1 <= short < supervised(tiny_tokenizer, LONG, 512)
    block = short // 2 + 1  # SHORT has some supervised tokens, fewer than two blocks
    kept = SampleSet(max_length=512, block_size=block)
    path = write(tmp_path, [LONG, SHORT, LONG])
    rows = encoded_samples(tiny_tokenizer, path, 512, kept)
    assert rows == pipeline_rows(tiny_tokenizer, path, kept)
    assert len(rows) == 2  # SHORT is the pipeline's to drop, so nobody trains on it


def test_a_peers_longer_cut_never_brings_back_a_sample_the_pipeline_dropped(tiny_tokenizer,
                                                                            tmp_path):
    full = len(encode_conversation(tiny_tokenizer, LATE["messages"], 4096)[0][0])
    answer = supervised(tiny_tokenizer, LATE, 4096)
    cut = full - answer + 3  # the pipeline's cut keeps three of its answer's tokens
    kept = SampleSet(max_length=cut, block_size=2)
    path = write(tmp_path, [LATE, LONG])
    pipeline = pipeline_rows(tiny_tokenizer, path, kept)
    long_ids = encode_conversation(tiny_tokenizer, LONG["messages"], 4096)[0][0]
    assert [r["input_ids"] for r in pipeline] == [long_ids[:cut]]  # LATE dropped
    rows = encoded_samples(tiny_tokenizer, path, 4096, kept)
    # LONG whole at the peer's length; LATE, trainable there, still left out
    assert [r["input_ids"] for r in rows] == [long_ids]


def test_a_peers_shorter_cut_shortens_rows_and_leaves_out_none_it_can_train(tiny_tokenizer,
                                                                             tmp_path):
    kept = SampleSet(max_length=512, block_size=2)
    path = write(tmp_path, [LONG, LATE])
    whole = encoded_samples(tiny_tokenizer, path, 512, kept)
    prompt = len(whole[0]["input_ids"]) - supervised(tiny_tokenizer, LONG, 512)
    seq = prompt + 4  # LONG keeps four supervised tokens; LATE none
    assert supervised(tiny_tokenizer, LATE, seq) == 0
    rows = encoded_samples(tiny_tokenizer, path, seq, kept)
    assert rows == [{k: v[:seq] for k, v in whole[0].items()}]
    assert sum(rows[0]["loss_mask"]) == 4
