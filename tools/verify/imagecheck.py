"""Decode images the way the Loader does and say which fail (``stoker verify`` and ``stoker index``
check every image with it): the Loader's header guard, pillow, and DALI's CPU decoder when installed."""

from __future__ import annotations

import contextlib
import io
import os

from stoker.pipeline.deps import HAS_DALI


def decode_check(data: bytes, *, require_rgb: bool = True) -> str | None:
    """None when ``data`` decodes completely with pillow as the pil backend decodes it
    (to an RGB image, if ``require_rgb``), else what is wrong."""
    from PIL import Image

    from stoker.pipeline.imagedecode import DAMAGED_INPUT

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            if require_rgb and im.mode not in ("RGB", "L"):
                return f"mode {im.mode}, not RGB or grayscale"
            if im.mode != "RGB":
                im.convert("RGB")  # what the pil backend does with L, P, LA, CMYK ...
    except DAMAGED_INPUT as e:  # a damaged image is a finding; a bug raises
        return f"does not decode with pillow: {str(e).strip() or type(e).__name__}"
    return None


@contextlib.contextmanager
def _quiet_stderr():
    """Silence native writes to fd 2 (DALI's image parser logs each bad image there)."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class ImageChecker:
    """Decode images the way the Loader does and say which fail: the Loader's header guard
    (:func:`~stoker.pipeline.shards.samples.image_size`), then pillow (the pil backend), then DALI's
    CPU decoder when DALI is installed (a small CPU-only pipeline fed in batches).

    Args:
        require_rgb: a packed shard must hold RGB images; foreign ones only need to decode.
        dali: use DALI (default: when installed).
        batch_size: images per DALI run.
    """

    def __init__(self, *, require_rgb: bool = True, dali: bool | None = None, batch_size: int = 32):
        self.require_rgb, self.batch_size = require_rgb, batch_size
        self.dali = HAS_DALI if dali is None else dali
        self._pipe = None
        self._feed: list = []

    def check(self, datas: list[bytes]) -> list[str | None]:
        """One entry per image: None when every decoder reads it, else why not."""
        from stoker.pipeline.shards.samples import image_size

        out: list[str | None] = []
        for data in datas:
            if image_size(data) is None:
                out.append(
                    "fails the loader's header check (truncated, not a JPEG/PNG, or a JPEG kind "
                    "the decoders do not read)"
                )
            else:
                out.append(decode_check(data, require_rgb=self.require_rgb))
        if self.dali:
            todo = [k for k, why in enumerate(out) if why is None]
            for s in range(0, len(todo), self.batch_size):
                part = todo[s : s + self.batch_size]
                for k, why in zip(part, self._dali_check([datas[k] for k in part]), strict=True):
                    out[k] = why
        return out

    def _build(self):
        from nvidia.dali import fn, pipeline_def, types

        @pipeline_def(batch_size=self.batch_size, num_threads=1, device_id=None, prefetch_queue_depth=1)
        def decode_graph():
            encoded = fn.external_source(source=lambda: self._feed, batch=True, dtype=types.UINT8)
            return fn.decoders.image(encoded, device="cpu", output_type=types.RGB)

        pipe = decode_graph()
        pipe.build()
        return pipe

    def _run(self, datas: list[bytes]) -> None:
        import numpy as np

        if self._pipe is None:
            self._pipe = self._build()
        self._feed = [np.frombuffer(d, np.uint8) for d in datas]
        ran = False
        try:
            with _quiet_stderr():
                self._pipe.run()
            ran = True
        finally:
            if not ran:
                self._pipe = None  # a DALI pipeline is unusable after an error: rebuild it

    def _dali_check(self, datas: list[bytes]) -> list[str | None]:
        from stoker.pipeline.imagedecode import NATIVE_DECODE_ERRORS, native_bug

        try:
            self._run(datas)
            return [None] * len(datas)
        except NATIVE_DECODE_ERRORS as e:  # find the failing image(s) one by one
            if native_bug(e):
                raise
        out: list[str | None] = []
        for data in datas:
            try:
                self._run([data])
                out.append(None)
            except NATIVE_DECODE_ERRORS as e:
                if native_bug(e):
                    raise
                lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and "pipeline" not in ln.lower()]
                out.append(f"does not decode with DALI: {(lines[-1] if lines else type(e).__name__)[:120]}")
        return out
