#!/usr/bin/env python3
"""Prints the PyTorch reference that lab 1's grader checks against (reference.h); run it again
after changing the problem below: python3 make_reference.py > reference.h

The problem: a 3-4-2 MLP with ReLU, weights given by a formula (so the C++ side can rebuild
them), 4 samples, mean cross-entropy, SGD with lr 0.1 and momentum 0.9, two full-batch steps,
all in float64."""
import torch

torch.set_default_dtype(torch.float64)


def init(rows, cols, k):
    return torch.tensor([[0.1 * ((k + 3 * i + 2 * j) % 7) - 0.3 for j in range(cols)]
                         for i in range(rows)])


w1, b1 = init(4, 3, 1), init(1, 4, 2)[0]
w2, b2 = init(2, 4, 3), init(1, 2, 4)[0]
params = [p.requires_grad_() for p in (w1, b1, w2, b2)]
x = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.3, -0.7], [-0.2, 0.8, 0.1], [1.0, 1.0, -1.0]])
y = torch.tensor([0, 1, 1, 0])
opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
losses = []
for _ in range(2):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(torch.relu(x @ w1.T + b1) @ w2.T + b2, y)
    loss.backward()
    opt.step()
    losses.append(loss.item())

print("// Written by make_reference.py (PyTorch %s): do not edit." % torch.__version__)
print("#pragma once\n#include <vector>\nnamespace lab1::reference {")
print("const std::vector<double> kLosses = {%s};" % ", ".join("%.17g" % v for v in losses))
for name, p in zip(("kW1", "kB1", "kW2", "kB2"), params):
    print("const std::vector<double> %s = {%s};" % (name, ", ".join("%.17g" % v for v in p.detach().flatten().tolist())))
print("}  // namespace lab1::reference")
