"""What a mutation run of ``splitfed.engine.template`` (its first half) found unwatched: the caches' key keeps
every default dtype apart (not only float32 from the rest) and is the same for equal specs whatever order their
options were given in; :class:`template._Once` computes a key once for threads asking together and forgets the
key once no thread asks it (its count of askers); ``size`` measures exactly (the input's bytes up to
SMALL_INPUT_BYTES inclusive, the largest module output of one sample beyond, 0 only when the parameters are
over the limit, not at it); ``admit`` refuses strictly above each limit, not at it; and ``small``'s bounds are
inclusive, hold for zoo models as the zoo defines them only, and only under the default limits."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from splitfed.engine import template
from splitfed.engine.limits import DEFAULT_LIMITS, BuildLimits, set_limits
from splitfed.errors import ResourceExhausted
from splitfed.models.zoo import ModelSpec, resolve_spec


@pytest.fixture
def limits() -> Iterator[None]:
    yield
    set_limits(DEFAULT_LIMITS)


# ---------------------------------------------------------------- the caches' key


def test_each_default_dtype_gets_a_template_of_its_own_not_only_float32_apart() -> None:
    """Two processes' worth of defaults in one: a float64 template must not serve bfloat16 (a key that marked
    only float32 told float32 apart from the others, but left float64 and bfloat16 one key)."""
    spec = resolve_spec("mlp")
    n = template.num_blocks(spec)
    dtypes = {}
    try:
        for dt in (torch.float64, torch.bfloat16):
            torch.set_default_dtype(dt)
            dtypes[dt] = {p.dtype for b in template.copy_blocks(spec, 0, n).values() for p in b.parameters()}
    finally:
        torch.set_default_dtype(torch.float32)
    assert dtypes == {torch.float64: {torch.float64}, torch.bfloat16: {torch.bfloat16}}
    assert {p.dtype for b in template.copy_blocks(spec, 0, n).values() for p in b.parameters()} == {torch.float32}


def test_equal_specs_share_one_template_whatever_order_their_options_came_in() -> None:
    """One built copy of each model per process: options given as ``d=, layers=`` or ``layers=, d=`` are one
    spec, and must not build (and keep) the model twice."""
    a = resolve_spec("transformer", d=16, layers=1)
    b = resolve_spec("transformer", layers=1, d=16)
    assert a == b and list(a.kwargs) != list(b.kwargs)
    assert template.template(a) is template.template(b)


# ---------------------------------------------------------------- _Once: askers counted


def test_a_once_forgets_a_key_no_thread_asks_any_more() -> None:
    """Each call counts itself in and out: after a call (answered, or raised) nothing is left in ``_asked``, or
    every key ever asked would stay there for the process's life."""
    calls: list[str] = []

    def fn(k: str) -> str:
        calls.append(k)
        if k == "bad":
            raise ValueError("no")
        return k.upper()

    once = template._Once(fn, 8)
    assert once("a") == "A" and once._asked == {}
    assert once("a") == "A" and once._asked == {} and calls == ["a"]  # from the cache
    with pytest.raises(ValueError, match="no"):
        once("bad")
    assert once._asked == {}
    with pytest.raises(ValueError, match="no"):
        once("bad")  # an error is not cached: asked again
    assert once._asked == {} and calls == ["a", "bad", "bad"]


def test_size_leaves_no_asker_behind() -> None:
    template.size(resolve_spec("cnn", width=3))
    assert template._size._asked == {}


def test_threads_asking_one_key_together_compute_it_once_and_other_keys_go_on() -> None:
    """Many threads ask one key while its first call is still computing: one computation, every thread gets its
    answer, another key is answered meanwhile, and once they are all done the key has left ``_asked``; asked
    again, it comes from the cache and leaves again."""
    n = 8
    calls: list[str] = []
    release = threading.Event()

    def fn(k: str) -> object:
        calls.append(k)
        if k == "slow":
            assert release.wait(30)
        return object()

    once = template._Once(fn, 8)
    got: list[object] = [None] * n
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, once("slow"))) for i in range(n)]
    for t in threads:
        t.start()
    try:
        gathered = threading.Event()
        for _ in range(3000):  # every thread counted in as an asker of "slow" (one computes, the others wait)
            asked = once._asked.get(("slow",))
            if asked is not None and asked.askers == n:
                break
            gathered.wait(0.01)
        assert once._asked[("slow",)].askers == n
        other = once("other")  # another key is not held up by "slow"
        assert once("other") is other and ("other",) not in once._asked
    finally:
        release.set()
        for t in threads:
            t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert calls.count("slow") == 1 and calls.count("other") == 1
    assert all(g is got[0] for g in got) and got[0] is not None
    assert once._asked == {}
    assert once("slow") is got[0] and calls.count("slow") == 1  # asked again after it left: the cached answer
    assert once._asked == {}
    once.cache_clear()
    assert once("slow") is not got[0] and calls.count("slow") == 2


# ---------------------------------------------------------------- size: what it measures

# cnn width 2 on one 1024x1024 channel: conv 20, conv 76, BatchNorm 8, dense 4*256*256*64+64, head 650 parameters
BIG = resolve_spec("cnn", input_shape=(1, 1024, 1024), width=2)
BIG_PARAMS = 4 * (20 + 76 + 8 + 4 * 256 * 256 * 64 + 64 + 650)  # 64 MiB
BIG_PEAK = 2 * 1024 * 1024 * 4  # the first conv's output for one sample: 8 MiB (the input is 4 MiB)


