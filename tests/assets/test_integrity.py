"""Model files checked before anything loads them (pipeline/assets/integrity.py): a GGUF or
safetensors file cut short or damaged is one line naming it, before Ray starts, from
``resolve_target_path``, which every entry point goes through."""

import json
import os
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from pipeline.assets import gguf as gguf_mod
from pipeline.assets import resolve_target_path
from pipeline.assets.integrity import BrokenModelFile, check_gguf
from pipeline.checks.preflight import PreflightError
from tests.driver.cli_run import refused_before_ray


def _cut(src: Path, dst: Path, keep: int) -> Path:
    dst.write_bytes(src.read_bytes()[:keep])
    return dst


def _one_line(error: pytest.ExceptionInfo) -> str:
    line = str(error.value)
    assert "\n" not in line
    return line


# --- GGUF ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    pytest.importorskip("gguf")
    from pipeline.assets.tiny_gguf import write_tiny_gguf

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(str(path))
    check_gguf(path)  # the whole file passes
    return path


def test_a_gguf_cut_in_its_data_is_named_before_any_conversion(tiny_gguf, tmp_path,
                                                                monkeypatch):
    """As a partial download leaves it: today's loader said only "cannot reshape array"."""
    monkeypatch.setenv(gguf_mod.ENV_VAR, str(tmp_path / "cache"))
    size = tiny_gguf.stat().st_size
    keep = size * 3 // 5
    cut = _cut(tiny_gguf, tmp_path / "cut.gguf", keep)
    with pytest.raises(BrokenModelFile) as e:
        resolve_target_path(str(cut))
    assert _one_line(e).startswith(f"{cut}: truncated at {keep:,} of {size:,} bytes, inside "
                                   f"the tensor data (the last tensor, 'blk.5.ffn_down.weight'")
    assert not (tmp_path / "cache").exists()  # nothing converted, nothing cached


def test_a_gguf_cut_inside_its_header_is_one_line(tiny_gguf, tmp_path, monkeypatch):
    """Cut in the fixed header, the metadata (the tokenizer) or the tensor table: one line
    saying where, never a traceback of the reader."""
    from gguf import GGUFReader

    monkeypatch.setenv(gguf_mod.ENV_VAR, str(tmp_path / "cache"))
    # The data section starts at most 31 bytes of alignment after the table ends.
    table_end = GGUFReader(str(tiny_gguf)).data_offset - 32
    for keep, where in ((10, "the fixed header"), (2000, r"metadata entry \d+ of 20"),
                        (table_end - 10, "tensor info 56 of 56")):
        cut = _cut(tiny_gguf, tmp_path / f"cut{keep}.gguf", keep)
        with pytest.raises(BrokenModelFile, match=rf"^{cut}: truncated at {keep:,} bytes, "
                                                  rf"inside {where}; a partial download"):
            resolve_target_path(str(cut))


def test_a_file_that_is_no_gguf_and_a_damaged_table_are_named(tiny_gguf, tmp_path):
    other = tmp_path / "model.gguf"
    other.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(BrokenModelFile, match=rf"{other}: not a GGUF file"):
        check_gguf(other)
    damaged = bytearray(tiny_gguf.read_bytes())
    damaged[4:8] = (7).to_bytes(4, "little")  # the version
    other.write_bytes(damaged)
    with pytest.raises(BrokenModelFile, match=rf"{other}: damaged header \(GGUF version 7"):
        check_gguf(other)


# --- safetensors ---------------------------------------------------------------------------

@pytest.fixture()
def target_copy(tiny_assets, tmp_path):
    folder = tmp_path / "target"
    shutil.copytree(tiny_assets.target_dir, folder)
    return folder


def _weights(folder: Path) -> tuple[Path, bytes]:
    path = folder / "model.safetensors"
    return path, path.read_bytes()


