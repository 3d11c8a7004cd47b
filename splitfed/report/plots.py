"""Figures of runs and experiments, as PNG files.

Built on ``matplotlib.figure.Figure`` without pyplot: no global backend or
figure state, so plotting is safe in servers, tests and worker processes, and
needs no display (the Agg canvas is used for PNG output). Every figure has a
title, labelled axes and a legend (the heatmap a colour bar instead), because
these are meant to go into a paper or a README as they are.

Two layers: :func:`line_plot` draws any set of named series (the experiment
scripts use it for their own figures); the ``*_plot`` functions draw the
standard views of runs (:class:`~splitfed.report.runs.Run`) with it.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import groupby
from numbers import Integral
from pathlib import Path
from textwrap import TextWrapper
from typing import Any

import numpy as np
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, MaxNLocator

from splitfed.jsonio import draft_of
from splitfed.report.runs import MEASURED, Run, clock_of
from splitfed.report.table import MB, shown

_CLOCK = {"sim": "simulated", "measured": "measured", "sim/measured": "simulated or measured"}  # clock_of's words

DPI = 120
_MARKERS = ("o", "s", "^", "D", "v", "x", "P", "*")
_DASHES = ("-", "--", "-.", ":")


@dataclass(frozen=True)
class Series:
    """One line: its legend label, points, and optional matplotlib style (``marker``, ``linestyle``...)."""

    label: str
    x: Sequence[float]
    y: Sequence[float]
    style: dict[str, Any] = field(default_factory=dict)


def line_plot(series: Sequence[Series], path: str | Path, *, title: str, xlabel: str, ylabel: str,
              logx: bool = False, logy: bool = False, hline: float | None = None, hline_label: str = "",
              vline: float | None = None, vline_label: str = "", integer_x: bool = False, note: str = "",
              size: tuple[float, float] = (7.0, 4.5), vlines: Sequence[tuple[float, str]] = ()) -> Path:
    """Draw ``series`` as lines on one labelled axes; optional reference lines and a footnote (``vlines``:
    more vertical lines, each (x, label), drawn as ``vline`` is).

    Series without a point to draw (none, or none with both coordinates finite: a run whose every round
    diverged) are left out of the plot and its legend, and named in the footnote: never a legend entry
    without a line.
    """
    fig = Figure(figsize=size, dpi=DPI)
    ax = fig.add_subplot()
    empty = [s.label for s in series if not _drawable(s)]
    if empty:
        note = "; ".join(x for x in (note, f"no points: {', '.join(empty)}") if x)
    for i, s in enumerate(series):
        if not _drawable(s):
            continue
        # distinct markers and dashes, so that equal curves (e.g. two policies that agree) stay visible; each
        # series styled by its place in ``series``, one left out or not: a run looks the same in every figure
        style = {"color": f"C{i % 10}", "marker": _MARKERS[i % len(_MARKERS)],
                 "linestyle": _DASHES[(i // 2) % len(_DASHES)], "markersize": 3.5, "linewidth": 1.5,
                 "markerfacecolor": "none" if i % 2 else None, **s.style}
        ax.plot(list(s.x), list(s.y), label=s.label, **style)
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle=":", linewidth=1, label=hline_label or f"{hline:g}")
    for x, label in ([(vline, vline_label)] if vline is not None else []) + list(vlines):
        ax.axvline(x, color="red", linestyle=":", linewidth=1, label=label or f"{x:g}")
    if integer_x:
        xs = {x for s in series for x in s.x if math.isfinite(x)}
        # one round (a run of one, or stopped after it): MaxNLocator finds no two whole numbers in the view
        # and falls back to ticks of 0.945, 0.96, ... on an axis of rounds
        ax.xaxis.set_major_locator(FixedLocator(sorted(xs)) if len(xs) == 1 else MaxNLocator(integer=True))
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    lines = ax.get_lines()  # named here: a label that starts with "_" would be left out of the legend
    ax.legend(lines, [str(x.get_label()) for x in lines], loc="best", fontsize="small")
    if note:
        fig.text(0.01, 0.005, note, fontsize="x-small", color="dimgrey", ha="left", va="bottom", wrap=True)
        fig.subplots_adjust(bottom=0.18)
    return _save(fig, path)


def _drawable(s: Series) -> bool:
    """Whether ``s`` has a point matplotlib draws: both coordinates finite (a NaN, a diverged round's
    accuracy, draws nothing)."""
    return any(math.isfinite(x) and math.isfinite(y) for x, y in zip(s.x, s.y, strict=False))


# ---------------------------------------------------------------- standard views of runs


def accuracy_vs_time_plot(runs: Sequence[Run], path: str | Path, target: float | None = None,
                          title: str = "") -> Path:
    """Accuracy after each round against the simulated clock (cost-model makespans summed), or a
    deployment's measured one (:func:`~splitfed.report.runs.clock_of` names which on the axis)."""
    series = [Series(_plain(r.label), *_with_start(r, r.sim_time)) for r in runs]
    kind = _CLOCK[clock_of(runs)]
    return line_plot(series, path, title=title or f"Test accuracy vs {kind} time", xlabel=f"{kind} time (s)",
                     ylabel="test accuracy",
                     hline=target, hline_label=f"target {target:g}" if target is not None else "")


