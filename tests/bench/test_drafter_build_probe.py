"""bench/drafter_build_probe.py at small widths on CPU: every figure measured, the checkpoint
really saved and read ahead (a read that gives nothing is an error, not a figure), and a
restart's constructor and load in each order of read-ahead and build."""

import json

import pytest

from bench.drafter_build_probe import main


def test_tiny_probe_times_every_part_and_reads_the_checkpoint_it_saved(tmp_path):
    out = tmp_path / "probe.json"
    result = main(["--tiny", "--device", "cpu", "--checkpoint", str(tmp_path / "ck"),
                   "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert result["beside_pinned"] is None  # pinned host memory needs CUDA
    assert set(result["setup_s"]) == {"grads_zeroed", "dynamo_import", "compile_wrapper",
                                      "adamw"}
    assert result["beside_pageable"]["build_s"] > 0 and result["beside_pageable"]["host_s"] > 0
    read = result["read_ahead"]
    assert set(read) == {"saved_s", "read_alone_s", "build_beside_read_s", "read_with_build_s",
                         "build_beside_read_0.5ms_s", "read_with_build_0.5ms_s"}
    assert all(v > 0 for v in read.values())
    assert (tmp_path / "ck" / "drafter").is_dir()  # the saved checkpoint, read three times
    # The 8B recipe's checkpoint shape at small widths: weights and two moments, fp32.
    assert 0 < result["checkpoint_gb"] < 0.1
    # A restart's constructor and load in each way, a fresh process each (dynamo imported anew).
    orders = result["restart_order"]
    assert set(orders) == {"before", "after", "before_pageable"}
    for parts in orders.values():
        assert set(parts) == {"device_ready_s", "build_s", "setup_s", "read_wait_s", "load_s",
                              "total_s"}
        assert parts["total_s"] >= parts["build_s"] + parts["setup_s"] + parts["load_s"] > 0


def test_pageable_alone_is_refused_not_ignored(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--tiny", "--device", "cpu", "--pageable"])
    assert info.value.code == 2 and "--pageable applies to --restart-order only" \
        in capsys.readouterr().err
