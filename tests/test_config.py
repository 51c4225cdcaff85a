import pytest

from specwise import SamplingParams, SpecConfig


@pytest.mark.parametrize("field, value, words", [
    ("temperature", -0.5, ">= 0"),
    ("temperature", float("nan"), "finite"),
    ("top_k", -1, ">= 0"),
    ("top_k", 2.5, "integer"),
    ("top_k", True, "integer"),  # a bool is not a count
    ("top_p", 0.0, "(0, 1]"),
    ("top_p", 1.5, "(0, 1]"),
    ("repetition_penalty", 0.0, "> 0"),
    ("seed", -3, "[0, 2**63)"),
    ("max_new_tokens", 0, ">= 1"),
    ("stop_token_ids", [-1], "integers >= 0"),
    ("stop_strings", [""], "non-empty strings"),
])
def test_bad_sampling_parameter_names_field_and_range(field, value, words):
    with pytest.raises(ValueError) as error:
        SamplingParams(**{field: value})
    message = str(error.value)
    assert message.startswith(field) and words in message and repr(value) in message


@pytest.mark.parametrize("kwargs, words", [
    ({"k": 0}, "k must be an integer in [1, 64]"),
    ({"k": True}, "k must be an integer in [1, 64]"),
    ({"verifier": "magic"}, "verifier must be one of auto, greedy, token, block, coupled"),
    ({"k_min": 4, "k_max": 2}, "k_max must be an integer in [k_min=4, 64]"),
    ({"ngram_min": 3, "ngram_max": 2}, "ngram_max must be an integer in [ngram_min=3, 32]"),
    ({"ngram_max": 1_000_000}, "ngram_max must be an integer in [ngram_min=1, 32]"),
    ({"drafter": ""}, "drafter must be a registered drafter name"),
])
def test_bad_spec_config(kwargs, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        SpecConfig(**kwargs)


def test_config_error_names_its_field():
    from specwise.config import ConfigError

    try:
        SamplingParams(top_p=2.0)
    except ConfigError as error:
        assert error.field == "top_p"
    else:
        raise AssertionError("no error")


def test_verifier_resolution():
    sampled = SamplingParams(temperature=1)
    assert SpecConfig().resolve_verifier(SamplingParams(temperature=0)) == "greedy"
    # auto: coupled for point-mass drafters, plain decoding and trees; block for a draft model's chains
    for drafter in ("ngram", "suffix", "recycle", "none"):
        assert SpecConfig(drafter=drafter).resolve_verifier(sampled) == "coupled", drafter
    assert SpecConfig(drafter="draft-model").resolve_verifier(sampled) == "block"
    assert SpecConfig(drafter="eagle", tree_nodes=8).resolve_verifier(sampled) == "coupled"
    assert SpecConfig(verifier="token").resolve_verifier(SamplingParams(temperature=0.7)) == "token"
    assert SpecConfig(drafter="draft-model", verifier="coupled").resolve_verifier(sampled) == "coupled"
    # Plain decoding is position-keyed sampling whatever verifier is named (none applies to it).
    assert SpecConfig(drafter="none", verifier="block").resolve_verifier(sampled) == "coupled"
    with pytest.raises(ValueError, match="verifier 'greedy' needs temperature 0.*'coupled', 'token' or 'block'"):
        SpecConfig(verifier="greedy").resolve_verifier(SamplingParams(temperature=0.7))


def test_auto_adapts_a_seeded_sampled_request_only_where_coupled_verification_keeps_its_tokens():
    seeded, unseeded = SamplingParams(temperature=0.8, seed=3), SamplingParams(temperature=0.8)
    assert SpecConfig(drafter="ngram").resolve_adaptive(seeded)  # coupled: k changes no token
    assert not SpecConfig(drafter="draft-model").resolve_adaptive(seeded)  # block: k fixed so the seed repeats
    assert SpecConfig(drafter="draft-model", verifier="coupled").resolve_adaptive(seeded)
    assert not SpecConfig(drafter="ngram", verifier="token").resolve_adaptive(seeded)
    assert SpecConfig(drafter="draft-model").resolve_adaptive(unseeded)
    assert SpecConfig(drafter="draft-model").resolve_adaptive(SamplingParams(seed=3))  # greedy
    assert not SpecConfig(drafter="draft-model").resolve_adaptive(seeded, "token")  # the verifier as given
    assert SpecConfig(drafter="draft-model").resolve_adaptive(seeded, "coupled")
    assert not SpecConfig(drafter="ngram", adaptive=False).resolve_adaptive(seeded)
    assert not SpecConfig(drafter="ngram", tree_nodes=8).resolve_adaptive(seeded)  # trees keep their size
    assert not SpecConfig(drafter="none").resolve_adaptive(unseeded)


def test_lists_become_tuples_and_params_are_hashable():
    params = SamplingParams(stop_token_ids=[1, 2], stop_strings=["\n\n"])
    assert params.stop_token_ids == (1, 2) and params.stop_strings == ("\n\n",)
    hash(params)
