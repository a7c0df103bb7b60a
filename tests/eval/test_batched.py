"""The many-prompts evaluator decodes every row exactly as the one-prompt evaluator does alone:
same tokens, same accepted counts per round, for families with plain, sliding-window (by
position), sink, MoE and MLA attention; rows that finish early change no other row; a family
without the fast path is decoded prompt by prompt, said once."""

import logging

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from pipeline.eval.batched import RowDrafter, batched_generate, decode_many
from pipeline.eval.config import EvalConfig
from pipeline.eval.holes import HoleCache
from pipeline.eval.speculative import DrafterProposer, acceptance_length, speculative_generate
from pipeline.eval.tau import evaluate_tau
from pipeline.model.config import DrafterConfig, build_drafter_spec
from pipeline.model.drafter import DFlashDrafter
from pipeline.model.target import load_target_head

OPTIONS = DrafterConfig(num_layers=1, block_size=4, num_taps=2)
LENGTHS = (9, 12, 3, 7)  # crossing the tiny targets' sliding windows (8)


class FlawedOracle:
    """Drafts each text's greedy continuation with one token spoiled at a place that depends on
    the length so far: rows accept different numbers of drafts each round (0..B-1)."""

    def __init__(self, texts, block_size):
        self.texts, self.block_size = texts, block_size

    def _one(self, tokens):
        t = tokens.tolist()
        text = next(x for x in self.texts if x[:len(t)] == t)
        draft = list(text[len(t):len(t) + self.block_size - 1])
        k = (len(t) * 7) % self.block_size
        if k < len(draft):
            draft[k] += 1
        return torch.tensor(draft)

    def propose(self, tokens, features):
        return self._one(tokens)

    def propose_rows(self, tokens, anchors, features):
        return torch.stack([self._one(tokens[r, :int(a) + 1]) for r, a in enumerate(anchors)])


def _setup(family_target, model_type):
    path = family_target(model_type)
    spec = build_drafter_spec(AutoConfig.from_pretrained(path).to_dict(), OPTIONS,
                              tokenizer_mask_id=3)
    target = AutoModelForCausalLM.from_pretrained(path).eval()
    torch.manual_seed(1)
    drafter = DrafterProposer(DFlashDrafter(spec).eval(), load_target_head(path))
    prompts = [torch.randint(4, 500, (n,)).tolist() for n in LENGTHS]
    return spec, target, drafter, prompts


def _same(reference, batched):
    assert [r.tokens for r in batched] == [r.tokens for r in reference]
    assert [r.accepted for r in batched] == [r.accepted for r in reference]


@pytest.mark.parametrize("model_type", ["qwen3", "llama", "gpt_oss", "gemma3_text",
                                        "deepseek_v3"])
@pytest.mark.slow
def test_batched_rows_equal_prompt_by_prompt(family_target, model_type, greedy_tokens,
                                             monkeypatch):
    spec, target, drafter, prompts = _setup(family_target, model_type)
    taps, new = spec.target_layer_ids, 10
    compactions = []
    real = HoleCache.compact
    monkeypatch.setattr(HoleCache, "compact",
                        lambda self, *a: (compactions.append(self.capacity), real(self, *a))[1])
    # The untrained drafter (tau near 1: holes every round) and a flawed oracle (0..B-1
    # accepted), each with the growing cache and the fixed-shape one.
    oracle = FlawedOracle([p + greedy_tokens(target, p, new + 4) for p in prompts], 4)
    for proposer, rows in ((drafter, RowDrafter(drafter)), (oracle, oracle)):
        reference = [speculative_generate(target, proposer, p, taps, new) for p in prompts]
        for static in (False, True):
            _same(reference, batched_generate(target, rows, prompts, taps, new, static=static))
    assert None in compactions and any(c is not None for c in compactions)
    assert acceptance_length(reference) > 2.0  # the oracle's rounds accepted drafts


def test_rows_finishing_early_change_no_other_row(family_target, greedy_tokens):
    spec, target, _, prompts = _setup(family_target, "qwen3")
    taps, new = spec.target_layer_ids, 10
    texts = [p + greedy_tokens(target, p, new + 4) for p in prompts]
    oracle = FlawedOracle(texts, 4)
    eos = texts[1][len(prompts[1]) + 5]  # row 1 ends early, mid-block
    reference = [speculative_generate(target, oracle, p, taps, new, eos) for p in prompts]
    assert len(reference[1].tokens) <= 6 and reference[1].tokens[-1] == eos
    for static in (False, True):
        alone = [batched_generate(target, oracle, [p], taps, new, eos, static=static)[0]
                 for p in prompts]
        _same(reference, alone)
        _same(reference, batched_generate(target, oracle, prompts, taps, new, eos,
                                          static=static))
    # Rows whose first token is eos, or with one new token: no round, in a batch of others.
    short = batched_generate(target, oracle, prompts, taps, 1)
    assert [r.accepted for r in short] == [[]] * len(prompts)


