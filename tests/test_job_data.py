"""The job's data is read, checked and encoded before Ray: what stops a job there is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.data import DataError
from pipeline.driver.compose import compose_job
from pipeline.job.job_data import _checked, load_job_data
from pipeline.checks.preflight import PreflightError
from pipeline.job.resolve import resolve_job

SHORT = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Ok."}]}


@pytest.fixture()
def demo_lines(tiny_assets) -> list[str]:
    return Path(tiny_assets.train_path).read_text().splitlines()[:6]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _load(tmp_path, train: list[str], *overrides: str, heldout: bool = False):
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(train) + "\n")
    job = compose_job([f"data.train_path={path}", f"train.out_dir={tmp_path / 'run'}",
                       *overrides])
    return str(path), load_job_data(job, resolve_job(job), heldout=heldout)


def test_the_first_bad_line_is_the_refusal(tmp_path, demo_lines):
    lines = demo_lines[:2] + ["", "{cut"] + demo_lines[2:] + ["[1]"]
    with pytest.raises(PreflightError) as e:
        _load(tmp_path, lines)
    message = str(e.value)
    assert message.startswith(f"{tmp_path / 'train.jsonl'}:4: invalid JSON") and \
        "data.on_bad_line=skip" in message and "\n" not in message


@pytest.mark.parametrize("lines, counts", [
    (["{cut", "", "[1]", "nope"], "lines=4 = conversations=0 + skipped_bad=3 + blank=1;"),
    ([json.dumps(SHORT)] * 3, "lines=3 = conversations=3 + skipped_bad=0 + blank=0; samples "
                              "kept=0 dropped_too_short=3"),
], ids=["every line bad", "every sample too short"])
def test_no_usable_sample_is_refused_with_the_counts(tmp_path, lines, counts):
    with pytest.raises(PreflightError) as e:
        _load(tmp_path, lines, "data.on_bad_line=skip")
    message, least = str(e.value), 2 * compose_job([]).drafter.block_size
    assert message.startswith(f"data.train_path='{tmp_path / 'train.jsonl'}': no usable sample "
                              f"(each needs >= {least} supervised tokens") and counts in message


def test_skip_keeps_the_good_lines_and_their_ids(tmp_path, demo_lines):
    _, data = _load(tmp_path, ["{cut", "", *demo_lines], "data.on_bad_line=skip")
    assert data.train.sample_ids == [2, 3, 4, 5, 6, 7] and data.heldout is None
    assert (data.train.stats.lines, data.train.stats.blank, data.train.stats.skipped_bad) == (
        8, 1, 1)


def test_heldout_is_read_only_when_tau_is_evaluated(tmp_path, demo_lines):
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("\n".join(demo_lines[:2] + ["{cut"]) + "\n")
    over = [f"data.heldout_path={heldout}", "train.eval.prompts=4"]
    with pytest.raises(PreflightError, match=rf"^{heldout}:3: invalid JSON"):
        _load(tmp_path, demo_lines, *over, heldout=True)
    # Two prompts are all it reads: the bad third line is never reached.
    _, data = _load(tmp_path, demo_lines, *over[:1], "train.eval.prompts=2", heldout=True)
    assert data.heldout is not None and len(data.heldout) == 2
    _, data = _load(tmp_path, demo_lines, *over, heldout=False)
    assert data.heldout is None


def test_the_driver_reads_heldout_before_ray_when_tau_is_on(tmp_path, demo_lines):
    """The driver's wiring: its constructor starts no Ray, and refuses a bad held-out line when
    tau is evaluated (train.eval.every >= 0), not when it is off."""
    from pipeline.driver.job import Driver

    heldout = _write(tmp_path / "heldout.jsonl", ["{cut", *demo_lines])
    over = [f"data.heldout_path={heldout}", f"train.out_dir={tmp_path / 'run'}"]
    with pytest.raises(PreflightError, match=rf"^{heldout}:1: invalid JSON"):
        Driver(compose_job(over))
    driver = Driver(compose_job([*over, "train.eval.every=-1"]))
    assert driver.data.heldout is None and len(driver.data.train) > 0


def test_a_heldout_file_without_a_prompt_is_refused(tmp_path, demo_lines):
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("{cut\n\n")
    with pytest.raises(PreflightError, match=r"no held-out prompt for tau \(train.eval.prompts"
                                             r"=16\): 2 line\(s\) = skipped_bad=1 \+ blank=1"):
        _load(tmp_path, demo_lines, f"data.heldout_path={heldout}", "data.on_bad_line=skip",
              heldout=True)


def test_a_reason_over_several_lines_is_one_line():
    def bad():
        raise DataError("t.jsonl", 3, "the chat template fails on it (TemplateError: no\nway)",
                        "template")
    with pytest.raises(PreflightError) as e:
        _checked(bad)
    assert str(e.value).startswith("t.jsonl:3: the chat template fails on it (TemplateError: "
                                   "no way)") and "\n" not in str(e.value)
