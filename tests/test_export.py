"""python -m pipeline.export: an unusable step folder is refused in one line naming why and the
run's newest usable checkpoint; the last line of an export names the step; the export's files
get the modes the run's checkpoint files have."""

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipeline import export
from pipeline.checkpoint import folders as ckpt
from pipeline.checkpoint import sharded
from pipeline.checkpoint.point import ResumePoint
from pipeline.checkpoint.writer import AsyncSaver
from pipeline.model.config import DrafterConfig, build_drafter_spec
from pipeline.model.drafter import DFlashDrafter

ROOT = Path(__file__).resolve().parents[1]
GROUP_UMASK = 0o002  # a shared run folder: files group-writable, as the team's launches set
SHARD = "drafter/__0_0.distcp"


def _save(out_dir, step, model, optim, spec):
    """A checkpoint as a drafter rank and the driver write one: DCP files, then published."""
    staging = ckpt.staging_dir(out_dir, step)
    saver = AsyncSaver(None, group=None, owner=True)
    saver.start(lambda: sharded.drafter_state(model, optim), lambda: {"steps_done": step},
                staging, step)
    (done,) = saver.wait()
    assert done.error is None, done.error
    return ckpt.finalize(staging, ResumePoint(step, 0, 2 * step), list(done.records),
                         {"drafter_config": spec.hf_config})


@pytest.fixture(scope="module")
def run(target_config, tmp_path_factory):
    """A run folder with real checkpoints at steps 2 and 4 (other weights), written under a
    group umask; and each step's weights."""
    old = os.umask(GROUP_UMASK)
    try:
        out = tmp_path_factory.mktemp("export_run")
        spec = build_drafter_spec(target_config, DrafterConfig(
            num_layers=1, block_size=4, num_taps=2, mask_token_id=95, num_anchors=4))
        torch.manual_seed(0)
        model = DFlashDrafter(spec)
        optim = torch.optim.AdamW(model.parameters())
        weights = {}
        for step in (2, 4):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(float(step))
            _save(out, step, model, optim, spec)
            weights[step] = {k: v.clone() for k, v in model.state_dict().items()}
    finally:
        os.umask(old)
    return out, weights


def _copy(run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run[0], out)
    return out, ckpt.checkpoint_root(out)


def _truncate(step):
    shard = step / SHARD
    shard.write_bytes(shard.read_bytes()[:100])


def _flip(step):
    data = bytearray((step / SHARD).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (step / SHARD).write_bytes(bytes(data))


def _drop_state(step):
    (step / "state.json").unlink()


def _main(monkeypatch, *argv):
    monkeypatch.setattr(sys, "argv", ["pipeline.export", *argv])
    with pytest.raises(SystemExit) as caught:
        export.main()
    return caught.value.code


@pytest.mark.parametrize("damage,why", [
    (_truncate, f"{SHARD} has 100 bytes, "),
    (_flip, f"{SHARD} does not match its recorded sha256"),
    (_drop_state, "state.json unreadable"),
])
def test_an_unusable_step_folder_is_one_line_naming_the_newest_usable(
        run, tmp_path, monkeypatch, capsys, damage, why):
    out, root = _copy(run, tmp_path)
    damage(root / "step_00000004")
    code = _main(monkeypatch, "--checkpoint", str(root / "step_00000004"),
                 "--out", str(tmp_path / "exported"))
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: --checkpoint {root / 'step_00000004'} is not a usable "
                             f"checkpoint: {why}")
    assert err[0].endswith(f"the newest usable checkpoint of run {out} is "
                           f"{root / 'step_00000002'}")
    assert not (tmp_path / "exported").exists()


def test_an_interrupted_write_given_directly_and_a_run_with_none_usable(
        run, tmp_path, monkeypatch, capsys):
    out, root = _copy(run, tmp_path)
    staging = ckpt.staging_dir(out, 6)  # what a kill during the write of step 6 leaves
    (staging / "trainer.pt").write_bytes(b"torn")
    assert _main(monkeypatch, "--checkpoint", str(staging), "--out", str(tmp_path / "e")) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "state.json unreadable" in err[0], err
    assert err[0].endswith(f"the newest usable checkpoint of run {out} is {root / 'step_00000004'}")
    _flip(root / "step_00000002")
    _truncate(root / "step_00000004")
    assert _main(monkeypatch, "--checkpoint", str(root / "step_00000004"),
                 "--out", str(tmp_path / "e")) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].endswith(f"run {out} has no usable checkpoint"), err


def test_the_cli_refuses_a_truncated_step_folder_in_one_line(run, tmp_path):
    # Was an 11-line traceback (exit status 1).
    out, root = _copy(run, tmp_path)
    _truncate(root / "step_00000004")
    proc = subprocess.run([sys.executable, "-m", "pipeline.export", "--checkpoint",
                           str(root / "step_00000004"), "--out", str(tmp_path / "exported")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = (proc.stdout + proc.stderr).splitlines()
    assert proc.returncode == 2 and len(lines) == 1, lines
    assert "has 100 bytes" in lines[0] and str(root / "step_00000002") in lines[0]


def test_a_run_folder_exports_its_newest_usable_step_and_says_which(run, tmp_path):
    out, root = _copy(run, tmp_path)
    _flip(root / "step_00000004")
    exported = tmp_path / "exported"
    proc = subprocess.run([sys.executable, "-m", "pipeline.export", "--checkpoint", str(out),
                           "--out", str(exported), "--dtype", "float32"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert any("skipping checkpoint" in line and "step_00000004" in line for line in lines)
    assert lines[-1] == f"INFO exported step 2 ({root / 'step_00000002'}) -> {exported}"
    got = load_file(str(exported / "model.safetensors"))
    want = run[1][2]
    assert got.keys() and all(torch.equal(got[k], want[k]) for k in got)


def test_the_export_files_get_the_modes_of_the_checkpoint_files(run, tmp_path):
    step = run[0] / "checkpoints" / "step_00000004"
    old = os.umask(GROUP_UMASK)
    try:
        out = export.export_checkpoint(step, tmp_path / "exported", "float32")
    finally:
        os.umask(old)

    def mode(path):
        return stat.S_IMODE(path.stat().st_mode)
    assert mode(step / "state.json") == mode(step / SHARD) == 0o664
    assert {p.name: mode(p) for p in out.iterdir()} == {
        "config.json": 0o664, "model.safetensors": 0o664, "modeling_dflash.py": 0o664}
    assert mode(out) == mode(step) == 0o775
