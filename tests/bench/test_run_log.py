"""bench/run_log.py: the rows of a JSONL file a run is still appending to."""

import json

from bench.run_log import jsonl_rows


def test_a_row_half_written_is_left_out_and_whole_rows_are_kept(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert jsonl_rows(path) == []  # not yet written
    rows = [{"step": 1, "time": 1.5}, {"step": 2, "time": 2.5}]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(text + '{"step": 3, "ti')  # the writer is inside its third row
    assert jsonl_rows(path) == rows
    path.write_text(text + "\n")  # blank lines are no rows
    assert jsonl_rows(path) == rows
    path.write_text('{"step": 1')
    assert jsonl_rows(path) == []
