"""One decode step of the static engine alone: ms/step at a batch, beside the step's datasheet
ceiling, and (``profile``) where an uncaptured step's time goes.

Used by ``bench.decode_static`` (``--step-rows``, ``--profile``): the engine's rows are all
filled with prompts (no stop tokens: every row live), then the step is timed at one attention
span, captured (CUDA graph replays, the engine's own path) and uncaptured (the same kernels
plus Python's launch cost), for each decode attention variant asked for. The ceiling is what
the step must read and compute at that span: weights (the input embedding excepted: it is
gathered, not read) plus every row's K/V columns up to the span, against 4.8 TB/s, and 2 FLOPs
a weight a row plus attention against 989 TFLOP/s (H200 datasheet, dense bf16). The useful
share of the K/V read (columns a row actually has, the rest are masked) is reported too.
The variants ``varlen+compile`` and ``triton+compile`` are those steps through ``torch.compile``
(``static_decoder.compiled_forward``); ``first_step_s`` holds each variant's first, untimed
step (a compile's cost there).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional, Sequence

import torch

from pipeline.regen.static_attention import ATTENTIONS, ROW_LENGTHS, swapped
from pipeline.regen.static_decoder import StaticDecoder, compiled_forward, prefill_group_end

log = logging.getLogger(__name__)

# The step variants: each decode attention, and the row-length steps through torch.compile.
COMPILED = "+compile"
VARIANTS = (*ATTENTIONS, *(a + COMPILED for a in ROW_LENGTHS))
HBM_BYTES_PER_S = 4.8e12   # H200 datasheet
DENSE_BF16_FLOPS = 989e12  # H200 datasheet


def ceiling(model, rows: int, span: int, mean_columns: float) -> dict:
    """The step's bytes and FLOPs at ``span`` and the time they take at the datasheet rates."""
    cfg = model.config
    embed = model.get_input_embeddings().weight
    tied = embed is model.get_output_embeddings().weight
    params = sum(p.numel() for p in model.parameters())
    read_params = params - (0 if tied else embed.numel())
    elem = next(model.parameters()).element_size()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_column = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * elem
    kv = rows * span * per_column
    flops = (2 * (params - embed.numel() * (not tied)) * rows
             + 4 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim * span * rows)
    weights = read_params * elem
    return {"weight_gb": weights / 1e9, "kv_read_gb": kv / 1e9,
            "kv_useful_share": mean_columns / span, "tflop": flops / 1e12,
            "ceiling_ms": 1e3 * max((weights + kv) / HBM_BYTES_PER_S, flops / DENSE_BF16_FLOPS),
            "bandwidth_ms": 1e3 * (weights + kv) / HBM_BYTES_PER_S,
            "compute_ms": 1e3 * flops / DENSE_BF16_FLOPS}


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _filled(model, chosen: list[list[int]], steps: int, attention: str = "sdpa",
            compile_prefill: bool = False) -> StaticDecoder:
    """A decoder whose rows each hold one prompt of ``chosen`` and stay live for ``steps``
    (its cache laid out for ``attention``: token-major for varlen and triton; its prefills
    compiled with ``compile_prefill``, the fill paying the compile)."""
    rows = len(chosen)
    longest = max(map(len, chosen))
    decoder = StaticDecoder(model, rows, longest + steps + 1, steps + 1, [], cuda_graphs=True,
                            prefill_tokens=16384, span_bucket=128, attention=attention,
                            compile_prefill=compile_prefill)
    decoder.stats = {}
    with swapped(model):
        decoder._prefill(list(range(rows)), chosen)
    return decoder