def accuracy_per_round_plot(runs: Sequence[Run], path: str | Path,
                            title: str = "Test accuracy per round") -> Path:
    """Accuracy after each round, led by round 0's, the accuracy before training, where the run recorded it
    (:func:`_with_start`, as the other accuracy figures)."""
    series = [Series(_plain(r.label), *_with_start(r, [x.round for x in r.rounds])) for r in runs]
    return line_plot(series, path, title=title, xlabel="round", ylabel="test accuracy", integer_x=True)


def makespan_plot(runs: Sequence[Run], path: str | Path, title: str = "",
                  mark_round: int | Sequence[int] | None = None) -> Path:
    """Each round's simulated makespan (a deployment's measured round time); ``mark_round`` draws a vertical
    line before that round, or before each of several (e.g. where a fleet's drifts happen)."""
    series = [Series(_plain(r.label), [x.round for x in r.rounds], [x.sim_round_s for x in r.rounds]) for r in runs]
    kind = _CLOCK[clock_of(runs)]
    marks = sorted({int(mark_round)} if isinstance(mark_round, int | Integral)  # one round (numpy's too)
                   else {int(r) for r in mark_round or ()})
    return line_plot(series, path, title=title or f"{kind.capitalize()} round time (makespan)", xlabel="round",
                     ylabel=f"makespan ({kind} s)", integer_x=True,
                     vlines=[(r - 0.5, f"change from round {r}") for r in marks])


def _predicted_rows(run: Run) -> list[tuple[int, float, float]]:
    """(round, measured s, predicted s) of each round run in real time that carries the cost model's
    prediction of it (``predicted_round_s``)."""
    out = []
    for x in run.rounds:
        p = x.extra.get("predicted_round_s")
        if x.extra.get(MEASURED) and isinstance(p, int | float) and not isinstance(p, bool) and math.isfinite(p):
            out.append((x.round, x.sim_round_s, float(p)))
    return out


def predicted_plot(runs: Sequence[Run], path: str | Path,
                   title: str = "Measured round time and the cost model's prediction") -> Path:
    """Each measured round (solid) beside what the cost model predicted of it before it ran (dashed, same
    colour): how well the one cost model knows the real fleet (real-time runs; see :func:`_predicted_rows`)."""
    series = []
    for i, r in enumerate(runs):
        rows = _predicted_rows(r)
        colour = {"color": f"C{i % 10}"}
        series += [Series(f"{_plain(r.label)}: measured", [x[0] for x in rows], [x[1] for x in rows],
                          {**colour, "linestyle": "-", "marker": "o"}),
                   Series(f"{_plain(r.label)}: predicted", [x[0] for x in rows], [x[2] for x in rows],
                          {**colour, "linestyle": "--", "marker": "x"})]
    return line_plot(series, path, title=title, xlabel="round", ylabel="round time (s)", integer_x=True)


