"""Simulation: a fleet of virtual clients in Flower's simulation engine, real tier processes."""
