"""bench.quality_real_corpus in two calls: ``--until data`` then ``--resume``.

The H200 gives a command 10 minutes; the bench's corpus, target and data take one, its
drafters another. The stages here are stand-ins that record their calls (each real stage
has its own tests; the tiny scale runs them for real): what is checked is which stages each
call runs, that the second call refuses a work folder the first did not finish, and that the
result file of the second call holds both calls' figures.
"""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import bench.quality_real_corpus as bench
from bench.quality import stages
from bench.quality.scale import TINY

_CORPUS = {"train_tokens": 10}


@pytest.fixture
def calls(monkeypatch):
    seen: list[str] = []

    def stage(name, value):
        def run(*args, **kwargs):
            seen.append(name)
            return value
        return run

    trainer = SimpleNamespace(curves=SimpleNamespace(), wall_s=6.0)
    monkeypatch.setattr(stages, "corpus_and_tokenizer", stage("corpus", (None, {}, _CORPUS)))
    monkeypatch.setattr(stages, "target", stage("target", {"target_params": 7}))
    monkeypatch.setattr(stages, "data", stage("data", {"data": {"train": 3}}))
    monkeypatch.setattr(stages, "drafters",
                        stage("drafters", {"pipeline": trainer, "reference": trainer}))
    monkeypatch.setattr(stages, "export_tau", stage("export", {"tau_reference_code": 2.0}))
    monkeypatch.setattr(stages, "trainer_summary", lambda trainers: {
        name: {"final_tau": 2.0} for name in trainers})
    monkeypatch.setattr(bench, "plot_curves", lambda *a: [])
    monkeypatch.setattr(bench, "_copy_samples", lambda *a: None)
    return seen


def _fresh(work: Path) -> None:
    work.mkdir()
    (work / bench._MARKER).write_text("")


def test_the_second_call_runs_only_the_drafters_and_keeps_the_first_calls_figures(
        tmp_path, calls):
    work = tmp_path / "work"
    _fresh(work)
    first = bench.run(TINY, tmp_path / "out1", work, until="data")
    assert calls == ["corpus", "target", "data"] and first["stopped_after"] == "data"
    assert json.loads((tmp_path / "out1" / "quality_real_corpus.json").read_text())[
        "target_params"] == 7

    second = bench.run(TINY, tmp_path / "out2", work, resume=True)
    assert calls == ["corpus", "target", "data", "drafters", "export"]
    written = json.loads((tmp_path / "out2" / "quality_real_corpus.json").read_text())
    assert written == second
    assert "stopped_after" not in second
    assert second["target_params"] == 7 and second["corpus"] == _CORPUS  # from the first call
    assert second["tau_pipeline"] == 2.0 and second["tau_reference_code"] == 2.0
    assert set(second["stage_timings"]) == {"corpus", "target", "data", "drafters", "export"}
    assert [c["stages"] for c in second["calls"]] == [["corpus", "target", "data"],
                                                      ["drafters", "export"]]
    assert second["total_wall_s"] == pytest.approx(
        sum(c["wall_s"] for c in second["calls"]), abs=0.11)
    assert second["command"].count("--until data") == 1
    assert second["command"].endswith("--resume")


def test_resume_refuses_a_work_folder_the_first_call_did_not_finish(tmp_path, calls,
                                                                    capsys):
    work = tmp_path / "work"
    _fresh(work)
    with pytest.raises(SystemExit) as nothing:
        bench.main(["--scale", "tiny", "--out", str(tmp_path / "o"), "--work", str(work),
                    "--resume"])
    assert nothing.value.code == 2
    assert "--resume needs --work" in capsys.readouterr().err

    bench.run(TINY, tmp_path / "o", work, until="target")  # stopped before the data
    with pytest.raises(bench.ResumeError, match="it has corpus, target done"):
        bench.load_state(work)
    assert calls == ["corpus", "target"]


def test_a_finished_run_is_not_resumed_again(tmp_path, calls):
    work = tmp_path / "work"
    _fresh(work)
    bench.run(TINY, tmp_path / "o", work, until="data")
    bench.run(TINY, tmp_path / "o", work, resume=True)
    with pytest.raises(bench.ResumeError, match="drafters not"):
        bench.load_state(work)


def test_resume_with_until_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        bench.main(["--scale", "tiny", "--out", str(tmp_path / "o"), "--work",
                    str(tmp_path / "w"), "--resume", "--until", "data"])
    assert refused.value.code == 2
    assert "--resume runs the drafters" in capsys.readouterr().err


def test_a_whole_run_without_a_tau_does_not_end_rc_0(tmp_path, calls, monkeypatch):
    out, work = tmp_path / "o", tmp_path / "w"
    args = ["--scale", "tiny", "--out", str(out), "--work", str(work)]
    assert bench.main(args) == 0
    monkeypatch.setattr(stages, "trainer_summary", lambda trainers: {
        "pipeline": {"final_tau": None}, "reference": {"final_tau": 2.0}})
    assert bench.main(args) == 1  # the evaluator never gave the pipeline's tau
    assert json.loads((out / "quality_real_corpus.json").read_text())["tau_pipeline"] is None
    assert bench.main(args + ["--until", "data"]) == 0  # stopped before any tau, as asked
