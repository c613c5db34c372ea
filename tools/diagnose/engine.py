"""The engine of ``stoker diagnose``: measure a loader and a model apart and together.

:func:`run_diagnosis` takes any loader and any ``nn.Module`` (no paths, no flags), runs the
measurements of :mod:`stoker.tools.diagnose.measure` and hands the figures to
:mod:`stoker.tools.diagnose.report` for the verdict and the ranked next steps
(:mod:`stoker.tools.diagnose.text` writes them out).

The figures the verdict needs (the loader, its alternatives, the model in fp32, end to end)
are always measured; the model's variants (AMP, channels_last, twice the batch, AMP with
channels_last) follow, best first, each only while the run stays within its time budget
(:data:`BUDGET` x ``seconds``), so the defaults take about a minute whatever the model.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable

from stoker.errors import ArgumentError, DiagnoseError

#: The run's time budget, in multiples of ``seconds``: the model's variants are measured while they fit in it.
BUDGET = 12


def slow_step_s(seconds: float) -> float:
    """The model step above which the promise of :func:`time_plan` does not hold: a figure's
    :data:`~.timing.MIN_STEPS` steps no longer fit in its :data:`~.timing.CAP` x ``seconds``."""
    from .timing import CAP, MIN_STEPS

    return CAP * seconds / MIN_STEPS


def time_plan(seconds: float, *, packed_sample: int = 0) -> str:
    """The line said before anything is measured: about how long the run takes. Its budget
    (:data:`BUDGET` x ``seconds``) holds the figures the verdict needs and the model's variants that
    fit; a model slower than :func:`slow_step_s` a step goes past it (said again once its step is
    timed: :func:`slow_model_line`), as do many loader alternatives. An ImageFolder's sample is
    packed first (``packed_sample`` images)."""
    line = f"this takes about {BUDGET * seconds:.0f} s ({BUDGET} x {seconds:g} s of measurements"
    line += f"; first {packed_sample} images are packed to measure stoker on them" if packed_sample else ""
    return line + f"; longer for a model slower than {slow_step_s(seconds):.2g} s a step, said once it is timed)"


def settle_seconds(step_s: float) -> float:
    """The ``--seconds`` at which a step of ``step_s`` gets its :data:`~.timing.MIN_STEPS` timed
    steps (by :data:`~.timing.CAP` x ``seconds``), rounded up to a number worth typing."""
    import math

    from .timing import CAP, MIN_STEPS

    need = MIN_STEPS * step_s / CAP
    return float(math.ceil(need)) if need >= 1 else math.ceil(need * 10) / 10


def slow_model_line(
    fp32: dict, *, seconds: float, warm: int, elapsed: float, budget: float, device, batch_size: int = 64
) -> str:
    """What a slow model does to the run, once its fp32 step is timed (``""`` for one that keeps
    the promise of :func:`time_plan`): the run's real length, from the step's time (the end-to-end
    figure still to come takes as many warm-up and timed steps, the bus a second or two), and, where
    its figures get too few steps to advise on, the ``--seconds`` that settles them."""
    from .timing import CAP, MIN_STEPS

    step = fp32["step_ms"] / 1000
    if step <= slow_step_s(seconds):
        return ""
    timed = max(seconds, step * MIN_STEPS) if step * MIN_STEPS <= CAP * seconds else max(seconds, step)
    total = elapsed + warm * step + timed + min(seconds, 2.0)
    line = f"the model takes {step:.1f} s a step on {device}: this run takes about {total:.0f} s"
    line += f", past the {budget:.0f} s said" if total > budget else ""
    if fp32.get("trust") == "few":
        need = settle_seconds(step)
        line += (
            f"; {fp32['steps']} timed step(s) a figure are too few to advise on ({MIN_STEPS} needed): "
            f"--seconds {need:g} settles them (about {BUDGET * need + warm * step:.0f} s)"
        )
        line += ", or a smaller --batch-size" if batch_size > 2 else ""  # 2: the least a BatchNorm trains on
    return line


def resolve_amp(amp: str, device) -> tuple[str | None, str]:
    """``(dtype or None, why)`` for the AMP measurement on ``device``: the training runtime's
    policy (:func:`stoker.model.train.runtime.resolve_amp`), so ``auto`` measures what
    ``stoker train --amp auto`` would train with."""
    import torch

    from stoker.model.train.runtime import resolve_amp as policy

    spec = policy(amp, device)
    if amp == "auto" and not spec.enabled and torch.device(device).type == "cpu":
        return None, f"skipped: {spec.why}; --amp bf16 measures it anyway"
    return (spec.name if spec.enabled else None), spec.why


def has_conv(model) -> bool:
    """True when ``model`` has a 2-D or 3-D convolution (channels_last can pay off)."""
    from torch import nn

    return any(isinstance(m, (nn.Conv2d, nn.Conv3d)) for m in model.modules())


def run_diagnosis(
    loader: Iterable,
    model,
    *,
    batch_size: int,
    crop,
    device="cpu",
    seconds: float = 5.0,
    amp: str = "auto",
    channels_last: str = "auto",
    warmup_batches: int = 2,
    data: dict | None = None,
    alternatives: list | None = None,
    budget_s: float | None = None,
    progress: Callable[[str], None] | None = None,
    task=None,
    fit=None,
    started: float | None = None,
) -> dict:
    """Measure ``loader`` and ``model`` separately and together; return the report dict.

    Args:
        loader: Yields ``(images, labels)``: uint8 NCHW (stoker's Loader) or normalized float
            (a torchvision pipeline), on the host or on ``device``.
        model: The network (taking normalized float input); measured in place, so pass a
            model you do not mind being trained a few steps.
        batch_size: The loader's batch size (the synthetic model batch uses the same).
        crop: Image side of the batches, or ``(height, width)``.
        device: Where the model runs.
        seconds: Least time of each measurement; each also takes at least
            :data:`~stoker.tools.diagnose.measure.MIN_STEPS` steps, up to
            :data:`~stoker.tools.diagnose.measure.CAP` x ``seconds``.
        amp: ``"auto"``, ``"bf16"``, ``"fp16"`` or ``"off"``: which autocast to measure
            (``auto``: what ``stoker train --amp auto`` would use on ``device``).
        channels_last: ``"auto"`` (measure when the model has convolutions), ``"on"``, ``"off"``.
        warmup_batches: Batches/steps excluded from every timing (fewer once they took ``seconds``).
        data: Facts about DATA shown in the report (kind, path, loader settings); a
            ``"loader_hints"`` list of dicts (id, title, action, est_loader_speedup, basis)
            adds estimated loader-side steps.
        alternatives: Other loaders to measure as loader-side next steps: dicts with ``id``,
            ``title``, ``action`` and ``loader`` (e.g. stoker's Loader on a packed subset).
        budget_s: Time the run may take before the model's variants are skipped
            (None: :data:`BUDGET` x ``seconds``); the verdict's figures are always measured.
        progress: Called with a line before each measurement.
        task: What the model learns (:class:`stoker.model.train.tasks.Task`: its loss and the
            synthetic targets of the model-alone figures); ``None``: class labels.
        fit: How ``batch_size`` was sized (:class:`~stoker.tools.diagnose.sizing.BatchFit`): the
            2x batch variant is measured only where it fits the memory; reported in ``settings``.
        started: ``time.perf_counter()`` when the caller's run began (the model built, the batch
            sized before this call): what a slow model's line counts the run's length from.

    Returns:
        A JSON-ready dict: ``environment``, ``settings``, ``data``, ``loader``, ``model``,
        ``end_to_end``, ``transfer``, ``audit``, ``verdict``, ``next_steps``, ``not_helping``.
        Every measured figure carries ``trust`` (``ok``, ``few``, ``noisy``) and its spread;
        advice rests only on trusted figures (see :func:`~stoker.tools.diagnose.report.next_steps`).
    """
    import torch

    from stoker.model.audit import audit_model
    from stoker.model.train.runtime import resolve_amp as train_amp
    from stoker.version import __version__

    from .measure import environment
    from .report import caveats_of, judge, next_steps

    h, w = _check_arguments(batch_size, crop, seconds, amp, channels_last)
    say = progress or (lambda line: None)
    device = torch.device(device)
    budget = BUDGET * seconds if budget_s is None else budget_s
    deadline = time.perf_counter() + budget
    env = environment()

    say("auditing the model's parameters and FLOPs")
    audit = audit_model(model, input_size=(3, h, w))
    loader_r, alt_r = _measure_loaders(loader, alternatives, seconds=seconds, warmup_batches=warmup_batches, say=say)

    amp_dtype, amp_why = resolve_amp(amp, device)
    cl, cl_why = _channels_last_choice(channels_last, model, loader_r=loader_r, size=(h, w))
    bench = _ModelBench(model, crop=crop, device=device, seconds=seconds, task=task, say=say)
    fp32 = _measure_fp32(bench, batch_size, warmup_batches)
    since = deadline - budget if started is None else started
    warm = _after_fp32(
        fp32, seconds, warmup_batches, since=since, budget=budget, device=device, batch=batch_size, say=say
    )
    e2e, transfer = _measure_end_to_end_and_transfer(loader, model, loader_r, device, seconds, warm, task, say)

    stages = _stages(loader_r, fp32, transfer)
    caveats = caveats_of(loader_r, fp32, transfer)
    verdict = judge(stages, e2e, caveats=caveats)

    variants = _model_variants(amp_dtype, cl, verdict["bound"], fit, batch_size, device)
    _measure_variants(bench, variants, fp32, batch_size, warm, deadline=deadline, budget=budget, budget_s=budget_s)
    model_r = _with_whys(bench.results, amp_why=amp_why, cl_why=cl_why)

    steps, not_helping = next_steps(
        stages,
        model_r,
        transfer,
        audit,
        batch_size,
        device,
        amp_dtype,
        alt_r,
        (data or {}).get("loader_hints", []),
        caveats=caveats,
        auto_amp=train_amp("auto", device).name,
    )
    data_out = {k: v for k, v in (data or {}).items() if k != "loader_hints"}
    return {
        "stoker_version": __version__,
        "environment": env,
        "settings": _settings(
            batch_size=batch_size,
            crop=crop if isinstance(crop, int) else f"{h}x{w}",
            device=device,
            seconds=seconds,
            budget=budget,
            fp32=fp32,
            amp=amp,
            amp_measured=amp_dtype,
            channels_last=channels_last,
            warmup_batches=warmup_batches,
            fit=fit,
        ),
        "data": data_out,
        "loader": loader_r,
        "loader_alternatives": alt_r,
        "model": model_r,
        "end_to_end": e2e,
        "transfer": transfer,
        "audit": audit.to_dict(top=10) | {"heaviest": [vars(la) for la in audit.heaviest(5)]},
        "verdict": verdict,
        "next_steps": steps,
        "not_helping": not_helping,
    }


def _after_fp32(
    fp32: dict, seconds: float, warmup_batches: int, *, since: float, budget: float, device, batch: int, say
) -> int:
    """The warm-up steps of the figures still to come, once the model's fp32 step is timed (a step
    that outlasts ``seconds``: one is plenty, and saves minutes); a slow model's line said."""
    warm = 1 if fp32["step_ms"] > 1000 * seconds else warmup_batches
    elapsed = time.perf_counter() - since
    line = slow_model_line(
        fp32, seconds=seconds, warm=warm, elapsed=elapsed, budget=budget, device=device, batch_size=batch
    )
    if line:
        say(line)
    return warm


