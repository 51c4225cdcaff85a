"""A draft model that proposes only frequent tokens: a smaller output layer (`draft_vocab=N`).

Why: the default 0.5B drafter's output layer maps 896 features to 151,936 tokens,
136M of its 494M weights, read in full for every draft token although almost all
drafts are common tokens. Keeping the N most frequent rows cuts the bytes read
per draft token (the cost that matters on a CPU) at a small loss of acceptance,
which `specwise bench` measures.

It stays lossless: the target still verifies every token, and the drafter reports
the distribution it really drew from, its softmax over the kept tokens (zero
elsewhere, summing to one over the kept set).

The kept set is: the first N tokens of a frequency-ordered token list, plus the
tokenizer's special tokens (end of turn, end of text), plus, per prompt, the
prompt's own tokens (answers copy names and words from their prompt). The list
for the default models ships in specwise/data/draft_vocab/, built by
scripts/build_draft_vocab.py from the Python standard library's source (text in
no benchmark split); a list records the tokenizer it belongs to.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "draft_vocab"


class TokenListError(ValueError):
    """No usable frequency-ordered token list for this tokenizer."""


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the tokenizer's token -> id map: a token list is only valid for it."""
    items = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()[:16]


def count_tokens(tokenizer, texts: Iterable[str]) -> Counter:
    counts: Counter = Counter()
    for text in texts:
        counts.update(tokenizer(text, add_special_tokens=False)["input_ids"])
    return counts


def write_token_list(path: Path, tokenizer, counts: Counter, source: str) -> None:
    """Token ids by falling frequency (ties: lower id first), one per line, after a header."""
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    header = {"tokenizer": tokenizer_fingerprint(tokenizer), "source": source, "tokens": len(ordered),
              "corpus_tokens": sum(counts.values())}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# " + json.dumps(header) + "\n" + "".join(f"{token}\n" for token, _ in ordered),
                    encoding="utf-8")


def read_token_list(path: Path) -> tuple[dict, list[int]]:
    """(header, token ids in frequency order) of a file written by write_token_list."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    if not lines or not lines[0].startswith("# "):
        raise TokenListError(f"{path} is not a token list: its first line must be the '# {{...}}' header "
                             "written by scripts/build_draft_vocab.py")
    try:
        header = json.loads(lines[0][2:])
        ids = [int(line) for line in lines[1:] if line.strip()]
    except ValueError as error:
        raise TokenListError(f"{path} is not a token list ({error})") from None
    return header, ids


def find_token_list(tokenizer, path: str | Path | None = None) -> list[int]:
    """The frequency-ordered ids for this tokenizer: from `path`, or the shipped list that matches it."""
    fingerprint = tokenizer_fingerprint(tokenizer)
    candidates = [Path(path)] if path is not None else sorted(SHIPPED_DIR.glob("*.txt"))
    for candidate in candidates:
        header, ids = read_token_list(candidate)
        if header.get("tokenizer") == fingerprint:
            return ids
        if path is not None:
            raise TokenListError(f"{candidate} was built for another tokenizer ({header.get('tokenizer')}, "
                                 f"this one is {fingerprint}); build one for this tokenizer with "
                                 "scripts/build_draft_vocab.py")
    raise TokenListError(f"no shipped token list matches this tokenizer ({fingerprint}); build one with "
                         "`python scripts/build_draft_vocab.py --model NAME --out FILE` and pass "
                         "vocab_file=FILE, or drop draft_vocab")


def kept_tokens(ordered: Sequence[int], size: int, always: Iterable[int], width: int) -> list[int]:
    """Sorted ids the drafter may propose: the first `size` of `ordered`, plus `always`, within [0, width)."""
    if size < 1:
        raise ValueError(f"draft_vocab must be >= 1 (0 keeps the whole vocabulary); got {size}")
    return sorted({t for t in list(ordered[:size]) + list(always) if 0 <= t < width})
