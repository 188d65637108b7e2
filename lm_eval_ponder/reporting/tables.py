"""The leaderboard as text: its Markdown table and CSV (``write_tables``) and its HTML page
(``write_html``), from the rows ``report.leaderboard`` makes. Formatting only: every figure is
computed before it reaches here, so the three forms cannot disagree."""

from __future__ import annotations

import base64
import csv
import html
import json
import math
from pathlib import Path

from lm_eval_ponder import registry
from lm_eval_ponder.reporting.identity import flatten, render
from lm_eval_ponder.reporting.plots import interval_kind


def cells(rows: list[dict], datasets: list[str]) -> list[dict]:
    """Every filled cell of the table (one row's figures on one dataset)."""
    return [r[d] for r in rows for d in datasets if isinstance(r.get(d), dict)]


def identity_lines(rows: list[dict]) -> list[str]:
    """One line per configuration in the table: its short hash and what it is."""
    seen = {r["identity"]: r["model"] for r in rows}
    return [f"{digest}: " + ", ".join(f"{k}={render(v)}" for k, v in flatten(model).items())
            for digest, model in seen.items()]


def cost_cells(f: dict) -> tuple[str, str]:
    """Mean tokens and log10 mean FLOPs as shown, with ``*`` when estimated."""
    mark = "*" if f.get("estimated") else ""
    return f"{f['tokens']:.1f}{mark}", f"{f['log10_flops']:.2f}{mark}"


def acc_text(f: dict) -> str:
    """Accuracy as shown: its interval, n, and the seeds it averages when more than one."""
    seeds = f", {f['seeds']} seeds" if f.get("seeds", 1) > 1 else ""
    return f"{f['acc']:.3f} [{f['lo']:.2f}, {f['hi']:.2f}] (n={f['n']}{seeds})"


def md_cell(f: dict | None) -> str:
    if not f:
        return "- | - | -"
    acc = f"**{acc_text(f)}**" if f["win"] else acc_text(f)
    return " | ".join((acc, *cost_cells(f)))


def write_tables(rows: list[dict], datasets: list[str], notes: list[str], out: Path) -> str:
    head = "| backbone | method | identity | " + " | ".join(
        f"{d} ACC [95% CI] | {d} Avg Tokens | {d} log10 FLOPs" for d in datasets) + " |"
    sep = "|" + "---|" * (3 + 3 * len(datasets))
    lines = [head, sep] + [
        f"| {r['backbone']} | {r['label']} | {r['identity']} | "
        + " | ".join(md_cell(r.get(d)) for d in datasets) + " |" for r in rows]
    md = "\n".join(lines) + "\n" + "".join(f"\n- {n}" for n in notes) + "\n" + \
        "\nIdentities (model part; the CSV has each cell's full identity):\n" + \
        "".join(f"\n- {line}" for line in identity_lines(rows)) + "\n"
    (out / "leaderboard.md").write_text(md)
    with open(out / "leaderboard.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["backbone", "method", "identity", "dataset", "n", "acc", "acc_lo", "acc_hi",
                    "avg_tokens", "log10_avg_flops", "avg_ponder_depth", "estimated", "bold",
                    "generation_kwargs"])
        for r, d in ((r, d) for r in rows for d in datasets if d in r):
            x = r[d]
            w.writerow([r["backbone"], r["label"], x["identity"], d, x["n"], f"{x['acc']:.4f}",
                        f"{x['lo']:.4f}", f"{x['hi']:.4f}", f"{x['tokens']:.2f}",
                        f"{x['log10_flops']:.4f}", f"{x['depth']:.3f}", x["estimated"], x["win"],
                        json.dumps(x["generation"], sort_keys=True, default=str)])
    return md


def spearman_text(method: str, dataset: str, rho: float, n: int) -> str:
    value = ("undefined (the depth is the same on every question)" if math.isnan(rho)
             else f"{rho:.3f}")
    return f"Spearman(ponder depth, level) {method} on {dataset}: {value} (n={n})"


