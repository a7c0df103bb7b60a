"""End to end through Ray's job server: a real `ray start --head` with token authentication,
then `launch/submit.sh` (that is, the `ray job submit` CLI) running `python -m pipeline.train`,
and `ray job stop` on such a job (SIGTERM to its driver: its last line says how to resubmit),
resubmitted to resume; a job larger than the cluster is refused in one line.

The head is private to this module: its own ports, its own --temp-dir (so in-process
`ray.init()` of other tests never finds it), and its environment is passed to subprocesses
only, never set in os.environ. Teardown kills exactly the head's processes (its process group
and their children), by pid: `ray stop --force` would kill every Ray process on the machine,
including other tests' and other users' clusters.
"""

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.checkpoint import folders as ckpt
from pipeline.driver.runlock import LOCK_NAME
from tests.driver.cli_run import exact_epochs, leftovers

ROOT = Path(__file__).resolve().parents[2]
SUBMIT = ROOT / "launch" / "submit.sh"
BIN = Path(sys.executable).parent  # the venv: `ray` here, and `python` for the job's entrypoint
# Settings of the caller's shell that must not steer the private head or the CLI towards
# another cluster or another token.
_CLEARED = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN",
            "RAY_AUTH_TOKEN_PATH")

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc to stop the head it started")]