def test_a_cut_safetensors_is_named_with_the_bytes_it_lacks(target_copy):
    path, data = _weights(target_copy)
    keep = len(data) - 1000
    path.write_bytes(data[:keep])
    with pytest.raises(BrokenModelFile) as e:
        resolve_target_path(str(target_copy))
    assert _one_line(e).startswith(f"{path}: truncated at {keep:,} of {len(data):,} bytes, "
                                   "inside the tensor data")


@pytest.mark.parametrize("damage, said", [
    (lambda d: d[:5], "truncated at 5 bytes, inside the 8-byte header length"),
    (lambda d: d[:100], r"truncated at 100 bytes, inside its [\d,]+-byte JSON header"),
    (lambda d: b"\xff" * 8 + d[8:], "damaged header .declares a [\\d,]+-byte JSON header"),
    (lambda d: d[:8] + b"[" + d[9:], "damaged header .the JSON header does not parse"),
    (lambda d: d + b"\0" * 16, "damaged header .16 bytes after the last tensor's end")])
def test_a_damaged_safetensors_header_is_named(target_copy, damage, said):
    path, data = _weights(target_copy)
    path.write_bytes(damage(data))
    with pytest.raises(BrokenModelFile, match=rf"^{path}: {said}"):
        resolve_target_path(str(target_copy))


def test_sharded_weights_are_checked_through_their_index(target_copy):
    """Each shard's header against its size, and the index's tensors against the shards'."""
    path, _ = _weights(target_copy)
    tensors = load_file(path)
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, part in shards.items():
        save_file({n: tensors[n] for n in part}, target_copy / shard)
    path.unlink()
    weight_map = {n: shard for shard, part in shards.items() for n in part}
    index = target_copy / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": weight_map}))
    assert resolve_target_path(str(target_copy)) == str(target_copy)

    moved = names[0]
    index.write_text(json.dumps({"weight_map": dict(weight_map, **{
        moved: "model-00002-of-00002.safetensors"})}))
    with pytest.raises(BrokenModelFile, match=rf"{index}: maps '{moved}' to "
                                              r"model-00002-of-00002.safetensors, whose header"):
        resolve_target_path(str(target_copy))
    index.write_text(json.dumps({"weight_map": weight_map}))
    second = target_copy / "model-00002-of-00002.safetensors"
    second.write_bytes(second.read_bytes()[:-1])
    with pytest.raises(BrokenModelFile, match=rf"{second}: truncated at"):
        resolve_target_path(str(target_copy))


# --- every entry point, before Ray ---------------------------------------------------------

@pytest.fixture()
def cut_target(target_copy):
    path, data = _weights(target_copy)
    path.write_bytes(data[:len(data) // 2])
    return target_copy, f"{path}: truncated at {len(data) // 2:,} of {len(data):,} bytes"


def test_the_driver_and_regenerate_stop_on_a_cut_target(cut_target, tiny_assets, tmp_path,
                                                       capsys):
    from pipeline.driver.compose import compose_job
    from pipeline.driver.job import Driver
    from pipeline.regenerate import main

    folder, line = cut_target
    with pytest.raises(PreflightError, match=line):  # its constructor starts no Ray
        Driver(compose_job([f"target.path={folder}", f"train.out_dir={tmp_path / 'run'}"]))
    with pytest.raises(SystemExit) as exit_info:
        main(["--input", tiny_assets.heldout_path, "--output", str(tmp_path / "out.jsonl"),
              "--target", str(folder)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and line in err[0], err
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.slow
def test_train_cli_says_it_in_one_line_before_ray(cut_target, tiny_assets, tmp_path):
    folder, line = cut_target
    env = dict(os.environ, DFLASH_ASSETS_DIR=tiny_assets.root, RAY_ADDRESS="")
    output = refused_before_ray(env, f"target.path={folder}",
                                f"train.out_dir={tmp_path / 'run'}")
    assert [text for text in output.splitlines() if line in text], output[-3000:]
