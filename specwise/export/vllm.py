"""vLLM: a `speculative_config` object, passed to `vllm serve` as --speculative-config JSON."""

from __future__ import annotations

from specwise.export.model import model_for_gpu_engine
from specwise.export.table import OMIT, EngineTable, Method, Note, StandIn, eagle_note

EAGLE_PLACEHOLDER = "<an EAGLE-3 head trained for the target, in vLLM's format>"


def _verification(context) -> str:
    """rejection_sample_method: specwise's auto verifier is block verification under sampling (greedy at
    temperature 0, which every engine does alike), and this version has it; a tree exports a chain, which
    block verification has no tree form for, so the engine's default stays."""
    if context.spec.tree:
        return OMIT
    return {"auto": "block", "block": "block", "token": "standard"}.get(context.spec.verifier, OMIT)


TABLE = EngineTable(
    keys="vllm",
    label="vLLM",
    program=("vllm", "serve"),
    target_flag=None,  # `vllm serve MODEL`
    config_flag="--speculative-config",
    name_model=model_for_gpu_engine,
    target_placeholder="<target model>",
    draft_placeholder="<draft model>",
    method_key="method",
    block_key="rejection_sample_method",
    # recycle drafts after its retrieval drafter where that one matches: that drafter is the nearest.
    stand_ins={"recycle": StandIn(lambda spec: "suffix" if spec.recycle_with == "suffix" else "ngram",
                                  words="method {drafter}"),
               "layerskip": StandIn("ngram", words="method ngram (prompt lookup)")},
    methods={
        "ngram": Method({"method": "ngram", "num_speculative_tokens": lambda c: c.k,
                         "prompt_lookup_min": lambda c: c.spec.ngram_min,
                         "prompt_lookup_max": lambda c: c.spec.ngram_max}),
        "suffix": Method(
            {"method": "suffix", "num_speculative_tokens": lambda c: c.k,
             "suffix_decoding_max_tree_depth": lambda c: c.spec.suffix_depth,
             "suffix_decoding_max_spec_factor": lambda c: float(c.spec.suffix_factor),
             "suffix_decoding_min_token_prob": lambda c: c.spec.suffix_min_percent / 100},
            notes=(Note(lambda c: "suffix: vLLM bounds its tree of earlier requests by a count of requests "
                                  "(suffix_decoding_max_cached_requests, left at vLLM's default), specwise by "
                                  f"tokens ({c.spec.suffix_cache_tokens}); vLLM shares that tree across all "
                                  "requests, with no per-tenant sharing scopes; the method needs the "
                                  "arctic-inference package"),)),
        "draft-model": Method(
            {"method": "draft_model", "model": lambda c: c.draft_model, "num_speculative_tokens": lambda c: c.k,
             "use_heterogeneous_vocab": lambda c: True if c.other_tokenizer else OMIT},
            notes=(Note("the draft model has another tokenizer: use_heterogeneous_vocab makes vLLM draft only "
                        "tokens both vocabularies hold (Token-Level Intersection, as specwise does under "
                        "sampling); specwise's greedy conversion through text has no equivalent",
                        when=lambda c: c.other_tokenizer is True),
                   Note("if the draft model's tokenizer differs from the target's, add "
                        "\"use_heterogeneous_vocab\": true (vLLM otherwise requires a shared vocabulary)",
                        when=lambda c: c.other_tokenizer is None))),
        "eagle": Method({"method": "eagle3", "model": EAGLE_PLACEHOLDER, "num_speculative_tokens": lambda c: c.k},
                        notes=(eagle_note("a vLLM checkpoint", "train or convert an EAGLE-3 head for vLLM and "
                                          "put its path in \"model\""),)),
    },
    after={"rejection_sample_method": _verification,
           # specwise samples a draft model's tokens from its processed distribution under sampling.
           "draft_sample_method": lambda c: "probabilistic" if c.drafter == "draft-model" else OMIT},
    notes=(Note(lambda c: f"draft trees ({c.spec.tree_summary()}): this vLLM version has no tree key "
                          f"(speculative_token_tree is gone from SpeculativeConfig); exported a chain of "
                          f"{c.k} tokens, the tree's depth", when=lambda c: c.spec.tree),),
)