def bytes_plot(runs: Sequence[Run], path: str | Path, title: str = "Activations and gradients per round") -> Path:
    """Uplink (solid) and downlink (dashed) megabytes per round on the devices' links, per run: activations
    and gradients (the weights a device exchanges with the coordinator are not counted). Each run has its own
    marker (hollow for its downlink), smaller than the one drawn before it (sizes repeat every four runs,
    shapes every eight): runs with the same cuts send the same bytes (``sl``, ``sflv1``, ``sflv2``), and one
    marker for all drew the last run's curve over the others'."""
    series = []
    for i, r in enumerate(runs):
        style = {"color": f"C{i % 10}", "marker": _MARKERS[i % len(_MARKERS)], "markersize": 8 - 1.5 * (i % 4)}
        rounds = [x.round for x in r.rounds]
        series.append(Series(f"{_plain(r.label)} up", rounds, [x.bytes_up / MB for x in r.rounds],
                             {**style, "linestyle": "-", "markerfacecolor": None}))
        series.append(Series(f"{_plain(r.label)} down", rounds, [x.bytes_down / MB for x in r.rounds],
                             {**style, "linestyle": "--", "markerfacecolor": "none"}))
    return line_plot(series, path, title=title, xlabel="round", ylabel="MB per round", integer_x=True)


def accuracy_vs_bytes_plot(runs: Sequence[Run], path: str | Path,
                           title: str = "Test accuracy vs activation bytes") -> Path:
    """Accuracy against the cumulative activation and gradient bytes of the devices' links. A run that sent
    none (every block on the device) draws a vertical line at 0 MB: the footnote names it, so that the line
    does not read as a run that reached its accuracy for free on a link."""
    series = [Series(_plain(r.label), *_with_start(r, [b / MB for b in r.cum_bytes])) for r in runs]
    silent = [_plain(r.label) for r in runs if r.rounds and not any(r.cum_bytes)]
    return line_plot(series, path, title=title, xlabel="cumulative MB of activations and gradients (up + down)",
                     ylabel="test accuracy",
                     note=f"no activation or gradient crossed a link: {', '.join(silent)}" if silent else "")


