"""HF checkpoints to CTranslate2 models: ``thinktrans convert``, and the cache the local backend
converts into on first load.

Serving a converted directory needs only ``ctranslate2`` and the tokenizer (transformers
without torch); converting needs torch and transformers, as CTranslate2's converter loads
the checkpoint with them. So a deployment converts once, ahead or on first load, and the
cache keeps the result across restarts, bounded in bytes (``local_ct2_cache_mb``).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from models.base import first_line
from models.local.checkpoint import detect_family, directory_fingerprint

log = logging.getLogger(__name__)

QUANTIZATIONS = (
    "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
    "float16", "bfloat16", "float32",
)
# Beside what CTranslate2 writes, what serving needs of the checkpoint without loading it:
# the family, the source, the quantization, its ``model_type`` and position limit (with its
# tokenizer files and ``generation_config.json``, copied).
META_FILE = "thinktrans-ct2.json"
# What the child process runs; its arguments follow on the command line.
_CHILD = "import sys; from models.local.convert import main; sys.exit(main(sys.argv[1:]))"
# The lock a conversion holds in its work directory, and how old an unlocked one must be to
# be debris (one made by another process that has not taken its lock yet is younger).
LOCK_FILE = ".lock"
UNLOCKED_DEBRIS_S = 60.0
# Files of a checkpoint that are weights (CTranslate2 writes its own) or clash with its files.
_NOT_COPIED = re.compile(r"(\.safetensors|\.bin|\.pt|\.h5|\.msgpack|\.ot|\.index\.json)$")


class ConversionError(Exception):
    """A checkpoint could not be converted; the message says why and what to do."""


def default_cache_dir() -> Path:
    """``$HF_HOME/thinktrans-ct2``: beside the HF cache, so a volume kept for one keeps both."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return Path(home) / "thinktrans-ct2"


def is_converted(path: str | Path) -> bool:
    """Whether ``path`` is a CTranslate2 model directory (``model.bin`` and CTranslate2's
    ``config.json``, which, unlike a checkpoint's, has no ``model_type``)."""
    directory = Path(path).expanduser()
    if not (directory / "model.bin").is_file() or not (directory / "config.json").is_file():
        return False
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "model_type" not in config


