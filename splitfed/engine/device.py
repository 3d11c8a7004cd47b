"""The device tier of one client: it holds the head (and, U-shaped, the tail) and drives each step.

It computes on ``torch_device`` (a Jetson's GPU, say): its blocks, batches and
optimizer state live there, and what it sends and receives is on the CPU, as on
every tier's wire.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from splitfed.engine import template
from splitfed.engine.checks import check_returned
from splitfed.engine.link import Link
from splitfed.engine.types import OptimConfig, State, StepKey
from splitfed.errors import ConfigError, CutError
from splitfed.models.segment import Segment, segment_bounds, step_rng, validate_cuts
from splitfed.models.zoo import ModelSpec


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _integer(dtype: torch.dtype) -> bool:
    """Token ids' kind of dtype: integers, not bool (a mask, not an id)."""
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def entry_input(model: ModelSpec, x: torch.Tensor, *, first_block_here: bool) -> torch.Tensor:
    """The chain's input as the model's template declares it, whichever tier holds block 0.

    Integer ids of another integer dtype (int32, uint8) are cast to the template's (int64 for a token model),
    here and once, so a run computes alike with block 0 on the device or on a tier (whose boundary check takes
    the template's dtype only). Another kind (floats to a token model, integers to a float model) is refused
    here, naming the model and both dtypes, unless the device runs block 0 and that block takes it (a model
    that casts its own input).
    """
    want = template.boundary(model, 0)[1]
    if x.dtype == want:
        return x
    if _integer(x.dtype) and _integer(want):
        given, to = torch.iinfo(x.dtype), torch.iinfo(want)
        if given.min < to.min or given.max > to.max:  # a cast could wrap an id into another (uint64 to int64)
            raise ConfigError(f"model {model.name!r} takes {_name(want)} inputs, got {_name(x.dtype)}: give it "
                              f"token ids of an integer dtype that {_name(want)} holds every value of")
        return x.to(want)
    if first_block_here and template.first_block_takes(model, x.dtype):
        return x
    how = (f"token ids of an integer dtype (they are cast to {_name(want)})" if _integer(want)
           else f"{_name(want)} values (convert them first, e.g. x.float())")
    raise ConfigError(f"model {model.name!r} takes {_name(want)} inputs, got {_name(x.dtype)}: give it {how}")


