"""Logits -> the probabilities plain sampling would use.

Drafter and verifier both go through `logits_to_probs`, so the target's
distribution at every position is exactly the one plain decoding samples from
(losslessness contract, point 1), and a drafter reports exactly the distribution
it sampled from (point 2).

Order and semantics follow Hugging Face `generate()`: repetition penalty, then
temperature, top-k (ties at the k-th value are kept), top-p (smallest set of
most likely tokens whose mass reaches top_p, at least one kept).
Temperature 0 gives a one-hot at the first argmax of the penalized logits.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specwise.config import SamplingParams
from specwise.noise import PositionNoise, race, race_order


def seen_token_mask(context: Sequence[int], block: Sequence[int], vocab_size: int) -> torch.Tensor:
    """Row j marks the tokens in context + block[:j]: what the repetition penalty sees there.

    Returns a bool tensor [len(block) + 1, vocab_size].
    """
    rows = len(block) + 1
    mask = torch.zeros(rows, vocab_size, dtype=torch.bool)
    if context:
        ids = torch.as_tensor(list(context), dtype=torch.long)
        mask[:, ids[ids < vocab_size]] = True
    for j, token in enumerate(block):
        if token < vocab_size:
            mask[j + 1:, token] = True
    return mask


def tree_seen_mask(context: Sequence[int], tokens: Sequence[int], parents: Sequence[int],
                   vocab_size: int) -> torch.Tensor:
    """Per tree path, what the repetition penalty sees: row 0 marks the context's tokens, row
    i + 1 also node i's and its ancestors' (siblings on other paths are not seen).

    parents[i] < i, -1 for a child of the root. Returns a bool tensor [len(tokens) + 1, vocab_size].
    """
    mask = seen_token_mask(context, [], vocab_size).expand(len(tokens) + 1, vocab_size).clone()
    for i, (token, parent) in enumerate(zip(tokens, parents)):
        mask[i + 1] = mask[parent + 1]
        if token < vocab_size:
            mask[i + 1, token] = True
    return mask


def process_logits(logits: torch.Tensor, params: SamplingParams,
                   seen: torch.Tensor | None = None) -> torch.Tensor:
    """Apply repetition penalty, temperature, top-k and top-p; masked entries become -inf.

    logits: [n, V]; seen: [n, V] bool (see seen_token_mask), needed only when
    repetition_penalty != 1. Returns float32 [n, V]. At temperature 0 only the
    repetition penalty is applied (the caller takes the argmax).
    """
    scores = logits.float()
    if params.repetition_penalty != 1.0:
        if seen is None:
            raise ValueError("repetition_penalty needs the seen-token mask of each row")
        seen = seen.to(scores.device, non_blocking=True)  # masks are built on the host
        penalized = torch.where(scores < 0, scores * params.repetition_penalty,
                                scores / params.repetition_penalty)
        scores = torch.where(seen, penalized, scores)
    if params.greedy:
        return scores
    scores = scores / params.temperature
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]  # [n, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= (1 - params.top_p)
        remove_sorted[..., -1] = False  # always keep the most likely token
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores


def first_argmax(rows: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """Each row's index of its largest value, the first one on ties, as torch.argmax(rows, -1, keepdim) gives it.

    On the CPU, for float32 rows, through NumPy: torch.argmax over a vocabulary row takes about
    190 µs on the CPU (at one or two threads, 570 µs for five rows), NumPy's 20-85 µs, about 1.5 %
    of a one-token pass of the default target on two cores. Elsewhere torch.argmax, on the rows' device."""
    if rows.device.type == "cpu" and rows.dtype == torch.float32 and not rows.requires_grad:
        return torch.as_tensor(rows.numpy().argmax(axis=-1, keepdims=keepdim))  # a 0-d tensor for one row
    return torch.argmax(rows, dim=-1, keepdim=keepdim)


