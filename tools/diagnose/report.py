"""The report of ``stoker diagnose``: the verdict, the next steps ranked, the text.

Pure functions of the measured figures (no timing here), so they are tested on made-up
figures: :func:`judge` names the stage that bounds training, :func:`next_steps` ranks the
candidate changes by the end-to-end speed-up each implies, :func:`format_report` renders
the report dict for humans.

One module past 400 lines: the verdict, the ranking and the text read the same report dict.
"""

from __future__ import annotations

# Within this factor the two slowest stages are "balanced": speeding up one alone gains little.
BALANCED = 1.15


def _rate(r: dict | None) -> float | None:
    return r.get("images_per_s") if r else None


def judge(stages: dict, e2e: dict) -> dict:
    """The verdict: the slowest stage bounds training; the ratio is how far ahead the next one is.

    Args:
        stages: Images/s of each stage measured alone (``loader``, ``model``, maybe ``transfer``).
        e2e: The end-to-end measurement (``images_per_s``, ``data_wait_fraction``).

    Returns:
        ``bound``, ``label``, ``ratio``, ``next``, ``stages``, ``balanced``,
        ``end_to_end_images_per_s``, ``data_wait_fraction``, ``consistent`` and ``text``.
    """
    order = sorted(stages, key=lambda k: stages[k])
    bound = order[0]
    slow = stages[bound]
    nxt = order[1]
    ratio = stages[nxt] / slow if slow else float("inf")
    figures = ", ".join(f"{k} {_f(stages[k])} img/s" for k in ("loader", "transfer", "model") if k in stages)
    text = f"{bound}-bound: {figures}; {nxt} is {ratio:.1f}x faster than {bound}"
    if ratio < BALANCED:
        text += (
            f" (balanced within {BALANCED - 1:.0%}: speeding up {bound} alone gains at most "
            f"{ratio:.2f}x before {nxt} bounds)"
        )
    wait = e2e.get("data_wait_fraction")
    consistent = None
    if wait is not None:
        text += f". End to end {_f(e2e['images_per_s'])} img/s, {wait:.0%} of the time waiting for data"
        if e2e["images_per_s"] < 0.8 * slow:
            text += (
                f" ({e2e['images_per_s'] / slow:.0%} of the {bound}'s own rate: loader and model do not "
                "overlap — no prefetch, or both share the same CPU cores)"
            )
        # The data-wait fraction is the end-to-end view of the same question.
        consistent = not ((bound == "loader" and wait < 0.2) or (bound == "model" and wait > 0.5))
        if not consistent:
            text += (
                f". Caution: end to end the data wait ({wait:.0%}) points the other way — the stages slow "
                "each other down when run together (on a CPU they share the cores), so judge changes by the "
                "end-to-end figure"
            )
    return {
        "bound": bound,
        "label": f"{bound}-bound",
        "ratio": ratio,
        "next": nxt,
        "stages": stages,
        "balanced": ratio < BALANCED,
        "end_to_end_images_per_s": e2e.get("images_per_s"),
        "data_wait_fraction": wait,
        "consistent": consistent,
        "text": text,
    }