class Device:
    """Runs one client's local training through its link; labels stay here in U-shape."""

    def __init__(self, model: ModelSpec, link: Link, *, run_id: str, client_id: str, round: int,
                 cuts: tuple[int, ...], state: State, u_shape: bool = False,
                 optim: OptimConfig | None = None, seed: int = 0,
                 torch_device: str | torch.device = "cpu", secret: str = "") -> None:
        self.torch_device = dev = torch.device(torch_device)
        n = template.num_blocks(model)
        bounds = segment_bounds(validate_cuts(cuts, n, u_shape=u_shape, model=model.name), n, u_shape)
        self.head_bounds = bounds[0]
        self.tail_bounds = bounds[-1] if u_shape else (n, n)
        blocks = {i: m.to(dev) for i, m in {**template.copy_blocks(model, *self.head_bounds),
                                             **template.copy_blocks(model, *self.tail_bounds)}.items()}
        self.head = Segment({str(i): blocks[i] for i in range(*self.head_bounds)}, *self.head_bounds)
        self.tail = Segment({str(i): blocks[i] for i in range(*self.tail_bounds)}, *self.tail_bounds)
        with torch.no_grad():
            for seg in (self.head, self.tail):
                own = seg.state_dict()
                missing = sorted(set(own) - set(state))
                if missing:
                    raise ConfigError(f"device weights lack {missing[:3]} for blocks [{seg.start}, {seg.stop})")
                for k, v in own.items():  # else load_state_dict's RuntimeError, or a silent cast of the dtype
                    if state[k].shape != v.shape or state[k].dtype != v.dtype:
                        raise ConfigError(f"device weights {k!r}: {str(state[k].dtype).removeprefix('torch.')} "
                                          f"{list(state[k].shape)}, but model {model.name!r} has "
                                          f"{str(v.dtype).removeprefix('torch.')} {list(v.shape)}")
                seg.load_state_dict({k: state[k] for k in own}, strict=True)
        self.head.train()
        self.tail.train()
        # no server block between head and tail: the step never leaves the device
        self.local = self.head_bounds[1] == (self.tail_bounds[0] if u_shape else n)
        self.model = model
        self.first_block_here = self.local or self.head_bounds[1] > 0  # else the first server tier holds it
        self.link, self.u_shape, self.seed = link, u_shape, seed
        self.run_id, self.client_id, self.round = run_id, client_id, round
        self.secret = secret  # the client's binding secret (SegmentLoad.secret): every step carries it
        self.optim = (optim or OptimConfig()).build([*self.head.parameters(), *self.tail.parameters()])
        self.seq = 0
        self.compute_s = 0.0
        self.link_s = 0.0
        self.samples = 0

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
        """One step across the whole chain; returns (loss, correct predictions)."""
        key = StepKey(self.run_id, self.client_id, self.round, self.seq, self.secret)
        rng = step_rng(self.seed, self.client_id, self.round, self.seq)
        t0 = self._now()
        x = entry_input(self.model, x, first_block_here=self.first_block_here)
        labels, x, y = y, x.to(self.torch_device), y.to(self.torch_device)  # labels: the wire's (CPU) copy
        out = self.head(x, rng=rng)
        t1 = self._now()
        if self.local:
            logits = self.tail(out, rng=rng) if self.u_shape else out
            lt = F.cross_entropy(logits, y)
            if lt.requires_grad:
                lt.backward()
            loss, correct = float(lt.detach()), int((logits.detach().argmax(1) == y).sum())
            t2 = t1
        elif not self.u_shape:
            reply = self.link.step(key, out.detach().cpu(), labels)
            t2 = self._now()
            if reply.grad is not None:
                check_returned(reply.grad, out, f"step {key.seq} of {self.client_id}: the edge's gradient")
                if out.requires_grad:
                    out.backward(reply.grad.to(self.torch_device))
            loss, correct = reply.loss, reply.correct
        else:
            mid = self.link.forward(key, out.detach().cpu()).detach()
            t2 = self._now()
            check_returned(mid, out, f"forward {key.seq} of {self.client_id}: the servers' output", batch_only=True)
            mid = mid.to(self.torch_device)
            if not mid.is_floating_point():  # the cost model never chooses such a tail cut (Scenario.options)
                raise CutError(f"{self.client_id}: the U-shape tail's input is a {mid.dtype} tensor: no gradient "
                               "can go back to the servers' blocks through it; choose another tail cut")
            mid.requires_grad_(True)
            logits = self.tail(mid, rng=rng)
            lt = F.cross_entropy(logits, y)
            if lt.requires_grad:
                lt.backward()
            loss, correct = float(lt.detach()), int((logits.detach().argmax(1) == y).sum())
            t3 = self._now()
            # None: no gradient came through the tail (a block of it detaches): the servers release the step,
            # their blocks left without a gradient, as the whole model leaves them
            g = self.link.backward(key, None if mid.grad is None else mid.grad.cpu())
            t2 += self._now() - t3
            if g is not None:
                check_returned(g, out, f"backward {key.seq} of {self.client_id}: the edge's gradient")
                if out.requires_grad:
                    out.backward(g.to(self.torch_device))
        if self.optim is not None:
            self.optim.step()
            self.optim.zero_grad(set_to_none=True)
        t4 = self._now()
        self.link_s += t2 - t1
        self.compute_s += (t4 - t0) - (t2 - t1)
        self.seq += 1
        self.samples += int(x.shape[0])
        return loss, correct

    def _now(self) -> float:
        """The clock, once a GPU has done what it was given: its work counts as compute, not as the link's
        wait (the measured times update this device's profile, and so where its cuts go)."""
        if self.torch_device.type == "cuda":
            torch.cuda.synchronize(self.torch_device)
        return time.perf_counter()

    def state(self) -> State:
        return {k: v.detach().to("cpu", copy=True)
                for k, v in {**self.head.state_dict(), **self.tail.state_dict()}.items()}
