"""What a mutation run of ``splitfed.transport.describe`` found unwatched: an idle release under a second is
kept as said (not read as "never"), a tier that releases exactly at the round timeout is taken, and with one
codec per link each tier's forwarding codec is checked against its own onward link, named by its number."""

from __future__ import annotations

import dataclasses

import pytest

from splitfed.errors import ConfigError
from splitfed.transport.describe import TierInfo, check_chain
from tests.test_describe import chain_infos


def test_an_idle_release_under_a_second_survives_its_message() -> None:
    _, (info,) = chain_infos(1)
    assert TierInfo.from_pb(dataclasses.replace(info, idle_release_s=0.5).to_pb()).idle_release_s == 0.5


def test_a_tier_that_releases_at_the_round_timeout_is_taken() -> None:
    addrs, infos = chain_infos(1)
    check_chain(addrs, [dataclasses.replace(infos[0], idle_release_s=600.0)], round_timeout_s=600.0)
    with pytest.raises(ConfigError, match="releases segments idle for 599.9 s, less than this run's round-timeout-s"):
        check_chain(addrs, [dataclasses.replace(infos[0], idle_release_s=599.9)], round_timeout_s=600.0)


def test_each_tier_forwards_with_the_codec_of_its_own_onward_link() -> None:
    """``none,int8,fp16``: the device's link, then the first tier's onward link (int8), then the second's
    (fp16)."""
    addrs, infos = chain_infos(3)
    good = [dataclasses.replace(infos[0], next_compress="int8"), dataclasses.replace(infos[1], next_compress="fp16"),
            infos[2]]
    check_chain(addrs, good, compress="none,int8,fp16")
    swapped = [dataclasses.replace(good[0], next_compress="fp16"), dataclasses.replace(good[1], next_compress="int8"),
               infos[2]]
    with pytest.raises(ConfigError) as e:
        check_chain(addrs, swapped, compress="none,int8,fp16")
    assert ("tier t0 at host0:7000 sends to its next tier with --compress fp16, but this run compresses that link "
            "(link 2 of the chain) with int8") in str(e.value)
    assert ("tier t1 at host1:7001 sends to its next tier with --compress int8, but this run compresses that link "
            "(link 3 of the chain) with fp16") in str(e.value)


def test_a_tier_that_ends_the_chain_too_early_is_told_the_next_address() -> None:
    addrs, infos = chain_infos(3)
    early = [infos[0], dataclasses.replace(infos[1], next_address="", next_instance=""), infos[2]]
    with pytest.raises(ConfigError, match=r"tier t1 at host1:7001 ends the chain \(no --next\), but tier-addresses "
                                          r"continue to host2:7002: start it with --next host2:7002"):
        check_chain(addrs, early)
    elsewhere = [infos[0], dataclasses.replace(infos[1], next_instance="other"), infos[2]]
    with pytest.raises(ConfigError, match=r"tier t1 at host1:7001 forwards to host2:7002, which is not the tier at "
                                          r"host2:7002 \(t2\)"):
        check_chain(addrs, elsewhere)


def test_a_codec_no_splitfed_knows_is_named_as_the_tier_gave_it() -> None:
    """A tier of another make (or version) forwarding with a codec this one cannot parse: refused, by its name."""
    addrs, infos = chain_infos(2)
    odd = [dataclasses.replace(infos[0], next_compress="zstd"), infos[1]]
    with pytest.raises(ConfigError, match="sends to its next tier with --compress zstd, but this run compresses "
                                          "every link with none"):
        check_chain(addrs, odd, compress="none")
