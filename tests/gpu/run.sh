#!/usr/bin/env bash
# tests/gpu/run.sh: the GPU tests and the GPU benchmark, on a machine with NVIDIA GPUs and a CUDA
# build of PyTorch. CI has no GPU; this is how the NCCL half of the kit gets run.
#
#   tests/gpu/run.sh [BUILD_DIR]        BUILD_DIR: default build-gpu in the repository root
#
#  1. configures BUILD_DIR against the torch of $PYTHON: CMAKE_PREFIX_PATH from
#     torch.utils.cmake_prefix_path. A torch outside the kit's tested range (KIT_TORCH_OLDEST/NEWEST
#     in common/cmake/torch.cmake) is built anyway, with -DKIT_ALLOW_UNTESTED_TORCH=ON, and the
#     output says so;
#  2. builds only what the GPU tests and the benchmark need (no stages, no other test areas);
#  3. runs `ctest -L gpu --output-on-failure` (tests/gpu/CMakeLists.txt lists the tests); a case
#     that cannot run here (too few GPUs, say) is reported as skipped, and its reason is listed;
#  4. exercise 04 with NCCL: tp 1 on one GPU, then, with 2 GPUs, tp 2 and cp 2, with 4, tp 4 (one
#     rank a GPU, dropout 0): each run's final test loss must be tp 1's (ex04-gpu.txt, the logs
#     ex04-*.log).
#  5. exercise 05 with NCCL: pp 1 on one GPU, then, with 2 GPUs, pp 2 under gpipe, 1f1b and
#     interleaved, with 4, pp 4 (one rank a GPU, dropout 0): each run's final test loss must be
#     pp 1's (ex05-gpu.txt, the logs ex05-*.log).
#  5b. the capstone (exercise 07), where HDF5 was found and prepared XSum data is at hand
#     ($KIT_XSUM_DIR, or one generated and prepared here when this python3 has sentencepiece and
#     h5py: `./kit data xsum generate`, `prepare`): its solution on one GPU with --strategy ddp,
#     zero2 and zero3, and with 2 GPUs on 2 ranks each: every run must end with its final line,
#     and zero2's and zero3's numbers must be ddp's within 1e-3 relative; with 2 GPUs also
#     --strategy tp --tp 2, whose numbers must be ddp's on 1 GPU (the same batches) within 1e-3
#     (ex07-gpu.txt, the logs ex07-*.log).
#  The short checks (1-5b) come before the benchmarks (6-9), so that a run stopped at a time
#  limit has them.
#  6. runs the DDP benchmark on one GPU: the kit's C++ DDP against PyTorch's DDP, one NCCL rank
#     each (tests/bench/run_bench.py --device cuda): step time, samples/s, wait after backward;
#  7. runs the collectives benchmark (common/bench/bench_collectives.cpp) on NCCL with one rank
#     per GPU, 8 B to 256 MiB, and, with two GPUs or more, plots busbw against size with the
#     alpha-beta fit (slides/tools/plot_collectives.py);
#  8. counts the host synchronisations of a training step (common/bench/host_syncs.cpp: exercise
#     01's loop under DDP, CUDA's sync debug mode) on 1 rank and, with two GPUs or more, on 2, and
#     prints them. Expected, as on fakegpu in CI (ctest -R host_syncs), unless one of ATen's CUDA
#     kernels synchronises: none inside a step from step 2 on; between steps, only at every 10th
#     step: rank 0 reads its losses (1), and on 2 ranks every rank polls the stop flag (2: the flag
#     to the GPU and back), so 1 with one rank, 3 on rank 0 and 2 on rank 1 with two. --check
#     makes any other figure a failure.
#  9. exercise 06 on one GPU, where HDF5 was found: its checks (tests/gpu/weather_gpu.py: fp16
#     with its gradient scaler, bf16, TF32 trained to fp32's u10 RMSE within tolerance, autocast's
#     dtypes, the batches copied from pinned memory on a stream of their own, GPU kernels in the
#     profile) and its table of speed-ups (tests/bench/bench_weather.py --device cuda: the shipped
#     exercise, then each optimisation added, samples/s, step time, peak memory, u10 RMSE, with
#     the date and the GPU's name).
#
# Results go to $OUT if set, else BUILD_DIR/results: info.txt (date, GPUs, torch), configure.log,
# build.log, ctest.log (the run and the skip reasons), ctest-details.log (every test's output),
# bench.txt (the table) and bench.log (the raw BENCH lines), collectives.txt, collectives.csv,
# collectives-busbw.svg and collectives-fit.md (step 7), host_syncs.txt (the counts) and
# host_syncs.log (every step's, step 8), weather-gpu.txt, weather-table.txt and weather-table.csv
# (step 9; its profile in BUILD_DIR/tests/bench/weather-gpu/profile). Exit status 0 when everything built
# and passed, 1 when a test or the benchmark failed, 2 when it could not build.
#
# Needs python3 with a CUDA torch, cmake, a C++ compiler, nvcc (the CMake config of a CUDA
# LibTorch looks for the CUDA toolkit) and nvidia-smi; no network. Gloo's headers are not needed
# (common/gloo-declarations). GoogleTest comes from the system or, where it is missing and
# nothing can be installed, from Debian packages brought along:
#
#   KIT_DEBS=DIR tests/gpu/run.sh       every DIR/*.deb is unpacked (dpkg -x) into BUILD_DIR/debs,
#                                       which goes on CMAKE_PREFIX_PATH and the include path;
#                                       nothing is installed on the system
#
# Prepare DIR where Debian's (or Ubuntu's) package lists are reachable, e.g. on the kit's
# development machine, and copy it to the GPU machine:
#
#   mkdir debs && cd debs && apt-get download libgtest-dev googletest
#
# Environment: PYTHON (python with torch; default python3), KIT_DEBS, OUT, KIT_JOBS (build jobs;
# default: all cores), CXX (the compiler of a new build folder), BENCH_STEPS / BENCH_WARMUP /
# BENCH_REPEATS (run length), KIT_BENCH_ARGS (more run_bench.py flags, e.g. "--vocab 33278"),
# KIT_NO_BENCH=1 (tests only), KIT_CMAKE_ARGS (more configure flags, split at spaces: e.g. an HDF5
# outside the usual places, "-DHDF5_C_INCLUDE_DIR=... -DHDF5_hdf5_LIBRARY_RELEASE=...").
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-gpu}
case "$BUILD" in /*) ;; *) BUILD=$PWD/$BUILD ;; esac
PYTHON=${PYTHON:-python3}
JOBS=${KIT_JOBS:-$(nproc 2>/dev/null || echo 4)}
RESULTS=${OUT:-$BUILD/results}

say() { printf 'gpu: %s\n' "$*"; }
die() { printf 'gpu: error: %s\n' "$*" >&2; exit 2; }

# a < b for versions like 2.13 (sort -V knows that 2.9 < 2.13).
version_lt() {
  [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" = "$1" ]
}

# DEB DIR: what `dpkg -x` does, also where there is no dpkg (a RHEL-like cluster): a .deb is an ar
# archive whose data.tar.* holds the files.
unpack_deb() {
  if command -v dpkg >/dev/null; then
    dpkg -x "$1" "$2"
    return
  fi
  local member z=()
  member=$(ar t "$1" | grep '^data\.tar') || return 1
  case "$member" in
    *.xz) z=(-J) ;;
    *.zst) z=(--zstd) ;;
    *.gz) z=(-z) ;;
    *.bz2) z=(-j) ;;
  esac
  ar p "$1" "$member" | tar -x "${z[@]}" -C "$2" -f -
}

# --- what is there --------------------------------------------------------------------------------
command -v cmake >/dev/null || die "cmake not found"
command -v "$PYTHON" >/dev/null || die "$PYTHON not found (PYTHON=... names the python with torch)"
# One line each: version, CMake prefix, CUDA version ("" for a CPU build), visible GPUs.
torch_info=$("$PYTHON" -W ignore -c '
import torch
print(torch.__version__)
print(torch.utils.cmake_prefix_path)
print(torch.version.cuda or "")
print(torch.cuda.device_count() if torch.cuda.is_available() else 0)') ||
  die "$PYTHON cannot import torch"
{ read -r torch_version; read -r torch_prefix; read -r torch_cuda; read -r gpus; } <<<"$torch_info"
if [ -n "$torch_cuda" ] && ! command -v nvcc >/dev/null; then
  die "nvcc not found: the CMake config of a CUDA build of torch needs the CUDA toolkit (load its module, or put it on PATH)"
fi

mkdir -p "$BUILD" "$RESULTS"
{
  echo "date:   $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "host:   $(uname -n)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/GPU:    /' ||
      echo "GPU:    (nvidia-smi failed: no driver?)"
    echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1 || true)"
  else
    echo "GPU:    (nvidia-smi not found)"
  fi
  echo "torch:  $torch_version (CUDA ${torch_cuda:-none}; $gpus GPU(s) visible to torch) from $PYTHON"
  echo "kit:    $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '(not a git checkout)')"
} | tee "$RESULTS/info.txt"
[ -n "$torch_cuda" ] || say "this torch is a CPU build: the GPU tests will all be skipped"

# The kit's tested range of LibTorch, from the file that enforces it.
torch_cmake=$ROOT/common/cmake/torch.cmake
oldest=$(sed -n 's/^set(KIT_TORCH_OLDEST \([0-9.]*\)).*/\1/p' "$torch_cmake")
newest=$(sed -n 's/^set(KIT_TORCH_NEWEST \([0-9.]*\)).*/\1/p' "$torch_cmake")
minor=$(printf '%s\n' "$torch_version" | sed 's/^\([0-9]*\.[0-9]*\).*/\1/')
untested=()
if version_lt "$minor" "$oldest" || version_lt "$newest" "$minor"; then
  say "torch $torch_version is outside the kit's tested range $oldest to $newest: building anyway" \
      "(-DKIT_ALLOW_UNTESTED_TORCH=ON); a failure may be the version's" | tee -a "$RESULTS/info.txt"
  untested=(-DKIT_ALLOW_UNTESTED_TORCH=ON)
