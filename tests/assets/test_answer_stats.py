"""answer_stats: length, variety, end of turn, and the re-tokenizing check, counted per answer
(batched through the tokenizer, as the real-model bench needs for 57k answers)."""

from transformers import AutoTokenizer

from pipeline.assets.chat_data import answer_stats
from pipeline.assets.generate import Continuation


def test_counts_each_answer_and_catches_ids_that_do_not_survive_re_tokenizing(tiny_assets):
    tokenizer = AutoTokenizer.from_pretrained(tiny_assets.target_dir)
    looping = tokenizer("ab ab ab ab ab ab ab ab", add_special_tokens=False)["input_ids"]
    varied = tokenizer("one two three four five six", add_special_tokens=False)["input_ids"]
    # The ids of a word spelled out piece by piece: decoding them gives the word, whose own
    # ids differ (the target could have produced these; the drafter trains on the text's).
    word = tokenizer("understanding", add_special_tokens=False)["input_ids"]
    pieces = [i for ch in "understanding"
              for i in tokenizer(ch, add_special_tokens=False)["input_ids"]]
    assert pieces != word and tokenizer.decode(pieces) == "understanding"
    answers = [Continuation(looping, True), Continuation(varied, False),
               Continuation(pieces, True)]
    stats = answer_stats(tokenizer, answers)
    assert stats["ended_turn"] == 2
    assert stats["retokenized_same"] == 2  # the spelled-out word is the one that changes
    assert stats["mean_assistant_tokens"] == round(
        (len(looping) + len(varied) + len(pieces)) / 3, 1)
    assert 0 < stats["distinct_4grams"] < 1
    assert answer_stats(tokenizer, []) == {"ended_turn": 0, "mean_assistant_tokens": 0.0,
                                           "distinct_4grams": 0.0, "retokenized_same": 0}
