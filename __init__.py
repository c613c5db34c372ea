"""stoker: keep the GPU fed.

Pack image folders into WebDataset shards (``stoker pack``), read them with an
NVIDIA DALI pipeline that yields uint8 batches on the device
(:class:`stoker.pipeline.Loader`), and normalize on the GPU
(:class:`stoker.model.Normalize`).
"""

__version__ = "0.1.0"


class StokerError(Exception):
    """Base of every error a user can cause or fix: the message is one line that names the
    file (or value) and what to do. The ``stoker`` command prints it and exits with
    :attr:`exit_code` instead of showing a traceback."""

    #: 2: the request itself is wrong (usage); 1: the request was fine, the data or run is not
    exit_code = 1


__all__ = ["StokerError", "__version__"]
