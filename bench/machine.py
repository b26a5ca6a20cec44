"""What the benchmark drivers share: which Python runs which PyTorch, what CPU this is, and a
competing load they start themselves.

Imports nothing outside the standard library, so a driver can use it without importing torch.
"""
import os
import socket
import subprocess
import sys
import time

# Debian's PyTorch (1.13) lives in the system Python; a current one from PyPI in the venv that
# scripts/pyvenv makes once per machine.
SYSTEM_PYTHON = "/usr/bin/python3"

# The CPU features that decide which kernels oneDNN picks (float32 GEMM width, bfloat16 dot
# products, AMX tiles), and how fast the communication hooks' 16-bit casts run.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16")


# What ddprun gives its workers unless the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT
# (tools/launcher.cpp says why). The drivers give it to ddplab and PyTorch alike, so that the
# comparison runs both under the same OpenMP wait policy.
OMP_WAIT_DEFAULT = {"GOMP_SPINCOUNT": "1000"}


# glibc told to keep freed memory (no mmap for large blocks, no trimming, a large top pad): without
# it glibc hands large freed blocks back to the OS and PyTorch faults fresh pages in every step
# (/work/shared/toolchain.md), which ddplab's caching allocator avoids by design. The drivers' fair
# PyTorch ("+malloc").
TUNED_MALLOC = {
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(1 << 40),
    "MALLOC_TOP_PAD_": str(256 << 20),
}


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now (for a rendezvous the driver starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def omp_wait_default(environ):
    """OMP_WAIT_DEFAULT, or nothing when `environ` already chooses the wait policy."""
    chosen = any(environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"))
    return {} if chosen else dict(OMP_WAIT_DEFAULT)


def venv_python():
    """The venv's interpreter, or None when scripts/pyvenv has not made it."""
    venv = os.environ.get("DDPLAB_VENV") or os.path.expanduser("~/.cache/ddplab/venv")
    python = os.path.join(venv, "bin", "python3")
    return python if os.access(python, os.X_OK) else None


def torch_python(generation):
    """The interpreter for "torch" (Debian's 1.13) or "torch2" (PyPI); exits with what to do when
    the venv is missing."""
    if generation == "torch":
        return SYSTEM_PYTHON
    python = venv_python()
    if python is None:
        raise SystemExit(f"{generation} needs the PyPI PyTorch venv: run scripts/pyvenv "
                         "(or set DDPLAB_VENV), or leave the torch2 variants out")
    return python


def cpu_info():
    """One line: the model name from lscpu, the cores, and which of ISA_FLAGS the CPU has."""
    model, flags, cpus = "unknown CPU", set(), os.cpu_count()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model name":
                model = value.strip()
            elif key.strip() == "Flags":
                flags = set(value.split())
    except (OSError, subprocess.CalledProcessError):
        pass  # no lscpu: the line says "unknown CPU" and no flags
    isa = " ".join(f"{f}={'yes' if f in flags else 'no'}" for f in ISA_FLAGS)
    return f"CPU: {model}, {cpus} CPUs, {isa}"


def load_average():
    return "%.1f" % os.getloadavg()[0]


class CompetingLoad:
    """N processes that spin on the CPU, at the benchmark's own priority, for as long as the
    `with` block runs: the scheduler then splits the cores between them and the measured program,
    as on a machine where someone else is building or training. N = 0 starts nothing."""

    def __init__(self, n):
        self.n = n
        self.procs = []

    def __enter__(self):
        # Spins, and every ~10 ms checks that the driver is still its parent: a driver killed
        # without running __exit__ leaves no spinner behind.
        spin = ("import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n"
                "    for _ in range(100000): pass\n")
        self.procs = [subprocess.Popen([sys.executable, "-S", "-c", spin]) for _ in range(self.n)]
        if self.procs:
            time.sleep(0.2)  # let them start spinning before the measurement does
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        self.procs = []
        return False
