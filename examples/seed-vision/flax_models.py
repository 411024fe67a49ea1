"""ResNet-50, ViT-B/16, MobileNetV3-Small and EfficientNet-B0 in Flax (linen).

Written from the papers' architecture tables to match torchvision's
definitions layer for layer (same widths, depths, kernels, strides,
squeeze-excitation sizes and activations), inference mode (BatchNorm uses its
running statistics). Inputs are NHWC. Random weights: no download.
"""

from functools import partial
from typing import Any

import flax.linen as nn
import jax.numpy as jnp


def _make_divisible(v, divisor=8):
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


class ConvBN(nn.Module):
    features: int
    kernel: int = 1
    strides: int = 1
    groups: int = 1
    act: Any = None
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        p = self.kernel // 2
        x = nn.Conv(
            self.features,
            (self.kernel, self.kernel),
            strides=self.strides,
            padding=((p, p), (p, p)),
            feature_group_count=self.groups,
            use_bias=False,
            dtype=self.dtype,
        )(x)
        x = nn.BatchNorm(use_running_average=True, epsilon=1e-3, dtype=self.dtype)(x)
        return self.act(x) if self.act else x


class Bottleneck(nn.Module):
    features: int
    strides: int
    dtype: Any

    @nn.compact
    def __call__(self, x):
        cb = partial(ConvBN, dtype=self.dtype)
        y = cb(self.features, 1, act=nn.relu)(x)
        y = cb(self.features, 3, self.strides, act=nn.relu)(y)
        y = cb(self.features * 4, 1)(y)
        if x.shape != y.shape:
            x = cb(self.features * 4, 1, self.strides)(x)
        return nn.relu(x + y)


class ResNet50(nn.Module):
    num_classes: int = 1000
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        x = ConvBN(64, 7, 2, act=nn.relu, dtype=self.dtype)(x)
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        for i, blocks in enumerate([3, 4, 6, 3]):
            for j in range(blocks):
                x = Bottleneck(64 * 2**i, 2 if i > 0 and j == 0 else 1, self.dtype)(x)
        return nn.Dense(self.num_classes, dtype=self.dtype)(x.mean((1, 2)))


class EncoderBlock(nn.Module):
    heads: int
    mlp: int
    dtype: Any

    @nn.compact
    def __call__(self, x):
        y = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype)(x)
        y = nn.MultiHeadDotProductAttention(num_heads=self.heads, dtype=self.dtype)(y, y)
        x = x + y
        y = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype)(x)
        y = nn.Dense(self.mlp, dtype=self.dtype)(y)
        y = nn.Dense(x.shape[-1], dtype=self.dtype)(nn.gelu(y, approximate=False))
        return x + y


class ViTB16(nn.Module):
    num_classes: int = 1000
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        d = 768
        x = nn.Conv(d, (16, 16), strides=16, padding="VALID", dtype=self.dtype)(x)
        b, h, w, _ = x.shape
        x = x.reshape(b, h * w, d)
        cls = self.param("cls", nn.initializers.zeros, (1, 1, d))
        x = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, d)).astype(x.dtype), x], axis=1)
        pos = self.param("pos_embedding", nn.initializers.normal(0.02), (1, h * w + 1, d))
        x = x + pos.astype(x.dtype)
        for _ in range(12):
            x = EncoderBlock(12, 3072, self.dtype)(x)
        x = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype)(x)
        return nn.Dense(self.num_classes, dtype=self.dtype)(x[:, 0])


class SqueezeExcite(nn.Module):
    squeeze: int
    act: Any
    gate: Any
    dtype: Any

    @nn.compact
    def __call__(self, x):
        s = x.mean((1, 2), keepdims=True)
        s = self.act(nn.Conv(self.squeeze, (1, 1), dtype=self.dtype)(s))
        s = self.gate(nn.Conv(x.shape[-1], (1, 1), dtype=self.dtype)(s))
        return x * s


class InvertedResidual(nn.Module):
    kernel: int
    expanded: int
    out: int
    se: bool
    act: Any
    strides: int
    dtype: Any

    @nn.compact
    def __call__(self, x):
        cb = partial(ConvBN, dtype=self.dtype)
        y = x
        if self.expanded != x.shape[-1]:
            y = cb(self.expanded, 1, act=self.act)(y)
        y = cb(self.expanded, self.kernel, self.strides, groups=self.expanded, act=self.act)(y)
        if self.se:
            y = SqueezeExcite(_make_divisible(self.expanded // 4), nn.relu, nn.hard_sigmoid, self.dtype)(y)
        y = cb(self.out, 1)(y)
        return x + y if self.strides == 1 and x.shape[-1] == self.out else y


class MobileNetV3Small(nn.Module):
    num_classes: int = 1000
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        re, hs = nn.relu, nn.hard_swish
        cfg = [  # kernel, expanded, out, SE, activation, stride (torchvision's table)
            (3, 16, 16, True, re, 2),
            (3, 72, 24, False, re, 2),
            (3, 88, 24, False, re, 1),
            (5, 96, 40, True, hs, 2),
            (5, 240, 40, True, hs, 1),
            (5, 240, 40, True, hs, 1),
            (5, 120, 48, True, hs, 1),
            (5, 144, 48, True, hs, 1),
            (5, 288, 96, True, hs, 2),
            (5, 576, 96, True, hs, 1),
            (5, 576, 96, True, hs, 1),
        ]
        x = ConvBN(16, 3, 2, act=hs, dtype=self.dtype)(x)
        for k, e, o, se, act, s in cfg:
            x = InvertedResidual(k, e, o, se, act, s, self.dtype)(x)
        x = ConvBN(576, 1, act=hs, dtype=self.dtype)(x)
        x = hs(nn.Dense(1024, dtype=self.dtype)(x.mean((1, 2))))
        return nn.Dense(self.num_classes, dtype=self.dtype)(x)


class MBConv(nn.Module):
    expand: int
    kernel: int
    strides: int
    out: int
    dtype: Any

    @nn.compact
    def __call__(self, x):
        cb = partial(ConvBN, dtype=self.dtype)
        cin = x.shape[-1]
        e = cin * self.expand
        y = x
        if self.expand != 1:
            y = cb(e, 1, act=nn.swish)(y)
        y = cb(e, self.kernel, self.strides, groups=e, act=nn.swish)(y)
        y = SqueezeExcite(max(1, cin // 4), nn.swish, nn.sigmoid, self.dtype)(y)
        y = cb(self.out, 1)(y)
        return x + y if self.strides == 1 and cin == self.out else y


class EfficientNetB0(nn.Module):
    num_classes: int = 1000
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        stages = [  # expand, kernel, stride, out, layers
            (1, 3, 1, 16, 1),
            (6, 3, 2, 24, 2),
            (6, 5, 2, 40, 2),
            (6, 3, 2, 80, 3),
            (6, 5, 1, 112, 3),
            (6, 5, 2, 192, 4),
            (6, 3, 1, 320, 1),
        ]
        x = ConvBN(32, 3, 2, act=nn.swish, dtype=self.dtype)(x)
        for e, k, s, o, n in stages:
            for i in range(n):
                x = MBConv(e, k, s if i == 0 else 1, o, self.dtype)(x)
        x = ConvBN(1280, 1, act=nn.swish, dtype=self.dtype)(x)
        return nn.Dense(self.num_classes, dtype=self.dtype)(x.mean((1, 2)))


MODELS = {
    "resnet50": ResNet50,
    "vit_b_16": ViTB16,
    "mobilenet_v3_small": MobileNetV3Small,
    "efficientnet_b0": EfficientNetB0,
}
