#!/usr/bin/env python3
"""Winograd F(4x4, 3x3) matrices from their interpolation points, and their float32 error.

Note [Winograd F(m x m, 3x3)] in nn/winograd.cpp picks the points 0, 1, -1, 2, -1/2 (and
infinity) for the 4x4 tile. This script is where that choice comes from: it builds A^T, G and B^T
exactly (fractions) for any five finite points, checks that they compute a 3-tap correlation, and
measures the float32 error of the two-dimensional algorithm on random 16-channel tiles against
float64, the way the kernel rounds (G applied in float64 and rounded once, B^T and A^T in float32).

    ~/.cache/ddplab/venv/bin/python bench/winograd_points.py            # the usual and ours
    ~/.cache/ddplab/venv/bin/python bench/winograd_points.py --search   # every pair from a list
    ~/.cache/ddplab/venv/bin/python bench/winograd_points.py --bf16     # with bfloat16 operands

--bf16 asks whether a bfloat16 Winograd could keep PyTorch's bfloat16 accuracy: it compares a
direct convolution of bfloat16-rounded activations and weights (float32 sums, what autocast's
convolutions do) with F(2x2, 3x3) and F(4x4, 3x3) whose transformed tiles and filters are also
rounded to bfloat16 before they are multiplied (what a kernel built on AVX512-BF16's dot products
would have to do).

Needs numpy (the test venv of scripts/pyvenv has it).
"""
import argparse
import itertools
from fractions import Fraction as Fr

import numpy as np

M, R = 4, 3  # outputs per tile side, filter taps
N = M + R - 1  # points, the last one infinity


def solve_exact(rows, rhs):
    """The x with rows @ x == rhs, for a consistent system with a unique solution (fractions)."""
    a = [list(r) + [b] for r, b in zip(rows, rhs)]
    cols = len(rows[0])
    pivots = []
    row = 0
    for col in range(cols):
        pick = next((i for i in range(row, len(a)) if a[i][col] != 0), None)
        if pick is None:
            raise ValueError("points give a singular system (repeated points?)")
        a[row], a[pick] = a[pick], a[row]
        a[row] = [v / a[row][col] for v in a[row]]
        for i in range(len(a)):
            if i != row and a[i][col] != 0:
                f = a[i][col]
                a[i] = [v - f * w for v, w in zip(a[i], a[row])]
        pivots.append(row)
        row += 1
    if any(v[-1] != 0 for v in a[row:]):
        raise ValueError("no B^T makes these A^T and G a correlation")
    return [a[p][-1] for p in pivots]


def matrices(points):
    """A^T (M x N), G (N x R), B^T (N x N) of F(M, R) on `points` (N - 1 finite ones) and
    infinity, as fractions: A^T holds the points' powers, G the filter's values there divided by
    the Lagrange denominators, and B^T is whatever makes y = A^T [(G g) . (B^T d)] the correlation
    y[a] = sum_k g[k] d[a + k] for every g and d."""
    p = [Fr(x) for x in points]
    at = [[x ** i for x in p] + [Fr(1 if i == M - 1 else 0)] for i in range(M)]
    denom = [Fr(1)] * len(p)
    for j, x in enumerate(p):
        for l, y in enumerate(p):
            if l != j:
                denom[j] *= x - y
    g = [[x ** k / denom[j] for k in range(R)] for j, x in enumerate(p)]
    g.append([Fr(0)] * (R - 1) + [Fr(1)])
    # Column i of B^T: sum_j at[a][j] g[j][k] bt[j][i] == (i == a + k) for every a, k.
    bt_cols = []
    for i in range(N):
        rows = [[at[a][j] * g[j][k] for j in range(N)] for a in range(M) for k in range(R)]
        rhs = [Fr(1 if i == a + k else 0) for a in range(M) for k in range(R)]
        bt_cols.append(solve_exact(rows, rhs))
    bt = [[bt_cols[i][j] for i in range(N)] for j in range(N)]
    return at, g, bt


def to_bf16(a):
    """float32 -> the nearest bfloat16 (ties to even), held in float32."""
    bits = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def correlate(d, w, m):
    """The m x m outputs of 3-tap correlations of tiles d [b, c, m+2, m+2] with w [c, 3, 3], in
    the dtype of d."""
    y = np.zeros((d.shape[0], m, m), dtype=d.dtype)
    for a in range(m):
        for b in range(m):
            y[:, a, b] = np.einsum("bcij,cij->b", d[:, :, a:a + R, b:b + R], w.astype(d.dtype))
    return y


