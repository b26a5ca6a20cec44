"""The PyTorch twins of ddplab's models (models/resnet.cpp, models/simple.cpp), layer by layer and
with the same parameter names, for the parity tests and the benchmarks (one definition for all).

Imports torch at import time: import this module only where PyTorch is needed."""
import re

import torch.nn as nn


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride, downsample):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.relu = nn.ReLU()

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = self.downsample(x) if self.downsample is not None else x
        return self.relu(out + identity)


class CifarResNet(nn.Module):
    def __init__(self, depth, num_classes=10, in_channels=3):
        super().__init__()
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU()
        inplanes = 16
        layers = []
        for s, planes in enumerate([16, 32, 64]):
            blocks = []
            for b in range(n):
                stride = 2 if (s > 0 and b == 0) else 1
                ds = None
                if stride != 1 or inplanes != planes:
                    ds = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, 0, bias=False),
                                       nn.BatchNorm2d(planes))
                blocks.append(BasicBlock(inplanes, planes, stride, ds))
                inplanes = planes
            layers.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        return self.fc(self.avgpool(out).flatten(1))


class SmallCNN(nn.Module):
    def __init__(self, num_classes=10, in_channels=1, image_size=28):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 3, 1, 1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, 1, 1)
        self.bn2 = nn.BatchNorm2d(64)
        s = image_size // 4
        self.fc1 = nn.Linear(64 * s * s, 128)
        self.fc2 = nn.Linear(128, num_classes)
        self.pool = nn.MaxPool2d(2)
        self.relu = nn.ReLU()

    def forward(self, x):
        h = self.pool(self.relu(self.bn1(self.conv1(x))))
        h = self.pool(self.relu(self.bn2(self.conv2(h))))
        h = self.relu(self.fc1(h.flatten(1)))
        return self.fc2(h)


def build_model(name):
    """(model, input shape without the batch dim) for a ddplab model name."""
    m = re.fullmatch(r"resnet(\d+)", name)
    if m and int(m.group(1)) in (20, 32, 44, 56, 110):
        return CifarResNet(int(m.group(1))), (3, 32, 32)
    if name == "cnn":
        return SmallCNN(), (1, 28, 28)
    raise SystemExit(f"torch_models: unknown model {name} (resnet20/32/44/56/110, cnn)")
