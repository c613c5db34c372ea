"""stoker: keep the GPU fed.

Pack image folders into WebDataset shards (``stoker pack``), read them with an
NVIDIA DALI pipeline that yields uint8 batches on the device
(:class:`stoker.pipeline.Loader`), and normalize on the GPU
(:class:`stoker.model.Normalize`).
"""

__version__ = "0.1.0"
