"""Real PyTorch TCPStore servers for test_torch_store.cpp, driven through stdin/stdout.

Hosts two torch.distributed.TCPStore servers on free ports of 127.0.0.1, one with the libuv
backend (as torchrun's agent does) and one with the older backend, sets the key "from_torch" in
both, and prints their ports: "LIBUV_PORT LEGACY_PORT". Then, one command per line on stdin, it
acts as a PyTorch-side client of the store named first (libuv or legacy):

    STORE get KEY          prints the value (waiting for it, as PyTorch's get does)
    STORE set KEY VALUE    sets it, prints "ok"
    STORE num_keys         prints the number of keys

It exits when stdin closes (the test ended or died). One process for both, since importing
torch takes seconds.
"""
import sys
from datetime import timedelta

import torch.distributed as dist

stores = {}
for backend in ("libuv", "legacy"):
    stores[backend] = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=backend == "libuv",
                                    wait_for_workers=False, timeout=timedelta(seconds=30))
    stores[backend].set("from_torch", "hello from PyTorch")
print(stores["libuv"].port, stores["legacy"].port, flush=True)
for line in sys.stdin:
    words = line.rstrip("\n").split(" ", 3)
    store = stores[words[0]]
    if words[1] == "get":
        print(store.get(words[2]).decode(), flush=True)
    elif words[1] == "set":
        store.set(words[2], words[3])
        print("ok", flush=True)
    elif words[1] == "num_keys":
        print(store.num_keys(), flush=True)
