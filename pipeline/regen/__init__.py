"""Regenerate a chat file's assistant turns with the target's own greedy (T=0) answers.

DFlash drafters learn to propose what the target would say, so their training answers must be
the target's own. ``python -m pipeline.regenerate`` is the entry point; this package holds its
pieces: the typed messages (:mod:`.messages`), batched greedy decoding (:mod:`.greedy`), the
options (:mod:`.config`), the resumable output file (:mod:`.output`), the generator actor
(:mod:`.generator`) and the Ray driver (:mod:`.runner`).
"""
