"""What a mutation run of ``splitfed.models.blocks`` (its first half, now mostly ``models.segment``) found unwatched:
the dropout key of a step and the seed of a block are fixed values (every tier, a resumed run and a tier in another
process must draw the same masks), which blocks count as drawing random numbers (an RNN's or attention's dropout
only when it is above 0), a segment's input copied only when it must be, empty segments allowed and segments past
the blocks refused, a Sequential subclass with its own forward traced (not cut at its children), a
``train``/``eval`` override that moves a module the tiers would not refused whatever other overrides the model has,
and which block outputs are legal boundaries (one tensor, batch first: a per-sample vector is, a scalar and a
sequence-first tensor are not) checked for every block but the last."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from splitfed.errors import ConfigError, CutError
from splitfed.models.blocks import refuse_lost_modes, to_blocks
from splitfed.models.check import stochastic_flags
from splitfed.models.segment import Segment, _mix, make_segment, step_rng
from splitfed.models.tying import Joined, join_at_tuples

# ---------------------------------------------------------------- pinned seeds


def test_block_seeds_are_the_values_every_version_has_given() -> None:
    """Pinned splitmix64 values: the seed a block's dropout draws from, whatever the tier or process. A change
    changes every run's masks (a resumed run would train otherwise), so it must be a deliberate one."""
    assert _mix(0, 0) == 6238072747940578789
    assert _mix(1, 0) == 1227844342346046657
    assert _mix(0, 1) == 6616413024727798922
    assert _mix(12345, 7) == 8249303779508355290
    assert _mix(2**63 - 1, 3) == 3769678487392051657
    assert _mix(2**64 + 5, 2) == 3992596847233833366


def test_step_keys_are_the_values_every_version_has_given() -> None:
    """Pinned dropout keys of a step (seed, client, round, step): equal on every tier, and across versions."""
    assert step_rng(0, "", 0, 0) == 4618857875736427910
    assert step_rng(42, "client-1", 3, 17) == 3241804784813042617
    assert step_rng(2**40 + 12345, "edge/7", 0, 0) == 4014796003431277457
    assert step_rng(7, "c", 1, 2) == 2376660698914774624
    assert step_rng(12345, "ü", 2, 5) == 6486589831442286072
    assert step_rng(0xFFFFFFFF, "zz", 9, 9) == 4841143888661305671


def test_block_seeds_and_step_keys_are_63_bit_and_spread() -> None:
    """Seeds fit ``manual_seed`` (63 bits) and reach the top bit and the bottom one; keys of neighbouring steps
    and clients all differ."""
    seeds = [_mix(r, b) for r in range(50) for b in range(20)]
    assert all(0 <= s < 2**63 for s in seeds) and len(set(seeds)) == 1000
    assert any(s >= 2**62 for s in seeds) and any(s & 1 for s in seeds)
    keys = {step_rng(1, c, r, q) for c in ("a", "b", "ab", "ba") for r in range(5) for q in range(5)}
    assert len(keys) == 100


def test_a_segment_draws_its_mask_from_the_blocks_pinned_seed() -> None:
    """Two instances of a segment draw the same mask for one step key: the one ``manual_seed(_mix(key, block))``
    gives, block 1's seed from block index 1 (not its position in the segment)."""
    x = torch.ones(4, 64)
    blocks = [nn.Identity(), nn.Dropout(0.5)]
    seg = Segment({"1": blocks[1]}, 1, 2)
    seg.train()
    other = Segment({"0": blocks[0], "1": nn.Dropout(0.5)}, 0, 2)
    other.train()
    key = step_rng(3, "c", 1, 2)
    torch.manual_seed(_mix(key, 1))
    expected = F.dropout(x, 0.5, training=True)
    assert torch.equal(seg(x, rng=key), expected)
    assert torch.equal(other(x, rng=key), expected)


# ---------------------------------------------------------------- which blocks draw random numbers


class _FDropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(self.lin(x), 0.5, self.training)


def _flags(*blocks: nn.Module) -> dict[str, bool]:
    return Segment({str(i): b for i, b in enumerate(blocks)}, 0, len(blocks))._stochastic


