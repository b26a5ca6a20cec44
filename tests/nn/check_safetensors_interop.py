"""ddplab <-> an independent safetensors implementation (tests/st_io.py, numpy).

1. ddplab writes every dtype; Python reads it and checks values, dtypes, shapes, metadata.
2. Python writes every dtype; ddplab loads and rewrites it; Python reads that back unchanged.
Prints `N passed, N failed`; exit status 1 on any failure, 77 (skipped) without numpy.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import check_util  # noqa: E402

np, st_io, checks = check_util.start()
check, tool = checks.check, sys.argv[1]

with tempfile.TemporaryDirectory() as d:
    a = os.path.join(d, "from_ddplab.safetensors")
    subprocess.run([tool, "write", a], check=True)
    t = st_io.read(a)
    h = st_io.read_header(a)
    check(h.get("__metadata__") == {"writer": "ddplab"}, "metadata")
    ref = np.arange(12).reshape(3, 4)
    for dt, st in [("float32", "F32"), ("float64", "F64"), ("float16", "F16"),
                   ("bfloat16", "BF16"), ("int64", "I64"), ("int32", "I32"), ("uint8", "U8")]:
        name = "t_" + dt
        check(h[name]["dtype"] == st, name + " dtype " + h[name]["dtype"])
        check(t[name].shape == (3, 4) and np.array_equal(t[name].astype(np.float64), ref),
              name + " values")
    check(np.array_equal(t["t_bool"], np.arange(5) > 1.5), "bool values")
    check(t["scalar"].shape == () and float(t["scalar"]) == 2.5, "scalar")

    src = {
        "f32": np.random.RandomState(0).randn(4, 5).astype(np.float32),
        "f64": np.random.RandomState(1).randn(3).astype(np.float64),
        "f16": np.linspace(-2, 2, 7).astype(np.float16),
        "bf16": np.array([1.0, -2.5, 0.15625, 65536.0], dtype=np.float32),
        "i64": np.array([-(2**40), 0, 7], dtype=np.int64),
        "i32": np.array([[-3, 4]], dtype=np.int32),
        "u8": np.arange(250, 256, dtype=np.uint8),
        "b": np.array([True, False, True]),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    p = os.path.join(d, "from_python.safetensors")
    q = os.path.join(d, "rewritten.safetensors")
    st_io.write(p, src, bf16={"bf16"})
    subprocess.run([tool, "roundtrip", p, q], check=True)
    back = st_io.read(q)
    hq = st_io.read_header(q)
    for name, arr in src.items():
        check(name in back, name + " present")
        if name not in back:
            continue
        check(back[name].shape == arr.shape, name + " shape")
        check(np.array_equal(back[name], arr.astype(back[name].dtype)), name + " values")
    check(hq["bf16"]["dtype"] == "BF16", "bf16 dtype kept")
    check(hq["i64"]["dtype"] == "I64" and hq["b"]["dtype"] == "BOOL", "int/bool dtypes kept")

checks.finish()
