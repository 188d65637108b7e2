"""Per-level wins and losses with a multiplicity correction (issue 65): each steered row of the
paper's protocol against its base, paired per question (the per-question means over seeds
0-2), one exact sign test per arith level and Holm's adjustment over the five levels.

    python studies/per_level_holm.py --out docs/results/paper-protocol-levels-holm.json

Reads the committed suite runs (``results/suite/t0.7*``, compact logs); seconds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PAIRS = (("FP-Direct [t0.7]", "Direct [t0.7]"), ("FR (alpha=-0.2) [t0.7]", "Direct [t0.7]"),
         ("FP-CoT [t0.7]", "CoT [t0.7]"))
ROOTS = ("results/suite/t0.7", "results/suite/t0.7-seed1", "results/suite/t0.7-seed2")


def main(argv: list[str] | None = None) -> int:
    from lm_eval_ponder.reporting.measures import holm, sign_test
    from lm_eval_ponder.reporting.report import load_runs

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="write the record as JSON here")
    args = parser.parse_args(argv)
    by = {r.method: r for r in load_runs(list(ROOTS)) if r.dataset == "arith"}
    out = {}
    for method, base in PAIRS:
        a = {s["doc_id"]: s for s in by[method].samples}
        b = {s["doc_id"]: s for s in by[base].samples}
        rows = []
        for level in range(1, 6):
            d = [float(a[i]["exact_match"]) - float(b[i]["exact_match"])
                 for i in a if i in b and a[i]["doc"].get("level") == level]
            rows.append({"level": level, "n": len(d), "diff": round(sum(d) / len(d), 4),
                         "sign_p": sign_test(d)})
        for row, p in zip(rows, holm([r["sign_p"] for r in rows])):
            row["sign_p"], row["holm_p"] = round(row["sign_p"], 4), round(p, 4)
        out[f"{method} - {base}"] = rows
        print(f"{method} - {base}: " + "; ".join(
            f"L{r['level']} {r['diff']:+.3f} (p {r['sign_p']:.3f}, Holm {r['holm_p']:.3f})"
            for r in rows))
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"what": "paired per-level accuracy differences at T = 0.7, seeds 0-2 (per-question "
                     "means), exact sign test, Holm over the 5 levels", "roots": list(ROOTS),
             "rows": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
