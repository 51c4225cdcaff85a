"""vLLM: a `speculative_config` object, passed to `vllm serve` as --speculative-config JSON."""

from __future__ import annotations

import json
from typing import Any

from specwise.export.model import (EngineExport, ExportError, Subject, common_notes, flag_argv, key_list,
                                   model_for_gpu_engine, other_tokenizer)

ENGINE = "vllm"
EAGLE_PLACEHOLDER = "<an EAGLE-3 head trained for the target, in vLLM's format>"


def export(subject: Subject) -> EngineExport:
    keys = key_list(ENGINE)
    spec = subject.spec
    k, k_note = subject.fixed_k()
    notes = [k_note] if k_note else []
    config: dict[str, Any] = {}
    drafter = spec.drafter
    # recycle drafts after its retrieval drafter where that one matches: that drafter is the nearest.
    if drafter == "recycle":
        drafter = "suffix" if spec.recycle_with == "suffix" else "ngram"
    elif drafter == "layerskip":
        drafter = "ngram"
    notes += common_notes(subject, "vLLM", block="block" in keys.choices.get("rejection_sample_method", ()),
                          recycle_nearest=f"method {'suffix' if drafter == 'suffix' else 'ngram'}",
                          layerskip_nearest="method ngram (prompt lookup)")

    if drafter == "ngram":
        config.update(method="ngram", num_speculative_tokens=k, prompt_lookup_min=spec.ngram_min,
                      prompt_lookup_max=spec.ngram_max)
    elif drafter == "suffix":
        config.update(method="suffix", num_speculative_tokens=k,
                      suffix_decoding_max_tree_depth=spec.suffix_depth,
                      suffix_decoding_max_spec_factor=float(spec.suffix_factor),
                      suffix_decoding_min_token_prob=spec.suffix_min_percent / 100)
        notes.append(f"suffix: vLLM bounds its tree of earlier requests by a count of requests "
                     f"(suffix_decoding_max_cached_requests, left at vLLM's default), specwise by tokens "
                     f"({spec.suffix_cache_tokens}); vLLM shares that tree across all requests, with no "
                     "per-tenant sharing scopes; the method needs the arctic-inference package")
    elif drafter == "draft-model":
        config.update(method="draft_model", model=model_for_gpu_engine(subject.draft_model, "<draft model>"),
                      num_speculative_tokens=k)
        other = other_tokenizer(subject.target, subject.draft_model)
        if other:
            config["use_heterogeneous_vocab"] = True
            notes.append("the draft model has another tokenizer: use_heterogeneous_vocab makes vLLM draft only "
                         "tokens both vocabularies hold (Token-Level Intersection, as specwise does under "
                         "sampling); specwise's greedy conversion through text has no equivalent")
        elif other is None:
            notes.append("if the draft model's tokenizer differs from the target's, add "
                         "\"use_heterogeneous_vocab\": true (vLLM otherwise requires a shared vocabulary)")
    elif drafter == "eagle":
        config.update(method="eagle3", model=EAGLE_PLACEHOLDER, num_speculative_tokens=k)
        notes.append("eagle: specwise's head (three target layers, one decoder layer, a reduced draft "
                     "vocabulary) is not a vLLM checkpoint; train or convert an EAGLE-3 head for vLLM and "
                     "put its path in \"model\"")
    else:
        raise ExportError(f"vLLM has no equivalent of specwise's drafter {drafter!r}")

    if spec.tree:
        notes.append(f"draft trees ({spec.tree_summary()}): this vLLM version has no tree key "
                     f"(speculative_token_tree is gone from SpeculativeConfig); exported a chain of "
                     f"{k} tokens, the tree's depth")
    else:
        verifier = spec.verifier
        if verifier in ("auto", "block"):
            # specwise's auto verifier is block verification under sampling (greedy at temperature 0,
            # which every engine does alike), and this version has it.
            config["rejection_sample_method"] = "block"
        elif verifier == "token":
            config["rejection_sample_method"] = "standard"
    if drafter == "draft-model":
        # specwise samples a draft model's tokens from its processed distribution under sampling.
        config["draft_sample_method"] = "probabilistic"

    serve = {"--speculative-config": json.dumps(config, separators=(",", ":"))}
    keys.check(config, serve)
    command = ["vllm", "serve", model_for_gpu_engine(subject.target, "<target model>"), *flag_argv(serve)]
    return EngineExport(engine=ENGINE, name=keys.name, version=keys.version, key_source=keys.source_line(),
                        settings=config, command=command, notes=notes, method=config["method"])
