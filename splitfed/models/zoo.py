"""The model zoo and user factories, resolved by one name: ``cnn`` or ``pkg.mod:factory``.

Every zoo model knows its input (shape, dtype) and class count so that synthetic
data can feed it; a user factory gets those from the command line.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import math
import operator
import os
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from splitfed.engine.limits import MAX_CLASSES, MAX_KWARGS_JSON, MAX_VOCAB
from splitfed.errors import ConfigError, SplitfedError
from splitfed.models import rng
from splitfed.models.blocks import refuse_root_hooks, to_blocks
from splitfed.models.check import check_trains_as_model, mark_stochastic, stochastic_flags
from splitfed.models.segment import Blocks
from splitfed.models.tying import join_at_tuples, kept, param_sizes


@dataclass(frozen=True)
class ModelSpec:
    """How any process (device, tier server, reference) builds the same model."""

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    vocab: int = 0  # > 0: inputs are int64 token ids in [0, vocab)
    kwargs: dict = field(default_factory=dict)

    @property
    def input_dtype(self) -> torch.dtype:
        return torch.int64 if self.vocab else torch.float32

    def example_input(self, batch: int = 2) -> torch.Tensor:
        g = torch.Generator().manual_seed(0)
        if self.vocab:
            return torch.randint(0, self.vocab, (batch, *self.input_shape), generator=g)
        return torch.randn(batch, *self.input_shape, generator=g)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "vocab": self.vocab,
            "kwargs": dict(self.kwargs),
        }

    @classmethod
    def from_dict(cls, d: dict) -> ModelSpec:
        """The spec :meth:`to_dict` wrote; a ValueError for anything else (``int()`` would make ``64.9`` 64,
        ``true`` 1 and the string ``"64"`` the shape ``(6, 4)``: another model than the sender's)."""
        name, shape, kwargs = d["name"], d["input_shape"], d.get("kwargs", {})
        if not isinstance(name, str) or not name:
            raise ValueError(f"model name must be a non-empty string, got {name!r}")
        if not isinstance(shape, (list, tuple)):
            raise ValueError(f"model {name}: input_shape must be a list of integers, got {shape!r}")
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ValueError(f"model {name}: kwargs must be an object with string keys, got {kwargs!r}")
        vocab = _whole(d.get("vocab", 0), f"model {name}: vocab", 0)
        if vocab == 1:  # no token model: one token carries nothing (the upper bounds are the receiver's limits)
            raise ValueError(f"model {name}: vocab must be 0 (float inputs) or at least 2, got 1")
        return cls(name=name, input_shape=tuple(_whole(x, f"model {name}: input_shape", 1) for x in shape),
                   num_classes=_whole(d["num_classes"], f"model {name}: num_classes", 1), vocab=vocab,
                   kwargs=dict(kwargs))


def _whole(v: object, what: str, least: int) -> int:
    """``v`` if it is an integer of at least ``least`` (a bool is none), else a ValueError naming ``what``."""
    if not isinstance(v, int) or isinstance(v, bool) or v < least:
        raise ValueError(f"{what} must be an integer >= {least}, got {v!r}")
    return v


# ---------------------------------------------------------------- zoo models


def _image_shape(input_shape: tuple[int, ...], least: int) -> tuple[int, int, int]:
    """``(channels, height, width)`` of an image model's input, each side at least ``least``."""
    if len(input_shape) != 3:
        raise ValueError(f"expected (channels, height, width), got {len(input_shape)} dimension(s)")
    c, h, w = input_shape
    if h < least or w < least:
        raise ValueError(f"height and width must be at least {least}, got {h}x{w}")
    return c, h, w


def mlp(input_shape: tuple[int, ...] = (64,), num_classes: int = 10, hidden: int = 128) -> nn.Module:
    if hidden < 2:  # a spec that bypassed resolve_spec (one off the wire): else a zero-width second layer
        raise ValueError(f"hidden must be at least 2 (its second layer is hidden // 2 wide), got {hidden}")
    n_in = math.prod(input_shape)
    return nn.Sequential(
        nn.Flatten(),
        nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU()),
        nn.Dropout(0.1),
        nn.Sequential(nn.Linear(hidden, hidden // 2), nn.ReLU()),
        nn.Linear(hidden // 2, num_classes),
    )


def cnn(input_shape: tuple[int, ...] = (1, 8, 8), num_classes: int = 10, width: int = 16) -> nn.Module:
    """LeNet-style: two conv stages, two dense layers; sized for digits (8x8) or MNIST (28x28)."""
    c, h, w = _image_shape(input_shape, 4)
    flat = 2 * width * (h // 4) * (w // 4)
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(c, width, 3, padding=1), nn.ReLU()),
        nn.MaxPool2d(2),
        nn.Sequential(nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU()),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Sequential(nn.Linear(flat, 64), nn.ReLU(), nn.Dropout(0.25)),
        nn.Linear(64, num_classes),
    )


_VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


def vgg11(input_shape: tuple[int, ...] = (3, 32, 32), num_classes: int = 10, width: float = 1.0) -> nn.Module:
    """CIFAR VGG-11 with BatchNorm; every conv stage and every pool is one block."""
    layers: list[nn.Module] = []
    c, h, w = _image_shape(input_shape, 32)
    for v in _VGG11:
        if isinstance(v, str):  # "M"
            layers.append(nn.MaxPool2d(2))
            h, w = h // 2, w // 2
        else:
            out = max(1, int(v * width))
            layers.append(nn.Sequential(nn.Conv2d(c, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU()))
            c = out
    layers.append(nn.Flatten())
    layers.append(nn.Linear(c * h * w, num_classes))
    return nn.Sequential(*layers)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """CIFAR ResNet-18. Not sequential: its blocks come from tracing, never inside a residual."""

    def __init__(self, in_ch: int = 3, num_classes: int = 10, width: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        cin = width
        stages = []
        for i, stride in enumerate((1, 2, 2, 2)):
            cout = width * 2**i
            stages.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1)
        return self.fc(out)


def resnet18(input_shape: tuple[int, ...] = (3, 32, 32), num_classes: int = 10, width: int = 64) -> nn.Module:
    return ResNet18(_image_shape(input_shape, 1)[0], num_classes, width)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()]
        layers += [
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_res:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    """CIFAR MobileNetV2 (stride 1 stem), width-scaled; traced for its cut points."""

    _CFG = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, in_ch: int = 3, num_classes: int = 10, width: float = 0.25) -> None:
        super().__init__()

        def ch(c: int) -> int:  # the nearest multiple of 8, at least 8: every base count at width 1, wider above
            return max(8, int(round(c * width / 8)) * 8)

        cin = ch(32)
        self.stem = nn.Sequential(nn.Conv2d(in_ch, cin, 3, 1, 1, bias=False), nn.BatchNorm2d(cin), nn.ReLU6())
        blocks: list[nn.Module] = []
        for t, c, n, s in self._CFG:
            cout = ch(c)
            for i in range(n):
                blocks.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        self.features = nn.Sequential(*blocks)
        last = ch(1280)
        self.head = nn.Sequential(nn.Conv2d(cin, last, 1, bias=False), nn.BatchNorm2d(last), nn.ReLU6())
        self.dropout = nn.Dropout(0.2)
        self.fc = nn.Linear(last, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.head(self.features(self.stem(x)))
        out = torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1)
        return self.fc(self.dropout(out))


def mobilenetv2(input_shape: tuple[int, ...] = (3, 32, 32), num_classes: int = 10, width: float = 0.25) -> nn.Module:
    return MobileNetV2(_image_shape(input_shape, 1)[0], num_classes, width)


class EncoderLayer(nn.Module):
    """Pre-norm encoder layer with explicit attention so that torch.fx can trace it."""

    def __init__(self, d: int, heads: int, ff: int, dropout: float) -> None:
        super().__init__()
        if d % heads:  # else the first batch failed to split its features into heads, far from the cause
            raise ValueError(f"d must be a multiple of the {heads} attention heads, got {d}")
        self.heads = heads
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, ff), nn.GELU(), nn.Linear(ff, d))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q = q.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // self.heads), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.ff(self.norm2(x)))