@dataclass
class Head:
    dashboard: str  # the job server's address, http://127.0.0.1:PORT
    env: dict[str, str]  # what a client needs: PATH to the venv and the cluster's token


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group), from /proc."""
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)"
            except OSError:
                continue  # exited meanwhile
            table[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return table


def _kill_process_group(pgid: int) -> None:
    """SIGKILL every process of ``pgid`` and all their descendants (workers, job drivers)."""
    for _ in range(3):  # again, for anything spawned while a pass ran
        table = _processes()
        doomed = {pid for pid, (_, group) in table.items() if group == pgid}
        grew = True
        while grew:
            more = {pid for pid, (ppid, _) in table.items() if ppid in doomed} - doomed
            doomed |= more
            grew = bool(more)
        for pid in doomed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not doomed:
            return
        time.sleep(1)


@pytest.fixture(scope="module")
def ray_head():
    """A one-node Ray head started by the CLI, with token authentication on."""
    caller_env = {k: os.environ.get(k) for k in _CLEARED}
    gcs, dash, agent_http, agent_grpc, env_agent, metrics, client = _free_ports(7)
    temp_dir = tempfile.mkdtemp(prefix="dfl-ray-")  # short: Ray's socket paths must fit
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    # Ray 2.60 turns token authentication on for a head started while a token is at hand.
    env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    cmd = [str(BIN / "ray"), "start", "--head", f"--port={gcs}", f"--dashboard-port={dash}",
           "--num-cpus=4", "--include-dashboard=true", "--disable-usage-stats",
           f"--temp-dir={temp_dir}", f"--dashboard-agent-listen-port={agent_http}",
           f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={env_agent}",
           f"--metrics-export-port={metrics}", f"--ray-client-server-port={client}"]
    # Its own session: every process of the cluster inherits this process group.
    proc = subprocess.Popen(cmd, env=env, cwd=temp_dir, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, out[-3000:]
        assert "Token authentication is enabled" in out, out[-3000:]
        yield Head(f"http://127.0.0.1:{dash}", env)
    finally:
        proc.kill()
        _kill_process_group(proc.pid)
        shutil.rmtree(temp_dir, ignore_errors=True)
    # Nothing leaked into this process: other tests' ray.init() must start their own cluster.
    assert {k: os.environ.get(k) for k in _CLEARED} == caller_env


def _ray(head: Head, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    # Ray's job CLI sends the token only in token mode, which it is not in by default.
    env = dict(head.env, RAY_AUTH_MODE="token")
    return subprocess.run([str(BIN / "ray"), *args, "--address", head.dashboard],
                          env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _submit(head: Head, env: dict[str, str], *args: str,
            timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SUBMIT), "--address", head.dashboard, *args],
                          env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_submit_without_the_token_is_refused(ray_head):
    """A wrong token is rejected (403), and so is none at all (401), before anything runs."""
    wrong = dict(ray_head.env, RAY_AUTH_TOKEN=secrets.token_hex(32))
    proc = _submit(ray_head, wrong, "--no-wait", "--", "train.plan.max_steps=1")
    assert proc.returncode != 0
    assert "Invalid authentication token" in proc.stdout + proc.stderr, proc.stderr[-3000:]
    no_token = dict(ray_head.env, RAY_AUTH_MODE="disabled")
    no_token.pop("RAY_AUTH_TOKEN")
    proc = _submit(ray_head, no_token, "--no-wait", "--", "train.plan.max_steps=1")
    assert proc.returncode != 0
    assert "Missing authentication token" in proc.stdout + proc.stderr, proc.stderr[-3000:]


def test_submit_runs_training_on_the_cluster(ray_head, tiny_assets, tmp_path):
    """With RAY_AUTH_TOKEN alone in the environment (no RAY_AUTH_MODE), as a user would."""
    out = tmp_path / "run"
    proc = _submit(ray_head, ray_head.env, "--env", f"DFLASH_ASSETS_DIR={tiny_assets.root}",
                   "--", "train.plan.max_steps=3", "train.eval.prompts=1",
                   "train.eval.max_new_tokens=4", "cluster.drafters_per_node=2",
                   f"train.out_dir={out}", "cluster.address=auto")
    logs = proc.stdout + proc.stderr
    assert proc.returncode == 0, logs[-5000:]
    job_id = re.search(r"raysubmit_\w+", logs).group(0)
    status = _ray(ray_head, "job", "status", job_id)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", status.stdout)  # without the colours
    assert status.returncode == 0 and f"Job '{job_id}' succeeded" in plain, plain + status.stderr
    assert "done: 3 steps" in logs
    assert (out / "export" / "model.safetensors").exists()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3]


def test_a_job_the_cluster_can_never_hold_is_refused_in_one_line(ray_head, tiny_assets,
                                                                 tmp_path):
    """The head has 4 CPUs and the default job asks 5 actors at cluster.cpus_per_actor=1: refused
    before any actor starts, in one line naming what it asks, what the cluster has and the key
    (it used to wait 300 s for its placement group, then end in a traceback)."""
    proc = _submit(ray_head, ray_head.env, "--env", f"DFLASH_ASSETS_DIR={tiny_assets.root}",
                   "--", "cluster.cpus_per_actor=1", f"train.out_dir={tmp_path / 'run'}",
                   "cluster.address=auto")
    assert proc.returncode != 0, (proc.stdout + proc.stderr)[-3000:]
    job_id = _job_id(proc)
    status = _job_status(ray_head, job_id)
    assert "failed" in status and "exit code 2" in status, status
    # The job's own output (`ray job submit` prints it a second time in its failure status).
    logs = _ray(ray_head, "job", "logs", job_id).stdout
    lines = [line for line in logs.splitlines() if "can never be placed" in line]
    assert len(lines) == 1, logs[-3000:]
    assert "asks 5 CPUs in all" in lines[0] and "have 4 CPUs" in lines[0]
    assert "cluster.cpus_per_actor=0.8 or less" in lines[0]
    assert "Traceback" not in logs and "plan:" not in logs, logs[-3000:]


def _job_id(proc: subprocess.CompletedProcess) -> str:
    found = re.search(r"raysubmit_\w+", proc.stdout + proc.stderr)
    assert found, (proc.stdout + proc.stderr)[-3000:]
    return found.group(0)


def _job_status(head: Head, job_id: str) -> str:
    status = _ray(head, "job", "status", job_id)
    return re.sub(r"\x1b\[[0-9;]*m", "", status.stdout + status.stderr)  # without the colours


def _driver_pid(out: Path) -> int:
    """The job's `python -m pipeline.train` process (not the shell Ray starts it with)."""
    for entry in os.scandir("/proc"):
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except (OSError, ValueError):
            continue
        if argv[1:3] == ["-m", "pipeline.train"] and f"train.out_dir={out}" in argv:
            return int(entry.name)
    raise AssertionError(f"no driver process for {out}")