def next_steps(
    stages: dict,
    model_r: dict,
    transfer: dict,
    audit,
    batch_size: int,
    device,
    amp_dtype: str | None,
    alt_r: list,
    hints: list,
) -> tuple[list, list]:
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
        cands.append(
            {
                "id": id_,
                "stage": stage,
                "title": title,
                "action": action,
                f"{stage}_images_per_s_after": rate,
                "est_speedup": min(after.values()) / now,
                "stage_speedup": rate / stages[stage],
                "measured": measured,
                "basis": basis,
                **({"note": note} if note else {}),
            }
        )

    dev = device.type
    m0 = stages["model"]
    amp_flag = amp_dtype or "bf16"
    torch_dtype = {"bf16": "bfloat16", "fp16": "float16"}[amp_flag]
    autocast = f"torch.autocast(device_type={dev!r}, dtype=torch.{torch_dtype})"
    r = model_r.get("amp", {})
    add(
        "amp",
        "model",
        _rate(r),
        f"Train with AMP ({amp_flag})",
        f"with {autocast}: loss = loss_fn(model(x), y)"
        + (" + torch.amp.GradScaler" if amp_flag == "fp16" else "")
        + f"   |   stoker train --amp {amp_flag}",
        f"model alone {_f(_rate(r) or 0)} vs {_f(m0)} img/s fp32",
    )
    r = model_r.get("channels_last", {})
    add(
        "channels_last",
        "model",
        _rate(r),
        "Use channels_last memory format",
        "model = model.to(memory_format=torch.channels_last); Loader(..., channels_last=True)"
        "   |   stoker train --channels-last",
        f"model alone {_f(_rate(r) or 0)} vs {_f(m0)} img/s",
    )
    r = model_r.get("amp_channels_last", {})
    if _rate(r) and _rate(r) > 1.05 * max(_rate(model_r.get("amp")) or 0, _rate(model_r.get("channels_last")) or 0):
        add(
            "amp_channels_last",
            "model",
            _rate(r),
            f"AMP ({amp_flag}) and channels_last together",
            f"both changes above   |   stoker train --amp {amp_flag} --channels-last",
            f"model alone {_f(_rate(r))} vs {_f(m0)} img/s",
        )
    r = model_r.get("fp32_batch_x2", {})
    if r.get("error"):
        cands.append(
            {
                "id": "batch_size",
                "stage": "model",
                "title": f"Batch size {2 * batch_size}",
                "action": "",
                "est_speedup": None,
                "measured": True,
                "basis": f"batch {2 * batch_size} does not fit: {r['error']}",
            }
        )
    else:
        add(
            "batch_size",
            "model",
            _rate(r),
            f"Batch size {2 * batch_size} (from {batch_size})",
            f"Loader(..., batch_size={2 * batch_size}) and scale the learning rate by 2"
            f"   |   stoker train --batch-size {2 * batch_size}",
            f"model alone {_f(_rate(r) or 0)} vs {_f(m0)} img/s at batch {batch_size}",
        )
    if audit.flatten_head and audit.dominant is not None:
        d = audit.dominant
        out_features = d.detail.split("out_features=")[-1].split(",")[0]
        share = d.flop_share or 0.0
        rate = m0 / (1 - share) if share < 1 else None
        add(
            "flatten_head",
            "model",
            rate,
            f"Replace the flatten head '{d.name}' ({d.kind}, {d.params:,} parameters, {d.param_share:.0%} of the "
            f"model) with adaptive pooling",
            f"nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(C, {out_features})) in place of "
            "flatten + Linear  (stoker's --arch inception does this)",
            f"from FLOPs: this layer does {share:.2%} of the forward FLOPs",
            measured=False,
            note=f"the gain is {d.params:,} fewer parameters ({d.param_share:.0%}): a model that generalizes "
            "instead of memorizing, and any input size; speed barely changes",
        )

    fr = audit.full_res_flop_share
    if fr is not None and fr >= 0.5:
        # Two stride-2 layers first: the same layers then see 1/16 of the pixels.
        factor = 1 / (1 - fr + fr / 16)
        h, w = audit.input_size[-2:]
        add(
            "stem",
            "model",
            m0 * factor,
            f"Downsample before the heavy layers: {fr:.0%} of the forward FLOPs run at the full {h}x{w} "
            "input resolution",
            "put a stride-2 stem first, e.g. nn.Sequential(Conv2d(3, 32, 3, stride=2, padding=1), BatchNorm2d(32), "
            "ReLU(), Conv2d(32, 64, 3, stride=2, padding=1), BatchNorm2d(64), ReLU()), as stoker's --arch "
            "inception does for the report's block",
            f"those layers would see 16x fewer pixels ({fr:.0%} of {audit.flops_per_image / 1e9:.2f} GFLOPs); "
            "the stem's own cost and changed channel counts not counted",
            measured=False,
        )

    # Loader side: measured alternatives, then estimates handed in by the caller.
    for alt in alt_r:
        basis = f"loader alone {_f(alt['result']['images_per_s'])} vs {_f(stages['loader'])} img/s"
        if alt.get("basis_note"):
            basis += f"; {alt['basis_note']}"
        # A loader that yields on the model's device takes the bus out of the pipeline.
        on_device = torch.device(alt["result"]["device"]).type == device.type
        add(
            alt["id"],
            "loader",
            alt["result"]["images_per_s"],
            alt["title"],
            alt["action"],
            basis,
            drops=("transfer",) if on_device else (),
        )
    for h in hints:
        add(
            h["id"],
            "loader",
            stages["loader"] * h["est_loader_speedup"],
            h["title"],
            h["action"],
            h["basis"],
            measured=False,
        )

    if transfer["applies"] and transfer.get("loader_dtype") != "uint8":
        add(
            "uint8_transfer",
            "transfer",
            transfer["uint8_images_per_s"],
            "Send uint8 batches and normalize on the GPU (4x fewer bytes)",
            "model = stoker.model.with_normalize(model); stop ToTensor()/Normalize() in the loader "
            "(stoker's Loader yields uint8 on the device)",
            f"host→device copy {_f(transfer['uint8_images_per_s'])} img/s uint8 vs "
            f"{_f(transfer['float32_images_per_s'])} img/s float32",
        )

    helping = [c for c in cands if c["est_speedup"] is not None and c["est_speedup"] >= 1.02]
    others = [c for c in cands if c not in helping]
    helping.sort(key=lambda c: (-c["est_speedup"], not c["measured"]))
    # A change to a stage that does not bound training gains nothing now; list it anyway
    # when the stage itself gets faster (it will matter once the bound moves).
    others.sort(key=lambda c: -(c.get("stage_speedup") or 0))
    for i, c in enumerate(helping, 1):
        c["rank"] = i
    return helping, others


