"""Moving a parity check's starting point off the ReLU and max-pool kinks.

Note [A starting point away from the kinks]
ReLU and max-pool are not smooth: at a ReLU input within rounding of 0, float32 may take the other
branch than float64, and that one element's gradient, which is as large as any other, then moves
every gradient below it. A float32 run that rounds a ReLU input of 1e-7 to the other side is as
right as one that does not, yet it differs from the oracle by far more than rounding: on one
resnet20 batch a single ReLU input of 9.5e-8 (of 500,000 in its layer) put conv1.weight at 0.97 of
its bound, and flipping that one decision in the oracle brought the error to 1.4e-7. Such a
comparison fails by chance, for PyTorch's float32 too: from PyTorch's initial state as it is
(check_train_step.py --at-init: BatchNorm's weight 1 and bias 0, so half of every normalized
channel is near zero) and batch 32 of data seeds 1 to 8, on an AMD EPYC with AVX2 (2026-12-06),
ddplab failed 2 of the 8 (worst 36x and 40x its bound, on BatchNorm biases moved from 0 by about
1e-3, whose error is a few channels' single flipped decisions), PyTorch 1.13's own float32 step in
channels-last failed 5 (91x to 267x) and with oneDNN off 3 (91x to 166x). In the first, ddplab's
layer1.1.bn2.bias was off in one channel of 16 (by 4.5e-6, the others within 1e-9), and the oracle
with one ReLU decision flipped (layer1.1's second ReLU, an input of 7.4e-7) gave ddplab's value
there to 3e-7 of itself. So the test moves its starting point off the kinks before it compares: in
forward order, wherever a ReLU input lies within tau = 10 x (PyTorch float32's largest error at
that ReLU) of zero, the bias feeding that channel (BatchNorm's, or the linear layer's before the
small CNN's last ReLU) moves by the smallest step that clears the whole channel of that band; and
it draws other data while a 2x2 max-pool window holds two values within its tau of each other. At
that point every implementation whose errors are within 10x PyTorch's takes the oracle's branches,
and the comparison measures arithmetic only.

Used by check_train_step.py (one step of examples/train) and check_resnet20.py (one step of
parity_resnet20): away_from_kinks() moves the biases of a state_dict, the programs under test
then start from it.
"""
import torch

import torch_models  # tests/torch_models.py; the caller puts tests/ on sys.path

KINK_FACTOR = 10  # tau in units of PyTorch float32's largest error; the bound's factor too


def make_model(name, state, dtype):
    model, _ = torch_models.build_model(name)
    model = model.to(dtype)
    model.load_state_dict({k: (v.to(dtype) if v.is_floating_point() else v)
                           for k, v in state.items()}, strict=True)
    model.train()
    return model


def kink_inputs(name, state, x, dtype):
    """{module name: its input} for every ReLU and MaxPool2d, in forward order."""
    model = make_model(name, state, dtype)
    seen = {}
    for n, m in model.named_modules():
        if isinstance(m, (torch.nn.ReLU, torch.nn.MaxPool2d)):
            m.register_forward_pre_hook(lambda mod, inp, n=n: seen.__setitem__(n, inp[0].detach()))
    with torch.no_grad():
        model(torch.from_numpy(x).to(dtype))
    return seen


def bias_before(relu):
    """The bias that shifts this ReLU's input channel by channel (torch_models' names)."""
    prefix, _, leaf = relu.rpartition(".")
    prefix = prefix + "." if prefix else ""
    return {"relu": "bn1.bias", "relu1": prefix + "bn1.bias", "relu2": prefix + "bn2.bias",
            "relu3": "fc1.bias"}[leaf]


def shift_clearing(z, tau):
    """The smallest shift s (a multiple of tau / 2) with |z + s| >= tau for every value of z."""
    for k in range(1, 200):
        for s in (k * tau / 2, -k * tau / 2):
            if (z + s).abs().min().item() >= tau:
                return s
    raise SystemExit("check_train_step: no shift clears a channel of its near-zero inputs")


def away_from_kinks(name, state, x):
    """Note [A starting point away from the kinks]: moves state's biases until no ReLU input is
    within tau of 0; returns (state, number of channels moved), or None when a max-pool window
    holds a near tie (the caller draws other data)."""
    moved, done = 0, set()
    while True:
        z64 = kink_inputs(name, state, x, torch.float64)
        z32 = kink_inputs(name, state, x, torch.float32)
        site = next((s for s in z64 if s not in done), None)
        if site is None:
            return state, moved
        tau = KINK_FACTOR * (z32[site].double() - z64[site]).abs().max().item()
        z = z64[site]
        if name in ("cnn",) and "pool" in site:
            # The two largest of each 2x2 window, where the largest is positive (ties of zeros
            # are exact in any precision).
            n, c, h, w = z.shape
            win = z[:, :, :h // 2 * 2, :w // 2 * 2].reshape(n, c, h // 2, 2, w // 2, 2)
            win = win.permute(0, 1, 2, 4, 3, 5).reshape(-1, 4)
            top = win.topk(2, dim=1).values
            if ((top[:, 0] > 0) & (top[:, 0] - top[:, 1] < tau)).any():
                return None
            done.add(site)
            continue
        bias = bias_before(site)
        changed = False
        for ch in range(z.shape[1]):
            zc = z[:, ch]
            if zc.abs().min().item() < tau:
                s = shift_clearing(zc, tau)
                b = state[bias]
                b[ch] = (b[ch].double() + s).to(b.dtype)
                moved += 1
                changed = True
        if not changed:
            done.add(site)  # else look again: float32's rounding of the new bias moved it a bit
