"""Flower integration: what the ServerApp and ClientApp share.

Flower carries the control of a round (who trains, with which cuts, which
weights) as records; the per-batch activations go over the tier servers' gRPC
links, never through Flower (a Flower message costs ~100 ms in simulation and
seconds in deployment). The modules here are plain typed code with no Flower
app object in them, so tests and the simulate runner use them directly.
"""
