#!/bin/bash
repo=$PWD
python3 -m pip install -q --no-index --no-deps --target /tmp/base-site .device-wheels/*.whl 2>&1 | tail -1
for t in before after; do
  cp -r /tmp/base-site /tmp/$t-site; src=.carry-$t; [ $t = after ] && src=.
  (cd $src && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/$t-site . 2>&1 | tail -1)
done
cd /tmp
for tree in after before; do
  echo "=== $tree"
  PYTHONPATH=/tmp/$tree-site:$repo/bench timeout 100 python3 $repo/.carry-run/reader_prof.py evict_drop,evict_device 2>&1 | grep -v Warn | cut -c1-150
done
