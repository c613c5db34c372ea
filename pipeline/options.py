"""The Loader's option objects: each owns its settings and checks them when it is made.

=====================  ===========================================  ==============================
object                 holds                                        ``Loader(...)`` argument
=====================  ===========================================  ==============================
:class:`Dali`,         the decode backend and its own knobs          ``backend=`` (a name means the
:class:`Nvjpeg`,       (``decode``, ``cpu_resize``, ``decoder``,     object with defaults)
:class:`Pil`,          ``hw_load``), and what every backend takes
:class:`Auto`          (``threads``, ``prefetch``, ``channels``,
                       ``channels_last``)
:class:`Order`         ``shuffle``, ``block_shards``, ``drop_last``  ``shuffle=``
:class:`Storage`       a URL's ``storage_options``, ``cache_dir``,   ``storage=``
                       ``cache_limit``; ``sha256`` checks
:class:`Augmentation`  ``augment`` and ``mixing`` of train batches   ``augment=``
``CropSpec``           ``scale``, ``ratio``, ``crop_pct``,           ``crop=``
                       ``val_resize`` (:mod:`.augment`)
=====================  ===========================================  ==============================

Each field is also a keyword of the Loader (``Loader(path, threads=4, cache_dir=...)``, the
spelling of the docs and examples): :func:`loader_options` hands it to the object that owns it. A
bad value is a one-line :class:`~stoker.errors.ArgumentError` naming it, raised when the object is
made; a keyword that moved names its new home.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, NamedTuple, get_args

from stoker.errors import ArgumentError

from .augment import CropSpec
from .backends import Backend, get_backend, resolve_backend
from .dataloader_compat import habit_message
from .fsutil import PathLike

ShuffleName = Literal["global", "block"]
DecodeName = Literal["auto", "mixed", "cpu"]
DecoderName = Literal["auto", "nvimgcodec", "torchcodec", "torchvision"]
CpuResizeName = Literal["pillow", "dali"]
#: the built-in ``backend=`` names (a backend registered by name is one too)
BackendName = Literal["auto", "dali", "nvjpeg", "pil"]


def check_choice(name: str, value: Any, literal: Any) -> None:
    """``value`` must be one of the strings of ``literal`` (a ``Literal[...]``), else a one-line
    ArgumentError naming ``name`` and the choices."""
    allowed = get_args(literal)
    if isinstance(value, bool) or value not in allowed:
        raise ArgumentError(f"{name}={value!r} must be one of {allowed}")


def _positive_int(name: str, value: Any, *, zero: bool = False, none: bool = False) -> None:
    if none and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < (0 if zero else 1):
        raise ArgumentError(f"{name}={value!r} must be a {'non-negative' if zero else 'positive'} integer")


def _share(name: str, value: Any) -> None:
    try:
        ok = 0.0 <= float(value) <= 1.0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ArgumentError(f"{name}={value!r} must be in [0, 1]")


# ---- the decode backend ------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class BackendOptions:
    """What every decode backend takes (the base of :class:`Dali`, :class:`Nvjpeg`, :class:`Pil`,
    :class:`Auto`).

    Attributes:
        decode: ``"mixed"`` (GPU decode), ``"cpu"``, or ``"auto"``: mixed where the backend can
            decode on a CUDA device (DALI: mixed or cpu; nvjpeg: mixed only; pil: cpu only).
        threads: DALI threads / pillow worker processes / decoder threads (default: usable cores;
            0 runs pillow in-process).
        prefetch: batches prepared ahead (DALI ``prefetch_queue_depth``, pillow ``prefetch_factor``).
        channels: 3 (RGB) or 1 (grayscale: ``[N, 1, H, W]``, the decoder's own luma).
        channels_last: images in ``torch.channels_last`` memory format (the shape stays NCHW).
    """

    name: ClassVar[str] = ""
    decode: DecodeName = "auto"
    threads: int | None = None
    prefetch: int = 2
    channels: int = 3
    channels_last: bool = False

    def __post_init__(self) -> None:
        check_choice("decode", self.decode, DecodeName)
        _positive_int("threads", self.threads, zero=True, none=True)
        _positive_int("prefetch", self.prefetch)
        if self.channels not in (1, 3) or isinstance(self.channels, bool):
            raise ArgumentError(f"channels={self.channels!r} must be 3 (RGB) or 1 (grayscale)")

    # what a backend without a knob of its own gives the runners (DecodeSettings' fields)
    decoder: ClassVar[str] = "auto"
    cpu_resize: ClassVar[str] = "pillow"
    hw_load: ClassVar[float] = 0.65

    def registry_backend(self) -> str | Backend:
        """What :func:`~.backends.resolve_backend` is asked for: a name or a configured backend."""
        return self.name

    def resolve(self, device: Any) -> Resolved:
        """This backend on ``device`` (a ``torch.device``): the registry's backend, why it was
        chosen, and ``decode`` resolved (``"mixed"`` or ``"cpu"``); a backend that cannot run here
        is a one-line ArgumentError naming the fix."""
        backend, reason = resolve_backend(self.registry_backend(), device, decoder=self.decoder)
        return Resolved(self, backend, reason, backend.resolve_decode(self.decode, device))

    def knobs(self) -> dict:
        """The backend knobs every runner reads from its settings."""
        return {
            "decode": self.decode,
            "decoder": self.decoder,
            "cpu_resize": self.cpu_resize,
            "hw_decoder_load": float(self.hw_load),
        }


@dataclass(frozen=True, kw_only=True)
class Dali(BackendOptions):
    """``backend="dali"``: NVIDIA DALI, GPU (mixed) decode on CUDA, its CPU graph otherwise.

    Attributes:
        decode: ``"mixed"`` (nvJPEG + hardware decoder, GPU resize), ``"cpu"``, or ``"auto"``
            (mixed when the device is CUDA).
        cpu_resize: with CPU decode, resize with ``"pillow"`` (pillow-simd, default: measured ~2x
            faster here) or ``"dali"`` (``fn.resize`` inside the graph).
        hw_load: share of JPEGs for the hardware decoder (``decode="mixed"``).
    """

    name: ClassVar[str] = "dali"
    cpu_resize: CpuResizeName = "pillow"
    hw_load: float = 0.65

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("cpu_resize", self.cpu_resize, CpuResizeName)
        _share("hw_load", self.hw_load)


@dataclass(frozen=True, kw_only=True)
class Nvjpeg(BackendOptions):
    """``backend="nvjpeg"``: batched GPU JPEG decode without DALI (decodes on the GPU only).

    Attributes:
        decoder: ``"nvimgcodec"`` (hardware decoder and region decode), ``"torchcodec"``,
            ``"torchvision"``, or ``"auto"``: the first whose probe decode works on the device
            (:func:`stoker.pipeline.backends.decoders.resolve_decoder`).
        hw_load: nvImageCodec's hardware decoder share of a batch.
        overlap: read + decode the next batch in a thread of its own (default: on).
        region: decode only the crop boxes' regions where the decoder can (default: on).
        stage_sync: synchronize each stage's stream at its end (for measuring).
    """

    name: ClassVar[str] = "nvjpeg"
    decoder: DecoderName = "auto"
    hw_load: float = 0.65
    overlap: bool | None = None
    region: bool | None = None
    stage_sync: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("decoder", self.decoder, DecoderName)
        _share("hw_load", self.hw_load)

    def registry_backend(self) -> str | Backend:
        runner = {k: getattr(self, k) for k in ("overlap", "region") if getattr(self, k) is not None}
        if self.stage_sync:
            runner["stage_sync"] = True
        return get_backend(self.name, **runner) if runner else self.name


@dataclass(frozen=True, kw_only=True)
class Pil(BackendOptions):
    """``backend="pil"``: pillow(-simd) in worker processes (``threads``; 0: in-process)."""

    name: ClassVar[str] = "pil"


@dataclass(frozen=True, kw_only=True)
class Auto(BackendOptions):
    """``backend="auto"``: DALI when installed, else nvjpeg on a CUDA device where a GPU JPEG
    decoder works, else pil (:func:`~.backends.resolve_backend`); the knobs go to the one chosen.

    Attributes:
        decoder: as :class:`Nvjpeg`'s (it also decides whether nvjpeg can run here).
        cpu_resize, hw_load: as :class:`Dali`'s.
    """

    name: ClassVar[str] = "auto"
    decoder: DecoderName = "auto"
    cpu_resize: CpuResizeName = "pillow"
    hw_load: float = 0.65

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("decoder", self.decoder, DecoderName)
        check_choice("cpu_resize", self.cpu_resize, CpuResizeName)
        _share("hw_load", self.hw_load)


@dataclass(frozen=True, kw_only=True)
class Registered(BackendOptions):
    """A backend of the registry that has no option object of its own: a name registered with
    :func:`~.backends.register_backend`, or a configured one (``get_backend("nvjpeg", overlap=False)``)."""

    backend: str | Backend = ""

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.backend if isinstance(self.backend, str) else self.backend.name

    def registry_backend(self) -> str | Backend:
        return self.backend


_BY_NAME: dict[str, type[BackendOptions]] = {c.name: c for c in (Dali, Nvjpeg, Pil, Auto)}


def backend_options(backend: Any) -> BackendOptions:
    """``backend=`` as an option object: a name is its object with defaults."""
    if isinstance(backend, BackendOptions):
        return backend
    if isinstance(backend, str) and backend in _BY_NAME:
        return _BY_NAME[backend]()
    if isinstance(backend, Backend):
        return Registered(backend=backend)
    if isinstance(backend, str):
        from .backends import backend_names

        if backend not in backend_names():
            raise ArgumentError(f"backend={backend!r} must be one of {backend_names()}")
        return Registered(backend=backend)
    raise ArgumentError(f"backend={backend!r} must be a name, Dali(...), Nvjpeg(...), Pil() or Auto(...)")


def backend_for(name: str, **knobs: Any) -> BackendOptions:
    """The option object of backend ``name`` with those of ``knobs`` it has (what a command line's
    ``--backend``, ``--decode`` and ``--decoder`` become; the others do not apply to it)."""
    cls = _BY_NAME.get(name)
    if cls is None:
        return dataclasses.replace(backend_options(name), **_fields_of(Registered, knobs))
    return cls(**_fields_of(cls, knobs))


def _fields_of(cls: type, values: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in values.items() if k in names}


class Resolved(NamedTuple):
    """A backend option object on a device: ``options`` (as given), the registry's ``backend``,
    the ``reason`` it was chosen, and ``decode`` resolved."""

    options: BackendOptions
    backend: Backend
    reason: str
    decode: str


# ---- the order, the split source, the train recipe ---------------------------------------
@dataclass(frozen=True)
class Order:
    """This rank's sample order (:mod:`.order`).

    Attributes:
        shuffle: the sampling policy (:mod:`.policies`; a registered one by its name too).
            ``"global"`` (default): a fresh permutation of the whole split each epoch; a URL's
            whole split is cached before the first batch. ``"block"``: each epoch permutes the
            shards, gives each rank a contiguous run of them (ranks share at most the one shard at
            each boundary) and permutes samples within windows of ``block_shards`` shards; a URL's
            next window is fetched while the current one trains, so each node downloads only its
            share and keeps two windows.
        block_shards: shards per window with ``shuffle="block"``.
        drop_last: drop this rank's incomplete last batch; default ``True`` for train (every rank
            and every step has ``batch_size`` samples), ``False`` for val (every sample once).
    """

    shuffle: ShuffleName | str = "global"
    block_shards: int = 4
    drop_last: bool | None = None

    def __post_init__(self) -> None:
        if isinstance(self.shuffle, bool):  # a DataLoader habit: the order is ours, not a flag
            raise ArgumentError(habit_message({"shuffle": self.shuffle}))
        from .policies import policy_names

        if self.shuffle not in policy_names("shuffle"):  # the built-in orders and any registered one
            raise ArgumentError(f"shuffle={self.shuffle!r} must be one of {policy_names('shuffle')}")
        _positive_int("block_shards", self.block_shards)


@dataclass(frozen=True)
class Storage:
    """Where a split's shards come from and how they are checked.

    Attributes:
        storage_options: fsspec options for a URL (``{"endpoint_url": ..., "anon": True}``);
            credentials otherwise come the ecosystem's way (``AWS_*`` environment variables).
        cache_dir: the local cache of a URL (default ``~/.cache/stoker/shards/<hash of URL>``);
            processes of one node may share it (file locks: each shard is fetched once).
        cache_limit: bytes of shards the cache keeps (least recently used evicted; never a shard
            the current or next window needs). Needs ``shuffle="block"`` unless the whole split fits.
        sha256: verify every local shard's checksum before the first batch (reads all data; a
            URL's shards are always checked as they are fetched).
    """

    storage_options: dict | None = None
    cache_dir: PathLike | None = None
    cache_limit: int | None = None
    sha256: bool = False

    def __post_init__(self) -> None:
        if self.cache_limit is not None and (
            not isinstance(self.cache_limit, int) or isinstance(self.cache_limit, bool) or self.cache_limit < 1
        ):
            raise ArgumentError(f"cache_limit={self.cache_limit!r} must be a positive number of bytes")

    def check_local(self, path: Any) -> None:
        """A local split takes no URL option: the first one given is named."""
        for k in ("storage_options", "cache_dir", "cache_limit"):
            if getattr(self, k) is not None:
                raise ArgumentError(f"{k}= is for a URL (s3://, gs://, https://, file://); {path} is a local path")


#: the fields of a :class:`Source` that are a URL's storage options (each overrides the Loader's)
SOURCE_STORAGE = ("storage_options", "cache_dir", "cache_limit")


@dataclass(frozen=True)
class Source:
    """One split of a Loader, with its own options: ``Loader([Source(url, weight=0.3,
    cache_dir=...), "local/train"], ...)``. A plain path or URL is the short form of
    ``Source(path)``.

    Attributes:
        path: a split directory or its fsspec URL.
        weight: its proportion of a mix (any number >= 0; 0 leaves the split out, saying so).
            ``None``: the Loader's ``weights=``, or the split's size when no split has one.
        storage_options, cache_dir, cache_limit: this URL split's (:class:`Storage`), in place
            of the Loader's; a local path takes none (one line naming it).
    """

    path: PathLike
    weight: float | None = None
    storage_options: dict | None = None
    cache_dir: PathLike | None = None
    cache_limit: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, os.PathLike)):
            raise ArgumentError(f"Source({self.path!r}): the path must be a split directory or its URL")
        w = self.weight
        if w is not None and (isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w < float("inf")):
            raise ArgumentError(f"Source({self.path}, weight={w!r}): a weight must be a finite number >= 0")
        Storage(cache_limit=self.cache_limit)  # its checks

    @classmethod
    def of(cls, value: Any) -> Source:
        """``value`` as a Source (a path or URL is ``Source(value)``)."""
        return value if isinstance(value, Source) else cls(value)

    def storage(self, base: Storage) -> Storage:
        """``base`` with this split's own storage options in place of the Loader's."""
        own = {k: getattr(self, k) for k in SOURCE_STORAGE if getattr(self, k) is not None}
        return dataclasses.replace(base, **own) if own else base

    def own_storage(self) -> tuple[str, ...]:
        """The storage options this split was given itself."""
        return tuple(k for k in SOURCE_STORAGE if getattr(self, k) is not None)


@dataclass(frozen=True)
class Augmentation:
    """Per-sample augmentation of train batches on their device (:mod:`.augment`).

    Attributes:
        augment: after the crop and flip: a transform (``build_augment(...)``,
            ``RandAugment(...)``) or a policy name as timm and torchvision name them
            (``"rand-m9-mstd0.5-inc1"``, ``"ta_wide"``, ``"original"``). Each sample's parameters
            come from ``(seed, epoch, sample)``: the same on every backend and batch size, and
            after a resume. Masks move with the geometric ops.
        mixing: MixUp/CutMix (``build_mixing(...)``): the targets become soft, float32
            ``[N, classes]``; class splits only.
    """

    augment: Any = None
    mixing: Any = None

    def __post_init__(self) -> None:
        if self.augment is not None and not isinstance(self.augment, str) and not callable(self.augment):
            raise ArgumentError(
                f"augment={self.augment!r} must be a transform of stoker.pipeline.augment or a policy name"
            )

    def recipe(self, *, train: bool, index: Any, path: Any) -> Any:
        """The train recipe of a Loader of ``path`` over ``index`` (:class:`~.augment.apply.TrainRecipe`;
        a setting that cannot apply to the split is a one-line ArgumentError)."""
        from .augment.apply import TrainRecipe

        classes = len(index.manifest.classes)
        return TrainRecipe.of(
            self.augment, self.mixing, train=train, target=index.target, num_classes=classes, path=path
        )


def resized(crops: CropSpec, crop: Any) -> CropSpec:
    """``crops`` at a new output size ``crop`` (a side, ``(height, width)``, or a whole
    :class:`~.augment.CropSpec`): the train crop's scale and ratio and the val resize rule stay."""
    if isinstance(crop, CropSpec):
        return crop
    return CropSpec.of(
        tuple(crop) if isinstance(crop, list) else crop,
        scale=crops.scale,
        ratio=crops.ratio,
        crop_pct=None if crops.val_resize is not None else crops.crop_pct,
        val_resize=crops.val_resize,
        val_fit=crops.val_fit,
        train_fit=crops.train_fit,
        jitter=crops.jitter,
    )


