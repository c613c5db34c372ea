"""Make foreign WebDataset shards loadable by stoker: write a DALI .idx next to
each tar and a stoker.json in their folder.

Works on tars written by webdataset's ShardWriter/TarWriter, GNU tar, or anything
with WebDataset's key rule (members sharing a name up to the first dot form one
sample). Keys can be anything; images may be jpg, jpeg or png (what the loader decodes);
labels come from cls members: integers 0 .. 999,999 as text, or class names when --classes
names them (a cls of "dog" with --classes cat,dog is class 1). Other targets are named,
never guessed: --targets float|multilabel|mask with --target-member (the member holding
it: npy, json or text numbers for floats and label lists, a png for masks). Unless --no-check,
every image is decoded once with the Loader's decoders. Samples that do not decode,
lack an image or a label, have a label that is not a class index, or repeat a
component (a.jpg a.cls a.jpg: which label goes with which image is unknowable) are
listed in the manifest under pack.skip as [shard, index, reason] so the loader
leaves them out; members in no sample (directories, links, no extension) are listed
under pack.ignored_members.

On a split that already has a stoker.json (one `stoker pack` wrote, or an earlier
index), its class names and pack settings are kept: re-indexing repairs, never
downgrades. A compressed tar (.tar.gz, ...) must be decompressed first.

When most samples are marked to skip the manifest is still written, but the command exits 1
and says why (a wrong --classes or --target-member usually).

examples:
  stoker index /data/laion-shards/*.tar
  stoker index /data/shards --classes cat,dog,bird
  stoker index /data/shards --targets float --target-member npy
  stoker index /data/seg-shards --targets mask --target-member seg.png --num-classes 21
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from stoker.errors import CheckFailedError, ManifestError, MostSkippedError, NotPackedError, UsageError, arg
from stoker.pipeline.shards.idx import MAX_CLASSES
from stoker.pipeline.shards.kinds import get_kind, kind_names
from stoker.pipeline.shards.manifest import MANIFEST_NAME, Manifest, ShardInfo, iter_skips, write_skips
from stoker.pipeline.shards.packstate import unfinished_pack
from stoker.pipeline.shards.paths import check_path, contents_problem
from stoker.pipeline.shards.table import write_split_table
from stoker.pipeline.shards.targets import IGNORE_INDEX, StatsAccumulator, Target
from stoker.version import __version__

from ..common.results import Result
from .index_shard import index_one
from .shardjobs import ShardJournal, engine_session, journal_at, run_shard_jobs, stamp

#: the folder (in the split's) of a run's journal, removed once the manifest is written
JOURNAL_DIR = ".stoker-index"

HELP = "write .idx files and a stoker.json for foreign WebDataset shards"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "shards", nargs="+", metavar="SHARD", help="tar files, or one folder holding them (all in one folder)"
    )
    p.add_argument(
        "--classes",
        metavar="NAMES",
        help="class names: comma-separated, or @FILE with one per line (default: '0'..'max cls')",
    )
    p.add_argument(
        "--targets",
        choices=kind_names(),
        default=Target().kind,
        help="what the samples' target member holds: class (cls members, default), float, multilabel, mask",
    )
    p.add_argument(
        "--target-member",
        metavar="EXT",
        help="the member holding the target (default: cls; target.npy, labels.npy, mask.png for the other kinds): "
        "npy/json/txt numbers, or a png mask",
    )
    p.add_argument("--num-classes", type=int, metavar="N", help="--targets mask: the mask's classes (values below N)")
    p.add_argument(
        "--ignore-index", type=int, default=IGNORE_INDEX, metavar="V", help="--targets mask: the ignored value (255)"
    )
    p.add_argument("--no-check", action="store_true", help="do not decode the images (faster; nothing is skipped)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes indexing shards in parallel")
    p.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: a process pool on this machine (default); ray: a Ray task per shard (pip install "
        "stoker[ray]) on --ray-address, or on a local Ray with --workers CPUs; the shards must be at the same "
        "path on every node",
    )
    p.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="the Ray cluster to run on (auto, ray://head:10001; default: a local Ray on this machine)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the result as JSON (IndexResult.to_dict())")


def _tars(shards: Sequence[str | Path]) -> list[Path]:
    paths = [Path(s) for s in shards]
    if len(paths) == 1:
        check_path(paths[0], "any")  # missing, or an unfinished pack: the line every command gives
    if len(paths) == 1 and paths[0].is_dir():
        folder = paths[0]
        paths = sorted(folder.glob("*.tar"))
        if not paths and contents_problem(folder):  # images: pack them
            raise NotPackedError(contents_problem(folder))
        if not paths:
            packed = sorted(p.name for p in folder.iterdir() if p.name.endswith(_COMPRESSED_SUFFIXES))
            splits = sorted(p.parent.name for p in folder.glob(f"*/{MANIFEST_NAME}"))
            hint = (
                f" (found {len(packed)} compressed: decompress them first, e.g. gunzip {folder / packed[0]})"
                if packed
                else ""
            )
            if splits and not packed:
                hint = f" (it holds splits: index each one, e.g. stoker index {folder / splits[0]})"
            raise UsageError(f"no .tar files in {shards[0]}{hint}")
    for p in paths:
        if not p.is_file():
            raise UsageError(f"{p} is not a file")
    dirs = {p.resolve().parent for p in paths}
    if len(dirs) > 1:
        raise UsageError("all shards must be in one folder (its stoker.json describes them together)")
    names = [p.name for p in paths]
    if len(set(names)) != len(names):
        raise UsageError("a shard is listed twice")
    return sorted(paths, key=lambda p: p.name)


_COMPRESSED_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst", ".tar.lz4")


def class_names(spec: str | None) -> list[str] | None:
    """The ``--classes`` value as a list: comma-separated names, or ``@FILE`` with one per line."""
    if not spec:
        return None
    if spec.startswith("@"):
        try:
            text = Path(spec[1:]).read_text(encoding="utf-8")
        except OSError as e:
            raise UsageError(f"cannot read {arg('classes')} file {spec[1:]}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise UsageError(f"{arg('classes')} file {spec[1:]} is not UTF-8 text") from None
        names = [line.strip() for line in text.splitlines() if line.strip()]
    else:
        names = [n.strip() for n in spec.split(",") if n.strip()]
    return _checked_classes(names)


def _checked_classes(names: Sequence[str]) -> list[str]:
    names = list(names)
    if not names:
        raise UsageError(f"{arg('classes')} is empty")
    if len(set(names)) != len(names):
        raise UsageError(f"{arg('classes')} names a class twice")
    if len(names) > MAX_CLASSES:
        raise UsageError(f"{arg('classes')} names {len(names):,} classes, more than {MAX_CLASSES:,}")
    return names


def _reason_kind(reason: str) -> str:
    """The part of a skip reason that the summary counts (details follow a colon)."""
    return reason.split(":", 1)[0]


def _previous(folder: Path, tars: list[Path], notes: list[str]) -> Manifest | None:
    """The split's current manifest, if it has a readable one (what a re-index keeps)."""
    if not (folder / MANIFEST_NAME).exists():
        return None
    try:
        m = Manifest.load(folder)
    except ManifestError as e:
        notes.append(f"note: replacing an unreadable manifest ({e})")
        return None
    given = {t.name for t in tars}
    left_out = [s.name for s in m.shards if s.name not in given and (folder / s.name).exists()]
    if left_out:
        raise UsageError(
            f"{folder / MANIFEST_NAME} also lists {', '.join(left_out[:3])}"
            f"{' ...' if len(left_out) > 3 else ''}: index the whole folder "
            f"(`stoker index {folder}`) so the split keeps them"
        )
    gone = [s.name for s in m.shards if s.name not in given and not (folder / s.name).exists()]
    if gone:
        notes.append(
            f"note: {len(gone)} shard(s) listed in the old manifest are gone and left out: "
            f"{', '.join(gone[:3])}{' ...' if len(gone) > 3 else ''}"
        )
    return m


