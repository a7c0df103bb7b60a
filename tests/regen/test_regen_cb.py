"""The continuous-batching and static engines as plain classes: every answer equals HF greedy
`generate`.

The reference decodes one conversation and one turn at a time, unpadded, with plain
``generate``; the engine serves all conversations together, each next turn joining as soon as
its previous answer is back. Checked on three targets with real tokenizers and chat
templates: the demo Qwen3 and the tiny Qwen3 and Llama family targets.
"""

import pytest
import torch

from pipeline.regen.cb import CbOptions, build_cb_config
from pipeline.regen.generator import GeneratorWorker
from pipeline.regen.greedy import stop_token_ids, with_answer_slots
from pipeline.regen.messages import GenRequest

MAX_NEW = 12
PROMPTS = ["How do I reverse a list in Python?", "What does the with statement do?",
           "Explain generators.", "Sort a dict by value.", "What is a decorator?"]


def conversations():
    """Prompts-only, with a system turn, multi-turn, and a trailing user turn."""
    return [
        [{"role": "user", "content": PROMPTS[0]}],
        [{"role": "system", "content": "Answer about Python."},
         {"role": "user", "content": PROMPTS[1]}],
        [{"role": "user", "content": PROMPTS[2]}, {"role": "assistant", "content": "a"},
         {"role": "user", "content": PROMPTS[3]}, {"role": "assistant", "content": "b"}],
        [{"role": "user", "content": PROMPTS[4]}, {"role": "assistant", "content": "old"},
         {"role": "user", "content": "And then?"}],
        [{"role": "user", "content": PROMPTS[3][:9]}, {"role": "assistant", "content": "x"}],
    ]


def one_by_one(model, tokenizer, messages, stops):
    """Each assistant turn (and the answer to a trailing user turn) decoded alone, unpadded."""
    out, positions = with_answer_slots(messages)
    for i in positions:
        ids = tokenizer.apply_chat_template(out[:i], add_generation_prompt=True,
                                            return_dict=True, return_tensors="pt")["input_ids"]
        row = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=MAX_NEW, eos_token_id=stops,
                             pad_token_id=stops[0])[0, ids.shape[1]:].tolist()
        row = row[:next((j for j, t in enumerate(row) if t in stops), len(row))]
        out[i] = {"role": "assistant", "content": tokenizer.decode(row)}
    return out


@pytest.fixture(scope="module", params=["demo", "qwen3", "llama"])
def target(request):
    from pipeline.assets.family_targets import ensure_family_target

    if request.param == "demo":
        return request.getfixturevalue("tiny_assets").target_dir
    return ensure_family_target(request.param)


@pytest.fixture(scope="module")
def workers(target):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a busy 2-core machine, 2 threads are much slower
    kw = dict(rank=0, target_path=target, device="cpu", dtype=torch.float32,
              max_new_tokens=MAX_NEW)
    yield (GeneratorWorker(engine="cb", cb_options=CbOptions(num_blocks=16), **kw),
           GeneratorWorker(engine="generate", **kw),
           # 2 rows for up to 5 prompts a round: finished rows are refilled
           GeneratorWorker(engine="static", static_rows=2, **kw))
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_cb_answers_equal_one_by_one_greedy(workers):
    cb, plain, _ = workers
    assert (cb.engine, plain.engine) == ("cb", "generate")
    requests = [GenRequest(10 + i, tuple(c)) for i, c in enumerate(conversations())]
    stops = stop_token_ids(cb.model, cb.tokenizer)
    with torch.no_grad():
        reference = [one_by_one(cb.model, cb.tokenizer, c, stops) for c in conversations()]
    got = cb.generate(requests)
    assert [r.line_index for r in got] == [10, 11, 12, 13, 14]
    assert [list(r.messages) for r in got] == reference
    # Prompts-only lines got their answer appended; a trailing user turn got answered.
    assert [len(r.turns) for r in got] == [1, 1, 2, 2, 1]
    assert got[3].messages[2] == {"role": "user", "content": "And then?"}
    # The baseline engine stores the very same records, token counts included.
    assert [(r.messages, r.turns) for r in plain.generate(requests)] == [
        (r.messages, r.turns) for r in got]


