"""The report as one self-contained HTML page (pure: ``ReportData`` in, a string out).

Guarantees: the page loads nothing (no network, no CDN, no external file): its CSS, its script
and its charts (SVG drawn here) are inline; every text from a record or a transcript goes through
``html.escape``, so what an agent printed shows as text and never runs. Each trial's details are
collapsed (``<details>``). Without the script every trial shows in record order; with it the
table sorts by a column (click its heading) and filters by text and status, and reads its
starting state from the address's fragment: ``#q=TEXT&status=resolved|failed|excluded&sort=KEY&desc=1``.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

from termgym.cli.run_report.data import COLUMNS, STATUSES, Bin, Clip, ReportData, TranscriptView, TrialView, TurnView

CSS = """
:root{--ok:#1a7f37;--bad:#cf222e;--muted:#57606a;--line:#d0d7de;--bg:#f6f8fa;--ex:#9a6700}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1400px;padding:16px 24px;
  color:#1f2328}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:24px 0 8px;border-bottom:1px solid var(--line);padding-bottom:4px}
.meta{color:var(--muted);margin:0}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:12px 0}
.card{border:1px solid var(--line);border-radius:6px;padding:10px 14px;min-width:150px;background:var(--bg)}
.card .value{display:block;font-size:24px;font-weight:600}.card .label{color:var(--muted);font-size:12px}
table{border-collapse:collapse;width:100%}
th,td{border-bottom:1px solid var(--line);padding:4px 8px;text-align:left;vertical-align:top}
th{background:var(--bg);white-space:nowrap}td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
#trials th{cursor:pointer;user-select:none}#trials th[aria-sort=ascending]::after{content:" ▲"}
#trials th[aria-sort=descending]::after{content:" ▼"}
.resolved{color:var(--ok);font-weight:600}.failed{color:var(--bad);font-weight:600}
.excluded{color:var(--ex);font-weight:600}
.controls{display:flex;gap:12px;align-items:center;margin:8px 0}.controls input{padding:4px 8px;min-width:280px}
.charts{display:flex;flex-wrap:wrap;gap:24px}.charts figure{margin:0}
.charts figcaption{font-weight:600;margin-bottom:4px}
svg text{font:11px system-ui,sans-serif;fill:#1f2328}svg .bar{fill:#0969da}svg .axis{stroke:#8c959f}
details.trial{border:1px solid var(--line);border-radius:6px;margin:6px 0;padding:4px 10px}
details.trial>summary{cursor:pointer;font-weight:600}
pre{background:var(--bg);border:1px solid var(--line);border-radius:4px;padding:6px 8px;white-space:pre-wrap;
  word-break:break-all;margin:4px 0;max-height:480px;overflow:auto}
.cut{display:block;color:var(--ex);font-style:italic;margin:4px 0}
ul.assertions{list-style:none;padding-left:0}ul.assertions li::before{content:"✔ ";color:var(--ok)}
ul.assertions li.fail::before{content:"✘ ";color:var(--bad)}
.step{border-left:3px solid var(--line);padding-left:8px;margin:8px 0}.step .head{color:var(--muted);font-size:12px}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:6px 0}dl.facts dt{color:var(--muted)}
dl.facts dd{margin:0}
"""

SCRIPT = """
(function () {
  var table = document.getElementById('trials');
  if (!table) return;
  var body = table.tBodies[0], heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
  var rows = Array.prototype.slice.call(body.rows);
  var query = document.getElementById('q'), status = document.getElementById('status');
  var shown = document.getElementById('shown');
  var state = {sort: '', desc: false};

  function readHash() {
    var params = new URLSearchParams(location.hash.replace(/^#/, ''));
    query.value = params.get('q') || '';
    status.value = params.get('status') || 'all';
    if (status.value === '') status.value = 'all';
    state.sort = params.get('sort') || '';
    state.desc = params.get('desc') === '1';
  }
  function writeHash() {
    var params = new URLSearchParams();
    if (query.value) params.set('q', query.value);
    if (status.value !== 'all') params.set('status', status.value);
    if (state.sort) params.set('sort', state.sort);
    if (state.sort && state.desc) params.set('desc', '1');
    try { history.replaceState(null, '', '#' + params.toString()); } catch (e) {}
  }
  function filter() {
    var text = query.value.trim().toLowerCase(), wanted = status.value, count = 0;
    rows.forEach(function (row) {
      var ok = (!text || row.dataset.search.indexOf(text) >= 0) && (wanted === 'all' || row.dataset.status === wanted);
      row.hidden = !ok;
      var detail = document.getElementById('d' + row.dataset.idx);
      if (detail) detail.hidden = !ok;
      if (ok) count++;
    });
    shown.textContent = count + ' of ' + rows.length + ' trials shown';
  }
  function sort() {
    var column = heads.findIndex(function (th) { return th.dataset.key === state.sort; });
    heads.forEach(function (th) { th.removeAttribute('aria-sort'); });
    if (column < 0) { state.sort = ''; return; }
    var numeric = heads[column].dataset.type === 'num', sign = state.desc ? -1 : 1;
    heads[column].setAttribute('aria-sort', state.desc ? 'descending' : 'ascending');
    var keyed = rows.map(function (row) {
      var value = row.cells[column].dataset.sort;
      return {row: row, key: numeric ? parseFloat(value) : value, idx: +row.dataset.idx};
    });
    keyed.sort(function (a, b) {
      var c = numeric ? a.key - b.key : (a.key < b.key ? -1 : a.key > b.key ? 1 : 0);
      return sign * c || a.idx - b.idx;
    });
    var fragment = document.createDocumentFragment();
    keyed.forEach(function (k) { fragment.appendChild(k.row); });
    body.appendChild(fragment);
    rows = keyed.map(function (k) { return k.row; });
  }
  heads.forEach(function (th) {
    th.addEventListener('click', function () {
      state.desc = state.sort === th.dataset.key ? !state.desc : false;
      state.sort = th.dataset.key;
      sort(); writeHash();
    });
  });
  query.addEventListener('input', function () { filter(); writeHash(); });
  status.addEventListener('change', function () { filter(); writeHash(); });
  function openTarget() {
    var target = location.hash.match(/^#d\\d+$/) && document.querySelector(location.hash);
    if (target && target.tagName === 'DETAILS') target.open = true;
  }
  window.addEventListener('hashchange', openTarget);
  if (/^#d\\d+$/.test(location.hash)) { openTarget(); } else { readHash(); }
  sort(); filter();
  document.body.dataset.ready = '1';
})();
"""


NUM = ' class="num"'
NUM_SORT = ' data-type="num" class="num"'


def e(value: Any) -> str:
    """Any value as escaped HTML text (None as an empty string)."""
    return html.escape("" if value is None else str(value), quote=True)


def render(data: ReportData) -> str:
    """The whole page."""
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        # No fetch of any kind: the page's only script and style are inline.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">",
        f"<title>termgym report · {e(data.title)}</title>",
        f"<style>{CSS}</style></head><body>",
        _header(data),
        _summary(data),
        _charts(data),
        _table(data.trials),
        _details(data.trials),
        f"<script>{SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _header(data: ReportData) -> str:
    meta = [
        f"run {', '.join(data.run_ids)}" if data.run_ids else "",
        f"agent {', '.join(data.agents)}" if data.agents else "",
        f"backend {', '.join(data.backends)}" if data.backends else "",
    ]
    line = " · ".join(m for m in meta if m)
    return f'<header><h1>termgym report · {e(data.title)}</h1><p class="meta">{e(line)}</p></header>'


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _card(key: str, value: str, label: str, raw: float | int) -> str:
    return (
        f'<div class="card" id="card-{e(key)}"><span class="value" data-value="{e(raw)}">{e(value)}</span>'
        f'<span class="label">{e(label)}</span></div>'
    )


def _summary(data: ReportData) -> str:
    s = data.summary
    low, high = s.get("resolved_ci95") or (0.0, 1.0)
    cards = [
        _card(
            "resolved",
            _pct(s["resolved_rate"]),
            f"resolved: {s['resolved']} of {s['trials']} · 95% CI [{_pct(low)}, {_pct(high)}]",
            s["resolved_rate"],
        ),
        _card("reward", f"{s['mean_reward']:.3f}", "mean reward", s["mean_reward"]),
        _card("assertions", _pct(s["mean_assertions_passed"]), "assertions passed (mean)", s["mean_assertions_passed"]),
        _card("trials", str(s["records"]), f"trials · {s['tasks']} tasks · {s['scored']} scored", s["records"]),
    ]
    if data.k > 1:
        cards.append(
            _card(f"pass-at-{data.k}", _pct(s["pass_at_k"][str(data.k)]), f"pass@{data.k}", s["pass_at_k"][str(data.k)])
        )
    excluded = s.get("excluded") or {}
    if excluded:
        count = sum(excluded.values())
        label = "excluded (infrastructure): " + ", ".join(f"{k} {v}" for k, v in excluded.items())
        cards.append(_card("excluded", str(count), label, count))
    lines = [
        _counts("errors", s.get("errors") or {}),
        _counts("stop reasons", s.get("stop_reasons") or {}),
    ]
    return (
        '<section id="summary"><h2>Summary</h2>'
        f'<div class="cards">{"".join(cards)}</div>'
        f"{_family_table(s, data.k)}{''.join(lines)}</section>"
    )


def _counts(name: str, counts: Mapping[str, int]) -> str:
    if not counts:
        return ""
    return f'<p class="meta">{e(name)}: {e(" · ".join(f"{k} {v}" for k, v in counts.items()))}</p>'


def _family_table(s: Mapping[str, Any], k: int) -> str:
    ks = list(range(1, k + 1)) if k > 1 else []
    head = ["family", "tasks", "trials", "resolved", "95% interval", *(f"pass@{i}" for i in ks), "reward", "assertions"]
    rows = []
    for family, rates in [*s.get("families", {}).items(), ("all", s)]:
        low, high = rates.get("resolved_ci95") or (0.0, 1.0)
        passes = rates.get("pass_at_k") or {}
        cells = [
            f"<td>{e(family)}</td>",
            f'<td class="num">{rates["tasks"]}</td>',
            f'<td class="num">{rates["trials"]}</td>',
            f'<td class="num">{_pct(rates["resolved_rate"])}</td>',
            f'<td class="num">[{_pct(low)}, {_pct(high)}]</td>',
            *(f'<td class="num">{_pct(passes[str(i)]) if str(i) in passes else "–"}</td>' for i in ks),
            f'<td class="num">{rates["mean_reward"]:.3f}</td>',
            f'<td class="num">{_pct(rates["mean_assertions_passed"])}</td>',
        ]
        rows.append(f'<tr data-family="{e(family)}">{"".join(cells)}</tr>')
    heads = "".join(f"<th{'' if i == 0 else NUM}>{e(h)}</th>" for i, h in enumerate(head))
    return f'<table id="families"><thead><tr>{heads}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _charts(data: ReportData) -> str:
    return (
        '<section id="charts"><h2>Distributions (scored trials)</h2><div class="charts">'
        f"{bar_chart(data.rewards, 'reward', 'chart-reward')}{bar_chart(data.turns, 'turns', 'chart-turns')}"
        "</div></section>"
    )


def bar_chart(bins: Sequence[Bin], title: str, chart_id: str, width: int = 560, height: int = 220) -> str:
    """An SVG bar chart of ``bins``: one ``rect`` per bin, its height proportional to its count
    (the tallest reaching the top), its count and range in a tooltip."""
    left, bottom, top = 36, 40, 12
    plot_w, plot_h = width - left - 8, height - bottom - top
    tallest = max((b.count for b in bins), default=0) or 1
    slot = plot_w / max(1, len(bins))
    shapes = [
        f'<line class="axis" x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}"/>',
        f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}"/>',
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{tallest}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end">0</text>',
    ]
    rotate = len(bins) > 12
    for i, b in enumerate(bins):
        h = plot_h * b.count / tallest
        x = left + i * slot + slot * 0.1
        label_x = left + (i + 0.5) * slot
        label_y = top + plot_h + 14
        shapes.append(
            f'<rect class="bar" data-count="{b.count}" x="{x:.1f}" y="{top + plot_h - h:.1f}" '
            f'width="{slot * 0.8:.1f}" height="{h:.1f}"><title>{e(b.label)}: {b.count}</title></rect>'
        )
        if b.count:
            shapes.append(
                f'<text x="{label_x:.1f}" y="{top + plot_h - h - 3:.1f}" text-anchor="middle">{b.count}</text>'
            )
        transform = f' transform="rotate(45 {label_x:.1f} {label_y})"' if rotate else ""
        anchor = "start" if rotate else "middle"
        shapes.append(f'<text x="{label_x:.1f}" y="{label_y}" text-anchor="{anchor}"{transform}>{e(b.label)}</text>')
    return (
        f'<figure id="{e(chart_id)}"><figcaption>{e(title)}</figcaption>'
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="{e(title)} histogram">{"".join(shapes)}</svg></figure>'
    )


def _table(trials: Sequence[TrialView]) -> str:
    heads = "".join(
        f'<th data-key="{key}"{NUM_SORT if numeric else ""}>{e(title)}</th>' for key, title, numeric in COLUMNS
    )
    options = "".join(f'<option value="{s}">{s}</option>' for s in ("all", *STATUSES))
    rows = "".join(_row(t) for t in trials)
    return (
        '<section id="trials-section"><h2>Trials</h2><div class="controls">'
        '<input id="q" type="search" placeholder="filter: task, trial, family, agent, error…" aria-label="filter">'
        f'<select id="status" aria-label="status">{options}</select>'
        f'<span id="shown" class="meta">{len(trials)} trials</span></div>'
        f'<table id="trials"><thead><tr>{heads}</tr></thead><tbody>{rows}</tbody></table></section>'
    )


def _row(t: TrialView) -> str:
    r = t.record
    total = int(r.get("total") or 0)
    shown = {
        "trial": f'<a href="#d{t.index}">{e(r.get("trial_id") or t.index)}</a>',
        "task": e(r.get("task")),
        "family": e(r.get("family")),
        "agent": e(r.get("agent")),
        "status": f'<span class="{t.status}">{t.status}</span>',
        "reward": f"{float(r.get('reward') or 0.0):.3f}",
        "assertions": f"{int(r.get('passed') or 0)}/{total}" if total else "–",
        "turns": e(r.get("turns") or 0),
        "error": e((r.get("error") or {}).get("kind") or ""),
        "seconds": f"{float(t.sort['seconds']):.1f}",
    }
    cells = "".join(
        f'<td data-sort="{e(t.sort[key])}"{NUM if numeric else ""}>{shown[key]}</td>' for key, _, numeric in COLUMNS
    )
    return f'<tr class="trial" data-idx="{t.index}" data-status="{t.status}" data-search="{e(t.search)}">{cells}</tr>'


def _details(trials: Sequence[TrialView]) -> str:
    return f'<section id="details"><h2>Trial details</h2>{"".join(_detail(t) for t in trials)}</section>'


def _detail(t: TrialView) -> str:
    r = t.record
    title = f"{r.get('trial_id') or t.index} · {r.get('task') or ''} · {t.status}"
    return (
        f'<details class="trial" id="d{t.index}" data-status="{t.status}"><summary>{e(title)}</summary>'
        f"{_facts(r)}{_assertions(r)}{_logs(t.logs)}{_transcript(t.transcript)}</details>"
    )


def _facts(r: Mapping[str, Any]) -> str:
    error = r.get("error") or {}
    facts: list[tuple[str, str]] = [
        ("task", str(r.get("task") or "")),
        ("agent", str(r.get("agent") or "") + (f" ({r['model']})" if r.get("model") else "")),
        ("backend", str(r.get("backend") or "")),
        ("reward", f"{float(r.get('reward') or 0.0):.3f} (scale {r.get('reward_scale', '–')})"),
        ("stop reason", str(r.get("stop_reason") or "–")),
    ]
    if error:
        facts.append(("error", f"{error.get('kind')}: {error.get('message')}"))
    if r.get("timings"):
        facts.append(("timings", " · ".join(f"{k} {float(v):.2f}s" for k, v in r["timings"].items())))
    for key in ("image", "overrides", "network", "usage", "kept"):
        if r.get(key):
            facts.append((key, json.dumps(r[key], sort_keys=True)))
    for key in ("warnings", "system_changes", "artifacts"):
        if r.get(key):
            facts.append((key.replace("_", " "), "; ".join(str(x) for x in r[key])))
    items = "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in facts)
    return f'<dl class="facts">{items}</dl>'


def _assertions(r: Mapping[str, Any]) -> str:
    assertions = r.get("assertions") or []
    if not assertions:
        return '<p class="meta">no assertions recorded</p>'
    items = "".join(
        f'<li class="{"pass" if a.get("passed") else "fail"}">{e(a.get("name"))}{_message(a)}</li>'
        for a in assertions
        if isinstance(a, Mapping)
    )
    passed = sum(bool(a.get("passed")) for a in assertions if isinstance(a, Mapping))
    return f'<h4>assertions ({passed}/{len(assertions)})</h4><ul class="assertions">{items}</ul>'


def _message(assertion: Mapping[str, Any]) -> str:
    return f" — {e(assertion['message'])}" if assertion.get("message") else ""


def clip_html(c: Clip, css: str = "") -> str:
    """A clip as a ``<pre>`` block, the cut (if any) marked between head and tail."""
    note = f'<span class="cut">… {c.cut:,} characters cut …</span>' if c.cut else ""
    attribute = f' class="{e(css)}"' if css else ""
    return f"<pre{attribute}>{e(c.head)}{note}{e(c.tail)}</pre>"


def _logs(logs: Mapping[str, Clip]) -> str:
    order = sorted(logs, key=lambda name: (name != "verifier", name != "build", name))
    return "".join(f"<h4>{e(name)} output</h4>{clip_html(logs[name], 'log-' + name)}" for name in order)


def _transcript(view: TranscriptView) -> str:
    if view.note:
        return f'<h4>transcript</h4><p class="meta transcript-note">{e(view.note)}</p>'
    parts = [
        f"<h4>transcript · {len(view.steps) + view.steps_cut} turns · stop reason {e(view.stop_reason or '–')}</h4>"
    ]
    if view.instruction and view.instruction.text:
        parts.append(f"<details><summary>instruction</summary>{clip_html(view.instruction)}</details>")
    for n, step in enumerate(view.steps):
        if view.steps_cut and n == view.cut_after:
            parts.append(f'<span class="cut">… {view.steps_cut:,} steps cut …</span>')
        parts.append(_step(step))
    return f'<div class="transcript">{"".join(parts)}</div>'


def _step(s: TurnView) -> str:
    head = [f"step {s.index}", s.kind]
    if s.exit_code is not None:
        head.append(f"exit {s.exit_code}")
    if s.duration is not None:
        head.append(f"{float(s.duration):.2f}s")
    if s.timed_out:
        head.append("timed out")
    if s.dropped_bytes:
        head.append(f"{s.dropped_bytes:,} bytes of output dropped by the sandbox")
    parts = [f'<div class="head">{e(" · ".join(head))}</div>']
    if s.reasoning:
        parts.append(f"<details><summary>reasoning</summary>{clip_html(s.reasoning)}</details>")
    if s.reply:
        parts.append(f"<div>reply</div>{clip_html(s.reply, 'reply')}")
    if s.error:
        parts.append(f'<div class="failed">{e(s.error)}</div>')
    if s.command:
        parts.append(clip_html(Clip("$ " + s.command.head, s.command.tail, s.command.cut), "command"))
    if s.output is not None and (s.output.text or s.output.cut):
        parts.append(clip_html(s.output, "output"))
    if s.observation:
        parts.append(f"<details><summary>observation</summary>{clip_html(s.observation)}</details>")
    return f'<div class="step">{"".join(parts)}</div>'
