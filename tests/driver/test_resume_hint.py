"""The line a Ctrl-C'd job prints: where it stopped and the exact command that resumes."""

import shlex

from pipeline.checkpoint import folders as ckpt
from pipeline.checkpoint.files import FileRecord, sha256_file
from pipeline.checkpoint.point import ResumePoint
from pipeline.driver.resume_hint import interrupted_line, resume_args


def _checkpoint(out, step):
    staging = ckpt.staging_dir(out, step)
    (staging / "drafter.pt").write_bytes(b"weights")
    record = FileRecord("drafter.pt", 7, sha256_file(staging / "drafter.pt"))
    return ckpt.finalize(staging, ResumePoint(step=step, epoch=0, samples_done=4 * step),
                         [record], {})


def test_the_resume_override_becomes_auto_in_place_or_is_added():
    args = ["--config-name", "qwen3_8b", "train.checkpoint.resume=null", "train.seed=3"]
    assert resume_args(args, None) == ["--config-name", "qwen3_8b",
                                       "train.checkpoint.resume=auto", "train.seed=3"]
    assert resume_args(["+train.checkpoint.resume=/a/step_1"], "/a/step_1") == \
        ["train.checkpoint.resume=auto"]
    # Not on the command line: added only when the config would not resume by itself.
    assert resume_args(["train.seed=3"], None) == ["train.seed=3", "train.checkpoint.resume=auto"]
    assert resume_args(["train.seed=3"], "auto") == ["train.seed=3"]
    # A key that only starts like it is left alone.
    assert resume_args(["train.checkpoint.resume_x=1"], "auto") == ["train.checkpoint.resume_x=1"]


def test_the_line_names_the_newest_usable_checkpoint_and_a_command_that_parses_back(tmp_path):
    out = tmp_path / "my run"
    _checkpoint(out, 2)
    newest = _checkpoint(out, 4)
    args = [f"train.out_dir={out}", "data.train_path=/data/a b.jsonl",
            "train.checkpoint.resume=null"]
    line = interrupted_line(out, args, None)
    assert "\n" not in line and f"the newest checkpoint is {newest} (step 4)" in line
    command = line.split("resume with: ", 1)[1]
    assert shlex.split(command) == ["python", "-m", "pipeline.train", *args[:2],
                                    "train.checkpoint.resume=auto"]


def test_with_no_checkpoint_a_rerun_starts_over_or_from_the_checkpoint_given(tmp_path):
    line = interrupted_line(tmp_path, ["train.seed=1"], "auto")
    assert "no checkpoint was written" in line and "starts from step 0" in line
    assert line.endswith(": python -m pipeline.train train.seed=1")
    # An explicit checkpoint elsewhere and nothing written here: the same command again.
    given = _checkpoint(tmp_path / "before", 6)
    args = [f"train.checkpoint.resume={given}"]
    line = interrupted_line(tmp_path / "new", args, str(given))
    assert f"resumes from {given} again" in line
    assert line.endswith(f": python -m pipeline.train {shlex.join(args)}")
