"""What a run tells, and where: the console, its copy in the run folder, and the metrics sinks.

* :class:`Console`: rank 0's ``stoker train: ...`` lines on stderr (above a progress bar) and a
  copy of each in ``RUN/console.log`` (lines said before the run folder exists are kept until it
  does).
* :func:`step_line`: the plain line a log window ends with where no progress bar shows (output
  redirected to a file, Slurm, nohup; or ``--no-progress``): epoch and step, loss, images/s,
  data wait, learning rate and ETA, so a log file tells how the run goes.
* :class:`MetricSinks`: every metrics row goes to ``RUN/metrics.jsonl``, and with ``--logger`` to
  ``RUN/metrics.csv`` and TensorBoard event files in ``RUN/`` (``pip install 'stoker[tensorboard]'``).
"""

from __future__ import annotations

import csv
import datetime
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from stoker.errors import MissingExtraError
from stoker.pipeline.fsutil import atomic_write

from .config import CONSOLE, METRICS, METRICS_CSV

#: a row's bookkeeping keys: the x axis or the row's kind, never a curve of its own
_NOT_SCALARS = ("kind", "epoch", "step", "time")


def shows_progress_bar(progress: bool, stream: TextIO | None = None) -> bool:
    """Does tqdm draw its bar (``progress`` asked for, and the stream a terminal)? Where it does
    not, each log window ends with a :func:`step_line`."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(progress and isatty is not None and isatty())


def step_line(
    *,
    epoch: int,
    epochs: int,
    step: int,
    total: int,
    loss: float,
    images_per_s: float,
    data_wait: float,
    lr: float,
    eta_s: float,
) -> str:
    """``epoch 1/5 step 40/600: loss 1.7921, 812 img/s, data wait 3%, lr 0.0125, ETA 0:03:41``."""
    eta = str(datetime.timedelta(seconds=round(max(0.0, eta_s))))
    return (
        f"epoch {epoch + 1}/{epochs} step {step}/{total}: loss {loss:.4f}, {images_per_s:.0f} img/s, "
        f"data wait {100 * data_wait:.0f}%, lr {lr:.4g}, ETA {eta}"
    )


class Console:
    """``stoker train: MSG`` on stderr (through tqdm, so a bar stays intact) and in ``console.log``.

    ``enabled=False`` (a rank other than 0) says nothing. Lines said before :meth:`open` wait in
    memory and are written first when the run folder exists.
    """

    def __init__(self, *, enabled: bool = True, prefix: str = "stoker train: ") -> None:
        self.enabled, self.prefix = enabled, prefix
        self._pending: list[str] = []
        self._file: TextIO | None = None

    def __call__(self, msg: str) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        line = f"{self.prefix}{msg}"
        tqdm.write(line, file=sys.stderr)
        self._keep(line)

    def _keep(self, line: str) -> None:
        if self._file is None:
            self._pending.append(line)
        else:
            self._file.write(line + "\n")
            self._file.flush()

    def open(self, run_dir: Path) -> None:
        """Start the copy in ``run_dir/console.log`` (appended to: a resumed run adds to it)."""
        if self.enabled and self._file is None:
            self._file = open(Path(run_dir) / CONSOLE, "a")
            for line in self._pending:
                self._file.write(line + "\n")
            self._file.flush()
            self._pending.clear()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def append_console(run_dir: str | Path, text: str) -> None:
    """Add ``text`` (the run's summary, printed on stdout) to ``run_dir/console.log``."""
    path = Path(run_dir) / CONSOLE
    if path.parent.is_dir():
        with open(path, "a") as f:
            f.write(text.rstrip("\n") + "\n")


def check_loggers(loggers: Iterable[str]) -> None:
    """Refuse, before any I/O, a ``--logger`` whose package is not installed (one line naming the extra)."""
    if "tensorboard" in loggers:
        try:
            import tensorboard  # noqa: F401
        except ImportError:
            raise MissingExtraError(
                "--logger tensorboard needs the tensorboard package: pip install 'stoker[tensorboard]'"
            ) from None


class _CsvSink:
    """``metrics.csv``: one row per metrics row; a key seen for the first time (the first val row)
    rewrites the file with the wider header (as Lightning's CSVLogger does), so every row's
    columns line up in one table."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fields: list[str] = []
        if path.exists():  # a resumed run: keep its rows and columns
            with open(path, newline="") as f:
                self.fields = list(csv.DictReader(f).fieldnames or [])

    def write(self, row: dict[str, Any]) -> None:
        new = [k for k in row if k not in self.fields]
        if new:
            self._rewrite(self.fields + new)
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, self.fields, restval="").writerow(row)

    def _rewrite(self, fields: list[str]) -> None:
        rows = []
        if self.path.exists():
            with open(self.path, newline="") as f:
                rows = list(csv.DictReader(f))
        with atomic_write(self.path, "w") as f:
            writer = csv.DictWriter(f, fields, restval="")
            writer.writeheader()
            writer.writerows(rows)
        self.fields = fields

    def close(self) -> None:
        pass


class _TensorBoardSink:
    """TensorBoard event files in the run folder: ``train/loss``, ``val/top1``, ... by step."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir), flush_secs=30)  # a watched run shows within 30 s

    def write(self, row: dict[str, Any]) -> None:
        for key, value in row.items():
            if key not in _NOT_SCALARS and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"{row.get('kind', 'run')}/{key}", value, global_step=row.get("step"))

    def close(self) -> None:
        self.writer.close()


class MetricSinks:
    """Where each metrics row goes: ``metrics.jsonl``, and the ``loggers`` (``csv``, ``tensorboard``)."""

    def __init__(self, run_dir: Path, loggers: Iterable[str] = ()) -> None:
        self.jsonl = Path(run_dir) / METRICS
        loggers = tuple(loggers)
        self.sinks: list[Any] = []
        if "csv" in loggers:
            self.sinks.append(_CsvSink(Path(run_dir) / METRICS_CSV))
        if "tensorboard" in loggers:
            self.sinks.append(_TensorBoardSink(Path(run_dir)))

    def write(self, row: dict[str, Any]) -> None:
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")
        for sink in self.sinks:
            sink.write(row)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


__all__ = ["Console", "MetricSinks", "append_console", "check_loggers", "shows_progress_bar", "step_line"]
