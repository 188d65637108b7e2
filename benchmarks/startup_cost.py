"""What the lm-eval registration costs an unrelated Python process (`python -c pass`).

The wheel installs `lm_eval_ponder.pth`, which imports `lm_eval_ponder_autoload` at every
interpreter start. This prints the cumulative import time of that module over N runs of
`python -X importtime -c pass` (median), and, for scale, the median wall time of the whole
`python -c pass`. Usage: python benchmarks/startup_cost.py [N]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time


def main(n: int = 30) -> None:
    hook_us, wall_ms = [], []
    for _ in range(n):
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"],
                             capture_output=True, text=True, cwd="/")
        wall_ms.append((time.perf_counter() - start) * 1e3)
        lines = [line for line in out.stderr.splitlines()
             if line.rstrip().endswith("lm_eval_ponder_autoload")]
        if not lines:
            sys.exit("lm_eval_ponder.pth is not installed in this environment (pip install .)")
        hook_us.append(int(lines[-1].split("|")[1]))
    print(f"runs {n}")
    print(f"python -c pass wall time: median {statistics.median(wall_ms):.1f} ms")
    print(f"lm_eval_ponder_autoload cumulative import: median {statistics.median(hook_us) / 1e3:.2f} ms "
          f"(max {max(hook_us) / 1e3:.2f} ms); budget 20 ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
