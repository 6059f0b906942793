#!/bin/sh
# The Python wheels a lent GPU machine's image lacks, downloaded here into .whl/ (git-ignored)
# for tests/gpu/lease.sh to install there: NumPy < 2.5 (numba-cuda 0.30 does not import next
# to the image's NumPy 2.5), array-api-compat, Liger-Kernel (the HF row's anchor) and the
# transformers release the tests pin. Python 3.12, x86-64: the image's python3.
set -e
cd "$(dirname "$0")/../.."
# (git's own path of the exclude file: .git is a file in a worktree, and info/ may not exist yet)
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo /.whl/ >> "$exclude"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
	--platform manylinux2014_x86_64 -d .whl \
	numpy==2.4.6 array-api-compat==1.16.0 liger-kernel==0.8.5 transformers==5.24.0
ls .whl