def write_html(md_rows: list[dict], datasets: list[str], notes: list[str],
               images: list[tuple[Path, str]], cases: list[dict], spearmans: list,
               out: Path, link_figures: bool = False) -> None:
    """One self-contained page (figures inlined as data URIs): it opens from disk, or from an
    e-mail attachment, with nothing beside it. With ``link_figures`` the page names the figure
    files beside it instead: a page of a few kB rather than 0.1-1 MB, for a directory that
    keeps the figures anyway (docs/leaderboard, which every clone carries)."""
    def cell(f):
        if not f:
            return "<td>-</td><td>-</td><td>-</td>"
        acc = f"<b>{acc_text(f)}</b>" if f["win"] else acc_text(f)
        return f"<td>{acc}</td>" + "".join(f"<td>{c}</td>" for c in cost_cells(f))

    head = "".join(f"<th>{d} ACC</th><th>{d} tokens</th><th>{d} log10 FLOPs</th>"
                   for d in datasets)
    body = "".join(f"<tr><td>{html.escape(r['backbone'])}</td><td>{html.escape(r['label'])}"
                   f"</td><td><code>{r['identity']}</code></td>"
                   + "".join(cell(r.get(d)) for d in datasets) + "</tr>" for r in md_rows)
    parts = ["<!doctype html><meta charset='utf-8'><title>lm-eval-ponder leaderboard</title>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}"
             "td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px}"
             "table{border-collapse:collapse}pre{white-space:pre-wrap;background:#f6f6f6;"
             "padding:6px;font-size:12px}figure{margin:18px 0}figcaption{font-size:13px;"
             "color:#333;max-width:900px}img{max-width:100%}</style>",
             "<h1>Leaderboard</h1><table><tr><th>backbone</th><th>method</th><th>identity</th>"
             + head + "</tr>" + body + "</table>",
             f"<p>Accuracy: {interval_kind(cells(md_rows, datasets))}, n questions (the "
             "questions every method of the dataset answered). Bold only when the interval "
             "does not overlap the runner-up's."
             "</p><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>",
             "<h2>Identities</h2><p>The configuration behind each identity (model part; "
             "leaderboard.csv has each cell's full identity with its generation kwargs).</p><ul>"
             + "".join(f"<li><code>{html.escape(line)}</code></li>"
                       for line in identity_lines(md_rows)) + "</ul>"]
    if spearmans:
        parts.append("<h2>Ponder depth vs difficulty</h2><ul>" + "".join(
            f"<li>{html.escape(spearman_text(*row))}</li>" for row in spearmans) + "</ul>")
    parts.append("<h2>Figures</h2>")
    for img, caption in images:
        src = html.escape(img.name) if link_figures else \
            "data:image/png;base64," + base64.b64encode(img.read_bytes()).decode()
        parts.append(f"<figure><img alt='{img.name}' src='{src}'>"
                     f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    parts.append("<h2>Cases</h2><p>Rule: per dataset, the first two questions (document order)"
                 " where FP is right and CoT or Direct is wrong, and the first where FP is wrong"
                 " and a baseline is right. Nothing else is selected."
                 f" Never quoted: {', '.join(sorted(registry.UNPUBLISHED))} (its authors ask that"
                 " its questions not be published in plain text).</p>")
    for c in cases:
        parts.append(f"<h3>{c['dataset']}</h3><pre>{html.escape(c['question'])}</pre>"
                     f"<p>target: {html.escape(str(c['target']))}</p><table><tr>")
        for name, s in c["answers"]:
            text = s["filtered_resps"][0] if s.get("filtered_resps") else ""
            text = text if isinstance(text, str) else json.dumps(text)
            parts.append(f"<td valign='top'><b>{html.escape(name)}</b> — "
                         f"{'correct' if s['exact_match'] else 'wrong'}, "
                         f"{s['gen_tokens']:.0f} tokens"
                         f"{' (estimated)' if s.get('estimated') else ''}"
                         f"<pre>{html.escape(text)}</pre></td>")
        parts.append("</tr></table>")
    (out / "leaderboard.html").write_text("\n".join(parts))
