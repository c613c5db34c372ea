"""The ``stoker`` commands, one folder each, each a typed Python function under a thin CLI module.

======================  ==================================================================
``pack/``               ``stoker pack``: scan SRC, sanitize images, write shards, resume, merge
``verify/``             ``stoker verify`` (check shards) and ``stoker index`` (foreign tars)
``bench/``              ``stoker bench`` (loaders), ``bench-pack``; the peers
``diagnose/``           ``stoker diagnose``: loader-, model- or transfer-bound, and what to do
``train.py``            ``stoker train`` (the training itself is :mod:`stoker.model.train`)
``demo.py``             ``stoker demo``: the main job on a generated dataset
``common/``             what several commands share: results, flag values, generated images
``cli.py``              the ``stoker`` entry point: one table of the commands above (and of
                        ``bench-model``, ``gpu-check``: the repository's ``benchmarks/``)
======================  ==================================================================

Each command's module keeps heavy imports (torch, DALI) inside functions, so ``stoker --help``
is instant; the Python functions (:func:`stoker.pack`, :func:`stoker.verify`, ...) are what
the commands call, and what other code calls instead of argv.
"""