fi

# --- headers from .deb files (KIT_DEBS) -----------------------------------------------------------
prefixes=$torch_prefix
extra_flags=()
if [ -n "${KIT_DEBS:-}" ]; then
  debroot=$BUILD/debs
  rm -rf "$debroot"
  mkdir -p "$debroot"
  found=0
  for deb in "$KIT_DEBS"/*.deb; do
    [ -f "$deb" ] || continue
    found=1
    unpack_deb "$deb" "$debroot" || die "cannot unpack $deb"
    say "unpacked $(basename "$deb") into $debroot"
  done
  [ "$found" = 1 ] || die "KIT_DEBS=$KIT_DEBS holds no .deb files"
  # find_package(GTest) looks under <prefix>/lib/<arch>/cmake; its headers (gtest/) need the
  # include path as well.
  prefixes="$prefixes;$debroot/usr"
  extra_flags=("-DCMAKE_CXX_FLAGS=-isystem $debroot/usr/include")
fi

# --- configure and build ----------------------------------------------------------------------------
read -r -a cmake_args <<<"${KIT_CMAKE_ARGS:-}"
compiler=()
if [ ! -f "$BUILD/CMakeCache.txt" ] && [ -n "${CXX:-}" ]; then compiler=("-DCMAKE_CXX_COMPILER=$CXX"); fi
say "configuring $BUILD (log: $RESULTS/configure.log)"
if ! cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "${compiler[@]}" \
    "-DCMAKE_PREFIX_PATH=$prefixes" -DKIT_BUILD_TESTS=ON -DKIT_BUILD_STAGES=OFF \
    "-DKIT_TEST_AREAS=gpu;ddp;bench" "${untested[@]}" "${extra_flags[@]}" "${cmake_args[@]}" \
    >"$RESULTS/configure.log" 2>&1; then
  tail -n 30 "$RESULTS/configure.log" >&2
  if grep -q "GTest" "$RESULTS/configure.log"; then
    say "GoogleTest is missing: bring it as .deb files (KIT_DEBS=DIR, see the top of $0)" >&2
  fi
  die "configuring $BUILD failed (log: $RESULTS/configure.log)"
fi
grep -E '(^-- |^  )kit: ' "$RESULTS/configure.log" | sed 's/^ *-* *//' || true