def _settings(*, batch_size: int, crop, device, seconds: float, budget: float, fp32: dict, fit, **asked) -> dict:
    """The report's ``settings``: what was measured how (``asked``: the AMP and channels_last
    choices, the warm-up), and the ``--seconds`` that would settle a slow model's figures."""
    from .timing import CAP, MIN_STEPS

    return {
        "batch_size": batch_size,
        "crop": crop,
        "device": str(device),
        "seconds": seconds,
        "min_steps": MIN_STEPS,
        "max_seconds": CAP * seconds,
        "budget_s": budget,
        # the --seconds at which the model's figures get their MIN_STEPS (None: they do at this one)
        "settle_seconds": settle_seconds(fp32["step_ms"] / 1000) if fp32.get("trust") == "few" else None,
        **asked,
        "batch_fit": fit.to_dict() if fit is not None else None,
    }


def _channels_last_choice(channels_last: str, model, *, loader_r: dict, size: tuple[int, int]) -> tuple[bool, str]:
    """``(measure channels_last?, why)`` for the ``channels_last`` argument and ``model``; a model
    whose forward cannot take channels_last (a ``.view`` flatten) is measured as it is, never in it
    (probed on the loader's channels)."""
    from stoker.model.user import channels_last_refusal

    shape = loader_r.get("batch_shape") or []
    in_channels = shape[1] if len(shape) == 4 else 3
    cl = channels_last == "on" or (channels_last == "auto" and has_conv(model))
    cl_why = {"on": "--channels-last on", "off": "--channels-last off"}.get(
        channels_last, "model has convolutions" if cl else "not measured: no convolutions in the model"
    )
    refusal = channels_last_refusal(model, in_channels=in_channels, size=size, name="the model") if cl else ""
    if refusal:
        return False, f"not measured: {refusal}; .reshape() or torch.flatten() in the forward lets it be measured"
    return cl, cl_why