def test_static_engine_stores_the_same_records_as_generate(workers):
    _, plain, static = workers
    assert static.engine == "static"
    requests = [GenRequest(i, tuple(c)) for i, c in enumerate(conversations())]
    want = [(r.messages, r.turns) for r in plain.generate(requests)]
    assert [(r.messages, r.turns) for r in static.generate(requests)] == want
    # The worker keeps its decoder (cache, graphs) for later calls: a call in two parts,
    # in another order, answers alike on the same decoder.
    decoder = static.static.decoder
    parts = static.generate(requests[3:]) + static.generate(requests[:3])
    assert sorted((r.line_index, r.messages, r.turns) for r in parts) == sorted(
        (i, m, t) for i, (m, t) in enumerate(want))
    assert static.static.decoder is decoder


def test_engine_counts_say_how_many_prompts_went_apart(workers):
    """A kept cache too narrow for the prompts (16 columns at 2 rows): each prompt is decoded
    apart, the answers stay generate's, and the worker's counts (what the driver reports)
    grow by the prompts decoded apart; the other engines have none to give."""
    from pipeline.regen.cache_budget import slot_bytes

    cb, plain, static = workers
    assert cb.engine_counts() == {} and plain.engine_counts() == {}
    engine = static.static
    requests = [GenRequest(i, tuple(c)) for i, c in enumerate(conversations())]
    before, budget = static.engine_counts(), engine.cache_budget
    engine.cache_budget = 2 * 16 * slot_bytes(static.model.config, torch.float32)
    longest = []
    decode = engine.decode

    def seen(prompts, *args, **kwargs):  # every prompt the engine is given
        longest.append(max(map(len, prompts)))
        return decode(prompts, *args, **kwargs)

    engine.decode = seen
    try:
        got = static.generate(requests)
    finally:
        engine.cache_budget = budget
        del engine.decode
    assert [(r.messages, r.turns) for r in got] == [
        (r.messages, r.turns) for r in plain.generate(requests)]
    turns = sum(len(r.turns) for r in got)  # each turn one prompt, none within 16 columns
    after = static.engine_counts()
    assert after["decoded_apart"] - before["decoded_apart"] == turns
    assert (after["rows"], after["columns"]) == (2, 16)
    assert after["longest_apart"] == max(*longest, before["longest_apart"])


@pytest.mark.parametrize("attention, runs", [("flex", "flex"), ("varlen", "varlen"),
                                             ("triton", "triton"), ("auto", "sdpa")])
@pytest.mark.slow
def test_static_engine_with_another_step_stores_the_same_records(workers, target, attention,
                                                                 runs):
    """``--static-attention`` reaches the worker's engine (auto: sdpa on CPU), whose answers
    stay generate's."""
    _, plain, _ = workers
    other = GeneratorWorker(rank=0, target_path=target, device="cpu", dtype=torch.float32,
                            max_new_tokens=MAX_NEW, engine="static", static_rows=2,
                            static_attention=attention)
    assert other.static.attention == runs
    picked = " picked by auto" if attention == "auto" else ""
    assert f"engine static (2 rows, {runs} attention{picked}; compiles nothing" in other.describe()
    requests = [GenRequest(i, tuple(c)) for i, c in enumerate(conversations())]
    assert [(r.messages, r.turns) for r in other.generate(requests)] == [
        (r.messages, r.turns) for r in plain.generate(requests)]


