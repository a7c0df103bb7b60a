"""`pipeline.regenerate` on prompts-only input, on nothing usable, and killed mid-run (cb engine).

Prompts-only lines (a user turn, a system and a user turn, ShareGPT's human turn) are the
usual input: each gets the target's greedy answer appended. A run that writes nothing names no
file and does not end rc 0. A run killed with SIGKILL, or stopped with SIGTERM (one line,
exit 143), resumes to the very bytes of an uninterrupted run, losing and duplicating no line.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import ray
import torch

from pipeline.regen.config import RegenConfig
from pipeline.regen.runner import run
from pipeline.regenerate import main
from tests.regen.test_regen_cb import MAX_NEW, one_by_one

PROMPTS = [[{"role": "user", "content": "How do I open a file?"}],
           [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is a tuple?"}],
           [{"role": "user", "content": "Explain list comprehensions."}]]


@pytest.fixture(scope="module")
def qwen3_target():
    from pipeline.assets.family_targets import ensure_family_target
    return ensure_family_target("qwen3")


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    lines = [json.dumps({"messages": PROMPTS[0]}), json.dumps({"messages": PROMPTS[1]}),
             json.dumps({"conversations": [{"from": "human", "value": PROMPTS[2][0]["content"]}]})]
    path.write_text("\n".join(lines) + "\n")
    return path


def _records(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _reference(target, conversations):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.regen.greedy import stop_token_ids

    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with torch.no_grad():
        return [one_by_one(model, tokenizer, c, stop_token_ids(model, tokenizer))
                for c in conversations]


def test_prompts_only_lines_get_their_answer(ray_cluster, qwen3_target, prompts_file, tmp_path,
                                            capsys):
    out = tmp_path / "out.jsonl"
    code = main(["--input", str(prompts_file), "--output", str(out), "--target", qwen3_target,
                 "--num-workers", "1", "--max-new-tokens", str(MAX_NEW)])
    assert code == 0
    records = _records(out)
    assert [r["source_line"] for r in records] == [0, 1, 2]
    assert [r["messages"] for r in records] == _reference(qwen3_target, PROMPTS)
    assert all(r["messages"][-1]["role"] == "assistant" for r in records)
    assert f"regenerated=3 skipped_bad=0 turns=3" in capsys.readouterr().out


@pytest.mark.parametrize("text, why", [("not json\n{\"messages\": 3}\n", "all 2 line(s)"),
                                       ("\n", "holds no conversation")])
def test_a_run_that_writes_nothing_says_so_and_fails(qwen3_target, tmp_path, capsys, text, why):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(text)
    code = main(["--input", str(src), "--output", str(out), "--target", qwen3_target,
                 "--on-bad-line", "skip"])
    printed = capsys.readouterr()
    assert code == 1 and not out.exists()
    assert "nothing written" in printed.err and why in printed.err
    assert str(out) not in printed.out + printed.err


@pytest.fixture(scope="module")
def forty_prompts(ray_cluster, qwen3_target, tmp_path_factory):
    """Forty prompts, the regeneration's options, and the bytes of an uninterrupted run."""
    folder = tmp_path_factory.mktemp("forty")
    src = folder / "in.jsonl"
    src.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Item {i}: "
                                                     f"what is {i} squared?"}]}) + "\n"
                           for i in range(40)))
    kw = dict(input=str(src), target=qwen3_target, num_workers=1, batch_size=1,
              max_new_tokens=MAX_NEW, in_flight_per_worker=1)
    run(RegenConfig(output=str(folder / "full.jsonl"), **kw))
    return kw, (folder / "full.jsonl").read_bytes()


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_run_resumes_losing_and_duplicating_no_line(forty_prompts, tmp_path, stop):
    """SIGKILL leaves whole records behind; SIGTERM (``ray job stop``, a preemption) ends the
    run as Ctrl-C does: exit 143, one line that says how to go on, no Ray trace."""
    kw, full = forty_prompts
    killed = tmp_path / "killed.jsonl"
    address = ray.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "pipeline.regenerate", "--input", kw["input"], "--output",
           str(killed), "--target", kw["target"], "--num-workers", "1", "--batch-size", "1",
           "--max-new-tokens", str(MAX_NEW), "--in-flight-per-worker", "1",
           "--ray-address", address]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": os.getcwd()},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while (not killed.exists() or killed.read_bytes().count(b"\n") < 2) \
                and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        proc.send_signal(stop)
        err = proc.communicate(timeout=120)[1]
    written = killed.read_bytes().count(b"\n")
    assert 2 <= written < 40, f"the {stop.name} came at {written} of 40 lines"
    if stop == signal.SIGTERM:
        assert proc.returncode == 143, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert last == (f"regenerate: stopped by SIGTERM; the answers written so far stay in "
                        f"{killed}; the same command goes on from them"), err[-3000:]
        assert "Traceback" not in err and "SIGTERM received" not in err, err[-3000:]
    summary = run(RegenConfig(output=str(killed), **kw))
    assert summary.resumed + summary.regenerated == 40
    assert killed.read_bytes() == full
