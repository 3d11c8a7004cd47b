"""What the mutation run of splitfed/models/zoo.py (lines 301 on) found no test for: ``resolve_spec``'s bounds
taken at their edges (a vocabulary of 2, the largest vocabulary and class count, model options of exactly
``MAX_KWARGS_JSON`` characters as JSON) and refused one past them; a ``module:factory`` in the working folder
importing, that folder put first on ``sys.path`` (ahead of a module of the same name elsewhere) and once; a lazy
model sized by a batch of two (a BatchNorm without running statistics has no spread in one); ``model_blocks``
on the meta device; the cache of "does the cut model train as itself" (one check per spec whatever the order
of its options, a refusal cached too, the least recently used spec evicted at ``_VERDICTS_SIZE``); the size
``CHECK_BYTES`` at which the check still runs, above which it is skipped with a warning naming MiB; a factory
that draws its sizes from torch's generator (both instances of the check built from one seed); the example
batch of ``check_input`` (two samples, as its message says); and ``with_kwargs``."""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import pytest
import torch
from torch import nn

from splitfed.engine.limits import MAX_CLASSES, MAX_KWARGS_JSON, MAX_VOCAB
from splitfed.errors import ConfigError
from splitfed.models import zoo
from splitfed.models.zoo import build, check_input, model_blocks, resolve_spec, with_kwargs

HERE = "tests.test_mutants_zoo_b"


# ---------------------------------------------------------------- models


class _Reverse(torch.autograd.Function):
    """A gradient reversal: lost in tracing, so a traced model using it does not train as itself."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def, override]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def, override]
        return -0.5 * g


class _Net(nn.Module):
    """Traced (not a Sequential): 12 -> width -> 10, (23 * width + 10) float32 parameters."""

    def __init__(self, width: int, reverse: bool) -> None:
        super().__init__()
        self.f, self.g = nn.Linear(12, width), nn.Linear(width, 10)
        self.reverse = reverse

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.f(x))
        if self.reverse:
            h = _Reverse.apply(h)
        return self.g(h)


def net(width: int = 16, reverse: bool = False) -> nn.Module:
    return _Net(width, reverse)


def anything(**kwargs: object) -> nn.Module:
    return _Net(16, False)


def drawn() -> nn.Module:
    """Its width drawn from torch's generator: the same model from one seed, another from another seed."""
    return _Net(int(torch.randint(4, 64, ())), False)


def lazy_batchnorm() -> nn.Module:
    """A lazy layer before a BatchNorm that keeps no running statistics: it normalises by the batch even in
    eval mode, and a batch of one sample has no spread."""
    return nn.Sequential(nn.LazyLinear(8), nn.BatchNorm1d(8, track_running_stats=False), nn.ReLU(), nn.Linear(8, 10))


