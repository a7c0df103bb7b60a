"""Pieces shared by the single-process reference trainer and the Ray drafter workers."""