@dataclasses.dataclass
class IndexResult(Result):
    """What :func:`index` wrote.

    Attributes:
        manifest: The stoker.json written.
        shards: How many shards it lists.
        num_samples: Samples in them, skipped ones included.
        classes: The class names (labels index them).
        skip: ``[shard, index, reason]`` for each sample the loader leaves out.
        ignored: ``[shard, member, reason]`` for each tar member in no sample.
        notes: Lines about the previous manifest (replaced as unreadable, shards gone).
        target: The target kind, in words (``"class"``, ``"float, 3 columns"``, ...).
    """

    manifest: Path
    shards: int
    num_samples: int
    classes: list
    skip: list
    ignored: list
    notes: list
    target: str = "class"

    def summary(self) -> str:
        """The lines ``stoker index`` prints on stdout."""
        lines = [
            f"indexed {self.shards} shard(s), {self.num_samples:,} samples, {len(self.classes)} classes "
            f"-> {self.manifest}",
            f"{len(self.skip)} sample(s) marked to skip" + (f" ({_summary(self.skip)})" if self.skip else ""),
        ]
        if self.ignored:
            lines.append(
                f"{len(self.ignored)} tar member(s) in no sample ({_summary(self.ignored)}), "
                "listed in pack.ignored_members"
            )
        lines.append(f"targets: {self.target}")
        return "\n".join(lines)