class _Sequence(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(12, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(x).unsqueeze(1).expand(-1, 4, -1)  # [batch, 4, 10]: no logits


def sequence() -> nn.Module:
    return _Sequence()


def _net_bytes(width: int) -> int:
    return (23 * width + 10) * 4


def _spec(factory: str = "net", **options: object) -> zoo.ModelSpec:
    return resolve_spec(f"{HERE}:{factory}", input_shape=(12,), num_classes=10, options=options)


@pytest.fixture
def verdicts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """An empty verdict cache, and the width of the model each check_trains_as_model call trains."""
    calls: list[int] = []
    check = zoo.check_trains_as_model

    def counted(*args: Any) -> None:
        calls.append(args[1].f.out_features)
        check(*args)

    monkeypatch.setattr(zoo, "check_trains_as_model", counted)
    monkeypatch.setattr(zoo, "_VERDICTS", type(zoo._VERDICTS)())
    return calls


# ---------------------------------------------------------------- resolve_spec's bounds


def test_a_vocabulary_of_two_tokens_is_taken_and_of_one_refused() -> None:
    """Token ids in [0, vocab): two is the least vocabulary with any choice in it."""
    assert resolve_spec("transformer", vocab=2).vocab == 2
    with pytest.raises(ConfigError, match=rf"^vocab must be in 2\.\.{MAX_VOCAB:,}, got 1$"):
        resolve_spec("transformer", vocab=1)


def test_the_largest_vocabulary_and_class_count_are_taken_and_one_more_refused() -> None:
    """``least..most`` includes ``most``."""
    spec = resolve_spec("transformer", num_classes=MAX_CLASSES, vocab=MAX_VOCAB)
    assert (spec.vocab, spec.num_classes) == (MAX_VOCAB, MAX_CLASSES)
    with pytest.raises(ConfigError, match=rf"^vocab must be in 2\.\.{MAX_VOCAB:,}, got {MAX_VOCAB + 1}$"):
        resolve_spec("transformer", vocab=MAX_VOCAB + 1)
    with pytest.raises(ConfigError, match=rf"^num_classes must be in 1\.\.{MAX_CLASSES:,}, got {MAX_CLASSES + 1}$"):
        resolve_spec("mlp", num_classes=MAX_CLASSES + 1)


def test_model_options_of_exactly_the_limit_as_json_are_taken_and_one_character_more_refused() -> None:
    """A tier takes a spec whose options are up to MAX_KWARGS_JSON characters as JSON: that many pass here."""
    note = "a" * (MAX_KWARGS_JSON - len(json.dumps({"note": ""})))
    spec = resolve_spec(f"{HERE}:anything", input_shape=(12,), note=note)
    assert len(json.dumps(spec.kwargs, sort_keys=True)) == MAX_KWARGS_JSON
    with pytest.raises(ConfigError, match=rf"^model {HERE}:anything: its keyword arguments take over "
                                          rf"{MAX_KWARGS_JSON:,} characters as JSON: "):
        resolve_spec(f"{HERE}:anything", input_shape=(12,), note=note + "a")


# ---------------------------------------------------------------- a user's module in the working folder


def _module(folder: Any, name: str, body: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(body)


@pytest.fixture
def own_path(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """sys.path without the working folder ('' included), given back afterwards with sys.modules."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("zoo_b_user"):
            del sys.modules[name]


_FACTORY = "from torch import nn\n\ndef make():\n    return nn.Linear(4, 3)\n"


def test_a_factory_in_the_working_folder_imports_with_that_folder_first_on_sys_path_once(
        own_path, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """A user runs splitfed from their project folder: ``mymodel:make`` there imports though the folder is
    not on sys.path, and it goes first, once, however many specs are resolved."""
    _module(tmp_path, "zoo_b_user_here", _FACTORY)
    monkeypatch.chdir(tmp_path)
    importlib.invalidate_caches()
    assert str(tmp_path) not in sys.path
    for _ in range(2):
        spec = resolve_spec("zoo_b_user_here:make", input_shape=(4,), num_classes=3)
    assert sys.path[0] == str(tmp_path) and sys.path.count(str(tmp_path)) == 1
    assert isinstance(build(spec, 0), nn.Linear)


def test_the_working_folders_module_wins_over_one_of_the_same_name_on_sys_path(
        own_path, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """The user's own module is the one meant: their folder goes ahead of everything on sys.path, even a
    module of the same name first there (which has no factory)."""
    other, own = tmp_path / "other", tmp_path / "own"
    _module(other, "zoo_b_user_shadow", "NOTHING = 0\n")
    _module(own, "zoo_b_user_shadow", _FACTORY)
    monkeypatch.setattr(sys, "path", [str(other), *sys.path])
    monkeypatch.chdir(own)
    importlib.invalidate_caches()
    spec = resolve_spec("zoo_b_user_shadow:make", input_shape=(4,), num_classes=3)
    assert isinstance(build(spec, 0), nn.Linear)


# ---------------------------------------------------------------- building


def test_a_lazy_model_is_sized_by_two_samples() -> None:
    """A BatchNorm without running statistics after a lazy layer: one sample (no spread) would fail."""
    model = build(_spec("lazy_batchnorm"), 0)
    assert model[0].weight.shape == (8, 12)


def test_model_blocks_on_the_meta_device_gives_the_model_and_its_blocks() -> None:
    """A tier sizes a model on the meta device (Describe): the model and its blocks come back, unchecked."""
    spec = resolve_spec("mlp")
    n = len(model_blocks(spec)[1])
    with torch.device("meta"):
        model, blocks = model_blocks(spec)
    assert len(blocks) == n
    assert all(p.is_meta for p in model.parameters())


def test_check_input_runs_two_samples_as_its_message_says() -> None:
    """The refusal of an output that is no logits gives its shape for the two samples it names."""
    spec = _spec("sequence")
    with pytest.raises(ConfigError) as e:
        check_input(spec, build(spec, 0))
    assert str(e.value) == (f"model {HERE}:sequence outputs [2, 4, 10] for two samples of shape (12,); "
                            "expected logits of shape [2, 10]")


def test_with_kwargs_gives_a_copy_of_the_spec_with_options_set() -> None:
    """Options given override the spec's, the others kept; the spec itself is unchanged (it is frozen)."""
    spec = with_kwargs(resolve_spec("resnet18"), width=8)
    assert spec == zoo.ModelSpec("resnet18", (3, 32, 32), 10, kwargs={"width": 8})
    assert with_kwargs(spec, width=16).kwargs == {"width": 16} and spec.kwargs == {"width": 8}

# ---------------------------------------------------------------- the verdict: checked once per spec


def test_a_spec_is_checked_once_whatever_the_order_of_its_options(verdicts: list[int]) -> None:
    """Two specs equal but for the order of their options are one model (ModelSpec equality): one check."""
    a, b = _spec(width=16, reverse=False), _spec(reverse=False, width=16)
    assert a == b and list(a.kwargs) != list(b.kwargs)
    model_blocks(a)
    model_blocks(b)
    assert verdicts == [16]


def test_a_refusal_is_cached_as_an_acceptance_is(verdicts: list[int]) -> None:
    """A refused model is refused again, with the same message, without training it again."""
    spec = _spec(width=8, reverse=True)
    said = []
    for _ in range(2):
        with pytest.raises(ConfigError, match="would not train as itself when cut") as e:
            model_blocks(spec)
        said.append(str(e.value))
    assert said[0] == said[1]
    assert verdicts == [8]


def test_the_least_recently_used_verdict_is_evicted_at_the_cache_size(verdicts: list[int], monkeypatch) -> None:  # noqa: ANN001
    """Two verdicts kept: a third evicts the one used longest ago (not the newest, not one too early)."""
    monkeypatch.setattr(zoo, "_VERDICTS_SIZE", 2)
    for width in (8, 9, 8, 10, 8, 10, 9):  # 9 is evicted by 10 (8 was used since); then 8 by 9
        model_blocks(_spec(width=width))
    assert verdicts == [8, 9, 10, 9]
    assert len(zoo._VERDICTS) == 2


def test_an_accepted_model_trains_as_itself_with_no_refusal() -> None:
    """``_trains_as_itself`` says "" (a string, as a refusal is) for a model it accepts."""
    spec = _spec(width=8)
    assert zoo._trains_as_itself(spec, spec.example_input(2)) == ""


def test_a_factory_drawing_its_sizes_from_torchs_generator_is_checked_on_two_instances_from_one_seed(
        verdicts: list[int]) -> None:
    """Every process builds it from one seed, so it is one model: both instances of the check come from seed 0
    (here seeds 0 and 1 build other widths, and the check would refuse it as built differently each time)."""
    spec = _spec("drawn")
    assert build(spec, 0).f.out_features != build(spec, 1).f.out_features
    model_blocks(spec, 1)
    assert verdicts == [build(spec, 0).f.out_features]


# ---------------------------------------------------------------- CHECK_BYTES


def test_a_model_of_exactly_check_bytes_is_still_checked_and_not_warned_about(verdicts, monkeypatch, caplog) -> None:  # noqa: ANN001
    """Up to CHECK_BYTES the cut model is trained beside itself (a lost reversal refused), silently."""
    monkeypatch.setattr(zoo, "CHECK_BYTES", _net_bytes(8))
    with caplog.at_level("WARNING", logger="splitfed.models.zoo"), \
            pytest.raises(ConfigError, match="would not train as itself when cut"):
        model_blocks(_spec(width=8, reverse=True))
    assert verdicts == [8]
    assert caplog.records == []


def test_a_model_one_byte_over_check_bytes_is_not_checked(verdicts, monkeypatch, caplog) -> None:  # noqa: ANN001
    """Its size counted in bytes (not elements): one byte over, the check is skipped and the log says so."""
    monkeypatch.setattr(zoo, "CHECK_BYTES", _net_bytes(8) - 1)
    with caplog.at_level("WARNING", logger="splitfed.models.zoo"):
        model_blocks(_spec(width=8, reverse=True))  # not refused: not checked
    assert verdicts == []
    assert [r.levelname for r in caplog.records] == ["WARNING"]


def test_the_warning_gives_the_model_and_the_limit_in_mib(verdicts, monkeypatch, caplog) -> None:  # noqa: ANN001
    """A 3 MiB model above a 2 MiB limit: both numbers in MiB, exactly."""
    width = 34193
    assert round(_net_bytes(width) / 2**20, 3) == 3.0
    monkeypatch.setattr(zoo, "CHECK_BYTES", 2 << 20)
    with caplog.at_level("WARNING", logger="splitfed.models.zoo"):
        model_blocks(_spec(width=width))
    assert [r.getMessage() for r in caplog.records] == [
        f"model {HERE}:net (3 MiB of parameters) is not trained beside itself to check its tracing (above 2 MiB): "
        "check it with splitfed verify against your own training"]
    assert verdicts == []

