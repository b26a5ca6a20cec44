#!/usr/bin/env python3
"""examples/train's command line: wrong flags end at once (exit 2, before any data is loaded) with
a message naming the flag, a mistyped flag gets the nearest one suggested, and --config reads the
same keys from JSON or TOML, the command line winning; the effective config it prints reads back
to itself. No dataset is needed: --data-dir points at nothing, so a run that gets past the flags
stops (exit 2) right after printing its effective config.

  check_train_flags.py TRAIN_BINARY
"""
import os
import subprocess
import sys
import tempfile

TRAIN = sys.argv[1]
failures = []


def run(*args):
    return subprocess.run([TRAIN, *args], capture_output=True, text=True, timeout=60)


def expect_error(args, *fragments):
    r = run(*args)
    text = r.stdout + r.stderr
    ok = r.returncode == 2 and all(f in text for f in fragments)
    print(("ok  " if ok else "FAIL"), " ".join(args), "->", r.returncode)
    if not ok:
        failures.append(f"{args}: exit {r.returncode}, wanted 2 and {fragments}; got:\n{text}")


def effective_config(args):
    """The effective config a run prints (it then fails to load the missing dataset)."""
    r = run(*args, "--data-dir", "/nonexistent/ddplab-data")
    out = r.stdout
    if "effective config:" not in out:
        failures.append(f"{args}: no effective config printed (exit {r.returncode}):\n"
                        f"{r.stdout}{r.stderr}")
        return {}
    lines = out.split("effective config:\n", 1)[1].splitlines()
    config = {}
    for line in lines:
        if "=" not in line:
            break
        key, value = line.split("=", 1)
        config[key] = value
    return config


expect_error(["--lrr", "0.1"], "--lrr: unknown flag", "did you mean --lr?")
expect_error(["--sync-nb"], "did you mean --sync-bn?")
expect_error(["--model", "resnt20"], "unknown model 'resnt20'", "resnet20")
expect_error(["--epochs", "0"], "--epochs must be at least 1")
expect_error(["--epochs", "-3"], "--epochs must be at least 1")
expect_error(["--subset", "-1"], "--subset must be >= 0")
expect_error(["--threads", "-2"], "--threads must be >= 0")
expect_error(["--batch-size", "0"], "--batch-size must be at least 1")
# Uneven shards: the Join shadows the loss scaler's all-reduce (accepted), not a partial
# accumulation group (refused).
expect_error(["--even-shards", "off", "--accumulation-steps", "2"], "--accumulation-steps > 1")
if effective_config(["--even-shards", "off", "--grad-scaler"]).get("grad-scaler") != "true":
    failures.append("--even-shards off --grad-scaler should be accepted")

with tempfile.TemporaryDirectory() as d:
    js = os.path.join(d, "c.json")
    with open(js, "w") as f:
        f.write('{"model": "cnn", "dataset": "fmnist", "lr": 0.05, "sync-bn": true, "epochs": 3}')
    c = effective_config(["--config", js, "--epochs", "2"])
    want = {"model": '"cnn"', "lr": "0.05", "sync-bn": "true", "epochs": "2"}
    for k, v in want.items():
        if c.get(k) != v:
            failures.append(f"JSON config: {k} = {c.get(k)!r}, wanted {v!r}")

    toml = os.path.join(d, "c.toml")
    with open(toml, "w") as f:
        f.write('model = "mlp"\ndataset = "fmnist"\nlr = 0.07\nbatch-size = 32\n')
    c = effective_config(["--config", toml, "--lr", "0.02"])
    want = {"model": '"mlp"', "lr": "0.02", "batch-size": "32"}
    for k, v in want.items():
        if c.get(k) != v:
            failures.append(f"TOML config: {k} = {c.get(k)!r}, wanted {v!r}")

    # The printed config is itself a config file that gives the same run.
    saved = os.path.join(d, "effective.toml")
    with open(saved, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in c.items() if k != "data-dir"))
    again = effective_config(["--config", saved])
    if {k: v for k, v in again.items() if k != "data-dir"} != \
            {k: v for k, v in c.items() if k != "data-dir"}:
        failures.append(f"effective config does not read back to itself:\n{c}\n{again}")

    bad_key = os.path.join(d, "bad.json")
    with open(bad_key, "w") as f:
        f.write('{"lrr": 0.1}')
    expect_error(["--config", bad_key], "'lrr' is not a flag", "did you mean 'lr'?")
    bad_json = os.path.join(d, "broken.json")
    with open(bad_json, "w") as f:
        f.write('{"lr": 0.1,')
    expect_error(["--config", bad_json], "not valid JSON")
    nested = os.path.join(d, "nested.json")
    with open(nested, "w") as f:
        f.write('{"optim": {"lr": 0.1}}')
    expect_error(["--config", nested], "optim")

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
