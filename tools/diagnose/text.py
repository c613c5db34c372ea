"""The human text of a ``stoker diagnose`` report (what the command prints without --json)."""

from __future__ import annotations

from .report import figure, untrusted


def _header_lines(rep: dict) -> list[str]:
    s, env = rep["settings"], rep["environment"]
    pil = env["pillow"]
    simd = "pillow-simd active" if pil["simd"] else "plain Pillow, not pillow-simd"
    per = f"at least {s['seconds']:g} s" + (
        f" and {s['min_steps']} steps (at most {s['max_seconds']:g} s)" if "min_steps" in s else ""
    )
    lines = [
        f"stoker diagnose — batch {s['batch_size']}, crop {s['crop']}, device {s['device']}, each measurement {per}",
    ]
    fit = s.get("batch_fit") or {}
    if fit.get("why"):
        lines.append(f"  ({fit['why']})")
    lines += [
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


def _steps(n, what: str = "step") -> str:
    return f"{n} {what}{'' if n == 1 else 'es' if what.endswith('h') else 's'}"


def _quality(r: dict) -> str:
    """``, ±3%`` (the spread across windows), then the caveat of a figure advice may not rest on."""
    if r.get("trust") == "noisy":  # its caveat gives the spread
        return f" — {untrusted(r)}"
    out = f", ±{r['spread']:.0%}" if r.get("spread") is not None else ""
    return out + (f" — {untrusted(r)}" if untrusted(r) else "")


def _measured_lines(rep: dict) -> list[str]:
    s, ld, mr, e2e, tr = (rep[k] for k in ("settings", "loader", "model", "end_to_end", "transfer"))
    lines = [
        "",
        "measured (images/s; ± is half the spread of the rates over the measurement's windows)",
        f"  {'loader alone':<30}{figure(ld['images_per_s']):>9}   ({_steps(ld['batches'], 'batch')}, "
        f"{ld['dtype']} {'x'.join(map(str, ld['batch_shape']))} on {ld['device']}{_quality(ld)})",
    ]
    for alt in rep.get("loader_alternatives", []):
        lines.append(
            f"  {'loader: ' + alt.get('label', alt['id']):<30}{figure(alt['result']['images_per_s']):>9}   "
            f"({_steps(alt['result']['batches'], 'batch')}{_quality(alt['result'])})"
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
            lines.append(f"  {label:<30}{figure(r['images_per_s']):>9}   ({_steps(r['steps'])}{_quality(r)})")
        else:
            lines.append(f"  {label:<30}{'-':>9}   {r['error'] if r.get('error') else r.get('why', '')}")
    lines.append(
        f"  {'end to end, loader + model':<30}{figure(e2e['images_per_s']):>9}   "
        f"(data wait {e2e['data_wait_fraction']:.0%} of {e2e['seconds']:.1f} s, {_steps(e2e.get('steps'))}"
        f"{_quality(e2e)})"
    )
    lines.append(
        f"  host→device per batch: {tr['bytes_uint8'] / 1e6:,.1f} MB as uint8, "
        f"{tr['bytes_float32'] / 1e6:,.1f} MB as float32"
        + (
            f"; copies {figure(tr['uint8_images_per_s'])} vs {figure(tr['float32_images_per_s'])} img/s"
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
        f"{figure(au['flops_per_image'] and au['flops_per_image'] / 1e9, '{:.2f}')} GFLOPs forward per image",
        f"  {'largest layers':<34} {'kind':<14} {'params':>11} {'share':>6} {'GFLOPs':>7}",
    ]
    for la in au["layers"][:5]:
        mark = "  <-- holds most parameters" if au["dominant"] and la["name"] == au["dominant"]["name"] else ""
        lines.append(
            f"  {(la['name'] or '(root)')[:34]:<34} {la['kind'][:14]:<14} {la['params']:>11,} "
            f"{la['param_share']:>6.1%} {figure(la['flops'] and la['flops'] / 1e9, '{:7.3f}'):>7}{mark}"
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
    reliable = v.get("reliable", True)
    head = f"({v['ratio']:.1f}x)" if reliable else "— not settled: too few or too noisy figures, no speed-up claims"
    lines = ["", f"verdict: {v['label'].upper()} {head}", f"  {v['text']}", ""]
    if not reliable and not rep["next_steps"]:
        need = rep["settings"].get("settle_seconds")
        longer = f"--seconds {need:g} settles the model's" if need else "measure longer: --seconds"
        lines.append(f"next steps: none ranked until the figures are settled ({longer})")
    elif rep["next_steps"]:
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
    unranked = [c for c in rep["not_helping"] if c.get("unranked")]
    if unranked:
        lines += ["", "not ranked (the figures they rest on are too few or too noisy to advise on)"]
        for c in unranked:
            how = "measured" if c["measured"] else "estimate"
            lines.append(f"  - {c['title']}: {c['unranked']} ({how}: {c['basis']})")
            if c.get("action"):
                lines.append(f"       {c['action']}")
    others = [c for c in rep["not_helping"] if not c.get("unranked")]
    if others:
        lines += ["", f"no gain now (the {v['bound']} bounds training, or the change is slower)"]
        for c in others:
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
