"""What the embedded backbone's null verdicts could have seen (issue 64 item 5): the minimum
detectable effect (MDE) of each, at its own sample size, 80% power, with the same test.

    python studies/power.py --out docs/results/power.json    # seconds, reads committed records

Read from the committed summaries the pages cite, no run needed:

- **headroom** (``docs/headroom/bf16/<form>-s4.json``): the cross-fitted per-prompt oracle's
  lead over the best fixed depth in expected reward, a paired bootstrap interval over 600
  training prompts;
- **per-level oracle** (``docs/adaptation/t0.7/*.json``): one depth per arith level (and one for
  GSM8K) against one depth for all, both cross-fitted, with a shuffled-label null;
- **controllers against the curve** (``docs/adaptation/bf16/n600/<form>-s4.json``): each arm's
  cross-fitted controllers minus the fixed curve at their own tokens, at tau = 0.2.

For an interval test the MDE is (z_0.975 + z_0.8) x SE = 2.80 SE, the SE read back from the
interval (``studylib.analysis.minimum_detectable_effect``). For the null test (a one-sided
permutation test at 5%) the effect must clear the null's 95th percentile with 80% power: its
distance above the null's mean, plus z_0.8 x SE. These are approximations (normal sampling
distributions, the SE at the observed effect), good to about a tenth of their size.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studylib.analysis import minimum_detectable_effect

REPO = Path(__file__).resolve().parents[1]
Z80 = 0.8416212335729143


def headroom(form: str) -> dict:
    d = json.loads((REPO / f"docs/headroom/bf16/{form}-s4.json").read_text())
    ci = d["headroom_val_ci95"]["gap_score_cf"]
    return {"verdict": f"headroom, per-prompt oracle (cross-fitted) over the best fixed depth, {form} form",
            "unit": "expected reward", "n": d["n_val"], "effect": d["headroom_val"]["gap_score_cf"],
            "ci95": ci, "mde": minimum_detectable_effect(ci),
            "source": f"docs/headroom/bf16/{form}-s4.json"}


def per_level(name: str) -> dict:
    d = json.loads((REPO / f"docs/adaptation/t0.7/{name}.json").read_text())
    ci, null = d["headroom_ci95"], d["null"]
    se = (ci[1] - ci[0]) / 3.92
    decoding = d["decoding"]
    if isinstance(decoding, dict):  # a rollout cache records its generation kwargs
        decoding = f"T = {decoding['temperature']}" if decoding.get("do_sample") else "greedy"
    decoding = {"t0.7": "T = 0.7"}.get(decoding, decoding)
    return {"verdict": f"per-level oracle (one depth per type) over one depth, {d['what']}, "
                       f"{d['form']} form, {decoding}",
            "unit": "accuracy", "n": d["n"], "effect": d["headroom"], "ci95": ci,
            "mde": minimum_detectable_effect(ci),
            "mde_against_null": float(null["q95"] - null["mean"] + Z80 * se),
            # in the claim's raw units (an accuracy difference from 0): choosing per level on
            # noise alone gains the null's mean, so an effect must reach its 95th percentile
            "mde_against_null_raw": float(null["q95"] + Z80 * se),
            "null_mean": null["mean"], "null_p": null["p"], "source": f"docs/adaptation/t0.7/{name}.json"}


def controllers(form: str) -> dict:
    d = json.loads((REPO / f"docs/adaptation/bf16/n600/{form}-s4.json").read_text())
    rows = []
    for arm, v in d["arms"].items():
        r = v.get("tau=0.2")
        if not r or "gap_accuracy_at_equal_tokens" not in r.get("ci95", {}):
            continue
        ci = r["ci95"]["gap_accuracy_at_equal_tokens"]
        if ci[1] - ci[0] < 0.002:  # (nearly) depth 0 everywhere: its gap is ~0 by construction
            continue
        rows.append({"arm": arm, "effect": r["figures"]["gap_accuracy_at_equal_tokens"],
                     "ci95": ci, "mde": minimum_detectable_effect(ci)})
    mdes = sorted(r["mde"] for r in rows)
    return {"verdict": f"cross-fitted controllers minus the fixed curve at their tokens, {form} form "
                       "(T = 0.7 cache, 600 prompts; the median arm)",
            "unit": "accuracy", "n": 600, "arms": rows,
            "mde": mdes[len(mdes) // 2] if mdes else None,
            "mde_min": mdes[0] if mdes else None, "mde_max": mdes[-1] if mdes else None,
            "source": f"docs/adaptation/bf16/n600/{form}-s4.json"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="write the record as JSON here")
    args = parser.parse_args(argv)
    record = {"power": 0.8, "alpha": 0.05, "rows": [
        headroom("ours"), headroom("paper"),
        *[per_level(n) for n in ("testset-greedy-ours", "testset-greedy-paper", "testset-t0.7-ours",
                                 "testset-t0.7-paper", "caches-ours", "caches-paper")],
        controllers("ours"), controllers("paper")]}
    for row in record["rows"]:
        extra = (f", against its null {row['mde_against_null']:.3f} above its mean "
                 f"{row['null_mean']:+.3f}, {row['mde_against_null_raw']:.3f} in raw units"
                 if "mde_against_null" in row else "")
        span = f" (arms: {row['mde_min']:.3f}-{row['mde_max']:.3f})" if row.get("mde_max") else ""
        print(f"{row['verdict']}: n {row['n']}, MDE {row['mde']:.3f} {row['unit']}{span}{extra}")
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