def test_static_engine_falls_back_in_one_line_for_a_family_it_cannot_serve(caplog):
    from pipeline.assets.family_targets import ensure_family_target

    worker = GeneratorWorker(rank=0, target_path=ensure_family_target("gemma3_text"),
                             device="cpu", dtype=torch.float32, max_new_tokens=4,
                             engine="static")
    assert worker.engine == "generate"
    assert "engine generate, stop ids" in worker.describe()  # the engine that answers
    lines = [r.getMessage() for r in caplog.records if "static engine" in r.getMessage()]
    assert len(lines) == 1 and "falling back to generate" in lines[0]


@pytest.mark.slow
def test_cb_engine_kept_between_calls_answers_alike(workers):
    cb, _, _ = workers
    requests = [GenRequest(i, tuple(c)) for i, c in enumerate(conversations())]
    whole = cb.generate(requests)
    parts = cb.generate(requests[3:]) + cb.generate(requests[:3])
    assert sorted((r.line_index, r.messages) for r in parts) == sorted(
        (r.line_index, r.messages) for r in whole)


def test_page_size_key_follows_the_installed_transformers():
    config = build_cb_config(CbOptions(page_size=32, num_blocks=8, cuda_graphs="off"))
    page = getattr(config, "page_size", None) or getattr(config, "block_size")
    assert (page, config.num_blocks, config.use_cuda_graph) == (32, 8, False)
    cpu = build_cb_config(CbOptions(), "cpu")
    assert cpu.num_blocks == 64 and cpu.max_batch_tokens == 512


def test_bad_cb_option_names_the_flag():
    with pytest.raises(ValueError, match="--cb-cuda-graphs='yes' is not allowed"):
        CbOptions(cuda_graphs="yes")
    with pytest.raises(ValueError, match="--cb-num-blocks=0 is not allowed"):
        CbOptions(num_blocks=0)


def test_engine_that_cannot_start_falls_back_with_one_log_line(caplog):
    from pipeline.assets.family_targets import ensure_family_target

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with caplog.at_level("WARNING", logger="pipeline.regen.generator"):
            # Pages of 2 tokens: the library refuses them when it builds the engine.
            worker = GeneratorWorker(rank=3, target_path=ensure_family_target("qwen3"),
                                     device="cpu", dtype=torch.float32, max_new_tokens=4,
                                     engine="cb", cb_options=CbOptions(page_size=2))
        lines = [r.getMessage() for r in caplog.records if r.name == "pipeline.regen.generator"]
        assert worker.engine == "generate" and len(lines) == 1
        assert "generator 3: continuous batching cannot serve" in lines[0]
        assert "falling back to generate" in lines[0]
        [result] = worker.generate([GenRequest(0, tuple(conversations()[0]))])
        assert result.messages[-1]["role"] == "assistant" and len(result.turns) == 1
    finally:
        torch.set_num_threads(threads)


def test_static_compile_reaches_the_worker_engine(target):
    """``--static-compile`` and ``--static-compile-prefill`` are the worker's engine's
    ``compile_step`` and ``compile_prefill`` (their answers under compile:
    tests/regen/test_static_decoder.py)."""
    worker = GeneratorWorker(rank=0, target_path=target, device="cpu", dtype=torch.float32,
                             max_new_tokens=MAX_NEW, engine="static", static_rows=2,
                             static_attention="varlen", static_compile=True)
    assert worker.static.compile_step and worker.static.attention == "varlen"
    assert not worker.static.compile_prefill
    worker = GeneratorWorker(rank=0, target_path=target, device="cpu", dtype=torch.float32,
                             max_new_tokens=MAX_NEW, engine="static", static_rows=2,
                             static_compile_prefill=True)
    assert worker.static.compile_prefill and not worker.static.compile_step
    # Auto, the default, compiles nothing on CPU however large the run: said in its line.
    worker = GeneratorWorker(rank=0, target_path=target, device="cpu", dtype=torch.float32,
                             max_new_tokens=MAX_NEW, engine="static", static_rows=2,
                             answer_tokens=10**15)
    assert not worker.static.compile_prefill and not worker.static.compile_step
    assert "compiles nothing (auto: never on cpu; at most 1,000,000,000,000,000 answer" \
        in worker.describe()
