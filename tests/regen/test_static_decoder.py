"""The static-cache decoder against Hugging Face greedy decoding, prompt by prompt, in fp32.

Each prompt's reference is ``model.generate(do_sample=False)`` on that prompt alone (no
padding, HF's own cache), so equality checks per-row positions, cache writes, masks, refills
and stop handling at once: a wrong position or a stale cache column shows as a changed token.
"""

from itertools import combinations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

from pipeline.regen.static_engine import greedy_decode

MAX_NEW = 10


def _save(path, family, **overrides):
    """A tiny random model saved with save_pretrained. Weights drawn wider than the default
    (std 0.2, not 0.02) so that greedy answers vary instead of repeating one token."""
    torch.manual_seed(3)
    shape = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                 initializer_range=0.2, **overrides)
    cfg = (LlamaConfig(tie_word_embeddings=True, **shape) if family == "llama"
           else Qwen3Config(head_dim=8, tie_word_embeddings=False, **shape))
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return {family: _save(tmp_path_factory.mktemp(family), family) for family in ("llama", "qwen3")}


def _load(path, **kwargs):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs).eval()
    model.generation_config.eos_token_id = None  # the stops are each test's own
    return model


def _prompts(n, seed, vocab=96):
    """``n`` random prompts of 1 to 30 tokens, in no particular length order."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 31, (n,), generator=g).tolist()
    return [torch.randint(0, vocab, (k,), generator=g).tolist() for k in lengths]


def _generate(model, prompt, max_new, stops):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new, eos_token_id=sorted(stops) or None,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _stops_for(model, prompts):
    """Two stop tokens under which rows finish at the most different steps (some at the
    first token, some by the max_new_tokens cut): picked from the answers without stops."""
    free = [_generate(model, p, MAX_NEW, set()) for p in prompts]

    def spread(stops):
        return len({next((j + 1 for j, t in enumerate(r) if t in stops), MAX_NEW + 1)
                    for r in free})

    tokens = sorted({t for r in free for t in r})
    return set(max(combinations(tokens, 2), key=lambda pair: spread(set(pair))))


def _reference(model, prompts, stops):
    return [_generate(model, p, MAX_NEW, stops) for p in prompts]


def _assert_same(got, want):
    mismatch = [(i, w, g) for i, (w, g) in enumerate(zip(want, got)) if w != g]
    assert not mismatch, f"{len(mismatch)} of {len(want)} differ, first (i, hf, ours): {mismatch[0]}"


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_equals_generate_with_refills_stops_and_cuts(family, model_dirs):
    model = _load(model_dirs[family])
    prompts = _prompts(13, seed=5)
    stops = _stops_for(model, prompts)
    want = _reference(model, prompts, stops)
    lengths = [len(w) for w in want]
    # The case is only meaningful if rows finished at different steps, some by a stop
    # and some by the max_new_tokens cut.
    assert len(set(lengths)) >= 3 and MAX_NEW in lengths and min(lengths) < MAX_NEW
    _assert_same(greedy_decode(model, prompts, MAX_NEW, stops, batch_size=4,
                               cuda_graphs=False, sync_every=3), want)


def test_batch_layouts_agree(model_dirs):
    """One row, more rows than prompts, syncing every step, refills held until 3 rows are
    free, tiny prefill groups and spans, a longer cache than needed: the same answers."""
    model = _load(model_dirs["llama"])
    prompts = _prompts(7, seed=9)
    stops = _stops_for(model, prompts)
    want = _reference(model, prompts, stops)
    for kwargs in ({"batch_size": 1}, {"batch_size": 16, "sync_every": 1},
                   {"batch_size": 5, "refill_rows": 3, "sync_every": 2},
                   {"batch_size": 3, "prefill_tokens": 8, "max_length": 128, "span_bucket": 4}):
        _assert_same(greedy_decode(model, prompts, MAX_NEW, stops, cuda_graphs=False, **kwargs), want)


def test_eager_attention_and_no_stops(model_dirs):
    model = _load(model_dirs["llama"], attn_implementation="eager")
    prompts = _prompts(5, seed=2)
    want = _reference(model, prompts, set())
    assert all(len(a) == MAX_NEW for a in want)
    _assert_same(greedy_decode(model, prompts, MAX_NEW, set(), batch_size=2, cuda_graphs=False), want)
    assert model.config._attn_implementation == "eager"  # the decoder swaps it back


def test_refusals(model_dirs, tmp_path):
    model = _load(model_dirs["llama"])
    with pytest.raises(ValueError, match="max_length 5 cannot hold"):
        greedy_decode(model, [[1, 2, 3]], 4, {0}, batch_size=2, max_length=5)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        greedy_decode(model, [[1], []], 4, {0}, batch_size=2)
    sliding = _save(tmp_path, "qwen3", use_sliding_window=True, sliding_window=8, max_window_layers=1)
    with pytest.raises(ValueError, match="sliding-window"):
        greedy_decode(_load(sliding), [[1]], 2, {0}, batch_size=1)
    assert greedy_decode(model, [], 4, {0}, batch_size=2) == []



def test_one_engine_across_calls_keeps_its_decoder(model_dirs, caplog):
    """One engine, several calls with other prompts, stops and limits: every answer equals
    generate's; the decoder (cache, graphs) is built once while calls fit it, and once more,
    said in one line, when a call needs more columns than it has."""
    from pipeline.regen.static_engine import StaticEngine

    model = _load(model_dirs["qwen3"])
    engine = StaticEngine(model, batch_size=4, sync_every=2, cuda_graphs=False, span_bucket=16)
    first = _prompts(9, seed=11)
    stops = _stops_for(model, first)
    _assert_same(engine.decode(first, MAX_NEW, stops), _reference(model, first, stops))
    decoder = engine.decoder
    short = [p[:6] for p in _prompts(3, seed=12)]  # fewer prompts than rows
    other = _stops_for(model, short)  # other stops, a lower limit
    _assert_same(engine.decode(short, 6, other), [_generate(model, p, 6, other) for p in short])
    _assert_same(engine.decode(first, MAX_NEW, stops), _reference(model, first, stops))
    assert engine.decoder is decoder and engine.builds == 1
    longer = [p + p + p for p in _prompts(5, seed=13)]  # up to 90 tokens: more columns
    assert max(map(len, longer)) + MAX_NEW - 1 > decoder.capacity
    with caplog.at_level("INFO", logger="pipeline.regen.static_engine"):
        _assert_same(engine.decode(longer, MAX_NEW, set()), _reference(model, longer, set()))
        _assert_same(engine.decode(short, 6, other), [_generate(model, p, 6, other) for p in short])
    assert engine.builds == 2 and engine.decoder is not decoder
    assert sum("rebuilt" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("attention", ["matmul", "flex", "varlen", "triton"])
def test_other_attentions_equal_generate(model_dirs, attention):
    """The decode step's other attention variants (two matmuls with an fp32 softmax; flex over
    each row's filled key blocks; varlen's token-major cache read to each row's length, here
    through its SDPA form, as triton's is without Triton's interpreter): the same answers. Span buckets of 16 columns make the flex block
    mask hold full, partial and skipped blocks at once."""
    model = _load(model_dirs["qwen3"])
    prompts = _prompts(6, seed=7)
    stops = _stops_for(model, prompts)
    _assert_same(greedy_decode(model, prompts, MAX_NEW, stops, batch_size=3, cuda_graphs=False,
                               attention=attention, span_bucket=16),
                 _reference(model, prompts, stops))
    with pytest.raises(ValueError, match="attention 'flash': allowed sdpa, matmul, flex, varlen, triton$"):
        greedy_decode(model, prompts, MAX_NEW, stops, batch_size=3, attention="flash")


def test_prompts_too_long_for_the_cache_budget_are_decoded_apart(model_dirs, caplog):
    """A cache budget for 3 rows of 32 columns: prompts needing more columns are decoded after
    the rest on a cache of their own (one line), the kept cache stays within the budget, and
    every answer, in prompt order, equals generate's."""
    from pipeline.regen.cache_budget import slot_bytes
    from pipeline.regen.static_engine import StaticEngine

    model = _load(model_dirs["llama"])
    per_slot = slot_bytes(model.config, torch.float32)
    engine = StaticEngine(model, batch_size=3, sync_every=2, cuda_graphs=False, span_bucket=16,
                          cache_gb=3 * 32 * per_slot / 1e9)
    prompts = [p[:20] for p in _prompts(7, seed=21)]
    g = torch.Generator().manual_seed(22)
    for i, n in ((1, 40), (4, 60)):  # more than 32 - (MAX_NEW - 1) tokens
        prompts[i] = torch.randint(0, 96, (n,), generator=g).tolist()
    stops = _stops_for(model, prompts)
    with caplog.at_level("INFO", logger="pipeline.regen.static_engine"):
        _assert_same(engine.decode(prompts, MAX_NEW, stops), _reference(model, prompts, stops))
    assert engine.decoder.capacity == 32 and engine.decoder.rows == 3
    assert engine.last_stats["long"]["prompts"] == 2 and engine.apart == 2
    assert sum("decoded apart" in r.getMessage() for r in caplog.records) == 1
    with pytest.raises(ValueError, match="cache_gb must be > 0"):
        StaticEngine(model, batch_size=3, cache_gb=0)