def _f(x, fmt=None):
    """A figure for humans: images/s get 3 significant digits below 100, none above."""
    if x is None:
        return "-"
    if fmt is None:
        fmt = "{:,.0f}" if abs(x) >= 100 else "{:.1f}" if abs(x) >= 10 else "{:.2f}" if abs(x) >= 1 else "{:.3f}"
    return fmt.format(x)


def _header_lines(rep: dict) -> list[str]:
    s, env = rep["settings"], rep["environment"]
    pil = env["pillow"]
    simd = "pillow-simd active" if pil["simd"] else "plain Pillow, not pillow-simd"
    lines = [
        f"stoker diagnose — batch {s['batch_size']}, crop {s['crop']}, device {s['device']}, "
        f"{s['seconds']:g} s per measurement",
        "",
        "environment",
        f"  torch {env['torch']}, torchvision {env['torchvision']}, DALI {env['dali'] or 'not installed'}, "
        f"Pillow {pil['version']} ({simd})",
        f"  {env['usable_cores']} usable CPU cores of {env['cpu_count']} ({env['cpu_capability']}"
        f"{', native bf16' if env['cpu_bf16'] else ''}), GPU: {env['gpu'] or 'none'}",
    ]
    d = rep.get("data") or {}
    if d:
        lines += ["", "data"]
        for k, val in d.items():
            if k == "backend" and isinstance(val, dict):
                k, val = "stoker backend", f"{val['name']} ({val['why']})"
            elif k == "pack" and isinstance(val, dict):
                val = ", ".join(f"{x}={val[x]}" for x in ("short_side", "max_side", "quality", "source") if x in val)
            elif isinstance(val, dict):
                val = ", ".join(f"{x}={y}" for x, y in val.items())
            lines.append(f"  {k}: {val}")
    return lines


