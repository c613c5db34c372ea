"""The ``multilabel`` kind: a set of class indices a sample (``labels.npy``), read as multi-hot rows."""

from __future__ import annotations

import numpy as np

from ..idx import MAX_CLASSES
from .base import (
    Target,
    bad_target,
    encode_labels,
    parse_labels,
)


class MultilabelKind(Target):
    """Any number of classes a sample, stored as their sorted indices (int32 ``(n,)`` ``.npy``)."""

    name, member, task, named_classes, sized = "multilabel", "labels.npy", "multilabel", True, False
    balance_groups = "rarest"

    def encode(self, value):
        return encode_labels(value)

    def meta(self, value, classes):
        return {"classes": [classes[k] for k in value]}

    def decode(self, raws, *, classes, where, split):
        out = np.zeros((len(raws), len(classes)), np.float32)
        for k, raw in enumerate(raws):
            labels = parse_labels(bytes(raw), self.member, len(classes))
            if isinstance(labels, str):
                raise bad_target(where(k), labels, split)
            out[k, labels] = 1.0
        return out

    def check(self, raw, *, num_classes, image_wh=None, names=None):
        value = parse_labels(raw, self.member, num_classes)
        return value if isinstance(value, str) else None

    def index_value(self, raw, *, num_classes, names, width, image_wh):
        labels = parse_labels(raw, self.member, num_classes or MAX_CLASSES)
        return labels if isinstance(labels, str) else int(labels.max(initial=-1))

    def batch_shape(self, n, crop, num_classes):
        return (n, num_classes)


__all__ = ["MultilabelKind"]
