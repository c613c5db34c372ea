"""Tell why training is slow, with numbers: loader-bound, model-bound or transfer-bound.

Measures, in one run and each for --seconds: the loader alone; the model alone
(forward+backward+step on a synthetic batch already on the device) in fp32, with AMP
and with channels_last where they apply; the two together end to end, with the
fraction of time spent waiting for data; the bytes each batch sends to the device
(uint8 vs float32); and a parameter/FLOP audit of the model that flags a layer holding
most of the parameters. Then a verdict with the ratio behind it, and the next steps
ranked by the speed-up they would bring, each with the command or code change.

DATA is stoker shards (a split folder with stoker.json, or a `stoker pack` OUT with
train/) or an ImageFolder; for an ImageFolder it measures the torchvision pipeline you
have now, and what `stoker pack` would give (a small subset is packed into a temporary
folder and measured).

examples:
  stoker diagnose out/ --arch resnet50 --batch-size 128
  stoker diagnose ~/data/imagenet --model my_project.nets:build --seconds 10
  stoker diagnose out/train --model train.py:make_net --json > diagnosis.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Optional

from stoker.pipeline.deps import usable_cores

from .errors import StokerError, UsageError
from .sanitize import IMAGE_EXTS

HELP = "measure loader, model, transfer and end to end; say what bounds training and what to change"

# Within this factor the two slowest stages are "balanced": speeding up one alone gains little.
BALANCED = 1.15


# ----------------------------------------------------------------------------- the core

class DiagnoseError(StokerError):
    """The measurement cannot go on (e.g. the model does not fit at this batch size)."""


def _resolve_amp(amp: str, device) -> tuple[Optional[str], str]:
    """``(dtype or None, why)`` for the AMP measurement on ``device``."""
    from .diagnose_measure import cpu_bf16

    import torch

    dev = torch.device(device)
    if amp == "off":
        return None, "--amp off"
    if amp in ("bf16", "fp16"):
        return amp, f"--amp {amp}"
    if dev.type == "cuda":
        return ("bf16", "GPU supports bf16") if torch.cuda.is_bf16_supported() else ("fp16", "GPU lacks bf16")
    if dev.type == "cpu" and cpu_bf16():
        return "bf16", "CPU has native bf16"
    return None, "skipped: no native bf16 on this CPU (AVX512-BF16/AMX); --amp bf16 measures it anyway"


def _has_conv(model) -> bool:
    from torch import nn

    return any(isinstance(m, (nn.Conv2d, nn.Conv3d)) for m in model.modules())


def _rate(r: Optional[dict]) -> Optional[float]:
    return r.get("images_per_s") if r else None


def run_diagnosis(loader: Iterable, model, *, batch_size: int, crop: int, device="cpu", seconds: float = 5.0,
                  amp: str = "auto", channels_last: str = "auto", warmup_batches: int = 2,
                  data: Optional[dict] = None, alternatives: Optional[list] = None,
                  progress: Optional[Callable[[str], None]] = None) -> dict:
    """Measure ``loader`` and ``model`` separately and together; return the report dict.

    Args:
        loader: Yields ``(images, labels)``: uint8 NCHW (stoker's Loader) or normalized float
            (a torchvision pipeline), on the host or on ``device``.
        model: The network (taking normalized float input); measured in place, so pass a
            model you do not mind being trained a few steps.
        batch_size: The loader's batch size (the synthetic model batch uses the same).
        crop: Image side of the batches.
        device: Where the model runs.
        seconds: Time budget of each measurement.
        amp: ``"auto"``, ``"bf16"``, ``"fp16"`` or ``"off"``: which autocast to measure.
        channels_last: ``"auto"`` (measure when the model has convolutions), ``"on"``, ``"off"``.
        warmup_batches: Batches/steps excluded from every timing.
        data: Facts about DATA shown in the report (kind, path, loader settings); a
            ``"loader_hints"`` list of dicts (id, title, action, est_loader_speedup, basis)
            adds estimated loader-side steps.
        alternatives: Other loaders to measure as loader-side next steps: dicts with ``id``,
            ``title``, ``action`` and ``loader`` (e.g. stoker's Loader on a packed subset).
        progress: Called with a line before each measurement.

    Returns:
        A JSON-ready dict: ``environment``, ``settings``, ``data``, ``loader``, ``model``,
        ``end_to_end``, ``transfer``, ``audit``, ``verdict``, ``next_steps``, ``not_helping``.
    """
    import torch

    from stoker import __version__
    from stoker.model.audit import audit_model

    from .diagnose_measure import (environment, measure_end_to_end, measure_loader, measure_model_alone,
                                   measure_transfer)

    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    if crop < 1:
        raise ValueError(f"crop={crop} must be >= 1")
    if seconds <= 0:
        raise ValueError(f"seconds={seconds} must be > 0")
    if amp not in ("auto", "bf16", "fp16", "off"):
        raise ValueError(f"amp={amp!r} must be 'auto', 'bf16', 'fp16' or 'off'")
    if channels_last not in ("auto", "on", "off"):
        raise ValueError(f"channels_last={channels_last!r} must be 'auto', 'on' or 'off'")
    say = progress or (lambda line: None)
    device = torch.device(device)
    env = environment()

    say("auditing the model's parameters and FLOPs")
    audit = audit_model(model, input_size=(3, crop, crop))

    say(f"loader alone ({seconds:g} s)")
    loader_r = measure_loader(loader, seconds=seconds, warmup_batches=warmup_batches)

    # Alternatives right after, so the loader figures compare side by side in time.
    alt_r = []
    for alt in alternatives or []:
        say(f"loader: {alt['title']} ({seconds:g} s)")
        r = measure_loader(alt["loader"], seconds=seconds, warmup_batches=warmup_batches)
        alt_r.append({k: v for k, v in alt.items() if k != "loader"} | {"result": r})

    amp_dtype, amp_why = _resolve_amp(amp, device)
    cl = channels_last == "on" or (channels_last == "auto" and _has_conv(model))
    cl_why = {"on": "--channels-last on", "off": "--channels-last off"}.get(
        channels_last, "model has convolutions" if cl else "not measured: no convolutions in the model")
    configs = [("fp32", None, False)]
    if amp_dtype:
        configs.append(("amp", amp_dtype, False))
    if cl:
        configs.append(("channels_last", None, True))
    if amp_dtype and cl:
        configs.append(("amp_channels_last", amp_dtype, True))
    model_r: dict = {}
    warm = warmup_batches
    for key, a, c in configs:
        say(f"model alone, {a or 'fp32'}{' channels_last' if c else ''} ({seconds:g} s)")
        model_r[key] = measure_model_alone(model, batch_size=batch_size, crop=crop, device=device, amp=a,
                                           channels_last=c, seconds=seconds, warmup=warm)
        if (model_r[key].get("step_ms") or 0) > 1000 * seconds:
            warm = 1  # a step outlasts the budget: one warm-up step is plenty, and saves minutes
    if model_r["fp32"].get("images_per_s") is None:
        raise DiagnoseError(f"the model does not train at batch {batch_size} on {device}: "
                            f"{model_r['fp32'].get('error')}; try a smaller batch size")
    model_r.setdefault("amp", {"applies": False, "why": amp_why})
    model_r["amp"].setdefault("why", amp_why)
    model_r.setdefault("channels_last", {"applies": False, "why": cl_why})
    model_r["channels_last"].setdefault("why", cl_why)

    say(f"end to end, loader + model ({seconds:g} s)")
    e2e = measure_end_to_end(loader, model, device=device, seconds=seconds, warmup_batches=min(warm, warmup_batches))

    batch_dev = torch.device(loader_r["device"])
    transfer = measure_transfer(loader_r["batch_shape"], device=device, seconds=min(seconds, 2.0))
    # The bus is a stage only when batches are made on the host and trained on the GPU.
    transfer["applies"] = bool(transfer["applies"] and batch_dev.type != device.type)
    transfer["loader_dtype"] = loader_r["dtype"]
    transfer["loader_device"] = loader_r["device"]

    stages = {"loader": loader_r["images_per_s"], "model": model_r["fp32"]["images_per_s"]}
    if transfer["applies"]:
        key = "uint8_images_per_s" if loader_r["dtype"] == "uint8" else "float32_images_per_s"
        stages["transfer"] = transfer[key]
    verdict = _verdict(stages, e2e)

    # A bigger batch is worth measuring only when the model is what bounds training.
    if verdict["bound"] == "model" and model_r["fp32"].get("images_per_s"):
        say(f"model alone, fp32, batch {2 * batch_size} ({seconds:g} s)")
        model_r["fp32_batch_x2"] = measure_model_alone(model, batch_size=2 * batch_size, crop=crop, device=device,
                                                       seconds=seconds, warmup=warm)

    steps, not_helping = _next_steps(stages, model_r, transfer, audit, batch_size, device, amp_dtype,
                                     alt_r, (data or {}).get("loader_hints", []))
    data_out = {k: v for k, v in (data or {}).items() if k != "loader_hints"}
    return {
        "stoker_version": __version__,
        "environment": env,
        "settings": {"batch_size": batch_size, "crop": crop, "device": str(device), "seconds": seconds,
                     "amp": amp, "amp_measured": amp_dtype, "channels_last": channels_last,
                     "warmup_batches": warmup_batches},
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


def _verdict(stages: dict, e2e: dict) -> dict:
    """The slowest stage bounds training; the ratio is how far ahead the next one is."""
    order = sorted(stages, key=lambda k: stages[k])
    bound = order[0]
    slow = stages[bound]
    nxt = order[1]
    ratio = stages[nxt] / slow if slow else float("inf")
    figures = ", ".join(f"{k} {_f(stages[k])} img/s" for k in ("loader", "transfer", "model") if k in stages)
    text = f"{bound}-bound: {figures}; {nxt} is {ratio:.1f}x faster than {bound}"
    if ratio < BALANCED:
        text += (f" (balanced within {BALANCED - 1:.0%}: speeding up {bound} alone gains at most "
                 f"{ratio:.2f}x before {nxt} bounds)")
    wait = e2e.get("data_wait_fraction")
    consistent = None
    if wait is not None:
        text += f". End to end {_f(e2e['images_per_s'])} img/s, {wait:.0%} of the time waiting for data"
        if e2e["images_per_s"] < 0.8 * slow:
            text += (f" ({e2e['images_per_s'] / slow:.0%} of the {bound}'s own rate: loader and model do not "
                     "overlap — no prefetch, or both share the same CPU cores)")
        # The data-wait fraction is the end-to-end view of the same question.
        consistent = not ((bound == "loader" and wait < 0.2) or (bound == "model" and wait > 0.5))
        if not consistent:
            text += (f". Caution: end to end the data wait ({wait:.0%}) points the other way — the stages slow "
                     "each other down when run together (on a CPU they share the cores), so judge changes by the "
                     "end-to-end figure")
    return {"bound": bound, "label": f"{bound}-bound", "ratio": ratio, "next": nxt, "stages": stages,
            "balanced": ratio < BALANCED, "end_to_end_images_per_s": e2e.get("images_per_s"),
            "data_wait_fraction": wait, "consistent": consistent, "text": text}


def _next_steps(stages, model_r, transfer, audit, batch_size, device, amp_dtype, alt_r, hints):
    """Candidate changes with the end-to-end speed-up each implies; ranked, best first.

    Each change moves one stage's rate; the pipelined rate is the slowest stage, so
    ``speedup = min(stages after) / min(stages now)``. Measured when we measured the
    changed stage, an estimate otherwise (``measured: False`` and the basis).
    """
    import torch

    now = min(stages.values())
    cands = []

    def add(id_, stage, rate, title, action, basis, measured=True, note=None, drops=()):
        if rate is None:
            return
        after = {k: v for k, v in stages.items() if k not in drops}
        after[stage] = rate
        cands.append({"id": id_, "stage": stage, "title": title, "action": action,
                      f"{stage}_images_per_s_after": rate, "est_speedup": min(after.values()) / now,
                      "stage_speedup": rate / stages[stage], "measured": measured, "basis": basis,
                      **({"note": note} if note else {})})

    dev = device.type
    m0 = stages["model"]
    amp_flag = amp_dtype or "bf16"
    torch_dtype = {"bf16": "bfloat16", "fp16": "float16"}[amp_flag]
    autocast = f"torch.autocast(device_type={dev!r}, dtype=torch.{torch_dtype})"
    r = model_r.get("amp", {})
    add("amp", "model", _rate(r), f"Train with AMP ({amp_flag})",
        f"with {autocast}: loss = loss_fn(model(x), y)" + (" + torch.amp.GradScaler" if amp_flag == "fp16" else "")
        + f"   |   stoker train --amp {amp_flag}",
        f"model alone {_f(_rate(r) or 0)} vs {_f(m0)} img/s fp32")
    r = model_r.get("channels_last", {})
    add("channels_last", "model", _rate(r), "Use channels_last memory format",
        "model = model.to(memory_format=torch.channels_last); Loader(..., channels_last=True)"
        "   |   stoker train --channels-last",
        f"model alone {_f(_rate(r) or 0)} vs {_f(m0)} img/s")
    r = model_r.get("amp_channels_last", {})
    if _rate(r) and _rate(r) > 1.05 * max(_rate(model_r.get("amp")) or 0, _rate(model_r.get("channels_last")) or 0):
        add("amp_channels_last", "model", _rate(r), f"AMP ({amp_flag}) and channels_last together",
            f"both changes above   |   stoker train --amp {amp_flag} --channels-last",
            f"model alone {_f(_rate(r))} vs {_f(m0)} img/s")
    r = model_r.get("fp32_batch_x2", {})
    if r.get("error"):
        cands.append({"id": "batch_size", "stage": "model", "title": f"Batch size {2 * batch_size}",
                      "action": "", "est_speedup": None, "measured": True,
                      "basis": f"batch {2 * batch_size} does not fit: {r['error']}"})
    else:
        add("batch_size", "model", _rate(r), f"Batch size {2 * batch_size} (from {batch_size})",
            f"Loader(..., batch_size={2 * batch_size}) and scale the learning rate by 2"
            f"   |   stoker train --batch-size {2 * batch_size}",
            f"model alone {_f(_rate(r) or 0)} vs {_f(m0)} img/s at batch {batch_size}")
    if audit.flatten_head and audit.dominant is not None:
        d = audit.dominant
        out_features = d.detail.split("out_features=")[-1].split(",")[0]
        share = d.flop_share or 0.0
        rate = m0 / (1 - share) if share < 1 else None
        add("flatten_head", "model", rate,
            f"Replace the flatten head '{d.name}' ({d.kind}, {d.params:,} parameters, {d.param_share:.0%} of the "
            f"model) with adaptive pooling",
            f"nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(C, {out_features})) in place of "
            "flatten + Linear  (stoker's --arch inception does this)",
            f"from FLOPs: this layer does {share:.2%} of the forward FLOPs", measured=False,
            note=f"the gain is {d.params:,} fewer parameters ({d.param_share:.0%}): a model that generalizes "
                 "instead of memorizing, and any input size; speed barely changes")

    fr = audit.full_res_flop_share
    if fr is not None and fr >= 0.5:
        # Two stride-2 layers first: the same layers then see 1/16 of the pixels.
        factor = 1 / (1 - fr + fr / 16)
        h, w = audit.input_size[-2:]
        add("stem", "model", m0 * factor,
            f"Downsample before the heavy layers: {fr:.0%} of the forward FLOPs run at the full {h}x{w} "
            "input resolution",
            "put a stride-2 stem first, e.g. nn.Sequential(Conv2d(3, 32, 3, stride=2, padding=1), BatchNorm2d(32), "
            "ReLU(), Conv2d(32, 64, 3, stride=2, padding=1), BatchNorm2d(64), ReLU()), as stoker's --arch "
            "inception does for the report's block",
            f"those layers would see 16x fewer pixels ({fr:.0%} of {audit.flops_per_image / 1e9:.2f} GFLOPs); "
            "the stem's own cost and changed channel counts not counted", measured=False)

    # Loader side: measured alternatives, then estimates handed in by the caller.
    for alt in alt_r:
        basis = f"loader alone {_f(alt['result']['images_per_s'])} vs {_f(stages['loader'])} img/s"
        if alt.get("basis_note"):
            basis += f"; {alt['basis_note']}"
        # A loader that yields on the model's device takes the bus out of the pipeline.
        on_device = torch.device(alt["result"]["device"]).type == device.type
        add(alt["id"], "loader", alt["result"]["images_per_s"], alt["title"], alt["action"], basis,
            drops=("transfer",) if on_device else ())
    for h in hints:
        add(h["id"], "loader", stages["loader"] * h["est_loader_speedup"], h["title"], h["action"], h["basis"],
            measured=False)

    if transfer["applies"] and transfer.get("loader_dtype") != "uint8":
        add("uint8_transfer", "transfer", transfer["uint8_images_per_s"],
            "Send uint8 batches and normalize on the GPU (4x fewer bytes)",
            "model = stoker.model.with_normalize(model); stop ToTensor()/Normalize() in the loader "
            "(stoker's Loader yields uint8 on the device)",
            f"host→device copy {_f(transfer['uint8_images_per_s'])} img/s uint8 vs "
            f"{_f(transfer['float32_images_per_s'])} img/s float32")

    helping = [c for c in cands if c["est_speedup"] is not None and c["est_speedup"] >= 1.02]
    others = [c for c in cands if c not in helping]
    helping.sort(key=lambda c: (-c["est_speedup"], not c["measured"]))
    # A change to a stage that does not bound training gains nothing now; list it anyway
    # when the stage itself gets faster (it will matter once the bound moves).
    others.sort(key=lambda c: -(c.get("stage_speedup") or 0))
    for i, c in enumerate(helping, 1):
        c["rank"] = i
    return helping, others


# ----------------------------------------------------------------------------- text report

def _f(x, fmt=None):
    """A figure for humans: images/s get 3 significant digits below 100, none above."""
    if x is None:
        return "-"
    if fmt is None:
        fmt = "{:,.0f}" if abs(x) >= 100 else "{:.1f}" if abs(x) >= 10 else "{:.2f}" if abs(x) >= 1 else "{:.3f}"
    return fmt.format(x)


def format_report(rep: dict) -> str:
    """The human report."""
    env, s, ld, mr, e2e, tr, au, v = (rep[k] for k in ("environment", "settings", "loader", "model", "end_to_end",
                                                      "transfer", "audit", "verdict"))
    pil = env["pillow"]
    lines = [f"stoker diagnose — batch {s['batch_size']}, crop {s['crop']}, device {s['device']}, "
             f"{s['seconds']:g} s per measurement", ""]
    lines.append("environment")
    lines.append(f"  torch {env['torch']}, torchvision {env['torchvision']}, DALI {env['dali'] or 'not installed'}, "
                 f"Pillow {pil['version']} ({'pillow-simd active' if pil['simd'] else 'plain Pillow, not pillow-simd'})")
    lines.append(f"  {env['usable_cores']} usable CPU cores of {env['cpu_count']} ({env['cpu_capability']}"
                 f"{', native bf16' if env['cpu_bf16'] else ''}), GPU: {env['gpu'] or 'none'}")
    d = rep.get("data") or {}
    if d:
        lines.append("")
        lines.append("data")
        for k, val in d.items():
            if k == "backend" and isinstance(val, dict):
                k, val = "stoker backend", f"{val['name']} ({val['why']})"
            elif k == "pack" and isinstance(val, dict):
                val = ", ".join(f"{x}={val[x]}" for x in ("short_side", "max_side", "quality", "source") if x in val)
            elif isinstance(val, dict):
                val = ", ".join(f"{x}={y}" for x, y in val.items())
            lines.append(f"  {k}: {val}")
    lines.append("")
    lines.append("measured (images/s)")
    lines.append(f"  {'loader alone':<30}{_f(ld['images_per_s']):>9}   ({ld['batches']} batches, "
                 f"{ld['dtype']} {'x'.join(map(str, ld['batch_shape']))} on {ld['device']})")
    for alt in rep.get("loader_alternatives", []):
        lines.append(f"  {'loader: ' + alt.get('label', alt['id']):<30}{_f(alt['result']['images_per_s']):>9}   "
                     f"({alt['result']['batches']} batches)")
    names = {"fp32": "model alone, fp32", "amp": f"model alone, AMP {s.get('amp_measured') or ''}",
             "channels_last": "model alone, channels_last",
             "amp_channels_last": "model alone, AMP + ch_last", "fp32_batch_x2": "model alone, fp32, 2x batch"}
    for key, label in names.items():
        r = mr.get(key)
        if r is None:
            continue
        if r.get("images_per_s") is not None:
            lines.append(f"  {label:<30}{_f(r['images_per_s']):>9}   ({r['steps']} step{'s' if r['steps'] != 1 else ''})")
        elif r.get("error"):
            lines.append(f"  {label:<30}{'-':>9}   {r['error']}")
        else:
            lines.append(f"  {label:<30}{'-':>9}   {r.get('why', '')}")
    lines.append(f"  {'end to end, loader + model':<30}{_f(e2e['images_per_s']):>9}   data wait {e2e['data_wait_fraction']:.0%} "
                 f"of {e2e['seconds']:.1f} s")
    lines.append(f"  host→device per batch: {tr['bytes_uint8'] / 1e6:,.1f} MB as uint8, "
                 f"{tr['bytes_float32'] / 1e6:,.1f} MB as float32"
                 + (f"; copies {_f(tr['uint8_images_per_s'])} vs {_f(tr['float32_images_per_s'])} img/s"
                    if tr["uint8_images_per_s"] else
                    " (model runs where the batches are made: no bus crossed)" if not tr["applies"] else ""))
    lines.append("")
    lines.append(f"model: {au['model']}, {au['total_params']:,} parameters, "
                 f"{_f(au['flops_per_image'] and au['flops_per_image'] / 1e9, '{:.2f}')} GFLOPs forward per image")
    lines.append(f"  {'largest layers':<34} {'kind':<14} {'params':>11} {'share':>6} {'GFLOPs':>7}")
    for la in au["layers"][:5]:
        mark = "  <-- holds most parameters" if au["dominant"] and la["name"] == au["dominant"]["name"] else ""
        lines.append(f"  {(la['name'] or '(root)')[:34]:<34} {la['kind'][:14]:<14} {la['params']:>11,} "
                     f"{la['param_share']:>6.1%} {_f(la['flops'] and la['flops'] / 1e9, '{:7.3f}'):>7}{mark}")
    if au["heaviest"]:
        h = au["heaviest"][0]
        lines.append(f"  most FLOPs: {h['name']} ({h['kind']}), {h['flop_share']:.0%} of the forward pass")
    if au["dominant"]:
        dm = au["dominant"]
        lines.append(f"  FLAG: {dm['name']} ({dm['kind']}) holds {dm['params']:,} of {au['total_params']:,} "
                     f"parameters ({dm['param_share']:.0%})"
                     + (": a flatten head (see next steps)" if au["flatten_head"] else
                        ": a classifier over many classes on a small network, which is expected"
                        if dm["kind"] == "Linear" else ""))
    lines.append("")
    lines.append(f"verdict: {v['label'].upper()} ({v['ratio']:.1f}x)")
    lines.append(f"  {v['text']}")
    lines.append("")
    if rep["next_steps"]:
        lines.append("next steps, by estimated end-to-end speed-up")
        for c in rep["next_steps"]:
            how = "measured" if c["measured"] else "estimate"
            lines.append(f"  {c['rank']}. {c['title']}: {c['est_speedup']:.2f}x ({how}: {c['basis']})")
            if c.get("action"):
                lines.append(f"       {c['action']}")
            if c.get("note"):
                lines.append(f"       note: {c['note']}")
    else:
        lines.append("next steps: nothing measured here would speed this run up")
    if rep["not_helping"]:
        lines.append("")
        lines.append(f"no gain now (the {v['bound']} bounds training, or the change is slower)")
        for c in rep["not_helping"]:
            sp = c.get("stage_speedup")
            how = "measured" if c["measured"] else "estimate"
            lines.append(f"  - {c['title']}: {c['stage']} stage {format(sp, '.2f') + 'x' if sp else '?'} "
                         f"({how}: {c['basis']})" + (f"; {c['note']}" if c.get("note") else ""))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the command

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", metavar="DATA", help="stoker shards (split folder or `stoker pack` OUT) or an ImageFolder")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--arch", default="inception",
                   help="stoker network ('inception'; 'report': the report's original network, one regressed "
                        "output) or a torchvision model name (default inception)")
    g.add_argument("--model", metavar="MODULE:FACTORY",
                   help="your network: 'package.module:factory' or 'path/to/file.py:factory'; FACTORY() (given "
                        "num_classes= when it takes it) returns an nn.Module taking normalized float NCHW input")
    p.add_argument("--batch-size", type=int, default=64, help="batch size (default 64)")
    p.add_argument("--crop", type=int, default=224, help="image side the loader produces (default 224)")
    p.add_argument("--device", default=None, help="cuda, cuda:1 or cpu (default: cuda when available)")
    p.add_argument("--seconds", type=float, default=5.0, help="time budget of each measurement (default 5)")
    p.add_argument("--amp", choices=("auto", "bf16", "fp16", "off"), default="auto",
                   help="autocast to measure (auto: bf16 where native, fp16 on GPUs without bf16; "
                        "skipped on CPUs without native bf16)")
    p.add_argument("--channels-last", choices=("auto", "on", "off"), default="auto",
                   help="measure channels_last (auto: when the model has convolutions)")
    p.add_argument("--backend", choices=("auto", "dali", "nvjpeg", "pil"), default="auto",
                   help="stoker Loader backend (auto: DALI when installed, else nvjpeg on a CUDA device, else pil)")
    p.add_argument("--decode", choices=("auto", "mixed", "cpu"), default="auto", help="stoker Loader decode")
    p.add_argument("--threads", type=int, default=None, help="stoker Loader threads (default: its own)")
    p.add_argument("--workers", type=int, default=None,
                   help="DataLoader workers of the torchvision pipeline for an ImageFolder (default: CPU count)")
    p.add_argument("--pack-sample", type=int, default=256, metavar="N",
                   help="ImageFolder: images packed into a temporary folder to measure stoker (default 256; 0 skips)")
    p.add_argument("--json", action="store_true", help="print the report as JSON (every figure) on stdout")


def _load_factory(spec: str):
    """``module:factory`` or ``file.py:factory`` → the callable (UsageError when it cannot be had)."""
    modname, sep, attr = spec.rpartition(":")
    if not sep or not modname or not attr:
        raise UsageError(f"--model {spec!r} must look like 'package.module:factory' or 'file.py:factory'")
    try:
        if modname.endswith(".py") or os.sep in modname or "/" in modname:
            path = Path(modname).expanduser().resolve()
            if not path.is_file():
                raise UsageError(f"--model {spec!r}: no such file {modname}")
            name = f"_stoker_user_model_{path.stem}"
            sys.path.insert(0, str(path.parent))  # so the file's own sibling imports work
            try:
                mspec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(mspec)
                sys.modules[name] = module
                mspec.loader.exec_module(module)
            finally:
                sys.path.remove(str(path.parent))
        else:
            if "" not in sys.path and os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())  # like `python -m`: the current folder is importable
            module = importlib.import_module(modname)
    except UsageError:
        raise
    except BaseException as e:  # noqa: BLE001 - user code may raise anything, even SystemExit
        if isinstance(e, KeyboardInterrupt):
            raise
        msg = str(e).splitlines()[0] if str(e) else ""
        raise UsageError(f"--model {spec!r}: cannot import {modname}: {type(e).__name__}: {msg}") from None
    if not hasattr(module, attr):
        raise UsageError(f"--model {spec!r}: {modname} has no attribute {attr!r}")
    factory = getattr(module, attr)
    if not callable(factory):
        raise UsageError(f"--model {spec!r}: {attr} is a {type(factory).__name__}, not a callable")
    return factory


def build_user_model(spec: str, num_classes: int):
    """Import and call the ``--model`` factory; the result must be an ``nn.Module``."""
    from torch import nn

    factory = _load_factory(spec)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    try:
        net = factory(num_classes=num_classes) if "num_classes" in params else factory()
    except Exception as e:  # noqa: BLE001
        msg = str(e).splitlines()[0] if str(e) else ""
        raise UsageError(f"--model {spec!r}: the factory raised {type(e).__name__}: {msg}") from None
    if not isinstance(net, nn.Module):
        raise UsageError(f"--model {spec!r}: the factory returned a {type(net).__name__}, not a torch.nn.Module")
    return net


def _is_image_folder(root: Path) -> bool:
    for sub in sorted(root.iterdir()):
        if sub.is_dir():
            for f in sub.iterdir():
                if f.suffix.lower() in IMAGE_EXTS:
                    return True
    return False


def resolve_data(path: str) -> tuple[str, Path]:
    """``("shards", split_dir)`` or ``("imagefolder", root)``; UsageError otherwise."""
    from stoker.pipeline.manifest import MANIFEST_NAME

    root = Path(path).expanduser()
    if not root.is_dir():
        raise UsageError(f"DATA {path} is not a folder")
    if (root / MANIFEST_NAME).is_file():
        return "shards", root
    if (root / "train" / MANIFEST_NAME).is_file():
        return "shards", root / "train"
    if _is_image_folder(root):
        return "imagefolder", root
    if (root / "train").is_dir() and _is_image_folder(root / "train"):
        return "imagefolder", root / "train"
    raise UsageError(f"DATA {path} is neither stoker shards (no {MANIFEST_NAME} in it or in train/) "
                     "nor an ImageFolder (class subfolders of images)")


def _device(arg: Optional[str]) -> str:
    from stoker.model.train import resolve_device

    try:
        return str(resolve_device(arg or "auto"))
    except ValueError as e:
        raise UsageError(f"--device: {e}") from None


def backend_choice(requested: str, device: str) -> dict:
    """Which Loader backend this setup uses for ``requested`` on ``device``, and why
    (:func:`stoker.pipeline.deps.resolve_backend`); a backend that cannot run here is a
    :class:`UsageError` naming the fix."""
    import torch

    from stoker.pipeline.deps import resolve_backend

    try:
        name, why = resolve_backend(requested, torch.device(device).type)
    except ValueError as e:
        raise UsageError(f"--backend: {e}") from None
    return {"name": name, "why": why if requested == "auto" else f"--backend {requested}"}


def _quick_pack(root: Path, n: int, tmp: Path) -> Path:
    """Pack ``n`` random images of ImageFolder ``root`` (symlinked into ``tmp``) with the
    default settings; return the packed split folder."""
    from .bench_pack import _image_folder
    from .cli import run_command

    src = tmp / "src"
    _image_folder(root, src, n)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the report (--json) alone
        run_command(["pack", str(src), str(tmp / "out"), "-q"])
    return tmp / "out" / "train"


def _loader_hints(manifest, crop: int) -> list:
    """Estimated loader-side steps read from the shards' manifest (pack settings)."""
    pack = manifest.pack or {}
    if "short_side" not in pack:  # not made by `stoker pack`: sizes unknown
        return []
    from stoker.pipeline.augment import VAL_CROP_FRACTION

    target = round(crop / VAL_CROP_FRACTION)  # what a val resize needs; train crops need no more
    side = pack.get("short_side") or (round(0.75 * pack["max_side"]) if pack.get("max_side") else 0)
    if side and side <= 1.5 * target:
        return []
    # Decode time grows with the stored pixels: ImageNet originals (median 500x375) against
    # short side 256 measured 1.6x for ~2.1x fewer pixels (MEASURED.md); assume the same law.
    pixels = (side / target) ** 2 if side else 2.1
    src = pack.get("source", "SRC")
    return [{"id": "pack_smaller", "title": f"Repack with --short-side {target}",
             "action": f"stoker pack {src} OUT --short-side {target}",
             "est_loader_speedup": min(pixels ** 0.65, 4.0),
             "basis": f"stored short side {side or 'original size'} vs {target} for crop {crop}: "
                      f"~{pixels:.1f}x the pixels to decode; 2.1x fewer pixels gave 1.6x on ImageNet"}]


def main(args: argparse.Namespace) -> int:
    for name in ("batch_size", "crop"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} {getattr(args, name)} must be >= 1")
    if args.seconds <= 0:
        raise UsageError(f"--seconds {args.seconds} must be > 0")
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads {args.threads} must be >= 1")
    kind, path = resolve_data(args.data)
    device = _device(args.device)
    backend = backend_choice(args.backend, device)
    say = (lambda line: print(f"stoker diagnose: {line}", file=sys.stderr, flush=True))
    cores = usable_cores()

    # Cheap facts first, then the user's model (a bad --model fails before any loader starts).
    if kind == "shards":
        from stoker.pipeline.manifest import Manifest

        manifest = Manifest.load(path)
        num_classes, num_samples = len(manifest.classes), manifest.num_samples
    else:
        from torchvision.datasets.folder import find_classes

        num_classes = len(find_classes(str(path))[0])
        num_samples = sum(1 for c in path.iterdir() if c.is_dir()
                          for f in c.iterdir() if f.suffix.lower() in IMAGE_EXTS)
    if num_samples < args.batch_size:
        raise UsageError(f"--batch-size {args.batch_size} is larger than the {num_samples} samples in {path}")
    model = _build_model(args, num_classes)

    tmp = None
    alternatives = []
    try:
        if kind == "shards":
            loader = _stoker_loader(path, args, device)
            data = {"kind": "stoker shards", "path": str(path), "samples": num_samples, "classes": num_classes,
                    "pack": manifest.pack, "loader": _describe(loader), "backend": backend,
                    "loader_hints": _loader_hints(manifest, args.crop)}
            if args.threads is not None and args.threads < cores:
                alternatives.append({"id": "threads", "label": f"{cores} threads",
                                     "title": f"Loader threads {cores} (from {args.threads})",
                                     "action": f"Loader(..., threads={cores})",
                                     "loader": _stoker_loader(path, args, device, threads=cores)})
            if device.startswith("cuda") and args.decode == "cpu":
                alternatives.append({"id": "decode_mixed", "label": 'decode="mixed"',
                                     "title": 'Decode on the GPU (decode="mixed")',
                                     "action": 'Loader(..., decode="mixed")',
                                     "loader": _stoker_loader(path, args, device, decode="mixed")})
        else:
            workers = args.workers if args.workers is not None else cores
            from .bench import torchvision_loader

            loader, _ = torchvision_loader(path, batch_size=args.batch_size, crop=args.crop, workers=workers,
                                           pin_memory=device.startswith("cuda"))
            data = {"kind": "ImageFolder", "path": str(path), "samples": num_samples, "classes": num_classes,
                    "backend": backend, "loader": "torchvision ImageFolder + RandomResizedCrop/flip/ToTensor/Normalize, "
                              f"DataLoader(num_workers={workers}): float32 batches on the host"}
            n = min(args.pack_sample, num_samples)
            if n > 0:
                from stoker.pipeline.manifest import Manifest

                say(f"packing {n} images into a temporary folder to measure stoker on them")
                tmp = Path(tempfile.mkdtemp(prefix="stoker-diagnose-"))
                split = _quick_pack(path, n, tmp)
                sub = argparse.Namespace(**{**vars(args),
                                            "batch_size": min(args.batch_size, Manifest.load(split).num_samples)})
                alternatives.append({
                    "id": "pack", "label": "after stoker pack", "title": "Pack with stoker pack, load with stoker's Loader",
                    "action": f"stoker pack {path} OUT; then Loader('OUT/train', batch_size={args.batch_size}, "
                              f"crop={args.crop}, device={device!r})",
                    "loader": _stoker_loader(split, sub, device),
                    "basis_note": f"on {n} of the images, packed with defaults"})
        try:
            rep = run_diagnosis(loader, model, batch_size=args.batch_size, crop=args.crop, device=device,
                                seconds=args.seconds, amp=args.amp, channels_last=args.channels_last,
                                data=data, alternatives=alternatives, progress=say)
        except DiagnoseError as e:
            raise UsageError(str(e)) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    rep["settings"]["model"] = args.model or args.arch
    if args.json:
        print(json.dumps(rep, indent=2, default=str))
    else:
        print(format_report(rep))
    return 0


def _build_model(args, num_classes: int):
    if args.model:
        return build_user_model(args.model, num_classes)
    from stoker.model.nets import build_model

    try:
        if args.arch == "report":  # as in the report: one regressed output, Linear sized by the crop
            return build_model("report", 1, image_size=args.crop)
        return build_model(args.arch, num_classes)
    except ValueError as e:
        raise UsageError(f"--arch: {e}") from None


def _stoker_loader(split: Path, args, device: str, **over):
    from stoker.pipeline import Loader

    kw = dict(batch_size=args.batch_size, train=True, crop=args.crop, device=device, seed=0,
              backend=args.backend, decode=args.decode, threads=args.threads)
    kw.update(over)
    try:
        return Loader(str(split), **kw)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _describe(loader) -> dict:
    out = {}
    for k in ("backend", "decode", "threads", "batch_size", "crop", "device"):
        v = getattr(loader, k, None)
        if v is not None:
            out[k] = str(v)
    return out
