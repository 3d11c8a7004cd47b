"""The split engine: tiers, the device runner, links, rounds per variant, and verification."""
