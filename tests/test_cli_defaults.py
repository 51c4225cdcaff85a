"""One default configuration everywhere: the library, `generate`, `serve` and `bench` agree."""

import pytest

from specwise.cli import build_parser
from specwise.cli_options import spec_from_args
from specwise.config import SpecConfig


def spec(argv):
    return spec_from_args(build_parser().parse_args(argv))


def test_every_command_defaults_to_the_library_configuration():
    library = SpecConfig()
    assert (library.drafter, library.k, library.adaptive, library.draft_quantize) == ("ngram", 4, "auto", None)
    for argv in (["generate", "hi"], ["bench", "run"], ["serve"]):
        assert spec(argv) == library, argv


def test_adaptive_on_off_and_auto_on_every_command():
    for command in (["generate"], ["bench", "run"], ["serve"], ["export", "vllm"]):
        assert spec(command + ["--adaptive"]).adaptive is True
        assert spec(command + ["--no-adaptive"]).adaptive is False  # the fixed k = 4 of earlier versions
        assert spec(command).adaptive == "auto"
    with pytest.raises(SystemExit):  # a switch takes no value: --adaptive / --no-adaptive, or neither (auto)
        build_parser().parse_args(["serve", "--adaptive=sometimes"])


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
    prompt = "abcabcabcabcabc"
    # Seeded sampling: the default verifies its point-mass drafts coupled, so the seed gives plain decoding's
    # tokens whatever k is; with k fixed, two runs also match step for step.
    sampling = SamplingParams(temperature=0.8, seed=11, max_new_tokens=12)
    result = specwise.generate(prompt, target=target, sampling=sampling, chat=False)  # no draft model needed
    explicit = specwise.generate(prompt, target=target, sampling=sampling, chat=False, spec=SpecConfig())
    fixed = specwise.generate(prompt, target=target, sampling=sampling, chat=False, spec=SpecConfig(adaptive=False))
    again = specwise.generate(prompt, target=target, sampling=sampling, chat=False, spec=SpecConfig(adaptive=False))
    plain = specwise.generate(prompt, target=target, sampling=sampling, chat=False, spec=SpecConfig(drafter="none"))
    assert result.token_ids == explicit.token_ids == fixed.token_ids == plain.token_ids
    assert result.seed == explicit.seed == fixed.seed == 11
    timings = ("seconds", "per_second")
    counts = [{k: v for k, v in r.stats.to_dict().items() if not any(t in k for t in timings)} for r in (fixed, again)]
    assert counts[0] == counts[1]
    assert fixed.stats.proposed > 0  # n-gram drafting found the repeated text
    # Greedy: adaptive k, whose steps follow measured times; the tokens are greedy decoding's either way.
    greedy = SamplingParams(max_new_tokens=12)
    outputs = [specwise.generate(prompt, target=target, sampling=greedy, chat=False, spec=spec)
               for spec in (None, SpecConfig(), SpecConfig(adaptive=False))]
    assert outputs[0].token_ids == outputs[1].token_ids == outputs[2].token_ids


def test_library_refuses_a_drafter_beside_a_spec():
    import dataclasses

    import specwise

    spec = SpecConfig(k=6)
    for call in (specwise.generate, specwise.stream):
        with pytest.raises(ValueError, match=r"give drafter='suffix' or spec=, not both.*spec.drafter='ngram'.*"
                                             r"dataclasses.replace\(spec, drafter='suffix'\)"):
            call("hi", drafter="suffix", spec=spec)  # refused before any model loads
    assert dataclasses.replace(spec, drafter="suffix") == SpecConfig(k=6, drafter="suffix")  # the fix it names


def test_m_names_the_target_everywhere():
    from specwise.cli import build_parser

    for command in (["generate"], ["serve"], ["bench", "run"], ["bench", "cost"], ["export", "vllm"]):
        assert build_parser().parse_args(command + ["-m", "x.gguf"]).target == "x.gguf", command
