"""One default configuration everywhere: the library, `generate`, `serve` and `bench` agree."""

from specwise.cli import build_parser
from specwise.cli_options import spec_from_args
from specwise.config import SpecConfig


def spec(argv):
    return spec_from_args(build_parser().parse_args(argv))


def test_every_command_defaults_to_the_library_configuration():
    library = SpecConfig()
    assert (library.drafter, library.k, library.adaptive, library.draft_quantize) == ("ngram", 4, False, None)
    for argv in (["generate", "hi"], ["bench", "run"], ["serve"]):
        assert spec(argv) == library, argv


def test_flags_change_only_what_they_name():
    assert spec(["generate", "--k", "6", "hi"]) == SpecConfig(k=6)
    chosen = spec(["generate", "--drafter", "draft-model", "--draft-quantize", "int8", "--adaptive", "hi"])
    assert chosen == SpecConfig(drafter="draft-model", draft_quantize="int8", adaptive=True)
    assert spec(["bench", "run", "--draft-quantize", "none"]).draft_quantize is None
    tree = spec(["serve", "--drafter", "draft-model", "--tree-shape", "3,2,1"])
    assert (tree.tree_shape, tree.tree_nodes, tree.tree_depth) == ((3, 2, 1), 15, 3)


def test_library_generate_uses_the_default_configuration():
    import specwise
    from specwise.config import SamplingParams
    from specwise.testing import tiny_loaded

    target = tiny_loaded(0)
    sampling = SamplingParams(max_new_tokens=12)
    prompt = "abcabcabcabcabc"
    result = specwise.generate(prompt, target=target, sampling=sampling, chat=False)  # no draft model needed
    explicit = specwise.generate(prompt, target=target, sampling=sampling, chat=False, spec=SpecConfig())
    assert result.token_ids == explicit.token_ids
    timings = ("seconds", "per_second")
    counts = [{k: v for k, v in r.stats.to_dict().items() if not any(t in k for t in timings)}
              for r in (result, explicit)]
    assert counts[0] == counts[1]
    assert result.stats.proposed > 0  # n-gram drafting found the repeated text
