#!/usr/bin/env bash
# The mpirun commands of README.md and docs/distributed.md say what running them as root needs
# (issue 16): Open MPI refuses root unless given --allow-run-as-root or both
# OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1. Each file with an mpirun
# command must name all three; run as root, this Open MPI must behave as they say.
set -u
src=${CTITAN_SOURCE_DIR:?run through ctest}
source "$(dirname "$0")/checks.bash" # ok, bad, finish

for f in README.md docs/distributed.md; do
    grep -Eq '^ *mpirun ' "$src/$f" || { bad "$f has no mpirun command any more"; continue; }
    for w in --allow-run-as-root OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; do
        grep -q -- "$w" "$src/$f" && ok || bad "$f has mpirun commands but does not say $w"
    done
done

# mpirun as root with the given environment (the test's own OMPI_ALLOW_* removed) and options.
as_root() {
    local vars=$1
    shift
    env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM $vars \
        mpirun "$@" -np 1 true >/dev/null 2>&1
}
if [ "$(id -u)" = 0 ] && command -v mpirun >/dev/null; then
    as_root "" && bad "mpirun ran as root with neither option nor variables" || ok
    as_root OMPI_ALLOW_RUN_AS_ROOT=1 && bad "mpirun ran as root with one variable of two" || ok
    as_root "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" && ok ||
        bad "mpirun refused root with both variables"
    as_root "" --allow-run-as-root && ok || bad "mpirun refused root with --allow-run-as-root"
else
    echo "not root or no mpirun: only the docs are checked"
fi
finish
