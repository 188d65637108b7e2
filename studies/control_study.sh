#!/usr/bin/env bash
# Issue 75: the trainer's positive control, every shipped world x three recipes x seeds 0-2
# (lm-eval-ponder train --control), merged into one committed record. About 15 min on 2 cores
# (the GRPO recipes take most of it); each run is also a command of its own:
#   lm-eval-ponder train --control WORLD --recipe RECIPE --seeds 0,1,2 --output DIR
# Usage: [OUT=/tmp/control] [RECORD=results/control/control.json] bash studies/control_study.sh
set -euo pipefail
out="${OUT:-/tmp/control}"
record="${RECORD:-results/control/control.json}"
py="${PYTHON:-python}"
for world in clean organism non_monotone; do
  for recipe in default grpo-2026-12 paper; do
    [ -f "$out/$world-$recipe/control.json" ] && continue
    "$py" -m lm_eval_ponder.train --control "$world" --recipe "$recipe" --seeds 0,1,2 \
        --output "$out/$world-$recipe"
  done
done
"$py" - "$out" "$record" <<'PY'
import json, platform, sys
from pathlib import Path
out, record = Path(sys.argv[1]), Path(sys.argv[2])
runs = {}
for path in sorted(out.glob("*/control.json")):
    r = json.loads(path.read_text())
    for result in r["results"] + ([r["ceiling"]] if "ceiling" in r else []):
        result["score"].pop("n", None)
    runs[path.parent.name] = {"world": r["world"]["name"], "recipe": r["recipe"],
                              "passed": r["passed"], "results": r["results"],
                              "ceiling": r.get("ceiling"),
                              "price_per_1k_tokens": r["config"]["reward"]["price_per_1k_tokens"]}
info = open("/proc/cpuinfo").read()
cpu = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), "")
cpu += " (" + (", ".join(f for f in ("avx512_bf16", "amx_bf16") if f in info) or "no native bf16") + ")"
record.parent.mkdir(parents=True, exist_ok=True)
record.write_text(json.dumps({"machine": {"cpu": cpu, "python": platform.python_version()},
                              "command": "bash studies/control_study.sh", "runs": runs},
                             indent=1, sort_keys=True) + "\n")
print(f"written {record} ({len(runs)} runs)")
PY
