"""The driver side: the job, its actor group, the step loop, and what it logs and saves.

Everything here sits above the workers, the reference trainer and regeneration; nothing below
imports it (tests/test_layering.py checks that).
"""
