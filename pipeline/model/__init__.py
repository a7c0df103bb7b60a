"""The DFlash drafter, its config and checkpoint format, and the frozen target's pieces."""
