"""NVIDIA ModelOpt's DFlash trainer as its docs drive it, for bench/peers.py (run in the peers'
environment: bench/peers_steps/env.py).

    python -m bench.peers_steps.modelopt_train --spec SPEC.json

Its documented path (examples/speculative_decoding of its repository, doc/dflash.md): load the
recipe YAML (here the ``dflash.yaml`` its wheel ships, with dotlist overrides), load the target
with its ``load_vlm_or_llm``, ``modelopt.torch.speculative.convert(model, [("dflash", cfg)])``,
then ``transformers.Trainer`` with the recipe's training section as TrainingArguments; the draft
is exported by its own ``DFlashExporter`` (z-lab's format). What is the bench's own: the data
(the pipeline's tokenization and loss masks of the same answers, padded to training_seq_len as
its collator pads; labels -100 outside the mask, which its DFlash forward reads as the loss
mask), a callback that exports at the minutes the bench asks for and stops at the last, and
one JSON line a step (``PEERSTEP``) for the bench's throughput figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from bench.peers_steps.samples import SampleSet, encoded_samples

# TrainingArguments fields of the recipe that are ModelOpt's own extensions, not HF's.
_SPEC_ONLY = ("training_seq_len", "estimate_ar", "ar_validate_steps", "answer_only_loss",
              "cp_size", "dp_shard_size")


def recipe_path() -> Path:
    import modelopt_recipes

    return Path(modelopt_recipes.__file__).parent / "general/speculative_decoding/dflash.yaml"


class PaddedCollator:
    """Pads every sample to ``seq_len`` (its LanguageDataCollator's padding="max_length"), and
    counts the real tokens it passed."""

    def __init__(self, seq_len: int, pad_id: int):
        self.seq_len, self.pad_id = seq_len, pad_id
        self.samples = self.tokens = 0

    def __call__(self, rows: list[dict]) -> dict:
        n = len(rows)
        ids = torch.full((n, self.seq_len), self.pad_id, dtype=torch.long)
        attn = torch.zeros((n, self.seq_len), dtype=torch.long)
        labels = torch.full((n, self.seq_len), -100, dtype=torch.long)
        for i, r in enumerate(rows):
            k = len(r["input_ids"])
            ids[i, :k] = torch.tensor(r["input_ids"])
            attn[i, :k] = 1
            mask = torch.tensor(r["loss_mask"], dtype=torch.bool)
            labels[i, :k] = torch.where(mask, ids[i, :k], -100)
        self.samples += n
        self.tokens += int(attn.sum())
        return {"input_ids": ids, "attention_mask": attn, "labels": labels}


def make_callback(model, collator: PaddedCollator, marks: list[float], out: Path):
    """Export at each mark (seconds of training after the first step; export time not
    counted), stop at the last, and print one PEERSTEP line per step."""
    from transformers import TrainerCallback

    class Marks(TrainerCallback):
        def __init__(self):
            self.first = None
            self.paused = 0.0
            self.todo = list(enumerate(marks))

        def on_step_end(self, args, state, control, **kw):
            now = time.time()
            self.first = self.first or now
            print("PEERSTEP " + json.dumps({"step": state.global_step, "time": now,
                                            "samples": collator.samples,
                                            "tokens": collator.tokens}), flush=True)
            trained = now - self.first - self.paused
            while self.todo and trained >= self.todo[0][1]:
                k, mark = self.todo.pop(0)
                t0 = time.time()
                folder = out / f"mark{k}"
                model.get_exporter().export(folder, dtype=torch.bfloat16)
                self.paused += time.time() - t0
                print("PEEREXPORT " + json.dumps({"mark": k, "step": state.global_step,
                                                  "trained_s": trained, "time": now,
                                                  "dir": str(folder)}), flush=True)
            if not self.todo:
                control.should_training_stop = True
            return control

        def on_train_end(self, args, state, control, **kw):
            for k, _ in self.todo:  # max_steps came first: the last weights stand for the rest
                folder = out / f"mark{k}"
                model.get_exporter().export(folder, dtype=torch.bfloat16)
                now = time.time()
                print("PEEREXPORT " + json.dumps({
                    "mark": k, "step": state.global_step, "time": now,
                    "trained_s": now - (self.first or now) - self.paused, "dir": str(folder)}),
                    flush=True)
            self.todo = []

    return Marks()


def training_args(recipe, spec: dict):
    import transformers

    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    given = {k: v for k, v in recipe.training.model_dump().items()
             if k in fields and k not in _SPEC_ONLY}
    cuda = torch.cuda.is_available()
    given.update(output_dir=spec["out"], report_to="none", save_strategy="no", do_eval=False,
                 bf16=bool(given.get("bf16")) and cuda, tf32=bool(given.get("tf32")) and cuda,
                 use_cpu=not cuda, logging_steps=max(1, int(given.get("logging_steps") or 1)),
                 dataloader_num_workers=0, max_steps=spec.get("max_steps") or -1,
                 ddp_find_unused_parameters=None)
    return transformers.TrainingArguments(**given)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", required=True, help="JSON: target, train, out, overrides, marks")
    spec = json.loads(Path(p.parse_args(argv).spec).read_text())

    import transformers

    import modelopt.torch.opt as mto
    import modelopt.torch.speculative as mtsp
    from modelopt.recipe import load_recipe
    from modelopt.torch.speculative.utils import load_vlm_or_llm

    torch.manual_seed(0)
    mto.enable_huggingface_checkpointing()
    recipe = load_recipe(str(recipe_path()), overrides=[
        f"model.model_name_or_path={spec['target']}", f"training.output_dir={spec['out']}",
        *spec["overrides"]])
    print("PEERRECIPE " + json.dumps({"dflash": recipe.dflash.model_dump(mode="json"),
                                      "training": recipe.training.model_dump(mode="json")},
                                     default=str), flush=True)
    model = load_vlm_or_llm(spec["target"], dtype="auto", device_map="cpu")
    tokenizer = transformers.AutoTokenizer.from_pretrained(spec["target"])
    mtsp.convert(model, [("dflash", recipe.dflash.model_dump())])
    seq_len = recipe.training.training_seq_len
    rows = encoded_samples(tokenizer, spec["train"], seq_len, SampleSet(**spec["sample_set"]))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    collator = PaddedCollator(seq_len, pad)
    trainer = transformers.Trainer(
        model=model, args=training_args(recipe, spec), train_dataset=rows,
        data_collator=collator,
        callbacks=[make_callback(model, collator, spec["marks"], Path(spec["out"]))])
    trainer.train()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
