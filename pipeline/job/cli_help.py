"""Short ``--help`` pages for the entry points: what the command does, its main config groups or
options, and examples, in at most 40 lines.

The full lists stay one flag away: for the Hydra entry points (pipeline.train,
pipeline.train_single) ``--cfg job`` prints every key with its value and ``--hydra-help`` is
Hydra's own help; pipeline.regenerate's ``--help-all`` is argparse's page of every option.
Hydra's own ``--help`` printed the whole composed config (125 lines) and no example.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Callable, Sequence

from pipeline.job.config import CONF_DIR

# (key=VALUE, what it does): the keys a first run changes, for the Hydra entry points.
_JOB_KEYS = [
    ("target.path=PATH", "HF model folder, a .gguf file, or builtin:tiny (the demo)"),
    ("data.train_path=FILE", "chat JSONL (messages or ShareGPT) to train on"),
    ("train.out_dir=DIR", "checkpoints, metrics.jsonl and export/ of the run"),
    ("train.plan.max_steps=N", "stop after N optimizer steps (null: all train.plan.epochs)"),
    ("train.checkpoint.every=N", "save every N steps; a rerun resumes from the newest"),
    ("train.eval.every=N", "tau on held-out prompts every N steps (-1: never)"),
    ("logger=wandb", "metrics to wandb too (WANDB_MODE=offline logs locally)"),
]
_CLUSTER_KEYS = [
    ("cluster.address=ADDR", "a running Ray cluster (null: start a local one)"),
    ("cluster.drafters_per_node=N", "drafter actors per node (and targets_per_node targets)"),
    ("cluster.cpus_per_actor=X", "Ray CPUs per actor (cluster.gpus_per_actor: GPUs)"),
]
_MORE_HYDRA = ["--cfg job: every key with its resolved value (no run); docs/CONFIG.md: each key",
               "--hydra-help: Hydra's own help (--multirun, --config-dir, tab completion)"]

TRAIN_EXAMPLES = [
    "python -m pipeline.train                         # the embedded demo, CPU",
    "python -m pipeline.train train.plan.max_steps=50 cluster.drafters_per_node=1",
    "python -m pipeline.train --config-name qwen3_8b target.path=/models/Qwen3-8B",
    "python -m pipeline.train --config-name qwen3_8b cluster=one_gpu target.path=...",
    "python -m pipeline.train logger=wandb train.checkpoint.every=100",
    "python -m pipeline.train --cfg job               # the resolved config, no run",
    "launch/submit.sh --address http://HEAD:8265 -- --config-name qwen3_8b  # ray job",
]
TRAIN_SINGLE_EXAMPLES = [
    "python -m pipeline.train_single                  # the embedded demo, CPU",
    "python -m pipeline.train_single train.plan.max_steps=20 train.out_dir=runs/ref",
    "python -m pipeline.train_single data.train_path=chats.jsonl train.plan.epochs=2",
    "python -m pipeline.train_single drafter.num_layers=1 train.optim.lr=3e-3",
    "python -m pipeline.train_single --cfg job        # the resolved config, no run",
]
REGENERATE_MAIN = ["--input", "--output", "--restart", "--target", "--num-workers", "--device",
                   "--engine", "--max-new-tokens", "--enable-thinking", "--on-bad-line",
                   "--ray-address"]
REGENERATE_EXAMPLES = [
    "python -m pipeline.regenerate --input chats.jsonl --output regen.jsonl",
    "python -m pipeline.regenerate --input chats.jsonl --output regen.jsonl --engine generate",
    "python -m pipeline.regenerate --input sharegpt.jsonl --output regen.jsonl \\",
    "    --target /models/Qwen3-8B --num-workers 8 --device cuda --max-new-tokens 2048",
    "python -m pipeline.regenerate ... --on-bad-line skip    # leave malformed lines out",
    "python -m pipeline.regenerate ... --no-enable-thinking  # train: data.enable_thinking=false",
    "ray job submit --address http://HEAD:8265 --working-dir . \\",
    "    --runtime-env launch/runtime_env.yaml -- python -m pipeline.regenerate ...",
]
EXPORT_EXAMPLES = [
    "python -m pipeline.export --checkpoint runs/demo --out drafter/          # the newest",
    "python -m pipeline.export --checkpoint runs/demo/checkpoints/step_00000150 --out d/",
    "python -m pipeline.export --checkpoint runs/demo --out d/ --dtype float32",
    "python -m pipeline.export --checkpoint /shared/run --out /models/drafter --dtype float16",
    "python -m pipeline.export --checkpoint runs/qwen3_8b --out drafter-qwen3-8b  # vllm serve",
]


def help_asked(argv: Sequence[str]) -> bool:
    """Whether a Hydra entry point's command asks for its help page (``--hydra-help`` is
    Hydra's)."""
    return any(a in ("-h", "--help") for a in argv)