def test_a_family_without_the_fast_path_is_decoded_prompt_by_prompt(family_target, caplog):
    spec, target, drafter, prompts = _setup(family_target, "qwen3_5_text")
    taps, prompts = spec.target_layer_ids, prompts[:2]
    reference = [speculative_generate(target, drafter, p, taps, 5) for p in prompts]
    with caplog.at_level(logging.INFO, logger="pipeline.eval.batched"):
        got = decode_many(target, RowDrafter(drafter), prompts, taps, 5, None, batch_size=4)
    _same(reference, got)
    lines = [r.getMessage() for r in caplog.records if r.name == "pipeline.eval.batched"]
    assert lines == ["tau: decoding prompt by prompt (Qwen3.5 (text) keeps state that cannot "
                     "be cut back to a prefix (hybrid: linear attention (gated delta net) and "
                     "full attention), so it has no many-prompts path)"]


def test_evaluate_tau_batched_equals_the_reference_path(drafter_setup, random_target_dir):
    drafter, _, head, spec, _ = drafter_setup
    target = AutoModelForCausalLM.from_pretrained(random_target_dir).eval()
    prompts = [[3, 14, 15, 9, 26], [5, 35, 8, 9, 7, 9, 3], [8, 9]]
    taus = {}
    for batch_size in (1, 2, 8):
        options = EvalConfig(batch_size=batch_size).decode_options()
        taus[batch_size] = evaluate_tau(target, drafter, head, prompts, 8, 17, options)
    assert taus[1] == taus[2] == taus[8]


def test_sliding_window_is_measured_in_positions_not_columns(family_target):
    _, target, _, _ = _setup(family_target, "gpt_oss")
    cache = HoleCache(target, 1, torch.device("cpu"))
    window = target.config.sliding_window
    # Columns 0..2w-1 with every other one a hole: positions run at half the column rate.
    cols = 2 * window
    cache.valid = (torch.arange(cols) % 2 == 0)[None]
    cache.pos = (torch.arange(cols) // 2)[None]
    cache.used = cols
    q = torch.tensor([[window]])
    masks = cache.masks(q, torch.tensor([[True]]))
    seen = masks["sliding_attention"][0, 0, 0] == 0
    full = masks["full_attention"][0, 0, 0] == 0
    # Position p sits at column 2p; the window keeps positions window-w+1..window (itself).
    assert seen[:cols].nonzero().flatten().tolist() == [2 * p for p in range(1, window)]
    assert full[:cols].nonzero().flatten().tolist() == [2 * p for p in range(window)]
    assert bool(seen[cols]) and bool(full[cols])


@pytest.mark.parametrize("key,value,match", [
    ("batch_size", 0, r"train.eval.batch_size=0 is not allowed"),
    ("cuda_graphs", "yes", r"train.eval.cuda_graphs='yes' is not allowed: expected one of "
                           r"\['auto', 'on', 'off'\]"),
    ("stream_priority", "high", r"train.eval.stream_priority='high'"),
    ("gpu_duty", 0.0, r"train.eval.gpu_duty=0.0 is not allowed"),
])
def test_bad_decode_settings_are_refused_by_name(key, value, match):
    with pytest.raises(ValueError, match=match):
        EvalConfig(**{key: value})


def test_graphs_on_without_cuda_is_refused():
    options = EvalConfig(cuda_graphs="on").decode_options()
    with pytest.raises(ValueError, match=r"train.eval.cuda_graphs='on' is not allowed on cpu"):
        options.graphs_on("cpu")
    assert EvalConfig().decode_options().graphs_on("cpu") is False
    assert EvalConfig().decode_options().graphs_on("cuda") is True


def test_families_say_which_fast_paths_they_have():
    from pipeline.model.families import batched_of, graph_verify_of

    assert batched_of("qwen3") is None and graph_verify_of("qwen3") is None
    assert batched_of("gpt_oss") is None
    assert graph_verify_of("gpt_oss") == ("gpt-oss's layers (sliding and full attention with "
                                          "sinks, MoE) sync with the host")
    assert "no many-prompts path" in batched_of("qwen3_5_text")
    assert batched_of("phi3") == "model_type='phi3' is no known family"


def test_the_prefill_is_paced_before_the_first_round(family_target, greedy_tokens, monkeypatch):
    """The duty cap (train.eval.gpu_duty) paces the prefill burst as it paces a round: the
    first pace comes before the first round, then one after every round."""
    import pipeline.eval.batched as batched

    spec, target, _, prompts = _setup(family_target, "qwen3")
    texts = [p + greedy_tokens(target, p, 8) for p in prompts]
    events = []
    real_round = batched._round

    def counted_round(*args, **kwargs):
        events.append("round")
        return real_round(*args, **kwargs)

    monkeypatch.setattr(batched, "_round", counted_round)
    batched_generate(target, FlawedOracle(texts, 4), prompts, spec.target_layer_ids, 6,
                     static=True, pace=lambda: events.append("pace"))
    assert events[0] == "pace" and events.count("round") >= 2
    assert events[1:] == ["round", "pace"] * events.count("round")
