"""Shared pieces for the engine tests: reference decoding, drafters that misbehave on purpose, the
statistical check that sampled output has the target's distribution, requests run together from
threads, and a lean runner's cache entries compared bitwise."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from scipy.stats import chisquare

from specwise.config import SamplingParams
from specwise.drafters.base import DraftProposal
from specwise.sampling import logits_to_probs
from specwise.verify.result import VerifyResult

if TYPE_CHECKING:
    from specwise import SpecConfig, SpecDecoder
    from specwise.runners.lean import LeanRunner


def hf_greedy(model, prompt_ids: Sequence[int], max_new_tokens: int, repetition_penalty: float = 1.0,
              eos: bool = True) -> list[int]:
    """The target's own greedy decoding, through Hugging Face generate()."""
    out = model.generate(torch.tensor([list(prompt_ids)]), max_new_tokens=max_new_tokens, do_sample=False,
                         repetition_penalty=repetition_penalty, eos_token_id=0 if eos else None,
                         pad_token_id=0, attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long))
    return out[0, len(prompt_ids):].tolist()


# The statistical check: LENGTH-token continuations of PROMPT sampled SAMPLES times with SAMPLING, compared
# with the target's exact distribution by Pearson's chi-square test; it fails when p < ALPHA.
PROMPT = [5, 9, 14, 5, 9]
LENGTH = 3
SAMPLES = 1500
SAMPLING = SamplingParams(temperature=1.0, top_k=4, top_p=0.9, max_new_tokens=LENGTH)
ALPHA = 1e-3


def exact_distribution(model) -> dict[tuple[int, ...], float]:
    """P(continuation) of every LENGTH-token continuation of PROMPT with nonzero probability, by
    enumerating every prefix with full (cache-free) forward passes."""
    dist: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(LENGTH):
        grown = {}
        for prefix, p in dist.items():
            with torch.no_grad():
                logits = model(torch.tensor([PROMPT + list(prefix)])).logits[0, -1:]
            probs = logits_to_probs(logits.double(), SAMPLING)[0]
            for token in torch.nonzero(probs).flatten().tolist():
                grown[prefix + (token,)] = p * float(probs[token])
        dist = grown
    return dist


def p_value(counts: dict[tuple[int, ...], int], exact: dict[tuple[int, ...], float]) -> float:
    """Chi-square p-value of the observed counts against the exact distribution, cells of expected
    count < 5 pooled; 0 when a continuation of probability zero was drawn."""
    if any(seq not in exact for seq in counts):
        return 0.0
    total = sum(counts.values())
    observed, expected = [], []
    pooled_obs = pooled_exp = 0.0
    for seq in sorted(exact, key=exact.get, reverse=True):
        e = exact[seq] * total
        if e >= 5:
            observed.append(counts.get(seq, 0))
            expected.append(e)
        else:
            pooled_obs += counts.get(seq, 0)
            pooled_exp += e
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    scale = sum(observed) / sum(expected)
    return float(chisquare(observed, [e * scale for e in expected]).pvalue)


class CorruptingDrafter:
    """Wraps a drafter and replaces the token at block position j, so acceptance stops there."""

    name = "corrupt"

    def __init__(self, inner, position: int, vocab_size: int) -> None:
        self.inner, self.position, self.vocab_size = inner, position, vocab_size

    def start(self, prompt_ids, sampling: SamplingParams, generator) -> None:
        self.inner.start(prompt_ids, sampling, generator)

    def propose(self, context, k: int) -> DraftProposal:
        proposal = self.inner.propose(context, k)
        tokens = proposal.tokens.clone()
        if len(tokens) > self.position:
            tokens[self.position] = (tokens[self.position] + 1) % self.vocab_size
        return DraftProposal(tokens, None)

    def observe(self, result: VerifyResult) -> None:
        self.inner.observe(result)


class RandomDrafter:
    """Proposes uniformly random tokens (point masses): almost never accepted."""

    name = "random"

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(seed)

    def start(self, prompt_ids, sampling, generator) -> None:
        pass

    def propose(self, context, k: int) -> DraftProposal:
        return DraftProposal(torch.randint(0, self.vocab_size, (k,), generator=self.generator), None)

    def observe(self, result) -> None:
        pass


