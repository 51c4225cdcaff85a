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
    ({"verifier": "magic"}, "verifier must be one of auto, greedy, token, block"),
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
    assert SpecConfig().resolve_verifier(SamplingParams(temperature=0)) == "greedy"
    assert SpecConfig().resolve_verifier(SamplingParams(temperature=1)) == "block"
    assert SpecConfig(verifier="token").resolve_verifier(SamplingParams(temperature=0.7)) == "token"
    with pytest.raises(ValueError, match="verifier 'greedy' needs temperature 0"):
        SpecConfig(verifier="greedy").resolve_verifier(SamplingParams(temperature=0.7))


def test_lists_become_tuples_and_params_are_hashable():
    params = SamplingParams(stop_token_ids=[1, 2], stop_strings=["\n\n"])
    assert params.stop_token_ids == (1, 2) and params.stop_strings == ("\n\n",)
    hash(params)
