"""The tuner's picture: every candidate's predicted step against its
predicted peak, the budget drawn (unless it is beyond twice the largest
peak), the verified ones and the pick marked."""

from typing import Optional, Sequence

import matplotlib
matplotlib.use('Agg')  # files only; no display needed
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from lingvo_pipe.planning import candidates  # pylint: disable=g-import-not-at-top

_MIB = 2.0**20


def Draw(rows: Sequence[candidates.Row], budget_bytes: int, path: str, title: str,
         pick: Optional[candidates.Row] = None) -> None:
  """Writes the PNG `path`: a point per row (peak MiB, step ms), grey where
  it does not fit, the verified rows' measured steps joined to their
  predictions, the budget a vertical line and the pick a star."""
  if not rows:
    raise ValueError('No candidates to draw.')
  fig, ax = plt.subplots(figsize=(8, 5))
  for fits, colour, label in ((True, '#4c72b0', 'fits'), (False, '#b0b0b0', 'does not fit')):
    chosen = [r for r in rows if r.fits == fits]
    if chosen:
      ax.scatter([r.peak_bytes / _MIB for r in chosen],
                 [r.predicted.seconds * 1e3 for r in chosen], s=14, c=colour, label=label)
  verified = [(r, r.measured_s) for r in rows if r.measured_s is not None]
  for r, measured in verified:
    ax.plot([r.peak_bytes / _MIB] * 2, [r.predicted.seconds * 1e3, measured * 1e3],
            c='#dd8452', lw=1)
  if verified:
    ax.scatter([r.peak_bytes / _MIB for r, _ in verified], [m * 1e3 for _, m in verified],
               s=30, c='#dd8452', marker='D', label='measured (verified)')
  if pick is not None and pick.measured_s is not None:
    ax.scatter([pick.peak_bytes / _MIB], [pick.measured_s * 1e3], s=220, marker='*',
               c='#c44e52', label=f'pick: {pick.candidate}', zorder=3)
  if budget_bytes <= 2 * max(r.peak_bytes for r in rows):  # else it would squash the points
    ax.axvline(budget_bytes / _MIB, c='#c44e52', ls='--', lw=1, label='budget per device')
  ax.set_xlabel('predicted peak per device (MiB)')
  ax.set_ylabel('step (ms)')
  ax.set_title(title)
  ax.legend(fontsize=8, loc='upper right')
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