targets=(gpu_tests ddp_tests bench_ddp bench_collectives host_syncs ex01-solution ex04-solution ex05-solution ddprun make_corpus corpus)
# Exercise 06, where the configure step found HDF5 (its targets exist only then).
if grep -q 'HDF5 not found' "$RESULTS/configure.log"; then
  say "HDF5 not found: exercise 06 is not built here (Debian: libhdf5-dev; a module: cray-hdf5, HDF5)"
else
  targets+=(ex06-exercise ex06-solution make_weather ex07-solution)
fi
say "building ${targets[*]} with $JOBS jobs (log: $RESULTS/build.log)"
if ! cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}" >"$RESULTS/build.log" 2>&1; then
  grep -m 20 -E 'error|Error' "$RESULTS/build.log" >&2 || tail -n 30 "$RESULTS/build.log" >&2
  die "building failed (log: $RESULTS/build.log)"
fi

# --- the tests ----------------------------------------------------------------------------------------
status=0
say "ctest -L gpu"
(cd "$BUILD" && ctest -L gpu --output-on-failure --no-tests=error) 2>&1 | tee "$RESULTS/ctest.log" || status=1
details=$BUILD/Testing/Temporary/LastTest.log
if [ -f "$details" ]; then
  cp "$details" "$RESULTS/ctest-details.log"
  # gtest prints "<file>:<line>: Skipped" and the reason on the next line.
  reasons=$(awk '/^[0-9]+\/[0-9]+ Testing: / { name = $0; sub(/^[0-9]+\/[0-9]+ Testing: /, "", name); sub(/  # GetParam.*/, "", name) }
                 want { print "  " name ": " $0; want = 0 }
                 /: Skipped$/ { want = 1 }' "$details")
  if [ -n "$reasons" ]; then
    printf 'skipped, and why:\n%s\n' "$reasons" | tee -a "$RESULTS/ctest.log"
  fi
fi

# --- exercise 04 on the GPUs: tensor and context parallelism with NCCL ----------------------------
# Each run on 1 GPU a rank (--dropout 0: tp's parallel regions draw their own dropout numbers, so
# only without dropout is tp N the very run of tp 1). Every rank must print the same final test
# loss as tp 1 on one GPU, within 2 units of its last digit (rules/ex04.py's LOSS_TOL).
solution_loss() {  # EX NAME RANKS FLAGS...: exercise EX's solution's final test loss, or nothing
  local ex=$1 name=$2 ranks=$3
  shift 3
  "$BUILD/bin/ddprun" --nproc-per-node "$ranks" -- "$BUILD/bin/$ex-solution" \
      --data-dir "$BUILD/data/wikitext-2" --out-dir "$BUILD/$ex-gpu/$name" --epochs 1 \
      --max-steps 20 --heads 4 --dropout 0 "$@" >"$RESULTS/$ex-$name.log" 2>&1 || return 0
  sed -n 's/^final test loss \([0-9.]*\).*/\1/p' "$RESULTS/$ex-$name.log" | head -n 1
}
same_loss() {  # EX NAME RANKS BASE FLAGS...: one line, "equal" or FAILED, for the run against BASE
  local ex=$1 name=$2 ranks=$3 base=$4 got
  shift 4
  got=$(solution_loss "$ex" "$name" "$ranks" "$@")
  if [ -n "$got" ] && [ -n "$base" ] &&
      awk -v a="$got" -v b="$base" 'BEGIN { d = a - b; exit !(d <= 2e-5 && d >= -2e-5) }'; then
    echo "$name on $ranks GPUs: final test loss $got: equal to the one-GPU run's"
  else
    echo "$name on $ranks GPUs: final test loss ${got:-none (see $ex-$name.log)}, one GPU's ${base:-none}: FAILED"
  fi
}
if [ -z "$torch_cuda" ] || [ "$gpus" -lt 1 ]; then
  say "exercise 04 not run on the GPU (no GPU or no CUDA torch)" | tee "$RESULTS/ex04-gpu.txt"
else
  rm -rf "$BUILD/ex04-gpu"
  say "exercise 04 on the GPUs: tp and cp with NCCL against tp 1 (dropout 0)"
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ), GPUs: $gpus x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
    base=$(solution_loss ex04 tp1 1)
    echo "tp 1 on 1 GPU: final test loss ${base:-none (see ex04-tp1.log): FAILED}"
    runs=()
    [ "$gpus" -ge 2 ] && runs+=("tp2 2 --tp 2" "cp2 2 --cp 2")
    [ "$gpus" -ge 4 ] && runs+=("tp4 4 --tp 4")
    for r in "${runs[@]}"; do
      read -r name ranks flags <<<"$r"
      # shellcheck disable=SC2086  # the flags split into words
      same_loss ex04 "$name" "$ranks" "$base" $flags
    done
    [ "$gpus" -ge 2 ] || echo "tp 2 and cp 2 need 2 GPUs (one rank a GPU): not run on $gpus"
  } 2>&1 | tee "$RESULTS/ex04-gpu.txt"  # a subshell: its verdict is read from the file
  grep -q FAILED "$RESULTS/ex04-gpu.txt" && status=1