def prefill_timing(decoder: StaticDecoder, chosen: list[list[int]], tables: list,
                   profile: Optional[Path], repeats: int = 3) -> dict:
    """Prefill calls into the rows a fill just gave their prompts (the state a call writes is
    the state already there): one of the engine's size (the first prompts of ``chosen`` that
    fit ``prefill_tokens`` padded tokens) and one of 4x that, each its ms and tokens/s, and
    (``profile``) the kernels of the first. The prefill was 38-40% of a whole regeneration on
    SmolLM2 and at the 8B shape (2026-12-05), at 54-95 ms a call of 16k tokens on
    SmolLM2-135M, which its FLOPs do not explain: a call 4x larger taking far less than 4x the
    time says the calls are bound by the host (an eager forward's launches), not the GPU."""
    out = {}
    with swapped(decoder.model):
        for budget in (decoder.prefill_tokens, 4 * decoder.prefill_tokens):
            group, figures = _prefill_call(decoder, chosen, budget, repeats)
            out[f"{budget}_tokens"] = figures
            if profile is not None and budget == decoder.prefill_tokens:
                tables.append(_profiled(lambda: decoder._prefill_group(*group), decoder.device,
                                        f"one prefill call: {figures['prompts']} prompts, "
                                        f"width {figures['width']}"))
                profile.parent.mkdir(parents=True, exist_ok=True)
                profile.write_text("".join(tables))
    return out


