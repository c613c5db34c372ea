"""Training as its own concern: config, runtime, the step, the loop, evaluation, plots.

>>> from stoker.model.train import TrainConfig, train
>>> summary = train(TrainConfig(data="data", out="runs/a", epochs=3, crop=64))  # doctest: +SKIP

=================  =============================================================================
module             owns
=================  =============================================================================
``config``         :class:`TrainConfig`, the ``--amp``/``--optimizer``/``--task`` choices, run file
                   names; imports no torch (``stoker train --help`` stays instant)
``runtime``        device, the AMP policy (:func:`resolve_amp`), DDP setup/teardown, seeds
``step``           :class:`TrainStep` (the one training step), loss, optimizer, LR schedule
``run``            :class:`~.run.Run`: one run's runtime, loaders, model + optimizer, resume, checkpoints
``loop``           :func:`train`: the epochs, log windows (loss, images/s, data wait), validation, summary
``evaluation``     :func:`evaluate`: val top-1/top-5 summed over ranks
``logs``           the console and ``RUN/console.log``, the plain step lines, ``--logger`` csv/tensorboard
``scoring``        :func:`evaluate_checkpoint`: a checkpoint's figures on any split, per class (``stoker eval``)
``plotting``       :func:`plot_metrics`: ``RUN/curves.png``
=================  =============================================================================

Checkpoints are :mod:`stoker.model.checkpoint`. Names are imported on first use, so
``stoker.model.train.config`` loads without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stoker._lazy import lazy_exports

_EXPORTS = {
    "TrainConfig": "config",
    "AMP_CHOICES": "config",
    "OPTIMIZERS": "config",
    "TASKS": "config",
    "AmpSpec": "runtime",
    "resolve_amp": "runtime",
    "resolve_device": "runtime",
    "TrainStep": "step",
    "lr_factor": "step",
    "make_optimizer": "step",
    "train": "loop",
    "evaluate": "evaluation",
    "evaluate_checkpoint": "scoring",
    "plot_metrics": "plotting",
}

__all__ = [
    "TrainConfig",
    "AMP_CHOICES",
    "OPTIMIZERS",
    "TASKS",
    "AmpSpec",
    "resolve_amp",
    "resolve_device",
    "TrainStep",
    "lr_factor",
    "make_optimizer",
    "train",
    "evaluate",
    "evaluate_checkpoint",
    "plot_metrics",
]

if TYPE_CHECKING:
    from .config import AMP_CHOICES, OPTIMIZERS, TASKS, TrainConfig
    from .evaluation import evaluate
    from .loop import train
    from .plotting import plot_metrics
    from .runtime import AmpSpec, resolve_amp, resolve_device
    from .scoring import evaluate_checkpoint
    from .step import TrainStep, lr_factor, make_optimizer


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
