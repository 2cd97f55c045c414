"""Optional plot (matplotlib; ``pip install 'ple-harness[plot]'``): decode throughput and median TTFT
per phase along the concurrency ladder, phases with mismatches or failures marked."""
from __future__ import annotations

from pathlib import Path

from .errors import UsageError
from .files import make_private
from .manifest import Manifest


def plot_run(m: Manifest, out: Path) -> Path:
    """Write a PNG of the run's load phases to ``out``. Raises UsageError without matplotlib."""
    try:
        import matplotlib  # lazy: optional matplotlib, only for --plot
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # lazy: optional matplotlib, only for --plot
    except ImportError:
        raise UsageError("plotting needs matplotlib: pip install 'ple-harness[plot]'") from None
    phases = [p for p in m.phases if p.role == "load" and p.decode_tok_per_s is not None]
    if not phases:
        raise UsageError(f"run {m.run_id} has no load phase to plot")
    x = list(range(len(phases)))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8, len(phases) * 0.45), 6), sharex=True)
    ax1.plot(x, [p.decode_tok_per_s for p in phases], marker="o")
    ax1.set_ylabel("decode tok/s")
    ax2.plot(x, [p.ttft_s_median or 0 for p in phases], marker="o", color="tab:orange")
    ax2.set_ylabel("median TTFT (s)")
    bad = [i for i, p in enumerate(phases) if p.status == "fail" or p.mismatched]
    for ax in (ax1, ax2):
        for i in bad:
            ax.axvline(i, color="red", alpha=0.3, linewidth=6)
    ax2.set_xticks(x)
    ax2.set_xticklabels([f"{p.name}\nC{p.concurrency}" for p in phases], rotation=90, fontsize=7)
    ax1.set_title(f"{m.run_id}: {m.summary.headline or ''}"[:110], fontsize=9)
    fig.tight_layout()
    out = Path(out)
    if out.suffix.lower() != ".png":
        out = out.with_name(out.name + ".png")
    try:
        fig.savefig(out, dpi=100)
        make_private(out)
    except OSError as exc:
        plt.close(fig)
        raise UsageError(f"cannot write the plot {out}: {exc}") from None
    plt.close(fig)
    return out
