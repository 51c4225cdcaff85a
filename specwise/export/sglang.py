"""SGLang: `python -m sglang.launch_server` flags (--speculative-*)."""

from __future__ import annotations

from typing import Any

from specwise.export.model import (EngineExport, Subject, common_notes, flag_argv, key_list, model_for_gpu_engine,
                                   other_tokenizer)

ENGINE = "sglang"
EAGLE_PLACEHOLDER = "<an EAGLE-3 head trained for the target, in SGLang's format>"


def export(subject: Subject) -> EngineExport:
    keys = key_list(ENGINE)
    spec = subject.spec
    k, k_note = subject.fixed_k()
    notes = [k_note] if k_note else []
    drafter = spec.drafter
    if drafter in ("recycle", "layerskip"):
        drafter = "ngram"
    notes += common_notes(subject, "SGLang", block=False, recycle_nearest="NGRAM (its trie cache)",
                          layerskip_nearest="NGRAM (its trie cache)")
    # A tree: branching children per node, depth levels, the node budget; a chain is the tree with
    # one child per node. SGLang counts the verified root too in num_draft_tokens (a chain of k
    # draft tokens is k + 1).
    topk = spec.tree_branching if spec.tree else 1
    steps = spec.tree_depth if spec.tree else k
    draft_tokens = (spec.tree_nodes if spec.tree else k) + 1
    flags: dict[str, Any] = {}

    if drafter in ("draft-model", "eagle"):
        model_drafter = drafter == "draft-model"
        flags["--speculative-algorithm"] = "STANDALONE" if model_drafter else "EAGLE3"
        flags["--speculative-draft-model-path"] = (model_for_gpu_engine(subject.draft_model, "<draft model>")
                                                  if model_drafter else EAGLE_PLACEHOLDER)
        flags["--speculative-num-steps"] = steps
        flags["--speculative-eagle-topk"] = topk
        flags["--speculative-num-draft-tokens"] = draft_tokens
        if spec.adaptive is not False and not spec.tree:  # True, or "auto" (adaptive for most requests)
            flags["--speculative-adaptive"] = None
            notes.append("--speculative-adaptive lets SGLang adjust num_steps from the acceptance rate it "
                         "measures, the nearest to specwise's adaptive k (which also weighs measured costs "
                         "and may draft nothing); its tuning knobs (--speculative-adaptive-config) are SGLang's own")
        if model_drafter:
            other = other_tokenizer(subject.target, subject.draft_model)
            if other or other is None:
                notes.append(("the draft model has another tokenizer" if other else
                              "if the draft model's tokenizer differs from the target's") +
                             ": SGLang requires a shared vocabulary for a draft model and has no cross-vocabulary "
                             "drafting; use a draft model of the target's family")
        else:
            notes.append("eagle: specwise's head (three target layers, one decoder layer, a reduced draft "
                         "vocabulary) is not an SGLang checkpoint; train or convert an EAGLE-3 head for SGLang "
                         "and give its path to --speculative-draft-model-path")
        if spec.tree and model_drafter:
            notes.append("a tree with a draft model: SGLang's STANDALONE worker shares EAGLE's tree settings "
                         "(topk, num_steps); if this version refuses topk > 1 for it, use topk 1 (a chain)")
    else:  # ngram or suffix: SGLang's NGRAM, a trie cache of earlier token sequences
        flags["--speculative-algorithm"] = "NGRAM"
        flags["--speculative-num-draft-tokens"] = draft_tokens
        flags["--speculative-ngram-min-bfs-breadth"] = 1
        flags["--speculative-ngram-max-bfs-breadth"] = topk
        if drafter == "suffix":
            flags["--speculative-ngram-match-type"] = "PROB"  # by frequency, as specwise's suffix drafter ranks
            flags["--speculative-ngram-max-trie-depth"] = spec.suffix_depth
            notes.append("suffix: SGLang's nearest is NGRAM matched by frequency (PROB) over its trie cache; "
                         f"it has no minimum frequency (suffix_min_percent={spec.suffix_min_percent}) or draft "
                         f"tokens per matched token (suffix_factor={spec.suffix_factor}) keys, and no "
                         "per-tenant sharing scopes for earlier requests; its cache is bounded by "
                         "--speculative-ngram-capacity, not by specwise's token count")
        else:
            flags["--speculative-ngram-match-type"] = "BFS"
            notes.append(f"ngram: this SGLang version's NGRAM has no match-window keys (specwise matches the "
                         f"longest suffix of {spec.ngram_max} down to {spec.ngram_min} tokens); it matches "
                         "through its trie cache, which also holds earlier requests, so it can draft from "
                         "them where specwise's prompt lookup would not")
    if spec.tree and drafter in ("ngram", "suffix"):
        notes.append(f"draft trees ({spec.tree_summary()}) map to NGRAM's BFS breadth and draft-token budget")
    notes.append("leave --speculative-accept-threshold-single/-acc at 1.0 (their default): lower values accept "
                 "draft tokens the target would not have sampled, which is no longer lossless")

    serve = {"--model-path": model_for_gpu_engine(subject.target, "<target model>"), **flags}
    keys.check({}, serve)
    command = ["python", "-m", "sglang.launch_server"] + flag_argv(serve)
    return EngineExport(engine=ENGINE, name=keys.name, version=keys.version, key_source=keys.source_line(),
                        settings=flags, command=command, notes=notes, method=flags["--speculative-algorithm"])