fi

# --- exercise 05 on the GPUs: pipeline parallelism with NCCL ---------------------------------------
# pp 1 on one GPU, then, with 2 GPUs, pp 2 under each schedule, with 4, pp 4 (one rank a GPU, 4
# blocks, dropout 0): every run's final test loss must be pp 1's (ex05-gpu.txt, the logs
# ex05-*.log). Its sends and receives are NCCL's point to point: two ranks never share a GPU.
if [ -z "$torch_cuda" ] || [ "$gpus" -lt 1 ]; then
  say "exercise 05 not run on the GPU (no GPU or no CUDA torch)" | tee "$RESULTS/ex05-gpu.txt"
else
  rm -rf "$BUILD/ex05-gpu"
  say "exercise 05 on the GPUs: pipelines with NCCL against pp 1 (dropout 0)"
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ), GPUs: $gpus x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
    base=$(solution_loss ex05 pp1 1 --layers 4)
    echo "pp 1 on 1 GPU: final test loss ${base:-none (see ex05-pp1.log): FAILED}"
    runs=()
    [ "$gpus" -ge 2 ] && runs+=("pp2-1f1b 2 --pp 2" "pp2-gpipe 2 --pp 2 --schedule gpipe"
                                "pp2-interleaved 2 --pp 2 --schedule interleaved --chunks 2")
    [ "$gpus" -ge 4 ] && runs+=("pp4 4 --pp 4")
    for r in "${runs[@]}"; do
      read -r name ranks flags <<<"$r"
      # shellcheck disable=SC2086  # the flags split into words
      same_loss ex05 "$name" "$ranks" "$base" --layers 4 $flags
    done
    [ "$gpus" -ge 2 ] || echo "pipelines need 2 GPUs (one rank a GPU): not run on $gpus"
  } 2>&1 | tee "$RESULTS/ex05-gpu.txt"
  grep -q FAILED "$RESULTS/ex05-gpu.txt" && status=1