def cuts_heatmap(run: Run, path: str | Path, title: str | None = None, max_labels: int = 40) -> Path:
    """Client x round heatmap of each cut (one panel per cut); blank where a client sat out a round."""
    clients = run.clients
    rounds = [r.round for r in run.rounds]
    # one panel at least: cuts that are all empty (``[]``, shown as ``-`` in the tables) drew none and failed
    width = max((len(c) for r in run.rounds for c in r.cuts.values()), default=1) or 1
    grid = np.full((width, max(1, len(clients)), max(1, len(rounds))), np.nan)
    index = {c: i for i, c in enumerate(clients)}
    for j, r in enumerate(run.rounds):
        for c, cuts in r.cuts.items():
            grid[: len(cuts), index[c], j] = cuts
    finite = grid[np.isfinite(grid)]
    lo, hi = (int(finite.min()), int(finite.max())) if finite.size else (0, 1)
    levels = np.arange(lo, hi + 2) - 0.5
    cmap = ListedColormap([_viridis(v) for v in np.linspace(0, 1, len(levels) - 1)]).with_extremes(bad="white")
    norm = BoundaryNorm(levels, cmap.N)
    names = _cut_names(run, width)
    wide = max(min(14.0, 3.0 + 0.35 * len(rounds)) * (1 if width == 1 else 1.6),
               1.5 + width * (0.3 + 0.1 * max(map(len, names))))  # room for each panel's title
    fig = Figure(figsize=(wide, min(12.0, 1.8 + 0.22 * len(clients))), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, width, squeeze=False, sharey=True)[0]
    im = None
    # one column per row of the metrics, placed by its index and labelled with its round: rounds that skip
    # (rows of a hand-made run) would otherwise stretch the columns over them and put them under wrong ticks
    step = max(1, math.ceil(len(rounds) / 15))
    for k, ax in enumerate(axes):
        im = ax.imshow(np.ma.masked_invalid(grid[k]), aspect="auto", cmap=cmap, norm=norm, interpolation="nearest",
                       extent=(-0.5, len(rounds) - 0.5, len(clients) - 0.5, -0.5) if rounds else None)
        ax.set_title(names[k])
        ax.set_xlabel("round")
        if rounds:
            ax.set_xticks(range(0, len(rounds), step), [str(x) for x in rounds[::step]])
    axes[0].set_ylabel("client (device class)")
    if len(clients) <= max_labels:
        axes[0].set_yticks(range(len(clients)))
        axes[0].set_yticklabels([_row_label(run, c) for c in clients], fontsize="small")
    else:
        _label_bands(run, clients, axes, max_labels)
    unsure = "" if _chain(run) or width == 1 else "\n(the run does not record its tiers: its cuts are numbered, not named)"
    fig.suptitle(title or f"Cuts over rounds: {_plain(run.label)}{unsure}")
    assert im is not None
    bar = fig.colorbar(im, ax=list(axes), ticks=range(lo, hi + 1, max(1, math.ceil((hi - lo + 1) / 12))))
    bar.set_label("cut (blocks before it)")
    return _save(fig, path)


def _label_bands(run: Run, clients: Sequence[str], axes: Sequence[Any], max_labels: int) -> None:
    """More clients than ``max_labels``: one tick per device class, at the middle of its band of rows (the
    clients are grouped by class), named with its count (``pi-sat (30)``), and a thin line between two bands;
    more classes than ``max_labels`` too: every n-th client named, as the rounds are. No names at all left a
    fleet of 100 clients without a clue which rows are which."""
    bands = [(k, len(list(g))) for k, g in groupby(clients, key=run.class_of)]
    if len(bands) > max_labels:
        step = math.ceil(len(clients) / max_labels)
        axes[0].set_yticks(range(0, len(clients), step), [_row_label(run, c) for c in clients[::step]], fontsize="small")
        return
    ticks, start = [], 0
    for _, n in bands:
        ticks.append(start + (n - 1) / 2)
        start += n
        if start < len(clients):
            for ax in axes:
                ax.axhline(start - 0.5, color="black", linewidth=0.6)
    axes[0].set_yticks(ticks, [_plain(f"{k} ({n})") for k, n in bands], fontsize="small")


def _row_label(run: Run, client: str) -> str:
    """A heatmap row's name: the client, with its device class when that is not the name itself."""
    return _plain(f"{client} ({run.class_of(client)})" if run.class_of(client) != client else client)


def standard_plot_files(runs: Sequence[Run], out: str | Path) -> list[Path]:
    """Every file :func:`standard_plots` writes for ``runs`` in folder ``out`` (to check before drawing any)."""
    return [path for _, path, _ in _views(runs, Path(out), None)]


def standard_plots(runs: Sequence[Run], out: str | Path, target: float | None = None) -> dict[str, Path]:
    """Every standard view of ``runs`` in folder ``out``; name -> PNG path. Each is drawn beside its place
    first, and all are put in place once all are drawn: a drawing that fails leaves the folder as it was. The
    views an earlier report drew there of runs not in this one (a cut heatmap is named by its run's place in
    the list) are removed: the folder shows these runs only."""
    drawn = draw_standard_plots(runs, out, target)
    for tmp, path in drawn.values():
        os.replace(tmp, path)
    remove_stale_plots(out, [path for _, path in drawn.values()])
    return {name: path for name, (_, path) in drawn.items()}