def test_an_rnn_or_attention_draws_only_with_dropout_above_0() -> None:
    """An LSTM, GRU or MultiheadAttention with dropout 0 draws nothing (re-seeding it would be needless); with
    dropout above 0 it draws, and is re-seeded per step."""
    assert _flags(nn.LSTM(4, 4, num_layers=2), nn.GRU(4, 4, num_layers=2, dropout=0.0),
                  nn.MultiheadAttention(4, 2)) == {"0": False, "1": False, "2": False}
    assert _flags(nn.LSTM(4, 4, num_layers=2, dropout=0.25), nn.MultiheadAttention(4, 2, dropout=0.1)) \
        == {"0": True, "1": True}
    assert _flags(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), nn.LSTM(4, 4, num_layers=2, dropout=0.5))) \
        == {"0": False, "1": True}


def test_dropout_rrelu_and_a_traced_dropout_call_draw() -> None:
    """A Dropout or RReLU module draws, and so does a traced graph calling ``F.dropout``; a plain layer does not."""
    assert _flags(nn.Dropout(0.1), nn.RReLU(), fx.symbolic_trace(_FDropout()), nn.Linear(4, 4),
                  fx.symbolic_trace(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))) \
        == {"0": True, "1": True, "2": True, "3": False, "4": False}


def test_flags_without_running_are_booleans() -> None:
    """``stochastic_flags(run=False)`` is one bool per block, False for a block that draws nothing."""
    blocks = to_blocks(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.LSTM(4, 4, num_layers=2)))
    flags = stochastic_flags(blocks, torch.zeros(2, 4), run=False)
    assert flags == [False, True, False]
    assert flags[0] is False and flags[2] is False


# ---------------------------------------------------------------- a segment's input


def test_a_leaf_input_that_needs_its_grad_survives_an_in_place_first_op() -> None:
    """A tier's input whose ``.grad`` it sends back (a leaf requiring grad) may start with ``ReLU(inplace=True)``:
    the segment works on a copy, the gradient arrives, and the input keeps its values."""
    seg = make_segment(to_blocks(nn.Sequential(nn.ReLU(inplace=True), nn.Linear(3, 1, bias=False))), 0, 2)
    with torch.no_grad():
        seg[1].weight.copy_(torch.tensor([[1.0, 2.0, 3.0]]))
    x = torch.tensor([[-1.0, 2.0, 3.0]], requires_grad=True)
    seg(x).sum().backward()
    assert torch.equal(x.grad, torch.tensor([[0.0, 2.0, 3.0]]))
    assert torch.equal(x.detach(), torch.tensor([[-1.0, 2.0, 3.0]]))


def test_an_input_without_grad_is_not_copied() -> None:
    """An input that needs no gradient runs as the model's own forward would run it, with no copy of the
    activations: an in-place first op writes it, as the model would."""
    seg = make_segment(to_blocks(nn.Sequential(nn.ReLU(inplace=True), nn.Identity())), 0, 2)
    x = torch.tensor([[-1.0, 2.0]])
    out = seg(x)
    assert out.data_ptr() == x.data_ptr()
    assert torch.equal(x, torch.tensor([[0.0, 2.0]]))


# ---------------------------------------------------------------- segments


def test_an_empty_segment_is_allowed_and_one_past_the_blocks_refused() -> None:
    """``[i, i)`` is a segment of no blocks (its input passes through); a start after the stop, or a stop past
    the last block, is refused naming the model's block count."""
    blocks = to_blocks(nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)))
    for i in (0, 2, 3):
        seg = make_segment(blocks, i, i)
        assert len(seg) == 0 and (seg.start, seg.stop) == (i, i)
        x = torch.ones(1, 2)
        assert seg(x) is x
    assert len(make_segment(blocks, 0, 3)) == 3
    for start, stop in ((2, 1), (0, 4), (-1, 2)):
        with pytest.raises(CutError, match=rf"^segment \[{start}, {stop}\) is outside the model's 3 blocks$"):
            make_segment(blocks, start, stop)


