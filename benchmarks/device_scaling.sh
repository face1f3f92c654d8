#!/bin/bash
# Issue 17 scouting on the 16-core device machine: mlckpt at RANKS="8 16 32" with its CPU time, then a
# py-spy profile of a 16-rank run (--idle: where every thread is). Run through the device tool with the
# wheels mlckpt needs in .whl/ (see benchmarks/README.md, "Ranks on the 16-core device"):
#   RANKS="8 16 32" bash benchmarks/device_scaling.sh
# .whl/ holds cp312 manylinux wheels of what the device image lacks (`pip download --no-deps`):
# mpich, mpi4py, hydra-core, omegaconf 2.3, antlr4-python3-runtime 4.9.3, jsonschema,
# jsonschema-specifications, referencing, rpds-py, cryptography, cffi, pycparser, py-spy.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
python3 -m zipfile -e .whl/mpich-5.0.2-*.whl /tmp/mw && M=/tmp/mw/mpich-5.0.2.data/data && chmod +x $M/bin/*
export PYTHONPATH=/tmp/site:$PWD PATH=$M/bin:/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=$M/lib MPI4PY_LIBMPI=$M/lib/libmpi.so.12
python3 -c "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])"
nproc; free -g | head -2; df -T / /tmp /root /dev/shm 2>&1 | tail -4; which mpiexec
# ext4 on the machine's virtio disk
CK=/root/ck; mkdir -p $CK /root/res
RUN="python3 -m mlckpt run preset=none division=open workload=llama3_8b scale=0.05 checkpoint.num_writes=3 checkpoint.num_reads=3 checkpoint.folder=$CK output.root=/root/res signing.key=none"
TIMEFORMAT="time: wall %R s, user %U s, sys %S s"
for n in ${RANKS:-}; do
  echo "== ranks $n"
  time ($RUN ranks=$n > /root/out$n.txt 2>&1)
  grep -E "^(write|read) [0-9]|^result|error|finding" /root/out$n.txt | cut -c1-170
  cat /proc/loadavg
done
echo "== py-spy, 16 ranks"
py-spy record --subprocesses --idle --nonblocking --rate 20 --format raw -o $OUT/p16.txt -- $RUN ranks=16 > /root/outp.txt 2>&1
grep -E '^result' /root/outp.txt; gzip -9 $OUT/p16.txt
tail -3 /root/outp.txt | cut -c1-170
ls -la $OUT
