#!/usr/bin/env bash
# Regenerate the Python code for Cluster Autoscaler's externalgrpc CloudProvider service
# from src/gpufleet/server/externalgrpc/externalgrpc.proto:
#
#   scripts/gen_externalgrpc.sh [DEST_DIR]
#
# DEST_DIR defaults to the proto's own folder (the committed code). The test
# tests/server/test_externalgrpc_service.py runs this into a temporary folder and checks
# that the committed files are byte-identical, so edit the proto, run this, commit both.
#
# It uses grpcio-tools from the dev extra (pinned in pyproject.toml): its protoc and the
# google/protobuf/*.proto it ships decide the generated code. PYTHON picks the interpreter
# (default: .venv/bin/python).
#
# The proto is compiled with -I src, so protoc names it by its package path and the
# _grpc module imports `from gpufleet.server.externalgrpc import externalgrpc_pb2`
# (a plain `import externalgrpc_pb2` would only work with that folder on sys.path).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PROTO=gpufleet/server/externalgrpc/externalgrpc.proto
DEST=${1:-$ROOT/src/gpufleet/server/externalgrpc}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# grpc_tools.protoc adds the include path of its bundled google/protobuf protos itself.
(cd "$ROOT/src" && "$PYTHON" -m grpc_tools.protoc -I . \
  --python_out="$work" --pyi_out="$work" --grpc_python_out="$work" "$PROTO")

mkdir -p "$DEST"
for f in externalgrpc_pb2.py externalgrpc_pb2.pyi externalgrpc_pb2_grpc.py; do
  cp "$work/gpufleet/server/externalgrpc/$f" "$DEST/$f"
done
