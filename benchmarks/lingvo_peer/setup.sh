#!/usr/bin/env bash
# Builds a venv that runs Lingvo's GPipe (lingvo.core.gpipe) on CPU, for the
# peer harness in this directory (bench.py).
#
#   PEER_VENV=/path/to/venv bash benchmarks/lingvo_peer/setup.sh
#
# PEER_VENV defaults to /tmp/lingvo-peer-venv, PYTHON to python3.11 (else
# python3). Needs network access to PyPI and about 2.4 GB of disk.
#
# lingvo 0.14.2 goes in with --no-deps: it declares many heavy requirements
# (apache-beam, jupyter, tensorflow-datasets, ...) that GPipe never imports, so
# TF 2.21.0 and the few packages that the lingvo.core.gpipe imports need are
# installed explicitly (pip then warns that the others are missing). Lingvo's
# compiled x_ops.so needs glibc >= 2.38 and fails to load on older systems
# (Debian 12 has 2.36), so its generated wrapper lingvo/core/ops/gen_x_ops.py
# is replaced by a stub whose functions raise when called; GPipe and the
# Transformer layers never call them.
set -euo pipefail

PEER_VENV="${PEER_VENV:-/tmp/lingvo-peer-venv}"
PYTHON="${PYTHON:-$(command -v python3.11 || echo python3)}"

echo "[setup] creating $PEER_VENV with $("$PYTHON" --version 2>&1)"
"$PYTHON" -m venv "$PEER_VENV"
PIP="$PEER_VENV/bin/pip"
"$PIP" install --quiet --upgrade pip
"$PIP" install --quiet "tensorflow==2.21.0" absl-py numpy
"$PIP" install --quiet --no-deps "lingvo==0.14.2"
# Imported by lingvo.core.{gpipe,layers_with_attention,py_utils}.
"$PIP" install --quiet sentencepiece matplotlib sympy

SITE="$("$PEER_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
STUB="$SITE/lingvo/core/ops/gen_x_ops.py"
if [ -f "$STUB" ] && ! grep -q "x_ops stub" "$STUB"; then
  cp "$STUB" "$STUB.orig"
fi
cat > "$STUB" <<'PYEOF'
# x_ops stub (written by benchmarks/lingvo_peer/setup.sh): the compiled
# x_ops.so needs a newer glibc. GPipe does not use these ops; calling one raises.
def __getattr__(name):
  if name.startswith('__'):
    raise AttributeError(name)

  def Missing(*args, **kwargs):
    raise NotImplementedError('x_ops stub: ' + name)

  return Missing
PYEOF
find "$SITE/lingvo/core/ops" -name '__pycache__' -prune -exec rm -rf {} +

echo "[setup] import check"
"$PEER_VENV/bin/python" - <<'PYEOF'
from importlib import metadata
from lingvo.core import cluster_factory, gpipe, layers_with_attention, py_utils  # noqa: F401
print('tensorflow', metadata.version('tensorflow'), '| lingvo', metadata.version('lingvo'),
      '| lingvo.core.gpipe imports')
PYEOF
echo "[setup] done: $PEER_VENV"