# ---- the Loader's keywords, each to the object that owns it -------------------------------
#: keywords that moved into an option object -> the spelling to use now
MOVED = {
    "decode": "backend=Dali(decode=...) (every backend option takes decode=; Auto(decode=...) lets the Loader choose)",
    "decoder": "backend=Nvjpeg(decoder=...) (or Auto(decoder=...))",
    "hw_decoder_load": "backend=Nvjpeg(hw_load=...) or Dali(hw_load=...)",
    "cpu_resize": "backend=Dali(cpu_resize=...)",
}
_CROP_KEYS = ("scale", "ratio", "crop_pct", "val_resize")
_BACKEND_KEYS = ("threads", "prefetch", "channels", "channels_last")


class LoaderOptions(NamedTuple):
    """A Loader's arguments as the objects that own them."""

    crops: CropSpec
    backend: BackendOptions
    order: Order
    storage: Storage
    augmentation: Augmentation


def loader_options(
    *, crop: Any, backend: Any, shuffle: Any, storage: Any, augment: Any, keywords: dict
) -> LoaderOptions:
    """The Loader's option objects from its arguments and its other ``keywords`` (each a field of
    one object). A DataLoader argument, a moved keyword or a keyword given both alone and inside
    its object is one line naming what to pass instead."""
    moved = [k for k in keywords if k in MOVED]
    if moved:
        k = moved[0]
        raise ArgumentError(f"Loader({k}=...) moved: pass {MOVED[k]} (from stoker.pipeline.options)")
    owners = {
        **dict.fromkeys(_CROP_KEYS, "crop"),
        **dict.fromkeys(_BACKEND_KEYS, "backend"),
        **{f.name: "shuffle" for f in dataclasses.fields(Order) if f.name != "shuffle"},
        **{f.name: "storage" for f in dataclasses.fields(Storage)},
        "mixing": "augment",
    }
    other = {k: v for k, v in keywords.items() if k not in owners}
    if other:
        raise ArgumentError(habit_message(other))
    by = {o: {k: v for k, v in keywords.items() if owners.get(k) == o} for o in set(owners.values())}

    if isinstance(crop, CropSpec):
        if by["crop"]:
            raise ArgumentError("crop= is a whole CropSpec: give scale=, ratio=, crop_pct=, val_resize= in it")
        crops = crop
    else:
        crops = CropSpec.of(crop, **by["crop"])
    return LoaderOptions(
        crops,
        _with(backend_options(backend), by["backend"], "backend"),
        _with(shuffle if isinstance(shuffle, Order) else Order(shuffle), by["shuffle"], "shuffle"),
        _with(storage if storage is not None else Storage(), by["storage"], "storage"),
        _with(augment if isinstance(augment, Augmentation) else Augmentation(augment), by["augment"], "augment"),
    )


def _with(obj: Any, values: dict, arg: str) -> Any:
    """``obj`` with ``values`` (keywords the Loader was given alone); one also set in ``obj`` to
    something else is refused."""
    for k, v in values.items():
        mine = getattr(obj, k)
        default = next(f.default for f in dataclasses.fields(obj) if f.name == k)
        if mine != default and mine != v:
            raise ArgumentError(f"{k}={v!r} and {arg}={obj!r} disagree: give {k}= once")
    return dataclasses.replace(obj, **values) if values else obj


__all__ = [
    "Augmentation",
    "Auto",
    "BackendName",
    "BackendOptions",
    "CpuResizeName",
    "Dali",
    "DecodeName",
    "DecoderName",
    "LoaderOptions",
    "MOVED",
    "Nvjpeg",
    "Order",
    "Pil",
    "Registered",
    "Resolved",
    "ShuffleName",
    "Source",
    "Storage",
    "backend_for",
    "backend_options",
    "check_choice",
    "loader_options",
    "resized",
]
