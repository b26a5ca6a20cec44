"""A tiny, independent safetensors reader/writer on numpy (no safetensors package needed).

Used by the Python halves of the parity and interop tests. BF16 has no numpy type: it is read
as float32 (by widening the bits) and written from float32 by truncating to the top 16 bits
(callers pass values that are exact in bfloat16).
"""
import json
import struct

import numpy as np

_DT = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64,
       "I32": np.int32, "U8": np.uint8, "BOOL": np.bool_}


def read(path):
    """Returns {name: numpy array}; BF16 tensors come back as float32."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    buf = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        chunk = buf[b:end]
        if e["dtype"] == "BF16":
            bits = np.frombuffer(chunk, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = np.frombuffer(chunk, dtype=np.dtype(_DT[e["dtype"]]).newbyteorder("<"))
        out[name] = arr.reshape(e["shape"]).copy()
    return out


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def write(path, tensors, bf16=()):
    """tensors: {name: numpy array}; names in `bf16` are stored as BF16."""
    header, chunks, off = {}, [], 0
    for name, arr in tensors.items():
        arr = np.asarray(arr)  # not ascontiguousarray: it makes a 0-d array 1-d
        if name in bf16:
            data = (arr.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
            dt = "BF16"
        else:
            dt = next(k for k, v in _DT.items() if np.dtype(v) == arr.dtype)
            data = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(data)]}
        chunks.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))


def read_metadata(path):
    """The header's "__metadata__" (str -> str), empty when absent."""
    return read_header(path).get("__metadata__", {})
