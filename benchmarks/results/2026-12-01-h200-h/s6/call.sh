#!/usr/bin/env bash
# Start-up A/B on call 5's warm machine (its checkpoint /tmp/q30b8/ftw, its wheels in /tmp/site): the tree of call 5
# ("new") against it with branch bothreads' loader change applied ("bt": the expert read starts with the dense read),
# alternating, bytecode kept per tree.
# Before: mkdir -p .probe/ab/bt; cp -r engine kernels ftw freetoken_cli pyproject.toml .probe/ab/bt/;
#         git diff main bothreads -- engine | patch -d .probe/ab/bt -p1
# needs, beside the tracked files: .probe/ab/bt
w=/tmp/n6; mkdir -p $w; export PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftcache; t0=$(date +%s)
ls /tmp/q30b8/ftw >/dev/null || exit 3
for run in bt1 new1 bt2 new2 bt3 new3; do
  [ $(( $(date +%s) - t0 )) -lt 170 ] || break
  t=${run%?}; root=$PWD; [ $t = bt ] && root=$PWD/.probe/ab/bt
  (cd $root && env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc_$t PYTHONPATH=$root:/tmp/site timeout -s ABRT 40 \
    python3 -m freetoken_cli.main bench startup /tmp/q30b8/ftw --cpu-threads 8 --out $w/startup_$run.json > $w/startup_$run.txt 2>&1)
  echo "$run $(grep -E 'ready|wait|dense' $w/startup_$run.txt | tr -s ' ' | cut -c1-90 | tr '\n' ' ')"
done
tar czf $OUT/n6.tgz -C $w .
