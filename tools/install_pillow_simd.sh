#!/usr/bin/env bash
# Replace pillow with pillow-simd built from source (both provide the PIL module).
# pillow-simd's SIMD resize and libjpeg-turbo decode make `stoker pack` and the pil
# backend faster. When it cannot be built, pillow stays and we say so in one line.
set -u
PY=${1:-.venv/bin/python}

is_simd() { "$PY" -m pip show -q pillow-simd >/dev/null 2>&1 && "$PY" -c "import PIL.Image" 2>/dev/null; }
if is_simd && ! "$PY" -m pip show -q pillow >/dev/null 2>&1; then
    exit 0
fi

# Build headers: JPEG (libjpeg-turbo), zlib (PNG), WebP. Installed when we may.
missing=""
for pkg in libjpeg-dev zlib1g-dev libwebp-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"
done
if [ -n "$missing" ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing) >/dev/null 2>&1 \
        || echo "stoker: could not install$missing; pillow-simd may lack some formats"
fi

cc="cc"
grep -q avx2 /proc/cpuinfo 2>/dev/null && cc="cc -mavx2"
"$PY" -m pip uninstall -q -y pillow pillow-simd >/dev/null 2>&1
if CC="$cc" "$PY" -m pip install -q --no-cache-dir --no-binary pillow-simd pillow-simd; then
    "$PY" - <<'PY'
from PIL import features, __version__
have = [f for f in ("jpg", "zlib", "webp") if features.check(f)]
lack = [f for f in ("jpg", "zlib", "webp") if not features.check(f)]
print(f"stoker: pillow-simd {__version__} active (formats: {', '.join(have)}"
      + (f"; missing: {', '.join(lack)})" if lack else ")"))
PY
else
    echo "stoker: pillow-simd could not be built here; using pillow (same results, slower resize)"
    "$PY" -m pip install -q pillow
fi
