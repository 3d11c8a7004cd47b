"""The engine's optimizers: SGD (momentum, L2 weight decay) and Adam, update for update torch.optim's on the CPU.

Why not torch.optim itself: each of its optimizers imports ``torch._dynamo`` the first time it is built or
stepped, only to mark its methods as not to be compiled. That import costs ~2.5 s of CPU and ~70 MB of memory on
a laptop (many times the seconds on a Raspberry Pi): a tier paid it before serving its first segment, and each
simulated client's process before its first step. splitfed never compiles a model.

The update rules are torch's single-tensor ones (what torch.optim runs for CPU tensors), operation for
operation and in the same order, so the weights come out bit-identical to torch.optim's
(``tests/test_engine_optim.py`` steps both side by side). Each Parameter's state is kept under torch's names
(``momentum_buffer``; ``step``, ``exp_avg``, ``exp_avg_sq``), made at its first gradient as torch makes it, so
what :func:`splitfed.engine.types.optimizer_state_bytes` counts is what is held.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

import torch

ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults, which OptimConfig does not expose
ADAM_EPS = 1e-8


class SegmentOptimizer(ABC):
    """Steps the Parameters of one segment (or one whole model); each Parameter once, in the order given."""

    def __init__(self, params: Iterable[torch.nn.Parameter], *, lr: float, weight_decay: float) -> None:
        seen: set[int] = set()
        self.params: list[torch.nn.Parameter] = []
        for p in params:
            if id(p) not in seen:  # a Parameter shared by two blocks is one weight: stepped once
                seen.add(id(p))
                self.params.append(p)
        self.lr = float(lr)
        self.weight_decay = float(weight_decay)
        self.state: dict[torch.nn.Parameter, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()

    def step(self) -> None:
        """Apply each Parameter's gradient; one without a gradient (frozen, or off the loss's path) is left
        as it is, and gets no state."""
        with torch.no_grad():
            for p in self.params:
                if p.grad is not None:
                    self._update(p, p.grad)

    def _decayed(self, p: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        return grad.add(p, alpha=self.weight_decay) if self.weight_decay != 0 else grad

    @abstractmethod
    def _update(self, p: torch.nn.Parameter, grad: torch.Tensor) -> None:
        """One Parameter's update from its gradient (under no_grad)."""


class SGD(SegmentOptimizer):
    """torch.optim.SGD with ``dampening=0``, ``nesterov=False``, ``maximize=False``."""

    def __init__(self, params: Iterable[torch.nn.Parameter], *, lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, lr=lr, weight_decay=weight_decay)
        self.momentum = float(momentum)

    def _update(self, p: torch.nn.Parameter, grad: torch.Tensor) -> None:
        grad = self._decayed(p, grad)
        if self.momentum != 0:
            state = self.state.setdefault(p, {})
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = grad.detach().clone()
            else:
                buf.mul_(self.momentum).add_(grad, alpha=1)
            grad = buf
        p.add_(grad, alpha=-self.lr)


class Adam(SegmentOptimizer):
    """torch.optim.Adam with its default betas and eps, ``amsgrad=False``, L2 (not decoupled) weight decay."""

    def _update(self, p: torch.nn.Parameter, grad: torch.Tensor) -> None:
        if grad.is_sparse:  # as torch.optim.Adam refuses it (an nn.Embedding(sparse=True)); SGD takes one
            raise RuntimeError("Adam does not support sparse gradients: use SGD, or an nn.Embedding without "
                               "sparse=True")
        beta1, beta2 = ADAM_BETAS
        state = self.state.get(p)
        if state is None:
            # the step count as torch hosts it (a 0-d tensor on the CPU, of its scalar dtype): the memory
            # model's step_count_bytes
            scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
            state = self.state[p] = {
                "step": torch.tensor(0.0, dtype=scalar),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }
        step_t, exp_avg, exp_avg_sq = state["step"], state["exp_avg"], state["exp_avg_sq"]
        step_t += 1
        grad = self._decayed(p, grad)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = step_t.item()
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = self.lr / bias_correction1
        denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(ADAM_EPS)
        p.addcdiv_(exp_avg, denom, value=-step_size)
