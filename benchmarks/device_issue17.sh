#!/bin/bash
# Issue 17's measurements on the 16-core GPU device machine, in one call of the device tool:
#   1. a GPU-source run (sync, restores verified out of device memory) as a check of the path;
#   2. benchmarks/gpu_stall.py: the async stall with the GPU source against the bare pinned copy;
#   3. benchmarks/vs_limit.py at 8, 16 and 32 ranks against fio, with CPU seconds per GiB.
# Carried (git-ignored): .whl/ (cp312 manylinux wheels the device image lacks: mpich, mpi4py,
# hydra-core, omegaconf 2.3, antlr4-python3-runtime 4.9.3, jsonschema, jsonschema-specifications,
# referencing, rpds-py, cryptography, cffi, pycparser) and .devpack/fio.tar.xz (Debian's fio binary
# with the shared libraries `ldd` names, run through a wrapper so that only fio sees them).
#   SCALE=0.025 ROUNDS=2 bash benchmarks/device_issue17.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
python3 -m zipfile -e .whl/mpich-*.whl /tmp/mw && M=$(echo /tmp/mw/mpich-*.data/data) && chmod +x $M/bin/*
mkdir -p /tmp/fio/bin && tar -xJf .devpack/fio.tar.xz -C /tmp/fio
printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/fio/lib exec /tmp/fio/fio "$@"\n' > /tmp/fio/bin/fio && chmod +x /tmp/fio/bin/fio
export PYTHONPATH=/tmp/site:$PWD PATH=$M/bin:/tmp/fio/bin:/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=$M/lib MPI4PY_LIBMPI=$M/lib/libmpi.so.12
fio --version; nproc; free -g | head -2; df -T /root | tail -1; cat /sys/kernel/mm/transparent_hugepage/enabled
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
mkdir -p /root/w && cd /root/w
echo "== 1. GPU source, sync, 2 ranks, restores"
python3 -m mlckpt run division=open workload=llama3_8b scale=0.02 ranks=2 checkpoint.num_writes=2 checkpoint.num_reads=2 \
  state.source=gpu signing.key=none 2>&1 | grep -vE "^[0-9:]{8} " | tail -12
python3 -c "
import json,glob; b=sorted(glob.glob('/root/w/mlckpt-results/*/run.json'))[-1]; r=json.load(open(b)); print(json.dumps(r['state'])[:600]); print('verdict', r['verdict'], [f['rule'] for f in r['findings'] if f['severity']!='ok'])"
cd - >/dev/null
echo "== 2. gpu_stall.py, 1 rank (one GPU per rank)"
timeout 150 python3 benchmarks/gpu_stall.py --ranks 1 --scale 0.02 --writes 4 --rounds 3 --interval 2 --json $OUT/gpu_stall_1r.json
echo "== 3. vs_limit.py at 8, 16, 32 ranks"
mkdir -p /root/vsl
timeout ${VSL_TIMEOUT:-300} python3 benchmarks/vs_limit.py --config 8:${SCALE:-0.025} --config 16:${SCALE:-0.025} --config 32:${SCALE:-0.025} \
  --rounds ${ROUNDS:-2} --limit fio --folder /root/vsl --json $OUT/vs_limit.json 2>&1 | tee $OUT/vs_limit.txt | grep -vE "^\s+(read|write)  "
uptime
