"""Profiles: what each block of a model costs, what each tier and link can do, and fleets of devices."""

from splitfed.profile.devices import PROFILES, DeviceProfile, LinkProfile, TierProfile, mbps
from splitfed.profile.fleet import Client, Drift, Fleet, load_fleet, parse_fleet, shipped_fleets
from splitfed.profile.profiler import ModelProfile, profile_model
from splitfed.units import MIB

__all__ = [
    "MIB",
    "PROFILES",
    "Client",
    "DeviceProfile",
    "Drift",
    "Fleet",
    "LinkProfile",
    "ModelProfile",
    "TierProfile",
    "load_fleet",
    "mbps",
    "parse_fleet",
    "profile_model",
    "shipped_fleets",
]
