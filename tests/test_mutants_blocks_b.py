"""What a mutation run of ``splitfed.models.blocks`` (lines 293-604, now ``models.tying``) found unwatched: the memory
a tensor views (a one-element tensor has some; a view's span needs a stride per dimension), parameter sizes with
ties counted once (a one-element tie, on meta too; one memory seen through two storage objects; an expanded
parameter counted whole; whole numbers, never floats), which blocks a shared storage joins (views side by side in a
flat buffer are no tie, whichever comes first), what a joined block's copy and moves keep tied (a tie beside other
tensors of its buffer, three views of one weight, a byte view beside a float one, a no-op move that must not copy, a
memory format change, a cast that keeps views alike shared and each tensor its shape), the name of a block joined
from more than three, what counts as equal to rounding (NaN where the other has NaN, the documented 1e-6 + 1e-6
relative edge, integers and dtypes exactly), a block that draws under ``fork_rng`` counted as drawing, and a flag
per block."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from splitfed.models.blocks import to_blocks
from splitfed.models.check import close_values, mark_stochastic, same_values, stochastic_flags
from splitfed.models.segment import STOCHASTIC_ATTR
from splitfed.models.tying import Joined, memory_extent, param_sizes, view_span

# ---------------------------------------------------------------- memory a tensor views, sizes of parameters


def test_view_span_needs_a_stride_per_dimension() -> None:
    """The elements from a view's first to its last; a size and a stride of different lengths are a caller's
    mistake, refused rather than measured on the shorter."""
    assert view_span((2, 3), (3, 1)) == 6
    assert view_span((2, 3), (6, 1)) == 9  # every other row skipped
    assert view_span((4,), (0,)) == 1  # expanded: one element seen four times
    with pytest.raises(ValueError):
        view_span((2, 3), (3,))


def test_a_one_element_tensor_has_memory_and_an_empty_one_none() -> None:
    """A scalar weight (a learned temperature) views 4 bytes; only an empty tensor views none."""
    t = torch.zeros(1)
    assert memory_extent(t) == ((("cpu", t.untyped_storage().data_ptr())), t.data_ptr(), t.data_ptr() + 4)
    assert memory_extent(torch.zeros(0)) is None
    assert memory_extent(torch.zeros(3, device="meta")) is None


def test_a_one_element_tie_is_counted_once_on_cpu_and_on_meta() -> None:
    """``b.weight.data = a.weight.data`` on a one-value weight: one value in memory, whether the model is real
    or sized on the meta device."""
    for device in ("cpu", "meta"):
        with torch.device(device):
            a, b = nn.Linear(1, 1, bias=False), nn.Linear(1, 1, bias=False)
        b.weight.data = a.weight.data
        assert param_sizes([a.weight, b.weight]) == (1, 4), device


def test_one_memory_through_two_storage_objects_is_counted_once() -> None:
    """``torch.from_numpy(w.numpy())`` views the same bytes through another storage object: one memory, so
    counted once (and its blocks joined), not as two."""
    a = nn.Parameter(torch.arange(6.0))
    b = nn.Parameter(torch.from_numpy(a.detach().numpy()))
    assert a.data_ptr() == b.data_ptr()
    assert param_sizes([a, b]) == (6, 24)
    first, second = nn.Linear(3, 2, bias=False), nn.Linear(3, 2, bias=False)
    second.weight = nn.Parameter(torch.from_numpy(first.weight.detach().numpy()))
    blocks = to_blocks(nn.Sequential(first, second, nn.ReLU()))
    assert len(blocks) == 2 and isinstance(blocks.modules[0], Joined)


def test_an_expanded_parameter_counts_all_its_elements() -> None:
    """One tensor alone counts whole, even when its memory is smaller (stride 0: what its state holds)."""
    p = nn.Parameter(torch.ones(1).expand(4))
    assert param_sizes([p]) == (4, 16)


def test_sizes_are_whole_numbers() -> None:
    """Element and byte counts are ints (a report prints them), with an empty parameter and a tie among them."""
    flat = torch.zeros(8)
    sizes = param_sizes([torch.empty(0), flat[:4], flat[2:6]])
    assert sizes == (6, 24)
    assert [type(v) for v in sizes] == [int, int]
    sizes = param_sizes([torch.empty(0, dtype=torch.float64)])
    assert sizes == (0, 0) and [type(v) for v in sizes] == [int, int]


# ---------------------------------------------------------------- which blocks a storage joins


@pytest.mark.parametrize("first_at", [0, 4])
def test_views_side_by_side_in_one_buffer_do_not_join_their_blocks(first_at: int) -> None:
    """Two blocks' weights that lie next to each other in one flat buffer (either first) share no memory: the
    model still cuts between them."""
    flat = torch.zeros(8)
    a, b = nn.Linear(4, 1, bias=False), nn.Linear(4, 1, bias=False)
    a.weight.data = flat[first_at: first_at + 4].view(1, 4)
    b.weight.data = flat[4 - first_at: 8 - first_at].view(1, 4)
    blocks = to_blocks(nn.Sequential(a, b, nn.ReLU()))
    assert blocks.modules == [a, b, blocks.modules[2]] and len(blocks) == 3


def test_a_block_joined_from_more_than_three_is_named_by_its_first_three() -> None:
    """Blocks 0..3 share a weight: one block named by its first three parts and '+...'."""
    a, d = nn.Linear(4, 4), nn.Linear(4, 4)
    d.weight = a.weight
    blocks = to_blocks(nn.Sequential(a, nn.ReLU(), nn.Tanh(), d, nn.Sigmoid()))
    assert blocks.names == ["Linear+ReLU+Tanh+...", "Sigmoid"]


# ---------------------------------------------------------------- a joined block's copies and moves


class _Views(nn.Module):
    """Parameters ``w0, w1, ...`` viewing slices of one flat buffer (shapes as given)."""

    def __init__(self, flat: torch.Tensor, slices: list[tuple[int, int, tuple[int, ...]]]) -> None:
        super().__init__()
        for i, (lo, hi, shape) in enumerate(slices):
            self.register_parameter(f"w{i}", nn.Parameter(flat[lo:hi].view(shape)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _joined(m: nn.Module) -> Any:
    blocks = to_blocks(nn.Sequential(m, nn.ReLU()))
    assert isinstance(blocks.modules[0], Joined)
    return blocks.modules[0]


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_a_copy_keeps_a_tie_that_lies_between_other_tensors_of_its_buffer() -> None:
    """A bias, a 4x4 weight, its first row as another parameter, then one more value, all in one buffer: a
    tier's copy keeps the row tied to the weight, holds only the weight's 16 values, shares nothing."""
    flat = torch.arange(21.0)
    joined = _joined(_Views(flat, [(0, 4, (4,)), (4, 20, (4, 4)), (4, 8, (4,)), (20, 21, (1,))]))
    twin = copy.deepcopy(joined)
    w, row = twin[0].w1, twin[0].w2
    assert torch.equal(w, flat[4:20].view(4, 4)) and torch.equal(row, flat[4:8])
    with torch.no_grad():
        w[0, 1] = -1.0
    assert float(row[1].detach()) == -1.0
    assert w.untyped_storage().nbytes() == 16 * 4
    assert float(flat[5]) == 5.0 and not _shares(w, flat)


def test_a_copy_keeps_every_row_tied_to_the_weight_they_view() -> None:
    """A 4x4 weight and two of its rows (0 and 2): both rows stay tied in a copy (one was left out when the
    views were ordered by where they end)."""
    flat = torch.arange(20.0)
    joined = _joined(_Views(flat, [(0, 16, (4, 4)), (0, 4, (4,)), (8, 12, (4,)), (16, 20, (4,))]))
    twin = copy.deepcopy(joined)
    w, row0, row2 = twin[0].w0, twin[0].w1, twin[0].w2
    with torch.no_grad():
        w[0, 2] = -1.0
        w[2, 1] = -2.0
    assert float(row0[2].detach()) == -1.0 and float(row2[1].detach()) == -2.0


def test_a_copy_keeps_a_byte_view_beside_a_float_weight() -> None:
    """A float weight 4 bytes into a byte buffer and a byte view from byte 2 (packed bytes): the copy starts
    at a whole float before both, so each views the same bytes as before."""
    base = torch.zeros(24, dtype=torch.uint8)
    m = nn.Module()
    m.weight = nn.Parameter(base[4:20].view(torch.float32))
    m.register_buffer("packed", base[2:10])
    m.forward = lambda x: x  # type: ignore[method-assign]
    twin = copy.deepcopy(_joined(m))
    w, packed = twin[0].weight, twin[0].packed
    assert w.shape == (4,) and packed.shape == (8,)
    with torch.no_grad():
        w[0] = 1.0
    assert packed[2:6].tolist() == list(torch.tensor([1.0]).view(torch.uint8).tolist())
    assert packed[:2].tolist() == [0, 0]


def test_a_move_to_where_it_is_copies_nothing() -> None:
    """``.float()`` on a float model, ``.to("cpu")`` on a CPU one: the tied tensors keep their memory (the
    buffer the user made them from still is the model's)."""
    flat = torch.arange(20.0)
    joined = _joined(_Views(flat, [(0, 16, (4, 4)), (0, 4, (4,))]))
    joined.float()
    joined.to("cpu")
    assert _shares(joined[0].w0, flat) and _shares(joined[0].w1, flat)
    assert joined[0].w0.data_ptr() == flat.data_ptr()


def test_a_memory_format_change_keeps_a_row_tied_to_its_weight() -> None:
    """``.to(memory_format=channels_last)`` moves the 4-d weight, not its 1-d row: a move, not a cast, so the
    row is tied to the weight again (a tier's update to one is the other's)."""
    flat = torch.arange(16.0)
    joined = _joined(_Views(flat, [(0, 16, (1, 4, 2, 2)), (0, 4, (4,))]))
    joined.to(memory_format=torch.channels_last)
    w, row = joined[0].w0, joined[0].w1
    assert torch.equal(w, flat.view(1, 4, 2, 2)) and torch.equal(row, flat[:4])
    with torch.no_grad():
        w[0, 0, 0, 1] = -1.0
    assert float(row[1].detach()) == -1.0


def test_a_cast_keeps_each_tensor_its_own_shape_and_values() -> None:
    """``.half()`` casts a weight and a row of it apart: each keeps its shape and values (a row was given the
    weight's data, or the weight the row's)."""
    flat = torch.arange(16.0)
    joined = _joined(_Views(flat, [(0, 16, (4, 4)), (0, 4, (4,))]))
    joined.half()
    w, row = joined[0].w0, joined[0].w1
    assert w.shape == (4, 4) and row.shape == (4,)
    assert w.dtype == row.dtype == torch.float16
    assert torch.equal(w, flat.view(4, 4).half()) and torch.equal(row, flat[:4].half())


def test_a_cast_keeps_identical_views_one_beside_a_view_it_does_not_cast() -> None:
    """Two parameters viewing one weight alike and a complex view of the same bytes between them (``.half()``
    leaves complex as it is): the two still share after the cast."""
    flat = torch.arange(16.0)
    m = nn.Module()
    m.a = nn.Parameter(flat.view(4, 4))
    m.c = nn.Parameter(flat.view(torch.complex64))
    m.b = nn.Parameter(flat.view(4, 4))
    m.forward = lambda x: x  # type: ignore[method-assign]
    joined = _joined(m)
    joined.half()
    a, b, c = joined[0].a, joined[0].b, joined[0].c
    assert a.dtype == b.dtype == torch.float16 and c.dtype == torch.complex64
    assert a.data_ptr() == b.data_ptr()


def test_a_cast_keeps_two_rows_that_view_a_weight_alike_shared() -> None:
    """A 4x4 weight and two parameters viewing its first row alike: after ``.half()`` the two rows still share
    (the rows, not the weight registered before them, are what each compares with)."""
    flat = torch.arange(16.0)
    joined = _joined(_Views(flat, [(0, 16, (4, 4)), (0, 4, (4,)), (0, 4, (4,))]))
    joined.half()
    w, row, again = joined[0].w0, joined[0].w1, joined[0].w2
    assert w.shape == (4, 4) and row.dtype == again.dtype == torch.float16
    assert row.data_ptr() == again.data_ptr() and torch.equal(row, flat[:4].half())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device to move to")
def test_a_move_to_another_device_moves_the_tie_there() -> None:
    """``.to("cuda")``: the tied weight and row move, and stay tied, on the GPU."""
    flat = torch.arange(20.0)
    joined = _joined(_Views(flat, [(0, 16, (4, 4)), (0, 4, (4,)), (16, 20, (4,))]))
    joined.to("cuda")
    w, row = joined[0].w0, joined[0].w1
    assert w.device.type == row.device.type == "cuda"
    with torch.no_grad():
        w[0, 1] = -1.0
    assert float(row[1].detach()) == -1.0


# ---------------------------------------------------------------- equal, and equal to rounding


def test_a_mapping_is_never_the_same_as_something_else() -> None:
    """A block's output a dict under one seed and a list or value under another differs (not an error)."""
    t = torch.ones(2)
    assert same_values({"a": t}, {"a": t.clone()})
    assert not same_values({"a": t}, [t])
    assert not same_values([t], {"a": t})
    assert not same_values({"a": 1}, 1)


def test_equal_to_rounding_at_the_documented_edge() -> None:
    """Within 1e-6 of the larger's magnitude plus 1e-6 relative: at magnitude 1 a difference of 1.9e-6 is
    rounding, 2.1e-6 is not; a floor widens it."""
    one = torch.tensor([1.0], dtype=torch.float64)
    assert close_values(one, one.clone())
    assert close_values(one, one + 1.9e-6)
    assert not close_values(one, one + 2.1e-6)
    assert close_values(one, one + 5e-4, floor=1e-3)
    assert not close_values(one, one + 2e-3, floor=1e-3)


def test_equal_to_rounding_with_nan_where_the_other_has_nan() -> None:
    """NaN where the other has NaN, and the rest within rounding: close (NaN is not a difference of 1)."""
    a = torch.tensor([float("nan"), 1.0], dtype=torch.float64)
    assert close_values(a, torch.tensor([float("nan"), 1.0 + 1e-7], dtype=torch.float64))
    assert not close_values(a, torch.tensor([0.0, 1.0], dtype=torch.float64))


def test_integers_and_other_dtypes_are_never_close_only_equal() -> None:
    """A counter off by one is a difference however large it is, and float32 is not float64 (a lost cast)."""
    assert not close_values(torch.tensor([10_000_000]), torch.tensor([10_000_001]))
    assert close_values(torch.tensor([10_000_000]), torch.tensor([10_000_000]))
    assert not close_values(torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64))
    assert not close_values(torch.ones(2), torch.ones(3))


# ---------------------------------------------------------------- which blocks draw


class _ForkedNoise(nn.Module):
    """Draws from torch's generator inside ``fork_rng``: the generator's state does not move, its output
    does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.random.fork_rng(devices=[]):
            return x + torch.randn_like(x)


def test_a_block_that_draws_under_fork_rng_counts_as_drawing() -> None:
    """Its generator state is given back, but two seeds give two outputs: it draws (re-seeded on every tier)."""
    blocks = to_blocks(nn.Sequential(nn.Linear(3, 3), _ForkedNoise()))
    assert stochastic_flags(blocks, torch.zeros(2, 3)) == [False, True]


def test_a_flag_per_block() -> None:
    """``mark_stochastic`` with fewer flags than blocks is a caller's mistake: refused, not half applied."""
    blocks = to_blocks(nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)))
    with pytest.raises(ValueError):
        mark_stochastic(blocks, [True])
    mark_stochastic(blocks, [False, True])
    assert [getattr(m, STOCHASTIC_ATTR) for m in blocks.modules] == [False, True]
