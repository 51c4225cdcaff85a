"""`specwise generate` defaults to the fastest measured configuration; other commands do not."""

from specwise.cli import build_parser, spec_from_args


def spec(argv):
    return spec_from_args(build_parser().parse_args(argv))


def test_generate_defaults_to_the_int8_adaptive_draft_model():
    default = spec(["generate", "hi"])
    assert (default.drafter, default.adaptive, default.draft_quantize) == ("draft-model", True, "int8")
    fixed = spec(["generate", "--no-adaptive", "--drafter-quantize", "none", "--k", "5", "hi"])
    assert (fixed.adaptive, fixed.draft_quantize, fixed.k) == (False, None, 5)
    tree = spec(["generate", "--tree-nodes", "8", "hi"])  # trees have a fixed budget, never adaptive
    assert tree.tree and not tree.adaptive


def test_bench_methods_keep_the_library_defaults():
    base = spec(["bench", "run"])
    assert (base.adaptive, base.draft_quantize) == (False, None)
    assert spec(["bench", "run", "--adaptive"]).adaptive