def _traced_with_aot_eager(monkeypatch):
    """The decoder's compiles through aot_eager (inductor's CPU build takes a minute) from a
    fresh dynamo state; dynamo's counters, cleared, to count the graphs."""
    from torch._dynamo.utils import counters

    from pipeline.regen import static_decoder

    monkeypatch.setattr(static_decoder, "COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    counters.clear()
    return counters


@pytest.mark.slow
def test_compiled_step_equals_generate(model_dirs, monkeypatch):
    """``compile_step``: the decode step traced whole by dynamo (fullgraph: no break) and run
    compiled, refills and stops included, gives generate's answers; the cache writes inside
    the traced step must land, or every later token would change. Traced with aot_eager here
    (inductor's CPU build takes a minute); the GPU tier runs inductor."""
    counters = _traced_with_aot_eager(monkeypatch)
    model = _load(model_dirs["qwen3"])
    prompts = _prompts(7, seed=11)
    stops = _stops_for(model, prompts)
    _assert_same(greedy_decode(model, prompts, MAX_NEW, stops, batch_size=3, cuda_graphs=False,
                               attention="varlen", compile_step=True),
                 _reference(model, prompts, stops))
    assert counters["stats"]["unique_graphs"] == 1  # one graph for every step and span
    with pytest.raises(ValueError,
                       match="compile_step needs attention varlen or triton .* not sdpa"):
        greedy_decode(model, prompts, MAX_NEW, stops, batch_size=3, compile_step=True)


@pytest.mark.slow
def test_compiled_prefill_equals_generate(model_dirs, monkeypatch):
    """``compile_prefill``: the prefills traced whole (fullgraph) with symbolic shapes give
    generate's answers over groups of other rows and widths (a tiny ``prefill_tokens`` makes
    many: refills of one to three prompts of 1-30 tokens), and one compile serves them, with at
    most one more where dynamo specialises a group of one prompt. The cache writes of a traced
    prefill must land, or every answer would change. aot_eager here; inductor on the GPU tier."""
    from pipeline.regen import static_decoder

    groups = []
    prefill_group = static_decoder.StaticDecoder._prefill_group

    def seen(self, rows, prompts, width):
        groups.append((len(prompts), static_decoder.aligned_columns(width)))
        return prefill_group(self, rows, prompts, width)

    monkeypatch.setattr(static_decoder.StaticDecoder, "_prefill_group", seen)
    counters = _traced_with_aot_eager(monkeypatch)
    model = _load(model_dirs["llama"])
    prompts = _prompts(11, seed=13)
    stops = _stops_for(model, prompts)
    _assert_same(greedy_decode(model, prompts, MAX_NEW, stops, batch_size=4, cuda_graphs=False,
                               prefill_tokens=64, sync_every=2, refill_rows=2,
                               attention="varlen", compile_prefill=True),
                 _reference(model, prompts, stops))
    assert len(set(groups)) >= 3 and {n for n, _ in groups} >= {1, 2}, groups
    assert 1 <= counters["stats"]["unique_graphs"] <= 2
    torch._dynamo.reset()
