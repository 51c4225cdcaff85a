"""llama-server (llama.cpp): --spec-type and the --spec-draft-* / --spec-ngram-* flags."""

from __future__ import annotations

from typing import Any

from specwise.export.model import EngineExport, Subject, common_notes, flag_argv, gguf_for_llama, key_list, \
    other_tokenizer

ENGINE = "llama-server"
EAGLE_PLACEHOLDER = "<an EAGLE-3 head for the target, converted to GGUF>"


def export(subject: Subject) -> EngineExport:
    keys = key_list(ENGINE)
    spec = subject.spec
    k, k_note = subject.fixed_k()
    notes = [k_note] if k_note else []
    drafter = spec.drafter
    if drafter in ("recycle", "layerskip"):
        drafter = "ngram"
    notes += common_notes(subject, "llama-server", block=False, recycle_nearest="--spec-type ngram-simple",
                          layerskip_nearest="--spec-type ngram-simple (prompt lookup)")
    flags: dict[str, Any] = {}

    if drafter in ("draft-model", "eagle"):
        model_drafter = drafter == "draft-model"
        flags["--spec-type"] = "draft-simple" if model_drafter else "draft-eagle3"
        flags["--spec-draft-model"] = (gguf_for_llama(subject.draft_model, "<draft model .gguf>")
                                       if model_drafter else EAGLE_PLACEHOLDER)
        flags["--spec-draft-n-max"] = k
        # specwise samples the draft from the drafter's processed distribution under sampling and
        # verifies by rejection sampling; greedy drafting (llama.cpp's default) is lossless too.
        flags["--spec-draft-sampling"] = "probabilistic"
        if model_drafter:
            other = other_tokenizer(subject.target, subject.draft_model)
            if other or other is None:
                notes.append(("the draft model has another tokenizer" if other else
                              "if the draft model's tokenizer differs from the target's") +
                             ": llama.cpp checks that the two vocabularies are compatible and has no "
                             "cross-vocabulary drafting; use a draft model of the target's family")
            if spec.draft_quantize == "int8":
                notes.append("for a cheaper draft model in llama.cpp, give it a Q8_0 or Q4 GGUF file "
                             "of the draft model")
        else:
            notes.append("eagle: specwise's head (three target layers, one decoder layer, a reduced draft "
                         "vocabulary) is not a llama.cpp model; convert an EAGLE-3 head for the target to GGUF "
                         "and give it to --spec-draft-model")
    elif drafter == "ngram":
        flags["--spec-type"] = "ngram-simple"
        flags["--spec-ngram-simple-size-n"] = spec.ngram_max
        flags["--spec-ngram-simple-size-m"] = k
        flags["--spec-ngram-simple-min-hits"] = 1
        if spec.ngram_min != spec.ngram_max:
            notes.append(f"ngram: llama.cpp's ngram-simple looks up one n-gram length (size-n = "
                         f"{spec.ngram_max}); specwise falls back to shorter matches down to {spec.ngram_min} "
                         "tokens, so llama.cpp drafts less often on text with only short repeats")
    else:  # suffix
        flags["--spec-type"] = "ngram-cache"
        flags["--spec-draft-n-max"] = k
        notes.append("suffix trees over earlier requests have no equivalent in llama-server: the nearest is "
                     "--spec-type ngram-cache, n-gram statistics of the text, kept across requests in a "
                     "dynamic lookup cache when given --lookup-cache-dynamic FILE; it has no minimum "
                     "frequency, depth or per-tenant scopes")
    if spec.tree:
        notes.append(f"draft trees ({spec.tree_summary()}) have no equivalent in llama-server: it drafts a "
                     f"chain; exported {k} tokens, the tree's depth")

    serve = {"-m": gguf_for_llama(subject.target, "<target .gguf>"), **flags}
    keys.check({}, serve)
    command = ["llama-server"] + flag_argv(serve)
    return EngineExport(engine=ENGINE, name=keys.name, version=keys.version, key_source=keys.source_line(),
                        settings=flags, command=command, notes=notes, method=flags["--spec-type"])
