#!/usr/bin/env bash
# What a bare GPU machine needs to run llmtop's checks and benchmarks, in ./.whl (ignored):
# the wheels its Python image lacks (llmtop's own deps; torch, pynvml, aiohttp, numpy,
# prometheus-client, uvloop and matplotlib are usually there), and nginx with its
# libraries for proxy_overhead.py / scale_overhead.py.
#
#   bash benchmarks/device_bundle.sh            # here, once (needs pip and /usr/sbin/nginx)
#
# Then, on the device machine (carry .whl):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \
#     && export PYTHONPATH=/tmp/site PATH=$PWD/.whl/nginx/bin:$PATH
#   OUT=$OUT bash benchmarks/gpu_device_run.sh
#   python3 benchmarks/scale_overhead.py --streams 64,256 --duration 4 --modes paced
#   python3 benchmarks/worker_scaling.py --rounds 2      # 1 vs 2 workers, pinned (~2 min)
#
# PYVER (default 3.12) is the device's Python; versions are this checkout's .venv's.
set -eu
PYVER=${PYVER:-3.12}
mkdir -p .whl
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
pkgs="hdrhistogram pbr orjson textual platformdirs mdit-py-plugins linkify-it-py uc-micro-py"
for p in $pkgs; do
    spec=$p  # pinned to this checkout's version where it has the package
    if v=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$p'))" \
            2>/dev/null); then spec="$p==$v"; fi
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
        --platform manylinux1_x86_64 -d .whl "$spec"
done
if [ -x /usr/sbin/nginx ]; then
    mkdir -p .whl/nginx/bin .whl/nginx/lib
    cp /usr/sbin/nginx .whl/nginx/bin/nginx.real
    ldd /usr/sbin/nginx | awk '/=> \// {print $3}' | grep -v -E '/libc\.so|ld-linux' \
        | xargs -I{} cp -L {} .whl/nginx/lib/
    cat > .whl/nginx/bin/nginx <<'EOF'
#!/bin/sh
d=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$d/../lib" exec "$d/nginx.real" "$@"
EOF
    chmod +x .whl/nginx/bin/nginx
fi
du -sh .whl
