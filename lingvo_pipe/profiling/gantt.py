"""A PNG Gantt chart: labelled bars on rows, one colour per kind of work."""

from typing import Dict, NamedTuple, Sequence

import matplotlib
matplotlib.use('Agg')  # files only; no display needed
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

_PALETTE = ('#4c72b0', '#dd8452', '#55a868', '#c44e52', '#8172b3', '#937860')


class Bar(NamedTuple):
  """Work of kind `kind` on row `row` in [start_us, end_us); `label` is
  written on the bar when it is wide enough ('' for none)."""
  row: int
  start_us: float
  end_us: float
  kind: str
  label: str


def Draw(rows: Sequence[str], bars: Sequence[Bar], path: str, title: str,
         kinds: Sequence[str] = ()) -> None:
  """Draws row r (named rows[r]) top to bottom, time in ms, a legend of kinds.

  Args:
    rows: the row names, e.g. 'cell_0\\nCPU:0'.
    bars: the bars.
    path: the PNG to write.
    title: shown above the chart.
    kinds: kinds in legend order, coloured by position (so a kind keeps its
      colour when another is absent); unlisted kinds follow as they appear.

  Raises:
    ValueError: no bars, or a bar on a row that `rows` does not name.
  """
  if not bars:
    raise ValueError('No bars to draw.')
  bad = sorted({b.row for b in bars if not 0 <= b.row < len(rows)})
  if bad:
    raise ValueError(f'Bars on rows {bad}, but only {len(rows)} rows are named.')
  colors: Dict[str, str] = {}
  for kind in kinds:
    colors.setdefault(kind, _PALETTE[len(colors) % len(_PALETTE)])
  for b in bars:
    colors.setdefault(b.kind, _PALETTE[len(colors) % len(_PALETTE)])
  end_ms = max(b.end_us for b in bars) / 1e3
  fig, ax = plt.subplots(figsize=(12, 1.2 + 0.6 * len(rows)))
  try:
    for b in bars:
      start, width = b.start_us / 1e3, (b.end_us - b.start_us) / 1e3
      ax.broken_barh([(start, width)], (b.row - 0.4, 0.8), facecolors=colors[b.kind],
                     edgecolors='white', linewidth=0.5)
      if b.label and width > end_ms / 80:
        ax.text(start + width / 2, b.row, b.label, ha='center', va='center',
                fontsize=7, color='white')
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows, fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, end_ms)
    ax.set_xlabel('time (ms)')
    ax.set_title(title, fontsize=9)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()],
              labels=list(colors), loc='upper left', bbox_to_anchor=(1.0, 1.0),
              fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
  finally:
    plt.close(fig)
