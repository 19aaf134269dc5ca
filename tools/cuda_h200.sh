#!/usr/bin/env bash
# The CUDA backend on the lent H200, in calls of the device tool (each under its 10-minute limit; a later
# call while the machine is still warm finds the builds and the model of the one before):
#
#   tools/cuda_h200.sh check   builds regolith for sm_90 (build/h200), then runs the conformance suite and
#                              the streaming tests on cuda
#   tools/cuda_h200.sh bench [SECONDS]
#                              builds llama.cpp's llama-bench in the background, regolith and the 48-layer
#                              synthetic Flash-Next model, then benchmarks/bench_cuda.py beside llama-bench
#                              (docs/benchmarks.md), the call ending within SECONDS (570); run it again on the same machine to
#                              measure the rows the first call had no time for (--record)
#   tools/cuda_h200.sh quick [SECONDS]
#                              one call for a kernel change: prepare in the background, regolith built, the
#                              conformance suite, the kernels' time per resident decode token (profile), then
#                              bench's resident row beside llama-bench (--record: bench on the same machine
#                              measures the rest), within SECONDS (570)
#   tools/cuda_h200.sh prepare starts the llama-bench build in the background and makes the synthetic model, so
#                              that a bench call right after (same machine) spends its time measuring
#   tools/cuda_h200.sh suite   the whole CUDA model suite (tests/test_cuda_backend.py)
#   tools/cuda_h200.sh serve [CLIENTS] [MODELS]
#                              regolith as for check, then `regolith run` on cuda once and benchmarks/bench_serve.py
#                              on cuda (MODELS: "demo" the demo streamed through 4 MiB and resident, "fn" the
#                              synthetic Flash-Next model resident; default demo; CLIENTS 1,2,4,8), with its bare
#                              steps; the servers' logs in $OUT/serve.log. Needs .whl/serve/ (the server's and the
#                              openai SDK's wheels) too
#   tools/cuda_h200.sh profile [TOKENS]
#                              regolith and the synthetic model as for bench, then the kernels' GPU time per
#                              resident decode token (bench_cuda.py --profile)
#
# Needs, carried in .whl/ (ignored by git): the wheels the machine lacks (gguf, transformers 5.24) and
# llamacpp-src.tar.gz from ../shared/tools/llamacpp-slim-source. Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src:$PWD PYTHONUNBUFFERED=1 COLUMNS=200

build_regolith() {
    cmake -S . -B build/h200 -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DPython_EXECUTABLE="$(command -v python3)" >"$OUT/cmake.log" 2>&1 &&
        cmake --build build/h200 -j "${1:-12}" >>"$OUT/cmake.log" 2>&1 &&
        cp build/h200/_core*.so src/regolith/ || { tail -30 "$OUT/cmake.log"; exit 1; }
}

start_llama() {  # llama.cpp's llama-bench, built in the background (about 5 minutes)
    [ -x /tmp/ll/build/bin/llama-bench ] || pgrep -f "build --target llama-bench" >/dev/null && return
    mkdir -p /tmp/ll && tar xzf .whl/llamacpp-src.tar.gz -C /tmp/ll
    (cd /tmp/ll && setsid nohup bash -c 'cmake -S vendor/llama.cpp -B build -G Ninja -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF && cmake --build build --target llama-bench -j 10' >/tmp/ll/build.log 2>&1 &)
}

synthetic_model() {  # the 48-layer synthetic Flash-Next model at /tmp/fn.gguf (about 35 s)
    [ -f /tmp/fn.gguf ] && return
    time python3 benchmarks/synthetic_qwen4exp.py /tmp/fn.part.gguf --layers 48 --experts IQ2_XS --dense Q8_0 \
        --vocab 248320 && mv /tmp/fn.part.gguf /tmp/fn.gguf
}

conformance() {  # the conformance suite on cuda, its table in $OUT/conformance.log
    time python3 -m regolith.backends.check --backend cuda 2>&1 | tee "$OUT/conformance.log" | tail -8
}

case "${1:?check, bench, quick, prepare, suite, serve or profile}" in
check)
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
    ls src/regolith/_core*.so >/dev/null 2>&1 || time build_regolith 16
    conformance
    REGOLITH_BACKEND=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_streaming.py \
        -k "device_routing or host_tier or bit_identical or moce" 2>&1 | tee "$OUT/streaming.log" | tail -15
    ;;
bench)  # resumable: a second call on the same machine measures the rows the first had no time for
    start_llama
    ls src/regolith/_core*.so >/dev/null 2>&1 || time build_regolith 6
    synthetic_model
    timeout $(("${2:-570}" - SECONDS)) python3 benchmarks/bench_cuda.py --model /tmp/fn.gguf --llama-bench /tmp/ll/build/bin/llama-bench \
        --decode 64 --record /tmp/bench_cuda.json 2>&1 | tee -a "$OUT/bench_cuda.log"
    cp /tmp/bench_cuda.json "$OUT/" 2>/dev/null
    tail -n 2 /tmp/ll/build.log
    ;;
quick)
    start_llama
    ls src/regolith/_core*.so >/dev/null 2>&1 || time build_regolith 12
    synthetic_model >"$OUT/synthetic.log" 2>&1 &  # imports regolith: after the build
    conformance
    wait
    timeout 150 python3 benchmarks/bench_cuda.py --model /tmp/fn.gguf --profile 8 2>&1 | tee "$OUT/profile.log" | head -40
    while ! [ -x /tmp/ll/build/bin/llama-bench ] && [ $SECONDS -lt $(("${2:-570}" - 200)) ]; do sleep 5; done
    peer=()  # llama-bench's rows only where its build finished in time
    [ -x /tmp/ll/build/bin/llama-bench ] && peer=(--llama-bench /tmp/ll/build/bin/llama-bench)
    [ $SECONDS -lt "${2:-570}" ] && timeout $(("${2:-570}" - SECONDS)) python3 benchmarks/bench_cuda.py --model /tmp/fn.gguf \
        "${peer[@]}" --decode 64 --skip host disk --record /tmp/bench_cuda.json 2>&1 | tee -a "$OUT/bench_cuda.log"
    ;;
prepare)
    start_llama
    synthetic_model
    ;;
suite)
    ls src/regolith/_core*.so >/dev/null 2>&1 || build_regolith 16
    timeout 560 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_backend.py tests/test_backend_conformance.py \
        2>&1 | tee "$OUT/suite.log" | tail -30
    ;;
serve)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/serve/*.whl
    ls src/regolith/_core*.so >/dev/null 2>&1 || time build_regolith 16
    time timeout 120 python3 -m regolith.cli run --backend cuda -p "class Stack:" -n 32 2>&1 | tail -4
    for which in ${3:-demo}; do
        case $which in
        demo) models=("" regolith-demo) ;;
        fn) synthetic_model && models=(/tmp/fn.gguf) ;;
        esac
        for model in "${models[@]}"; do
            timeout 300 python3 benchmarks/bench_serve.py $model --backend cuda --clients "${2:-1,2,4,8}" \
                --requests 3 --steps 32 --server-log "$OUT/serve.log" 2>&1 | tee -a "$OUT/bench_serve.log"
        done
    done
    ;;
profile)
    ls src/regolith/_core*.so >/dev/null 2>&1 || time build_regolith 16
    synthetic_model
    python3 benchmarks/bench_cuda.py --model /tmp/fn.gguf --profile "${2:-16}" 2>&1 | tee "$OUT/profile.log"
    ;;
esac
