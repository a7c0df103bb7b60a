import logging

import pytest
import torch

from pipeline.data import ChatDataset, DataConfig, DataError, encode_conversation


def chat(*turns):
    roles = ("user", "assistant")
    return {"messages": [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]}


LONG = chat("Tell me about lists.",
            "Lists are mutable sequences, typically used to store collections of homogeneous "
            "items. They may be constructed in several ways: a pair of square brackets denotes "
            "the empty list, and a list comprehension builds one from an iterable.")
SHORT = chat("Hi", "Hello.")


def supervised(tokenizer, record):
    [(_, mask)] = encode_conversation(tokenizer, record["messages"], max_length=512)
    return sum(mask)


def test_sample_ids_are_line_indices_and_drops_are_counted(tiny_tokenizer, write_jsonl):
    path = write_jsonl([LONG, SHORT, "", "{oops", LONG])
    ds = ChatDataset(path, tiny_tokenizer, DataConfig(on_bad_line="skip"), block_size=4)
    assert ds.sample_ids == [0, 4]
    assert [s.sample_id for s in ds] == [0, 4]
    s = ds[4]
    assert s.input_ids.dtype == torch.long and s.loss_mask.dtype == torch.long
    assert s.input_ids.shape == s.loss_mask.shape and s.input_ids.dim() == 1
    st = ds.stats
    assert (st.lines_read, st.kept, st.dropped_too_short, st.skipped_bad, st.truncated) == (
        4, 2, 1, 1, 0)
    assert st.summary() == ("lines=5 = conversations=3 + skipped_bad=1 + blank=1; samples "
                            "kept=2 dropped_too_short=1 truncated=0 split_segments=0; "
                            "bad: invalid_json=1")
    with pytest.raises(KeyError, match="no sample with id 1"):
        ds[1]


def test_ids_of_other_lines_do_not_move_when_a_line_is_dropped(tiny_tokenizer, write_jsonl):
    other = chat("And tuples?", "Tuples are immutable sequences, typically used to store "
                 "collections of heterogeneous data such as the pairs produced by enumerate.")
    before = ChatDataset(write_jsonl([LONG, LONG, other], "a.jsonl"), tiny_tokenizer,
                         DataConfig(), block_size=4)
    after = ChatDataset(write_jsonl([LONG, SHORT, other], "b.jsonl"), tiny_tokenizer,
                        DataConfig(), block_size=4)
    assert before.sample_ids == [0, 1, 2] and after.sample_ids == [0, 2]
    assert torch.equal(before[2].input_ids, after[2].input_ids)


def test_min_supervised_tokens_is_two_blocks(tiny_tokenizer, write_jsonl):
    n = supervised(tiny_tokenizer, LONG)
    path = write_jsonl([LONG])
    kept = ChatDataset(path, tiny_tokenizer, DataConfig(), block_size=n // 2)
    dropped = ChatDataset(path, tiny_tokenizer, DataConfig(), block_size=n // 2 + 1)
    assert (len(kept), kept[0].num_supervised) == (1, n)
    assert (len(dropped), dropped.stats.dropped_too_short) == (0, 1)


def test_long_samples_are_truncated_and_counted(tiny_tokenizer, write_jsonl):
    ds = ChatDataset(write_jsonl([LONG, SHORT]), tiny_tokenizer, DataConfig(max_length=24),
                     block_size=2)
    assert ds.stats.truncated == 1
    assert len(ds[0].input_ids) == 24


def test_both_formats_give_identical_samples(tiny_tokenizer, write_jsonl):
    sharegpt = {"conversations": [
        {"from": {"user": "human", "assistant": "gpt"}[m["role"]], "value": m["content"]}
        for m in LONG["messages"]]}
    ds = ChatDataset(write_jsonl([LONG, sharegpt]), tiny_tokenizer, DataConfig(), block_size=4)
    assert torch.equal(ds[0].input_ids, ds[1].input_ids)
    assert torch.equal(ds[0].loss_mask, ds[1].loss_mask)


def test_bad_line_stops_the_dataset_by_default(tiny_tokenizer, write_jsonl):
    path = write_jsonl([LONG, {"messages": [{"role": "user", "content": "no answer"}]}])
    with pytest.raises(DataError, match=r":2: no assistant turn"):
        ChatDataset(path, tiny_tokenizer, DataConfig(), block_size=4)


def test_skipped_lines_are_reported_in_a_warning(tiny_tokenizer, write_jsonl, caplog):
    path = write_jsonl([LONG, "nope"])
    with caplog.at_level(logging.WARNING):
        ds = ChatDataset(path, tiny_tokenizer, DataConfig(on_bad_line="skip"), block_size=4)
    assert ds.stats.skipped_bad == 1
    assert "skipped_bad=1" in caplog.text and f"{path}:2: invalid JSON" in caplog.text
