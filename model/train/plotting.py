"""The curves of a run as one PNG (``stoker train --plot``; needs matplotlib)."""

from __future__ import annotations

import json
from pathlib import Path

from stoker.pipeline.fsutil import atomic_write

from .config import METRICS, PLOT


def plot_metrics(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """PNG of the curves in ``RUN/metrics.jsonl``: loss, images/s + data wait, val top-1/top-5.

    Written atomically to ``out`` (default ``RUN/curves.png``), whose path is returned.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = [json.loads(line) for line in (run_dir / METRICS).read_text().splitlines() if line.strip()]
    tr = [r for r in rows if r.get("kind") == "train"]
    va = [r for r in rows if r.get("kind") == "val"]
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    ax[0].plot([r["step"] for r in tr], [r["loss"] for r in tr], label="train loss")
    va_loss = [r for r in va if r.get("loss") is not None]  # a detector's evaluation has no loss
    if va_loss:
        ax[0].plot([r["step"] for r in va_loss], [r["loss"] for r in va_loss], "o-", label="val loss")
    ax[0].set_xlabel("step")
    ax[0].set_title("loss")
    ax[0].legend()
    ax[1].plot([r["step"] for r in tr], [r["images_per_s"] for r in tr], color="C0")
    ax[1].set_xlabel("step")
    ax[1].set_ylabel("images/s", color="C0")
    ax[1].set_title("throughput")
    tw = ax[1].twinx()
    tw.plot([r["step"] for r in tr], [100 * r["data_wait"] for r in tr], color="C3")
    tw.set_ylabel("data wait %", color="C3")
    tw.set_ylim(0, 100)
    if va and va[0].get("top1") is not None:
        ax[2].plot([r["epoch"] + 1 for r in va], [100 * r["top1"] for r in va], "o-", label="top-1")
        if va[0].get("top5") is not None:
            ax[2].plot([r["epoch"] + 1 for r in va], [100 * r["top5"] for r in va], "o-", label="top-5")
        ax[2].legend()
    ax[2].set_xlabel("epoch")
    ax[2].set_title("val accuracy %")
    fig.tight_layout()
    out = Path(out) if out else run_dir / PLOT
    with atomic_write(out, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
    return out
