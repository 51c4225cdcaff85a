"""Which device models, caches and sampling live on: the `device` setting resolved.

"auto" is the first CUDA device when PyTorch sees one, else the CPU. Only the
name is checked by SpecConfig (a string test, no CUDA needed); whether the device
exists is checked here, when something is about to be placed on it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DEVICE_WORDS = "auto, cpu, cuda or cuda:N"
_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


class DeviceError(ValueError):
    """A device that this machine or this PyTorch build cannot provide."""


def is_device_name(text: object) -> bool:
    """Whether `text` is a device setting specwise accepts (auto, cpu, cuda, cuda:N)."""
    return isinstance(text, str) and _PATTERN.match(text) is not None


def is_cuda_name(text: str) -> bool:
    return text.startswith("cuda")


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """The torch.device for a setting; raises DeviceError, naming the fix, when it is not here."""
    import torch  # here, not at the top: SpecConfig checks device names without loading PyTorch

    if isinstance(name, torch.device):
        name = str(name)
    name = name or "auto"
    if not is_device_name(name):
        raise DeviceError(f"device must be {DEVICE_WORDS}; got {name!r}")
    if name == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise DeviceError(f"device {name!r} asked for, but PyTorch ({torch.__version__}, {build}) sees no CUDA "
                          "device; install the CUDA build of PyTorch (docs/GPU.md) or use --device cpu")
    index = int(name.split(":")[1]) if ":" in name else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise DeviceError(f"device {name!r} asked for, but this machine has {torch.cuda.device_count()} CUDA "
                          f"device(s) (cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    return torch.device("cuda", index)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (timings of CUDA passes need it; a no-op on the CPU)."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
