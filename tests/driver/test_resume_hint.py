"""The line a Ctrl-C'd job prints: where it stopped and the exact command that resumes, as a
resubmission where Ray's job server ran the job."""

import json
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


# What Ray 2.x's job server sets in a submitted job's driver (job_supervisor), trimmed.
SUBMITTED = {"RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({
    "runtime_env": {"working_dir": "gcs://_ray_pkg_0123.zip", "env_vars": {"WANDB_API_KEY": "k"}},
    "metadata": {"job_submission_id": "raysubmit_AbC123", "job_name": "raysubmit_AbC123"}})}


def test_under_ray_job_the_line_says_how_to_resubmit(tmp_path):
    newest = _checkpoint(tmp_path, 3)
    args = [f"train.out_dir={tmp_path}", "cluster.address=auto"]
    line = interrupted_line(tmp_path, args, "auto", "stopped by SIGTERM", environ=SUBMITTED)
    assert "\n" not in line and f"the newest checkpoint is {newest} (step 3)" in line
    command = line.split("resume with: ", 1)[1].split(" (", 1)[0]
    assert shlex.split(command) == ["ray", "job", "submit", "--working-dir", ".",
                                    "--runtime-env", "launch/runtime_env.yaml", "--",
                                    "python", "-m", "pipeline.train", *args]
    assert "raysubmit_AbC123" in line and f"launch/submit.sh -- {shlex.join(args)}" in line
    assert "WANDB_API_KEY" not in line and "gcs://" not in line  # never the job's env
    # No checkpoint yet: the same resubmission starts over.
    line = interrupted_line(tmp_path / "new", ["train.seed=1"], "auto", environ=SUBMITTED)
    assert "starts from step 0: ray job submit " in line


def test_outside_ray_job_the_line_is_the_command_line(tmp_path):
    _checkpoint(tmp_path, 3)
    for environ in ({}, {"RAY_JOB_CONFIG_JSON_ENV_VAR": "not json"},
                    {"RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"metadata": {}})}):
        line = interrupted_line(tmp_path, ["train.seed=1"], "auto", environ=environ)
        assert line.endswith("resume with: python -m pipeline.train train.seed=1")
