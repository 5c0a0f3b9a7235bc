#!/usr/bin/env bash
# llmtop's NVML path on a real NVIDIA GPU, end to end, in about two minutes:
#
#   1. benchmarks/gpu_check.py: the sampler's readings while torch runs matmul and copies;
#   2. the simulated H200 engine behind a 2-worker proxy sampling NVML, driven by
#      `llmtop bench` while torch keeps the GPU busy; a TUI screenshot taken from the admin
#      API mid-run, the snapshot and /metrics saved, the recording reported.
#
#   OUT=/tmp/gpu-out bash benchmarks/gpu_device_run.sh
#
# The README's screenshots/tui-h200.svg is $OUT/tui-h200.svg from a run on an H200.
#
# Needs python3 with torch (CUDA) and llmtop's dependencies importable (PY= to choose
# another interpreter; benchmarks/device_bundle.sh gathers the wheels a bare GPU image
# lacks). Writes at most 8 files to $OUT (the device tool's limit). Always
# exits 0 once it has run: it reports, it does not gate. A dry run without a GPU:
#   PY=.venv/bin/python GPU_SOURCE=sim OUT=/tmp/gpu-dry bash benchmarks/gpu_device_run.sh
set -u
OUT=${OUT:-/tmp/gpu-out}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
SIM=127.0.0.1:18000 PROXY=127.0.0.1:18080 ADMIN=127.0.0.1:18081
LOG="$OUT/log.txt"

nvidia-smi -L 2>&1 | tee -a "$LOG"
$PY -c 'import pynvml, torch; pynvml.nvmlInit()
print("driver", pynvml.nvmlSystemGetDriverVersion(), "nvml", pynvml.nvmlSystemGetNVMLVersion(),
      "torch", torch.__version__)' 2>&1 | tee -a "$LOG"

echo "== 1. gpu_check" | tee -a "$LOG"
if [ -z "${SKIP_CHECK:-}" ]; then  # SKIP_CHECK=1: only the end-to-end part
    timeout 150 $PY benchmarks/gpu_check.py 2>&1 | tee "$OUT/gpu_check.txt"
fi

echo "== 2. proxy on NVML" | tee -a "$LOG"
$PY -m llmtop sim --listen $SIM --profile h200-llama8b >>"$LOG" 2>&1 &
sim_pid=$!
$PY -m llmtop run --upstream http://$SIM --listen $PROXY --admin $ADMIN --gpu-source "${GPU_SOURCE:-nvml}" \
    --workers 2 --headless --record "$OUT/rec.jsonl.gz" >>"$LOG" 2>&1 &
proxy_pid=$!
$PY - "$ADMIN" <<'EOF' 2>&1 | tee -a "$LOG"
import sys, time, urllib.request
url = f"http://{sys.argv[1]}/llmtop/v1/health"
for _ in range(100):
    try:
        print("health:", urllib.request.urlopen(url, timeout=1).read().decode()[:300]); break
    except OSError:
        time.sleep(0.3)
else:
    print("the proxy never answered", url)
EOF

# torch keeps the GPU busy for the whole bench (~35 s), so the readings move
$PY - <<'EOF' >>"$LOG" 2>&1 &
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
end = time.monotonic() + 35
while time.monotonic() < end:
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
print("torch load done")
EOF
load_pid=$!

timeout 120 $PY -m llmtop bench http://$PROXY --concurrency 16,64 --duration 10 --warmup 2 \
    --max-tokens 64 >"$OUT/bench.txt" 2>&1 &
bench_pid=$!
sleep 18  # mid-way through the 64-stream level
timeout 60 $PY - "$ADMIN" "$OUT/tui-h200.svg" <<'EOF' 2>&1 | tee -a "$LOG"
import sys
sys.path.insert(0, "tools")
from screenshots import capture
from llmtop.tui.source import AdminSource
print("screenshot:", capture(AdminSource([f"http://{sys.argv[1]}"]), sys.argv[2], wait_s=4,
                             title="llmtop on an H200"))
EOF
wait $bench_pid
$PY - "$ADMIN" "$OUT" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys, urllib.request
admin, out = sys.argv[1], sys.argv[2]
snap = json.load(urllib.request.urlopen(f"http://{admin}/llmtop/v1/snapshot?window=60", timeout=5))
open(f"{out}/snapshot.json", "w").write(json.dumps(snap, indent=1))
print("snapshot gpus:", json.dumps(snap.get("gpus"), indent=1)[:3000])
metrics = urllib.request.urlopen(f"http://{admin}/metrics", timeout=5).read().decode()
open(f"{out}/metrics.txt", "w").write(metrics)
print("\n".join(l for l in metrics.splitlines() if "gpu" in l and not l.startswith("#")))
EOF
kill -INT $proxy_pid; wait $proxy_pid
kill $sim_pid $load_pid 2>/dev/null; wait 2>/dev/null
echo "== 3. report" | tee -a "$LOG"
$PY -m llmtop report "$OUT/rec.jsonl.gz" >"$OUT/report.txt" 2>&1
cat "$OUT/bench.txt" "$OUT/report.txt"
exit 0
