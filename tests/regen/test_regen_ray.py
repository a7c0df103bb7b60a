"""`pipeline.regenerate` end to end on a local Ray: order, equality, resume, bad lines."""

import dataclasses
import json
import logging
import shutil
import time
from pathlib import Path

import pytest
import ray

from pipeline.data.reader import DataError
from pipeline.regen.actors import ordered_results
from pipeline.regen.config import RegenConfig
from pipeline.regen.runner import prepare, run
from pipeline.regenerate import main


class FirstBatchSlow:
    """Stands in for a generator: the first batch finishes last."""

    def generate(self, batch):
        time.sleep(1.0 if 0 in batch else 0.0)
        return [10 * i for i in batch]


def test_results_come_back_in_batch_order(ray_session):
    workers = [ray.remote(FirstBatchSlow).options(num_cpus=0).remote() for _ in range(2)]
    batches = iter([[0, 1], [2], [3, 4], [5], [6]])
    try:
        got = list(ordered_results(workers, batches, per_worker=1))
    finally:
        for w in workers:
            ray.kill(w)
    assert got == [[0, 10], [20], [30, 40], [50], [60]]


def _config(tiny_assets, src, out, **kw):
    kw = {"num_workers": 2, "batch_size": 2, "max_new_tokens": 16, **kw}
    return RegenConfig(input=str(src), output=str(out), target=tiny_assets.target_dir, **kw)


def _records(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def full_run(ray_cluster, tiny_assets, chat_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("full") / "regen.jsonl"
    return out, run(_config(tiny_assets, chat_file, out))


def test_two_workers_write_the_targets_answers_in_input_order(full_run, chats, reference):
    out, summary = full_run
    records = _records(out)
    assert [r["source_line"] for r in records] == chats[1]
    assert [r["messages"] for r in records] == reference
    assert (summary.lines_read, summary.resumed, summary.regenerated,
            summary.skipped_bad, summary.turns) == (6, 0, 6, 0, 8)
    # The tokens the records hold, and none decoded apart (no cache budget on CPU).
    assert summary.tokens == sum(sum(r["regen"]["num_tokens"]) for r in records) > 0
    assert summary.decoded_apart == 0
    assert f"tokens={summary.tokens} decoded_apart=0 " in summary.line()
    # Every turn the target finished re-renders through the template as what it generated.
    assert summary.turns_not_round_trip == 0
    assert all(r["regen"]["round_trips"] == r["regen"]["finished"] for r in records)


def test_resume_after_a_crash_equals_an_uninterrupted_run(full_run, tiny_assets, chat_file,
                                                          tmp_path):
    full, _ = full_run
    lines = full.read_bytes().split(b"\n")
    crashed = tmp_path / "regen.jsonl"
    crashed.write_bytes(b"\n".join(lines[:2]) + b"\n" + lines[2][:40])
    summary = run(_config(tiny_assets, chat_file, crashed))
    assert crashed.read_bytes() == full.read_bytes()
    assert (summary.resumed, summary.regenerated) == (2, 4)
    # Rerunning a finished file is a no-op: no actor starts, nothing is appended.
    again = run(_config(tiny_assets, chat_file, crashed))
    assert (again.resumed, again.regenerated) == (6, 0)
    assert crashed.read_bytes() == full.read_bytes()


def test_output_of_another_input_is_refused(full_run, tiny_assets, chat_file, tmp_path):
    full, _ = full_run
    lines = full.read_text(encoding="utf-8").splitlines(keepends=True)
    other = tmp_path / "regen.jsonl"
    other.write_text(lines[0] + lines[2], encoding="utf-8")  # source lines 0, 2
    with pytest.raises(ValueError, match=r"regen.jsonl:2: has source_line=2 but conversation"
                                         r" 2 of --input=.* is line 1"):
        prepare(_config(tiny_assets, chat_file, other))


def _copy(full, tmp_path, name="regen.jsonl"):
    out = tmp_path / name
    out.write_bytes(full.read_bytes())
    return out


@pytest.mark.parametrize("override, said", [
    ({"max_new_tokens": 8}, "was generated with --max-new-tokens 16, this run has "
                            "--max-new-tokens 8"),
    ({"enable_thinking": False}, "was generated with --enable-thinking, this run has "
                                 "--no-enable-thinking")])
def test_output_of_other_settings_is_refused_before_any_model_loads(
        full_run, tiny_assets, chat_file, tmp_path, override, said):
    """Resuming with a setting that shapes the answers changed would keep the old answers
    under the new setting: refused in one line naming the setting, the output untouched."""
    full, _ = full_run
    out = _copy(full, tmp_path)
    with pytest.raises(ValueError) as refused:
        prepare(_config(tiny_assets, chat_file, out, **override))
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"{out}:1: {said}")
    assert "--restart" in line
    assert out.read_bytes() == full.read_bytes()


def test_output_of_another_target_is_refused(full_run, tiny_assets, chat_file, tmp_path):
    full, _ = full_run
    other = tmp_path / "target"
    shutil.copytree(tiny_assets.target_dir, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(dict(config, rms_norm_eps=1e-5)))
    out = _copy(full, tmp_path)
    cfg = dataclasses.replace(_config(tiny_assets, chat_file, out), target=str(other))
    with pytest.raises(ValueError, match=rf"{out}:1: was generated with --target [0-9a-f]{{16}}"):
        prepare(cfg)


def test_output_of_an_edited_input_names_the_first_line_that_differs(
        full_run, tiny_assets, chat_file, tmp_path, capsys):
    """Same lines, same conversations count, one prompt edited: the output's answer to the old
    prompt is not this input's. The first edited line is named as file:line, exit 2."""
    full, _ = full_run
    lines = Path(chat_file).read_text().splitlines()
    edited = json.loads(lines[1])
    edited["messages"][1]["content"] += " Briefly."
    lines[1] = json.dumps(edited)
    src = tmp_path / "edited.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out = _copy(full, tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["--input", str(src), "--output", str(out), "--target", "builtin:tiny",
              "--max-new-tokens", "16"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{src}:2: differs from the line {out}:2 was generated from" in err
    assert out.read_bytes() == full.read_bytes()


def test_output_without_fingerprints_is_refused_with_the_way_on(full_run, tiny_assets,
                                                              chat_file, tmp_path):
    """Records of an earlier version carry no fingerprint: nothing proves they are this run's,
    so they are not adopted; the line says how to start anew."""
    full, _ = full_run
    out = tmp_path / "regen.jsonl"
    records = _records(full)
    for r in records:
        del r["fingerprint"]
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ValueError, match=rf"{out}:1: carries no fingerprint .* --restart "
                                         rf"starts {out} anew"):
        prepare(_config(tiny_assets, chat_file, out))


