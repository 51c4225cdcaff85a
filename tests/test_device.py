"""The device setting: resolved once, refused clearly, and every part runs on the device it names.

Tests parametrized over DEVICES run on the CPU everywhere and on CUDA where PyTorch sees a
device (marked gpu: `pytest -m gpu` runs them alone on a GPU machine).
"""

from __future__ import annotations

import pytest
import torch

from specwise import SamplingParams, SpecConfig, SpecDecoder
from specwise.device import DeviceError, resolve_device
from specwise.runners.lean import LeanRunner
from specwise.store.loading import LoadedModel
from specwise.settings import ConfigError
from specwise.testing import tiny_loaded, tiny_model, tiny_tokenizer

from helpers import hf_greedy

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs CUDA")])]


def test_auto_is_cuda_when_present_else_cpu():
    assert resolve_device("auto").type == ("cuda" if CUDA else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(CUDA, reason="checks the message on a machine without CUDA")
def test_cuda_without_cuda_names_the_fix():
    with pytest.raises(DeviceError, match="sees no CUDA device.*CUDA build of PyTorch.*--device cpu"):
        resolve_device("cuda")
    with pytest.raises(DeviceError, match="no CUDA"):
        SpecDecoder(tiny_loaded(), SpecConfig(device="cuda:0"))


def test_bad_device_names_are_refused_by_the_setting():
    for bad in ("gpu", "cuda:", "cuda:x", "CPU", "mps"):
        with pytest.raises(ConfigError, match="device must be auto, cpu, cuda or cuda:N"):
            SpecConfig(device=bad)


def test_cpu_kernels_are_refused_on_cuda_with_the_fix():
    with pytest.raises(ConfigError, match="target_format 'gguf'.*CPU kernels.*'dense'"):
        SpecConfig(device="cuda", target_format="gguf")
    with pytest.raises(ConfigError, match="draft_quantize 'int8'.*CPU kernels"):
        SpecConfig(device="cuda:1", drafter="draft-model", draft_quantize="int8")
    SpecConfig(device="cuda", target_format="auto")  # auto runs such a target dense there


def test_a_loaded_model_stays_where_it_is():
    loaded = tiny_loaded()
    decoder = SpecDecoder(loaded, SpecConfig(device="cpu"))
    assert decoder.device == torch.device("cpu") and decoder.runner.device == torch.device("cpu")


def test_compile_step_needs_the_lean_runner():
    with pytest.raises(ValueError, match="compile_step.*runner 'lean' or 'auto'"):
        tiny_loaded().runner("hf", compile_step=True)


def _on(device: str, seed: int = 0) -> LoadedModel:
    return LoadedModel(name=f"tiny-{seed}-{device}", path=None, model=tiny_model(seed).to(device),
                       tokenizer=tiny_tokenizer())


@pytest.mark.parametrize("device", DEVICES)
def test_lean_runner_on_the_device_matches_hugging_face(device):
    loaded = _on(device)
    runner = LeanRunner(loaded.model)
    ids = [5, 9, 14, 5, 9, 22, 31]
    runner.reset()
    runner.forward(ids[:4], logits=False)
    block = runner.forward(ids[4:])
    with torch.inference_mode():
        expected = loaded.model(torch.tensor([ids], device=device)).logits[0, 4:]
    assert block.device.type == device
    torch.testing.assert_close(block, expected.float(), rtol=1e-4, atol=1e-4)
    runner.rollback(2)
    tree = runner.forward_tree([22, 40, 41], [-1, 0, 0])
    assert tree.shape == (3, runner.vocab_size) and tree.device.type == device


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", [SpecConfig(drafter="ngram", k=4), SpecConfig(drafter="draft-model", k=3),
                                  SpecConfig(drafter="draft-model", tree_nodes=6)],
                         ids=["ngram", "draft-model", "tree"])
def test_greedy_speculation_on_the_device_is_plain_greedy_decoding(device, spec):
    target, drafter = _on(device, 0), _on(device, 1)
    decoder = SpecDecoder(target, dataclass_replace(spec, device=device), drafter_model=drafter)
    prompt = [5, 9, 14, 5, 9, 14, 5, 9]
    result = decoder.generate(prompt, SamplingParams(max_new_tokens=20))
    plain = decoder.generate(prompt, SamplingParams(max_new_tokens=20), spec=SpecConfig(drafter="none", device=device))
    assert result.token_ids == plain.token_ids and result.finish_reason == plain.finish_reason
    # These weights reach no EOS within 20 tokens of the prompt: a cut or empty output fails here.
    assert len(result.token_ids) == 20 and result.finish_reason == "length"
    if device == "cpu":
        assert result.token_ids == hf_greedy(target.model, prompt, 20)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("verifier", ["token", "block"])
def test_sampling_on_the_device_is_seeded_and_reproducible(device, verifier):
    target, drafter = _on(device, 0), _on(device, 1)
    decoder = SpecDecoder(target, SpecConfig(drafter="draft-model", k=3, verifier=verifier, device=device),
                          drafter_model=drafter)
    sampling = SamplingParams(temperature=1.0, top_k=8, seed=3, max_new_tokens=16, repetition_penalty=1.1)
    first = decoder.generate([5, 9, 14], sampling).token_ids
    assert decoder.generate([5, 9, 14], sampling).token_ids == first
    if device == "cuda":  # the same draws on the host: the CPU run decides the same (but for rounding ties)
        on_cpu = SpecDecoder(_on("cpu", 0), SpecConfig(drafter="draft-model", k=3, verifier=verifier),
                             drafter_model=_on("cpu", 1))
        assert on_cpu.generate([5, 9, 14], sampling).token_ids == first


def dataclass_replace(spec: SpecConfig, **changes) -> SpecConfig:
    import dataclasses

    return dataclasses.replace(spec, **changes)


@pytest.mark.slow  # torch.compile builds a graph per block size: tens of seconds on a small CPU
def test_compiled_step_computes_the_eager_logits_and_greedy_output():
    from specwise.runners.torch_step import CompiledLeanRunner

    model = tiny_model(0)
    eager, compiled = LeanRunner(model), CompiledLeanRunner(model)
    ids = list(range(5, 25))
    for runner in (eager, compiled):
        runner.reset()
        runner.forward(ids[:10], logits=False)
    torch.testing.assert_close(compiled.forward(ids[10:13]), eager.forward(ids[10:13]), rtol=1e-4, atol=1e-4)
    eager.rollback(2)
    compiled.rollback(2)
    torch.testing.assert_close(compiled.forward(ids[11:14]), eager.forward(ids[11:14]), rtol=1e-4, atol=1e-4)
    decoder = SpecDecoder(LoadedModel("tiny-0", None, model, tiny_tokenizer()),
                          SpecConfig(drafter="ngram", k=2, runner="lean", compile_step=True))
    assert isinstance(decoder.runner, CompiledLeanRunner)
    prompt = [5, 9, 14, 5, 9, 14, 5, 9]
    result = decoder.generate(prompt, SamplingParams(max_new_tokens=12))
    assert result.token_ids == hf_greedy(model, prompt, 12) and len(result.token_ids) == 12
