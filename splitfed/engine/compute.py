"""Where a server tier computes: the CPU, or one CUDA GPU of its machine.

Tensors cross the wire on the CPU (the codec and the boundary checks work there):
a tier on a GPU moves each incoming activation, label and gradient to it, and
each outgoing one back. The option is named after torch's word (``cuda:1``)
because "device" in splitfed is the client's tier.
"""

from __future__ import annotations

import os

import torch

from splitfed.errors import ConfigError

CHOICES = "cpu, cuda or cuda:N"


def torch_device(text: str, what: str = "--torch-device", *, here: bool = True) -> torch.device:
    """The torch device ``text`` names, refused in one line unless this machine can compute on it (``here``
    False: only its form is checked, e.g. a setting read where the tiers do not run)."""
    try:
        dev = torch.device(text.strip())
    except (RuntimeError, ValueError):
        raise ConfigError(f"{what} {text!r}: not a device torch knows; use {CHOICES}") from None
    if dev.type == "cpu":
        if dev.index not in (None, 0):
            raise ConfigError(f"{what} {text!r}: the CPU has no index; use cpu")
        return torch.device("cpu")
    if dev.type != "cuda":
        raise ConfigError(f"{what} {text!r}: splitfed computes on {CHOICES}, not {dev.type}")
    if not here:
        return dev
    if not torch.cuda.is_available():
        build = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ConfigError(f"{what} {text}: this machine has no CUDA GPU that torch can use (torch "
                          f"{torch.__version__}, {build}); use cpu")
    count = torch.cuda.device_count()
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    if index >= count:
        raise ConfigError(f"{what} {text}: this machine has {count} CUDA GPU(s): cuda:0"
                          + (f" .. cuda:{count - 1}" if count > 1 else ""))
    return torch.device("cuda", index)


def describe(dev: torch.device) -> str:
    """``cpu``, or ``cuda:0 (NVIDIA H200)``: what a tier's log and status name."""
    return f"{dev} ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else str(dev)


def free_memory(dev: torch.device) -> tuple[int, int]:
    """(free, total) bytes of ``dev`` now: the GPU's (``cudaMemGetInfo``) or this host's (MemAvailable: what a
    new process can take without swapping), the share a device's training can use that a fleet entry records."""
    if dev.type == "cuda":
        free, total = torch.cuda.mem_get_info(dev)
        return int(free), int(total)
    import psutil

    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


def memory_bytes(dev: torch.device) -> int:
    """The memory of ``dev``: the GPU's own, or the machine's (what a tier's segments share)."""
    if dev.type == "cuda":
        return int(torch.cuda.get_device_properties(dev).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
