"""Flower integration: what the ServerApp and ClientApp share.

Flower carries the control of a round (who trains, with which cuts, which
weights) as records; the per-batch activations go over the tier servers' gRPC
links, never through Flower (a Flower message costs ~100 ms in simulation and
seconds in deployment). The modules here are plain typed code with no Flower
app object in them, so tests and the simulate runner use them directly.
"""

import os as _os

# splitfed never phones home: Flower's telemetry and update check are off unless asked for
_os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
_os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
