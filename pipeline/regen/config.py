"""Options of ``python -m pipeline.regenerate``, checked before any actor starts."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from pipeline.data.config import FORMATS, ON_BAD_LINE
from pipeline.regen.cb import ENGINES, CbOptions
from pipeline.regen.static_attention import CHOICES as ATTENTIONS, ROW_LENGTHS
from pipeline.checks.validate import require, require_choice

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class RegenConfig:
    input: str  # chat JSONL, OpenAI "messages" or ShareGPT "conversations" per line
    output: str  # JSONL in "messages" form plus "source_line"; appended to when it exists
    # Start --output anew instead of resuming it (the earlier file is kept beside it, as
    # <output>.before-restart): a resume refuses an output of another input or settings.
    restart: bool = False
    target: str = "builtin:tiny"  # HF model folder, or builtin:tiny (the embedded demo)
    num_workers: int = 1  # generator actors; one GPU each on cuda
    device: str = "auto"  # auto: cuda when the Ray cluster has GPUs
    dtype: str = "auto"  # auto: bfloat16 on cuda, float32 on cpu
    # static: our static-cache engine (pipeline/regen/static_engine.py: rows refilled as
    # they finish, the decode step a CUDA graph); cb: transformers' continuous-batching
    # engine; generate: left-padded generate() batches (the measured baseline). static and
    # cb fall back to generate, with a log line, where they cannot serve the model.
    # docs/BENCHMARKS.md ("Decoding") has the three measured side by side.
    engine: str = "static"
    # Conversations per worker call. generate: also its padded batch. static and cb: a
    # round's turns go through the engine together. None: 16 for generate, 1024 otherwise.
    batch_size: Optional[int] = None
    static_rows: int = 512  # static: the KV cache's rows (requests decoded at once)
    # static: the decode step's attention (pipeline/regen/static_attention.py: sdpa and
    # matmul read every row's cache up to the furthest row; flex, varlen and triton each
    # row's own prefix). auto: on CUDA (Ampere+) in bf16/fp16 triton where Triton builds its
    # kernel, else varlen where the flash kernel runs; sdpa elsewhere.
    static_attention: str = "auto"
    # static: the decode step through torch.compile (fused norms, RoPE and activations; the
    # compile is paid once per worker and kept in the compile cache). varlen or triton
    # attention only. None: auto (compile_choice below).
    static_compile: Optional[bool] = None
    # static: the prefills through torch.compile with symbolic shapes (fused norms, RoPE and
    # activations over every prompt token; one compile a worker), any attention. None: auto.
    static_compile_prefill: Optional[bool] = None
    max_new_tokens: int = 256  # per assistant turn; longer answers are cut and counted
    # Passed to the chat template, as data.enable_thinking is in training and eval: use the
    # same value for both (see pipeline.data.config).
    enable_thinking: bool = True
    on_bad_line: str = "error"  # a malformed input line stops the job, or is skipped
    format: str = "auto"  # per line, or forced: one of FORMATS
    # Batches queued per worker: one computing, the next already waiting, so a worker never
    # idles while the driver writes results.
    in_flight_per_worker: int = 2
    cpus_per_worker: float = 1.0
    # The continuous-batching engine's knobs (None/auto: the library's choice); see CbOptions.
    cb_max_batch_tokens: Optional[int] = None
    cb_num_blocks: Optional[int] = None
    cb_max_requests: Optional[int] = None
    cb_cuda_graphs: str = "auto"
    cb_compile_level: int = 0
    ray_address: Optional[str] = None  # None: $RAY_ADDRESS, else a private local cluster

    def __post_init__(self) -> None:
        require(bool(self.input) and os.path.isfile(self.input), "--input", self.input,
                "an existing JSONL file")
        require(bool(self.output) and os.path.abspath(self.output)
                != os.path.abspath(self.input), "--output", self.output,
                "a path other than --input")
        require(bool(self.target), "--target", self.target, "a model folder or builtin:tiny")
        for flag, value in (("--num-workers", self.num_workers),
                            ("--batch-size", self.conversations_per_call),
                            ("--max-new-tokens", self.max_new_tokens),
                            ("--in-flight-per-worker", self.in_flight_per_worker),
                            ("--static-rows", self.static_rows)):
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
            require(ok, flag, value, "an integer >= 1")
        require(self.cpus_per_worker > 0, "--cpus-per-worker", self.cpus_per_worker, "> 0")
        require_choice("--device", self.device, DEVICES)
        require_choice("--dtype", self.dtype, DTYPES)
        require_choice("--on-bad-line", self.on_bad_line, ON_BAD_LINE)
        require_choice("--format", self.format, FORMATS)
        require_choice("--engine", self.engine, ENGINES)
        require_choice("--static-attention", self.static_attention, ATTENTIONS)
        # With auto attention the worker checks what auto picked (compile_choice).
        require(not self.static_compile or (self.engine == "static" and self.static_attention
                                             in (*ROW_LENGTHS, "auto")),
                "--static-compile", self.static_compile,
                f"only with --engine static and --static-attention {', '.join(ROW_LENGTHS)} "
                "or auto (one compiled shape serves every span)")
        require(not self.static_compile_prefill or self.engine == "static",
                "--static-compile-prefill", self.static_compile_prefill,
                "only with --engine static")
        self.cb_options()  # its checks name the --cb-* flags

    @property
    def conversations_per_call(self) -> int:
        if self.batch_size is not None:
            return self.batch_size
        return 16 if self.engine == "generate" else 1024

    def cb_options(self) -> CbOptions:
        return CbOptions(max_batch_tokens=self.cb_max_batch_tokens,
                         num_blocks=self.cb_num_blocks, max_requests=self.cb_max_requests,
                         cuda_graphs=self.cb_cuda_graphs, compile_level=self.cb_compile_level)


# Auto compiles a generator's decode step and prefills when its share of the answers is worth
# at least this many FLOPs (2 x the model's parameters x lines x --max-new-tokens, an upper
# bound: answers may stop early). Both compiles cost 136 s more set-up at the Qwen3-8B shape
# on an H100 and speed its regeneration 1.37x (8.1k -> 11.2k tokens/s), repaid after about 4M
# generated tokens (7e16 FLOPs); the bar is four times that. SmolLM2-135M's step compile
# (46 s for 1.14x on an H200) is repaid only after about 34M tokens, also below the bar's
# 1.1G. On CPU nothing is compiled unless asked.
AUTO_COMPILE_FLOP = 3e17


@dataclass(frozen=True)
class CompileChoice:
    step: bool
    prefill: bool
    auto: str = ""  # why auto chose as it did; empty where both were set explicitly

    def note(self) -> str:
        """What a generator's line says of its compiles: those it makes on its first call (the
        minutes they take would otherwise look like a hang) and, where auto chose, why."""
        parts = [name for name, on in (("decode step", self.step), ("prefills", self.prefill))
                 if on]
        said = (f"compiles its {' and '.join(parts)} on its first call: minutes on an empty "
                "compile cache (136 s more set-up for both at the Qwen3-8B shape on an H100)"
                if parts else "compiles nothing")
        return f"{said}{f' ({self.auto})' if self.auto else ''}"


def compile_choice(step: Optional[bool], prefill: Optional[bool], attention: str,
                   device_type: str, parameters: int, answer_tokens: Optional[int]
                   ) -> CompileChoice:
    """The static engine's compiles: an explicit setting as given; None (auto) on CUDA when the
    generator's answers are worth :data:`AUTO_COMPILE_FLOP`, the step only where its attention
    reads each row to its own length (``ROW_LENGTHS``)."""
    if step and attention not in ROW_LENGTHS:
        raise ValueError(f"--static-compile needs the {' or '.join(ROW_LENGTHS)} decode step, "
                         f"but --static-attention auto picked {attention} here (neither "
                         "kernel runs on this device and dtype): drop --static-compile")
    if step is not None and prefill is not None:
        return CompileChoice(step, prefill)
    flop = 2 * parameters * (answer_tokens or 0)
    worth = device_type == "cuda" and flop >= AUTO_COMPILE_FLOP
    size = ("answer tokens unknown" if answer_tokens is None else
            f"at most {answer_tokens:,} answer tokens")
    if device_type != "cuda":
        why = f"auto: never on {device_type}; {size}"
    else:
        billions = parameters / 1e9
        why = (f"auto: {size} of a {billions:.3g}B-parameter model, {flop:.1e} FLOPs, "
               f"{'at or above' if worth else 'below'} {AUTO_COMPILE_FLOP:.0e}; "
               "--[no-]static-compile[-prefill] decide")
    return CompileChoice(
        step=worth and attention in ROW_LENGTHS if step is None else step,
        prefill=worth if prefill is None else prefill, auto=why)

