"""What ``stoker pack`` reads: pack sources as readers in one registry.

=================  ======================================================================
``base``           :class:`SourceReader` (what a reader says: name, recognition, scan, read),
                   :class:`Item`, :class:`Scan`, :class:`Source`, :class:`SourceOptions`,
                   :class:`Job` and :func:`sanitize_item` (a worker's input, read and sanitized)
``registry``       :func:`register_reader`, :func:`scan` (the reader, split lists, val split,
                   shuffle), auto-detection by priority
``walk``           the folder walk the folder readers share (symlinks, loops, rejects)
``folder``         an ImageFolder tree
``trainval``       a ``train/`` + ``val/`` tree
``csvlist``        a CSV/TSV of ``path,label`` or ``path,values`` rows
``masktree``       images and a parallel mask tree (``--masks``)
``coco``           COCO JSON boxes in the layouts tools export (Label Studio, FiftyOne, Roboflow, CVAT)
``yolo``           YOLO boxes: ``images/`` + ``labels/``, or Ultralytics' ``data.yaml``
``detection``      what the box readers share (frames, splits, refusals), and Pascal VOC
=================  ======================================================================
"""

from .base import (
    MAX_LABEL,
    SPLITS,
    FileReader,
    Item,
    Job,
    Scan,
    Source,
    SourceOptions,
    SourceReader,
    display_path,
    sanitize_item,
)
from .registry import choose_reader, reader_names, readers, register_reader, scan

__all__ = [
    "MAX_LABEL",
    "SPLITS",
    "FileReader",
    "Item",
    "Job",
    "Scan",
    "Source",
    "SourceOptions",
    "SourceReader",
    "choose_reader",
    "display_path",
    "reader_names",
    "readers",
    "register_reader",
    "sanitize_item",
    "scan",
]