def test_size_beyond_small_inputs_is_the_largest_module_output_of_one_sample() -> None:
    """Exact bytes: one sample (not a batch of two), each output's elements times their size (not divided),
    every tensor output counted (the input alone is half the answer)."""
    assert BIG_PARAMS == 67112136
    assert template.size(BIG) == (BIG_PARAMS, BIG_PEAK)


def test_size_of_a_small_input_is_the_input_in_bytes_up_to_and_at_the_bound() -> None:
    """Up to SMALL_INPUT_BYTES (inclusive) the second number is the input's bytes, unmeasured: a 1 MiB input
    whose first conv makes 2 MiB per sample still answers 1 MiB (it is bounded by the parameter check)."""
    at_bound = resolve_spec("cnn", input_shape=(1, 512, 512), width=2)
    assert template.size(at_bound) == (4 * (20 + 76 + 8 + 4 * 128 * 128 * 64 + 64 + 650), template.SMALL_INPUT_BYTES)
    assert template.size(resolve_spec("cnn"))[1] == 1 * 8 * 8 * 4  # 256 bytes of float32


def test_size_is_zero_only_above_the_parameter_limit(limits) -> None:  # type: ignore[no-untyped-def]
    """Parameters over the limit: no forward pass, the second number 0. At the limit the model may be built:
    its activations are measured."""
    set_limits(BuildLimits(model_bytes=BIG_PARAMS - 1))
    assert template.size(BIG) == (BIG_PARAMS, 0)
    set_limits(BuildLimits(model_bytes=BIG_PARAMS))
    assert template.size(BIG) == (BIG_PARAMS, BIG_PEAK)


# ---------------------------------------------------------------- admit: strictly above a limit


def test_admit_takes_a_model_exactly_at_both_limits(limits) -> None:  # type: ignore[no-untyped-def]
    set_limits(BuildLimits(model_bytes=BIG_PARAMS, sample_bytes=BIG_PEAK))
    template.admit(BIG)  # no refusal


def test_admit_refuses_a_byte_over_either_limit(limits) -> None:  # type: ignore[no-untyped-def]
    """At the parameter limit the per-sample tensor is still checked (not skipped as if refused already). A byte
    over reads apart from the limit (it read "a 8 MiB tensor per sample; at most 8 MiB")."""
    set_limits(BuildLimits(model_bytes=BIG_PARAMS, sample_bytes=BIG_PEAK - 1))
    with pytest.raises(ResourceExhausted, match=r"^model 'cnn' with input \[1, 1024, 1024\] makes a 8 MiB tensor "
                                                r"per sample; at most 7\.999999 MiB$"):
        template.admit(BIG)
    set_limits(BuildLimits(model_bytes=BIG_PARAMS - 1, sample_bytes=BIG_PEAK))
    with pytest.raises(ResourceExhausted, match=r"^model 'cnn' \{'width': 2\} has 64\.00312 MiB of parameters; "
                                                r"this process builds at most 64\.003119 MiB$"):
        template.admit(BIG)


# ---------------------------------------------------------------- small: the zoo as defined, default limits


def test_a_zoo_model_as_defined_under_the_default_limits_is_small() -> None:
    assert template.small(resolve_spec("vgg11")) is True
    assert template.small(resolve_spec("transformer")) is True


def test_options_or_a_user_model_are_not_small() -> None:
    """A model sized by its options, or a user's model, is measured before it is built: it may be any size."""
    assert template.small(resolve_spec("vgg11", width=0.5)) is False
    assert template.small(ModelSpec("tests.own_models:anything", (3, 32, 32), 10)) is False


def test_small_bounds_are_inclusive() -> None:
    """At each bound a zoo model is small; one past it, not: 2**17 float inputs (1 MiB at 8 bytes each), 1000
    classes, 2**16 tokens."""
    assert template.small(resolve_spec("mlp", input_shape=(1 << 17,))) is True
    assert template.small(resolve_spec("mlp", input_shape=((1 << 17) + 1,))) is False
    assert template.small(resolve_spec("mlp", input_shape=(3, 512, 512))) is False  # 6 MiB at 8 bytes
    assert template.small(resolve_spec("vgg11", num_classes=1000)) is True
    assert template.small(resolve_spec("vgg11", num_classes=1001)) is False
    assert template.small(resolve_spec("transformer", vocab=1 << 16)) is True
    assert template.small(resolve_spec("transformer", vocab=(1 << 16) + 1)) is False


def test_lowered_limits_make_nothing_small(limits) -> None:  # type: ignore[no-untyped-def]
    set_limits(BuildLimits(model_bytes=DEFAULT_LIMITS.model_bytes - 1))
    assert template.small(resolve_spec("vgg11")) is False
    set_limits(BuildLimits(sample_bytes=DEFAULT_LIMITS.sample_bytes - 1))
    assert template.small(resolve_spec("vgg11")) is False
    set_limits(BuildLimits(model_bytes=DEFAULT_LIMITS.model_bytes + 1, sample_bytes=DEFAULT_LIMITS.sample_bytes + 1))
    assert template.small(resolve_spec("vgg11")) is True