def index(
    shards: str | Path | Sequence[str | Path],
    *,
    classes: Sequence[str] | None = None,
    check: bool = True,
    workers: int | None = None,
    progress: bool = False,
    targets: str | None = None,
    target_member: str | None = None,
    num_classes: int | None = None,
    ignore_index: int = IGNORE_INDEX,
    engine: str = "local",
    ray_address: str | None = None,
) -> IndexResult:
    """Write a DALI .idx beside each tar, a stoker.json and the split's sample table
    (``stoker.index``) in their folder (see the module doc).

    Shards are indexed in parallel and journaled as each finishes (``.stoker-index/`` in the
    folder): a killed run, rerun with the same arguments, indexes only the shards not done yet.

    Args:
        shards: Tar files (all in one folder), or that folder.
        classes: Class names, label ``i`` naming ``classes[i]`` (None: kept from the split's
            manifest when it has real names, else ``'0'..'max cls'``); a ``cls`` member that is
            one of these names is that class.
        check: Decode every image once; samples that do not decode are skipped.
        workers: Processes indexing shards in parallel (None: the CPU count).
        progress: Show a progress bar on stderr.
        targets: The target kind (``class``, ``float``, ``multilabel``, ``mask``; None: the
            split's manifest's, else ``class``).
        target_member: The member holding the target (None: the kind's packed member, or the
            split's manifest's).
        num_classes: ``mask``: mask values must be below it (or ``ignore_index``).
        ignore_index: ``mask``: the ignored value.
        engine: ``"local"`` (``workers`` processes) or ``"ray"`` (a task per shard on the Ray
            cluster at ``ray_address``, or a local Ray with ``workers`` CPUs; the shards must be
            at the same path on every node).
        ray_address: The Ray cluster (``"auto"``, ``"ray://head:10001"``).

    Returns:
        The :class:`IndexResult`.

    Raises:
        UsageError: A bad path or setting, ``classes`` shorter than the labels, or no sample
            holds the target member (the members they hold are named).
        CheckFailedError: A tar that cannot be indexed, no loadable sample, the manifest cannot
            be written, or most samples were marked to skip (the manifest is written).
        RayError: The Ray cluster cannot be reached, or a task failed (rerun to resume).
    """
    tars = _tars([shards] if isinstance(shards, (str, Path)) else shards)
    unfinished = unfinished_pack(tars[0].parent)  # indexing it would serve only the shards finished so far
    if unfinished:
        raise NotPackedError(unfinished)  # the line every command gives an unfinished pack
    classes = _checked_classes(classes) if classes is not None else None
    workers = (os.cpu_count() or 1) if workers is None else workers
    if workers < 1:
        raise UsageError(f"{arg('workers')} must be >= 1, got {workers}")
    if targets is not None and targets not in kind_names():
        raise UsageError(f"{arg('targets')} {targets!r} must be one of {', '.join(kind_names())}")
    folder = tars[0].parent
    notes: list[str] = []
    previous = _previous(folder, tars, notes)
    spec, discover = _target_spec(previous, targets, target_member, num_classes, ignore_index)
    # a split `stoker pack` wrote (or an earlier index given --classes) keeps its class names:
    # labels index them. Names an earlier index made up ('0'..'N-1') may grow with the data.
    named = previous is not None and previous.classes != [str(i) for i in range(len(previous.classes))]
    found, journal = _index_shards(
        tars,
        check=check,
        bound=len(previous.classes) if classes is None and named else None,
        target=dataclasses.replace(spec, stats=None).to_json(),
        names=classes if classes is not None else (previous.classes if named else None),
        discover=discover,
        engine=engine,
        ray_address=ray_address,
        workers=workers,
        progress=progress,
    )
    if not any(r["seen"] for r in found):
        members = sorted({e for r in found for e in r.get("members", ())})
        raise UsageError(
            f"no sample in {folder} has a {spec.member!r} member"
            + (f" (they hold {', '.join(members)})" if members else "")
            + f": name the target's member with {arg('target_member')}"
        )
    infos = [ShardInfo(**r["info"]) for r in found]
    skip = [[r["info"]["name"], i, why] for r in found for i, why in r["skips"]]
    if not check and previous is not None:
        skip += _carried_skips(folder, previous, infos, skip)
    ignored = [[r["info"]["name"], name, why] for r in found for name, why in r["ignored"]]
    spec = _found_target(folder, found, spec, discover)
    classes = _split_classes(folder, found, spec, classes, previous, named)
    m = _write_split(folder, found, infos, skip, ignored, previous, classes, spec, check)
    journal.remove()
    result = IndexResult(
        manifest=folder / MANIFEST_NAME,
        shards=len(infos),
        num_samples=m.num_samples,
        classes=list(classes),
        skip=skip,
        ignored=ignored,
        notes=notes,
        target=spec.describe(),
    )
    if len(skip) * 2 > m.num_samples:  # written, but a run on a fraction of the data is no success
        raise MostSkippedError(
            f"{len(skip):,} of {m.num_samples:,} samples of {folder} are marked to skip ({_summary(skip)}); "
            f"{MANIFEST_NAME} is written, but check the data and the arguments ({arg('classes')} with the names "
            f"the tars use, {arg('targets')}, {arg('target_member')})",
            result,
        )
    return result


