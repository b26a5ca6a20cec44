#!/usr/bin/env python3
"""Merge the flight-recorder dumps of all ranks into one table: sequence number x rank.

Each rank's process group keeps its last collectives and writes them, when a collective fails,
to flight_<group>_rank<R>.jsonl (see comm/flight_recorder.h). One rank's dump says where
that rank was; only the ranks side by side say who was behind. This tool lines them up and marks
the first sequence number where the ranks disagree, which is where the job went wrong.

A rank that left no dump (it was stopped, or killed before it could write) is still placed, from
two clues in the other ranks' dumps: their headers carry how many collectives each peer had
reported starting (published every 250 ms, so it may lag), and a collective that needs every
rank's data (all_reduce, all_gather, reduce_scatter, barrier) cannot have completed anywhere
unless every rank joined it.

Usage: flight_merge.py DIR_OR_FILE... [--group NAME] [--last N]
"""
import argparse
import glob
import json
import os
import sys


def load(paths, group):
    """{rank: (header, {seq: entry})} from the dump files found in `paths`."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(glob.glob(os.path.join(p, "flight_*_rank*.jsonl")))
        else:
            files.append(p)
    dumps = {}
    for path in files:
        with open(path) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        if not lines:
            continue
        header, entries = lines[0], lines[1:]
        if group and header.get("group") != group:
            continue
        dumps[header["rank"]] = (header, {e["seq"]: e for e in entries})
    return dumps


NEEDS_EVERY_RANK = {"all_reduce", "all_gather", "reduce_scatter", "barrier"}


def reached_without_dump(dumps, started_by_peers):
    """How many collectives a rank without a dump must have joined, by the two clues above."""
    joined = 0
    seqs = sorted(set().union(*(entries for _, entries in dumps.values())))
    for seq in seqs:
        row = [entries.get(seq) for _, entries in dumps.values()]
        if all(e and e["state"] == "completed" and e["op"] in NEEDS_EVERY_RANK for e in row):
            joined = seq + 1
    return max(joined, started_by_peers)


def cell(dumps, reached, rank, seq):
    """(op, what `rank` did at `seq`): ('all_reduce', 'completed'), (None, 'not issued')..."""
    if rank in dumps:
        entries = dumps[rank][1]
        if seq in entries:
            return entries[seq]["op"], entries[seq]["state"]
        if entries and seq < min(entries):
            return None, "(evicted)"
        return None, "not issued"
    if rank not in reached:
        return None, "?"
    return None, "reached" if seq < reached[rank] else "not reached"


def progress(c):
    """How far a cell shows a rank got, to find who is behind: higher is further."""
    state = c[1]
    if state in ("not issued", "not reached"):
        return 0
    if state == "issued":
        return 1
    return 2  # started, completed, failed, reached, (evicted)


def text(c):
    return c[1] if c[0] is None else c[0] + " " + c[1]


def agree(cells):
    """Ranks agree at a seq when they ran the same op and each got equally far with it."""
    ops = {c[0] for c in cells if c[0] is not None}
    levels = {progress(c) for c in cells if c[1] != "?"}
    return len(ops) <= 1 and len(levels) <= 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", help="dump files, or folders holding flight_*.jsonl")
    ap.add_argument("--group", default="", help="only this process group's dumps")
    ap.add_argument("--last", type=int, default=20, help="rows before the disagreement to show")
    args = ap.parse_args()

    dumps = load(args.paths, args.group)
    if not dumps:
        print("flight_merge: no flight_*_rank*.jsonl dumps in " + " ".join(args.paths))
        return 1
    size = max(h["size"] for h, _ in dumps.values())
    ranks = list(range(size))
    started_by_peers = {}
    for header, _ in dumps.values():
        for r, n in header.get("peers", {}).items():
            started_by_peers[int(r)] = max(started_by_peers.get(int(r), 0), n)
    reached = {r: reached_without_dump(dumps, started_by_peers.get(r, 0))
               for r in ranks if r not in dumps}
    seqs = sorted(set().union(*(entries for _, entries in dumps.values())))

    first_bad = None
    rows = []
    for seq in seqs:
        cells = [cell(dumps, reached, r, seq) for r in ranks]
        rows.append((seq, cells))
        if first_bad is None and not agree(cells):
            first_bad = seq

    print("flight recorder: %d of %d ranks dumped (%s)" %
          (len(dumps), size, ", ".join("rank %d" % r for r in sorted(dumps))))
    for r in ranks:
        if r not in dumps:
            seen = "seq %d" % (reached[r] - 1) if reached[r] else "no collective"
            print("rank %d left no dump; the other ranks' dumps show it reached %s" % (r, seen))
    width = max([22] + [len(text(c)) for _, cells in rows for c in cells])
    print("seq".rjust(6) + "  " + "  ".join(("rank %d" % r).ljust(width) for r in ranks))
    start = 0 if first_bad is None else max(0, seqs.index(first_bad) - args.last)
    for seq, cells in rows[start:]:
        mark = "  <== first disagreement" if seq == first_bad else ""
        print(str(seq).rjust(6) + "  " + "  ".join(text(c).ljust(width) for c in cells) + mark)

    if first_bad is None:
        print("All ranks agree on every recorded collective.")
        return 0
    cells = dict(rows)[first_bad]
    low = min(progress(c) for c in cells if c[1] != "?")
    behind = [r for r, c in zip(ranks, cells) if c[1] != "?" and progress(c) == low]
    ops = sorted({c[0] for c in cells if c[0] is not None})
    print("First disagreement at seq %d (%s): rank%s %s behind." %
          (first_bad, " vs ".join(ops) if ops else "?", "s" if len(behind) > 1 else "",
           ", ".join(str(r) for r in behind)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
