"""Benchmarks a user runs: ``stoker bench`` (:mod:`.loader`: the Loader against the usual
loaders) and ``stoker bench-pack`` (:mod:`.packing`: packing speed); the pipelines they time are
:mod:`.runners`, and the peers' own programs, run by path, :mod:`.peers`. The research benchmarks
(bench-model, gpu-check, scale, ...) are the repository's ``benchmarks/``, outside the wheel."""
