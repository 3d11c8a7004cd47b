"""The one cost model: per-client round times, shared-tier loads, memory and the makespan."""

from splitfed.cost.model import (
    Assignment,
    ClientCost,
    Cuts,
    OptionTable,
    RoundCost,
    Scenario,
    client_cost,
    client_key,
    cut_options,
    evaluate,
    move_cost,
    move_costs,
    option_table,
    round_time,
)

__all__ = [
    "Assignment",
    "ClientCost",
    "Cuts",
    "OptionTable",
    "RoundCost",
    "Scenario",
    "client_cost",
    "client_key",
    "cut_options",
    "evaluate",
    "move_cost",
    "move_costs",
    "option_table",
    "round_time",
]