@pytest.mark.slow
def test_restart_writes_the_output_anew_and_keeps_the_old_beside_it(full_run, tiny_assets,
                                                                   chat_file, tmp_path):
    full, _ = full_run
    out = _copy(full, tmp_path)
    summary = run(_config(tiny_assets, chat_file, out, max_new_tokens=8, restart=True))
    assert (summary.resumed, summary.regenerated) == (0, 6)
    assert (tmp_path / "regen.jsonl.before-restart").read_bytes() == full.read_bytes()
    records = _records(out)
    assert [r["fingerprint"]["max_new_tokens"] for r in records] == [8] * 6
    assert all(n <= 8 for r in records for n in r["regen"]["num_tokens"])
    # The fingerprints of the input lines are the same whatever the settings.
    assert [r["fingerprint"]["input"] for r in records] == \
        [r["fingerprint"]["input"] for r in _records(full)]


@pytest.fixture()
def bad_file(chat_file, tmp_path):
    """Four lines: two good, line 3 malformed, one good."""
    good = Path(chat_file).read_text().splitlines()
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([good[0], good[1], '{"messages": [{"role": "user"', good[4]])
                    + "\n")
    return path


def test_malformed_line_stops_before_any_actor(bad_file, tiny_assets, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    with pytest.raises(DataError, match=f"{bad_file}:3: invalid JSON"):
        prepare(_config(tiny_assets, bad_file, out))
    with pytest.raises(SystemExit) as exit_info:
        main(["--input", str(bad_file), "--output", str(out), "--target", "builtin:tiny"])
    assert exit_info.value.code == 2
    assert f"{bad_file}:3: invalid JSON" in capsys.readouterr().err
    assert not out.exists()


def test_skip_mode_counts_and_reports_the_bad_line(ray_cluster, tiny_assets, bad_file,
                                                  tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    out = tmp_path / "out.jsonl"
    code = main(["--input", str(bad_file), "--output", str(out), "--target", "builtin:tiny",
                 "--num-workers", "1", "--batch-size", "2", "--max-new-tokens", "8",
                 "--on-bad-line", "skip"])
    assert code == 0
    assert [r["source_line"] for r in _records(out)] == [0, 1, 3]
    printed = capsys.readouterr().out
    assert "read=4 resumed=0 regenerated=3 skipped_bad=1" in printed
    # The generator's line comes from the driver: an actor's info lines never reach it.
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("generator 0:")]
    assert len(said) == 1 and "engine static (" in said[0], said
    # Its auto compile choice saw the run's answers at most: 4 lines x 8 new tokens.
    assert "compiles nothing (auto: never on cpu; at most 32 answer tokens" in said[0], said


def test_cuda_without_gpus_names_the_flags(ray_cluster, tiny_assets, chat_file, tmp_path):
    from pipeline.regen.actors import pick_device

    cfg = _config(tiny_assets, chat_file, tmp_path / "out.jsonl", device="cuda")
    with pytest.raises(ValueError, match="--device=cuda with --num-workers=2 needs one GPU"):
        pick_device(cfg)
    assert pick_device(_config(tiny_assets, chat_file, tmp_path / "o.jsonl")) == "cpu"


def test_the_driver_reports_prompts_decoded_apart(caplog):
    """The engines' counts come back to the driver, which sums them into the summary and says
    in one warning per generator what went apart and what to change; a cache built more than
    once is one info line."""
    from pipeline.regen.runner import RegenSummary, _report_engines

    summary = RegenSummary()
    with caplog.at_level("INFO", logger="pipeline.regen.runner"):
        _report_engines([{"decoded_apart": 0, "cache_builds": 1, "rows": 512}, {},
                         {"decoded_apart": 3, "longest_apart": 2048, "cache_builds": 2,
                          "rows": 256, "columns": 1024}], summary)
    assert summary.decoded_apart == 3
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["WARNING", "INFO"]
    assert lines[0][1].startswith("generator 2: 3 prompt(s) of up to 2048 tokens did not fit "
                                  "its kept cache (1024 columns a row at 256 rows) and were "
                                  "decoded apart")
    assert "--static-rows" in lines[0][1]
    assert lines[1][1].startswith("generator 2: its cache was built 2 times")
