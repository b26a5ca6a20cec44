"""A real PyTorch TCPStore server for test_torch_store.cpp, driven through stdin/stdout.

    torch_store_server.py libuv|legacy

Hosts torch.distributed.TCPStore on a free port of 127.0.0.1 (the libuv backend, as torchrun's
agent does, or the older one), sets the key "from_torch", and prints the port. Then, one command
per line on stdin, it acts as a second, PyTorch-side client of its own store:

    get KEY          prints the value (waiting for it, as PyTorch's get does)
    set KEY VALUE    sets it, prints "ok"
    num_keys         prints the number of keys

It exits when stdin closes (the test ended or died).
"""
import sys
from datetime import timedelta

import torch.distributed as dist

store = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=sys.argv[1] == "libuv",
                      wait_for_workers=False, timeout=timedelta(seconds=30))
store.set("from_torch", "hello from PyTorch")
print(store.port, flush=True)
for line in sys.stdin:
    words = line.rstrip("\n").split(" ", 2)
    if words[0] == "get":
        print(store.get(words[1]).decode(), flush=True)
    elif words[0] == "set":
        store.set(words[1], words[2])
        print("ok", flush=True)
    elif words[0] == "num_keys":
        print(store.num_keys(), flush=True)
