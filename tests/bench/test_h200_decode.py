"""bench.h200_decode at the tiny scale on CPU: the GGUF goes through the pipeline's conversion,
each run in its own process, and the gathered figures say what the runs measured (fp32: the
static engine answers as generate does, the two evaluators give the same tau and outputs; the
sustained run decodes more prompts than rows on one engine; the step timing and its profile)."""

import json
import logging
import threading

import pytest

from bench import h200_decode


@pytest.mark.slow
def test_tiny_scale_gathers_each_runs_figures(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_GGUF_CACHE", str(tmp_path / "gguf"))
    out, logs = tmp_path / "decode.json", tmp_path / "logs"
    result = h200_decode.main(["--scale", "tiny", "--only", "smol_static",
                               "--budget-s", "3000", "--out", str(out), "--logs", str(logs)])
    assert json.loads(out.read_text()) == result
    assert set(result["runs"]) == {"smol_static"}
    smol = result["smollm2_135m"]
    assert smol["regen_tokens_per_s"] > 0 and smol["hf_generate_tokens_per_s"] > 0
    assert smol["regen_identical_to_hf_share"] == 1.0
    assert smol["cb_tokens_per_s"] is None  # not run: no figure is made up for it
    assert result["eval_tau_equal"] is None  # not run either
    # Sustained: 10 prompts through 4 rows of one engine, built once (the first wave's).
    run = result["runs"]["smol_static"]
    sustained = run["sustained"]
    assert sustained["prompts"] == 10 and sustained["batch"] == 4 and sustained["builds"] == 1
    assert sustained["generated_tokens"] > 0 and smol["regen_sustained_tokens_per_s"] > 0
    assert sustained["timed"]["prefill_calls"] >= 2  # refills: more prompts than rows
    assert sustained["timed"]["steps"] > 0 and sustained["timed"]["decode_s"] > 0
    # The prompts past HumanEval's two come from stdlib APIs, none repeated.
    assert run["prompt_source"] == {"humaneval": 2, "stdlib_api": 8, "repeated": 0}
    step = run["step"]["4"]["variants"]
    assert set(step) == {"sdpa", "matmul", "flex", "varlen", "triton"}
    for figures in step.values():
        assert "error" not in figures
        assert figures["uncaptured_ms"] > 0 and figures["ceiling_ms"] > 0
        assert "captured_ms" not in figures  # CPU: nothing captured, nothing claimed
    profile = (logs / "smol_step_profile.txt").read_text()
    assert "== sdpa: 3 uncaptured decode steps" in profile and "aten::" in profile
    assert "== one prefill call: " in profile
    assert set(smol["prefill_call_ms"]) == {"4 rows, head-major", "4 rows, token-major"}
    assert all(call["ms"] > 0 and call["tokens"] > 0
               for calls in smol["prefill_call_ms"].values() for call in calls.values())
    assert set(smol["decode_step_ms"]) == {"4 rows, sdpa", "4 rows, matmul", "4 rows, flex",
                                           "4 rows, varlen", "4 rows, triton"}
    assert smol["regen_sustained_varlen_tokens_per_s"] is None  # its run was not asked for


@pytest.mark.slow
def test_varlen_sustained_run_is_gathered_apart(tmp_path, monkeypatch):
    """The varlen engine's sustained figures land under their own keys, sdpa's stay empty."""
    monkeypatch.setenv("DFLASH_GGUF_CACHE", str(tmp_path / "gguf"))
    result = h200_decode.main(["--scale", "tiny", "--only", "smol_varlen", "--budget-s", "3000",
                               "--out", str(tmp_path / "d.json"), "--logs", str(tmp_path / "l")])
    smol = result["smollm2_135m"]
    sustained = result["runs"]["smol_varlen"]["sustained"]
    assert sustained["prompts"] == 10 and sustained["batch"] == 4
    assert smol["regen_sustained_varlen_tokens_per_s"] == sustained["tokens_per_s"] > 0
    assert smol["regen_sustained_tokens_per_s"] is None and smol["regen_tokens_per_s"] is None


@pytest.mark.slow
def test_cpu_equality_run_in_the_background(tmp_path):
    """The CPU-only run starts beside the others (no GGUF needed, none converted)."""
    out = tmp_path / "decode.json"
    result = h200_decode.main(["--scale", "tiny", "--only", "cpu_eval_equal", "--budget-s",
                               "3000", "--out", str(out), "--logs", str(tmp_path / "logs")])
    assert result["eval_tau_equal"] is True and result["target_folder"] is None
    assert json.loads(out.read_text()) == result


def test_a_spent_budget_skips_runs_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_GGUF_CACHE", str(tmp_path / "gguf"))
    out = tmp_path / "decode.json"
    before = set(threading.enumerate())
    with pytest.raises(SystemExit):
        h200_decode.main(["--scale", "tiny", "--only", "smol_static", "--budget-s", "1",
                          "--out", str(out), "--logs", str(tmp_path / "logs")])
    # The GGUF conversion it started has ended with it: left running, its model loading (which
    # patches PreTrainedModel.tie_weights process-wide) untied a later test's Gemma3 head.
    # (tqdm's progress-bar monitor, a daemon thread, may stay: it touches no model.)
    assert not [t for t in threading.enumerate()
                if t not in before and t.is_alive() and not t.daemon]
    result = json.loads(out.read_text())
    assert "budget left" in result["runs"]["smol_static"]["skipped"]
    assert result["smollm2_135m"]["regen_tokens_per_s"] is None


def test_a_failed_run_names_its_cause_in_the_summary(tmp_path, caplog):
    """The failed run's last log line (the exception) is in the log line and its error: on
    the H100 (2026-12-05) three runs' logs did not come back and only "rc 1" was left."""
    logs = tmp_path / "logs"
    logs.mkdir()
    run = h200_decode.Run("broken", "bench.no_such_module", "", logs)
    with caplog.at_level(logging.INFO, logger="bench.h200_decode"):
        result = run.finish(120)
    assert "No module named bench.no_such_module" in result["error"]
    assert "partial figures" not in result["error"]
    assert any(r.getMessage().startswith("broken: rc 1 in ") and
               r.getMessage().endswith("No module named bench.no_such_module")
               for r in caplog.records)
    bar = logs / "bar.log"
    bar.write_text("Loading: 10%\rLoading: 100%\n\nRuntimeError: boom\n\n")
    assert h200_decode.last_line(bar) == "RuntimeError: boom"
    bar.write_text("")
    assert h200_decode.last_line(bar) == "no output"
    bar.write_text("(TargetWorker pid=5) AcceleratorError: CUDA error: out of memory\n"
                   "\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack "
                   "trace.\n")
    assert h200_decode.last_line(bar) == ("(TargetWorker pid=5) AcceleratorError: CUDA error: "
                                          "out of memory")


def test_unknown_run_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_GGUF_CACHE", str(tmp_path / "gguf"))
    with pytest.raises(SystemExit, match="--only nope: allowed q8b_static, q8b_beside, smol_static"):
        h200_decode.main(["--scale", "tiny", "--only", "nope", "--out", str(tmp_path / "o.json"),
                          "--logs", str(tmp_path / "logs")])


def test_compiled_sustained_runs_are_gathered_apart():
    """The on-request compiled runs land under their own keys, the compile in their setup;
    without them the keys are None, not a figure made up."""
    sustained = {"tokens_per_s": 10.0, "timed": {"decode_tokens_per_s": 20.0},
                 "setup": {"wall_s": 60.0}}
    result = h200_decode.gather({"q8b_compile": {"sustained": sustained}})
    q8b = result["qwen3_8b_random"]
    assert (q8b["regen_sustained_compiled_tokens_per_s"],
            q8b["regen_sustained_compiled_decode_tokens_per_s"],
            q8b["regen_sustained_compiled_setup_s"]) == (10.0, 20.0, 60.0)
    assert q8b["regen_sustained_varlen_tokens_per_s"] is None
    assert result["smollm2_135m"]["regen_sustained_compiled_tokens_per_s"] is None
    assert set(h200_decode.ON_REQUEST) >= {"smol_compile", "q8b_compile"}


def test_each_sustained_variant_lands_under_its_own_keys():
    """gather: the varlen, compiled, triton and compiled-triton sustained runs of a model each
    fill their own keys (a run not made leaves None, never another run's figure)."""
    def run(rate):
        return {"sustained": {"tokens_per_s": rate, "timed": {"decode_tokens_per_s": 2 * rate},
                              "setup": {"wall_s": rate / 100}}}

    result = h200_decode.gather({"q8b_varlen": run(100.0), "q8b_compile": run(200.0),
                                 "q8b_triton_compile": run(400.0)})
    q8b = result["qwen3_8b_random"]
    assert q8b["regen_sustained_varlen_tokens_per_s"] == 100.0
    assert q8b["regen_sustained_compiled_decode_tokens_per_s"] == 400.0
    assert q8b["regen_sustained_compiled_setup_s"] == 2.0
    assert q8b["regen_sustained_triton_tokens_per_s"] is None
    assert q8b["regen_sustained_triton_compiled_tokens_per_s"] == 400.0
    assert q8b["regen_sustained_triton_compiled_setup_s"] == 4.0
    assert result["smollm2_135m"]["regen_sustained_triton_tokens_per_s"] is None


def test_the_sustained_rows_follow_the_cards_memory():
    from bench.h200_decode import H200, ON_REQUEST, rows_for

    assert set(ON_REQUEST) <= set(H200)

    assert rows_for(85.5) == {"smol_rows": 2048, "q8b_rows": 256}   # an H100 80GB
    assert rows_for(150.7) == {"smol_rows": 4096, "q8b_rows": 512}  # an H200
    assert rows_for(None) == rows_for(150.7)
    # Every run's command takes them (no run keeps a fixed row count of its own).
    for name, (_, line, _) in H200.items():
        argv = line.format(folder="F", humaneval="H", logs="L", timeout=1, **rows_for(85.5))
        assert "--sustained-batch 4096" not in argv and "--sustained-batch 512" not in argv, name


def test_each_part_adds_its_runs_to_one_file(tmp_path, monkeypatch):
    """The default runs outlast one device call: each part adds its runs to --out."""
    monkeypatch.setenv("DFLASH_GGUF_CACHE", str(tmp_path / "gguf"))
    out, logs = tmp_path / "decode.json", ["--logs", str(tmp_path / "logs")]
    monkeypatch.setattr(h200_decode, "PARTS", {"1": ("cpu_eval_equal",), "2": ("smol_static",)})
    with pytest.raises(SystemExit, match="--part and --only"):
        h200_decode.main(["--scale", "tiny", "--part", "1", "--only", "smol_static",
                          "--out", str(out), *logs])
    with pytest.raises(SystemExit):  # the first part starts the file; its run finds no budget
        h200_decode.main(["--scale", "tiny", "--part", "2", "--budget-s", "1",
                          "--out", str(out), *logs])
    assert set(json.loads(out.read_text())["runs"]) == {"smol_static"}
    other = {"cpu_eval_equal": {"outputs_agree_share": 1.0, "tau_difference": 0.0}}
    out.write_text(json.dumps({"scale": "h200", "runs": other}))
    with pytest.raises(SystemExit, match="holds scale 'h200', not 'tiny'"):
        h200_decode.main(["--scale", "tiny", "--part", "2", "--out", str(out), *logs])
    out.write_text(json.dumps({"scale": "tiny", "runs": other}))
    with pytest.raises(SystemExit):  # its one run finds the budget spent, and says so
        h200_decode.main(["--scale", "tiny", "--part", "2", "--budget-s", "1",
                          "--out", str(out), *logs])
    result = json.loads(out.read_text())
    assert set(result["runs"]) == {"cpu_eval_equal", "smol_static"}
    assert result["eval_tau_equal"] is True  # the other part's figure, gathered again
    assert "budget left" in result["runs"]["smol_static"]["skipped"]


def test_only_the_runs_that_read_the_gguf_ask_for_it(tmp_path):
    """Part 2 (the 8B shape, random weights) runs without the GGUF and HumanEval, e.g. while
    the GGUF is still being carried over; part 1 is refused naming the runs that read them."""
    out, logs = tmp_path / "decode.json", ["--logs", str(tmp_path / "logs")]
    with pytest.raises(SystemExit, match="needed at --scale h200 by smol_triton, smol_static"):
        h200_decode.main(["--part", "1", "--out", str(out), *logs])
    with pytest.raises(SystemExit) as ended:  # past the check: each run finds no budget left
        h200_decode.main(["--part", "2", "--budget-s", "1", "--out", str(out), *logs])
    assert "needed" not in str(ended.value)
    result = json.loads(out.read_text())
    assert set(result["runs"]) == {"q8b_static", "q8b_eval", "q8b_beside"}
    assert all("budget left" in run["skipped"] for run in result["runs"].values())
