"""Run every method on the same prompts, interleaved, and turn each generation into a record.

Order: one warm-up generation per method, then prompt by prompt (question, turn)
every method in turn, the order rotated by one at each prompt so that no method
always runs first (or right after a particular other one). A question's later
turn is asked after each method's own earlier answer, as Spec-Bench does.
Under greedy decoding every method's tokens are compared with the reference
method's for the same prompt (see `specwise.numerics`).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from tqdm import tqdm

from specwise.api import SpecDecoder
from specwise.bench.machine import CONTENDED, CpuProbe
from specwise.bench.methods import HF_GENERATE
from specwise.numerics import DEFAULT_TIE_ULPS, FAILURE, check_identity
from specwise.bench.prompts import Question, conversation
from specwise.bench.types import Method, MethodOutput
from specwise.config import SamplingParams
from specwise.drafters.scope import sharing_scope


@dataclass
class BenchSettings:
    sampling: SamplingParams
    chat: bool = True
    warmup_tokens: int = 16  # max_new_tokens of the warm-up generation (0: no warm-up)
    reference: str = HF_GENERATE  # greedy outputs are checked against this method's
    tie_ulps: float = DEFAULT_TIE_ULPS
    progress: bool = True
    retakes: int = 1  # a generation timed while other processes took the CPU is run again, up to this often
    warmup_prompt_tokens: int = 64  # the warm-up reads only the end of the first prompt (see warm_up)


def rotated(methods: Sequence[Method], index: int) -> list[Method]:
    shift = index % len(methods) if methods else 0
    return list(methods[shift:]) + list(methods[:shift])


def prompt_seed(sampling: SamplingParams, question_index: int, turn: int) -> SamplingParams:
    """Every method gets the same seed for a prompt, and each prompt its own."""
    if sampling.seed is None:
        return sampling
    return dataclasses.replace(sampling, seed=(sampling.seed + 1000 * question_index + turn) % 2**63)


def _stats_fields(output: MethodOutput) -> dict:
    stats = output.stats
    if stats is None:  # Hugging Face: only the target's forward passes are known
        return dict(steps=output.steps, tau=None, alpha=None, proposed=None, accepted=None,
                    proposed_at=None, accepted_at=None, draft_seconds=None, score_seconds=None,
                    verify_seconds=None, other_seconds=None, prefill_seconds=None)
    accounted = stats.draft_seconds + stats.score_seconds + stats.verify_seconds
    return dict(steps=stats.steps, tau=stats.acceptance_length, alpha=stats.acceptance_rate,
                proposed=stats.proposed, accepted=stats.accepted,
                proposed_at=list(stats.proposed_at), accepted_at=list(stats.accepted_at),
                draft_seconds=stats.draft_seconds, score_seconds=stats.score_seconds,
                verify_seconds=stats.verify_seconds, other_seconds=max(0.0, output.seconds - accounted),
                prefill_seconds=stats.prefill_seconds)


def make_record(question: Question, turn: int, method: Method, order: int, prompt_ids: Sequence[int],
                output: MethodOutput, text: str) -> dict:
    tokens = len(output.token_ids)
    return dict(question_id=question.question_id, category=question.category, task=question.task,
                turn=turn + 1, method=method.label, family=method.family, weights=method.weights, order=order,
                prompt_tokens=len(prompt_ids), new_tokens=tokens, wall_seconds=output.seconds,
                tokens_per_second=tokens / output.seconds if output.seconds > 0 else None,
                **_stats_fields(output), match=None, check="not checked", mismatch=None,
                token_ids=list(output.token_ids), text=text)


class Harness:
    """Runs methods over questions and hands each finished record to `sink`."""

    def __init__(self, decoder: SpecDecoder, methods: Sequence[Method], settings: BenchSettings,
                 sink: Callable[[dict], None] = lambda record: None) -> None:
        labels = [m.label for m in methods]
        if len(set(labels)) != len(labels):
            raise ValueError(f"methods must have distinct labels; got {', '.join(labels)}")
        if not methods:
            raise ValueError("no methods to run")
        self.decoder, self.methods, self.settings, self.sink = decoder, list(methods), settings, sink
        self.mismatches: list[dict] = []
        self._bar: tqdm | None = None

    def _say(self, message: str) -> None:
        tqdm.write(message, file=sys.stderr)

    def _encode(self, question: Question, turn: int, answers: Sequence[str]) -> list[int]:
        return self.decoder.encode(conversation(question, turn, answers, self.settings.chat),
                                   chat=self.settings.chat)

    def _decode(self, token_ids: Sequence[int]) -> str:
        tokenizer = self.decoder.tokenizer
        return tokenizer.decode(list(token_ids), skip_special_tokens=True) if tokenizer is not None else ""

    def warm_up(self, question: Question) -> None:
        if self.settings.warmup_tokens <= 0:
            return
        sampling = dataclasses.replace(self.settings.sampling, max_new_tokens=self.settings.warmup_tokens)
        # Only the prompt's end (which holds the chat template's assistant header): the warm-up
        # exercises every code path, while a summarization prompt's full prefill would cost each
        # method minutes here, before any measurement.
        ids = self._encode(question, 0, [])[-self.settings.warmup_prompt_tokens:]
        for method in self.methods:
            self._progress(f"warm-up {method.label}")
            with sharing_scope("warm-up"):  # drafters that remember requests keep the warm-up apart
                method.generate(ids, sampling)
            self._advance()

    def run(self, questions: Sequence[Question], done: Collection[int] = ()) -> list[dict]:
        """Records of every question not in `done` (question ids finished by an earlier, resumed run).

        Skipped questions still count for the seeds and the method rotation, so a
        resumed run gives each remaining prompt the order and seed it would have had.
        """
        todo = [q for q in questions if q.question_id not in done]
        total = sum(len(q.turns) for q in todo) * len(self.methods)
        warmups = len(self.methods) if todo and self.settings.warmup_tokens > 0 else 0
        records: list[dict] = []
        with tqdm(total=total + warmups, disable=not self.settings.progress, file=sys.stderr,
                  unit="gen", dynamic_ncols=True) as self._bar:
            if todo:
                self.warm_up(todo[0])
            prompt_index = 0
            for index, question in enumerate(questions):
                if question.question_id in done:
                    prompt_index += len(question.turns)
                    continue
                answers = {m.label: [] for m in self.methods}
                for turn in range(len(question.turns)):
                    group = self._run_prompt(question, index, turn, answers, prompt_index)
                    prompt_index += 1
                    for record in group:
                        answers[record["method"]].append(record["text"])
                        self.sink(record)
                    records.extend(group)
        self._bar = None
        return records

    def _run_prompt(self, question: Question, index: int, turn: int, answers: dict[str, list[str]],
                    prompt_index: int) -> list[dict]:
        sampling = prompt_seed(self.settings.sampling, index, turn)
        by_label: dict[str, dict] = {}
        prompts: dict[str, list[int]] = {}
        for order, method in enumerate(rotated(self.methods, prompt_index)):
            self._progress(f"{question.task[:14]} q{question.question_id} t{turn + 1} {method.label}")
            prompts[method.label] = ids = self._encode(question, turn, answers[method.label])
            retakes = self.settings.retakes if getattr(method, "repeatable", True) else 0
            for attempt in range(retakes + 1):
                probe = CpuProbe()
                output = method.generate(ids, sampling)
                other = probe.other_share()  # others' CPU share while timing: flags a ruined timing
                if other is None or other <= CONTENDED:
                    break
                again = "; timing it again" if attempt < retakes else ""
                self._say(f"!   contended timing: {method.label} on question {question.question_id} turn "
                          f"{turn + 1}: other processes used {other:.0%} of the CPU{again}")
            # The same prompt and seed give the same tokens: a retake only replaces the timing.
            record = make_record(question, turn, method, order, ids, output, self._decode(output.token_ids))
            record["other_cpu"], record["retakes"] = other, attempt
            by_label[method.label] = record
            self._advance()
        if sampling.greedy:
            self._check(by_label, prompts)
        else:
            for record in by_label.values():
                record["check"] = "sampling: not compared"
        return [by_label[m.label] for m in self.methods]

    def _check(self, records: dict[str, dict], prompts: dict[str, list[int]]) -> None:
        """Each method against the reference of the model it runs: the configured reference for its
        weights, else that model's plain decoding (specwise-ar), else its first method."""
        logits_cache: dict = {}  # one plain pass per (model, divergence position), shared by the methods
        for label, record in records.items():
            if record["family"] == "llamacpp":
                record["check"] = ("not compared: llama.cpp's arithmetic differs from specwise's "
                                   "(scripts/lab/llamacpp_agreement.py compares them)")
                continue
            reference = self._reference_for(record["weights"])
            if label == reference:
                record["match"], record["check"] = True, "reference"
                continue
            if prompts[label] != prompts[reference]:
                record["check"] = "skipped: prompt differs (an earlier turn's answer differed)"
                continue
            model = self.decoder.target_model(record["weights"]).model
            cache = logits_cache.setdefault(record["weights"], {})
            mismatch = check_identity(model, prompts[label], records[reference]["token_ids"],
                                      record["token_ids"], self.settings.tie_ulps, cache)
            record["match"] = mismatch is None
            record["check"] = "identical" if mismatch is None else mismatch.classification
            if mismatch is not None:
                record["mismatch"] = mismatch.to_dict()
                self.mismatches.append(record)
                self._say(mismatch_line(record, reference))

    def _reference_for(self, weights: str) -> str:
        same = [m for m in self.methods if m.family != "llamacpp" and m.weights == weights]
        labels = [m.label for m in same]
        if self.settings.reference in labels:
            return self.settings.reference
        plain = [m.label for m in same if getattr(getattr(m, "spec", None), "drafter", None) == "none"]
        return (plain or labels)[0]

    def _progress(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def _advance(self) -> None:
        if self._bar is not None:
            self._bar.update(1)


def mismatch_line(record: dict, reference: str) -> str:
    m = record["mismatch"]
    loud = "!!! FAILURE" if m["classification"] == FAILURE else "!   numerical"
    margin = "n/a" if m["margin_ulps"] is None else f"{m['margin_ulps']:.2f} ulp (tolerance {m['tolerance']:.4g})"
    return (f"{loud} MISMATCH: {record['method']} differs from {reference} on question "
            f"{record['question_id']} ({record['task']}) turn {record['turn']} at new token {m['position']}: "
            f"{m['reference_token']} vs {m['method_token']}, target's gap {margin}")
