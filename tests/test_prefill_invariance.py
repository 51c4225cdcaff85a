"""A prompt's cache entries do not depend on how it is read (docs/DESIGN.md, "Numerics"), in the gguf format.

Bitwise, on every kernel path this CPU runs, for prompts of 300+ tokens:
- read in one pass, in chunks of 8, 32, 128 or 200 rows, or after a prefix whose entries were copied
  from another runner's cache (a cached prefix, of any length), a prompt writes the same entries, and
  the same greedy tokens follow;
- the entries written while generating (scoring passes, rolled back after rejections) are those a
  one-pass reading of the prompt and output gives: what a later turn of a conversation reuses;
- the batcher reading a prompt in `prefill_chunk` pieces beside other requests gives each request
  exactly its output alone: 8 concurrent requests of 300+ tokens, with chunks of 8 to 200 rows.
One real-model test (marked real_models): the default model, prompts whose last chunk is short.
"""

from __future__ import annotations

import os

import pytest
import torch

from helpers import assert_same_entries, entries, long_prompt, run_together
from specwise import SamplingParams, SpecConfig, SpecDecoder
from specwise.runners.lean import LeanRunner
from specwise.testing import tiny_gguf_loaded

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

CHUNKS = (8, 32, 128, 200)
GREEDY = SamplingParams(max_new_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_gguf_loaded(tmp_path_factory.mktemp("target"), seed=0)


def read(runner: LeanRunner, ids: list[int], chunk: int) -> None:
    for start in range(0, len(ids), chunk):
        runner.forward(ids[start:start + chunk], logits=False)


def copy_prefix(source: LeanRunner, into: LeanRunner, length: int) -> None:
    """Give `into` the first `length` entries of `source`'s cache, through the runner's pass interface
    (what a prefix cache does), instead of computing them."""
    into.reset()
    layout = into.layout([0] * length)
    into.reserve(length)
    keys, values = into.cache
    theirs = source.cache
    keys[:, :, :length] = theirs[0][:, :, :length]
    values[:, :, :length] = theirs[1][:, :, :length]
    into.append(layout)


def greedy_after(runner: LeanRunner, last: int, steps: int) -> list[int]:
    tokens = []
    for _ in range(steps):
        last = int(runner.forward([last])[-1].argmax())
        tokens.append(last)
    return tokens


def test_a_prompt_writes_the_same_entries_in_any_chunks_or_after_a_cached_prefix(target, kernel_path):
    prompt = long_prompt(330)
    whole = LeanRunner(target.model)
    whole.forward(prompt, logits=False)
    want = entries(whole)
    follow = greedy_after(whole, 3, 6)
    readers = {}
    for chunk in CHUNKS:
        readers[f"chunks of {chunk}"] = runner = LeanRunner(target.model)
        read(runner, prompt, chunk)
    source = LeanRunner(target.model)
    read(source, prompt, 64)
    for cached in (1, 17, 100, 257, 329):
        readers[f"after {cached} cached"] = runner = LeanRunner(target.model)
        copy_prefix(source, runner, cached)
        read(runner, prompt[cached:], 50)
    for name, runner in readers.items():
        assert_same_entries(entries(runner), want)
        assert greedy_after(runner, 3, 6) == follow, name


def test_entries_written_while_generating_are_a_one_pass_reading_of_prompt_and_output(target, kernel_path):
    """What a conversation's next turn reuses: after speculative generation (drafts scored and rolled
    back), the cache holds bitwise what reading the prompt and output in one pass writes."""
    decoder = SpecDecoder(target, SpecConfig(drafter="ngram", k=4))
    prompt = long_prompt(300, seed=1) + [5, 9, 14, 5, 9, 14]
    result = decoder.generate(prompt, SamplingParams(max_new_tokens=30, ignore_eos=True))
    generated = decoder.runner
    assert generated.length == len(prompt) + len(result.token_ids) - 1
    reread = LeanRunner(target.model)
    reread.forward(prompt + result.token_ids[:-1], logits=False)
    assert_same_entries(entries(generated), entries(reread))


def test_eight_concurrent_long_prompts_each_get_their_output_alone(target, kernel_path):
    """8 requests of 300+ tokens read beside each other in chunks of 8 to 200 rows (more than 16 too):
    each one's greedy tokens are exactly those of the one-at-a-time decoder, which reads its prompt in
    one pass."""
    alone = SpecDecoder(target, SpecConfig(drafter="ngram", k=3))
    prompts = [long_prompt(300 + 7 * i, seed=10 + i) for i in range(8)]
    want = [alone.generate(prompt, GREEDY).token_ids for prompt in prompts]
    for chunk in (200,) if kernel_path == "scalar" else (8, 200):
        batched = SpecDecoder(target, SpecConfig(drafter="ngram", k=3), max_batch=8, prefill_chunk=chunk)
        got = run_together(batched, [(prompt, GREEDY, None) for prompt in prompts])
        assert got == want, chunk
        assert max(b.stats.most_members for b in batched.batchers()) > 1  # they did run together


@pytest.mark.real_models
def test_the_default_model_batched_equals_alone_for_prompts_with_a_short_last_chunk():
    """The default model in the gguf format, served as the server serves it (prefill_chunk 128): prompts
    of 130-145 tokens, whose last chunk is 2-17 rows, give the one-at-a-time decoder's greedy tokens."""
    from specwise.store.catalog import DEFAULT_TARGET
    from specwise.errors import ModelError
    from specwise.store.prepare import resolve_model

    try:
        resolve_model(DEFAULT_TARGET)
    except ModelError as error:
        pytest.skip(str(error))
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        alone = SpecDecoder(DEFAULT_TARGET, SpecConfig(drafter="ngram", k=3, target_format="gguf"))
        batched = SpecDecoder(alone.target, SpecConfig(drafter="ngram", k=3), max_batch=4)
        vocab = alone.runner.vocab_size
        prompts = [[(97 * i + 13 * j) % (vocab - 300) + 100 for i in range(130 + 5 * j)] for j in range(4)]
        sampling = SamplingParams(max_new_tokens=16, ignore_eos=True)
        want = [alone.generate(prompt, sampling).token_ids for prompt in prompts]
        assert run_together(batched, [(prompt, sampling, None) for prompt in prompts]) == want
    finally:
        torch.set_num_threads(1)