def _index_shards(
    tars: list[Path], *, check, bound, target, names, discover, engine, ray_address, workers, progress
) -> tuple[list[dict], ShardJournal]:
    """:func:`~.index_shard.index_one` of every shard, in parallel, and the journal that holds their
    results (a rerun with the same settings indexes only the shards not done yet)."""
    folder = tars[0].parent
    jobs = [(str(t), check, bound, target, names, discover) for t in tars]
    # the journal holds results of these settings only: another run's is started over
    settings = {"stoker": __version__, "check": check, "bound": bound, "target": target, "names": names}
    journal = journal_at(folder, JOURNAL_DIR, {**settings, "discover": discover})
    with engine_session(engine, ray_address, workers):
        found = run_shard_jobs(
            index_one,
            jobs,
            [t.name for t in tars],
            [stamp(t) for t in tars],
            journal=journal,
            engine=engine,
            workers=workers,
            progress=progress,
            desc="index",
            what="indexing",
        )
    return found, journal


def _found_target(folder: Path, found: list[dict], spec: Target, discover: bool) -> Target:
    """The split's target as the shards found it: its width (``discover``: the data's) and its
    statistics, merged from the shards'."""
    if discover:
        widths = sorted({r["width"] for r in found if r["width"]})
        if len(widths) > 1:
            raise UsageError(f"the float targets of {folder} have {' and '.join(map(str, widths))} values per sample")
        spec = spec.resized(widths[0] if widths else 1)
    return dataclasses.replace(spec, stats=_merged_stats(found, spec))


def _split_classes(folder: Path, found: list[dict], spec: Target, classes, previous, named: bool) -> list[str]:
    """The split's class names: ``classes`` (which must name every label found), else the previous
    manifest's real names, else ``'0'..'max label'``; a kind without named classes: its declared
    classes' numbers (a mask's), else none."""
    max_label = max(r["max_label"] for r in found)
    if classes is not None and max_label >= len(classes):
        shard = next(r["info"]["name"] for r in found if r["max_label"] == max_label)
        raise UsageError(
            f"{folder / shard} has a cls of {max_label} but {arg('classes')} names only {len(classes)} classes"
        )
    if classes is None:
        grown = max(max_label + 1, len(previous.classes) if previous else 0)
        classes = previous.classes if named else [str(i) for i in range(grown)]
        if not spec.named_classes:
            classes = [str(i) for i in range(spec.num_classes)] if spec.num_classes else []
    return classes


