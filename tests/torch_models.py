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
        # One module per use, so that a forward hook can tell them apart (the parity tests look
        # at every ReLU's input); ReLU has no state, so the state_dict is unchanged.
        self.relu1 = nn.ReLU()
        self.relu2 = nn.ReLU()

    def forward(self, x):
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = self.downsample(x) if self.downsample is not None else x
        return self.relu2(out + identity)


class ResNet(nn.Module):
    """BasicBlock ResNet with the 32x32 stem of models/resnet.cpp (3x3 stride 1, no max-pool)."""

    def __init__(self, blocks, widths, stem_width, num_classes=10, in_channels=3):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, stem_width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(stem_width)
        self.relu = nn.ReLU()
        inplanes = stem_width
        self.num_layers = len(blocks)
        for s, (n, planes) in enumerate(zip(blocks, widths)):
            layer = []
            for b in range(n):
                stride = 2 if (s > 0 and b == 0) else 1
                ds = None
                if stride != 1 or inplanes != planes:
                    ds = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, 0, bias=False),
                                       nn.BatchNorm2d(planes))
                layer.append(BasicBlock(inplanes, planes, stride, ds))
                inplanes = planes
            setattr(self, f"layer{s + 1}", nn.Sequential(*layer))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        for s in range(self.num_layers):
            out = getattr(self, f"layer{s + 1}")(out)
        return self.fc(self.avgpool(out).flatten(1))


class CifarResNet(ResNet):
    def __init__(self, depth, num_classes=10, in_channels=3):
        n = (depth - 2) // 6
        super().__init__([n, n, n], [16, 32, 64], 16, num_classes, in_channels)


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
        # One module per use (see BasicBlock).
        self.pool1, self.pool2 = nn.MaxPool2d(2), nn.MaxPool2d(2)
        self.relu1, self.relu2, self.relu3 = nn.ReLU(), nn.ReLU(), nn.ReLU()

    def forward(self, x):
        h = self.pool1(self.relu1(self.bn1(self.conv1(x))))
        h = self.pool2(self.relu2(self.bn2(self.conv2(h))))
        h = self.relu3(self.fc1(h.flatten(1)))
        return self.fc2(h)


def build_model(name):
    """(model, input shape without the batch dim) for a ddplab model name."""
    m = re.fullmatch(r"resnet(\d+)", name)
    if m and int(m.group(1)) in (20, 32, 44, 56, 110):
        return CifarResNet(int(m.group(1))), (3, 32, 32)
    if name == "resnet18":  # models::resnet18 on 32x32 images (the CIFAR stem)
        return ResNet([2, 2, 2, 2], [64, 128, 256, 512], 64), (3, 32, 32)
    if name == "cnn":
        return SmallCNN(), (1, 28, 28)
    raise SystemExit(f"torch_models: unknown model {name} (resnet18, resnet20/32/44/56/110, cnn)")


def resnet20_step_inputs(T, dtype):
    """resnet20 with the initial weights, input and target that parity_resnet20 recorded in T
    (its safetensors file, read by st_io), in `dtype` and train mode: (model, x, y)."""
    import torch
    model = CifarResNet(20).to(dtype)
    before = {k[len("before."):]: torch.from_numpy(v) for k, v in T.items()
              if k.startswith("before.")}
    model.load_state_dict({k: (v.to(dtype) if v.is_floating_point() else v)
                           for k, v in before.items()}, strict=True)
    model.train()
    return model, torch.from_numpy(T["input"]).to(dtype), torch.from_numpy(T["target"]).long()
