"""Saving and loading a trained head, bound to the target it was trained on.

A head only makes sense over the hidden states of one target, so the file records
that target's name and a fingerprint of its weights, and loading against a target
with another fingerprint is refused (the name alone may differ: a registry name
and a directory can hold the same weights).
"""

from __future__ import annotations

import hashlib
import os
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from specwise.eagle.head import EagleHead, HeadConfig
from specwise.paths import heads_dir

FORMAT = "specwise-eagle-head/1"
HEAD_FILE = "head.pt"
_SAMPLES_PER_TENSOR = 4096
_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class TargetMismatchError(ValueError):
    """A head was trained on another target than the one it is being loaded for."""


@dataclass(frozen=True)
class HeadInfo:
    """What a head file says about where it came from."""

    target_name: str
    target_fingerprint: str
    metadata: dict


def target_fingerprint(model: nn.Module) -> str:
    """A short hash of a model's weights: every tensor's name, shape and an evenly spaced sample
    of its values rounded to bfloat16 (so the same checkpoint in float32 or bfloat16 agrees)."""
    if model in _FINGERPRINTS:
        return _FINGERPRINTS[model]
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            if not tensor.is_floating_point():
                continue
            flat = tensor.detach().reshape(-1)
            step = max(1, flat.numel() // _SAMPLES_PER_TENSOR)
            sample = flat[::step].to("cpu", torch.bfloat16).view(torch.int16)
            digest.update(f"{name}:{tuple(tensor.shape)};".encode())
            digest.update(sample.numpy().tobytes())
    _FINGERPRINTS[model] = digest.hexdigest()[:16]
    return _FINGERPRINTS[model]


def default_head_dir(target_name: str) -> Path:
    """Where `specwise train-drafter` puts a target's head unless told otherwise, and where the
    eagle drafter looks when no head is named: $SPECWISE_HOME/heads/<target name>/."""
    return heads_dir() / Path(str(target_name)).name


def head_path(path: str | os.PathLike) -> Path:
    """A head file, or a training directory holding one as head.pt."""
    path = Path(path)
    return path / HEAD_FILE if path.is_dir() else path


def save_head(path: str | os.PathLike, head: EagleHead, target_name: str, fingerprint: str,
              metadata: dict | None = None) -> Path:
    """Write the head (float32 weights, config, draft vocabulary) and its target's identity."""
    path = head_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().float() if t.is_floating_point() else t.detach()
             for name, t in head.state_dict().items()}
    payload = {"format": FORMAT, "config": head.config.to_dict(), "state_dict": state,
               "target": {"name": target_name, "fingerprint": fingerprint}, "metadata": metadata or {}}
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)  # never leave a half-written head behind
    return path


def read_head(path: str | os.PathLike) -> tuple[EagleHead, HeadInfo]:
    """The head in a file (float32) and what it says about its target, without checking it."""
    path = head_path(path)
    if not path.exists():
        raise FileNotFoundError(f"no EAGLE head at {path}; train one with `specwise train-drafter`")
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not a specwise EAGLE head ({FORMAT})")
    config = HeadConfig(**payload["config"])
    head = EagleHead(config, payload["state_dict"]["draft_to_target"])
    head.load_state_dict(payload["state_dict"])
    target = payload["target"]
    return head.eval(), HeadInfo(target["name"], target["fingerprint"], payload.get("metadata", {}))


def load_head(path: str | os.PathLike, target_model: nn.Module, target_name: str = "the target") -> EagleHead:
    """Load a head for `target_model`, refusing one trained on another target."""
    head, info = read_head(path)
    found = target_fingerprint(target_model)
    if found != info.target_fingerprint:
        raise TargetMismatchError(
            f"EAGLE head {head_path(path)} was trained on target {info.target_name!r} "
            f"(weights {info.target_fingerprint}), not on {target_name!r} (weights {found}); "
            f"train a head for this target with `specwise train-drafter --target {target_name}`")
    vocab = target_model.get_output_embeddings().out_features
    if head.config.target_vocab_size != vocab:
        raise TargetMismatchError(f"EAGLE head {head_path(path)} maps to {head.config.target_vocab_size} target "
                                  f"tokens but {target_name!r} has {vocab}")
    return head
