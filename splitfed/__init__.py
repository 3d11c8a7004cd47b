"""splitfed: split + federated learning across a chain of tiers (device, edge, cloud)."""

__version__ = "0.1.0"
