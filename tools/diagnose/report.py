"""The report of ``stoker diagnose``: the verdict, the next steps ranked, the text.

Pure functions of the measured figures (no timing here), so they are tested on made-up
figures: :func:`judge` names the stage that bounds training, :func:`next_steps` ranks the
candidate changes by the end-to-end speed-up each implies (:mod:`.text` renders the report
dict for humans). A figure with too few steps or too noisy (its ``trust``) gets no speed-up
claim: the verdict says it is not settled and the changes that rest on it are listed unranked.
"""

from __future__ import annotations

# Within this factor the two slowest stages are "balanced": speeding up one alone gains little.
BALANCED = 1.15


def _rate(r: dict | None) -> float | None:
    return r.get("images_per_s") if r else None


def untrusted(r: dict | None) -> str | None:
    """The caveat of a measurement that advice may not rest on, else None (no ``trust``: made-up, trusted)."""
    return r.get("caveat", r["trust"]) if r and r.get("trust", "ok") != "ok" else None


def caveats_of(loader: dict, model: dict, transfer: dict | None = None) -> dict:
    """``{stage: "what: caveat"}`` for the stage figures that are too few or too noisy to advise on."""
    out = {}
    for stage, what, r in (("loader", "loader alone", loader), ("model", "model alone, fp32", model)):
        if untrusted(r):
            out[stage] = f"{what}: {untrusted(r)}"
    if transfer and transfer.get("applies") and untrusted(transfer):
        out["transfer"] = f"host→device copy: {untrusted(transfer)}"
    return out


def judge(stages: dict, e2e: dict, *, caveats: dict | None = None) -> dict:
    """The verdict: the slowest stage bounds training; the ratio is how far ahead the next one is.

    Args:
        stages: Images/s of each stage measured alone (``loader``, ``model``, maybe ``transfer``).
        e2e: The end-to-end measurement (``images_per_s``, ``data_wait_fraction``, maybe ``trust``).
        caveats: ``{stage: why}`` for stage figures too few or too noisy to advise on
            (:func:`caveats_of`): the verdict is then not settled (``reliable`` False).

    Returns:
        ``bound``, ``label``, ``ratio``, ``next``, ``stages``, ``balanced``, ``reliable``,
        ``caveats``, ``end_to_end_images_per_s``, ``data_wait_fraction``, ``consistent`` and ``text``.
    """
    caveats = caveats or {}
    order = sorted(stages, key=lambda k: stages[k])
    bound = order[0]
    slow = stages[bound]
    nxt = order[1]
    ratio = stages[nxt] / slow if slow else float("inf")
    figures = ", ".join(f"{k} {figure(stages[k])} img/s" for k in ("loader", "transfer", "model") if k in stages)
    text = f"{bound}-bound: {figures}; {nxt} is {ratio:.1f}x faster than {bound}"
    if ratio < BALANCED:
        text += (
            f" (balanced within {BALANCED - 1:.0%}: speeding up {bound} alone gains at most "
            f"{ratio:.2f}x before {nxt} bounds)"
        )
    wait = e2e.get("data_wait_fraction")
    consistent = None
    if wait is not None:
        text += f". End to end {figure(e2e['images_per_s'])} img/s, {wait:.0%} of the time waiting for data"
        if e2e["images_per_s"] < 0.8 * slow:
            text += (
                f" ({e2e['images_per_s'] / slow:.0%} of the {bound}'s own rate: loader and model do not "
                "overlap — no prefetch, or both share the same CPU cores)"
            )
        # The data-wait fraction is the end-to-end view of the same question (when it can be trusted).
        if untrusted(e2e):
            text += f" (end to end: {untrusted(e2e)})"
        else:
            consistent = not ((bound == "loader" and wait < 0.2) or (bound == "model" and wait > 0.5))
        if consistent is False:
            text += (
                f". Caution: end to end the data wait ({wait:.0%}) points the other way — the stages slow "
                "each other down when run together (on a CPU they share the cores), so judge changes by the "
                "end-to-end figure"
            )
    if caveats:
        text += (
            ". Not settled: " + "; ".join(caveats.values()) + ". No speed-up figures rest on that: measure longer "
            "(--seconds) or with a smaller --batch-size"
        )
    return {
        "bound": bound,
        "label": f"{bound}-bound",
        "ratio": ratio,
        "next": nxt,
        "stages": stages,
        "balanced": ratio < BALANCED,
        "reliable": not caveats,
        "caveats": list(caveats.values()),
        "end_to_end_images_per_s": e2e.get("images_per_s"),
        "data_wait_fraction": wait,
        "consistent": consistent,
        "text": text,
    }