def float32_error(at, g, bt, tiles=2000, channels=16, seed=0):
    """Mean and largest error of F(4x4, 3x3) in float32 over random tiles, relative to the
    largest output of each batch of 100 tiles."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    at32, bt32 = np.array(at, dtype=f32), np.array(bt, dtype=f32)
    g64 = np.array(g, dtype=np.float64)
    errors = []
    for _ in range(tiles // 100):
        d = rng.standard_normal((100, channels, N, N)).astype(f32)
        w = (rng.standard_normal((channels, R, R)) * 0.3).astype(f32)
        u = (g64 @ w.astype(np.float64) @ g64.T).astype(f32)
        v = np.einsum("ij,bcjk,lk->bcil", bt32, d, bt32).astype(f32)
        prod = np.einsum("bcij,cij->bij", v, u).astype(f32)
        y = np.einsum("ij,bjk,lk->bil", at32, prod, at32).astype(f32)
        ref = correlate(d.astype(np.float64), w, M)
        errors.append(np.abs(y - ref).max() / np.abs(ref).max())
    return float(np.mean(errors)), float(np.max(errors))


def bf16_error(mats, m, channels=16, tiles=3000, seed=0):
    """Root-mean-square error relative to the outputs' of one bfloat16 convolution of random
    tiles against float64 on the unrounded operands: direct if `mats` is None, else Winograd with
    (A^T, G, B^T) = mats."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    if mats is not None:
        at32, bt32 = np.array(mats[0], dtype=f32), np.array(mats[2], dtype=f32)
        g64 = np.array(mats[1], dtype=np.float64)
    num = den = 0.0
    for _ in range(tiles // 100):
        d = rng.standard_normal((100, channels, m + 2, m + 2)).astype(f32)
        w = (rng.standard_normal((channels, R, R)) * 0.3).astype(f32)
        ref = correlate(d.astype(np.float64), w, m)
        db, wb = to_bf16(d), to_bf16(w)
        if mats is None:
            y = correlate(db, wb, m)
        else:
            u = to_bf16((g64 @ wb.astype(np.float64) @ g64.T).astype(f32))
            v = to_bf16(np.einsum("ij,bcjk,lk->bcil", bt32, db, bt32))
            prod = np.einsum("bcij,cij->bij", v, u).astype(f32)
            y = np.einsum("ij,bjk,lk->bil", at32, prod, at32)
        num += float(((y - ref) ** 2).sum())
        den += float((ref ** 2).sum())
    return (num / den) ** 0.5


def show_bf16():
    f22 = ([[1, 1, 1, 0], [0, 1, -1, -1]],
           [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]],
           [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]])
    direct = bf16_error(None, 4)
    print("bfloat16 operands, 16 channels, rms error relative to the outputs':")
    print("  %-33s %.2e" % ("direct (autocast's)", direct))
    ours = matrices([0, 1, -1, 2, Fr(-1, 2)])
    usual = matrices([0, 1, -1, 2, -2])
    for name, mats, m in (("F(2x2, 3x3)", f22, 2),
                          ("F(4x4, 3x3) on 0, 1, -1, 2, -1/2", ours, 4),
                          ("F(4x4, 3x3) on 0, 1, -1, 2, -2", usual, 4)):
        err = bf16_error(mats, m)
        print("  %-33s %.2e (%.1fx direct)" % (name, err, err / direct))


def show(points):
    at, g, bt = matrices(points)
    mean, worst = float32_error(at, g, bt)
    print("points 0, 1, -1, %s, %s: float32 error mean %.2e, worst %.2e" %
          (points[3], points[4], mean, worst))
    for name, mat in (("B^T", bt), ("G", g), ("A^T", at)):
        print("  %s" % name)
        for row in mat:
            print("    " + "  ".join("%6s" % str(v) for v in row))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--search", action="store_true",
                    help="try every pair of extra points from +-1/4 .. +-4 beside 0, 1, -1")
    ap.add_argument("--bf16", action="store_true",
                    help="bfloat16 operands: direct against Winograd F(2x2) and F(4x4)")
    args = ap.parse_args()
    if args.bf16:
        show_bf16()
        return
    if not args.search:
        show([0, 1, -1, 2, -2])
        show([0, 1, -1, 2, Fr(-1, 2)])
        return
    extra = [Fr(1, 2), 2, Fr(3, 2), Fr(1, 3), 3, Fr(1, 4), 4, Fr(2, 3)]
    extra += [-x for x in extra]
    results = []
    for a, b in itertools.combinations(extra, 2):
        at, g, bt = matrices([0, 1, -1, a, b])
        mean, worst = float32_error(at, g, bt, tiles=600)
        results.append((mean, worst, a, b))
    for mean, worst, a, b in sorted(results)[:10]:
        print("0, 1, -1, %5s, %5s: mean %.2e, worst %.2e" % (a, b, mean, worst))


if __name__ == "__main__":
    main()
