"""The GPU check's report: its targets judged, and the markdown ``OUT/gpu_check.md``.

Both work on the check's JSON-ready result (what ``OUT/gpu_check.json`` holds), so a saved
result renders the same.
"""

from __future__ import annotations

#: targets of issue 20 (the loader alone, and ResNet-50 training), reported as met or not
TARGET_NVJPEG_VS_PIL = 3.0
TARGET_NVJPEG_IMG_S = 20_000.0
TARGET_DATA_WAIT = 0.03
#: issue 28: the decoded-pixel tier on one H200, crop 224 (the better of its RGB and YUV 4:2:0 rows)
TARGET_PIXELS_IMG_S = 45_000.0

#: target key -> (label, format of the measured value)
LABELS = {
    "nvjpeg_vs_pil": ("nvjpeg vs pil images/s", "{:.2f}x"),
    "nvjpeg_img_s": ("nvjpeg loader alone", "{:,.0f} img/s"),
    "pixels_img_s": ("pixel tier, warm", "{:,.0f} img/s"),
    "train_data_wait": ("ResNet-50 bf16 data wait", "{:.1%}"),
    "train_data_wait_compiled": ("ResNet-50 bf16 compiled data wait", "{:.1%}"),
}


def targets(result: dict) -> dict:
    """Each target with what was measured and whether it was met (None: not measured, or a smoke run)."""
    parts = result["parts"]
    loader = (parts.get("loader") or {}).get("result") or {}
    train = (parts.get("train") or {}).get("result") or {}
    smoke = result["settings"]["smoke"]
    measured = {
        "nvjpeg_vs_pil": (loader.get("nvjpeg_vs_pil"), f">= {TARGET_NVJPEG_VS_PIL:g}x", TARGET_NVJPEG_VS_PIL, True),
        "nvjpeg_img_s": (
            ((loader.get("rows") or {}).get("nvjpeg") or {}).get("img_s"),
            f">= {TARGET_NVJPEG_IMG_S:,.0f} img/s",
            TARGET_NVJPEG_IMG_S,
            True,
        ),
        "pixels_img_s": (
            max(
                (r.get("img_s") or 0 for k, r in (loader.get("rows") or {}).items() if k.startswith("pixels-")),
                default=0,
            )
            or None,
            f">= {TARGET_PIXELS_IMG_S:,.0f} img/s",
            TARGET_PIXELS_IMG_S,
            True,
        ),
        "train_data_wait": (train.get("data_wait"), f"< {TARGET_DATA_WAIT:.0%}", TARGET_DATA_WAIT, False),
        "train_data_wait_compiled": (
            (train.get("compiled") or {}).get("data_wait"),
            f"< {TARGET_DATA_WAIT:.0%}",
            TARGET_DATA_WAIT,
            False,
        ),
    }
    out = {}
    for key, (value, target, bound, at_least) in measured.items():
        met = None if value is None or smoke else (value >= bound if at_least else value < bound)
        out[key] = {"target": target, "measured": value, "met": met}
    return out


def _fmt(x: float | None, spec: str = "{:,.0f}") -> str:
    return "-" if x is None else spec.format(x)


def _result(parts: dict, name: str) -> dict | None:
    """What part ``name`` finished (None: not run, or nothing finished)."""
    return (parts.get(name) or {}).get("result")


def format_markdown(result: dict) -> str:
    """The report as markdown: environment, part status, loader, model, train, tests, targets."""
    parts = result["parts"]
    smoke = result["settings"]["smoke"]
    lines = _environment(_result(parts, "environment") or {}, smoke)
    lines += ["", "| part | status | seconds | note |", "|---|---|---:|---|"]
    for name, rec in parts.items():
        note = rec.get("why") or rec.get("error") or ""
        lines.append(f"| {name} | {rec['status']} | {rec.get('seconds', 0):.0f} | {note.replace('|', '/')} |")
    for name, section in (("loader", _loader), ("bench-model", _bench_model), ("train", _train), ("pytest", _pytest)):
        if _result(parts, name):
            lines += section(_result(parts, name))
    return "\n".join(lines + _targets(result["targets"], smoke)) + "\n"