def _write_split(folder, found, infos, skip, ignored, previous, classes, spec, check) -> Manifest:
    """Write the split's manifest (its skips beside it past the inline limit) and sample table;
    the run's journal goes."""
    pack = dict(previous.pack) if previous else {}
    # verify holds packed shards to pack's rules (RGB JPEGs) and foreign ones to the loader's
    pack["reindexed_by" if previous and "indexed_by" not in pack else "indexed_by"] = f"stoker {__version__}"
    exts = set().union(*(r["exts"] for r in found))
    pack.update(image_exts=sorted(exts), checked=check, ignored_members=ignored)
    total = sum(s.num_samples for s in infos)
    if total - len(skip) <= 0:
        raise CheckFailedError(f"no loadable samples in {folder}: {_summary(skip)}; nothing written to {MANIFEST_NAME}")
    try:
        write_skips(folder, pack, skip)  # in the manifest, or past INLINE_SKIPS in a file of their own
        m = Manifest(num_samples=total, classes=classes, shards=infos, pack=pack, target=spec)
        m.save(folder)
        write_split_table(folder, m)
    except OSError as e:  # the old manifest, if any, is left as it was (atomic write)
        raise CheckFailedError(f"cannot write {e.filename or folder / MANIFEST_NAME}: {e.strerror or e}") from None
    return m


def _merged_stats(found: list[dict], spec: Target):
    """The split's target statistics (of a kind that keeps them), merged from the shards'."""
    states = [r["stats"] for r in found if r.get("stats")]
    acc = spec.accumulator()
    if acc is None or not states:
        return None
    for state in states:
        acc.merge(StatsAccumulator.from_state(state))
    return acc.result(spec.ignore_index)


def _target_spec(previous, targets, member, num_classes, ignore_index) -> tuple[Target, bool]:
    """``(target, discover_width)``: the split's target, the flags' (as its kind reads them), else
    what its manifest already says, else a class; a float target the flags name has the width of
    the data."""
    if targets is None and member is None and num_classes is None and previous is not None:
        return previous.target, False
    kind = get_kind(targets or (previous.target.kind if previous is not None else Target().kind))
    return kind.from_flags(member=member, num_classes=num_classes, ignore_index=ignore_index)


def main(args: argparse.Namespace) -> int:
    try:
        result = index(
            args.shards,
            classes=class_names(args.classes),
            check=not args.no_check,
            workers=args.workers,
            progress=not args.quiet,
            # the default kind, alone, keeps what the split's manifest says
            targets=None if args.targets == Target().kind and args.target_member is None else args.targets,
            target_member=args.target_member,
            num_classes=args.num_classes,
            ignore_index=args.ignore_index,
            engine=args.engine,
            ray_address=args.ray_address,
        )
    except MostSkippedError as e:  # written: its summary, then the error
        print(json.dumps(e.result.to_dict(), indent=1, default=str) if args.json else e.result.summary())
        raise
    for line in result.notes:
        print(line, file=sys.stderr)
    print(json.dumps(result.to_dict(), indent=1, default=str) if args.json else result.summary())
    return 0


def _summary(entries: list) -> str:
    reasons = collections.Counter(_reason_kind(e[-1]) for e in entries)
    return ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))


def _carried_skips(folder: Path, previous: Manifest, shards: list[ShardInfo], skip: list) -> list:
    """With --no-check, the decode skips an earlier index found in shards that did not change."""
    same = {s.name for s in shards} & {
        s.name for s in previous.shards if s.sha256 == next((t.sha256 for t in shards if t.name == s.name), None)
    }
    have = {(e[0], e[1]) for e in skip}
    out = []
    for e in iter_skips(folder, previous):
        if isinstance(e, (list, tuple)) and len(e) in (2, 3) and e[0] in same and (e[0], e[1]) not in have:
            out.append([e[0], int(e[1]), e[2] if len(e) == 3 else "skipped by an earlier index"])
    return out
