"""The held-out records of an adaptation sweep (``adaptation.py``), kept as one compressed file
per sweep.

Each cross-fitted run writes ``<sweep>/<arm>/seed<s>/fold<f>/heldout.json`` (about 30 KB: the
held-out prompts' keys, depths and continue probabilities, and the training log). A sweep of
105 runs is 3 MB of them, mostly the probabilities printed to 17 digits; the repository keeps
instead one ``<sweep>/heldout.jsonl.xz`` (``PACK``) with every run's record, the
probabilities as the shortest decimals that read back to the same float32 (they come from a
float32 tensor), 0.1-0.5 MB per sweep. ``record`` reads a run's record from its own file where
present, else from the pack, bit for bit what the run wrote; ``pack`` merges the runs' files
into the pack after each run, so a sweep that spans sessions keeps its finished runs in git.
"""

from __future__ import annotations

import json
from pathlib import Path

from lm_eval_ponder.errors import PonderError
from lm_eval_ponder.files import exact_float32, read_jsonl, short_float32, write_jsonl_xz

RECORD = "heldout.json"
PACK = "heldout.jsonl.xz"
FLOAT32 = ("val_p_continue",)  # fields that hold rows of float32 values


def run_name(sweep: Path, run: Path) -> str:
    """A run's name within its sweep: <arm>/seed<s>/fold<f>."""
    return run.relative_to(sweep).as_posix()


def encode(record: dict) -> dict:
    """A record as the pack keeps it: float32 rows as short decimals (``short_float32``)."""
    out, float32 = dict(record), []
    for name in FLOAT32:
        rows = [short_float32(row) for row in record.get(name, [])]
        if all(row is not None for row in rows):
            out[name], float32 = rows, [*float32, name]
    return {**out, "float32": float32} if float32 else out


def decode(stored: dict) -> dict:
    """The record a run wrote, from its packed form."""
    record = dict(stored)
    for name in record.pop("float32", []):
        record[name] = [exact_float32(row) for row in record[name]]
    return record


def read_pack(sweep: Path) -> dict[str, dict]:
    """Run name -> record, of a sweep's pack (empty if it has none)."""
    path = sweep / PACK
    if not path.is_file():
        return {}
    out = {}
    for line in read_jsonl(path):
        if "run" not in line or "record" not in line:
            raise PonderError(f"{path}: a line without run and record; rebuild it with "
                              "`adaptation.py train` from the runs' heldout.json files")
        out[line["run"]] = line["record"]
    return out


def record(sweep: Path, run: Path) -> dict | None:
    """A finished run's record: its own ``heldout.json``, else the sweep's pack; None if the
    run has not finished."""
    own = run / RECORD
    if own.is_file():
        return json.loads(own.read_text())
    stored = read_pack(sweep).get(run_name(sweep, run))
    return None if stored is None else decode(stored)


def records(sweep: Path) -> dict[str, dict]:
    """Every finished run of a sweep by name, from the pack and the runs' own files."""
    out = {name: decode(stored) for name, stored in read_pack(sweep).items()}
    for own in sorted(sweep.glob(f"*/seed*/fold*/{RECORD}")):
        out[run_name(sweep, own.parent)] = json.loads(own.read_text())
    return out


def pack(sweep: Path) -> Path:
    """Rewrite the sweep's pack with every finished run (atomically)."""
    target = sweep / PACK
    write_jsonl_xz(target, [{"run": name, "record": encode(rec)}
                            for name, rec in sorted(records(sweep).items())])
    return target