class _Doubling(nn.Sequential):
    """A Sequential subclass whose own forward does more than run its children."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x * 2)


def test_a_sequential_with_its_own_forward_is_traced_not_cut_at_children() -> None:
    """A subclass of nn.Sequential with its own forward is traced (its children alone would drop what its
    forward adds); a plain Sequential is cut at its children, untraced."""
    torch.manual_seed(0)
    model = _Doubling(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    blocks = to_blocks(model)
    assert blocks.traced is True
    x = torch.randn(5, 3)
    assert torch.allclose(blocks.whole()(x), model(x))
    plain = to_blocks(nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2)))
    assert plain.traced is False and len(plain) == 3


# ---------------------------------------------------------------- train()/eval() overrides


class _LinT(nn.Linear):
    def train(self, mode: bool = True) -> _LinT:
        return super().train(mode)


class _BNT(nn.BatchNorm1d):
    def train(self, mode: bool = True) -> _BNT:
        return super().train(mode)


class _LinE(nn.Linear):
    def eval(self) -> _LinE:
        return super().eval()


class _BNE(nn.BatchNorm1d):
    def eval(self) -> _BNE:
        return super().eval()


class _FreezesOnTrain(nn.Module):
    """Every module overrides train() (none eval()); the root's keeps its BatchNorm in eval mode."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = _LinT(3, 3), _BNT(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))

    def train(self, mode: bool = True) -> _FreezesOnTrain:
        super().train(mode)
        self.b.eval()
        return self


class _TrainsOnEval(nn.Module):
    """Every module overrides eval() (none train()); the root's leaves its BatchNorm in training mode."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = _LinE(3, 3), _BNE(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))

    def eval(self) -> _TrainsOnEval:
        super().eval()
        self.b.train()
        return self


def test_a_train_override_is_refused_though_every_module_overrides_train() -> None:
    """The shortcut for models with no override at all must not skip a model whose modules all override
    ``train``: the root's keeps its BatchNorm in eval mode, which the tiers (setting each block's mode) would
    not."""
    model = _FreezesOnTrain()
    with pytest.raises(ConfigError, match=r"its train\(\) puts b \(_BNT\) in eval mode"):
        refuse_lost_modes(model, [model.a, model.b])


def test_an_eval_override_is_refused_though_every_module_overrides_eval() -> None:
    """Likewise for ``eval``: an eval() that leaves the BatchNorm training is refused, eval mode checked as well
    as training mode."""
    model = _TrainsOnEval()
    with pytest.raises(ConfigError, match=r"its eval\(\) puts b \(_BNE\) in training mode"):
        refuse_lost_modes(model, [model.a, model.b])
    assert model.training and model.b.training  # every mode given back


# ---------------------------------------------------------------- legal boundaries


class _Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x * 2


class _Add(nn.Module):
    def forward(self, t: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return t[0] + t[1]


class _Fn(nn.Module):
    def __init__(self, fn) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def _joined(*mods: nn.Module, example: torch.Tensor | None = None) -> list[int]:
    """The block count of each joined block: [1, 2] is block 0 alone, then blocks 1 and 2 as one."""
    blocks = to_blocks(nn.Sequential(*mods))
    out = join_at_tuples(blocks, torch.randn(3, 4) if example is None else example)
    return [len(m) if isinstance(m, Joined) else 1 for m in out.modules]


def test_a_tuple_from_the_last_but_one_block_joins_it_to_the_last() -> None:
    """Every block but the last is run for its output: a tuple from the last but one joins the last two."""
    assert _joined(nn.Linear(4, 4), _Pair(), _Add()) == [1, 2]


def test_a_per_sample_vector_is_a_legal_boundary() -> None:
    """A block's ``[B]`` output (one number per sample) has the batch first: a legal cut, nothing joined."""
    assert _joined(nn.Linear(4, 1), _Fn(lambda x: x.squeeze(1)), _Fn(lambda x: x.unsqueeze(1)),
                   nn.Linear(1, 2)) == [1, 1, 1, 1]


def test_a_scalar_or_a_sequence_first_output_is_no_boundary() -> None:
    """A 0-dim output, and a ``[T, B, d]`` one, have no batch first: joined to the next block."""
    assert _joined(nn.Linear(4, 2), _Fn(lambda x: x.sum()), _Fn(lambda s: s * 2)) == [1, 2]
    assert _joined(nn.Linear(4, 2), _Fn(lambda x: x.unsqueeze(0).expand(5, -1, -1)), _Fn(lambda x: x.mean(0)),
                   nn.Linear(2, 2)) == [1, 2, 1]


def test_an_example_without_a_batch_dimension_is_checked_for_tuples_only() -> None:
    """A 0-dim example has no batch to tell: its blocks are run for tuples only, and kept as they are."""
    assert _joined(nn.Identity(), _Fn(lambda x: x * 2), nn.Identity(), example=torch.tensor(3.0)) == [1, 1, 1]
