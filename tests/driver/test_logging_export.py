"""wandb (offline) gets the run's config and metrics; the trace and the export CLI work."""

import json
import logging
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from pipeline.driver.compose import compose_job
from pipeline.driver.job import Driver

ROOT = Path(__file__).resolve().parents[2]


def _log_records(raw: bytes):
    """Payloads of a .wandb file: a 7-byte header, then LevelDB-log records in 32 KiB blocks
    (4-byte checksum, 2-byte length, 1-byte type: 1 full, 2 first, 3 middle, 4 last)."""
    assert raw[:4] == b":W&B", "not a wandb transaction log"
    pos, pending = 7, b""
    while pos + 7 <= len(raw):
        room = 32768 - pos % 32768
        if room < 7:  # block trailer too small for a header: skip to the next block
            pos += room
            continue
        length = int.from_bytes(raw[pos + 4:pos + 6], "little")
        kind = raw[pos + 6]
        chunk = raw[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending += chunk
        if kind in (1, 4):
            yield pending
            pending = b""


def _wandb_records(run_dir: Path) -> tuple[list[dict], dict, str]:
    """History rows, config and project of an offline run, read back from its .wandb file."""
    from wandb.proto import wandb_internal_pb2

    rows, config, project = [], {}, ""
    for data in _log_records(next(run_dir.glob("run-*.wandb")).read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
        elif kind in ("run", "config"):
            items = record.run.config.update if kind == "run" else record.config.update
            config.update({item.key: json.loads(item.value_json) for item in items})
            project = record.run.project or project
    return rows, config, project


def test_wandb_offline_trace_and_export(ray_cluster, tiny_assets, tmp_path, monkeypatch,
                                        caplog):
    monkeypatch.setenv("WANDB_SILENT", "true")
    # wandb's own variables, with logger.mode and logger.project left unset (issue 13).
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "from-the-environment")
    out = tmp_path / "run"
    job = compose_job(["logger=wandb", "train.plan.max_steps=4",
                       "logger.trace_start=1", "logger.trace_steps=2", "train.eval.prompts=2",
                       "train.eval.max_new_tokens=8", "train.export_dtype=float32",
                       "train.eval.every=2",
                       "cluster.cpus_per_actor=0.5", f"train.out_dir={out}"])
    with caplog.at_level(logging.INFO, logger="pipeline.driver.job"):
        summary = Driver(job).run()
    # tau before training: drafter rank 0's weights through its snapshot ring (CPU shared
    # memory here; train.eval.weights_ring=null and one node)
    assert "tau at step 0: " in caplog.text and "weights through the ring" in caplog.text

    run_dir = next((out / "wandb").glob("offline-run-*"))
    rows, config, project = _wandb_records(run_dir)
    assert project == "from-the-environment"
    assert config["cluster"]["drafters_per_node"] == 2
    assert config["drafter"]["num_anchors"] == job.drafter.num_anchors
    train = [r for r in rows if "train/loss" in r]
    assert [r["trainer/step"] for r in train] == [1, 2, 3, 4]
    assert all(r["train/samples"] > 0 for r in train)
    for key in ("train/accuracy", "train/accuracy_pos01", "train/expected_tau",
                "perf/samples_per_s", "perf/tokens_per_s", "perf/target0_busy",
                "perf/drafter1_busy", "perf/slot_wait_s", "perf/ready_queue_depth",
                "perf/drafter0_max_mem_gb"):
        assert key in train[-1], key
    evals = [r for r in rows if "eval/tau" in r]
    assert [r["trainer/step"] for r in evals] == [0, 2, 4]  # before, periodic, after
    assert evals[0]["eval/tau"] == summary.tau_before and evals[-1]["eval/tau"] == summary.tau_after

    trace = json.loads((out / "trace.json").read_text())["traceEvents"]
    names = {e["name"] for e in trace}
    assert {"target forward", "slot wait", "drafter fwd+bwd", "optimizer step",
            "all-reduce"} <= names
    assert {e["args"]["step"] for e in trace} == {2, 3}

    exported = tmp_path / "exported"
    subprocess.run([sys.executable, "-m", "pipeline.export", "--checkpoint", str(out),
                    "--out", str(exported), "--dtype", "float32"], cwd=ROOT, check=True)
    a = load_file(str(exported / "model.safetensors"))
    b = load_file(str(out / "export" / "model.safetensors"))
    assert a.keys() == b.keys()
    for folder in (exported, out / "export"):  # both ways ship the AutoModel file
        assert (folder / "modeling_dflash.py").is_file()
    for name in a:
        torch.testing.assert_close(a[name], b[name])
