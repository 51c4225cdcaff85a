"""`specwise generate` defaults to the fastest measured configuration; other commands do not."""

from specwise.cli import build_parser, spec_from_args


def spec(argv):
    return spec_from_args(build_parser().parse_args(argv))


def test_generate_defaults_to_ngram_drafting_with_k4():
    default = spec(["generate", "hi"])
    assert (default.drafter, default.k, default.adaptive, default.draft_quantize) == ("ngram", 4, False, None)
    assert spec(["generate", "--k", "6", "hi"]).k == 6


def test_generate_asked_for_the_draft_model_uses_its_int8_adaptive_configuration():
    default = spec(["generate", "--drafter", "draft-model", "hi"])
    assert (default.drafter, default.adaptive, default.draft_quantize, default.k) == ("draft-model", True, "int8", 5)
    fixed = spec(["generate", "--drafter", "draft-model", "--no-adaptive", "--drafter-quantize", "none",
                  "--k", "5", "hi"])
    assert (fixed.adaptive, fixed.draft_quantize, fixed.k) == (False, None, 5)
    tree = spec(["generate", "--drafter", "draft-model", "--tree-nodes", "8", "hi"])  # trees: fixed budget
    assert tree.tree and not tree.adaptive


def test_bench_and_serve_keep_the_library_defaults():
    base = spec(["bench", "run"])
    assert (base.drafter, base.k, base.adaptive, base.draft_quantize) == ("draft-model", 5, False, None)
    assert spec(["bench", "run", "--adaptive"]).adaptive
    served = spec(["serve"])
    assert (served.drafter, served.k, served.adaptive) == ("draft-model", 5, False)