def _prefill_call(decoder: StaticDecoder, chosen: list[list[int]], budget: int,
                  repeats: int) -> tuple[tuple, dict]:
    """The group of the first prompts within ``budget`` padded tokens (as the engine groups
    them), and its timing."""
    k, width = prefill_group_end(chosen, 0, budget)
    group = (list(range(k)), chosen[:k], width)
    decoder._prefill_group(*group)  # warm-up
    _sync(decoder.device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        decoder._prefill_group(*group)
    _sync(decoder.device)
    ms = 1e3 * (time.perf_counter() - t0) / repeats
    real = sum(map(len, chosen[:k]))
    return group, {"prompts": k, "width": width, "tokens": real, "ms": ms,
                   "tokens_per_s": real / ms * 1e3}


def _table(prof, device) -> str:
    keys = (("self_device_time_total", "self_cuda_time_total") if device.type == "cuda"
            else ("self_cpu_time_total",))
    for key in keys:
        try:
            return prof.key_averages().table(sort_by=key, row_limit=40)
        except (AttributeError, KeyError, ValueError, RuntimeError):
            continue
    return prof.key_averages().table(row_limit=40)


def _profiled(fn, device, title: str) -> str:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        _sync(device)
    return f"== {title}\n{_table(prof, device)}\n"


def sdpa_backends(decoder: StaticDecoder, span: int) -> dict:
    """Which fused SDPA kernels accept the decode step's attention call as the ``sdpa``
    variant makes it (grouped queries against the cache's strided slice, the additive float
    mask), on this device; each refusal's reasons as PyTorch states them (CUDA only)."""
    if decoder.device.type != "cuda":
        return {"checked": False, "why": "not on CUDA"}
    import warnings

    cfg = decoder.model.config
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    keys = decoder.cache.key_buffers[0][:, :, :span]
    query = torch.zeros(decoder.rows, kv, heads // kv, keys.shape[-1], dtype=keys.dtype,
                        device=keys.device)
    visible = decoder.columns[None, :span] <= decoder.pos[:, None]
    mask = decoder._additive(visible[:, None, None])
    found: dict = {"checked": True, "key_strides": list(keys.stride()),
                   "key_contiguous": keys.is_contiguous()}
    backends = torch.backends.cuda
    for name in ("flash", "efficient", "cudnn"):
        check = getattr(backends, f"can_use_{name}_attention", None)
        if check is None:
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                params = backends.SDPAParams(query, keys, keys, mask, 0.0, False, False)
                found[name] = bool(check(params, True))
            except Exception as e:  # another signature in another version: say so
                found[name] = f"not checked: {type(e).__name__}: {e}"
        found[f"{name}_why_not"] = [str(w.message) for w in caught][:4]
    return found


@torch.no_grad()
def step_timing(model, prompts: Sequence[Sequence[int]], rows: int,
                attentions: Sequence[str] = ("sdpa",), steps: int = 20,
                profile: Optional[Path] = None, compile_prefill: bool = False) -> dict:
    """ms/step at ``rows`` for each attention variant (captured where on CUDA, and uncaptured),
    with the datasheet ceiling; ``profile``: the top kernels of 3 uncaptured steps (and of 3
    replays) per variant, written to that file as each variant ends. The variants run one
    after another on one decoder filled once (a prefill of ``rows`` prompts); varlen and
    triton, whose cache is token-major, on a second one filled alike once the first is freed.
    ``compile_prefill``: their prefills (timed and profiled too) through torch.compile."""
    device = next(model.parameters()).device
    per_variant = 2 * steps + 10  # steps a variant moves every row: warm-ups, timed, profiled
    out: dict = {"rows": rows, "steps_timed": steps, "variants": {}}
    tables = []
    token_major = [a for a in attentions if a.removesuffix(COMPILED) in ROW_LENGTHS]
    layouts = [[a for a in attentions if a not in token_major], token_major]
    chosen = [list(prompts[i % len(prompts)]) for i in range(rows)]  # every row a prompt
    for group in (g for g in layouts if g):
        decoder = _filled(model, chosen, len(group) * per_variant,
                          group[0].removesuffix(COMPILED), compile_prefill)
        layout = "token-major" if group is token_major else "head-major"
        out.setdefault("prefill", {})[layout] = prefill_timing(decoder, chosen, tables, profile)
        for attention in group:
            out["variants"][attention] = _variant(decoder, model, rows, attention, steps,
                                                  per_variant, tables, profile)
        decoder = None  # its cache freed before the next one is allocated
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if tables:
        out["profile"] = str(profile)
    return out


def _variant(decoder: StaticDecoder, model, rows: int, name: str, steps: int,
             per_variant: int, tables: list, profile: Optional[Path]) -> dict:
    attention = name.removesuffix(COMPILED)
    base = int(decoder.pos.max())
    span = -(-(base + per_variant + 1) // decoder.span_bucket) * decoder.span_bucket
    span = min(span, decoder.capacity)
    mean = float(decoder.pos.float().mean()) + per_variant / 2
    figures = {"span": span, **ceiling(model, rows, span, mean)}
    if attention == "sdpa":
        figures["sdpa_backends"] = sdpa_backends(decoder, span)
    decoder.attention = attention  # the step's mask follows it
    decoder.step_forward = compiled_forward(decoder.body) if name != attention else decoder.body
    # Each variant's graph in a pool of its own: on the H200 (torch 2.11) varlen captured into
    # the pool that still held varlen+compile's graph failed an allocator assertion.
    decoder.pool = None
    try:
        _time_variant(decoder, name, span, steps, figures, tables, profile)
    except Exception as e:  # one variant failing (a kernel that will not compile) is a
        # figure of its own; the others' figures stand
        figures["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        log.error("decode step, %s: %s", attention, figures["error"])
    else:
        best = figures.get("captured_ms", figures["uncaptured_ms"])
        figures["ceiling_share"] = figures["ceiling_ms"] / best
    return figures


def _time_variant(decoder: StaticDecoder, name: str, span: int, steps: int, figures: dict,
                  tables: list, profile: Optional[Path]) -> None:
    """One variant's uncaptured and captured ms/step into ``figures``; with ``profile``, its
    kernel tables appended to ``tables`` and all of them written there."""
    device, rows = decoder.device, decoder.rows
    with swapped(decoder.model, decoder.attention):
        t0 = time.perf_counter()
        decoder._step(span)  # warm-up: kernels pick their algorithms (and a compile runs)
        _sync(device)
        figures["first_step_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(steps // 2):
            decoder._step(span)
        _sync(device)
        figures["uncaptured_ms"] = 1e3 * (time.perf_counter() - t0) / (steps // 2)
        if device.type == "cuda":
            graph = decoder._capture(span)  # its warm-ups move no row (state put back)
            graph.replay()
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                graph.replay()
            _sync(device)
            figures["captured_ms"] = 1e3 * (time.perf_counter() - t0) / steps
            figures["tokens_per_s_at_step"] = rows / figures["captured_ms"] * 1e3
        if profile is not None:
            tables.append(_profiled(lambda: [decoder._step(span) for _ in range(3)], device,
                                    f"{name}: 3 uncaptured decode steps, {rows} rows, "
                                    f"span {span}"))
            if device.type == "cuda":
                tables.append(_profiled(lambda: [graph.replay() for _ in range(3)], device,
                                        f"{name}: 3 captured replays"))
            profile.parent.mkdir(parents=True, exist_ok=True)
            profile.write_text("".join(tables))

