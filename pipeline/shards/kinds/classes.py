"""The ``class`` kind: a class index a sample, stored as text (``cls``)."""

from __future__ import annotations

import numpy as np

from ..idx import MAX_CLS_BYTES, parse_label
from .base import (
    Target,
    bad_target,
)


class ClassKind(Target):
    """A class index a sample, stored as text (``b"3"``; a class name when ``stoker index --classes``
    names them)."""

    name, member, task, named_classes, dtype, format, sized = "class", "cls", "classify", True, "int64", 1, False
    balance_groups = "label"
    max_bytes = MAX_CLS_BYTES

    def encode(self, value):
        return str(int(value)).encode()

    def meta(self, value, classes):
        return {"class": classes[int(value)]}

    def decode(self, raws, *, classes, where, split):
        names = None  # made only for a class stored by name: most splits store indices
        out = np.empty(len(raws), np.int64)
        for k, raw in enumerate(raws):
            text = bytes(raw).strip() if len(raw) <= MAX_CLS_BYTES else b"x"
            if not text.isdigit() and names is None:
                names = {c.encode("utf-8", "surrogateescape"): i for i, c in enumerate(classes)}
            try:
                out[k] = int(text) if text.isdigit() else names.get(text, -1)
            except ValueError:  # digits Python will not convert (e.g. too long)
                out[k] = -1
        bad = (out < 0) | (out >= len(classes))
        if bad.any():
            k = int(np.argmax(bad))
            text = bytes(raws[k][:MAX_CLS_BYTES]).decode("utf-8", "replace")
            raise bad_target(where(k), f"cls {text!r} is not a class index below {len(classes)}", split)
        return out

    def check(self, raw, *, num_classes, image_wh=None, names=None):
        value = parse_label(raw, num_classes or None, names)
        return value if isinstance(value, str) else None

    def missing(self):
        return "no cls label"

    def oversize(self, size):
        return f"cls is not an integer: {size:,} bytes"

    def index_value(self, raw, *, num_classes, names, width, image_wh):
        return parse_label(raw, num_classes, names)  # a name: what --classes names


__all__ = ["ClassKind"]
