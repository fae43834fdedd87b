# Setup for one command on a fresh GPU machine (a bare H200 of the device tool): run it with `source`, then the
# measurements, in the same command. It installs the project over the machine's own torch (and any wheels carried
# in .whl: faster-coco-eval, which that machine lacks), writes torch's bytecode cache (the image sets
# PYTHONDONTWRITEBYTECODE, and every process then compiled torch at its start: 1-3 s of each race,
# docs/performance.md), and makes the race's data (800/200 generated images of 640 px, label scan cached).
#
#   here, once:  echo /.whl/ >> .git/info/exclude
#                python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#                    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl faster-coco-eval==1.8.0
#                (for the console's GPU test add `--platform any` and the console's packages at pyproject's test pins:
#                textual==8.2.8 textual-plotext==1.0.1 plotext==5.3.2 textual-image mdit-py-plugins platformdirs
#                linkify-it-py uc-micro-py; plotext 6 breaks textual-plotext's import)
#   old code to race against (benchmarks/race_ab.py): mkdir -p .gpu/old && git archive REF | tar -x -C .gpu/old
#                (with /.gpu/ in .git/info/exclude; name .gpu and .whl in the call's carry)
#   there:       source benchmarks/device_setup.sh && libreyolo bench race data=/tmp/s800/data.yaml epochs=15 \
#                    imgsz=640 batch=16 modes=auto
#   or, two trees: source benchmarks/device_setup.sh && python3 benchmarks/race_ab.py --tree new=. --tree old=.gpu/old \
#                    --out $OUT/ab.jsonl -- data=/tmp/s800/data.yaml epochs=15 imgsz=640 batch=16
#   LibreYOLO 1.6 for tests/test_weights16_gpu.py and benchmarks/sizes_vs.py (the device has no network): here,
#                python3 -m pip install -q --no-deps --target .gpu/ly16 libreyolo==1.6.0 tqdm (carry .gpu/ly16)
unset PYTHONDONTWRITEBYTECODE
if [ -d .gpu/ly16 ]; then export LIBREYOLO16_DIR=$PWD/.gpu/ly16; fi
export PYTHONPYCACHEPREFIX=/tmp/pyc PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-deps --no-build-isolation .whl/*.whl || return 1
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . || return 1
# one import of everything a run imports writes the bytecode cache for every later process
python3 -c "import torch, torchvision, libreyolo.engine.trainer, libreyolo.families" || return 1
if [ ! -f /tmp/s800/data.yaml ]; then
    libreyolo data shapes out=/tmp/s800 n_train=800 n_val=200 size=640 >/dev/null || return 1
fi
libreyolo data prepare data=/tmp/s800/data.yaml >/dev/null || return 1
echo "device_setup: $(python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA")'), data /tmp/s800"
