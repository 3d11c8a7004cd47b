"""What a tier can do: compute (FLOP/s, memory) and links (bandwidth, latency).

Units inside splitfed are SI base units: FLOP/s, bytes, bytes/s, seconds. Files
and the CLI speak the units people quote: ``mbps`` (10^6 bit/s), ``memory_mb``
(MiB, 2^20 bytes), ``rtt_ms``.

Named profiles are *effective* training throughputs, not peaks: a spec-sheet
peak times the fraction of it that fp32 PyTorch training of small CNNs reaches.
The number and where it comes from are written beside each profile; they are
estimates (order of magnitude right, not a benchmark of any one unit). Links are
the device's link to the edge; for ``edge-server`` the link is edge -> cloud.
"""

from __future__ import annotations

from dataclasses import dataclass


def mbps(v: float) -> float:
    """Megabit/s -> bytes/s."""
    return v * 1e6 / 8


@dataclass(frozen=True)
class TierProfile:
    """Compute of one tier: effective FLOP/s and memory (bytes) available for training."""

    flops: float
    memory: float


@dataclass(frozen=True)
class LinkProfile:
    """One link: up (towards the cloud) and down bandwidth in bytes/s, round-trip time in s."""

    up: float
    down: float
    rtt: float


@dataclass(frozen=True)
class DeviceProfile:
    """A named profile as written in a fleet file (file units: FLOP/s, MiB, Mbps, ms)."""

    flops: float
    memory_mb: float
    up_mbps: float | None = None
    down_mbps: float | None = None
    rtt_ms: float | None = None
    source: str = ""

    def fields(self) -> dict[str, float]:
        d = {"flops": self.flops, "memory_mb": self.memory_mb, "up_mbps": self.up_mbps,
             "down_mbps": self.down_mbps, "rtt_ms": self.rtt_ms}
        return {k: v for k, v in d.items() if v is not None}


PROFILES: dict[str, DeviceProfile] = {
    # Raspberry Pi 4B (4x Cortex-A72 @ 1.5 GHz). fp32 NEON peak 4 cores x 1.5 GHz x 8 FLOP/cycle
    # = 48 GFLOP/s; published HPL runs on the Pi 4 reach ~10-13 GFLOP/s; PyTorch CPU training of
    # small CNNs gets roughly a third of HPL -> 4 GFLOP/s (estimate). 4 GB board, ~2 GiB left for
    # training after OS and runtime. Link: home broadband to a metro edge (uplink-limited).
    "rpi4": DeviceProfile(4e9, 2048, 20, 100, 20,
                          "Pi 4B spec peak 48 GFLOP/s; HPL ~10-13 GFLOP/s; ~1/3 of HPL in PyTorch"),
    # Jetson Nano CPU (4x Cortex-A57 @ 1.43 GHz): peak 4 x 1.43 GHz x 8 = 46 GFLOP/s; A57 is
    # slower per clock than A72 -> 3 GFLOP/s effective (estimate). 4 GB shared, ~2 GiB usable.
    "jetson-nano-cpu": DeviceProfile(3e9, 2048, 50, 100, 15,
                                     "A57 peak 46 GFLOP/s; ~3/4 of the Pi 4's effective rate"),
    # Jetson Nano GPU (128 Maxwell cores @ 921 MHz): NVIDIA quotes 472 GFLOPS fp16 -> 236 GFLOP/s
    # fp32 peak; ~25% of peak in cuDNN training of small convnets -> 60 GFLOP/s (estimate).
    "jetson-nano-gpu": DeviceProfile(60e9, 2048, 50, 100, 15,
                                     "NVIDIA spec 472 GFLOPS fp16 = 236 fp32 peak; ~25% in training"),
    # Mid-range phone (e.g. Snapdragon 7-series, 4 big + 4 little cores), CPU fp32 training via
    # PyTorch/ExecuTorch: ~8 GFLOP/s (estimate); ~1 GiB an app can use before the low-memory
    # killer. LTE typical: 8 Mbps up, 30 Mbps down, 50 ms RTT.
    "phone-mid": DeviceProfile(8e9, 1024, 8, 30, 50,
                               "big-core NEON fp32 ~ 2-3x a Pi 4; LTE median-class link"),
    # Flagship phone (Snapdragon 8-series / Apple A-series): ~25 GFLOP/s fp32 training on CPU
    # (estimate, ~3x mid-range); ~2 GiB usable; 5G: 40 Mbps up, 200 down, 30 ms RTT.
    "phone-flagship": DeviceProfile(25e9, 2048, 40, 200, 30,
                                    "~3x mid-range CPU throughput; 5G sub-6 GHz typical link"),
    # Laptop (4-core x86 with AVX2+FMA, ~3 GHz): peak 4 x 3 GHz x 32 = 384 GFLOP/s; PyTorch CPU
    # training reaches ~20% -> 80 GFLOP/s (estimate; `splitfed profile` prints this host's rate).
    # 4 GiB for training; Wi-Fi + fibre: 50 Mbps up, 200 down, 10 ms.
    "laptop": DeviceProfile(80e9, 4096, 50, 200, 10,
                            "AVX2 peak 384 GFLOP/s; ~20% in PyTorch CPU training"),
    # Edge server with one NVIDIA T4: 8.1 TFLOP/s fp32 peak (NVIDIA data sheet); ~40% in
    # training -> 3.2 TFLOP/s; 16 GB card. Link to the cloud: 1 Gbit/s, 20 ms.
    "edge-server": DeviceProfile(3.2e12, 16384, 1000, 1000, 20,
                                 "NVIDIA T4 data sheet 8.1 TFLOP/s fp32; ~40% in training"),
    # Cloud GPU, NVIDIA A100 40 GB: 19.5 TFLOP/s fp32 (156 TF32) peak; ~50% of fp32 peak in
    # training -> 10 TFLOP/s; 40 GB.
    "cloud-gpu": DeviceProfile(10e12, 40960, None, None, None,
                               "NVIDIA A100 data sheet 19.5 TFLOP/s fp32; ~50% in training"),
}
