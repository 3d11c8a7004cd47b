"""Argument parsers shared by several commands (one place to validate shapes and cut lists).

Light, as every command module's top level is: building the parser, its help and the command lines argparse
refuses import no torch, numpy or scipy (what a command needs of them, its ``run`` imports).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from splitfed.engine.limits import MAX_BATCH, MAX_CLASSES, MAX_SEED, MAX_VOCAB
from splitfed.errors import ConfigError

if TYPE_CHECKING:
    from splitfed.models.zoo import ModelSpec


def int_list(text: str) -> tuple[int, ...]:
    """``"3,7"`` -> ``(3, 7)``; a clear argparse error otherwise."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected at least one integer")
    try:  # an empty entry ("3,,5", "3,5,") is a number left out, not nothing: refused, not dropped
        return tuple(int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def cut_list(text: str) -> tuple[int, ...]:
    """A cut vector, ``K1,K2``: integers, none negative, non-decreasing (:func:`splitfed.cut_order.check_order`),
    checked without torch; whether the model has that many blocks is for the command to check once it is built."""
    from splitfed.cut_order import check_order
    from splitfed.errors import CutError

    try:
        return check_order(int_list(text))
    except CutError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def shape(text: str) -> tuple[int, ...]:
    vals = int_list(text)
    if any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"shape dimensions must be positive, got {text!r}")
    return vals


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, high]``, else a clear error naming the bounds."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in {low}..{high:,}, got {text!r}") from None
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(f"expected an integer in {low}..{high:,}, got {v}")
        return v

    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse


batch_size = bounded_int(1, MAX_BATCH)
num_classes = bounded_int(1, MAX_CLASSES)
seed = bounded_int(0, MAX_SEED)


def non_negative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not (v >= 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return v


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="zoo name (mlp, cnn, vgg11, resnet18, mobilenetv2, "
                   "transformer) or module.path:factory")
    p.add_argument("--input-shape", type=shape, default=None, help="input shape without batch, e.g. 3,32,32")
    p.add_argument("--num-classes", type=num_classes, default=None)
    p.add_argument("--vocab", type=bounded_int(2, MAX_VOCAB), default=None,
                   help="the model takes integer tokens below this (an nn.Embedding first), not floats")
    add_model_kwargs(p)


def add_model_kwargs(p: argparse.ArgumentParser) -> None:
    """``--model-kwargs``, for a command whose other model flags are its own (ping's --model is optional):
    :func:`model_spec` passes it on."""
    p.add_argument("--model-kwargs", type=model_kwargs, default=None, metavar="JSON",
                   help='the model factory\'s keyword arguments, a JSON object (e.g. \'{"width": 32}\')')


def model_kwargs(text: str) -> dict[str, Any]:
    """``--model-kwargs``: a JSON object, refused as a flag (exit 2) if it is not one."""
    from splitfed.options import kwargs_json, kwargs_of

    try:
        return kwargs_of(kwargs_json(text, ""))
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def zoo_name_checked(name: str | None) -> None:
    """Refuse a model name no zoo model has and no ``module:factory`` is, at once: the zoo that would refuse it
    imports torch first (seconds for one line). A command calls it before its heavy imports."""
    from splitfed.zoo_names import unknown_model_message

    if name and (refused := unknown_model_message(name)):
        raise ConfigError(refused)


def model_spec(args: argparse.Namespace, name: str | None = None) -> ModelSpec:
    """The spec ``add_model_args``' flags name (``name``: the model in place of ``--model``, as ping's
    --fleet-entry times cnn when none is given)."""
    from splitfed.models.zoo import resolve_spec

    return resolve_spec(name or args.model, args.input_shape, args.num_classes, vocab=getattr(args, "vocab", None),
                        options=getattr(args, "model_kwargs", None))


def json_out(name: str) -> Callable[[str], str]:
    """The type of a benchmark's ``--out``: the JSON file to write (``name``: the example its refusal gives),
    refused when the flags are read if it cannot be written (a folder, a path under a file, a folder that takes no
    file), not with a traceback once the measuring is done."""
    from pathlib import Path

    def out_file(text: str) -> str:
        p = Path(text)
        if p.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a folder: name the JSON file to write, e.g. {p / name}")
        folder = next((a for a in p.parents if a.exists()), None)
        if folder is not None and not folder.is_dir():
            raise argparse.ArgumentTypeError(f"{folder} is not a folder, so {text} cannot be written")
        if folder is not None:  # by writing there: permissions alone miss a read-only mount, or /proc
            import tempfile

            try:
                tempfile.TemporaryFile(dir=folder).close()
            except OSError as e:
                raise argparse.ArgumentTypeError(f"{folder} takes no new file ({e.strerror or e}), so {text} "
                                                 "cannot be written") from None
        return text

    return out_file


def zoo_model(text: str) -> str:
    """A zoo model by name, where a ``module:factory`` one would need an input shape the command has no flag
    for; checked without importing torch (a bad flag is refused at once)."""
    from splitfed.zoo_names import ZOO_NAMES

    if text not in ZOO_NAMES:
        factory = " (a module:factory model needs an input shape it has no flag for)" if ":" in text else ""
        raise argparse.ArgumentTypeError(f"unknown model {text!r}: this benchmark takes a zoo model{factory}: "
                                         f"{', '.join(ZOO_NAMES)}")
    return text
