"""A PNG Gantt chart of pipeline intervals: one row per cell, bars per phase."""

from typing import Sequence

import matplotlib
matplotlib.use('Agg')  # files only; no display needed
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from lingvo_pipe.core.timeline import Interval, Phase  # pylint: disable=g-import-not-at-top

_COLORS = {Phase.FORWARD: '#4c72b0', Phase.RECOMPUTE: '#dd8452',
           Phase.BACKWARD: '#55a868'}


def Draw(intervals: Sequence[Interval], path: str, title: str) -> None:
  """Draws cell k on row k (top: cell 0), time in ms, micro-batches on the
  forward and backward bars.

  Args:
    intervals: from timeline.Intervals.
    path: the PNG to write.
    title: shown above the chart.

  Raises:
    ValueError: no intervals.
  """
  if not intervals:
    raise ValueError('No intervals to draw.')
  cells = sorted({(i.cell, i.device) for i in intervals})
  end_ms = max(i.end_us for i in intervals) / 1e3
  fig, ax = plt.subplots(figsize=(12, 1.2 + 0.6 * len(cells)))
  try:
    for i in intervals:
      start, width = i.start_us / 1e3, (i.end_us - i.start_us) / 1e3
      ax.broken_barh([(start, width)], (i.cell - 0.4, 0.8),
                     facecolors=_COLORS[i.phase], edgecolors='white', linewidth=0.5)
      if i.phase != Phase.RECOMPUTE and width > end_ms / 80:
        ax.text(start + width / 2, i.cell, str(i.micro_batch), ha='center',
                va='center', fontsize=7, color='white')
    ax.set_yticks([c for c, _ in cells])
    ax.set_yticklabels([f'cell_{c}\n{d.rsplit("/", 1)[-1]}' for c, d in cells],
                       fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, end_ms)
    ax.set_xlabel('time since the first cell call (ms)')
    ax.set_title(title, fontsize=9)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in _COLORS.values()],
              labels=[p.value for p in _COLORS], loc='upper left',
              bbox_to_anchor=(1.0, 1.0), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
  finally:
    plt.close(fig)