def _check_arguments(batch_size: int, crop, seconds: float, amp: str, channels_last: str) -> tuple[int, int]:
    """The crop's ``(height, width)``, once every argument is checked (one-line ArgumentError each)."""
    from .measure import hw_of

    if batch_size < 1:
        raise ArgumentError(f"batch_size={batch_size} must be >= 1")
    h, w = hw_of(crop)
    if min(h, w) < 1:
        raise ArgumentError(f"crop={crop} must be >= 1")
    if seconds <= 0:
        raise ArgumentError(f"seconds={seconds} must be > 0")
    if amp not in ("auto", "bf16", "fp16", "off"):
        raise ArgumentError(f"amp={amp!r} must be 'auto', 'bf16', 'fp16' or 'off'")
    if channels_last not in ("auto", "on", "off"):
        raise ArgumentError(f"channels_last={channels_last!r} must be 'auto', 'on' or 'off'")
    return h, w


def _measure_loaders(
    loader: Iterable, alternatives: list | None, *, seconds: float, warmup_batches: int, say: Callable[[str], None]
) -> tuple[dict, list]:
    """``(the loader's figures, each alternative's dict with its figures as "result")``."""
    from .measure import measure_loader
    from .timing import MIN_STEPS

    say(f"loader alone (at least {seconds:g} s and {MIN_STEPS} batches)")
    loader_r = measure_loader(loader, seconds=seconds, warmup_batches=warmup_batches)
    # Alternatives right after, so the loader figures compare side by side in time.
    alt_r = []
    for alt in alternatives or []:
        say(f"loader: {alt['title']}")
        r = measure_loader(alt["loader"], seconds=seconds, warmup_batches=warmup_batches)
        alt_r.append({k: v for k, v in alt.items() if k != "loader"} | {"result": r})
    return loader_r, alt_r


