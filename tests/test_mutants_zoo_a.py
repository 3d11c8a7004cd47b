"""What the mutation run of splitfed/models/zoo.py (lines 1-300) found no test for: that the zoo's names are the
standard architectures (the parameter counts of the CIFAR ResNet-18, VGG-11 and MobileNetV2 of the literature,
no bias in a conv that a BatchNorm follows, the feature-map size after each stage), that residual branches add,
that the transformer's attention is scaled dot-product attention, the smallest image each model takes and the
refusal just below it, and a spec's round trip through ``to_dict``/``from_dict`` at its least values."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from splitfed.models import zoo
from splitfed.models.zoo import ModelSpec, resolve_spec


def _params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def _convs(m: nn.Module) -> list[nn.Conv2d]:
    return [c for c in m.modules() if isinstance(c, nn.Conv2d)]


# ---------------------------------------------------------------- ModelSpec


def test_a_float_spec_and_a_one_class_spec_come_back_from_their_dicts() -> None:
    """A float model's spec says vocab 0 and a run may have one class (resolve_spec takes both): a tier
    rebuilds the spec from its dict, so both must come back."""
    for spec in (resolve_spec("cnn"), resolve_spec("mlp", num_classes=1), resolve_spec("transformer")):
        assert ModelSpec.from_dict(spec.to_dict()) == spec
    d = resolve_spec("cnn").to_dict()
    with pytest.raises(ValueError, match=r"^model cnn: vocab must be an integer >= 0, got -1$"):
        ModelSpec.from_dict({**d, "vocab": -1})
    with pytest.raises(ValueError, match=r"^model cnn: num_classes must be an integer >= 1, got 0$"):
        ModelSpec.from_dict({**d, "num_classes": 0})


def test_a_spec_without_vocab_or_kwargs_is_a_float_model_without_options() -> None:
    """``vocab`` and ``kwargs`` are the optional keys of a spec's dict: left out, the model takes floats."""
    spec = ModelSpec.from_dict({"name": "mlp", "input_shape": [64], "num_classes": 10})
    assert spec == ModelSpec("mlp", (64,), 10, vocab=0, kwargs={})
    assert spec.input_dtype == torch.float32


def test_a_token_models_example_input_spans_its_whole_vocabulary() -> None:
    """Token ids are in [0, vocab): the example a model is traced and profiled with draws from all of them,
    id 0 included."""
    x = resolve_spec("transformer").example_input(4)
    assert x.dtype == torch.int64 and x.shape == (4, 64)
    assert int(x.min()) == 0 and int(x.max()) == 16
    assert set(x.unique().tolist()) == set(range(17))


# ---------------------------------------------------------------- the smallest images


def test_cnn_takes_a_4x4_image_and_refuses_a_side_below_4() -> None:
    """Two 2x2 pools: 4 is the least side that leaves a pixel; each side is checked on its own."""
    m = zoo.cnn((1, 4, 4)).eval()
    assert m(torch.randn(2, 1, 4, 4)).shape == (2, 10)
    for shape in ((1, 3, 4), (1, 4, 3)):
        with pytest.raises(ValueError, match=rf"^height and width must be at least 4, got {shape[1]}x{shape[2]}$"):
            zoo.cnn(shape)


