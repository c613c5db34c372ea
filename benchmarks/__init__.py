"""Research benchmarks, run from a checkout of the repository (the wheel leaves this folder out).

Each is ``python -m stoker.benchmarks.<name>`` with a ``main()``: :mod:`.model` (``stoker
bench-model``: the model alone), :mod:`.gpu_check` (``stoker gpu-check``: the prepared GPU
measurement), :mod:`.scale` (the billion-sample simulation), :mod:`.accuracy` (time to accuracy),
:mod:`.frameworks` (Lightning, Accelerate, a plain loop), :mod:`.kinds` (the target kinds),
:mod:`.augment_cost` (the GPU augmentations' cost), :mod:`.pixel_stages` (where the pixel
tier's time goes), :mod:`.mix_balance` (exact mixes and balance against weighted samplers),
:mod:`.box_cost` (what a box batch adds) and
:mod:`.buckets` (aspect-ratio buckets against square batches). The user commands they build on (``stoker bench``,
``bench-pack``) and their pipelines, :mod:`stoker.tools.bench`, stay in the wheel.
"""
