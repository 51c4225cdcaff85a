"""Training data for the head: the target's features and next-token distributions over a corpus.

The default corpus is the Python standard library of the running interpreter, read
at run time (text the benchmarks do not use); users pass their own files or
directories instead. Texts are cut into chunks of equal length and each chunk is
one teacher-forced prefill of the target, which records per token the fused
layers' hidden states and the target's top-k next-token probabilities (temperature
1). Every `heldout_every`-th chunk is held out for measuring acceptance.
Shards are written as they fill, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import random
import sysconfig
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from specwise.eagle.features import teacher_forced
from specwise.runners.protocols import ModelRunner

TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst", ".json", ".toml", ".cfg", ".js", ".ts", ".c", ".h", ".rs", ".go")
_SKIPPED_DIRS = {"site-packages", "dist-packages", "test", "tests", "__pycache__", "idle_test"}


def stdlib_files() -> list[Path]:
    """The .py files of this interpreter's standard library (installed packages and tests excluded)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if not _SKIPPED_DIRS.intersection(p.relative_to(root).parts))


def corpus_files(paths: Sequence[str | Path] | None) -> list[Path]:
    """Files to train on: the given files, directories expanded to their text files; none: the stdlib."""
    if not paths:
        return stdlib_files()
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES))
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"corpus path {path} does not exist")
    if not files:
        raise ValueError(f"no text files in {', '.join(map(str, paths))}")
    return files


def iter_chunks(tokenizer, files: Sequence[Path], length: int, seed: int = 0) -> Iterator[list[int]]:
    """Chunks of exactly `length` token ids, files in a seeded shuffled order (the same every run)."""
    order = list(files)
    random.Random(seed).shuffle(order)
    for path in order:
        text = path.read_text(encoding="utf-8", errors="replace")
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for start in range(0, len(ids) - length + 1, length):
            yield list(ids[start:start + length])


@dataclass
class FeatureData:
    """Recorded chunks. tokens [N, L] long; hidden [N, L, layers, H] (target dtype), row i the
    target's states after token i; top_ids [N, L, K] int32 and top_probs [N, L, K] float16, the
    target's next-token distribution after token i; index [N] long, each chunk's corpus order."""

    tokens: torch.Tensor
    hidden: torch.Tensor
    top_ids: torch.Tensor
    top_probs: torch.Tensor
    index: torch.Tensor

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def select(self, rows: torch.Tensor) -> "FeatureData":
        return FeatureData(self.tokens[rows], self.hidden[rows], self.top_ids[rows], self.top_probs[rows],
                           self.index[rows])

    def split(self, heldout_every: int) -> tuple["FeatureData", "FeatureData"]:
        """(training, held-out): every heldout_every-th chunk in corpus order is held out."""
        held = (self.index % heldout_every) == heldout_every - 1
        return self.select(~held), self.select(held)

    def save(self, path: Path) -> None:
        torch.save(self.__dict__, path)

    @staticmethod
    def load(path: Path) -> "FeatureData":
        return FeatureData(**torch.load(path, map_location="cpu", weights_only=True))

    @staticmethod
    def cat(parts: Sequence["FeatureData"]) -> "FeatureData":
        return FeatureData(*(torch.cat([getattr(p, name) for p in parts]) for name in
                             ("tokens", "hidden", "top_ids", "top_probs", "index")))


def record_chunks(runner: ModelRunner, chunks: Iterable[list[int]], layers: Sequence[int], top_k: int,
                  first_index: int = 0, deadline: float | None = None) -> FeatureData:
    """One teacher-forced prefill per chunk (all the same length); stops early at the monotonic
    `deadline` (a chunk takes seconds on a CPU, a shard minutes: the time budget is kept per chunk)."""
    parts = []
    for offset, ids in enumerate(chunks):
        if parts and deadline is not None and time.monotonic() >= deadline:
            break
        logits, hidden = teacher_forced(runner, ids, layers)  # [L, V], [L, layers, H]
        probs = logits.float().softmax(dim=-1)
        top = torch.topk(probs, min(top_k, probs.shape[-1]), dim=-1)
        parts.append(FeatureData(torch.tensor(ids)[None], hidden.clone()[None], top.indices.int()[None],
                                 top.values.half()[None], torch.tensor([first_index + offset])))
    if not parts:
        raise ValueError("no chunks to record: the corpus is shorter than one chunk")
    return FeatureData.cat(parts)


def record_corpus(runner: ModelRunner, chunks: Iterator[list[int]], layers: Sequence[int], top_k: int,
                  directory: Path, *, max_chunks: int, deadline: float | None = None, shard_chunks: int = 32,
                  progress: bool = True) -> FeatureData:
    """Record up to max_chunks chunks (or until the monotonic `deadline`) into shards under
    `directory`, resuming after the shards already there; returns everything recorded."""
    from tqdm.auto import tqdm

    directory.mkdir(parents=True, exist_ok=True)
    shards = sorted(directory.glob("shard-*.pt"))
    parts = [FeatureData.load(p) for p in shards]
    done = sum(len(p) for p in parts)
    for _ in range(done):  # the chunk order is deterministic: skip what the shards hold
        if next(chunks, None) is None:
            break
    with tqdm(total=max_chunks, initial=done, desc="recording target features", unit="chunk",
              disable=not progress) as bar:
        while done < max_chunks and (deadline is None or time.monotonic() < deadline):
            batch = []
            for ids in chunks:
                batch.append(ids)
                if len(batch) == min(shard_chunks, max_chunks - done):
                    break
            if not batch:
                break
            part = record_chunks(runner, batch, layers, top_k, first_index=done, deadline=deadline)
            part.save(directory / f"shard-{len(parts):05d}.pt")
            parts.append(part)
            done += len(part)
            bar.update(len(part))
    if not parts:
        raise ValueError("no training data: the corpus is shorter than one chunk, or the time ran out first")
    return FeatureData.cat(parts)


def draft_vocabulary(data: FeatureData, target_vocab: int, size: int) -> torch.Tensor:
    """The `size` target ids seen most often as tokens or as the target's top choice, sorted by id."""
    if size >= target_vocab:
        return torch.arange(target_vocab)
    counts = torch.bincount(data.tokens.flatten(), minlength=target_vocab)[:target_vocab]
    counts += torch.bincount(data.top_ids[..., 0].flatten().long(), minlength=target_vocab)[:target_vocab]
    order = torch.sort(counts, descending=True, stable=True).indices  # ties: lower id first
    return order[:size].sort().values