# --------------------------------------------------------------------------- GGUF files


def _byte_alphabet() -> list[str]:
    """The printable stand-in for each byte that byte-level BPE vocabularies use."""
    printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)}
    letters, shifted = [], 0
    for byte in range(256):
        if byte in printable:
            letters.append(chr(byte))
        else:
            letters.append(chr(256 + shifted))
            shifted += 1
    return letters


def write_tiny_gguf(path: Path, *, layers: int = 1, hidden: int = 32, heads: int = 4, kv_heads: int = 2,
                    ffn: int = 64, seed: int = 0) -> Path:
    """A llama-architecture GGUF with Q8_0 matrices, a byte-level BPE vocabulary and a chat template."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens = _byte_alphabet() + ["\u0120t", "he", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * (len(tokens) - 3) + [3, 3, 3]
    head_dim = hidden // heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny test llama")
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(["\u0120 t", "h e"])
    writer.add_bos_token_id(len(tokens) - 2)
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_pad_token_id(len(tokens) - 3)
    writer.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    )

    def add(name: str, shape: tuple[int, ...]) -> None:
        data = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        if len(shape) == 1:
            writer.add_tensor(name, data)
        else:
            q8 = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(data, q8), raw_dtype=q8)

    add("token_embd.weight", (len(tokens), hidden))  # no output.weight: tied embeddings
    add("output_norm.weight", (hidden,))
    for i in range(layers):
        add(f"blk.{i}.attn_norm.weight", (hidden,))
        add(f"blk.{i}.attn_q.weight", (hidden, hidden))
        add(f"blk.{i}.attn_k.weight", (kv_heads * head_dim, hidden))
        add(f"blk.{i}.attn_v.weight", (kv_heads * head_dim, hidden))
        add(f"blk.{i}.attn_output.weight", (hidden, hidden))
        add(f"blk.{i}.ffn_norm.weight", (hidden,))
        add(f"blk.{i}.ffn_gate.weight", (ffn, hidden))
        add(f"blk.{i}.ffn_up.weight", (ffn, hidden))
        add(f"blk.{i}.ffn_down.weight", (hidden, ffn))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def run_together(decoder: SpecDecoder, jobs: list[tuple[list[int], SamplingParams, SpecConfig | None]]) -> list:
    """Each job's token ids, all started at once from threads of their own."""
    out: list = [None] * len(jobs)
    errors: list = []

    def run(i: int) -> None:
        prompt, sampling, spec = jobs[i]
        try:
            out[i] = decoder.generate(prompt, sampling, spec=spec).token_ids
        except BaseException as error:  # reported below, not lost in a thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    return out


def long_prompt(length: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, 79, (length,), generator=generator).tolist()


def entries(runner: LeanRunner) -> tuple[torch.Tensor, torch.Tensor]:
    keys, values = runner.cache
    return keys[:, :, :runner.length].clone(), values[:, :, :runner.length].clone()


def assert_same_entries(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> None:
    assert got[0].shape == want[0].shape
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# Prompts of the tiny models' greedy-identity tests: arbitrary, repetitive, and one token.
GREEDY_PROMPTS = [[5, 9, 14, 20, 33], [40, 41, 42, 40, 41, 42, 40, 41], [7]]
SMALL_TREE = dict(tree_nodes=10, tree_depth=4, tree_branching=3)


def run_engine(target, drafter, prompt: Sequence[int], max_new: int = 40, eos: Sequence[int] = (0,),
               sampling: SamplingParams | None = None, **spec):
    """One generation of `target` (a transformers model, in the Hugging Face runner) with `drafter`;
    spec: SpecConfig's fields but the drafter's name, which is the drafter's own (k fixed unless
    `adaptive` is given: a chain drafts k tokens every step)."""
    from specwise import SpecConfig, SpeculativeEngine
    from specwise.runners.hf import HFRunner

    spec = {"adaptive": False, **spec}
    engine = SpeculativeEngine(HFRunner(target), drafter, SpecConfig(drafter=drafter.name, **spec), eos_token_ids=eos)
    return engine.generate(prompt, sampling or SamplingParams(max_new_tokens=max_new))