def _pending(pid: int, sig: int) -> bool:
    """Whether ``sig`` waits, undelivered, for the process ``pid`` (it is stopped)."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return bool(int(fields["ShdPnd"], 16) & (1 << (sig - 1)))


def test_ray_job_stop_ends_the_job_with_the_resume_line_and_a_rerun_resumes(
        ray_head, tiny_assets, small_train_file, tmp_path):
    """`ray job stop` (SIGTERM to the driver) after a checkpoint: the job's log ends with the
    one line naming it and the command that resumes, without Ray's C++ SIGTERM trace; nothing
    half-written and no lock stay behind; the same submission again resumes there and trains
    every sample of every epoch exactly once."""
    out = tmp_path / "run"
    # 1 drafter x 4 samples: 3 steps an epoch, 6 in all (one drafter: what is checked is the
    # stop, the resume line and the resubmission, not ranks; two cost 2 more actor starts).
    data = tmp_path / "twelve.jsonl"
    data.write_text("".join(small_train_file.read_text().splitlines(True)[:12]))
    args = ["--env", f"DFLASH_ASSETS_DIR={tiny_assets.root}", "--",
            "cluster.cpus_per_actor=0.5", "cluster.drafters_per_node=1", "train.eval.every=-1",
            "data.micro_batch_size=4",
            "train.plan.epochs=2", "train.checkpoint.every=1", "train.log_every=100",
            f"data.train_path={data}", f"train.out_dir={out}", "cluster.address=auto"]
    job_id = _job_id(_submit(ray_head, ray_head.env, "--no-wait", *args))
    deadline = time.monotonic() + 300
    while ckpt.latest(out) is None:
        assert time.monotonic() < deadline, _job_status(ray_head, job_id)[-3000:]
        time.sleep(0.05)
    # Held (SIGSTOP) from its first checkpoint until `ray job stop`'s SIGTERM is waiting for
    # it: however fast the machine, the job cannot finish first.
    driver = _driver_pid(out)
    os.kill(driver, signal.SIGSTOP)
    try:
        stop = subprocess.Popen([str(BIN / "ray"), "job", "stop", job_id, "--address",
                                 ray_head.dashboard], env=dict(ray_head.env, RAY_AUTH_MODE="token"),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 120
        while not _pending(driver, signal.SIGTERM):
            assert stop.poll() is None and time.monotonic() < deadline, stop.communicate()[0]
            time.sleep(0.05)
    finally:
        os.kill(driver, signal.SIGCONT)
    said = stop.communicate(timeout=180)[0]
    assert stop.returncode == 0, said
    assert f"Job '{job_id}' was stopped" in _job_status(ray_head, job_id)
    logs = _ray(ray_head, "job", "logs", job_id).stdout
    assert "SIGTERM received" not in logs and "logging.cc" not in logs, logs[-3000:]
    assert "Traceback" not in logs, logs[-3000:]
    lines = [line for line in logs.splitlines() if "resume with: " in line]
    newest = ckpt.latest(out)
    step = ckpt.read_point(newest).step
    assert len(lines) == 1 and "stopped by SIGTERM" in lines[0], logs[-3000:]
    assert f"the newest checkpoint is {newest} (step {step})" in lines[0]
    # Where the job ran: a resubmission of the same overrides, naming the stopped job.
    assert ("resume with: ray job submit --working-dir . --runtime-env launch/runtime_env.yaml "
            "-- python -m pipeline.train cluster.cpus_per_actor=0.5") in lines[0], lines[0]
    assert job_id in lines[0], lines[0]
    assert not (out / LOCK_NAME).exists() and leftovers(out) == [], logs[-3000:]

    # The same submission again (train.checkpoint.resume=auto is the default).
    rerun = _submit(ray_head, ray_head.env, *args, timeout=400)
    text = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, text[-5000:]
    assert f"resumed from {newest} at step {step}" in text, text[-5000:]
    assert f"done: {6 - step} steps" in text, text[-5000:]
    exact_epochs(text, last_epoch=1)
    assert ckpt.latest(out).name == "step_00000006" and leftovers(out) == []
