#!/usr/bin/env bash
# A GPU check's figures in one run, side by side with an earlier tree (docs/performance.md, "Where
# it stands"): where a cold and a kept `grader check -a vector_add --device cuda` spend their seconds
# (benchmarks/where_time_goes.py --requests: every worker request, the burst's steps by the
# worker's own clock), then the check by both trees alternating (benchmarks/check_compare.py).
#
#   git archive REV | tar -x -C BASELINE       (where git is; a machine without git gets the folder)
#   benchmarks/check_session.sh BASELINE OUT [--catalogue]
#   DEVICE=cpu benchmarks/check_session.sh ...  (the interpreter's figures: the same steps on a CPU)
#
# OUT gets trace0.json/err0.txt (the cold check), trace1.json/err1.txt (the kept one) and
# check_compare.json; the lines that matter are printed as they come. Work folders are private
# (0700), as the grader asks of a folder it keeps kernels in.
set -uo pipefail
baseline=${1:?usage: check_session.sh BASELINE OUT [--catalogue]}
out=${2:?usage: check_session.sh BASELINE OUT [--catalogue]}
scope=(-a vector_add)
[ "${3:-}" = --catalogue ] && scope=(--catalogue)
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/grader-check-session.XXXXXX")  # 0700
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
export COLUMNS=200
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee "$out/machine.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/machine.txt"

device=${DEVICE:-cuda}
check=("$repo/tests/fixtures/good" --device "$device" --seed 3)
[ "${scope[0]}" = -a ] && check+=("${scope[@]}")
for i in 0 1; do  # 0 fills the kept cache, 1 is a kept check
    GRADER_CACHE_DIR="$work/kept" python "$repo/benchmarks/where_time_goes.py" --requests --json "$out/trace$i.json" \
        -- "${check[@]}" --json "$work/r$i.json" --html "$work/h$i" >"$out/out$i.txt" 2>"$out/err$i.txt"
    grep -E "Score" "$out/out$i.txt" | cut -c1-200
    grep -E "first call|WarmBurst|Run student|stage |perf\._|total" "$out/err$i.txt" | head -40
done
python "$repo/benchmarks/check_compare.py" --baseline "$baseline" --device "$device" "${scope[@]}" --runs 3 --workdir "$work/cc" \
    >"$out/check_compare.txt" 2>&1
cp "$work/cc/check_compare.json" "$out/" 2>/dev/null
grep -v "timing phases" "$out/check_compare.txt" | tail -15
