# GPU grading image: CUDA, torch, triton and the grader. Build from the course folder:
#   docker build -t grader .
#   docker run --gpus all -v "$PWD/submissions:/submissions" grader check /submissions/alice
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
WORKDIR /opt/grader
COPY pyproject.toml README.md ./
COPY grader ./grader
COPY assignments ./assignments
COPY reference ./reference
RUN pip install --no-cache-dir -e . && useradd --create-home --uid 10001 student
ENV GRADER_COURSE=/opt/grader
ENTRYPOINT ["grader"]
