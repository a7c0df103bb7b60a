"""drafter.parallel=fsdp's dispatch policy and refusals. Its training against the
single-process reference, its evaluation and its resumes are in test_checkpoint_dcp.py."""

import pytest

from pipeline.driver.compose import compose_job
from pipeline.driver.drafter_group import FSDP_POLICY, POLICY, Dispatch, policy_for


def test_fsdp_policy_sends_gathers_to_every_rank():
    assert policy_for("replicate") is POLICY and policy_for("fsdp") is FSDP_POLICY
    for method in ("weights", "export"):
        assert POLICY[method] is Dispatch.OWNER and FSDP_POLICY[method] is Dispatch.EVERY_RANK
    # A DCP save is entered by every rank in both modes.
    for method in ("save_checkpoint", "wait_saves"):
        assert POLICY[method] is FSDP_POLICY[method] is Dispatch.EVERY_RANK


def test_fsdp_refuses_compiled_drafters():
    with pytest.raises(ValueError, match="drafter.compile.*drafter.parallel=fsdp"):
        compose_job(["drafter.parallel=fsdp", "drafter.compile=reduce-overhead"])
    with pytest.raises(ValueError, match="drafter.parallel"):
        compose_job(["drafter.parallel=zero3"])
