"""What a node says about itself: its Flower node config, read once and checked.

A deployed node is configured by hand (``flower-supernode --node-config
'partition-id=0 num-partitions=10 edge-address="edge:7000"'``). Flower passes
any key through, so a misspelt one (``edge_address``, ``datafile``) used to be
ignored without a word: the node then trained on a partition instead of its own
file, or through the run's edge instead of its own address. Here an unknown key
is refused with the nearest known one, every value is type-checked, and the
files a node names must exist on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from splitfed.errors import ConfigError, unknown_key
from splitfed.transport.address import parse_address

EXAMPLE = "flower-supernode --node-config 'partition-id=0 num-partitions=2'"


@dataclass(frozen=True)
class NodeConfig:
    partition_id: int  # names the client (client<id>) and, without a data-file, its partition
    num_partitions: int  # not needed with a data-file
    device_profile: str = ""  # its device class in the run's fleet ("": the fleet's by partition)
    edge_address: str = ""  # how this node reaches the edge ("": the run's address)
    data_file: str = ""  # a .npz of its own (x_train, y_train), trained on whole
    tls_ca: str = ""  # files on this node, used instead of the run's paths
    tls_cert: str = ""
    tls_key: str = ""
    token_file: str = ""
    torch_device: str = "cpu"  # where this device computes: cpu, cuda, cuda:N (a Jetson's GPU)

    def tls_files(self, ca: str, cert: str, key: str) -> tuple[str, str, str]:
        """The (tls-ca, tls-cert, tls-key) this node connects with, given the run's: its own as a whole when it
        names any (a tls-ca alone: it presents no certificate), else the run's (one host: the coordinator's
        files). Taken one by one, a node's tls-ca beside the run's certificate sent it looking for the
        coordinator's files, which only the coordinator's host has."""
        return (self.tls_ca, self.tls_cert, self.tls_key) if self.tls_ca or self.tls_cert else (ca, cert, key)

    @classmethod
    def parse(cls, cfg: Mapping[str, Any]) -> NodeConfig:
        keys = {f.name.replace("_", "-"): f for f in fields(cls)}
        unknown = sorted(set(cfg) - set(keys))
        if unknown:
            raise unknown_key(unknown[0], keys, "node config")
        vals: dict[str, Any] = {}
        for key, f in keys.items():
            if key not in cfg:
                continue
            v = cfg[key]
            if f.type == "int":
                digits = str(v).strip().removeprefix("-")
                if isinstance(v, bool) or not isinstance(v, int | str) or not (digits.isascii() and digits.isdigit()):
                    raise ConfigError(f"node config: {key} must be an integer, got {v!r}")
                v = int(v)
            elif not isinstance(v, str):
                raise ConfigError(f"node config: {key} must be a string (quote it: {key}=\"...\"), got {v!r}")
            vals[f.name] = v
        if "partition-id" not in cfg or ("num-partitions" not in cfg and not vals.get("data_file")):
            raise ConfigError(f"node config needs integer partition-id and num-partitions ({EXAMPLE}; with a "
                              "data-file of its own, partition-id alone)")
        if vals["partition_id"] < 0:  # it names the client (client<id>) with or without a partition to pick
            raise ConfigError(f"node config: partition-id must be >= 0, got {vals['partition_id']}")
        if "num-partitions" not in cfg:  # its own data: no partition to pick, the id only names the client
            vals["num_partitions"] = vals["partition_id"] + 1
        node = cls(**vals)
        if node.num_partitions < 1:
            raise ConfigError(f"node config: num-partitions must be >= 1, got {node.num_partitions}")
        if node.edge_address:
            parse_address(node.edge_address, "node config: edge-address")
        from splitfed.engine.compute import torch_device

        torch_device(node.torch_device, "node config: torch-device")  # read on the node: it must have that GPU
        if node.partition_id >= node.num_partitions:  # a negative one was refused above
            raise ConfigError(f"node config: partition-id {node.partition_id} is outside 0..{node.num_partitions - 1} "
                              f"(num-partitions {node.num_partitions})")
        if bool(node.tls_cert) != bool(node.tls_key):
            raise ConfigError("node config: tls-cert and tls-key go together (the node's certificate and its key)")
        if node.tls_cert and not node.tls_ca:  # its files are a set (tls_files): the run's CA is not taken with them
            raise ConfigError("node config: tls-cert needs tls-ca (the CA this node verifies its edge with): a node "
                              "naming any tls-* file connects with its own files alone, not the run's")
        for key in ("data-file", "tls-ca", "tls-cert", "tls-key", "token-file"):
            path = getattr(node, key.replace("-", "_"))
            if path and not Path(path).is_file():
                what = "a folder, not a file" if Path(path).is_dir() else "no such file on this node"
                raise ConfigError(f"node config: {key} {path}: {what}")
        return node
