"""A torch module for `ferry export vision --arch tests.exporters.tiny_vision:build`."""

from torch import nn


def build() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 3),
    )