@dataclasses.dataclass
class _ModelBench:
    """Measures the model alone in one setting after another, keeping each figure in ``results``."""

    model: object
    crop: object
    device: object
    seconds: float
    task: object
    say: Callable[[str], None]
    results: dict = dataclasses.field(default_factory=dict)

    def measure(self, key: str, amp: str | None = None, channels_last: bool = False, *, batch: int, warm: int) -> dict:
        """Measure one setting, keep its figures under ``key`` and return them."""
        from .measure import measure_model_alone

        self.say(f"model alone, {amp or 'fp32'}{' channels_last' if channels_last else ''}, batch {batch}")
        self.results[key] = measure_model_alone(
            self.model,
            batch_size=batch,
            crop=self.crop,
            device=self.device,
            amp=amp,
            channels_last=channels_last,
            seconds=self.seconds,
            warmup=warm,
            task=self.task,
        )
        return self.results[key]


def _measure_fp32(bench: _ModelBench, batch_size: int, warmup_batches: int) -> dict:
    """The model alone in fp32, the figure the verdict needs; DiagnoseError when it does not train."""
    fp32 = bench.measure("fp32", batch=batch_size, warm=warmup_batches)
    if fp32.get("images_per_s") is None:
        raise DiagnoseError(
            f"the model does not train at batch {batch_size} on {bench.device}: {fp32.get('error')}; "
            "try a smaller batch size"
        )
    return fp32


