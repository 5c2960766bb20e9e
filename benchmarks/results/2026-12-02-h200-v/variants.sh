#!/usr/bin/env bash
# The A/B trees of a1-a4 under .probe/ab (run from the repository root of 6dcf34a):
# m0 = main at 6dcf34a, v3 = 421d1c6 (the prefill CPU share for chunks of at most 64 routes an expert),
# and the executor's prefetch / lookup variants (kernels/ only, for kernels.cpu_executor.expert_gbps).
set -eu
A=.probe/ab; S=kernels/csrc
for t in m0:HEAD v3:421d1c6; do
  mkdir -p $A/${t%%:*}; git archive ${t#*:} engine kernels ftw freetoken_cli pyproject.toml | tar -x -C $A/${t%%:*}
  rm -rf $A/${t%%:*}/engine/demo/model
done
for v in pfT1 pf0 pf8k noperm pd0 pd1k pd2k; do mkdir -p $A/$v; git archive HEAD kernels | tar -x -C $A/$v; done
sed -i 's/_MM_HINT_T0/_MM_HINT_T1/g' $A/pfT1/$S/cpu_moe.cpp $A/pfT1/$S/cpu_moe_qrow.h                 # prefetch into L2
sed -i 's/^\( *\)_mm_prefetch(.*$/\1;/; s/_mm_prefetch(ahead, _MM_HINT_T0), _mm_prefetch(ahead + 64, _MM_HINT_T0);/;/' \
  $A/pf0/$S/cpu_moe.cpp $A/pf0/$S/cpu_moe_qrow.h                                                   # no software prefetch
sed -i 's/+ 4096/+ 8192/g' $A/pf8k/$S/cpu_moe.cpp $A/pf8k/$S/cpu_moe_qrow.h                          # two pages ahead
sed -i 's/_mm512_permutexvar_epi16(\(.*\), tab);/_mm512_or_si512(\1, tab);/' $A/noperm/$S/cpu_moe.cpp  # int4 lookups out (wrong values)
q='      _mm_prefetch(reinterpret_cast<const char\*>(q) + 4096, _MM_HINT_T0);  \/\/ see dot_avx2'
sed -i "s|$q|      ;|" $A/pd0/$S/cpu_moe.cpp                                                          # int4 rows: no prefetch
sed -i "s|$q|      _mm_prefetch(reinterpret_cast<const char*>(q) + 1024, _MM_HINT_T0);|" $A/pd1k/$S/cpu_moe.cpp
sed -i "s|$q|      _mm_prefetch(reinterpret_cast<const char*>(q) + 2048, _MM_HINT_T0);|" $A/pd2k/$S/cpu_moe.cpp
