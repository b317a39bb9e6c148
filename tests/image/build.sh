#!/usr/bin/env bash
# Builds the grading image (the repo's Dockerfile) where no registry of base images is reachable:
# the base is Debian bookworm made by debootstrap (its Python 3.11 takes the cp311 wheels) with
# the packages the Dockerfile's first RUN asks for, and every wheel pip needs (CPU torch
# included) lies in the build context, so the build itself reaches no network.
#
#   tests/image/build.sh [TAG] [CACHE]     (default: grader-cpu /var/tmp/grader-image; root, podman)
#
# CACHE keeps what the next build reuses: base.tar (the debootstrap root) and wheels/ (pip's
# downloads). The base is imported once as localhost/grader-base:bookworm; podman's layer cache
# keeps the torch layer while only the grader's code changes.
set -euo pipefail
tag=${1:-grader-cpu}
cache=${2:-/var/tmp/grader-image}
repo=$(cd "$(dirname "$0")/../.." && pwd)
base=localhost/grader-base:bookworm
python=${PYTHON:-python3}
mkdir -p "$cache"

if ! podman image exists "$base"; then
    if [ ! -s "$cache/base.tar" ]; then
        echo "build.sh: debootstrap bookworm (minbase) into $cache/rootfs" >&2
        rm -rf "$cache/rootfs"
        debootstrap --variant=minbase \
            --include=python3,python3-venv,python3-dev,gcc,libc6-dev,util-linux,ca-certificates \
            bookworm "$cache/rootfs" http://deb.debian.org/debian >"$cache/debootstrap.log"
        rm -rf "$cache/rootfs/var/cache/apt/archives/"*.deb "$cache/rootfs/var/lib/apt/lists/"*
        tar -C "$cache/rootfs" -cf "$cache/base.tar.part" . && mv "$cache/base.tar.part" "$cache/base.tar"
        rm -rf "$cache/rootfs"
    fi
    podman import "$cache/base.tar" "$base" >/dev/null
fi

# the grader's dependencies (read from pyproject.toml), CPU torch and the build backend, as wheels
mapfile -t requirements < <("$python" - "$repo/pyproject.toml" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))
for requirement in project["project"]["dependencies"] + project["build-system"]["requires"]:
    print("torch==2.13.0+cpu" if requirement.startswith("torch") else requirement)
PY
)
if ! "$python" -m pip download --quiet --disable-pip-version-check --only-binary=:all: --python-version 3.11 \
        --find-links "$cache/wheels" -d "$cache/wheels" "${requirements[@]}" >"$cache/pip.log" 2>&1; then
    cat "$cache/pip.log" >&2
    exit 1
fi

# the build context: what the Dockerfile copies, and the wheels (hard links, no copy)
context=$(mktemp -d "${TMPDIR:-/tmp}/grader-image-context.XXXXXX")
trap 'rm -rf "$context"' EXIT
cp "$repo/Dockerfile" "$repo/pyproject.toml" "$repo/README.md" "$context/"
cp -r "$repo/grader" "$repo/assignments" "$context/"
find "$context" -name __pycache__ -prune -exec rm -rf {} +
rm -f "$context/assignments/course-secret.txt"
cp -al "$cache/wheels" "$context/wheels" 2>/dev/null || cp -r "$cache/wheels" "$context/wheels"

# the image the tag named before this build is removed once the tag moves (each is gigabytes; the
# layers the new one shares stay); one still used by a container or another tag stays, and says so
before=$(podman image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
podman build --quiet --tag "$tag" --build-arg BASE="$base" --build-arg TORCH_VERSION=2.13.0+cpu \
    --build-arg PIP_OPTIONS=--no-index "$context"
after=$(podman image inspect --format '{{.Id}}' "$tag")
if [ -n "$before" ] && [ "$before" != "$after" ]; then
    podman rmi "$before" >/dev/null || echo "build.sh: the previous $tag ($before) is still in use; kept" >&2
fi
