"""The methods a benchmark compares, behind one interface: prompt ids in, tokens and timings out.

Hugging Face baselines: `hf-generate` (the target alone, the reference for every
speedup), `hf-assisted` (assisted generation with the same drafter model) and
`hf-prompt-lookup`. specwise: `specwise-ar` (drafter "none": plain decoding
through our runner) and any configuration written as
`specwise:drafter=draft-model,k=5`: the keys are SpecConfig's settings (field names, or the
short keys quantize= and vocab=; tree_shape written 3x2x1), plus model=, head= (eagle) and
label=; unset keys take the command line's --drafter, --k, ... values. adaptive= takes 1, 0
or auto; a run settles auto for its sampling settings (SpecConfig.resolve_adaptive: fixed k
where it samples with a seed under a verifier other than coupled, else adaptive k), so that a
label says which k policy ran.

Timing is `time.perf_counter` around the generate call only. Hugging Face does not
report its drafts, so for its methods `steps` counts the target's forward passes
(a hook) and τ, α and the per-phase seconds are unknown (None).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import torch

from specwise.api import SpecDecoder
from specwise.bench.types import BenchModels, Method, MethodOutput
from specwise.config import SamplingParams, SpecConfig, spec_settings
from specwise.drafters.base import RememberingDrafter, forget_prompts
from specwise.drafters.scope import sharing_scope
from specwise.store.loading import LoadedModel
from specwise.settings import SettingInfo, describe, method_label

HF_GENERATE = "hf-generate"
HF_ASSISTED = "hf-assisted"
HF_PROMPT_LOOKUP = "hf-prompt-lookup"
SPECWISE_AR = "specwise-ar"
BUILTIN_METHODS = (HF_GENERATE, HF_ASSISTED, HF_PROMPT_LOOKUP, SPECWISE_AR)
DEFAULT_PROMPT_LOOKUP_TOKENS = 10  # Hugging Face's documented example value


class _ForwardCounter:
    """Counts calls of a module's forward while active (hooks cost microseconds)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module, self.calls, self._handle = module, 0, None

    def _hook(self, *_) -> None:
        self.calls += 1

    def __enter__(self) -> "_ForwardCounter":
        self._handle = self.module.register_forward_pre_hook(self._hook)
        return self

    def __exit__(self, *_) -> None:
        self._handle.remove()


def hf_generate_kwargs(sampling: SamplingParams, eos_token_ids: Sequence[int], tokenizer=None) -> dict:
    """generate() arguments that make Hugging Face decode as specwise does: same processors, same stops.

    Every processor is set explicitly, so a model's own generation_config defaults
    (some ship top_k=20, temperature=0.7) cannot change what is compared.
    """
    eos = sorted(set(eos_token_ids) | set(sampling.stop_token_ids))
    kwargs = dict(max_new_tokens=sampling.max_new_tokens, min_new_tokens=0, num_beams=1,
                  repetition_penalty=sampling.repetition_penalty, no_repeat_ngram_size=0,
                  eos_token_id=eos or None, pad_token_id=eos[0] if eos else None)
    if sampling.greedy:
        kwargs.update(do_sample=False)
    else:
        kwargs.update(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k,
                      top_p=sampling.top_p, typical_p=1.0)
    if sampling.stop_strings:
        kwargs.update(stop_strings=list(sampling.stop_strings), tokenizer=tokenizer)
    return kwargs


class HFMethod:
    """model.generate() on the target, with optional extra arguments (assistant, prompt lookup)."""

    family = "hf"
    weights = "dense"

    def __init__(self, label: str, description: str, target: LoadedModel, eos_token_ids: Sequence[int],
                 extra: dict | None = None) -> None:
        self.label, self.description = label, description
        self.target, self.eos_token_ids, self.extra = target, tuple(eos_token_ids), dict(extra or {})

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> MethodOutput:
        model = self.target.model
        kwargs = hf_generate_kwargs(sampling, self.eos_token_ids, self.target.tokenizer) | self.extra
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=model.device)
        mask = torch.ones_like(ids)
        if not sampling.greedy and sampling.seed is not None:
            torch.manual_seed(sampling.seed)  # HF samples from the global generator
        with _ForwardCounter(model) as counter, torch.inference_mode():
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=mask, **kwargs)
            seconds = time.perf_counter() - start
        return MethodOutput(out[0, ids.shape[1]:].tolist(), seconds, counter.calls)