def hydra_page(entry: str, doc: str, examples: Sequence[str], cluster: bool = True) -> str:
    """The help page of a Hydra entry point: ``doc``'s first line, the config groups and the
    presets under conf/, the main keys and ``examples``."""
    lines = [f"usage: python -m {entry} [--config-name NAME] [GROUP=OPTION] [KEY=VALUE ...]", "",
             doc.strip().splitlines()[0], "",
             "Presets (--config-name NAME): " + ", ".join(_stems(CONF_DIR)),
             "Config groups (GROUP=OPTION, e.g. cluster=one_gpu):"]
    lines += [f"  {d.name:<9} {', '.join(_stems(d))}" for d in sorted(CONF_DIR.iterdir())
              if d.is_dir() and _stems(d)]
    lines += ["", "Main keys (KEY=VALUE; every key: --cfg job):"]
    keys = _JOB_KEYS + (_CLUSTER_KEYS if cluster else [])
    lines += [f"  {k:<29} {what}" for k, what in keys]
    lines += ["", "Examples:"] + [f"  {e}" for e in examples]
    lines += ["", "More:"] + [f"  {m}" for m in _MORE_HYDRA]
    return "\n".join(lines)


def _stems(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.yaml"))


def add_short_help(parser: argparse.ArgumentParser, main: Sequence[str],
                   examples: Sequence[str]) -> None:
    """``-h/--help`` on ``parser`` (built with ``add_help=False``) prints a page of the
    ``main`` options and ``examples``; ``--help-all`` prints argparse's page of every one."""
    def page(p: argparse.ArgumentParser) -> str:
        return argparse_page(p, main, examples)
    parser.add_argument("-h", "--help", action=_PrintPage, page=page,
                        help="the main options and examples; --help-all: every option")
    parser.add_argument("--help-all", action="help", help="every option, with its default")


class _PrintPage(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str,
                 page: Callable[[argparse.ArgumentParser], str], help: str) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                         nargs=0, help=help)
        self.page = page

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        print(self.page(parser))
        parser.exit()


def argparse_page(parser: argparse.ArgumentParser, main: Sequence[str],
                  examples: Sequence[str]) -> str:
    """The ``main`` options of ``parser`` with the first clause of their help, then the
    examples; the other options are counted, and named by --help-all."""
    by_name = {o: a for a in parser._actions for o in a.option_strings}
    shown = [by_name[name] for name in main if name in by_name]
    rest = [a for a in parser._actions if a.option_strings and a not in shown
            and a.dest != argparse.SUPPRESS]
    lines = [f"usage: {parser.prog} {' '.join(_usage(a) for a in shown if a.required)} "
             f"[OPTIONS]", "", (parser.description or "").strip().splitlines()[0], "",
             "Main options:"]
    lines += [f"  {_usage(a):<29} {_first_clause(a)}" for a in shown]
    lines += [f"  ... and {len(rest)} more (--help-all lists every option with its default)",
              "", "Examples:"] + [f"  {e}" for e in examples]
    return "\n".join(lines)


def _usage(action: argparse.Action) -> str:
    name = next(o for o in action.option_strings if o.startswith("--"))
    if action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction):
        return name
    if action.choices:
        return f"{name} {{{','.join(map(str, action.choices))}}}"
    value = {int: "N", float: "X"}.get(action.type, action.dest.upper())  # type: ignore
    return f"{name} {value if len(value) <= 11 else 'VALUE'}"


def _first_clause(action: argparse.Action) -> str:
    text = re.split(r"; |\. | \(", " ".join((action.help or "").split()))[0]
    if isinstance(action, argparse.BooleanOptionalAction):
        text += f" (--no-{action.option_strings[0][2:]} to turn off)"
    return text
