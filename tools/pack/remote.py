"""``stoker pack`` to a URL OUT (s3://, gs://, any fsspec URL): the shards are built in a
local staging folder and uploaded one by one as each is finished; the manifests go last."""

from __future__ import annotations

from pathlib import Path

from stoker.pipeline.shards.manifest import MANIFEST_NAME, idx_path
from stoker.pipeline.storage import Store

from .journal import REJECTS_NAME, local_shard_ok


class Remote:
    """OUT is a URL: shards are built in the local staging folder (which holds the journal
    and the locks), uploaded as each is finished and then removed from staging; the
    manifests are uploaded last. Uploads are atomic for readers (see ``Store.put_file``).

    One upload runs in a background thread while the next shard is being built, so the
    workers do not wait on the network; its error surfaces at the next :meth:`publish`
    or :meth:`flush`.
    """

    def __init__(self, store: Store, staging: Path):
        from concurrent.futures import ThreadPoolExecutor

        self.store, self.staging = store, staging
        self.listing: dict[str, dict[str, int]] = {}
        self._uploader = ThreadPoolExecutor(1, thread_name_prefix="stoker-upload")
        self._pending = None

    def publish(self, split_dir: Path, name: str) -> None:
        """Upload a finished, journaled shard and its index (in the background), then drop them from staging."""
        self.flush()
        self._pending = self._uploader.submit(self._upload, split_dir, name)

    def flush(self) -> None:
        """Wait for the upload in flight; raises its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _upload(self, split_dir: Path, name: str) -> None:
        tar = split_dir / name
        # the index goes up first: a shard under its final name always has its index
        self.store.put_file(idx_path(tar), f"{split_dir.name}/{idx_path(tar).name}")
        self.store.put_file(tar, f"{split_dir.name}/{name}")
        tar.unlink()
        idx_path(tar).unlink()

    def _ok(self, sizes: dict[str, int], name: str, size: int) -> bool:
        return sizes.get(name) == size and sizes.get(name[: -len(".tar")] + ".idx", 0) > 0

    def check(self, split_dir: Path, records: list[dict], start: int) -> tuple[list[tuple[int, int, dict]], list[str]]:
        """Journaled shards not in place remotely: ``(to rebuild, to upload from staging)``.
        One listing per split; a shard counts as in place when its size is the journaled one
        and its ``.idx`` is there (object stores write whole objects or none)."""
        sizes = self.store.sizes(split_dir.name)
        rebuild, upload, first = [], [], start
        for r in records:
            info = r.get("shard")
            if info:
                tar = split_dir / info["name"]
                if self._ok(sizes, info["name"], info["bytes"]):
                    tar.unlink(missing_ok=True)  # uploaded just before a kill: the staged copy is done with
                    idx_path(tar).unlink(missing_ok=True)
                elif local_shard_ok(tar, info["bytes"]):
                    upload.append(info["name"])
                else:
                    rebuild.append((first, r["end"], info))
            first = r["end"]
        return rebuild, upload

    def shard_ok(self, split: str, name: str, size: int) -> bool:
        if split not in self.listing:
            self.listing[split] = self.store.sizes(split)
        return self._ok(self.listing[split], name, size)

    def manifests_match(self, out: Path, splits: list[str]) -> bool:
        """The uploaded rejects.jsonl and manifests equal the staged ones."""
        names = [REJECTS_NAME] + [f"{s}/{MANIFEST_NAME}" for s in splits]
        return all(self.store.read_bytes(n) == (out / n).read_bytes() for n in names)

    def publish_manifests(self, out: Path, splits: list[str]) -> None:
        """Upload rejects.jsonl, then each split's stoker.json: the manifests last."""
        self.store.put_file(out / REJECTS_NAME, REJECTS_NAME)
        for split in splits:
            self.store.put_file(out / split / MANIFEST_NAME, f"{split}/{MANIFEST_NAME}")
