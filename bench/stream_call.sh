#!/usr/bin/env bash
# The stream kernel's first GPU call, prepared here (nvcc, no GPU) so that the call can go out as soon as a device is
# lent:
#
#     bash bench/stream_call.sh [REV] [DIR]      # REV default HEAD, DIR default .cache/tree-stream
#
# writes DIR (bench/rev_tree.sh: REV's package and bench scripts), builds w12_gemv there and the stamped trace
# libraries in DIR/st (bench/stream_trace.py --build), strips the .so files (the device tool carries 64 MiB at most)
# and prints the `run` call: bench/stream_kernel.py at M = 1 and 32 (it rewrites its table after each shape), then
# bench/kernels.py with the STREAM_TABLE it wrote, then the trace if time is left.
set -euo pipefail
rev=${1:-HEAD} dir=${2:-.cache/tree-stream}
root=$(git rev-parse --show-toplevel)
py=$root/.venv/bin/python
cd "$root"
bash bench/rev_tree.sh "$rev" "$dir"
(cd "$dir" && PYTHONPATH=$PWD W12_CACHE=$PWD/.cache/w12 "$py" -c \
  "from w12.kernels import cuda_build as cb; p = cb.build('w12_gemv'); assert p, 'w12_gemv did not build'; print(p)")
"$py" bench/stream_trace.py --build "$dir/st" --rev "$rev"
find "$dir" -name '*.so' -exec strip --strip-unneeded {} +
echo "$dir: $(du -sh "$dir" | cut -f1) to carry"
cat <<EOF
run(carry=["$dir"], timeout_s=600, command=
  "cd $dir && export W12_CACHE=\$PWD/.cache/w12 W12_CUDA=1 PYTHONUNBUFFERED=1 PYTHONPATH=\$PWD &&
   timeout 380 python bench/stream_kernel.py --ms 1,32 --out \$OUT 2>&1 | tail -40;
   [ -s \$OUT/stream_table.py ] && mkdir -p \$OUT/k && W12_STREAM_TABLE=\$OUT/stream_table.py timeout 150 python bench/kernels.py --out \$OUT/k 2>&1 | tail -25;
   timeout 50 python bench/stream_trace.py --libs st --out \$OUT 2>&1 | tail -15")
EOF