def logits_to_probs(logits: torch.Tensor, params: SamplingParams,
                    seen: torch.Tensor | None = None) -> torch.Tensor:
    """The distribution plain sampling uses at each row: [n, V] float32, rows sum to 1.

    Greedy (temperature 0) gives a one-hot at the first argmax, so that greedy
    verification and sampling share this one path.
    """
    scores = process_logits(logits, params, seen)
    if params.greedy:
        probs = torch.zeros_like(scores)
        probs.scatter_(-1, first_argmax(scores, keepdim=True), 1.0)
        return probs
    return scores.softmax(dim=-1)


def sample(weights: torch.Tensor, generator: torch.Generator | None = None, position: int | None = None) -> int:
    """Draw one token from a [V] row of non-negative weights (a distribution, maybe unnormalized).

    With position-keyed noise (generator a PositionNoise and the token's position given), the
    exponential race over that position's noise (specwise.noise): the draw plain sampling makes
    there, whatever was drawn before. Otherwise inverts the CDF with the generator's next uniform:
    many times faster than torch.multinomial on a 150k vocabulary. A zero-weight token is never
    returned (searchsorted(right=True) lands only where the CDF rises).
    """
    if isinstance(generator, PositionNoise) and position is not None:
        return int(race(weights, generator.exponentials(position, weights.numel())))
    cdf = torch.cumsum(weights, dim=0)  # [V]
    u = float(torch.rand((), generator=generator, dtype=torch.float64)) * float(cdf[-1])
    index = int(torch.searchsorted(cdf, torch.tensor(u, dtype=cdf.dtype, device=cdf.device), right=True))
    if index >= weights.numel():  # u * total rounded up to total
        index = int(weights.nonzero()[-1])
    return index


def sample_without_replacement(probs: torch.Tensor, m: int, generator: torch.Generator | None = None,
                               position: int | None = None) -> torch.Tensor:
    """An ordered sample of up to m distinct tokens from a [V] distribution, without replacement.

    The j-th token follows probs with the first j - 1 removed and renormalized (the law
    tree verification needs of siblings). Exponential race, the Gumbel-top-m trick in
    another form: token i arrives at E_i / probs[i] with E_i ~ Exp(1), and the order of
    arrival is exactly that sequential law. Only tokens with positive probability are
    returned, so fewer than m when the support is smaller. Returns [min(m, support)] long.
    With position-keyed noise (generator a PositionNoise, position given) the race runs on that
    position's noise: its winner is then the token plain sampling draws there from `probs`.
    """
    if isinstance(generator, PositionNoise) and position is not None:
        return race_order(probs, generator.exponentials(position, probs.numel()), m)
    weights = probs.double()
    # Drawn on the host (the generator is a CPU one: the same seed gives the same tree on any device).
    exponentials = torch.empty(weights.shape, dtype=torch.float64).exponential_(generator=generator)
    arrival = torch.where(weights > 0, exponentials.to(weights.device) / weights, torch.inf)  # never 0 / 0 = nan
    support = int((weights > 0).sum())
    count = min(m, support)
    if count <= 0:
        return torch.empty(0, dtype=torch.long)
    return torch.topk(arrival, count, largest=False, sorted=True).indices.cpu()


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator: seeded for reproducible output, else from fresh entropy. On every device
    the uniforms are drawn from it on the host (a few per step), so a seed means the same draws
    wherever the models run."""
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def draft_token(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None,
                generator: torch.Generator | None, position: int | None = None) -> tuple[int, torch.Tensor | None]:
    """One draft token from a drafter's logits [V]: the processed argmax under greedy decoding
    (probs None: a point mass), else a sample together with exactly the distribution it was
    drawn from. seen [V] marks tokens for the repetition penalty (None: no penalty). position:
    the token's place in the sequence, for position-keyed noise (see `sample`)."""
    mask = None if seen is None else seen[None]
    if params.greedy:
        return int(process_logits(logits[None], params, mask).argmax(dim=-1)), None
    probs = logits_to_probs(logits[None], params, mask)[0]
    return sample(probs, generator, position), probs