fi

# --- the capstone on the GPUs: DDP and ZeRO-2 with NCCL ---------------------------------------------
xsum=${KIT_XSUM_DIR:-}
if [ -z "$xsum" ] && [ -x "$BUILD/bin/ex07-solution" ] &&
    "$PYTHON" -c 'import sentencepiece, h5py, numpy' >/dev/null 2>&1; then
  xsum=$BUILD/xsum-generated
  { "$ROOT/kit" data xsum generate "$xsum" --seed 5 &&
    KIT_PYTHON=$PYTHON "$ROOT/kit" data xsum prepare "$xsum" --vocab-size 1000; } \
    >"$RESULTS/ex07-data.log" 2>&1 || xsum=""
fi
if [ -z "$torch_cuda" ] || [ "$gpus" -lt 1 ] || [ ! -x "$BUILD/bin/ex07-solution" ] || [ -z "$xsum" ]; then
  say "the capstone not run on the GPU (it needs a GPU, a CUDA torch, HDF5 and prepared data:" \
      "KIT_XSUM_DIR, or sentencepiece and h5py in $PYTHON)" | tee "$RESULTS/ex07-gpu.txt"
else
  rm -rf "$BUILD/ex07-gpu"
  say "the capstone on the GPUs: DDP, ZeRO-2, ZeRO-3 and tensor parallelism with NCCL ($xsum)"
  ex07_numbers() {  # NAME RANKS FLAGS...: the final line's four numbers, or nothing
    local name=$1 ranks=$2
    shift 2
    "$BUILD/bin/ddprun" --nproc-per-node "$ranks" -- "$BUILD/bin/ex07-solution" \
        --data-dir "$xsum" --out-dir "$BUILD/ex07-gpu/$name" --epochs 2 --train-examples 1000 \
        --eval-examples 100 --dropout 0 "$@" >"$RESULTS/ex07-$name.log" 2>&1 || return 0
    sed -n 's/^final test loss \([0-9.]*\), ROUGE-1 \([0-9.]*\), ROUGE-2 \([0-9.]*\), ROUGE-L \([0-9.]*\)$/\1 \2 \3 \4/p' \
        "$RESULTS/ex07-$name.log" | head -n 1
  }
  ex07_close() {  # A B: two runs' four numbers, each pair within 1e-3 relative (+ 1e-5)
    awk -v a="$1" -v b="$2" 'BEGIN {
        n = split(a, x, " "); split(b, y, " ");
        for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > 1e-3 * (x[i] < 0 ? -x[i] : x[i]) + 1e-5) exit 1 }
        exit 0 }'
  }
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ), GPUs: $gpus x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
    shapes=("1")
    [ "$gpus" -ge 2 ] && shapes+=("2")
    for ranks in "${shapes[@]}"; do
      ddp=$(ex07_numbers "ddp$ranks" "$ranks" --strategy ddp)
      for strategy in zero2 zero3; do
        zero=$(ex07_numbers "$strategy-$ranks" "$ranks" --strategy "$strategy")
        if [ -n "$ddp" ] && [ -n "$zero" ] && ex07_close "$ddp" "$zero"; then
          echo "$ranks GPU(s): ddp (test loss, ROUGE-1, -2, -L) $ddp; $strategy $zero: equal within 1e-3"
        else
          echo "$ranks GPU(s): ddp ${ddp:-none (see ex07-ddp$ranks.log)}, $strategy ${zero:-none (see ex07-$strategy-$ranks.log)}: FAILED"
        fi
      done
    done
    # --strategy tp --tp 2 on 2 GPUs: one copy of the model, split, on the batches of DDP on 1.
    if [ "$gpus" -ge 2 ]; then
      ddp=$(ex07_numbers "ddp1" 1 --strategy ddp)
      tp=$(ex07_numbers "tp-2" 2 --strategy tp --tp 2)
      if [ -n "$ddp" ] && [ -n "$tp" ] && ex07_close "$ddp" "$tp"; then
        echo "2 GPU(s): tp 2 $tp; ddp on 1 GPU $ddp: equal within 1e-3"
      else
        echo "2 GPU(s): tp 2 ${tp:-none (see ex07-tp-2.log)}, ddp on 1 ${ddp:-none (see ex07-ddp1.log)}: FAILED"
      fi
    fi
  } 2>&1 | tee "$RESULTS/ex07-gpu.txt"
  grep -q FAILED "$RESULTS/ex07-gpu.txt" && status=1