def _measured_lines(rep: dict) -> list[str]:
    s, ld, mr, e2e, tr = (rep[k] for k in ("settings", "loader", "model", "end_to_end", "transfer"))
    lines = [
        "",
        "measured (images/s)",
        f"  {'loader alone':<30}{_f(ld['images_per_s']):>9}   ({ld['batches']} batches, "
        f"{ld['dtype']} {'x'.join(map(str, ld['batch_shape']))} on {ld['device']})",
    ]
    for alt in rep.get("loader_alternatives", []):
        lines.append(
            f"  {'loader: ' + alt.get('label', alt['id']):<30}{_f(alt['result']['images_per_s']):>9}   "
            f"({alt['result']['batches']} batches)"
        )
    names = {
        "fp32": "model alone, fp32",
        "amp": f"model alone, AMP {s.get('amp_measured') or ''}",
        "channels_last": "model alone, channels_last",
        "amp_channels_last": "model alone, AMP + ch_last",
        "fp32_batch_x2": "model alone, fp32, 2x batch",
    }
    for key, label in names.items():
        r = mr.get(key)
        if r is None:
            continue
        if r.get("images_per_s") is not None:
            steps = f"{r['steps']} step{'s' if r['steps'] != 1 else ''}"
            lines.append(f"  {label:<30}{_f(r['images_per_s']):>9}   ({steps})")
        else:
            lines.append(f"  {label:<30}{'-':>9}   {r['error'] if r.get('error') else r.get('why', '')}")
    lines.append(
        f"  {'end to end, loader + model':<30}{_f(e2e['images_per_s']):>9}   "
        f"data wait {e2e['data_wait_fraction']:.0%} of {e2e['seconds']:.1f} s"
    )
    lines.append(
        f"  host→device per batch: {tr['bytes_uint8'] / 1e6:,.1f} MB as uint8, "
        f"{tr['bytes_float32'] / 1e6:,.1f} MB as float32"
        + (
            f"; copies {_f(tr['uint8_images_per_s'])} vs {_f(tr['float32_images_per_s'])} img/s"
            if tr["uint8_images_per_s"]
            else " (model runs where the batches are made: no bus crossed)"
            if not tr["applies"]
            else ""
        )
    )
    return lines


def _audit_lines(au: dict) -> list[str]:
    lines = [
        "",
        f"model: {au['model']}, {au['total_params']:,} parameters, "
        f"{_f(au['flops_per_image'] and au['flops_per_image'] / 1e9, '{:.2f}')} GFLOPs forward per image",
        f"  {'largest layers':<34} {'kind':<14} {'params':>11} {'share':>6} {'GFLOPs':>7}",
    ]
    for la in au["layers"][:5]:
        mark = "  <-- holds most parameters" if au["dominant"] and la["name"] == au["dominant"]["name"] else ""
        lines.append(
            f"  {(la['name'] or '(root)')[:34]:<34} {la['kind'][:14]:<14} {la['params']:>11,} "
            f"{la['param_share']:>6.1%} {_f(la['flops'] and la['flops'] / 1e9, '{:7.3f}'):>7}{mark}"
        )
    if au["heaviest"]:
        h = au["heaviest"][0]
        lines.append(f"  most FLOPs: {h['name']} ({h['kind']}), {h['flop_share']:.0%} of the forward pass")
    if au["dominant"]:
        dm = au["dominant"]
        lines.append(
            f"  FLAG: {dm['name']} ({dm['kind']}) holds {dm['params']:,} of {au['total_params']:,} "
            f"parameters ({dm['param_share']:.0%})"
            + (
                ": a flatten head (see next steps)"
                if au["flatten_head"]
                else ": a classifier over many classes on a small network, which is expected"
                if dm["kind"] == "Linear"
                else ""
            )
        )
    return lines


def _steps_lines(rep: dict) -> list[str]:
    v = rep["verdict"]
    lines = ["", f"verdict: {v['label'].upper()} ({v['ratio']:.1f}x)", f"  {v['text']}", ""]
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
        lines += ["", f"no gain now (the {v['bound']} bounds training, or the change is slower)"]
        for c in rep["not_helping"]:
            sp = c.get("stage_speedup")
            how = "measured" if c["measured"] else "estimate"
            lines.append(
                f"  - {c['title']}: {c['stage']} stage {format(sp, '.2f') + 'x' if sp else '?'} "
                f"({how}: {c['basis']})" + (f"; {c['note']}" if c.get("note") else "")
            )
    return lines


def format_report(rep: dict) -> str:
    """The human report of a :func:`stoker.tools.diagnose.engine.run_diagnosis` dict."""
    return "\n".join(_header_lines(rep) + _measured_lines(rep) + _audit_lines(rep["audit"]) + _steps_lines(rep))
