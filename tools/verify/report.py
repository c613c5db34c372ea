"""What ``stoker verify`` found: a report per shard (:class:`ShardReport`) and the whole run's
(:class:`VerifyResult`), with the table and lines the command prints."""

from __future__ import annotations

from dataclasses import dataclass, field

#: a target member past this is not read whole (a mask of 64 MiB is damage, not data)
from stoker.pipeline.shards.kinds import MAX_TARGET_BYTES  # noqa: E402 - named here too

from ..common.results import Result


@dataclass
class ShardReport:
    """What :func:`~.command.verify_shard` (or ``--sample``) found in one shard."""

    split: str
    name: str
    samples: int = 0
    bytes: int = 0
    sha_ok: bool | None = False  # None: not checked (--sample)
    idx_ok: bool | None = False
    decoded: int = 0
    bad: int = 0
    skipped: int = 0
    problems: list[str] = field(default_factory=list)


@dataclass
class VerifyResult(Result):
    """What :func:`verify` found; ``stoker verify`` prints :meth:`table`, then :meth:`problem_lines`
    and :meth:`failure` (exit 1) or :meth:`summary`.

    Attributes:
        path: The folder or URL checked.
        shards: One :class:`ShardReport` per shard, split by split.
        ok: No shard has a problem.
    """

    path: str
    shards: list[ShardReport]
    ok: bool

    @property
    def problems(self) -> list[str]:
        """Every problem found, each naming its shard (and sample)."""
        return [p for r in self.shards for p in r.problems]

    def table(self) -> str:
        """One row per shard: samples, bytes, sha256 and .idx ok (``-``: not checked, with
        ``--sample``), images decoded, bad, skipped."""
        w = max([len(f"{r.split}/{r.name}") for r in self.shards] + [5])
        lines = [
            f"{'shard':{w}} {'samples':>8} {'bytes':>13} {'sha256':>6} {'idx':>4} {'decoded':>8} {'bad':>5} {'skip':>5}"
        ]
        lines += [
            f"{r.split + '/' + r.name:{w}} {r.samples:>8,} {r.bytes:>13,} {_mark(r.sha_ok):>6} "
            f"{_mark(r.idx_ok):>4} {r.decoded:>8,} {r.bad:>5,} {r.skipped:>5,}"
            for r in self.shards
        ]
        return "\n".join(lines)

    def summary(self) -> str:
        """The closing line of a clean check."""
        return (
            f"ok: {len(self.shards)} shards, {sum(r.samples for r in self.shards):,} samples, "
            f"{sum(r.decoded for r in self.shards):,} images decoded"
        )

    def problem_lines(self, limit: int = 50) -> list[str]:
        """The first ``limit`` problems, indented, and how many more."""
        problems = self.problems
        more = [f"  ... and {len(problems) - limit} more"] if len(problems) > limit else []
        return [f"  {p}" for p in problems[:limit]] + more

    def failure(self) -> str:
        """One line: how many problems in how many shards, and the first."""
        problems = self.problems
        bad = len({(r.split, r.name) for r in self.shards if r.problems})
        return f"{len(problems)} problem(s) in {bad} shard(s); first: {problems[0]}" if problems else ""


def _mark(ok: bool | None) -> str:
    return "-" if ok is None else "ok" if ok else "BAD"


__all__ = ["MAX_TARGET_BYTES", "ShardReport", "VerifyResult"]