class SpecwiseMethod:
    """specwise's engine with one SpecConfig."""

    family = "specwise"

    def __init__(self, label: str, description: str, decoder: SpecDecoder, spec: SpecConfig) -> None:
        self.label, self.description, self.decoder, self.spec = label, description, decoder, spec
        self.weights = decoder.resolve_format(spec.target_format, spec.device)
        # build runner and drafter now, not in a timed call
        decoder.runner_for(spec.runner, spec.target_format, spec.device, compile_step=spec.compile_step)
        drafter = decoder.drafter_for(spec)
        # A drafter that remembers its generations drafts a rerun from the first run's answer: a
        # contended timing of it cannot be taken again (the harness keeps the first, flagged).
        self.repeatable = not (isinstance(drafter, RememberingDrafter) and drafter.remembers_requests)

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> MethodOutput:
        # Cold, like the target (re-read every time) and Hugging Face's methods: methods that share
        # a drafter (same model and quantization) would otherwise find the prompt already read.
        forget_prompts(self.decoder.drafter_for(self.spec))
        # Earlier requests are shared per method (suffix drafter): methods sharing a drafter must not
        # draft from each other's answers to the same prompt.
        with sharing_scope(self.label):
            start = time.perf_counter()
            result = self.decoder.generate(list(prompt_ids), sampling, spec=self.spec)
            seconds = time.perf_counter() - start
        return MethodOutput(list(result.token_ids), seconds, result.stats.steps, result.stats)


# --------------------------------------------------------------------------- parsing

# Keys of a method spec that are not SpecConfig settings.
_EXTRA_KEYS = ("model", "head", "label")


def _setting_keys() -> dict[str, SettingInfo]:
    return {key: info for info in spec_settings() for key in info.keys}


def parse_specwise_method(text: str, base: SpecConfig) -> tuple[SpecConfig, str | None, str | None]:
    """`specwise:drafter=ngram,k=8` -> (SpecConfig over `base`, drafter model or None, label or None).

    Keys are SpecConfig's field names (or their short keys, e.g. quantize, vocab), parsed and
    checked by the same declarations as the CLI's flags; tree shapes are written 3x2x1 since
    commas separate the options.
    """
    if text != "specwise" and not text.startswith("specwise:"):
        raise ValueError(f"a specwise method is written specwise:key=value,...; got {text!r}")
    body = text[len("specwise:"):] if ":" in text else ""
    settings = _setting_keys()
    fields: dict[str, object] = {}
    options = dict(base.drafter_options)
    model = label = None
    for item in filter(None, (part.strip() for part in body.split(","))):
        key, sep, value = item.partition("=")
        key, value = key.strip().replace("-", "_"), value.strip()
        if not sep or (key not in settings and key not in _EXTRA_KEYS):
            raise ValueError(f"bad method option {item!r} in {text!r}; use key=value with key one of "
                             f"{', '.join(list(settings) + list(_EXTRA_KEYS))}")
        if key in settings:
            fields[settings[key].name] = settings[key].parse(value)
        elif key == "model":
            model = options["model"] = value
        elif key == "head":  # the eagle drafter's trained head (default: $SPECWISE_HOME/heads/<target>/)
            options["head"] = value
        else:
            label = value
    return dataclasses.replace(base, **fields, drafter_options=options), model, label


def spec_label(spec: SpecConfig, model: str | None = None, base: SpecConfig | None = None) -> str:
    """A short readable name from the settings' declared label parts: specwise-ngram-k4,
    specwise-draft-model-adaptive1-10-block, specwise-draft-model-tree16d4b3 (nodes, depth, branching);
    plain decoding through the engine is specwise-ar."""
    base = base or SpecConfig()
    label = method_label(spec, base, model)
    return SPECWISE_AR + label.removeprefix("specwise-none") if spec.drafter == "none" else label


def describe_spec(spec: SpecConfig, model: str | None) -> str:
    extra = f", model {model}" if model else ""
    return f"specwise{extra}: {describe(spec)}"