def draw_standard_plots(runs: Sequence[Run], out: str | Path,
                        target: float | None = None) -> dict[str, tuple[Path, Path]]:
    """Every standard view of ``runs``, each drawn to a temporary file beside its place in ``out``; name ->
    (temporary file, place). Nothing is put in place (a caller that writes more files puts all in place
    together, e.g. with ``os.replace``); a drawing that fails removes those drawn before it."""
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    drawn: dict[str, tuple[Path, Path]] = {}
    path = d
    try:
        for name, path, draw in _views(runs, d, target):
            drawn[name] = (draft_of(path), path)
            draw(drawn[name][0])
    except BaseException as e:
        for tmp, _ in drawn.values():
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and not e.filename:  # a write that failed part way (a full disk) names no file
            e.filename = str(path)
        raise
    return drawn


def run_plot_files(out: str | Path) -> list[Path]:
    """The views in ``out`` that depend on which runs a report held (a cut heatmap per run, named by its place
    in the list; the measured-vs-predicted view): an earlier report's may be there beside this one's. Only names a
    report gives (:func:`_is_heatmap_name`): ``--out`` may name a folder of the user's own figures."""
    d = Path(out)
    return [*sorted(p for p in d.glob("cuts_*.png") if _is_heatmap_name(p.name)), d / "predicted_vs_measured.png"]


def _is_heatmap_name(name: str) -> bool:
    """Whether ``name`` is one a report gives a run's cut heatmap: ``cuts_N_SLUG.png`` (:func:`_views`), not
    ``cuts_overview.png``, a file of the user's that the report must leave alone."""
    m = re.fullmatch(r"cuts_([1-9][0-9]*)_(.+)\.png", name)
    return m is not None and slug(m[2]) == m[2]


def remove_stale_plots(out: str | Path, made: Sequence[Path]) -> None:
    """Remove the views an earlier report drew in ``out`` that ``made`` (this report's) does not hold."""
    keep = set(made)
    for old in run_plot_files(out):  # an earlier report's, of other runs
        if old not in keep:
            old.unlink(missing_ok=True)


def _views(runs: Sequence[Run], d: Path, target: float | None) -> list[tuple[str, Path, Callable[[Path], Path]]]:
    """(name, PNG path, how to draw it) of each standard view: one list for the files and the drawing."""
    views: list[tuple[str, Path, Callable[[Path], Path]]] = [
        (f"accuracy vs {_CLOCK[clock_of(runs)]} time", d / "accuracy_vs_time.png", lambda p: accuracy_vs_time_plot(runs, p, target)),
        ("accuracy per round", d / "accuracy_per_round.png", lambda p: accuracy_per_round_plot(runs, p)),
        ("makespan per round", d / "makespan.png", lambda p: makespan_plot(runs, p)),
        ("bytes per round", d / "bytes.png", lambda p: bytes_plot(runs, p)),
        ("accuracy vs bytes", d / "accuracy_vs_bytes.png", lambda p: accuracy_vs_bytes_plot(runs, p)),
    ]
    if any(_predicted_rows(r) for r in runs):  # real-time runs: the measured rounds beside their prediction
        views.append(("measured vs predicted round time", d / "predicted_vs_measured.png",
                      lambda p: predicted_plot(runs, p)))
    for i, r in enumerate(runs):
        if r.clients:
            views.append((f"cuts: {r.label}", d / f"cuts_{i + 1}_{slug(r.label)}.png",
                          partial(cuts_heatmap, r)))
    return views


# ---------------------------------------------------------------- internals


