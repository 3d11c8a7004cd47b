"""Experiment scripts: each ``python -m simulations.NAME --config FILE --out DIR`` writes JSON/CSV and PNGs."""