def _measure_end_to_end_and_transfer(loader, model, loader_r: dict, device, seconds: float, warm: int, task, say):
    """``(end-to-end figures, transfer figures)``: the loader feeding the model, then the bus alone."""
    import torch

    from .measure import measure_end_to_end, measure_transfer

    say("end to end, loader + model")
    e2e = measure_end_to_end(loader, model, device=device, seconds=seconds, warmup_batches=warm, task=task)

    batch_dev = torch.device(loader_r["device"])
    transfer = measure_transfer(loader_r["batch_shape"], device=device, seconds=min(seconds, 2.0))
    # The bus is a stage only when batches are made on the host and trained on the GPU.
    transfer["applies"] = bool(transfer["applies"] and batch_dev.type != device.type)
    transfer["loader_dtype"] = loader_r["dtype"]
    transfer["loader_device"] = loader_r["device"]
    return e2e, transfer


def _stages(loader_r: dict, fp32: dict, transfer: dict) -> dict:
    """Images per second of each stage of training: the loader, the model and (where it applies) the bus."""
    stages = {"loader": loader_r["images_per_s"], "model": fp32["images_per_s"]}
    if transfer["applies"]:
        key = "uint8_images_per_s" if loader_r["dtype"] == "uint8" else "float32_images_per_s"
        stages["transfer"] = transfer[key]
    return stages


def _model_variants(amp_dtype: str | None, cl: bool, bound: str, fit, batch_size: int, device) -> list[tuple]:
    """The model's variants worth measuring, most telling first: ``(key, amp, channels_last, batch)`` each."""
    variants = []
    if amp_dtype:
        variants.append(("amp", amp_dtype, False, batch_size))
    if cl:
        variants.append(("channels_last", None, True, batch_size))
    # A bigger batch is worth measuring only when the model is what bounds training.
    if bound == "model" and (fit is None or fit.fits(2 * batch_size, device)):
        variants.append(("fp32_batch_x2", None, False, 2 * batch_size))
    if amp_dtype and cl:
        variants.append(("amp_channels_last", amp_dtype, True, batch_size))
    return variants


def _measure_variants(
    bench: _ModelBench,
    variants: list[tuple],
    fp32: dict,
    batch_size: int,
    warm: int,
    *,
    deadline: float,
    budget: float,
    budget_s: float | None,
) -> None:
    """Measure ``variants`` while the run's ``budget`` lasts; each one that would pass ``deadline``
    gets why it was not measured instead (``budget_s``: the caller's budget, None for the default)."""
    from .timing import CAP, MIN_STEPS

    # Each costs its warm-up and its timed steps; estimated from the fp32 step (a variant may well be faster).
    step_s = fp32["step_ms"] / 1000
    for key, a, c, batch in variants:
        s = step_s * batch / batch_size
        timed = max(bench.seconds, s * MIN_STEPS) if s * MIN_STEPS <= CAP * bench.seconds else max(bench.seconds, s)
        cost = warm * s + timed
        left = deadline - time.perf_counter()
        if cost > left:
            of = f", {BUDGET}x --seconds" if budget_s is None else ""
            bench.results[key] = {
                "applies": False,
                "why": f"not measured: about {cost:.{0 if cost >= 10 else 1}f} s more would pass the run's "
                f"time budget ({budget:g} s{of}); a longer --seconds measures it",
            }
            continue
        bench.measure(key, a, c, batch=batch, warm=warm)


def _with_whys(model_r: dict, *, amp_why: str, cl_why: str) -> dict:
    """``model_r`` with the AMP and channels_last figures saying why they were (not) measured."""
    model_r.setdefault("amp", {"applies": False, "why": amp_why})
    model_r["amp"].setdefault("why", amp_why)
    model_r.setdefault("channels_last", {"applies": False, "why": cl_why})
    model_r["channels_last"].setdefault("why", cl_why)
    return model_r
