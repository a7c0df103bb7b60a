"""bench/real_model.py at tiny scale: a tiny Llama GGUF through conversion, prompts,
regeneration, both trainers and the export decoded apart, with the result file's keys; and a
second call that goes on from the stages done (resumable calls)."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.real_model_steps import curve_sizes

pytest.importorskip("gguf")
ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--scale", "tiny", "--train-prompts", "16", "--heldout-prompts", "2",
         "--humaneval-prompts", "2", "--max-new-tokens", "12", "--max-steps", "2",
         "--eval-prompts", "1"]


def _bench(args, tmp_path):
    humaneval = tmp_path / "HumanEval.jsonl.gz"  # two tasks in HumanEval's form
    with gzip.open(humaneval, "wt") as f:
        for name in ("add", "sub"):
            f.write(json.dumps({"prompt": f"def {name}(a, b):\n    \"\"\"{name} a and b.\"\"\"\n"})
                    + "\n")
    args = [*args, "--humaneval", str(humaneval)]
    env = dict(os.environ, RAY_ADDRESS="", DFLASH_GGUF_CACHE=str(tmp_path / "gguf_cache"))
    return subprocess.run([sys.executable, "-m", "bench.real_model", *SMALL,
                           "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"),
                           *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)


def test_curve_spans_16x_in_4_sizes():
    assert curve_sizes(1600, curve=True) == [100, 200, 400, 1600]
    assert curve_sizes(3, curve=True) == [1, 1, 1, 3]
    assert curve_sizes(1600, curve=False) == [1600]


@pytest.mark.slow
def test_tiny_chain_writes_the_result_file_and_resumes(tmp_path):
    first = _bench(["--until", "data"], tmp_path)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    state = json.loads((tmp_path / "work" / "state.json").read_text())
    assert state["done"] == ["convert", "prompts", "data"]
    # Goes on from the drafters; --set replaces the bench's own value of a key, for every
    # trainer (packed micro-batches here, as the h200 scale trains), and a recipe adds its
    # overrides to those.
    # --redo: a stage done runs again (its files lost with another machine), the rest do not.
    second = _bench(["--curve", "--set", "drafter.num_anchors=8", "--set", "data.batching=pack",
                     "--recipe", "g2", "drafter.gamma=2", "--redo", "prompts"], tmp_path)
    output = second.stdout + second.stderr
    assert second.returncode == 0, output[-3000:]
    assert "=== convert" not in output and "=== data" not in output
    assert "running again, as asked: prompts" in output and "=== prompts" in output
    assert "=== drafters" in output
    commands = [line for line in output.splitlines() if "-m pipeline.train" in line]
    # The pipeline alone, then the reference beside the curve's N/16, N/8, N/4, then the recipe.
    assert len(commands) == 6
    assert all("drafter.num_anchors=8" in c and "drafter.num_anchors=16" not in c
               and "data.batching=pack" in c for c in commands)
    assert ["drafter.gamma=2" in c for c in commands] == [False] * 5 + [True]
    result = json.loads((tmp_path / "out" / "real_model.json").read_text())
    assert result["target"]["model_type"] == "llama" and result["target"]["parameters"] > 0
    assert result["train_samples"] == 16
    for key in ("tau_humaneval_pipeline", "tau_humaneval_reference",
                "tau_humaneval_reference_code", "tau_second_heldout"):
        assert result[key] is not None and result[key] >= 1.0, key
    assert 0 <= result["greedy_distinct_4grams"] <= 1 and 0 <= result["greedy_ended_share"] <= 1
    assert len(result["tau_per_position"]["humaneval"]) == 3  # block 4: positions 1..3
    minutes = result["gpu_minutes"]
    assert set(minutes) >= {"convert", "prompts", "data", "drafters", "export", "reference",
                            "recipes", "chain", "total"}
    assert minutes["chain"] == pytest.approx(sum(minutes[k] for k in (
        "convert", "prompts", "data", "drafters", "export")), abs=0.02)
    assert [row["samples"] for row in result["data_curve"]] == [1, 2, 4, 16]
    assert all(row["tau"] >= 1.0 and row["sharing_device"] == 4 for row in result["data_curve"])
    assert result["data_curve"][-1]["tau"] == result["tau_humaneval_reference"]
    assert set(result["trainers"]) == {"pipeline", "reference"}
    recipe = result["recipes"]["g2"]
    assert recipe["overrides"] == ["drafter.gamma=2"] and recipe["tau"] >= 1.0
    assert recipe["steps"] == 2 and recipe["sharing_device"] == 1
    # Prompts-only lines, split by source module: no held-out module among training prompts.
    prompts = tmp_path / "work" / "prompts"
    line = json.loads((prompts / "train.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in line["messages"]] == ["user"]


def test_prompts_built_elsewhere_are_used_as_they_are(tmp_path):
    from bench.real_model_scale import TINY
    from bench.real_model_steps import Work, prompts

    built = tmp_path / "built"
    built.mkdir()
    line = lambda text: json.dumps({"messages": [{"role": "user", "content": text}]})  # noqa: E731
    for name, n in (("train", 5), ("humaneval", 3), ("heldout_explain", 2)):
        (built / f"{name}.jsonl").write_text("".join(line(f"{name} {i}") + "\n" for i in range(n)))
    (built / "prompts_stats.json").write_text(json.dumps({"prompts": 7}))
    scale = TINY.with_sizes(prompts_dir=str(built), train_prompts=4, humaneval_prompts=2,
                            heldout_prompts=9)
    got = prompts(scale, Work(tmp_path / "work"), {})
    assert got["prompt_counts"] == {"train": 4, "humaneval": 2, "explain": 2}
    assert got["prompts"]["built_elsewhere"] == str(built)
    rows = (tmp_path / "work" / "data" / "regen_input.jsonl").read_text().splitlines()
    assert [json.loads(r)["messages"][0]["content"].split()[0] for r in rows] == \
        ["train"] * 4 + ["humaneval"] * 2 + ["heldout_explain"] * 2


def test_the_plot_takes_the_curve_rows_with_a_tau_in_samples_order():
    from bench.plot_real_model import curve_points

    result = {"data_curve": [{"samples": 40, "gpu_minutes": 2.0, "tau": 2.1},
                             {"samples": 10, "gpu_minutes": 0.5, "tau": 1.4},
                             {"samples": 20, "gpu_minutes": 1.0, "tau": None}]}
    assert curve_points(result) == [(10, 0.5, 1.4), (40, 2.0, 2.1)]
    assert curve_points({}) == []


def test_a_stage_that_gave_no_figure_is_named_for_a_nonzero_exit():
    from bench.real_model import missing_figures

    result = {"tau_humaneval_pipeline": 2.0, "tau_humaneval_reference": None,
              "data_curve": [{"samples": 10, "tau": 1.5}, {"samples": 40, "tau": None}]}
    assert missing_figures(["convert", "data"], result) == []
    assert missing_figures(["drafters"], result) == []
    assert missing_figures(["drafters", "reference"], result) == [
        "tau_humaneval_reference", "data_curve tau at 40 samples"]
    assert missing_figures(["export"], result) == ["tau_humaneval_reference_code",
                                                   "tau_second_heldout"]


def test_recipes_already_measured_are_not_trained_again(tmp_path):
    from bench.real_model_scale import TINY
    from bench.real_model_steps import Work, recipes

    measured = {"g2": {"overrides": ["drafter.gamma=2"], "tau": 1.5}}
    scale = TINY.with_sizes(recipes=(("g2", ("drafter.gamma=2",)),))
    got = recipes(scale, Work(tmp_path / "work"), {"recipes": measured})
    assert got == {"recipes": measured}
    assert not (tmp_path / "work" / "runs").exists()  # no trainer started


def test_greedy_stats_of_every_answer_pool_the_sets_by_answers():
    from bench.real_model_steps import _pooled

    sets = [{"answers": 3, "ended_turn": 3, "distinct_4grams": 0.5, "mean_assistant_tokens": 10},
            {"answers": 1, "ended_turn": 0, "distinct_4grams": 0.9, "mean_assistant_tokens": 30}]
    assert _pooled(sets) == {"answers": 4, "ended_share": 0.75, "distinct_4grams": 0.6,
                             "mean_assistant_tokens": 15.0}


def test_recipes_compare_with_a_run_of_their_own_size():
    """A recipe on all answers compares with the reference's run, on N answers with the data
    curve's run of N, and with neither a base run is trained beside it (None here)."""
    from bench.real_model_steps import _base_tau

    result = {"tau_humaneval_reference": 3.1,
              "data_curve": [{"samples": 4, "tau": 2.0}, {"samples": 16, "tau": 3.1}]}
    assert _base_tau(result, 16, 16) == 3.1
    assert _base_tau(result, 4, 16) == 2.0
    assert _base_tau(result, 8, 16) is None
    assert _base_tau({}, 16, 16) is None


def test_a_recipe_named_base_is_refused_in_one_line(tmp_path):
    got = _bench(["--recipe", "base", "drafter.gamma=2"], tmp_path)
    assert got.returncode == 2
    assert "--recipe base: reserved for the run without overrides" in got.stderr
    assert not (tmp_path / "work").exists()