def read_meta(path: str | Path) -> dict[str, Any]:
    """``thinktrans-ct2.json`` of a converted directory; {} for one converted by other tools."""
    try:
        meta = json.loads((Path(path).expanduser() / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


@dataclass(frozen=True)
class _Source:
    """Where a checkpoint's files are and what identifies this version of them."""

    location: str  # what the converter loads: a directory, or the hub id
    fingerprint: str


def _source(model_id: str, offline: bool) -> _Source:
    """A directory is fingerprinted by its files' names, sizes and times; a hub id by the
    revision its cached ``config.json`` belongs to (fetched first when online)."""
    path = Path(model_id).expanduser()
    if path.is_dir():
        return _Source(str(path), directory_fingerprint(path))
    from transformers.utils import cached_file

    try:
        config = cached_file(model_id, "config.json", local_files_only=offline)
    except Exception as exc:  # OSError, HFValidationError, hub errors
        raise ConversionError(
            f"model {model_id!r} not found locally and the hub is unreachable or does not have "
            f"it ({first_line(exc)}): set THINKTRANS_LOCAL_MODEL to a local directory, pre-seed "
            "HF_HOME with it, or convert it elsewhere with `thinktrans convert`"
        ) from exc
    if config is None:
        raise ConversionError(f"model {model_id!r} has no config.json")
    snapshot = Path(config).parent
    # hub cache layout: models--org--name/snapshots/<revision>/config.json
    location = str(snapshot) if offline else model_id
    return _Source(location, hashlib.sha256(str(snapshot).encode()).hexdigest()[:16])


def cache_path(cache_dir: Path, model_id: str, quantization: str, fingerprint: str) -> Path:
    """``<cache>/<model id, path-safe>--<quantization>--<fingerprint>``: a changed checkpoint
    directory or a new hub revision has another fingerprint, so it is converted again."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", model_id.strip("/").replace("/", "--"))[-80:]
    return cache_dir / f"{name}--{quantization}--{fingerprint}"


def cached_conversion(
    model_id: str, *, quantization: str, cache_dir: Path, offline: bool,
    timeout_s: float = 3600.0, max_bytes: int | None = None, in_use: Collection[Path] = (),
) -> Path:
    """The converted directory for ``model_id`` at ``quantization``, converting it first (in a
    child process) when the cache lacks it; then the cache is pruned to ``max_bytes``, never
    removing ``in_use`` or the answer. ConversionError says what went wrong."""
    source = _source(model_id, offline)
    target = cache_path(cache_dir, model_id, quantization, source.fingerprint)
    if is_converted(target):
        log.info("local: using the converted model in %s", target)
    else:
        _convert_into(model_id, quantization, source, target, cache_dir, offline, timeout_s)
    _touch(target)
    if max_bytes is not None:
        prune_cache(cache_dir, max_bytes, keep={*in_use, target})
    return target


def _convert_into(model_id: str, quantization: str, source: _Source, target: Path,
                  cache_dir: Path, offline: bool, timeout_s: float) -> None:
    """Convert in a child process into a locked ``.converting-*`` directory, then rename it
    to ``target``. The child keeps the full-precision checkpoint out of the service's own
    memory; the rename means a crash never leaves a half-written model a later start would
    trust."""
    _check_can_convert()
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        sweep_debris(cache_dir)
        work = Path(tempfile.mkdtemp(prefix=".converting-", dir=cache_dir))
        lock = os.open(work / LOCK_FILE, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)  # held until this conversion is over, or killed
    except OSError as exc:
        raise ConversionError(
            f"cannot write the conversion cache {str(cache_dir)!r} ({exc.strerror or exc}): set "
            "THINKTRANS_LOCAL_CT2_CACHE to a writable directory, or convert the model ahead "
            "with `thinktrans convert` and point THINKTRANS_LOCAL_MODEL at the result"
        ) from exc
    log.info("local: converting %s to CTranslate2 (%s); this happens once", model_id,
             quantization)
    env = dict(os.environ)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    # ``main`` called, not ``-m models.local.convert``: the package imports this module
    # first, so runpy would warn and run a second copy of it.
    command = [sys.executable, "-c", _CHILD, "--quantization", quantization,
               "--model-id", model_id, source.location, str(work / "model")]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              env=env, cwd=_package_root(), check=False)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            raise ConversionError(lines[-1] if lines else
                                  f"converting {model_id!r} failed (exit {done.returncode})")
        try:
            os.replace(work / "model", target)
        except OSError:
            if not is_converted(target):  # not another process that won the race
                raise
    except subprocess.TimeoutExpired as exc:
        raise ConversionError(f"converting {model_id!r} took over {timeout_s:g} s") from exc
    except OSError as exc:
        raise ConversionError(
            f"cannot write the converted model to {str(target)!r}: {exc.strerror or exc}"
        ) from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
        os.close(lock)


def _touch(path: Path) -> None:
    """Mark a converted model used now: the cache drops the least recently used first."""
    try:
        os.utime(path)
    except OSError:  # a read-only cache: nothing is pruned there either
        pass


def _size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def prune_cache(cache_dir: Path, max_bytes: int, keep: Collection[Path] = ()) -> list[Path]:
    """Remove converted models from ``cache_dir``, the least recently used first, until what
    is left takes at most ``max_bytes``; never one in ``keep``. What was removed."""
    kept = {Path(os.path.realpath(path)) for path in keep}
    try:
        entries = [entry for entry in cache_dir.iterdir()
                   if not entry.name.startswith(".") and not entry.is_symlink()
                   and is_converted(entry)]
    except OSError:
        return []
    sized = sorted((entry.stat().st_mtime, _size(entry), entry) for entry in entries)
    total = sum(size for _, size, _ in sized)
    removed = []
    for _, size, entry in sized:
        if total <= max_bytes:
            break
        if Path(os.path.realpath(entry)) in kept:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        total -= size
        removed.append(entry)
        log.info("local: removed %s from the conversion cache, the least recently used "
                 "(%d MB, THINKTRANS_LOCAL_CT2_CACHE_MB=%d)", entry.name, size >> 20,
                 max_bytes >> 20)
    if total > max_bytes:
        log.warning("local: the conversion cache %s holds %d MB, over "
                    "THINKTRANS_LOCAL_CT2_CACHE_MB=%d, all of it in use", cache_dir,
                    total >> 20, max_bytes >> 20)
    return removed


def sweep_debris(cache_dir: Path) -> list[Path]:
    """Remove the ``.converting-*`` directories a killed conversion left: those whose lock
    no process holds (or, without a lock, older than UNLOCKED_DEBRIS_S). What was removed."""
    removed: list[Path] = []
    try:
        work_dirs = [entry for entry in cache_dir.glob(".converting-*")
                     if entry.is_dir() and not entry.is_symlink()]
    except OSError:
        return removed
    for entry in work_dirs:
        try:
            lock = os.open(entry / LOCK_FILE, os.O_RDWR)
        except FileNotFoundError:
            try:
                young = time.time() - entry.stat().st_mtime < UNLOCKED_DEBRIS_S
            except OSError:
                continue
            if not young:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held: a conversion running now
        else:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
        finally:
            os.close(lock)
    if removed:
        log.info("local: removed %d unfinished conversion(s) from %s", len(removed), cache_dir)
    return removed


def _package_root() -> str:
    """The directory ``models`` is imported from, for the child's import of this module."""
    return str(Path(__file__).resolve().parents[2])


def _check_can_convert() -> None:
    for module in ("ctranslate2", "torch", "transformers"):
        if find_spec(module) is None:
            raise ConversionError(
                f"converting a checkpoint to CTranslate2 needs {module!r}: pip install "
                "'thinktrans[local,ct2]', or convert the model elsewhere with `thinktrans "
                "convert` and point THINKTRANS_LOCAL_MODEL at the result"
            )


def convert(src: str, out: str | Path, *, quantization: str = "int8", model_id: str | None = None,
            force: bool = False) -> Path:
    """Convert the checkpoint at ``src`` (a directory or hub id) into ``out``: what
    CTranslate2 writes, the tokenizer files, ``generation_config.json`` and ``META_FILE``.
    ConversionError says what went wrong."""
    if quantization not in QUANTIZATIONS:
        raise ConversionError(
            f"unknown quantization {quantization!r}; choose one of {', '.join(QUANTIZATIONS)}"
        )
    _check_can_convert()
    from ctranslate2.converters import TransformersConverter
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    output = Path(out).expanduser()
    if output.exists() and any(output.iterdir()) and not force:
        raise ConversionError(f"{str(output)!r} exists and is not empty; pass --force to "
                              "overwrite it")
    looks_local = src.startswith(("/", "./", "../", "~")) or Path(src).expanduser().exists()
    if looks_local and not Path(src).expanduser().is_dir():
        raise ConversionError(f"{src!r} is not a directory: name a checkpoint directory "
                              "(written by save_pretrained) or a hub id")
    try:
        config = AutoConfig.from_pretrained(src)
        tokenizer = AutoTokenizer.from_pretrained(src)
    except Exception as exc:
        raise ConversionError(f"cannot load {src!r} as a checkpoint: {first_line(exc)}") from exc
    family = detect_family(config, tokenizer)
    if family is None:
        raise ConversionError(
            f"{src!r} is a {config.model_type!r} checkpoint; the local backend converts NLLB-200, "
            "M2M-100 and Marian checkpoints"
        )
    try:
        TransformersConverter(src, low_cpu_mem_usage=True).convert(
            str(output), quantization=quantization, force=True,
        )
    except Exception as exc:  # the converter raises ValueError, OSError, RuntimeError...
        raise ConversionError(f"converting {src!r} failed: {first_line(exc)}") from exc
    tokenizer.save_pretrained(output)
    _drop_weights(output)
    try:
        GenerationConfig.from_pretrained(src).save_pretrained(output)
    except OSError:
        pass  # a checkpoint without generation_config.json: the defaults apply
    meta = {
        "source": model_id or src,
        "family": family,
        "quantization": quantization,
        "model_type": config.model_type,
        "max_position_embeddings": getattr(config, "max_position_embeddings", None),
        "d_model": getattr(config, "d_model", None),
        "thinktrans_test_checkpoint": bool(getattr(config, "thinktrans_test_checkpoint", False)),
        "ctranslate2": _version("ctranslate2"),
    }
    (output / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    make_readable(output)
    return output


def _drop_weights(output: Path) -> None:
    """save_pretrained of a tokenizer writes nothing heavy, but be sure no stray weights or a
    second config sit beside CTranslate2's model."""
    for entry in output.iterdir():
        if entry.is_file() and entry.name != "model.bin" and _NOT_COPIED.search(entry.name):
            entry.unlink()


def make_readable(out: Path, created: Sequence[Path] = ()) -> None:
    """Files 0644 and directories 0755 at least, under ``out`` and in ``created``:
    save_pretrained writes the weights 0600, which a container's user (uid 10001) cannot
    read from a mounted directory."""
    for directory in (*created, out):
        directory.chmod(directory.stat().st_mode | 0o755)
    for root, dirs, files in os.walk(out):
        for name in dirs:
            path = Path(root, name)
            path.chmod(path.stat().st_mode | 0o755)
        for name in files:
            path = Path(root, name)
            mode = path.lstat().st_mode
            if stat.S_ISREG(mode):
                path.chmod(mode | 0o644)


def _version(module: str) -> str | None:
    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m models.local.convert SRC OUT --quantization int8``: what the backend runs
    in a child process. The last line of stderr is the reason on failure."""
    parser = argparse.ArgumentParser(prog="python -m models.local.convert")
    parser.add_argument("src")
    parser.add_argument("out")
    parser.add_argument("--quantization", default="int8", choices=QUANTIZATIONS)
    parser.add_argument("--model-id", default=None, help="the name recorded as the source")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        convert(args.src, args.out, quantization=args.quantization, model_id=args.model_id,
                force=args.force)
    except ConversionError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