fi

# --- the benchmark on one GPU ---------------------------------------------------------------------
if [ "${KIT_NO_BENCH:-0}" = 1 ]; then
  say "benchmark not run (KIT_NO_BENCH=1)" | tee "$RESULTS/bench.txt"
elif [ -z "$torch_cuda" ] || [ "$gpus" -lt 1 ]; then
  say "benchmark not run: it needs a GPU and a CUDA build of torch" | tee "$RESULTS/bench.txt"
else
  read -r -a bench_args <<<"${KIT_BENCH_ARGS:-}"
  say "DDP benchmark on one GPU: kit C++ DDP vs PyTorch DDP (a few minutes)"
  rm -f "$RESULTS/bench.log"
  "$PYTHON" "$ROOT/tests/bench/run_bench.py" --device cuda --ranks 1 \
      --bench "$BUILD/bin/bench_ddp" --ddprun "$BUILD/bin/ddprun" --data "$BUILD/data/wikitext-2" \
      --python "$PYTHON" --log "$RESULTS/bench.log" "${bench_args[@]}" 2>&1 |
    tee "$RESULTS/bench.txt" || status=1
fi

# --- the collectives benchmark: NCCL, one rank per GPU ------------------------------------------------
if [ "${KIT_NO_BENCH:-0}" = 1 ] || [ -z "$torch_cuda" ] || [ "$gpus" -lt 1 ]; then
  say "collectives benchmark not run" | tee "$RESULTS/collectives.txt"
