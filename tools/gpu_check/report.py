"""The GPU check's report: its targets judged, and the markdown ``OUT/gpu_check.md``.

Both work on the check's JSON-ready result (what ``OUT/gpu_check.json`` holds), so a saved
result renders the same.
"""

from __future__ import annotations

#: targets of issue 11, reported as met or not
TARGET_NVJPEG_VS_PIL = 3.0
TARGET_DATA_WAIT = 0.10


def targets(result: dict) -> dict:
    """Each target with what was measured and whether it was met (None: not measured, or a smoke run)."""
    parts = result["parts"]
    ratio = ((parts.get("loader") or {}).get("result") or {}).get("nvjpeg_vs_pil")
    wait = ((parts.get("train") or {}).get("result") or {}).get("data_wait")
    smoke = result["settings"]["smoke"]
    return {
        "nvjpeg_vs_pil": {
            "target": f">= {TARGET_NVJPEG_VS_PIL:g}x",
            "measured": ratio,
            "met": None if ratio is None or smoke else ratio >= TARGET_NVJPEG_VS_PIL,
        },
        "train_data_wait": {
            "target": f"< {TARGET_DATA_WAIT:.0%}",
            "measured": wait,
            "met": None if wait is None or smoke else wait < TARGET_DATA_WAIT,
        },
    }


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
    st = ld.get("nvjpeg_stages")
    if st and "error" in st:
        lines.append(f"\nnvjpeg stages: failed: {st['error']}")
    elif st:
        lines.append(
            f"\nnvjpeg stages, one at a time, synchronized, one thread ({st['batches']} batches on "
            f"{st['device']}): read {_fmt(st['read_img_s'])} img/s, decode {_fmt(st['decode_img_s'])} "
            f"img/s, crop + resize + flip {_fmt(st['crop_resize_img_s'])} img/s"
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
    return [
        "",
        "## Training",
        "",
        f"`{tr['command']}`",
        "",
        f"{tr['steps']} steps in {tr['seconds']:.0f} s: {_fmt(tr['images_per_s'])} images/s, "
        f"data wait {_fmt(tr['data_wait'] and 100 * tr['data_wait'], '{:.1f}')}% of step time "
        "(first log window excluded)",
    ]


def _pytest(pt: dict) -> list[str]:
    return ["", "## pytest -m gpu", "", pt["summary"], *(f"- FAILED {f}" for f in pt["failures"])]


def _targets(judged: dict, smoke: bool) -> list[str]:
    lines = ["", "## Targets", ""]
    for key, label in (("nvjpeg_vs_pil", "nvjpeg vs pil images/s"), ("train_data_wait", "ResNet-50 bf16 data wait")):
        t = judged[key]
        got = (
            "-"
            if t["measured"] is None
            else (f"{t['measured']:.2f}x" if key == "nvjpeg_vs_pil" else f"{100 * t['measured']:.1f}%")
        )
        met = {True: "met", False: "NOT met", None: "not judged (CPU smoke run)" if smoke else "not measured"}[t["met"]]
        lines.append(f"- {label}: target {t['target']}, measured {got}: {met}")
    return lines
