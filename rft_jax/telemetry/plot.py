"""One-image summary of a run from its metrics.jsonl (see `sinks.JsonlSink`).

A 2x3 grid: reward mean (+- std band), KL, entropy, response length (mean and
max), grad norm, and eval accuracy (an SFT or DPO log: loss, accuracy, DPO implicit
rewards and log-probs or learning rate and param norm in the first four).
Train series are drawn raw (faint) with a debiased EMA on top; a panel whose
series are absent says 'no data'.
Monitor incidents are marked on every train panel (a line at the detection step,
a shaded span back to the onset, the fault class as label) and remediation
actions as dotted lines; `plot_records` draws the same grid from in-memory
records, e.g. a replayed log of another framework.

Uses the object-oriented matplotlib API with the Agg canvas (no pyplot global
state), so it is safe in headless processes, threads and notebooks.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from rft_jax.atomic_file import replacing
from rft_jax.telemetry.records import final_trajectory
from rft_jax.telemetry.sinks import read_jsonl

_RAW_ALPHA = 0.35
_MARKER_MAX_POINTS = 100
_ACTION_KINDS = ('action', 'remediation')  # JSONL kinds of remediation actions
_LABEL_MIN_GAP = 0.03  # fraction of the x data range between two labels of one fault class
_INCIDENT_COLORS = ('tab:red', 'tab:purple', 'tab:brown', 'tab:pink', 'tab:olive',
                    'tab:cyan', 'darkred', 'navy')


def ema(values: Sequence[float], weight: float = 0.6) -> list[float]:
  """TensorBoard-style debiased exponential moving average.

  s_t = w * s_{t-1} + (1 - w) * x_t, reported as s_t / (1 - w^n) where n is
  the count of finite values so far. Non-finite inputs yield NaN at their
  position and leave the running state unchanged.
  """
  out, state, count = [], 0.0, 0
  for x in values:
    if not math.isfinite(x):
      out.append(math.nan)
      continue
    state = weight * state + (1.0 - weight) * x
    count += 1
    out.append(state / (1.0 - weight ** count))
  return out


def _series(records: list[dict[str, Any]],
            key: str) -> tuple[list[int], list[float]]:
  """(steps, values) of `key` over `records`; non-finite values become NaN."""
  steps, values = [], []
  for record in records:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      continue
    value = float(value)
    steps.append(int(record['step']))
    values.append(value if math.isfinite(value) else math.nan)
  return steps, values


def _has_data(values: Sequence[float]) -> bool:
  return any(math.isfinite(v) for v in values)


def _no_data(ax, title: str) -> None:
  ax.set_title(title)
  ax.text(0.5, 0.5, 'no data', ha='center', va='center',
          transform=ax.transAxes, color='gray', fontsize=12)
  ax.set_xticks([])
  ax.set_yticks([])


def _plot_smoothed(ax, steps, values, label: str, color: str) -> None:
  """Faint raw line plus an EMA line in the same color.

  Short series get point markers so values isolated by NaN gaps stay
  visible; the EMA line skips the NaN steps instead of breaking at them.
  """
  marker = '.' if len(values) <= _MARKER_MAX_POINTS else None
  ax.plot(steps, values, color=color, alpha=_RAW_ALPHA, linewidth=1,
          marker=marker, markersize=6)
  finite = [(s, v) for s, v in zip(steps, ema(values)) if math.isfinite(v)]
  ax.plot([s for s, _ in finite], [v for _, v in finite], color=color,
          linewidth=1.8, label=label)


def _train_panel(ax, records, title: str,
                 series: Sequence[tuple[str, str]]) -> None:
  """Draws each (key, label) train series that has data, else 'no data'."""
  colors = ('tab:blue', 'tab:orange', 'tab:green')
  drawn = 0
  for key, label in series:
    steps, values = _series(records, key)
    if _has_data(values) and drawn < len(colors):
      _plot_smoothed(ax, steps, values, label, colors[drawn])
      drawn += 1
  if not drawn:
    _no_data(ax, title)
    return
  ax.set_title(title)
  ax.set_xlabel('step')
  ax.grid(alpha=0.3)
  if drawn > 1:
    ax.legend(fontsize=8)


# An SFT or DPO log has none of the RL signals: its own in the first four panels instead.
_RL_KEYS = ('reward/mean', 'kl', 'entropy', 'response/len_mean')
_SUPERVISED_PANELS = (
    ('loss', (('loss', 'loss'), ('nll_loss', 'NLL term'))),
    ('accuracy', (('token_acc', 'next token'), ('rewards/accuracies', 'chosen > rejected'))),
    ('DPO implicit reward', (('rewards/chosen', 'chosen'), ('rewards/rejected', 'rejected'),
                             ('rewards/margins', 'margin'))),
    ('log-prob', (('logps/chosen', 'chosen'), ('logps/rejected', 'rejected'))),
    ('learning rate', (('lr', 'lr'),)),
    ('param norm', (('param_norm', 'param norm'),)),
)


def supervised_panels(records) -> list[tuple[str, Sequence[tuple[str, str]]]]:
  """(title, series) of the first four SFT/DPO panels with data; [] for an RL log."""
  if any(k in r for r in records for k in _RL_KEYS):
    return []
  return [(title, series) for title, series in _SUPERVISED_PANELS
          if any(_has_data(_series(records, k)[1]) for k, _ in series)][:4]


def _reward_panel(ax, records) -> None:
  """Reward mean with a mean +- std band when the std series is present."""
  steps, mean = _series(records, 'reward/mean')
  if not _has_data(mean):
    _no_data(ax, 'reward')
    return
  std_by_step = dict(zip(*_series(records, 'reward/std')))
  if std_by_step:
    std = [std_by_step.get(s, math.nan) for s in steps]
    ax.fill_between(steps, [m - s for m, s in zip(mean, std)],
                    [m + s for m, s in zip(mean, std)],
                    color='tab:blue', alpha=0.15, linewidth=0, label='+- std')
  _plot_smoothed(ax, steps, mean, 'mean', 'tab:blue')
  ax.set_title('reward')
  ax.set_xlabel('step')
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)


def _grad_norm_panel(ax, records) -> None:
  """Grad norm; log y-axis when positive values span over two decades."""
  _train_panel(ax, records, 'grad norm', [('grad_norm', 'grad norm')])
  finite = [v for v in _series(records, 'grad_norm')[1]
            if math.isfinite(v) and v > 0]
  if finite and max(finite) / min(finite) > 100:
    ax.set_yscale('log')


def _eval_panel(ax, records) -> None:
  """Every eval key containing 'acc' (greedy, mean@k, ...) versus step."""
  keys = sorted({k for r in records for k in r if 'acc' in k})
  markers = ('o', 's', '^', 'D', 'v', 'P')
  drawn = 0
  for i, key in enumerate(keys):
    steps, values = _series(records, key)
    if not _has_data(values):
      continue
    label = key.removeprefix('eval/').removesuffix('_acc')
    ax.plot(steps, values, marker=markers[i % len(markers)], markersize=4,
            linewidth=1.2, label=label)
    drawn += 1
  if not drawn:
    _no_data(ax, 'eval accuracy')
    return
  ax.set_title('eval accuracy')
  ax.set_xlabel('step')
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)


def _incident_colors(incidents: Sequence[Mapping[str, Any]]) -> dict[str, str]:
  """A fixed color per fault class, in order of first appearance."""
  colors: dict[str, str] = {}
  for incident in incidents:
    name = str(incident.get('fault_class', 'incident'))
    if name not in colors:
      colors[name] = _INCIDENT_COLORS[len(colors) % len(_INCIDENT_COLORS)]
  return colors


def _step_value(event: Mapping[str, Any], key: str) -> float | None:
  value = event.get(key)
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return None
  value = float(value)
  return value if math.isfinite(value) else None


def _mark_events(ax, incidents: Sequence[Mapping[str, Any]],
                 remediations: Sequence[Mapping[str, Any]],
                 colors: Mapping[str, str]) -> None:
  """Marks incidents (shaded onset..step span, solid line, fault-class label) and
  remediation actions (dotted line, action label) on one panel, keeping its x-limits
  wide enough to show them."""
  label_at = ax.get_xaxis_transform()  # x in data, y in axes fraction
  # A burst of incidents of one class gets one label: the lines alone say how many.
  min_gap = _LABEL_MIN_GAP * max(ax.dataLim.width, 1.0)
  last_label: dict[str, float] = {}
  for incident in sorted(incidents, key=lambda i: _step_value(i, 'step') or 0.0):
    step = _step_value(incident, 'step')
    if step is None:
      continue
    name = str(incident.get('fault_class', 'incident'))
    color = colors[name]
    onset = _step_value(incident, 'onset_step')
    if onset is not None and onset < step:
      ax.axvspan(onset, step, color=color, alpha=0.12, linewidth=0)
    ax.axvline(step, color=color, linewidth=1.4, alpha=0.9)
    if step - last_label.get(name, -math.inf) >= min_gap:
      ax.text(step, 0.98, f' {name}', transform=label_at, rotation=90, ha='left',
              va='top', fontsize=7, color=color, clip_on=True)
      last_label[name] = step
  for action in remediations:
    step = _step_value(action, 'step')
    if step is None:
      continue
    ax.axvline(step, color='black', linestyle=':', linewidth=1.3, alpha=0.8)
    ax.text(step, 0.02, f' {action.get("action", "remediation")}', transform=label_at,
            rotation=90, ha='left', va='bottom', fontsize=7, color='black', clip_on=True)


def _events_legend(fig, colors: Mapping[str, str], remediations: bool) -> None:
  """One figure-level legend for the incident classes and remediation lines."""
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top  (0.5 s: at use)
  handles = [Line2D([], [], color=c, linewidth=1.4, label=name) for name, c in colors.items()]
  if remediations:
    handles.append(Line2D([], [], color='black', linestyle=':', label='remediation'))
  if handles:
    fig.legend(handles=handles, loc='lower center', ncols=min(len(handles), 6),
               fontsize=8, title='incidents', title_fontsize=8)


def plot_records(train: Sequence[Mapping[str, Any]], png_path: str | os.PathLike,
                 title: str = '', evals: Sequence[Mapping[str, Any]] = (),
                 incidents: Sequence[Mapping[str, Any]] = (),
                 remediations: Sequence[Mapping[str, Any]] = ()):
  """Renders the 2x3 summary grid from in-memory records to `png_path`; returns the Figure.

  Args:
    train: per-step metric dicts, each with 'step' (e.g. `monitor.formats.load_run` output,
      for replays of other frameworks' logs).
    png_path: the PNG to write (parent directories are created).
    title: figure title.
    evals: eval-result dicts, each with 'step'.
    incidents: dicts with 'step', 'fault_class' and optionally 'onset_step': a solid line at
      'step' and a shaded span from 'onset_step' on every train panel, labelled by class.
    remediations: dicts with 'step' and optionally 'action': a dotted line on every train panel.
  """
  # matplotlib takes ~0.5 s to import: only when a plot is drawn, not with the trainer.
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  train = [dict(r) for r in train]
  evals = [dict(r) for r in evals]
  # Fixed margins, not layout='constrained': that measured every tick label, ~0.6 s of a ~1 s
  # plot drawn at the end of every run.
  fig = Figure(figsize=(15, 8.5))
  FigureCanvasAgg(fig)
  axes = fig.subplots(2, 3)
  supervised = supervised_panels(train)
  if supervised:   # SFT, DPO: loss, accuracy, ...
    for ax, (name, series) in zip((axes[0, 0], axes[0, 1], axes[0, 2], axes[1, 0]),
                                  supervised + [('', ())] * (4 - len(supervised))):
      _train_panel(ax, train, name, series)
  else:
    _reward_panel(axes[0, 0], train)
    _train_panel(axes[0, 1], train, 'KL', [('kl', 'kl')])
    _train_panel(axes[0, 2], train, 'entropy', [('entropy', 'entropy')])
    _train_panel(axes[1, 0], train, 'response length',
                 [('response/len_mean', 'mean'), ('response/len_max', 'max')])
  _grad_norm_panel(axes[1, 1], train)
  _eval_panel(axes[1, 2], evals)

  if incidents or remediations:
    colors = _incident_colors(incidents)
    for ax in (axes[0, 0], axes[0, 1], axes[0, 2], axes[1, 0], axes[1, 1]):
      if ax.has_data():  # panels that say 'no data' stay blank
        _mark_events(ax, incidents, remediations, colors)
    _events_legend(fig, colors, bool(remediations))

  fig.suptitle(title)
  fig.subplots_adjust(left=0.045, right=0.99, top=0.925, bottom=0.13 if fig.legends else 0.07,
                      wspace=0.17, hspace=0.3)
  png_path = os.fspath(png_path)
  os.makedirs(os.path.dirname(os.path.abspath(png_path)), exist_ok=True)
  with replacing(png_path) as tmp:   # a full disk leaves the earlier plot whole
    fig.savefig(tmp, dpi=110, format='png')
  return fig


def plot_run(jsonl_path: str | os.PathLike, png_path: str | os.PathLike,
             title: str = '', incidents: Sequence[Mapping[str, Any]] = (),
             remediations: Sequence[Mapping[str, Any]] = ()) -> None:
  """Renders the 2x3 summary grid of a run's metrics.jsonl to `png_path`.

  Train and eval records are those of the final trajectory (`records.final_trajectory`: steps
  abandoned by a remediation rewind are left out). Records of kind 'incident' and of kind
  'action' (remediation actions; 'remediation' is accepted too) in the JSONL, as the trainer
  writes them, all of them, are marked on the train panels together with any passed in
  `incidents` / `remediations` (see `plot_records`).

  Args:
    jsonl_path: a file written by `JsonlSink`.
    png_path: the PNG to write (parent directories are created).
    title: figure title; defaults to the JSONL file's directory name.
    incidents: extra incident dicts (e.g. from an offline replay).
    remediations: extra remediation-action dicts.
  """
  records = read_jsonl(jsonl_path)
  if not title:
    title = os.path.basename(os.path.dirname(os.path.abspath(jsonl_path)))
  final = final_trajectory(records)
  plot_records(
      [r for r in final if r.get('kind') == 'train'], png_path, title=title,
      evals=[r for r in final if r.get('kind') == 'eval'],
      incidents=[r for r in records if r.get('kind') == 'incident'] + list(incidents),
      remediations=[r for r in records if r.get('kind') in _ACTION_KINDS] + list(remediations))