else
  say "collectives benchmark: NCCL on $gpus GPU(s), 8 B .. 256 MiB"
  "$BUILD/bin/ddprun" --nproc-per-node "$gpus" -- "$BUILD/bin/bench_collectives" \
      --min-bytes 8 --max-bytes 256M --csv "$RESULTS/collectives.csv" 2>&1 |
    tee "$RESULTS/collectives.txt" || status=1
  if [ "$gpus" -ge 2 ]; then
    "$PYTHON" "$ROOT/slides/tools/plot_collectives.py" --out "$RESULTS" \
        --label "$gpus x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1), $(date -u +%F)" \
        "$RESULTS/collectives.csv" 2>&1 | tee -a "$RESULTS/collectives.txt" || status=1
  fi
fi

# --- host synchronisations per training step (CUDA's sync debug mode) -------------------------------
if [ "${KIT_NO_BENCH:-0}" = 1 ] || [ -z "$torch_cuda" ] || [ "$gpus" -lt 1 ]; then
  say "host synchronisations not counted (they need a GPU)" | tee "$RESULTS/host_syncs.txt"
else
  say "host synchronisations per step (expected: 0 inside a step from step 2 on; between steps only" \
      "every 10th: 1 on one rank, 3 on rank 0 and 2 on rank 1 of two)"
  rm -f "$RESULTS/host_syncs.log" "$RESULTS/host_syncs.txt"
  for ranks in 1 2; do
    [ "$ranks" -le "$gpus" ] || continue
    "$BUILD/bin/ddprun" --nproc-per-node "$ranks" -- "$BUILD/bin/host_syncs" --steps 40 \
        --d-model 256 --layers 2 --seq 64 --batch 16 --check >>"$RESULTS/host_syncs.log" 2>&1 || status=1
  done
  grep -E '^HOSTSYNCS|host_syncs:' "$RESULTS/host_syncs.log" | tee "$RESULTS/host_syncs.txt" || status=1
fi

# --- exercise 06 on one GPU: precisions, the loader's copies, the table of speed-ups --------------
if [ "${KIT_NO_BENCH:-0}" = 1 ] || [ -z "$torch_cuda" ] || [ "$gpus" -lt 1 ] ||
    [ ! -x "$BUILD/bin/ex06-solution" ]; then
  say "exercise 06 not run on the GPU (no GPU, no CUDA torch, no HDF5, or KIT_NO_BENCH=1)" |
    tee "$RESULTS/weather-gpu.txt"
else
  say "exercise 06 on one GPU: fp16, bf16, TF32, the loader's copies, the profile"
  "$PYTHON" "$ROOT/tests/gpu/weather_gpu.py" "$BUILD/bin/ex06-solution" "$BUILD/bin/make_weather" \
      "$BUILD/weather-gpu-checks" 2>&1 | tee "$RESULTS/weather-gpu.txt" || status=1
  say "exercise 06's table of speed-ups on one GPU (several minutes)"
  "$PYTHON" "$ROOT/tests/bench/bench_weather.py" --device cuda \
      --exercise "$BUILD/bin/ex06-exercise" --solution "$BUILD/bin/ex06-solution" \
      --make-weather "$BUILD/bin/make_weather" --work "$BUILD/tests/bench/weather-gpu" \
      --csv "$RESULTS/weather-table.csv" --profile 2>&1 | tee "$RESULTS/weather-table.txt" || status=1
fi

say "results in $RESULTS"
exit "$status"
