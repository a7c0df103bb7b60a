"""bench/process_cpu.py: kinds of processes and the per-kind sums; the command's exit code."""

import sys

import pytest

from bench.process_cpu import by_kind, by_test, kind_of, main

WORKER = ("/venv/bin/python /venv/lib/python3.11/site-packages/ray/_private/workers/"
          "default_worker.py --node-ip-address=10.0.0.1 --raylet-name=/tmp/ray/raylet")


def test_kinds_follow_the_newest_command_line():
    assert kind_of(WORKER) == "Ray worker (not yet an actor)"
    assert kind_of("ray::DrafterWorker.forward_backward") == "ray::DrafterWorker"
    assert kind_of("ray::collected") == "ray:: (tasks, the tests' own actors)"
    # The pipeline's other actor classes by the names Ray gives their processes.
    assert kind_of("ray::TargetStageWorker.forward") == "ray::TargetStageWorker"
    assert kind_of("ray::GeneratorWorker.generate") == "ray::GeneratorWorker"
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


def test_processes_go_to_the_test_that_started_them_and_a_worker_s_cluster_apart():
    worker = "/venv/bin/python -c import sys;exec(eval(sys.stdin.readline()))"
    first, cli = "tests/a.py::test_one (setup)", "tests/b.py::test_two (call)"
    seen = {("100", "1"): [0.0, 9.0, worker, "1", ""],
            # The worker's own cluster, started during test_one: its actor, raylet and GCS.
            ("101", "2"): [0.0, 1.0, "/venv/ray/core/src/ray/raylet/raylet --x", "100", first],
            ("102", "3"): [0.0, 4.0, "ray::DrafterWorker.step", "101", first],
            ("103", "4"): [0.0, 0.5, "/venv/ray/core/src/ray/gcs/gcs_server --y", "100", first],
            # A CLI job test_two ran: the driver, its own cluster's raylet and an actor.
            ("200", "5"): [0.0, 3.0, "/venv/bin/python -m pipeline.train a=1", "100", cli],
            ("201", "6"): [0.0, 0.25, "/venv/ray/core/src/ray/raylet/raylet --z", "200", cli],
            ("202", "7"): [1.0, 3.0, "ray::TargetWorker", "201", cli],
            ("300", "8"): [0.0, 2.0, "/usr/bin/vim notes.md", "1", ""]}
    assert by_test(seen) == {"the Ray cluster of pytest worker 100": 5.5,
                             "tests/b.py": 5.25, "(no test) pytest-xdist worker": 9.0,
                             "(no test) other: vim": 2.0}


def test_by_test_names_this_test_s_file(capsys):
    # Every group is listed (other tests' processes may run beside this one and cost more).
    code = main(["--every", "0.05", "--by-test", "100000", "--", sys.executable, "-c",
                 "import time; time.sleep(1)"])
    out = capsys.readouterr().out
    assert code == 0 and "by test file:" in out
    assert "tests/bench/test_process_cpu.py" in out.split("by test file:")[1], out


def test_a_negative_by_test_is_refused(capsys):
    with pytest.raises(SystemExit) as ended:
        main(["--by-test", "-1", "--", sys.executable, "-c", "pass"])
    assert ended.value.code == 2 and "--by-test -1" in capsys.readouterr().err