def build_method(name: str, models: BenchModels, base_spec: SpecConfig,
                 prompt_lookup_tokens: int = DEFAULT_PROMPT_LOOKUP_TOKENS,
                 sampling: SamplingParams | None = None) -> Method:
    """A method from its command-line name: a built-in name or a specwise:... configuration.
    sampling: the run's sampling settings, which settle adaptive "auto" (None: each generation
    settles it, and the label says auto)."""
    decoder = models.decoder
    eos = decoder.eos_token_ids
    if name == HF_GENERATE:
        return HFMethod(name, "Hugging Face generate() on the target alone", decoder.target_model("dense"), eos)
    if name == HF_ASSISTED:
        if models.drafter is None:
            raise ValueError("hf-assisted needs a drafter model (--drafter-model)")
        return HFMethod(name, f"Hugging Face assisted generation, assistant {models.drafter.name} "
                              f"(its generation_config: {assistant_settings(models.drafter)})",
                        decoder.target_model("dense"), eos, {"assistant_model": models.drafter.model})
    if name == HF_PROMPT_LOOKUP:
        if prompt_lookup_tokens < 1:
            raise ValueError(f"prompt lookup tokens must be >= 1; got {prompt_lookup_tokens}")
        return HFMethod(name, f"Hugging Face prompt lookup, prompt_lookup_num_tokens={prompt_lookup_tokens}",
                        decoder.target_model("dense"), eos, {"prompt_lookup_num_tokens": prompt_lookup_tokens})
    if name == SPECWISE_AR:
        spec = _resolved(dataclasses.replace(base_spec, drafter="none", adaptive=False), decoder)
        return SpecwiseMethod(spec_label(spec), f"specwise engine, plain decoding: {describe(spec)}", decoder, spec)
    if name == "llamacpp-generate":
        from specwise.bench.llamacpp import LlamaCppMethod

        return LlamaCppMethod(models.decoder.target.name, eos, torch.get_num_threads())
    if name == "ikllamacpp-generate":
        from specwise.bench.ikllamacpp import IkLlamaCppMethod

        return IkLlamaCppMethod(models.decoder.target.name, eos, torch.get_num_threads())
    if name == "specwise" or name.startswith("specwise:"):
        spec, model, label = parse_specwise_method(name, base_spec)
        spec = _resolved(spec, decoder, sampling)
        return SpecwiseMethod(label or spec_label(spec, model, base_spec), describe_spec(spec, model),
                              decoder, spec)
    raise ValueError(f"unknown method {name!r}; built-in: {', '.join(BUILTIN_METHODS)}, llamacpp-generate, "
                     "ikllamacpp-generate, "
                     "or specwise:drafter=NAME,k=N,...")


def _resolved(spec: SpecConfig, decoder: SpecDecoder, sampling: SamplingParams | None = None) -> SpecConfig:
    """The spec with target_format "auto" made explicit, so a label says which weights ran, and with
    adaptive "auto" settled for the run's sampling settings where they are given."""
    adaptive = spec.adaptive if sampling is None else spec.resolve_adaptive(sampling)
    return dataclasses.replace(spec, target_format=decoder.resolve_format(spec.target_format, spec.device),
                               adaptive=adaptive)


def assistant_settings(drafter: LoadedModel) -> str:
    """The assisted-generation settings HF will take from the assistant's generation_config."""
    config = drafter.model.generation_config
    defaults = config._get_default_generation_params() if hasattr(config, "_get_default_generation_params") else {}
    names = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    values = {n: getattr(config, n, None) if getattr(config, n, None) is not None else defaults.get(n)
              for n in names}
    return ", ".join(f"{n}={v}" for n, v in values.items())


def sweep_k(names: Sequence[str], ks: Sequence[int],
            base_spec: SpecConfig) -> tuple[list[str], dict[str, list[tuple[int, str]]]]:
    """Each specwise configuration (non-adaptive) once per k; other names unchanged.

    Returns the new names and, per swept configuration, its (k, name) pairs. With
    no specwise configuration among the names, the command line's own (--drafter,
    --k, ...) is swept. A configuration with adaptive "auto" (the default) is swept
    with adaptive=0: a fixed k each.
    """
    specs = [n for n in names if n == "specwise" or n.startswith("specwise:")]
    if not specs:
        specs = ["specwise"]
        names = list(names) + specs
    out: list[str] = []
    groups: dict[str, list[tuple[int, str]]] = {}
    for name in names:
        if name not in specs:
            out.append(name)
            continue
        spec, _, label = parse_specwise_method(name, base_spec)
        if spec.adaptive is True:
            raise ValueError(f"--sweep-k needs fixed-k configurations; {name!r} is adaptive (adaptive=0 fixes k)")
        if label is not None:
            raise ValueError(f"--sweep-k names its methods itself; drop label= from {name!r}")
        separator = "," if ":" in name else ":"
        fixed = ",adaptive=0" if spec.adaptive is not False else ""
        groups[name] = [(k, f"{name}{separator}k={k}{fixed}") for k in ks]
        out.extend(swept for _, swept in groups[name])
    return out, groups
