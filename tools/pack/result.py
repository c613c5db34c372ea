"""What ``stoker pack`` reports: :class:`PackResult` (its ``summary()`` is the command's output)
and the errors a finished or failed pack raises."""

from __future__ import annotations

import dataclasses

from ..common.results import Result
from .journal import REJECTS_NAME


@dataclasses.dataclass
class PackResult(Result):
    """What :func:`~stoker.tools.pack.api.pack` or :func:`~stoker.tools.pack.api.merge_parts` did; :meth:`summary`
    is what ``stoker pack`` prints.

    Attributes:
        out: OUT, a folder or a URL.
        inputs: Inputs that were to be packed, all splits (files the scan rejected not counted).
        splits: Per split, what OUT holds: ``samples`` packed, inputs ``rejected`` (listed in
            rejects.jsonl), ``skipped`` (not images), ``shards``, ``bytes``. Empty after a part
            (``parts > 1``): the merge writes the manifests.
        run: Per split, what this run did: ``packed``, ``rejected``, ``copied`` (stored byte for
            byte), ``resized`` (stored smaller, re-encoded), ``shards`` and ``bytes`` written,
            ``restored`` (damaged shards rebuilt). Empty after a merge.
        seconds: This run, scan included.
        part: The part packed, of ``parts`` (1: the whole list).
        up_to_date: OUT already held this pack; nothing was written.
        targets: What the samples' targets are, in words (``"class, 6 classes"``,
            ``"float, 1 column (age: mean 47.2, std 17.9, 18..80)"``, ``"mask, 21 classes, 255 ignored"``).
        targets_found: Masks: the values the masks hold (``"classes 0..20 found"``).
        hidden: Hidden folders of SRC left out (``.ipynb_checkpoints/``, ``rings/.thumbs/``),
            relative to SRC: never packed, named in the summary. Empty after a merge.
        val_only: The classes with val images but no train image (a split list, a val/ folder of
            their own): no model trained on train/ learns them; named in :meth:`notes`.
        found_label: What the ``targets_found`` line starts with (``masks``, ``boxes``).
        scan_notes: What the scan of SRC has to say (a test split left out, images without a
            label file): printed by :meth:`notes`.
    """

    out: str
    inputs: int
    splits: dict
    run: dict
    seconds: float
    part: int = 0
    parts: int = 1
    up_to_date: bool = False
    targets: str = ""
    targets_found: str = ""
    hidden: list = dataclasses.field(default_factory=list)
    val_only: list = dataclasses.field(default_factory=list)
    found_label: str = "masks"
    scan_notes: list = dataclasses.field(default_factory=list)
    #: how images were stored: ``short_side``, ``max_side``, ``quality`` (for the ``stored:`` line)
    image_settings: dict = dataclasses.field(default_factory=dict)

    @property
    def packed(self) -> int:
        """Samples in OUT, all splits."""
        return sum(t["samples"] for t in self.splits.values())

    @property
    def rejected(self) -> int:
        """Inputs listed in rejects.jsonl, all splits."""
        return sum(t["rejected"] for t in self.splits.values())

    @property
    def restored(self) -> int:
        """Shards this run rebuilt or uploaded again (deleted or damaged since they were written)."""
        return sum(r["restored"] for r in self.run.values())

    def notes(self) -> list[str]:
        """The lines ``stoker pack`` prints on stderr: shards restored, splits left empty."""
        lines = [f"restored {self.restored} missing or damaged shard(s) of {self.out}"] if self.restored else []
        if not self.up_to_date:
            lines += [f"note: {line}" for line in self.scan_notes]
        if self.val_only and not self.up_to_date:
            lines.append(self.val_only_line())
        if self.up_to_date or self.parts > 1 or not self.packed:  # nothing packed: the pack's error says why
            return lines
        for split, t in self.splits.items():  # never an empty split without a word
            if not t["samples"]:
                why = f"all {t['rejected']:,} inputs were rejected" if t["rejected"] else "it has no input images"
                lines.append(f"note: {split}/ holds no samples: {why}")
        return lines

    def val_only_line(self) -> str:
        """``note: 2 classes are in val/ only (no train image, so never learnt): cat, dog`` (the
        first 5 named)."""
        n = len(self.val_only)
        more = f", and {n - 5:,} more" if n > 5 else ""
        return (
            f"note: {n:,} class{'es are' if n != 1 else ' is'} in val/ only (no train image, so never learnt): "
            f"{', '.join(self.val_only[:5])}{more}"
        )

    def stored_line(self) -> str:
        """``stored: 812 resized to a shorter side of 256 px and re-encoded at quality 90, 120
        re-encoded at quality 90 without resizing, 68 copied byte for byte; --short-side 0 keeps the
        original sizes``: what this run did to the images it packed, and the flags that keep their
        sizes when any was resized (a JPEG that every decoder reads alike is then copied as it is)."""
        count = {k: sum(r.get(k, 0) for r in self.run.values()) for k in ("packed", "copied", "resized")}
        resized, copied = count["resized"], count["copied"]
        reencoded = count["packed"] - copied - resized
        quality = self.image_settings.get("quality")
        at = f" at quality {quality}" if quality else ""
        limits = [
            f"a {name} side of {px} px"
            for name, px in (
                ("shorter", self.image_settings.get("short_side")),
                ("longer", self.image_settings.get("max_side")),
            )
            if px
        ]
        parts = []
        if resized:
            parts.append(f"{resized:,} resized to {' or '.join(limits) or 'fit'} and re-encoded{at}")
        if reencoded:
            parts.append(f"{reencoded:,} re-encoded{at} without resizing")
        if copied or not parts:
            parts.append(f"{copied:,} copied byte for byte")
        hint = ""
        if resized:
            flags = " ".join(
                f"--{n} 0" for n in ("short-side", "max-side") if self.image_settings.get(n.replace("-", "_"))
            )
            hint = f"; {flags} keeps the original sizes"
        return "stored: " + ", ".join(parts) + hint

    def no_val_line(self) -> str:
        """The line of a pack without a val split: what that means for training, and how to add one."""
        return (
            "val: none, a train split only: `stoker train` trains without validation (no val figures, no "
            "best.pt); for a val split pack again into a new OUT with --val-fraction 0.1 (or give a train/ + val/ tree)"
        )

    def hidden_line(self) -> str:
        """``left out 2 hidden folders: .git/, rings/.thumbs/`` (the first 5 named), or ""."""
        if not self.hidden:
            return ""
        n = len(self.hidden)
        more = f", and {n - 5:,} more" if n > 5 else ""
        return f"left out {n:,} hidden folder{'s' if n != 1 else ''}: {', '.join(self.hidden[:5])}{more}"

    def summary(self) -> str:
        """The lines ``stoker pack`` prints on stdout."""
        if self.up_to_date:
            return f"{self.out} is up to date ({self.inputs:,} inputs, nothing to do)"
        hidden = [self.hidden_line()] if self.hidden else []
        if self.parts > 1:
            where = f"{self.part}/{self.parts}"
            return "\n".join(
                [
                    f"{split} part {where}: {r['packed']:,} packed, {r['rejected']:,} rejected, "
                    f"{r['shards']} shards this run"
                    for split, r in self.run.items()
                ]
                + hidden
                + [
                    f"part {where} done in {self.seconds:.1f} s; when every part is done: "
                    f"stoker pack --merge {self.out}"
                ]
            )
        lines = [f"{'split':6} {'packed':>9} {'rejected':>9} {'skipped':>8} {'shards':>7} {'bytes':>14}"]
        lines += [
            f"{split:6} {t['samples']:>9,} {t['rejected']:>9,} {t['skipped']:>8,} {t['shards']:>7,} {t['bytes']:>14,}"
            for split, t in self.splits.items()
        ]
        if self.targets:
            lines.append(f"targets: {self.targets}")
        if self.targets_found:  # right under the targets line: what the packed targets hold
            lines.append(f"{self.found_label}: {self.targets_found}")
        if "train" in self.splits and "val" not in self.splits:
            lines.append(self.no_val_line())
        lines += hidden
        if self.run:  # not after a merge
            n = sum(r["packed"] + r["rejected"] for r in self.run.values())
            rate = n / self.seconds if self.seconds > 0 else 0.0
            lines.append(f"this run: {n:,} images in {self.seconds:.1f} s ({rate:,.0f} images/s)")
            lines.append(self.stored_line())
        if self.rejected:
            lines.append(f"{self.rejected:,} rejected inputs listed in {self.out.rstrip('/')}/{REJECTS_NAME}")
        return "\n".join(lines)
