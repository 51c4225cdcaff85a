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
