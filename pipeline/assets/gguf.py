"""A GGUF file as a target: converted once into a plain Hugging Face folder, then cached.

Every part of the pipeline reads the target from an HF folder (safetensors read by name for
the head, the layer slices and ``drafter.init``; ``from_pretrained`` in the actors, the
evaluator and regeneration), so a GGUF file (llama.cpp's format, e.g. a quantised
SmolLM2-135M-Instruct) is turned into one folder before anything else reads it. transformers
loads the file (``gguf_file=``) and dequantises it; its model then refuses ``save_pretrained``
(it is marked GGUF-quantised), so the weights are saved from a model built from the cleaned
config. Weights are stored in float32, which holds the dequantised values exactly; the
trainers load them in the dtype they ask for.

The folder is ``<cache>/<sha256 of the file>``, with ``<cache>`` ``$DFLASH_GGUF_CACHE`` or
``~/.cache/dflash-pipeline/gguf``. Keyed by content, a renamed or copied file reuses it and an
edited file is converted again. One process converts under a file lock while the others wait;
the conversion is written to a temporary sibling and renamed into place when complete, so a
half-written folder is never visible under its final name.

The file's header and tensor table are checked against its size before anything reads it
(pipeline/assets/integrity.py: a file cut short is one line naming it), and the cached folder
on each use (pipeline/assets/cache_entry.py: a damaged one is converted again).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile

from pipeline.assets import cache_entry
from pipeline.assets.cache_entry import file_lock, file_sha256
from pipeline.assets.integrity import check_gguf
from pipeline.checks.preflight import PreflightError

log = logging.getLogger(__name__)

ENV_VAR = "DFLASH_GGUF_CACHE"
SUFFIX = ".gguf"
MANIFEST = "gguf_source.json"  # written last: its presence marks a finished conversion
# Raised when the conversion changes: a folder an older converter wrote is converted again.
CONVERTER_VERSION = 3
# What transformers needs to read a GGUF file; `pip install -e .[gguf]` installs both.
NEEDS = ("gguf", "accelerate")
INSTALL_HINT = "pip install -e .[gguf]"


def is_gguf(value: str) -> bool:
    return value.lower().endswith(SUFFIX)


def cache_root() -> str:
    default = os.path.join("~", ".cache", "dflash-pipeline", "gguf")
    return os.path.abspath(os.path.expanduser(os.environ.get(ENV_VAR) or default))


def gguf_folder(path: str, root: str | None = None) -> str:
    """The HF folder converted from the GGUF file ``path``, converting it on first use."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
        raise PreflightError(f"{path}: no such GGUF file")
    check_gguf(path)
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        raise PreflightError(f"{path} is a GGUF file, and reading it needs the package(s) "
                             f"{missing}: install them with `{INSTALL_HINT}`")
    root = root or cache_root()
    folder = os.path.join(root, file_sha256(path))
    cache_entry.sweep_leftovers(folder, folder + ".lock")
    if _is_converted(folder) and not cache_entry.problem(folder):
        cache_entry.adopt(folder)
        return folder
    os.makedirs(root, exist_ok=True)
    with file_lock(folder + ".lock"):
        # Another process may have converted (or mended) it meanwhile.
        damage = cache_entry.problem(folder) if _is_converted(folder) else None
        if damage:
            log.warning("%s: the conversion of %s is damaged; converting it again", damage,
                        path)
            cache_entry.discard(folder)
        if not _is_converted(folder):
            log.info("converting GGUF %s into an HF folder %s (once per file content)",
                     path, folder)
            _convert_atomically(path, folder)
    return folder


def _is_converted(folder: str) -> bool:
    try:
        with open(os.path.join(folder, MANIFEST)) as f:
            return json.load(f).get("converter") == CONVERTER_VERSION
    except (OSError, ValueError):
        return False


def _convert_atomically(path: str, folder: str) -> None:
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}.converting-",
                           dir=os.path.dirname(folder))
    try:
        convert(path, tmp)
        cache_entry.write_listing(tmp)
        shutil.rmtree(folder, ignore_errors=True)  # a folder left without its manifest
        os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def convert(path: str, out_dir: str) -> dict:
    """Write the HF folder (config, float32 safetensors, tokenizer with its chat template,
    generation config with eos) of the GGUF file ``path`` into ``out_dir``."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.utils import logging as hf_logging

    folder, name = os.path.split(path)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    _set_special_tokens(tokenizer, path)
    # The conversion is announced in one line by the caller: no progress bars over it.
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                      dtype=torch.float32)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    config = _clean_config(loaded.config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    if config.tie_word_embeddings:
        model.tie_weights()
    model.generation_config = _generation_config(loaded.generation_config, tokenizer,
                                                 GenerationConfig)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    _no_space_cleanup(tokenizer, out_dir)
    if tokenizer.chat_template is None:
        log.warning("%s carries no chat template (tokenizer.chat_template metadata): chat "
                    "data cannot be rendered for this target", path)
    manifest = {"source": path, "sha256": file_sha256(path), "converter": CONVERTER_VERSION,
                "model_type": config.model_type,
                "parameters": sum(p.numel() for p in model.parameters()),
                "transformers": transformers.__version__,
                "gguf": importlib.metadata.version("gguf")}
    with open(os.path.join(out_dir, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=2)
    return manifest


def _set_special_tokens(tokenizer, path: str) -> None:
    """eos, bos and pad as the file names them. transformers 5.17 builds a Llama file's
    byte-level BPE with its BOS as eos (SmolLM2: <|im_start|> instead of <|im_end|>), which
    would end no generated turn and mask the wrong token; 5.24 reads them right."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    for attr, key in (("eos_token", "eos_token_id"), ("bos_token", "bos_token_id"),
                      ("pad_token", "padding_token_id")):
        field = reader.fields.get(f"tokenizer.ggml.{key}")
        if field is not None:
            token_id = int(field.parts[field.data[0]][0])
            setattr(tokenizer, attr, tokenizer.convert_ids_to_tokens(token_id))


def _no_space_cleanup(tokenizer, out_dir: str) -> None:
    """Write in the folder what transformers does anyway for a BPE tokenizer: no clean-up of
    spaces before punctuation (it would change the text). SmolLM2's file leaves it on, and
    transformers then warns on the first decode of every process that it ignores it: a line
    in every regeneration and training log that its user cannot act on. Written into the
    saved config, as a value equal to a version's default may be left out of it."""
    from tokenizers import models

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not isinstance(backend.model, models.BPE):
        return
    config_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(config_path) as f:
        saved = json.load(f)
    saved["clean_up_tokenization_spaces"] = False
    with open(config_path, "w") as f:
        json.dump(saved, f, indent=2, ensure_ascii=False)


def _clean_config(config):
    """The config without GGUF's quantisation record or the file's internal model name."""
    data = config.to_dict()
    for key in ("quantization_config", "_name_or_path", "transformers_version"):
        data.pop(key, None)
    return type(config).from_dict(data)


def _generation_config(loaded, tokenizer, cls):
    """The file's generation config, with the tokenizer's eos (the chat turn's end) as eos."""
    gen = cls.from_dict(loaded.to_dict())
    if tokenizer.eos_token_id is not None:
        gen.eos_token_id = tokenizer.eos_token_id
    if gen.pad_token_id is None:
        gen.pad_token_id = tokenizer.pad_token_id
    return gen

