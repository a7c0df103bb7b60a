"""bench/quality: the corpus split, the token stream and the chat-formed target windows."""

import hashlib
import sys
from dataclasses import replace

import pytest
import torch

from bench.quality.corpus import is_heldout, load_corpus
from bench.quality.scale import TINY
from bench.quality.target import ChatWindows
from bench.quality.tokens import DOC_SEPARATOR, encode_stream
from pipeline.assets.target import chat_pieces
from pipeline.assets.tokenizer import build_tokenizer

TEXTS = ["def add(a, b):\n    return a + b\n", "class Point:\n    x: int = 0\n",
         "import os\nprint(os.sep)\n"] * 20


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(TEXTS, 300)


def test_split_is_a_pure_function_of_the_path():
    path = "json/decoder.py"
    value = int.from_bytes(hashlib.sha256(path.encode()).digest()[:8], "big") / 2**64
    assert is_heldout(path, value + 1e-9) and not is_heldout(path, value)
    held = sum(is_heldout(f"pkg/mod{i}.py", 0.2) for i in range(2000))
    assert 300 < held < 500  # about 20%


def test_corpus_splits_are_disjoint_and_cover_the_files():
    corpus = load_corpus(0.3, max_chars=400_000)
    train = {p for p, _ in corpus.train}
    held = {p for p, _ in corpus.heldout}
    assert train and held and not train & held
    assert all(is_heldout(p, 0.3) for p in held) and not any(is_heldout(p, 0.3) for p in train)
    assert corpus.stats()["train_chars"] + corpus.stats()["heldout_chars"] <= 400_000


def test_stream_decodes_to_the_documents_joined(tokenizer):
    docs = [("a.py", TEXTS[0]), ("b.py", TEXTS[1])]
    stream = encode_stream(tokenizer, docs)
    assert stream.dtype == torch.int32
    assert tokenizer.decode(stream.tolist()) == TEXTS[0] + DOC_SEPARATOR + TEXTS[1] + DOC_SEPARATOR


def test_windows_are_chat_turns_over_consecutive_stream_tokens(tokenizer):
    stream = encode_stream(tokenizer, [(f"{i}.py", t) for i, t in enumerate(TEXTS)])
    scale = replace(TINY, seq_len=64, user_tokens=(5, 12))
    windows = ChatWindows(tokenizer, stream, scale, seed=0)
    head, middle, tail = chat_pieces(tokenizer)
    for _ in range(5):
        batch = windows.batch(3)
        assert batch.shape == (3, 64)  # fixed shape whatever the user length
        for row in batch.tolist():
            assert row[:len(head)] == head and row[-len(tail):] == tail
            body = row[len(head):-len(tail)]
            cut = next(i for i in range(len(body)) if body[i:i + len(middle)] == middle)
            assert 5 <= cut <= 12
            text = body[:cut] + body[cut + len(middle):]
            # The user prefix and the assistant rest are one consecutive run of the stream.
            s = stream.tolist()
            assert any(s[j:j + len(text)] == text for j in range(len(s) - len(text) + 1))


def test_windows_refuse_a_sequence_too_short_for_the_prefix(tokenizer):
    stream = encode_stream(tokenizer, [("a.py", TEXTS[0] * 10)])
    with pytest.raises(ValueError, match="seq_len=20"):
        ChatWindows(tokenizer, stream, replace(TINY, seq_len=20, user_tokens=(5, 12)), 0)


def test_target_schedule_warms_up_then_decays_to_the_floor():
    from bench.quality.target import _lr_at

    scale = replace(TINY, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert _lr_at(0, 100, scale) == pytest.approx(0.1)
    assert _lr_at(9, 100, scale) == pytest.approx(1.0)
    assert _lr_at(55, 100, scale) == pytest.approx(0.55)  # half-way down the cosine
    assert _lr_at(100, 100, scale) == pytest.approx(0.1)
    assert _lr_at(500, 100, scale) == pytest.approx(0.1)  # past the fitted end: the floor


def _tree(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_corpus_reads_every_package_root_once_and_keeps_one_of_each_copy(tmp_path, monkeypatch):
    import pydoc_data.topics  # noqa: F401 (imported before sys.path is replaced)

    from bench.quality import corpus as corpus_mod

    stdlib = _tree(tmp_path / "lib", {"json/decoder.py": "x = 1\n",
                                      "site-packages/pkg/a.py": "in the stdlib's own folder\n"})
    site = _tree(tmp_path / "venv" / "site-packages", {
        "pkg/a.py": "a = 2\n", "pkg/vendored/decoder.py": "x = 1\n",  # a copy of json's
        "other/b.py": "b = 3\n", "other/__pycache__/c.py": "cache\n"})
    project = _tree(tmp_path / "proj", {"mine.py": "not installed\n"})
    monkeypatch.setattr(corpus_mod, "stdlib_root", lambda: str(stdlib))
    monkeypatch.setattr(sys, "path", [str(project), str(site), str(project / "missing")])
    got = corpus_mod.load_corpus(0.5, exclude=(str(tmp_path / "proj"),))
    names = sorted(name for name, _ in got.train + got.heldout)
    assert names == sorted(["pydoc_data/topics.txt", "json/decoder.py", "pkg/a.py",
                            "other/b.py"])
    assert got.duplicates == 1 and got.not_utf8 == 0
    # A project's own virtual environment counts as installed packages.
    inside = _tree(project / ".venv" / "site-packages", {"dep/d.py": "d = 4\n"})
    monkeypatch.setattr(sys, "path", [str(project), str(inside)])
    got = corpus_mod.load_corpus(0.5, exclude=(str(project),))
    assert "dep/d.py" in {name for name, _ in got.train + got.heldout}
    assert "mine.py" not in {name for name, _ in got.train + got.heldout}


def test_target_sees_its_tokens_at_most_max_epochs_times(tokenizer):
    from bench.quality.target import epoch_steps

    stream = encode_stream(tokenizer, [(f"{i}.py", t) for i, t in enumerate(TEXTS * 20)])
    scale = replace(TINY, seq_len=64, user_tokens=(5, 12), batch_size=4)
    windows = ChatWindows(tokenizer, stream, scale, seed=0)
    once = epoch_steps(windows, scale)
    assert once * scale.batch_size * windows.body <= len(stream)
    assert (once + 1) * scale.batch_size * windows.body > len(stream)
    assert epoch_steps(windows, replace(scale, target_max_epochs=2.0)) in (2 * once, 2 * once + 1)