class _Candidates:
    """The changes gathered so far, each with the end-to-end speed-up it implies against ``stages``."""

    def __init__(self, stages: dict, caveats: dict | None):
        self.stages = stages
        self.now = min(stages.values())
        self.unsettled = "" if not caveats else "not ranked: the stage figures it is weighed against are not settled"
        self.items: list = []

    def add(self, id_, stage, rate, title, action, basis, measured=True, note=None, drops=(), src=None):
        if rate is None:
            return
        after = {k: v for k, v in self.stages.items() if k not in drops}
        after[stage] = rate
        why = self.unsettled or (f"not ranked: {untrusted(src)}" if untrusted(src) else "")
        self.items.append(
            {
                "id": id_,
                "stage": stage,
                "title": title,
                "action": action,
                f"{stage}_images_per_s_after": rate,
                "est_speedup": None if why else min(after.values()) / self.now,
                "stage_speedup": None if why else rate / self.stages[stage],
                "measured": measured,
                "basis": basis,
                **({"unranked": why} if why else {}),
                **({"note": note} if note else {}),
            }
        )


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
    *,
    caveats: dict | None = None,
    auto_amp: str | None = None,
) -> tuple[list, list]:
    """Candidate changes with the end-to-end speed-up each implies; ranked, best first.

    Each change moves one stage's rate; the pipelined rate is the slowest stage, so
    ``speedup = min(stages after) / min(stages now)``. Measured when we measured the
    changed stage, an estimate otherwise (``measured: False`` and the basis). A change whose
    own figure, or any stage figure (``caveats``, :func:`caveats_of`), is too few or too noisy
    gets no speed-up (``est_speedup`` and ``stage_speedup`` None, ``unranked`` says why).
    ``auto_amp`` is what ``stoker train --amp auto`` uses on ``device``, so the AMP advice
    says whether the default already does it.
    """
    cands = _Candidates(stages, caveats)
    _model_settings(cands, model_r, batch_size, device.type, amp_dtype, auto_amp)
    _model_design(cands, audit)
    _loader_changes(cands, alt_r, hints, device)
    if transfer["applies"] and transfer.get("loader_dtype") != "uint8":
        cands.add(
            "uint8_transfer",
            "transfer",
            transfer["uint8_images_per_s"],
            "Send uint8 batches and normalize on the GPU (4x fewer bytes)",
            "model = stoker.model.with_normalize(model); stop ToTensor()/Normalize() in the loader "
            "(stoker's Loader yields uint8 on the device)",
            f"host→device copy {figure(transfer['uint8_images_per_s'])} img/s uint8 vs "
            f"{figure(transfer['float32_images_per_s'])} img/s float32",
            src=transfer,
        )
    return _ranked(cands.items)


def _amp_default(amp_flag: str, auto_amp: str | None) -> str:
    """Whether `stoker train`'s default already does AMP: advice and training must agree."""
    if auto_amp is None:
        return ""
    if auto_amp == amp_flag:
        return f" (the default, --amp auto, picks {amp_flag} on this device)"
    if auto_amp == "off":
        return " (the default, --amp auto, leaves it off on this device)"
    return f" (the default, --amp auto, picks {auto_amp} on this device)"


