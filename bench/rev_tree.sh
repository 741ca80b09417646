#!/usr/bin/env bash
# A revision's package and bench scripts as an importable tree, for a machine with no install of w12 (the GPU
# machine): the folders land in pyproject.toml's package-dir layout (formats/ -> w12/formats/, ...), so that
#
#     bash bench/rev_tree.sh 6a8eb97 .cache/tree-cand          # here (git archive: committed files only)
#     cd .cache/tree-cand && PYTHONPATH=$PWD python bench/kernels.py --out $OUT/k        # there
#
# runs that revision's kernels.py on that revision's kernels, and its reports name the commit (REV at the tree's
# root, read by bench/revision.py). bench/results/ is left out (nothing reads it there, and it is most of bench/'s
# bytes). The tree has no top-level kernels/ folder, so nothing shadows PyPI's `kernels` package. DIR is replaced if
# it exists.
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: bash bench/rev_tree.sh REV DIR   (REV: any git revision; DIR: the tree to write)" >&2
  exit 2
fi
rev=$1 dir=$2
root=$(git rev-parse --show-toplevel)
git -C "$root" rev-parse --verify -q "$rev^{commit}" > /dev/null || { echo "rev_tree.sh: no commit '$rev' in $root" >&2; exit 2; }
mkdir -p "$(dirname "$dir")"
tmp=$(mktemp -d "${dir%/}.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
git -C "$root" archive "$rev" w12 formats convert kernels runtime specdec bench | tar -x -C "$tmp"
for d in formats convert kernels runtime specdec; do mv "$tmp/$d" "$tmp/w12/$d"; done
rm -rf "$tmp/bench/results"
git -C "$root" rev-parse --short "$rev" > "$tmp/REV"  # the commit the reports name (bench/revision.py)
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "$dir: $(git -C "$root" rev-parse --short "$rev") ($(du -sh "$dir" | cut -f1))"
