"""llama-server (llama.cpp): --spec-type and the --spec-draft-* / --spec-ngram-* flags."""

from __future__ import annotations

from specwise.export.model import gguf_for_llama
from specwise.export.table import EngineTable, Method, Note, StandIn, eagle_note, vocabulary_note

EAGLE_PLACEHOLDER = "<an EAGLE-3 head for the target, converted to GGUF>"

# specwise samples the draft from the drafter's processed distribution under sampling and verifies by
# rejection sampling; greedy drafting (llama.cpp's default) is lossless too.
_SAMPLING = {"--spec-draft-sampling": "probabilistic"}

TABLE = EngineTable(
    keys="llama-server",
    label="llama-server",
    program=("llama-server",),
    target_flag="-m",
    name_model=gguf_for_llama,
    target_placeholder="<target .gguf>",
    draft_placeholder="<draft model .gguf>",
    method_key="--spec-type",
    reads_gguf=True,
    stand_ins={"recycle": StandIn("ngram", words="--spec-type ngram-simple"),
               "layerskip": StandIn("ngram", words="--spec-type ngram-simple (prompt lookup)")},
    methods={
        "draft-model": Method(
            {"--spec-type": "draft-simple", "--spec-draft-model": lambda c: c.draft_model,
             "--spec-draft-n-max": lambda c: c.k, **_SAMPLING},
            notes=(vocabulary_note("llama.cpp checks that the two vocabularies are compatible and has no "
                                   "cross-vocabulary drafting; use a draft model of the target's family"),
                   Note("for a cheaper draft model in llama.cpp, give it a Q8_0 or Q4 GGUF file of the draft model",
                        when=lambda c: c.spec.draft_quantize == "int8"))),
        "eagle": Method(
            {"--spec-type": "draft-eagle3", "--spec-draft-model": EAGLE_PLACEHOLDER,
             "--spec-draft-n-max": lambda c: c.k, **_SAMPLING},
            notes=(eagle_note("a llama.cpp model", "convert an EAGLE-3 head for the target to GGUF and give it to "
                              "--spec-draft-model"),)),
        "ngram": Method(
            {"--spec-type": "ngram-simple", "--spec-ngram-simple-size-n": lambda c: c.spec.ngram_max,
             "--spec-ngram-simple-size-m": lambda c: c.k, "--spec-ngram-simple-min-hits": 1},
            notes=(Note(lambda c: f"ngram: llama.cpp's ngram-simple looks up one n-gram length (size-n = "
                                  f"{c.spec.ngram_max}); specwise falls back to shorter matches down to "
                                  f"{c.spec.ngram_min} tokens, so llama.cpp drafts less often on text with only "
                                  "short repeats", when=lambda c: c.spec.ngram_min != c.spec.ngram_max),)),
        "suffix": Method(
            {"--spec-type": "ngram-cache", "--spec-draft-n-max": lambda c: c.k},
            notes=(Note("suffix trees over earlier requests have no equivalent in llama-server: the nearest is "
                        "--spec-type ngram-cache, n-gram statistics of the text, kept across requests in a dynamic "
                        "lookup cache when given --lookup-cache-dynamic FILE; it has no minimum frequency, depth or "
                        "per-tenant scopes"),)),
    },
    notes=(Note(lambda c: f"draft trees ({c.spec.tree_summary()}) have no equivalent in llama-server: it drafts a "
                          f"chain; exported {c.k} tokens, the tree's depth", when=lambda c: c.spec.tree),),
)
