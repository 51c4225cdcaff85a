"""Build the frequency-ordered token list behind `draft_vocab=N` (specwise.drafters.vocab).

    .venv/bin/python scripts/build_draft_vocab.py --model qwen2.5-coder-1.5b \
        --out specwise/data/draft_vocab/qwen2.5.txt [--corpus FILE_OR_DIR ...]

The default corpus is this interpreter's Python standard library (read here, never
copied into the repository): code and English prose that no benchmark split contains.
Only tokenizers are loaded, no model weights.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tqdm import tqdm

from specwise.drafters.vocab import count_tokens, write_token_list
from specwise.eagle.data import corpus_files
from specwise.store.loading import load_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b",
                        help="registry name, model directory or .gguf file")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--corpus", nargs="*", default=None, help="files or directories (default: the stdlib)")
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.model)
    files = corpus_files(args.corpus)
    texts = (f.read_text(encoding="utf-8", errors="replace") for f in tqdm(files, desc="tokenizing", unit="file"))
    counts = count_tokens(tokenizer, texts)
    source = "Python standard library source" if not args.corpus else ", ".join(args.corpus)
    write_token_list(args.out, tokenizer, counts, f"{source}, {len(files)} files")
    print(f"{args.out}: {len(counts)} distinct tokens of {sum(counts.values())} in {len(files)} files")


if __name__ == "__main__":
    main()