def test_cnn_dense_layer_fits_mnist_and_other_sizes() -> None:
    """The docstring's MNIST (28x28 -> 7x7 after two pools) and a non-square 12x16 (3x4) both run."""
    for (h, w) in ((28, 28), (12, 16), (8, 8)):
        m = zoo.cnn((1, h, w)).eval()
        lin = [x for x in m.modules() if isinstance(x, nn.Linear)][0]
        assert lin.in_features == 2 * 16 * (h // 4) * (w // 4)
        assert m(torch.randn(2, 1, h, w)).shape == (2, 10)
    assert [x for x in zoo.cnn((1, 28, 28)).modules() if isinstance(x, nn.Linear)][0].in_features == 1568


def test_vgg11_takes_32x32_and_refuses_31_on_either_side() -> None:
    """Five 2x2 pools: 32 is the least side that leaves a pixel."""
    assert zoo.vgg11((3, 32, 32)).eval()(torch.randn(1, 3, 32, 32)).shape == (1, 10)
    for shape in ((3, 31, 32), (3, 32, 31)):
        with pytest.raises(ValueError, match=rf"^height and width must be at least 32, got {shape[1]}x{shape[2]}$"):
            zoo.vgg11(shape)


@pytest.mark.parametrize("factory", [zoo.resnet18, zoo.mobilenetv2])
def test_pooled_models_take_a_1x1_image_and_refuse_an_empty_one(factory) -> None:
    """Global average pooling: any image of at least one pixel runs; a side of 0 is refused."""
    m = factory((3, 1, 1), width=8 if factory is zoo.resnet18 else 0.25).eval()
    assert m(torch.randn(2, 3, 1, 1)).shape == (2, 10)
    for shape in ((3, 0, 1), (3, 1, 0)):
        with pytest.raises(ValueError, match=rf"^height and width must be at least 1, got {shape[1]}x{shape[2]}$"):
            factory(shape)


# ---------------------------------------------------------------- VGG-11


def test_vgg11_is_the_cifar_vgg11_with_batchnorm() -> None:
    """kuangliu/pytorch-cifar VGG('VGG11') (convs with bias, BatchNorm, one 512->10 linear): 9,231,114."""
    m = zoo.vgg11()
    assert _params(m) == 9_231_114
    assert [c.out_channels for c in _convs(m)] == [64, 128, 256, 256, 512, 512, 512, 512]


def test_vgg11_width_scales_each_conv_and_keeps_at_least_one_channel() -> None:
    """int(v * width) channels, never fewer than one."""
    assert [c.out_channels for c in _convs(zoo.vgg11(width=1 / 64))] == [1, 2, 4, 4, 8, 8, 8, 8]
    m = zoo.vgg11(width=0.01)
    assert [c.out_channels for c in _convs(m)] == [1, 1, 2, 2, 5, 5, 5, 5]
    assert m.eval()(torch.randn(1, 3, 32, 32)).shape == (1, 10)


# ---------------------------------------------------------------- ResNet-18


def test_resnet18_is_the_cifar_resnet18() -> None:
    """kuangliu/pytorch-cifar ResNet18() on CIFAR-10 has 11,173,962 parameters; no conv has a bias (each
    feeds a BatchNorm)."""
    m = zoo.resnet18()
    assert _params(m) == 11_173_962
    assert all(c.bias is None for c in _convs(m))
    assert [c.kernel_size for c in _convs(m)][0] == (3, 3)
    assert sum(1 for c in _convs(m) if c.kernel_size == (1, 1)) == 3  # a projection where the shape changes


def test_resnet18_feature_maps_halve_at_stages_two_to_four() -> None:
    """3x3 stride-1 padded stem keeps 32x32; stages of stride 1, 2, 2, 2: 32, 16, 8, 4 with 64..512 channels."""
    m = zoo.resnet18().eval()
    seen: dict[str, tuple[int, ...]] = {}
    for name in ("bn1", "layer1", "layer2", "layer3", "layer4"):
        getattr(m, name).register_forward_hook(lambda _m, _i, out, name=name: seen.__setitem__(name, out.shape))
        for i, blk in enumerate(getattr(m, name)) if name != "bn1" else ():
            blk.register_forward_hook(lambda _m, _i, out, k=f"{name}.{i}": seen.__setitem__(k, out.shape))
    assert m(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert seen == {
        "bn1": (2, 64, 32, 32),
        "layer1.0": (2, 64, 32, 32), "layer1.1": (2, 64, 32, 32), "layer1": (2, 64, 32, 32),
        "layer2.0": (2, 128, 16, 16), "layer2.1": (2, 128, 16, 16), "layer2": (2, 128, 16, 16),
        "layer3.0": (2, 256, 8, 8), "layer3.1": (2, 256, 8, 8), "layer3": (2, 256, 8, 8),
        "layer4.0": (2, 512, 4, 4), "layer4.1": (2, 512, 4, 4), "layer4": (2, 512, 4, 4),
    }


def _silence_residual_branch(bn: nn.BatchNorm2d) -> None:
    with torch.no_grad():
        bn.weight.zero_()
        bn.bias.zero_()


def test_basic_block_adds_its_shortcut() -> None:
    """With its residual branch silenced (last BatchNorm scaled to 0) a block returns relu(shortcut(x)): x itself
    for an identity shortcut, the projection where the shape changes."""
    x = torch.randn(2, 8, 6, 6)
    same = zoo.BasicBlock(8, 8, 1).eval()
    _silence_residual_branch(same.bn2)
    assert torch.equal(same(x), torch.relu(x))
    for cin, cout, stride in ((8, 16, 1), (8, 8, 2), (8, 16, 2)):
        blk = zoo.BasicBlock(cin, cout, stride).eval()
        assert len(blk.shortcut) == 2 and blk.shortcut[0].kernel_size == (1, 1) and blk.shortcut[0].bias is None
        _silence_residual_branch(blk.bn2)
        out = blk(x)
        assert out.shape == (2, cout, 6 // stride, 6 // stride)
        assert torch.equal(out, torch.relu(blk.shortcut(x)))


# ---------------------------------------------------------------- MobileNetV2


def test_mobilenetv2_at_width_one_is_the_standard_mobilenetv2() -> None:
    """torchvision's mobilenet_v2 has 3,504,872 parameters with 1000 classes: 2,236,682 with a 1280->10 head
    (the CIFAR variant only changes strides). No conv has a bias."""
    m = zoo.mobilenetv2(width=1.0)
    assert _params(m) == 3_504_872 - (1280 * 1000 + 1000) + (1280 * 10 + 10) == 2_236_682
    assert all(c.bias is None for c in _convs(m))
    assert m.stem[0].kernel_size == (3, 3) and m.stem[0].out_channels == 32
    assert m.head[0].kernel_size == (1, 1) and m.fc.in_features == 1280


def test_mobilenetv2_feature_maps_follow_the_cifar_strides() -> None:
    """Stride-1 stem (32x32 kept) and stage strides 1, 1, 2, 2, 1, 2, 1: 32, 16, 8, then 4 before the head."""
    m = zoo.mobilenetv2().eval()
    seen: list[int] = []
    m.stem.register_forward_hook(lambda _m, _i, out: seen.append(out.shape[-1]))
    for blk in m.features:
        blk.register_forward_hook(lambda _m, _i, out: seen.append(out.shape[-1]))
    assert m(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert seen == [32] + [32] + [32] * 2 + [16] * 3 + [8] * 4 + [8] * 3 + [4] * 3 + [4]


def test_mobilenetv2_width_rounds_channels_to_the_nearest_multiple_of_eight() -> None:
    """Width 0.25 (the zoo's default): each of 32, 16, 24, 32, 64, 96, 160, 320, 1280 times 0.25, to the nearest
    multiple of 8, at least 8."""
    m = zoo.mobilenetv2(width=0.25)
    assert m.stem[0].out_channels == 8
    assert [blk.conv[-1].num_features for blk in m.features] == [8] + [8] * 2 + [8] * 3 + [16] * 4 + [24] * 3 + [40] * 3 + [80]
    assert m.head[0].out_channels == 320 and m.fc.in_features == 320


def test_mobilenetv2_width_above_one_widens_the_model() -> None:
    """vgg11's width widens above 1 too; a width the model ignored (as it did for any width >= 1) is another
    model than the one asked for. Width 2 doubles every channel count (all multiples of 8); 1.5 rounds to the
    nearest multiple of 8 (32 -> 48, 1280 -> 1920)."""
    wide, base = zoo.mobilenetv2(width=2.0), zoo.mobilenetv2(width=1.0)
    convs = [m.out_channels for m in wide.modules() if isinstance(m, nn.Conv2d)]
    assert convs == [2 * m.out_channels for m in base.modules() if isinstance(m, nn.Conv2d)]
    half = zoo.mobilenetv2(width=1.5)
    assert (half.stem[0].out_channels, half.head[0].out_channels, half.fc.in_features) == (48, 1920, 1920)
    assert _params(half) > _params(base)


def test_inverted_residual_adds_its_input() -> None:
    """A stride-1 block with equal channels returns x + branch(x): with the branch's last BatchNorm made a
    constant 1, that is x + 1. The expansion-1 block has no 1x1 expansion conv."""
    blk = zoo.InvertedResidual(8, 8, 1, 6).eval()
    with torch.no_grad():
        blk.conv[-1].weight.zero_()
        blk.conv[-1].bias.fill_(1.0)
    x = torch.randn(2, 8, 5, 5)
    assert torch.equal(blk(x), x + 1)
    assert [c.groups for c in _convs(zoo.InvertedResidual(8, 8, 1, 1))] == [8, 1]
    assert [c.groups for c in _convs(zoo.InvertedResidual(8, 8, 1, 6))] == [1, 48, 1]


# ---------------------------------------------------------------- the transformer


def _reference_layer(layer: zoo.EncoderLayer, x: torch.Tensor) -> torch.Tensor:
    """A pre-norm encoder layer by the textbook, with the layer's own weights (no dropout)."""
    b, t, d = x.shape
    h = layer.heads
    q, k, v = F.linear(F.layer_norm(x, (d,), layer.norm1.weight, layer.norm1.bias, layer.norm1.eps),
                       layer.qkv.weight, layer.qkv.bias).split(d, dim=-1)
    q, k, v = (z.view(b, t, h, d // h).permute(0, 2, 1, 3) for z in (q, k, v))
    att = F.scaled_dot_product_attention(q, k, v)
    x = x + F.linear(att.permute(0, 2, 1, 3).reshape(b, t, d), layer.proj.weight, layer.proj.bias)
    ff = layer.ff
    y = F.layer_norm(x, (d,), layer.norm2.weight, layer.norm2.bias, layer.norm2.eps)
    return x + F.linear(F.gelu(F.linear(y, ff[0].weight, ff[0].bias)), ff[2].weight, ff[2].bias)


def test_encoder_layer_is_scaled_dot_product_attention_with_residuals() -> None:
    torch.manual_seed(1)
    layer = zoo.EncoderLayer(32, 4, 64, 0.1).eval()
    x = torch.randn(3, 5, 32)
    with torch.no_grad():
        assert torch.allclose(layer(x), _reference_layer(layer, x), atol=1e-5)
        x1 = torch.randn(1, 7, 32)  # one sample: attention is within it, over its tokens
        assert torch.allclose(layer(x1), _reference_layer(layer, x1), atol=1e-5)


def test_transformer_is_token_plus_position_embeddings_through_the_layers() -> None:
    torch.manual_seed(2)
    m = zoo.transformer((6,), num_classes=3, vocab=11).eval()
    x = torch.randint(0, 11, (2, 6))
    with torch.no_grad():
        h = m.tok.weight[x] + m.pos
        for layer in m.layers:
            h = _reference_layer(layer, h)
        want = F.linear(F.layer_norm(h, (32,), m.norm.weight, m.norm.bias, m.norm.eps).mean(dim=1),
                        m.fc.weight, m.fc.bias)
        assert torch.allclose(m(x), want, atol=1e-5)


def test_default_transformer_parameter_count() -> None:
    """By hand, d 32, 4 heads, 2 layers, feed-forward 2d = 64, vocab 17, 64 positions, 10 classes: embeddings
    17*32 + 64*32; a layer: two LayerNorms 2*64, qkv 32*96+96, proj 32*32+32, ff 32*64+64 + 64*32+32; final
    LayerNorm 64; head 32*10+10. A checkpoint of the zoo model loads only into this shape."""
    per_layer = 2 * 64 + (32 * 96 + 96) + (32 * 32 + 32) + (32 * 64 + 64) + (64 * 32 + 32)
    want = 17 * 32 + 64 * 32 + 2 * per_layer + 64 + 32 * 10 + 10
    assert want == 20_074
    assert _params(zoo.transformer()) == want
