"""bench/process_cpu.py: kinds of processes and the per-kind sums; the command's exit code."""

import sys

from bench.process_cpu import by_kind, kind_of, main

WORKER = ("/venv/bin/python /venv/lib/python3.11/site-packages/ray/_private/workers/"
          "default_worker.py --node-ip-address=10.0.0.1 --raylet-name=/tmp/ray/raylet")


def test_kinds_follow_the_newest_command_line():
    assert kind_of(WORKER) == "Ray worker (not yet an actor)"
    assert kind_of("ray::DrafterWorker.forward_backward") == "ray::DrafterWorker"
    assert kind_of("ray::collected") == "ray:: (tasks)"
    assert kind_of("/venv/lib/ray/core/src/ray/raylet/raylet --raylet_socket_name=x") == "raylet"
    assert kind_of("/venv/bin/python -m pipeline.train_single x=1") == "-m pipeline.train_single"
    assert kind_of("/venv/bin/python -m pipeline.train x=1") == "-m pipeline.train"
    assert kind_of("/usr/bin/vim notes.md") == "other: vim"
    assert kind_of("") == "other: (no command line)"


def test_each_kind_sums_the_cpu_used_while_sampled():
    seen = {("10", "5"): [1.0, 4.0, "ray::TargetWorker"],
            ("11", "6"): [0.0, 2.5, "ray::TargetWorker.produce"],
            ("12", "7"): [0.0, 0.5, WORKER]}
    cpu, count = by_kind(seen)
    assert cpu["ray::TargetWorker"] == 5.5 and count["ray::TargetWorker"] == 2
    assert cpu["Ray worker (not yet an actor)"] == 0.5


def test_the_command_s_exit_code_is_returned(capsys):
    assert main(["--", sys.executable, "-c", "raise SystemExit(3)"]) == 3
    assert "CPU-s in all" in capsys.readouterr().out
