"""Programs the benchmarks run in another interpreter, by file path.

Each module here imports nothing from stoker (only the standard library and what its peer
needs), so it runs under a python that has only that peer installed, e.g. stock Pillow +
webdataset for ``plain_pack``, or ffcv for ``ffcv_bench``. They are linted and tested like
the rest of the package and are importable as ``stoker.tools.bench.peers.*`` too.
"""
