# The grading image: Python, torch, triton and the grader (not the reference solutions).
#
#   docker build -t grader .                 # from the course folder: CUDA base, CUDA torch from its index
#   docker build -t grader --build-arg TORCH_VERSION=2.11.0 --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
#
# Where no registry of base images is reachable, BASE names a local image that already has the
# packages of the first RUN (then apt is not asked), and wheels/ in the build context holds every
# wheel pip needs (with PIP_OPTIONS=--no-index nothing is downloaded): tests/image/build.sh does
# this from a debootstrap base with CPU torch. A GPU host keeps the default CUDA base.
#
# Two ways to use it (docs/security.md says what each protects):
# 1. The grader on the host, each worker in its own container from this image:
#      GRADER_DOCKER_IMAGE=grader grader check /srv/submissions/alice --isolation docker
#    (GRADER_CONTAINER_CLI=podman where podman stands in for docker). The host's grader package
#    is mounted into each worker container (so both speak the same protocol); the image only
#    provides Python, torch and triton.
# 2. All of the grader in one container, workers in its default sandbox (namespaces need these
#    privileges inside the container; without them the sandbox says so and does what it can):
#      docker run --rm --gpus all --cap-add SYS_ADMIN --security-opt seccomp=unconfined \
#        --security-opt apparmor=unconfined \
#        -v "$PWD/reference:/opt/grader/reference:ro" -v "$PWD/submissions:/submissions:ro" \
#        -v "$PWD/reports:/reports" grader check /submissions/alice --json /reports/alice/results.json --html /reports/alice
#    The grader in the container is root and writes only into folders no other user can change:
#    make reports/ root's first (`sudo install -d -o root -g root -m 0755 reports`), or it refuses
#    (exit 2) a folder your own uid owns, which inside the container is another user's.
ARG BASE=nvidia/cuda:12.8.1-base-ubuntu24.04

# the optional wheels/ folder of the build context (the glob matches nothing where it is absent),
# kept out of the final image: its RUN mounts it
FROM ${BASE} AS wheels
COPY pyproject.toml wheel[s] /wheels/

FROM ${BASE}
ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG PIP_OPTIONS=""

# gcc and the Python headers: Triton compiles a small launcher for each kernel signature;
# util-linux: unshare, for the default sandbox. Asked of apt only where the base lacks them.
RUN packages="python3 python3-venv python3-dev gcc libc6-dev util-linux ca-certificates"; \
    dpkg -s $packages >/dev/null 2>&1 || { apt-get update \
    && apt-get install -y --no-install-recommends $packages \
    && rm -rf /var/lib/apt/lists/*; }

RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install $PIP_OPTIONS --find-links /wheels --index-url "$TORCH_INDEX" --extra-index-url https://pypi.org/simple "torch==$TORCH_VERSION"

WORKDIR /opt/grader
COPY pyproject.toml README.md ./
COPY grader ./grader
COPY assignments ./assignments
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install $PIP_OPTIONS --find-links /wheels . \
    && rm -rf build grader.egg-info \
    && mkdir -p /opt/grader/reference \
    && chmod -R go-rwx /opt/grader/assignments \
    && useradd --create-home --uid 10001 --user-group student

# The course folder is root's alone: where the container refuses namespaces (use 2 without the
# capabilities) a worker runs as another uid in the same file tree and must not read the hidden cases.
# reference/ is mounted read-only by the TA when the grader runs here (use 2); worker
# containers (use 1) never get it.
ENV GRADER_COURSE=/opt/grader
ENTRYPOINT ["grader"]
