"""SGLang: `python -m sglang.launch_server` flags (--speculative-*)."""

from __future__ import annotations

from specwise.export.model import model_for_gpu_engine
from specwise.export.table import OMIT, Context, EngineTable, Method, Note, StandIn, eagle_note, vocabulary_note

EAGLE_PLACEHOLDER = "<an EAGLE-3 head trained for the target, in SGLang's format>"


# A tree: branching children per node, depth levels, the node budget; a chain is the tree with one child
# per node. SGLang counts the verified root too in num_draft_tokens (a chain of k draft tokens is k + 1).
def _topk(c: Context) -> int:
    return c.spec.tree_branching if c.spec.tree else 1


def _steps(c: Context) -> int:
    return c.spec.tree_depth if c.spec.tree else c.k


def _draft_tokens(c: Context) -> int:
    return (c.spec.tree_nodes if c.spec.tree else c.k) + 1


def _adaptive(c: Context) -> bool:
    return c.spec.adaptive is not False and not c.spec.tree  # True, or "auto" (adaptive for most requests)


# The shape of drafting with a model (a draft model or an EAGLE head), after the algorithm and the model.
_MODEL_DRAFTING = {"--speculative-num-steps": _steps, "--speculative-eagle-topk": _topk,
                   "--speculative-num-draft-tokens": _draft_tokens,
                   "--speculative-adaptive": lambda c: None if _adaptive(c) else OMIT}  # None: a switch
_ADAPTIVE = Note("--speculative-adaptive lets SGLang adjust num_steps from the acceptance rate it measures, the "
                 "nearest to specwise's adaptive k (which also weighs measured costs and may draft nothing); its "
                 "tuning knobs (--speculative-adaptive-config) are SGLang's own", when=_adaptive)
# ngram and suffix: SGLang's NGRAM, a trie cache of earlier token sequences.
_NGRAM = {"--speculative-algorithm": "NGRAM", "--speculative-num-draft-tokens": _draft_tokens,
          "--speculative-ngram-min-bfs-breadth": 1, "--speculative-ngram-max-bfs-breadth": _topk}
_NGRAM_TREE = Note(lambda c: f"draft trees ({c.spec.tree_summary()}) map to NGRAM's BFS breadth and draft-token "
                             "budget", when=lambda c: c.spec.tree)

TABLE = EngineTable(
    keys="sglang",
    label="SGLang",
    program=("python", "-m", "sglang.launch_server"),
    target_flag="--model-path",
    name_model=model_for_gpu_engine,
    target_placeholder="<target model>",
    draft_placeholder="<draft model>",
    method_key="--speculative-algorithm",
    stand_ins={"recycle": StandIn("ngram", words="NGRAM (its trie cache)"),
               "layerskip": StandIn("ngram", words="NGRAM (its trie cache)")},
    methods={
        "draft-model": Method(
            {"--speculative-algorithm": "STANDALONE", "--speculative-draft-model-path": lambda c: c.draft_model,
             **_MODEL_DRAFTING},
            notes=(_ADAPTIVE,
                   vocabulary_note("SGLang requires a shared vocabulary for a draft model and has no "
                                   "cross-vocabulary drafting; use a draft model of the target's family"),
                   Note("a tree with a draft model: SGLang's STANDALONE worker shares EAGLE's tree settings "
                        "(topk, num_steps); if this version refuses topk > 1 for it, use topk 1 (a chain)",
                        when=lambda c: c.spec.tree))),
        "eagle": Method(
            {"--speculative-algorithm": "EAGLE3", "--speculative-draft-model-path": EAGLE_PLACEHOLDER,
             **_MODEL_DRAFTING},
            notes=(_ADAPTIVE,
                   eagle_note("an SGLang checkpoint", "train or convert an EAGLE-3 head for SGLang and give its "
                              "path to --speculative-draft-model-path"))),
        "ngram": Method(
            {**_NGRAM, "--speculative-ngram-match-type": "BFS"},
            notes=(Note(lambda c: f"ngram: this SGLang version's NGRAM has no match-window keys (specwise matches "
                                  f"the longest suffix of {c.spec.ngram_max} down to {c.spec.ngram_min} tokens); "
                                  "it matches through its trie cache, which also holds earlier requests, so it "
                                  "can draft from them where specwise's prompt lookup would not"),
                   _NGRAM_TREE)),
        "suffix": Method(
            {**_NGRAM, "--speculative-ngram-match-type": "PROB",  # by frequency, as specwise's suffix drafter ranks
             "--speculative-ngram-max-trie-depth": lambda c: c.spec.suffix_depth},
            notes=(Note(lambda c: "suffix: SGLang's nearest is NGRAM matched by frequency (PROB) over its trie "
                                  "cache; it has no minimum frequency (suffix_min_percent="
                                  f"{c.spec.suffix_min_percent}) or draft tokens per matched token (suffix_factor="
                                  f"{c.spec.suffix_factor}) keys, and no per-tenant sharing scopes for earlier "
                                  "requests; its cache is bounded by --speculative-ngram-capacity, not by "
                                  "specwise's token count"),
                   _NGRAM_TREE)),
    },
    notes=(Note("leave --speculative-accept-threshold-single/-acc at 1.0 (their default): lower values accept "
                "draft tokens the target would not have sampled, which is no longer lossless"),),
)