def _environment(env: dict, smoke: bool) -> list[str]:
    lines = [f"# stoker GPU check, {env.get('date', '?')}: {env.get('gpu') or 'no GPU'}", ""]
    if smoke:
        lines += ["**CPU smoke run: miniature sizes, no figure here means anything.**", ""]
    lines.append(
        f"torch {env.get('torch', '?')}, torchvision {env.get('torchvision', '?')}, CUDA "
        f"{env.get('cuda_version') or '-'}, DALI {'installed' if env.get('dali') else 'not installed'}, "
        f"{env.get('usable_cores', '?')} CPU cores; Loader backend `auto` here: "
        f"**{env.get('auto_backend', '?')}** ({env.get('auto_backend_why', '?')})"
    )
    if env.get("decoders"):
        shown = ", ".join(f"{n} {'yes' if ok else 'no'}" for n, (ok, _) in env["decoders"].items())
        lines.append(
            f"\nnvjpeg decoders here: {shown}; `auto` picks **{env.get('auto_decoder', '?')}** "
            f"({env.get('auto_decoder_why', '?')}); stream priorities (least, greatest): "
            f"{env.get('stream_priorities') or '-'}"
        )
    missing = [m for m, v in (env.get("modules") or {}).items() if v is None]
    if missing:
        lines.append(f"\nnot installed here: {', '.join(missing)}")
    return lines


def _loader(ld: dict) -> list[str]:
    lines = [
        "",
        f"## Loader: batch {ld['batch_size']}, crop {ld['crop']}, train augmentation, batches on {ld['device']}",
        "",
        "| backend | images/s | vs pil | CPU % | GPU fallbacks | note |",
        "|---|---:|---:|---:|---:|---|",
    ]
    pil = (ld["rows"].get("pil") or {}).get("img_s")
    for b, r in ld["rows"].items():
        note = r.get("skipped") or r.get("error") or ""
        ratio = _fmt(r["img_s"] / pil, "{:.2f}x") if r.get("img_s") and pil else "-"
        lines.append(
            f"| {b} | {_fmt(r.get('img_s'))} | {ratio} | {_fmt(r.get('cpu_pct'))} | "
            f"{_fmt(r.get('gpu_fallbacks'), '{}')} | {note.replace('|', '/')} |"
        )
    for b, r in ld["rows"].items():
        if r.get("fill_img_s"):
            lines.append(
                f"\n{b}: filling epoch {_fmt(r['fill_img_s'])} img/s; warm {_fmt(r.get('img_s'))} img/s; "
                f"store {_fmt(r.get('store_bytes', 0) / 1e6)} MB"
            )
    nv = ld["rows"].get("nvjpeg") or {}
    if nv.get("decoder"):
        lines.append(f"\nnvjpeg row: decoder {nv['decoder']} ({nv.get('decoder_why', '?')}){_overlap(nv)}")
    lines += _variants(ld.get("variants") or [], nv.get("img_s"))
    st = ld.get("nvjpeg_stages")
    if st and "error" in st:
        lines.append(f"\nnvjpeg stages: failed: {st['error']}")
    elif st:
        where = st["device"] + (f", {st['decoder']}" if st.get("decoder") else "")
        lines.append(
            f"\nnvjpeg stages, one at a time, synchronized, one thread ({st['batches']} batches on {where}): "
            f"read {_fmt(st['read_img_s'])} img/s, decode {_fmt(st['decode_img_s'])} img/s, "
            f"crop + resize + flip {_fmt(st['crop_resize_img_s'])} img/s"
        )
    return lines


