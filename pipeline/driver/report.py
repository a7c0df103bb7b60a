"""Turning a StepReport into logged metrics: loss, accuracy, throughput, busy fractions."""

from __future__ import annotations

from collections import defaultdict

from pipeline.driver.scheduler import StepReport
from pipeline.training.metrics import StepTotals, metrics_dict


def step_metrics(report: StepReport, num_targets: int) -> dict[str, float]:
    totals = StepTotals()
    for m in report.micro:
        totals.merge(StepTotals(m.numerator, m.denominator, list(m.correct), list(m.total),
                                len(m.sample_ids), m.tokens))
    wall = max(report.wall_s, 1e-9)
    drafter_busy: dict[int, float] = defaultdict(float)
    for m in report.micro:
        drafter_busy[m.drafter] += m.busy_s
    for res in report.results:
        drafter_busy[res.drafter] += res.busy_s
    out = metrics_dict(totals)
    out.update({
        "train/lr": report.results[0].lr, "train/grad_norm": report.results[0].grad_norm,
        # Bucketed and packed steps hold different numbers of samples.
        "train/samples": totals.samples,
        "perf/samples_per_s": totals.samples / wall, "perf/tokens_per_s": totals.tokens / wall,
        "perf/step_time_s": wall, "perf/slot_wait_s": report.slot_wait_s,
        "perf/ready_queue_depth": report.ready_depth,
        "perf/allreduce_s": max(r.reduce_s for r in report.results),
    })
    for t in range(num_targets):
        out[f"perf/target{t}_busy"] = report.produce_busy_s.get(t, 0.0) / wall
    for res in report.results:
        out[f"perf/drafter{res.drafter}_busy"] = drafter_busy[res.drafter] / wall
        out[f"perf/drafter{res.drafter}_max_mem_gb"] = res.max_memory_bytes / 2**30
    return out