class TinyTransformer(nn.Module):
    """A small encoder classifier over token ids (mean-pooled)."""

    def __init__(self, vocab: int, seq_len: int, num_classes: int, d: int = 32, heads: int = 4,
                 layers: int = 2, dropout: float = 0.1) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, d))
        nn.init.normal_(self.pos, std=0.02)
        self.layers = nn.ModuleList(EncoderLayer(d, heads, 2 * d, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos
        for layer in self.layers:
            h = layer(h)
        return self.fc(self.norm(h).mean(dim=1))


def transformer(input_shape: tuple[int, ...] = (64,), num_classes: int = 10, vocab: int = 17,
                d: int = 32, layers: int = 2) -> nn.Module:
    if len(input_shape) != 1:
        raise ValueError(f"expected (sequence length,), got {len(input_shape)} dimensions")
    return TinyTransformer(vocab, input_shape[0], num_classes, d=d, layers=layers)


@dataclass(frozen=True)
class _ZooEntry:
    factory: Callable[..., nn.Module]
    input_shape: tuple[int, ...]
    num_classes: int = 10
    vocab: int = 0


ZOO: dict[str, _ZooEntry] = {
    "mlp": _ZooEntry(mlp, (64,)),
    "cnn": _ZooEntry(cnn, (1, 8, 8)),
    "vgg11": _ZooEntry(vgg11, (3, 32, 32)),
    "resnet18": _ZooEntry(resnet18, (3, 32, 32)),
    "mobilenetv2": _ZooEntry(mobilenetv2, (3, 32, 32)),
    "transformer": _ZooEntry(transformer, (64,), vocab=17),
}


def resolve_spec(name: str, input_shape: tuple[int, ...] | None = None, num_classes: int | None = None,
                 *, vocab: int | None = None, options: Mapping[str, object] | None = None,
                 **kwargs: object) -> ModelSpec:
    """A spec for a zoo name or a ``module:factory`` path; user paths need an input shape. ``vocab``: the
    model takes integer tokens below it (an ``nn.Embedding`` first), not floats; it is not passed to a
    user's factory. The factory's keyword arguments: ``kwargs``, and ``options`` (a mapping, which may name
    what this function's own parameters are called: a user's factory may take ``num_classes``)."""
    kwargs = {**(options or {}), **kwargs}
    vocab = None if vocab is None else _integer(vocab, "vocab", 2, MAX_VOCAB)
    num_classes = None if num_classes is None else _integer(num_classes, "num_classes", 1, MAX_CLASSES)
    if input_shape is not None:
        if isinstance(input_shape, (str, bytes)) or not isinstance(input_shape, Iterable):
            raise ConfigError(f"model {name}: input_shape must be a tuple of integers (e.g. (3, 32, 32), or (64,) "
                              f"for vectors), got {input_shape!r}")
        input_shape = tuple(_integer(d, f"model {name}: each dimension of input_shape", 1) for d in input_shape)
    try:  # every process rebuilds the model from the spec as JSON: a tuple would come back a list
        same = json.loads(json.dumps(kwargs)) == kwargs  # a tuple is no list: unequal
    except (TypeError, ValueError):
        same = False
    if not same:
        raise ConfigError(f"model {name}: its keyword arguments {kwargs!r} must be JSON values (numbers, strings, "
                          "true/false, lists, objects with string keys): every tier rebuilds the model from them")
    if len(json.dumps(kwargs, sort_keys=True)) > MAX_KWARGS_JSON:  # what a tier takes in a spec
        raise ConfigError(f"model {name}: its keyword arguments take over {MAX_KWARGS_JSON:,} characters as JSON: "
                          "a model's options are a few numbers and names")
    if name in ZOO:
        e = ZOO[name]
        _zoo_options(name, kwargs)
        if vocab is not None and not e.vocab:
            raise ConfigError(f"model {name} takes floats, not tokens: --vocab is for a token model")
        return ModelSpec(name, tuple(input_shape or e.input_shape), num_classes or e.num_classes,
                         vocab=vocab or e.vocab, kwargs=dict(kwargs))
    if ":" not in name:
        raise ConfigError(
            f"unknown model {name!r}: use one of {', '.join(sorted(ZOO))} or 'module.path:factory'"
        )
    _import_factory(name)  # fail early with a clear message
    if input_shape is None:
        raise ConfigError(f"model {name!r} is not in the zoo: give --input-shape (e.g. 3,32,32)")
    return ModelSpec(name, tuple(input_shape), num_classes or 10, vocab=vocab or 0, kwargs=dict(kwargs))


_SET_APART = ("input_shape", "num_classes", "vocab")  # a zoo factory's parameters that are no option
# the least of a zoo model's integer options where 1 is too few: a size the model halves (mlp's second layer is
# hidden // 2 wide: 1 made it zero-width, a model of empty tensors)
_LEAST: dict[tuple[str, str], int] = {("mlp", "hidden"): 2}


def options(name: str) -> tuple[str, ...]:
    """The keyword arguments (``--model-kwargs``) zoo model ``name`` takes: its factory's, but the input shape,
    classes and vocabulary, which a run sets itself."""
    return tuple(p for p in inspect.signature(ZOO[name].factory).parameters if p not in _SET_APART)


def _zoo_options(name: str, kwargs: dict[str, object]) -> None:
    """A zoo model's keyword arguments, checked by name and value before it is built: a misspelt one was a
    TypeError, and a width of 0 a model of empty tensors (torch warning of each), both reported as the model not
    taking its input shape. Every zoo option is a size, positive (at least ``_LEAST`` where the model derives a
    smaller size from it), of the type its factory declares."""
    known = options(name)
    declared = inspect.signature(ZOO[name].factory, eval_str=True).parameters
    for k, v in kwargs.items():
        if k not in known:
            apart = " (the input shape, classes and vocabulary are set apart from them)" if k in _SET_APART else ""
            raise ConfigError(f"model {name} takes no keyword argument {k!r}: its options are "
                              f"{', '.join(known) or 'none'}{apart}")
        if declared[k].annotation is int:
            _integer(v, f"model {name}: option {k}", _LEAST.get((name, k), 1))
        elif not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < math.inf:
            raise ConfigError(f"model {name}: option {k} must be a number > 0, got {v!r}")


def _integer(v: object, what: str, least: int, most: int | None = None) -> int:
    """``v`` as an int (numpy's and torch's integers too) in ``least..most``, else a ConfigError naming ``what``:
    a float or a bool would be taken here and break later (a batch of shape 16.0, a spec a tier refuses)."""
    try:
        n = operator.index(v)  # type: ignore[arg-type]  # TypeError for a float, a string, None
    except TypeError:
        n = None
    if n is None or isinstance(v, bool):
        raise ConfigError(f"{what} must be an integer, got {v!r}")
    if n < least or (most is not None and n > most):
        raise ConfigError(f"{what} must be {f'in {least}..{most:,}' if most is not None else f'>= {least}'}, got {v!r}")
    return n


def _import_factory(path: str) -> Callable[..., nn.Module]:
    mod_name, _, attr = path.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # a user's own module, run from their project folder
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's path
        if "/" in mod_name or os.sep in mod_name or mod_name.endswith(".py"):  # a file, which import cannot take
            raise ConfigError(_file_given(path)) from None
        raise ConfigError(f"cannot import {mod_name!r} for model {path!r}: {type(e).__name__}: {e}") from None
    try:
        factory = getattr(mod, attr)
    except AttributeError:
        raise ConfigError(f"module {mod_name!r} has no attribute {attr!r} (model {path!r})") from None
    if not callable(factory):
        raise ConfigError(f"{path!r} is not callable")
    return factory


def _file_given(path: str) -> str:
    """The refusal of a file path (``./mymod.py:net``) as a model, naming the module and the folder it imports
    from: import took it for a relative module name (a TypeError on its package) or a module named by the path."""
    file, _, attr = path.partition(":")
    module = os.path.splitext(os.path.basename(file.rstrip("/" + os.sep)))[0]
    folder = os.path.dirname(os.path.abspath(file))
    missing = "" if os.path.exists(file) else f" (and there is no {os.path.abspath(file)})"
    return (f"model {path!r}: --model takes a module path (module:factory, importable from the current folder or "
            f"PYTHONPATH), not a file: give '{module}:{attr}', run from {folder} or with {folder} on PYTHONPATH"
            f"{missing}")


def build(spec: ModelSpec, seed: int | None = None) -> nn.Module:
    """Build the model; with a seed, its initial weights are the same in every process and thread."""
    with rng.seeded(seed):
        return _build(spec)


def _build(spec: ModelSpec) -> nn.Module:
    if spec.name in ZOO:
        e = ZOO[spec.name]
        kw = dict(spec.kwargs)
        if e.vocab:
            kw.setdefault("vocab", spec.vocab)
        try:
            model = e.factory(spec.input_shape, spec.num_classes, **kw)
        except SplitfedError:
            raise
        except Exception as ex:  # noqa: BLE001 - a zoo model refusing its input fails in many types
            raise input_error(spec, ex) from None
    else:
        factory = _import_factory(spec.name)
        try:
            model = factory(**spec.kwargs)
        except SplitfedError:
            raise
        except Exception as ex:  # noqa: BLE001 - the user's code may raise anything
            given = f" given {spec.kwargs} (--model-kwargs)" if spec.kwargs else ""
            raise ConfigError(f"model factory {spec.name}{given} raised {type(ex).__name__}: "
                              f"{first_line(ex)}") from None
        if not isinstance(model, nn.Module):
            raise ConfigError(f"factory {spec.name!r} returned {type(model).__name__}, not torch.nn.Module")
        _materialise(spec, model)
    return model


def _materialise(spec: ModelSpec, model: nn.Module) -> None:
    """Give a model's lazy modules (``nn.LazyLinear``...) their sizes, by one pass of an example batch in eval
    mode: splitfed sizes, copies and cuts the model's tensors before anything trains, and an uninitialised
    parameter has no size. Every process builds it so, from the same seed: the same weights everywhere."""
    from torch.nn.parameter import is_lazy

    if not any(is_lazy(t) for t in [*model.parameters(), *model.buffers()]):
        return
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.no_grad():
            model(spec.example_input(2))
    except Exception as ex:  # noqa: BLE001 - the user's code may raise anything
        raise ConfigError(f"model {spec.name}: its lazy modules could not be sized by a batch of input shape "
                          f"{list(spec.input_shape)}: {type(ex).__name__}: {first_line(ex)}") from None
    finally:
        for m, training in modes.items():
            m.training = training


def first_line(e: BaseException) -> str:
    """An exception's message in one line (torch's run over several), or its type when it has none."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def input_error(spec: ModelSpec, e: BaseException) -> ConfigError:
    """The one-line refusal of a model that fails on its input shape, or with its keyword arguments: a model
    given them is not told its input is wrong when a width of them may be (a zoo model's are checked apart)."""
    shape = tuple(spec.input_shape)
    what = f"model {spec.name}" + (f" with {dict(spec.kwargs)}" if spec.kwargs else "")
    # a zoo model says what it expects itself; a user's may fail on the dtype (an nn.Embedding given floats)
    kind = ("" if spec.name in ZOO else f" (integer tokens below {spec.vocab})" if spec.vocab
            else " (floats; a model that takes tokens, an nn.Embedding first, needs --vocab N)")
    text = first_line(e)
    if not spec.vocab and spec.name not in ZOO and _DTYPE_CLASH.search(text):  # the shape is not the problem
        return ConfigError(f"{what} does not take float32 inputs, which splitfed feeds it: {text}; a model that "
                           "computes in another dtype (.double(), bfloat16) casts its input itself, e.g. "
                           "x = x.to(self.weight.dtype) first in forward (a model that takes tokens needs --vocab N)")
    if spec.kwargs:
        return ConfigError(f"model {spec.name} fails with its keyword arguments {dict(spec.kwargs)} (--model-kwargs) "
                           f"on inputs of shape {shape}{kind}: {text}")
    return ConfigError(f"{what} does not take inputs of shape {shape}{kind}: {text}")


# what torch says when a float32 input meets weights of another dtype
_DTYPE_CLASH = re.compile(r"must have the same dtype|expected (m1 and m2|mat1 and mat2|both vectors|scalar type)|"
                          r"Input type \(.*\) and (weight|bias) type|dtype.*(Float|Double|BFloat16|Half)", re.I)


def model_blocks(spec: ModelSpec, seed: int | None = None) -> tuple[nn.Module, Blocks]:
    """The model of ``spec`` and its blocks: the one way every part (template, profiler, initial weights)
    cuts a model, so they all count the same blocks. A traced model whose blocks do not train as the model
    does is refused (:func:`~splitfed.models.check.check_trains_as_model`), and every block that draws random
    numbers is marked so (:func:`~splitfed.models.check.stochastic_flags`); both once per spec in a process."""
    model = build(spec, seed)
    refuse_root_hooks(model, spec.name)
    blocks = to_blocks(model, cut_name(spec, model))  # first: a model that cannot be cut says so whatever its input
    check_input(spec, model)  # then the one place a spec meets its input shape: refused clearly
    example = spec.example_input(2)
    blocks = join_at_tuples(blocks, example, spec.name)
    if example.is_meta:  # sized on the meta device (a tier's Describe): no values to check, nothing to train
        return model, blocks
    refusal, flags = _verdict(spec, blocks, example)
    if refusal:
        raise ConfigError(refusal)
    mark_stochastic(blocks, flags)
    return model, blocks


def cut_name(spec: ModelSpec, model: nn.Module) -> str | None:
    """What a refusal to cut ``model`` calls it: a user's model by the ``--model`` given and its class
    (``mypkg.nets:make (class Net)``: the class alone leaves the factory to find); a zoo model by its class."""
    return None if spec.name in ZOO else f"{spec.name} (class {type(model).__name__})"


CHECK_BYTES = 256 << 20  # a traced user model up to this size is trained beside itself once (_trains_as_itself)
log = logging.getLogger(__name__)
_VERDICTS: OrderedDict[str, tuple[str, tuple[bool, ...]]] = OrderedDict()  # spec -> (refusal or "", flags)
_VERDICTS_LOCK = threading.Lock()
_VERDICTS_SIZE = 256


def _verdict(spec: ModelSpec, blocks: Blocks, example: torch.Tensor) -> tuple[str, tuple[bool, ...]]:
    """Why ``spec``'s blocks may not be trained ("" if they may), and which blocks draw random numbers;
    worked out once per spec in a process (``model_blocks`` runs for every tier, client and profile)."""
    key = json.dumps(spec.to_dict(), sort_keys=True, default=repr)
    with _VERDICTS_LOCK:
        hit = _VERDICTS.get(key)
        if hit is not None:
            _VERDICTS.move_to_end(key)
    if hit is not None and (hit[0] or len(hit[1]) == len(blocks)):
        return hit
    own = spec.name not in ZOO  # the zoo's models are splitfed's code, checked by its tests: no trial runs
    size = param_sizes([p for m in blocks.modules for p in m.parameters()])[1]  # a .data tie once
    if own and blocks.traced and size > CHECK_BYTES:  # two more instances and their gradients: ~5x the model
        log.warning("model %s (%.0f MiB of parameters) is not trained beside itself to check its tracing (above "
                    "%d MiB): check it with splitfed verify against your own training", spec.name, size / 2**20,
                    CHECK_BYTES >> 20)
    refusal = _trains_as_itself(spec, example) if blocks.traced and own and size <= CHECK_BYTES else ""
    verdict = (refusal, () if refusal else tuple(stochastic_flags(blocks, example, run=own)))
    with _VERDICTS_LOCK:
        _VERDICTS[key] = verdict
        while len(_VERDICTS) > _VERDICTS_SIZE:
            _VERDICTS.popitem(last=False)
    return verdict


def _trains_as_itself(spec: ModelSpec, example: torch.Tensor) -> str:
    """"" if a traced model's blocks train as the model does, else the one-line refusal. Checked on two
    instances of its own (the same seed), cut one and trained both: the caller's model is not touched."""
    model = build(spec, 0)
    blocks = to_blocks(model, cut_name(spec, model))  # joined or not, its blocks end to end compute the same
    try:
        check_trains_as_model(blocks, model, build(spec, 0), example, spec.name)
    except ConfigError as e:
        return str(e)
    return ""


def check_input(spec: ModelSpec, model: nn.Module) -> None:
    """Run an example batch of two samples through ``model`` (built from ``spec``); a ConfigError if it does
    not fit. Two, not one: a BatchNorm that keeps no running statistics normalises by the batch's own even in
    eval mode, and one sample has no spread.

    The model runs without gradients; its mode, and every parameter and buffer (a forward of one's own
    may update one even in eval mode), is given back afterwards. The output must be
    ``(batch, num_classes)`` logits, as the training loss expects, in training mode too: a model that
    returns more when training (an auxiliary head's logits beside its own) would pass in eval mode and
    fail only in a tier's first step. Both runs hold torch's generator (:func:`splitfed.models.rng.seeded`)
    and give it back: a run starting in a process where another run trains (a tier's dropout seeded per
    step) or builds its initial model moves nothing of theirs, nor they anything of its.
    """
    try:
        # its modes and tensors given back (a buffer forward updates), and the generator (a model may draw in
        # eval mode too)
        with kept([model]), torch.no_grad(), rng.seeded():
            x = spec.example_input(2)
            model.eval()
            _check_logits(spec, model(x), "")
            model.train()
            trained = model(x)
    except SplitfedError:
        raise
    except Exception as e:  # noqa: BLE001 - shape errors come as RuntimeError, ValueError, IndexError...
        raise input_error(spec, e) from None
    _check_logits(spec, trained, " in training mode")


def _check_logits(spec: ModelSpec, out: object, mode: str) -> None:
    if not isinstance(out, torch.Tensor) or out.dim() != 2:
        got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(f"model {spec.name} outputs {got}{mode} for two samples of shape "
                          f"{tuple(spec.input_shape)}; expected logits of shape [2, {spec.num_classes}]"
                          + (" (return them alone when training: an auxiliary head's output too)" if mode else ""))
    if not out.is_floating_point():  # integer, bool or complex: the loss has no kernel for it (a tier's first step)
        raise ConfigError(f"model {spec.name} outputs {str(out.dtype).removeprefix('torch.')} values{mode}: logits "
                          "must be floating point (float32, as a last nn.Linear gives them): return them uncast "
                          "(no .long(), .argmax() or torch.complex last)")
    if out.shape[1] != spec.num_classes:
        raise ConfigError(f"model {spec.name} outputs {out.shape[1]} classes{mode}, and {spec.num_classes} are "
                          "expected (--num-classes in verify, blocks, profile, optimize and ping; in a run, as many "
                          f"as its dataset has){_classes_fix(spec)}")


def _classes_fix(spec: ModelSpec) -> str:
    """How a user's model is given ``spec.num_classes`` outputs, in words true in every command: a run sets no
    --num-classes, and a factory is given only its keyword arguments (--model-kwargs), never the class count."""
    if spec.name in ZOO:  # built with the spec's classes
        return ""
    n, given = spec.num_classes, spec.kwargs.get("num_classes")
    if given is not None:
        return f": its factory is given num_classes {given!r} (--model-kwargs); give it {n}"
    try:
        takes = "num_classes" in inspect.signature(_import_factory(spec.name)).parameters
    except (TypeError, ValueError):  # a callable inspect cannot read
        takes = False
    kw = f"--model-kwargs '{{\"num_classes\": {n}}}'"
    return (f": give its factory num_classes, which no command passes it: {kw}" if takes else
            f": make its factory build {n} outputs (or take num_classes, given with {kw})")


def with_kwargs(spec: ModelSpec, **kwargs: object) -> ModelSpec:
    return replace(spec, kwargs={**spec.kwargs, **kwargs})