def _model_settings(cands: _Candidates, model_r: dict, batch_size: int, dev: str, amp_dtype, auto_amp) -> None:
    """The model's measured variants: AMP, channels_last, both, twice the batch."""
    m0 = cands.stages["model"]
    amp_flag = amp_dtype or "bf16"
    torch_dtype = {"bf16": "bfloat16", "fp16": "float16"}[amp_flag]
    autocast = f"torch.autocast(device_type={dev!r}, dtype=torch.{torch_dtype})"
    default = _amp_default(amp_flag, auto_amp)
    r = model_r.get("amp", {})
    cands.add(
        "amp",
        "model",
        _rate(r),
        f"Train with AMP ({amp_flag})",
        f"with {autocast}: loss = loss_fn(model(x), y)"
        + (" + torch.amp.GradScaler" if amp_flag == "fp16" else "")
        + f"   |   stoker train --amp {amp_flag}{default}",
        f"model alone {figure(_rate(r) or 0)} vs {figure(m0)} img/s fp32",
        src=r,
    )
    r = model_r.get("channels_last", {})
    cands.add(
        "channels_last",
        "model",
        _rate(r),
        "Use channels_last memory format",
        "model = model.to(memory_format=torch.channels_last); Loader(..., channels_last=True)"
        "   |   stoker train --channels-last",
        f"model alone {figure(_rate(r) or 0)} vs {figure(m0)} img/s",
        src=r,
    )
    r = model_r.get("amp_channels_last", {})
    if _rate(r) and _rate(r) > 1.05 * max(_rate(model_r.get("amp")) or 0, _rate(model_r.get("channels_last")) or 0):
        cands.add(
            "amp_channels_last",
            "model",
            _rate(r),
            f"AMP ({amp_flag}) and channels_last together",
            f"both changes above   |   stoker train --amp {amp_flag} --channels-last{default}",
            f"model alone {figure(_rate(r))} vs {figure(m0)} img/s",
            src=r,
        )
    _batch_size_change(cands, model_r.get("fp32_batch_x2", {}), batch_size)


def _batch_size_change(cands: _Candidates, r: dict, batch_size: int) -> None:
    if r.get("error"):
        cands.items.append(
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
        return
    cands.add(
        "batch_size",
        "model",
        _rate(r),
        f"Batch size {2 * batch_size} (from {batch_size})",
        f"Loader(..., batch_size={2 * batch_size}) and scale the learning rate by 2"
        f"   |   stoker train --batch-size {2 * batch_size}",
        f"model alone {figure(_rate(r) or 0)} vs {figure(cands.stages['model'])} img/s at batch {batch_size}",
        src=r,
    )


def _model_design(cands: _Candidates, audit) -> None:
    """Estimates from the audit: a flatten head, the heavy layers at the full resolution."""
    m0 = cands.stages["model"]
    if audit.flatten_head and audit.dominant is not None:
        d = audit.dominant
        out_features = d.detail.split("out_features=")[-1].split(",")[0]
        share = d.flop_share or 0.0
        rate = m0 / (1 - share) if share < 1 else None
        cands.add(
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
        cands.add(
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


def _loader_changes(cands: _Candidates, alt_r: list, hints: list, device) -> None:
    """Loader side: measured alternatives, then estimates handed in by the caller."""
    import torch

    loader = cands.stages["loader"]
    for alt in alt_r:
        basis = f"loader alone {figure(alt['result']['images_per_s'])} vs {figure(loader)} img/s"
        if alt.get("basis_note"):
            basis += f"; {alt['basis_note']}"
        # A loader that yields on the model's device takes the bus out of the pipeline.
        on_device = torch.device(alt["result"]["device"]).type == device.type
        cands.add(
            alt["id"],
            "loader",
            alt["result"]["images_per_s"],
            alt["title"],
            alt["action"],
            basis,
            drops=("transfer",) if on_device else (),
            src=alt["result"],
        )
    for h in hints:
        rate = loader * h["est_loader_speedup"]
        cands.add(h["id"], "loader", rate, h["title"], h["action"], h["basis"], measured=False)


def _ranked(cands: list) -> tuple[list, list]:
    """The changes that help now, ranked best first (``rank`` 1...), and the others."""
    helping = [c for c in cands if c["est_speedup"] is not None and c["est_speedup"] >= 1.02]
    others = [c for c in cands if c not in helping]
    helping.sort(key=lambda c: (-c["est_speedup"], not c["measured"]))
    # A change to a stage that does not bound training gains nothing now; list it anyway
    # when the stage itself gets faster (it will matter once the bound moves).
    others.sort(key=lambda c: -(c.get("stage_speedup") or 0))
    for i, c in enumerate(helping, 1):
        c["rank"] = i
    return helping, others


def figure(x, fmt=None):
    """A figure for humans: images/s get 3 significant digits below 100, none above."""
    if x is None:
        return "-"
    if fmt is None:
        fmt = "{:,.0f}" if abs(x) >= 100 else "{:.1f}" if abs(x) >= 10 else "{:.2f}" if abs(x) >= 1 else "{:.3f}"
    return fmt.format(x)
