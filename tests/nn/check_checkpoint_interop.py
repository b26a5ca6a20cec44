"""A ddplab training checkpoint read by independent code: tests/st_io.py (numpy), zlib, torch.

1. The file is plain safetensors; the model's tensors have their PyTorch names, unprefixed, and
   equal the model's own state dict; every other tensor is "<part>.<name>".
2. The CRC32 recorded for every tensor (and for the metadata itself) is zlib's CRC32 of its bytes.
3. With torch: the model keys load into torch.nn.Sequential(Flatten, Linear, ReLU, Dropout,
   Linear) with strict=True, and the torch model gives ddplab's output on the same input.
Prints `N passed, N failed`; exit status 1 on any failure, 77 (skipped) without numpy.
"""
import json
import os
import subprocess
import sys
import tempfile
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import check_util  # noqa: E402

np, st_io, checks = check_util.start()
check, tool = checks.check, sys.argv[1]

with tempfile.TemporaryDirectory() as d:
    subprocess.run([tool, "write", d], check=True)
    path = os.path.join(d, "ckpt-step000001.safetensors")
    check(os.path.exists(path), "checkpoint named by its step")
    check(not [f for f in os.listdir(d) if f.endswith(".tmp")], "no temporary file left")
    t = st_io.read(path)
    ref = st_io.read(os.path.join(d, "reference.safetensors"))
    model_keys = ["1.weight", "1.bias", "4.weight", "4.bias"]
    for k in model_keys:
        check(k in t and np.array_equal(t[k], ref[k]), "model key %s unprefixed and equal" % k)
    others = [k for k in t if k not in model_keys]
    check(others and all(k.startswith("optimizer.state.") for k in others),
          "other tensors are prefixed: %s" % others)

    meta = st_io.read_header(path)["__metadata__"]
    check(meta.get("format") == "ddplab-checkpoint", "format tag")
    text = meta["ddplab_checkpoint"]
    check(meta["ddplab_checkpoint_crc32"] == str(zlib.crc32(text.encode())), "metadata CRC32")
    info = json.loads(text)
    check(info["step"] == 1 and "optimizer" in info["parts"], "step and parts")
    for k, arr in t.items():
        check(info["crc32"].get(k) == zlib.crc32(np.ascontiguousarray(arr).tobytes()),
              "CRC32 of " + k)

    try:
        import torch
    except ImportError:
        torch = None
        print("torch not importable: the PyTorch load is not checked")
    if torch is not None:
        net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 5), torch.nn.ReLU(),
                                  torch.nn.Dropout(0.5), torch.nn.Linear(5, 3))
        sd = {k: torch.from_numpy(np.array(v)) for k, v in t.items()
              if not k.startswith("optimizer.")}
        net.load_state_dict(sd, strict=True)
        net.eval()
        with torch.no_grad():
            out = net(torch.from_numpy(np.array(ref["input"]))).numpy()
        check(np.allclose(out, ref["output"], rtol=1e-5, atol=1e-6),
              "torch output %s vs ddplab %s" % (out, ref["output"]))

checks.finish()