def _with_start(run: Run, x: Sequence[float]) -> tuple[list[float], list[float]]:
    """Points after each round, led by (0, accuracy before training) when the run recorded it.

    The summary's ``initial_accuracy`` (else round 1's row's: a run that did not finish has no summary) is used
    if present and an accuracy (a number in [0, 1]: a NaN or a percentage would be drawn off the axis the
    rounds share); nothing is made up otherwise.
    """
    xs, ys = list(x), [r.accuracy for r in run.rounds]
    v = run.summary.get("initial_accuracy")
    if v is None and run.rounds and run.rounds[0].round == 1:
        v = run.rounds[0].extra.get("initial_accuracy")
    if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1:
        return [0.0, *xs], [float(v), *ys]
    return xs, ys


def _chain(run: Run) -> int | None:
    """How many tiers the run's chain has: its settings' ``tiers`` (``summary.json``'s, else its checkpoint's:
    :attr:`~splitfed.report.runs.Run.settings`), else one more than the server tiers its rows'
    ``tier_weight_bytes`` name; None when none says."""
    tiers = run.settings.get("tiers")
    if isinstance(tiers, int) and not isinstance(tiers, bool) and tiers >= 2:
        return tiers
    for r in run.rounds:
        per_tier = r.extra.get("tier_weight_bytes")
        if isinstance(per_tier, list) and per_tier and all(isinstance(b, list) for b in per_tier):
            return len(per_tier) + 1
    return None


def _cut_names(run: Run, width: int) -> list[str]:
    """Each cut's panel title: the tiers it lies between. A run's cut vector has one cut per server tier and,
    for a U-shape, one more where the device's tail starts, so its chain (:func:`_chain`) tells the two apart.
    Without one, only a single cut is sure (device | server); more are numbered, not named: two cuts are three
    tiers, or two in a U-shape (``splitfed simulate --tiers 2 --u-shape``), which its rows do not say."""
    tiers = _chain(run) or (2 if width == 1 else None)
    if tiers is None or width not in (tiers - 1, tiers):
        return [f"cut {k + 1}" for k in range(width)]
    names = {2: ["device", "server"], 3: ["device", "edge", "cloud"]}.get(
        tiers, ["device", *(f"tier {t}" for t in range(2, tiers + 1))])
    between = [f"{a} | {b}" for a, b in zip(names, names[1:], strict=False)]
    if width == tiers:  # U-shape: the last cut hands back to the device, which holds the tail and the loss
        between.append(f"{names[-1]} | device (tail)")
    return [f"cut {k + 1}: {name}" for k, name in enumerate(between)]


def _plain(label: str) -> str:
    """A run's or a client's name as matplotlib draws it as it is: as the tables show it
    (:func:`~splitfed.report.table.shown`: no control character drawn as a missing glyph), a long one in lines
    (:func:`_wrapped`), its ``$`` escaped (two would start math, which a name such as ``a$\\frac$`` cannot be
    drawn as)."""
    return "\n".join(line.replace("$", r"\$") for line in _wrapped(shown(label)))


LABEL_WIDTH = 40  # characters per line of a name in a figure: a longer one is wrapped, never cut


def _wrapped(text: str, width: int = LABEL_WIDTH) -> list[str]:
    """``text`` in lines of at most ``width`` characters (broken after a space or a hyphen where it can be,
    else inside a word), which joined give ``text`` back: a long run name on one line widened the legend past
    the axes and over the curves and the y axis's label (``bbox_inches="tight"`` grows the figure to fit)."""
    if len(text) <= width:
        return [text]
    return TextWrapper(width, expand_tabs=False, replace_whitespace=False, drop_whitespace=False).wrap(text)


def _viridis(v: float) -> tuple[float, float, float, float]:
    from matplotlib import colormaps

    return colormaps["viridis"](v)


def slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)[:60] or "run"


def _save(fig: Figure, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "wb") as f:  # on disk before it is put in place (a crash then leaves the old one or the new)
        fig.savefig(f, format="png", bbox_inches="tight")
        f.flush()
        os.fsync(f.fileno())
    return p