def _overlap(r: dict) -> str:
    """``; stages busy ... s over ... s wall (overlap x)`` of a row with stage seconds."""
    st, ratio = r.get("stages"), r.get("overlap_ratio")
    if not st:
        return ""
    return (
        f"; stages read {st['read_s']:.1f} s, decode {st['decode_s']:.1f} s, crop + resize "
        f"{st['crop_resize_s']:.1f} s over {st['wall_s']:.1f} s wall (overlap {_fmt(ratio, '{:.2f}')})"
    )


def _variants(rows: list, base: float | None) -> list[str]:
    """The nvjpeg variants table (each decoder, overlap off, hardware share, region decode off)."""
    if not rows:
        return []
    lines = [
        "",
        "| nvjpeg variant | decoder | images/s | vs nvjpeg row | overlap (stages / wall) | GPU fallbacks | note |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        note = (r.get("skipped") or r.get("error") or "").replace("|", "/")
        ratio = _fmt(r["img_s"] / base, "{:.2f}x") if r.get("img_s") and base else "-"
        lines.append(
            f"| {r['label']} | {r.get('decoder') or '-'} | {_fmt(r.get('img_s'))} | {ratio} | "
            f"{_fmt(r.get('overlap_ratio'), '{:.2f}')} | {_fmt(r.get('gpu_fallbacks'), '{}')} | {note} |"
        )
    return lines


def _bench_model(bm: dict) -> list[str]:
    lines = [
        "",
        f"## Model alone (`stoker bench-model`): batch {bm['batch_size']} x {bm['image_size']}px "
        "synthetic uint8, forward + backward + SGD step",
        "",
        "| model | amp | channels_last | compile | images/s | ms/step | vs fp32 |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for r in bm["rows"]:
        head = (
            f"| {r['model']} | {r['amp']} | {'yes' if r['channels_last'] else 'no'} | "
            f"{'yes' if r['compile'] else 'no'} |"
        )
        if "error" in r:
            lines.append(f"{head} failed: {r['error'][:100].replace('|', '/')} | | |")
        else:
            lines.append(
                f"{head} {_fmt(r['images_per_s'])} | {r['step_ms']:.1f} | {_fmt(r.get('speedup'), '{:.2f}x')} |"
            )
    if bm["not_run"]:
        lines.append(
            f"\nnot run (time box): {len(bm['not_run'])} setting(s): "
            + ", ".join(
                f"{r['model']} {r['amp']}{' cl' if r['channels_last'] else ''}{' compile' if r['compile'] else ''}"
                for r in bm["not_run"]
            )
        )
    return lines


def _train(tr: dict) -> list[str]:
    lines = ["", "## Training"]
    for run in (tr, tr.get("compiled")):
        if not run:
            continue
        if "command" not in run:  # the compiled run: skipped or failed
            lines += ["", f"compiled: {run.get('skipped') or run.get('error')}"]
            continue
        lines += [
            "",
            f"`{run['command']}`",
            "",
            f"{run['steps']} steps in {run['seconds']:.0f} s: {_fmt(run['images_per_s'])} images/s, "
            f"data wait {_fmt(run['data_wait'] and 100 * run['data_wait'], '{:.1f}')}% of step time "
            "(first log window excluded)",
        ]
    return lines


def _pytest(pt: dict) -> list[str]:
    return ["", "## pytest -m gpu", "", pt["summary"], *(f"- FAILED {f}" for f in pt["failures"])]


def _targets(judged: dict, smoke: bool) -> list[str]:
    lines = ["", "## Targets", ""]
    for key, (label, spec) in LABELS.items():
        t = judged.get(key)
        if t is None:  # a result saved before this target existed
            continue
        got = "-" if t["measured"] is None else spec.format(t["measured"])
        met = {True: "met", False: "NOT met", None: "not judged (CPU smoke run)" if smoke else "not measured"}[t["met"]]
        lines.append(f"- {label}: target {t['target']}, measured {got}: {met}")
    return lines
