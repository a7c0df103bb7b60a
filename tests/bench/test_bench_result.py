"""bench/scale/result.py: a bench's parts, run in separate GPU calls, add to one JSON file."""

import json

from bench.scale.result import failed_parts, open_result


def test_parts_merge_into_one_file_and_failures_are_named(tmp_path):
    out = tmp_path / "out"
    path, result = open_result(out, tmp_path / "work", "figures.json")
    assert not path.exists() and (tmp_path / "work").is_dir()
    assert {"machine", "date", "torch"} <= set(result)
    result.update(first={"samples_per_s": 1.0})
    path.write_text(json.dumps(result))
    _, again = open_result(out, tmp_path / "work", "figures.json")  # a later call, part two
    assert again["first"] == {"samples_per_s": 1.0}
    again.update(second={"error": "exit 1"}, third=3.0)
    assert failed_parts(again) == ["second"]
